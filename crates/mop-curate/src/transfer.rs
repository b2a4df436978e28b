//! Files in and out of a workspace: `import` sends memory files (OKF cards, `CLAUDE.md`,
//! `AGENTS.md`, `.claude/rules/`, Claude Code's and Codex's memory directories) to the
//! server, which reads them (`mop_intake::import`) and queues them for review; `export`
//! writes the cards a filter matches as the server sends them (a tarball of OKF files),
//! or unpacked into a new OKF directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mop_proto::curation::{ImportAnswer, ImportFile, ImportOutcome, ImportRequest, ListQuery};

use crate::api::Connection;
use crate::render::safe;

/// Directories a walk never enters: version control and build output, not memory.
const SKIP_DIRS: &[&str] = &[".git", "node_modules", "target", ".venv"];

/// Most bytes of file text one import request carries (the server's default body limit
/// is 1 MiB; JSON escaping adds a little).
const BATCH_BYTES: usize = 700 * 1024;

/// The files under `paths` (a file, or every `.md` file of a directory, recursively),
/// each named as the curator typed it.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<ImportFile>> {
    let mut found = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
        if meta.is_dir() {
            walk(p, &mut found)?;
        } else {
            found.push(p.clone());
        }
    }
    found.sort();
    found.dedup();
    let mut files = Vec::new();
    for path in found {
        let text =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let text = String::from_utf8(text).map_err(|e| {
            anyhow::anyhow!(
                "{} is not UTF-8 text (invalid byte at offset {}); convert it or leave it out",
                path.display(),
                e.utf8_error().valid_up_to()
            )
        })?;
        let name = path.to_string_lossy().replace('\\', "/");
        let name = name.strip_prefix("./").unwrap_or(&name).to_owned();
        if text.len() > BATCH_BYTES {
            bail!(
                "{name} is {} bytes, more than one import request carries ({BATCH_BYTES}); split it",
                text.len()
            );
        }
        files.push(ImportFile { path: name, text });
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot read {}", path.display()))?;
        let name = entry.file_name();
        if kind.is_dir() {
            if !SKIP_DIRS.iter().any(|s| name == *s) {
                walk(&path, out)?;
            }
        } else if kind.is_file() && name.to_string_lossy().to_ascii_lowercase().ends_with(".md") {
            out.push(path);
        }
    }
    Ok(())
}

/// Reads the files under `paths` and imports them.
pub fn import_paths(
    c: &Connection,
    paths: &[PathBuf],
    dry_run: bool,
    user: Option<String>,
) -> Result<ImportAnswer> {
    let files = collect(paths)?;
    if files.is_empty() {
        bail!("no .md file under the paths given; name the files to import");
    }
    import(c, files, dry_run, user)
}

/// Sends `files` in requests the server's body limit takes; one answer for all.
pub fn import(
    c: &Connection,
    files: Vec<ImportFile>,
    dry_run: bool,
    user: Option<String>,
) -> Result<ImportAnswer> {
    let mut total = ImportAnswer {
        cards: Vec::new(),
        skipped: Vec::new(),
        done: !dry_run,
        revision: None,
    };
    let mut batch: Vec<ImportFile> = Vec::new();
    let mut size = 0;
    let send = |batch: &mut Vec<ImportFile>, total: &mut ImportAnswer| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let sent = batch.len();
        let req = ImportRequest {
            files: std::mem::take(batch),
            dry_run,
            user: user.clone(),
        };
        let a = c.import(&req)?;
        eprintln!(
            "{} file(s): {} card(s), {} left out",
            sent,
            a.cards.len(),
            a.skipped.len()
        );
        total.cards.extend(a.cards);
        total.skipped.extend(a.skipped);
        total.revision = a.revision.or(total.revision);
        Ok(())
    };
    for f in files {
        if size + f.text.len() > BATCH_BYTES {
            send(&mut batch, &mut total)?;
            size = 0;
        }
        size += f.text.len();
        batch.push(f);
    }
    send(&mut batch, &mut total)?;
    Ok(total)
}

/// An import's answer, for people.
pub fn render(a: &ImportAnswer) -> String {
    let mut out = String::new();
    let (made, grouped) = if a.done {
        ("created", "created, grouped with")
    } else {
        ("would create", "would create, grouped with")
    };
    for c in &a.cards {
        let what = match (c.outcome, &c.with) {
            (ImportOutcome::Grouped, Some(with)) => format!("{grouped} {with}"),
            _ => made.to_owned(),
        };
        out.push_str(&format!(
            "{what}: {} {} \"{}\"  (from {})\n",
            c.id,
            c.card_type.as_str(),
            safe(&c.title),
            safe(&c.file)
        ));
    }
    // Titles and reasons come from the files: shown with control characters escaped.
    for s in &a.skipped {
        let (file, reason) = (safe(&s.file), safe(&s.reason));
        match &s.title {
            Some(t) => out.push_str(&format!("left out: {file} \"{}\": {reason}\n", safe(t))),
            None => out.push_str(&format!("left out: {file}: {reason}\n")),
        }
    }
    let verb = if a.done {
        "imported"
    } else {
        "dry run: would import"
    };
    out.push_str(&format!(
        "{verb} {} card(s) (a memory file's sections wait for review, unverified); {} left out",
        a.cards.len(),
        a.skipped.len()
    ));
    match a.revision {
        Some(r) if a.done => out.push_str(&format!(" (revision {r})\n")),
        _ => out.push('\n'),
    }
    out
}

/// Writes the cards `q` matches to `out`: a `.tar.gz`/`.tgz` file as it is, anything
/// else as a new OKF directory. Either appears whole or not at all (written beside it
/// under a temporary name, then renamed). Answers how many cards.
pub fn export(c: &Connection, q: &ListQuery, out: &Path) -> Result<usize> {
    let name = out.to_string_lossy();
    let tarball = name.ends_with(".tar.gz") || name.ends_with(".tgz");
    if out.exists() && !(tarball && out.is_file()) {
        bail!(
            "{} exists; name a new directory (or a .tar.gz file) to export into",
            out.display()
        );
    }
    let bytes = c.export(q)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut cards = 0;
    for entry in tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()))
        .entries()
        .context("export: the server's tarball does not read")?
    {
        entry.context("export: the server's tarball does not read")?;
        cards += 1;
    }
    if tarball {
        let mut tmp = tempfile::NamedTempFile::new_in(&parent)
            .with_context(|| format!("cannot write in {}", parent.display()))?;
        std::io::Write::write_all(&mut tmp, &bytes)
            .with_context(|| format!("cannot write {}", out.display()))?;
        tmp.persist(out)
            .with_context(|| format!("cannot write {}", out.display()))?;
    } else {
        let tmp = tempfile::Builder::new()
            .prefix(".mop-export-")
            .tempdir_in(&parent)
            .with_context(|| format!("cannot write in {}", parent.display()))?;
        // `unpack` refuses paths that leave the directory.
        tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()))
            .unpack(tmp.path())
            .with_context(|| format!("cannot unpack the export into {}", tmp.path().display()))?;
        std::fs::rename(tmp.path(), out)
            .with_context(|| format!("cannot move the export to {}", out.display()))?;
        // Renamed away: nothing is left for the guard to remove.
        let _ = tmp.keep();
    }
    Ok(cards)
}
