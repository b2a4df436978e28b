//! OKF card directories in and out. Import reads every `*.md` file below a directory
//! (without following symlinks); export writes each card at `<pillar>/<id>.md`, each file
//! through a temporary name and a rename, so an interrupted export leaves no half-written
//! card, or as a gzipped tarball of the same paths (what the API and the console send).

use std::io::Write;
use std::path::{Component, Path};

use anyhow::{Context, bail};

/// A card file: its path relative to the card directory, and its bytes.
pub type CardFile = (String, Vec<u8>);

/// A file the import walk did not read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Path relative to the directory.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// Reads every `*.md` file below `dir`, with paths relative to it (`/`-separated), sorted.
/// Symlinks and other non-regular files are reported, not followed; other files are
/// ignored silently only when they are not `.md` (README.txt, .git …).
pub fn read_card_dir(
    dir: &Path,
    mut progress: impl FnMut(usize),
) -> anyhow::Result<(Vec<CardFile>, Vec<Skipped>)> {
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("cannot read directory {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot list {}", d.display()))?;
            let path = entry.path();
            let rel = relative(dir, &path);
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                continue;
            }
            let kind = entry
                .file_type()
                .with_context(|| format!("cannot stat {}", path.display()))?;
            if kind.is_dir() {
                stack.push(path);
            } else if !rel.ends_with(".md") {
                continue;
            } else if kind.is_symlink() || !kind.is_file() {
                skipped.push(Skipped {
                    path: rel,
                    reason: "not a regular file (symlinks are not followed)".into(),
                });
            } else {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                files.push((rel, bytes));
                progress(files.len());
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((files, skipped))
}

fn relative(base: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(base).unwrap_or(path);
    rel.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Writes `files` (relative paths from [`mop_cards::card_path`]) into `dir`, which must be
/// missing or empty.
pub fn write_card_dir(dir: &Path, files: &[CardFile]) -> anyhow::Result<()> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; export into a new or empty directory",
                dir.display()
            );
        }
    } else {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    for (rel, bytes) in files {
        // Paths come from card types and UUIDs; refuse anything else rather than trust it.
        if rel
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
        {
            bail!("refusing to write unexpected path {rel:?}");
        }
        let target = dir.join(rel);
        let parent = target.parent().expect("card paths have a directory");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let mut tmp = tempfile::NamedTempFile::new_in(parent)
            .with_context(|| format!("cannot create a temporary file in {}", parent.display()))?;
        tmp.write_all(bytes)
            .with_context(|| format!("cannot write {}", target.display()))?;
        tmp.as_file()
            .sync_all()
            .with_context(|| format!("cannot flush {}", target.display()))?;
        tmp.persist(&target)
            .with_context(|| format!("cannot rename into {}", target.display()))?;
    }
    Ok(())
}

/// The card files as a gzipped tarball, each at its path, mode 0644, dated `mtime` (Unix
/// seconds).
pub fn tar_gz(files: &[CardFile], mtime: u64) -> std::io::Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    for (path, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, path, bytes.as_slice())?;
    }
    tar.into_inner()?.finish()
}
