//! What `mop run` keeps of a task when it ends, besides its exit status: the memory the
//! agent CLI wrote on its own, and the task's edits to the working directory's memory
//! files.
//!
//! - **Native memory.** With `--agent claude` and capture on, Claude Code's auto memory
//!   goes to [`inside::CAPTURE_DIR`], a directory this process made (mode 0700, the
//!   runner's) and binds into the sandbox. At the end each file there is read as the
//!   import decoder reads an auto-memory topic file (`mop_intake::import`), and what it
//!   holds is handed to the daemon as the task's stores.
//! - **Working directory memory files.** `CLAUDE.md`, `CLAUDE.local.md` and `AGENTS.md`
//!   are hashed before the sandbox starts and after it ends; a change is reported, and
//!   with the profile's `capture.workdir_memory = "propose"` its new sections are proposed
//!   as cards. The files stay as the task left them.
//!
//! Everything read here was written by the sandboxed agent, which may have meant harm: each
//! file is opened beneath a directory descriptor held from before the task started, never
//! through a symbolic link (`O_NOFOLLOW`), and taken only when it is a regular file with
//! one link and at most [`MAX_FILE_BYTES`]. So a link to the runner's own files (an SSH
//! key, say) is skipped, never read and proposed as a card.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};

use anyhow::{Context, Result};
use mop_intake::import::{Source, read_source};
use mop_proto::control::{CapturedCard, MAX_CAPTURED};
use mop_proto::receipts::{CaptureSkip, MAX_CAPTURE_SKIPS, WORKDIR_MEMORY_FILES, WorkdirEdit};
use mop_proto::sync::NewCard;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstat};

/// The largest memory file read: a card's body limit, with room for its frontmatter.
pub const MAX_FILE_BYTES: u64 = mop_cards::MAX_BODY_BYTES as u64 + 4096;

/// The most directory entries a capture looks at.
const MAX_ENTRIES: usize = 1000;

/// The label every card captured from an agent CLI's own memory carries.
pub const NATIVE_LABEL: &str = "native-memory";

/// The label every card proposed from a working directory's memory file carries.
pub const WORKDIR_LABEL: &str = "workdir-memory";

/// Why a file was left out, in the words the receipt uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    Index,
    TooLarge,
    NotAFile,
    Unreadable,
    NotMemory,
    TooMany,
}

impl Skip {
    fn as_str(self) -> &'static str {
        match self {
            Skip::Index => "index",
            Skip::TooLarge => "too_large",
            Skip::NotAFile => "not_a_file",
            Skip::Unreadable => "unreadable",
            Skip::NotMemory => "not_memory",
            Skip::TooMany => "too_many",
        }
    }
}

/// A regular, singly linked file of at most [`MAX_FILE_BYTES`] named `name` directly
/// beneath `dir` (and owned by `owner`, when given), read without following links;
/// `Ok(None)` when there is none.
fn read_beneath(dir: impl AsFd, name: &str, owner: Option<u32>) -> Result<Option<Vec<u8>>, Skip> {
    let fd: OwnedFd = match openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        // A symbolic link (ELOOP), a directory opened for reading, a socket.
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENXIO) => return Err(Skip::NotAFile),
        Err(_) => return Err(Skip::Unreadable),
    };
    let st = fstat(&fd).map_err(|_| Skip::Unreadable)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG
        || st.st_nlink != 1
        || owner.is_some_and(|uid| st.st_uid != uid)
    {
        return Err(Skip::NotAFile);
    }
    if st.st_size as u64 > MAX_FILE_BYTES {
        return Err(Skip::TooLarge);
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|_| Skip::Unreadable)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Skip::TooLarge);
    }
    Ok(Some(bytes))
}

/// The cards a memory file's text holds, as the import decoder reads it, each with
/// `label`; or why none.
fn cards_of(name: &str, text: &str, label: &str) -> Result<Vec<CapturedCard>, Skip> {
    let labelled = |mut labels: Vec<String>| {
        if !labels.iter().any(|l| l == label) {
            labels.push(label.to_owned());
        }
        labels
    };
    match read_source(name, text) {
        Source::Card(card) => {
            let s = card.summary;
            Ok(vec![CapturedCard {
                personal: s.scope.user_id.is_some(),
                card: NewCard {
                    card_type: s.card_type,
                    title: s.title,
                    description: s.description,
                    labels: labelled(s.labels),
                    error_codes: s.error_codes,
                    stacks: s.stacks,
                    scope: Default::default(),
                    body: card.body,
                },
            }])
        }
        Source::Drafts { drafts, .. } if !drafts.is_empty() => Ok(drafts
            .into_iter()
            .map(|d| CapturedCard {
                personal: d.personal,
                card: NewCard {
                    card_type: d.card_type,
                    title: d.title,
                    description: d.description,
                    labels: labelled(Vec::new()),
                    error_codes: Vec::new(),
                    stacks: Vec::new(),
                    scope: Default::default(),
                    body: d.body,
                },
            })
            .collect()),
        Source::Skip(_) if name == mop_proto::inside::MEMORY_MD_NAME => Err(Skip::Index),
        _ => Err(Skip::NotMemory),
    }
}

/// What a capture found: the cards to store, how many files held them, and the files
/// left out.
#[derive(Debug, Default)]
pub struct Found {
    /// The cards, at most [`MAX_CAPTURED`].
    pub cards: Vec<CapturedCard>,
    /// Files that gave cards.
    pub files: usize,
    /// Files left out.
    pub skipped: Vec<CaptureSkip>,
}

impl Found {
    fn skip(&mut self, sha256: Option<String>, why: Skip) {
        if self.skipped.len() < MAX_CAPTURE_SKIPS {
            self.skipped.push(CaptureSkip {
                sha256,
                reason: why.as_str().to_owned(),
            });
        }
    }

    fn add(&mut self, cards: Vec<CapturedCard>, sha256: String) {
        if self.cards.len() + cards.len() > MAX_CAPTURED {
            self.skip(Some(sha256), Skip::TooMany);
            return;
        }
        self.files += 1;
        self.cards.extend(cards);
    }
}

/// Most bytes of captured cards (as JSON) in one finish request: mopd's control socket
/// takes requests of up to 256 KiB, and the rest of a request is small.
pub const BATCH_BYTES: usize = 192 * 1024;

/// `cards` in batches of at most [`BATCH_BYTES`] as JSON each (a card is at most its
/// 64 KiB body twice over, when every character needs escaping), in order.
pub fn batches(cards: Vec<CapturedCard>) -> Vec<Vec<CapturedCard>> {
    let mut out: Vec<Vec<CapturedCard>> = Vec::new();
    let mut bytes = 0;
    for card in cards {
        let size = serde_json::to_vec(&card).map_or(BATCH_BYTES, |j| j.len());
        match out.last_mut() {
            Some(batch) if bytes + size <= BATCH_BYTES => batch.push(card),
            _ => {
                out.push(vec![card]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    out
}

/// The directory an agent CLI's own memory goes to for one task: made by `mop run`,
/// bound into the sandbox at [`mop_proto::inside::CAPTURE_DIR`], read at the end and
/// removed with this value.
pub struct CaptureDir {
    dir: tempfile::TempDir,
    /// Opened before the task started, so the agent cannot swap what it names.
    fd: OwnedFd,
}

impl CaptureDir {
    /// A new, empty directory of the runner's, mode 0700, in `$XDG_RUNTIME_DIR` when set
    /// (memory-backed, as the sandbox's own home is) or else the temporary directory.
    pub fn create() -> Result<CaptureDir> {
        let mut b = tempfile::Builder::new();
        b.prefix("mop-capture-");
        let dir = match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
            Some(base) => b.tempdir_in(base),
            None => b.tempdir(),
        }
        .context("cannot create a directory for the agent's own memory (capture)")?;
        let fd = nix::fcntl::open(
            dir.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .context("cannot open the capture directory")?;
        Ok(CaptureDir { dir, fd })
    }

    /// The directory on the host.
    pub fn path(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Every memory file the agent left, read as cards (sorted by name, so a capture is
    /// the same however the directory lists).
    pub fn collect(&self) -> Found {
        let mut found = Found::default();
        // The agent could have opened the directory to other local users (it has the
        // runner's uid); from now on nobody else can add to it, and a file someone else
        // put there before is not the task's.
        let _ = nix::sys::stat::fchmod(&self.fd, Mode::S_IRWXU);
        let runner = nix::unistd::geteuid().as_raw();
        let names: Vec<String> = match nix::fcntl::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .and_then(nix::dir::Dir::from_fd)
        {
            Ok(mut d) => d
                .iter()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "." && n != "..")
                .take(MAX_ENTRIES + 1)
                .collect(),
            Err(_) => {
                found.skip(None, Skip::Unreadable);
                return found;
            }
        };
        let mut names = names;
        // An agent that made a million files costs a thousand reads, not a million.
        if names.len() > MAX_ENTRIES {
            names.truncate(MAX_ENTRIES);
            found.skip(None, Skip::TooMany);
        }
        names.sort();
        for name in names {
            match read_beneath(&self.fd, &name, Some(runner)) {
                Ok(Some(bytes)) => {
                    let sha256 = mop_cards::sha256_hex(&bytes);
                    let Ok(text) = String::from_utf8(bytes) else {
                        found.skip(Some(sha256), Skip::NotMemory);
                        continue;
                    };
                    match cards_of(&name, &text, NATIVE_LABEL) {
                        Ok(cards) => found.add(cards, sha256),
                        Err(why) => found.skip(Some(sha256), why),
                    }
                }
                Ok(None) => {}
                Err(why) => found.skip(None, why),
            }
        }
        found
    }
}

/// One line on what `mop run` captured at a task's end, from the receipt's capture and
/// its captured stores: what `mop run` prints last and `mop receipt` shows.
pub fn line(
    c: &mop_proto::receipts::Capture,
    stores: &[mop_proto::receipts::StoreEvent],
) -> String {
    use mop_proto::receipts::StoreEventOutcome as O;
    if !c.enabled {
        return format!(
            "capture: off; {}'s own memory was turned off for the task",
            c.agent
        );
    }
    let captured: Vec<_> = stores.iter().filter(|s| s.captured).collect();
    let count = |o: O| captured.iter().filter(|s| s.outcome == o).count();
    let refused: Vec<String> = captured
        .iter()
        .filter(|s| s.outcome == O::Refused)
        .map(|s| s.code.clone().unwrap_or_else(|| "refused".into()))
        .collect();
    format!(
        "capture: {} memory file{} of {}: {} stored unverified, {} reinforced, {} queued, {} refused{}; {} skipped",
        c.files,
        if c.files == 1 { "" } else { "s" },
        c.agent,
        count(O::Created),
        count(O::Reinforced) + count(O::Unchanged),
        count(O::Queued),
        refused.len(),
        if refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", refused.join(", "))
        },
        c.skipped.len()
    )
}

/// One working-directory memory file as read: absent, its bytes, or why it could not be
/// read (a link, too large).
type FileState = Option<Result<Vec<u8>, &'static str>>;

/// The working directory's memory files as they are now, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkdirFiles(Vec<(&'static str, FileState)>);

impl WorkdirFiles {
    /// Reads them beneath `workdir` (the descriptor the run checked and binds).
    pub fn read(workdir: impl AsFd + Copy) -> WorkdirFiles {
        WorkdirFiles(
            WORKDIR_MEMORY_FILES
                .iter()
                .map(|&name| {
                    let state = match read_beneath(workdir, name, None) {
                        Ok(None) => None,
                        Ok(Some(bytes)) => Some(Ok(bytes)),
                        Err(why) => Some(Err(why.as_str())),
                    };
                    (name, state)
                })
                .collect(),
        )
    }

    /// What changed from `before` to `self`, and, when `propose`, the sections of each
    /// created or changed file that were not in it before, as cards.
    pub fn edits_since(
        &self,
        before: &WorkdirFiles,
        propose: bool,
    ) -> (Vec<WorkdirEdit>, Vec<CapturedCard>) {
        let mut edits = Vec::new();
        let mut cards = Vec::new();
        for ((name, after), (_, was)) in self.0.iter().zip(&before.0) {
            if after == was {
                continue;
            }
            let change = match (was, after) {
                (None, Some(_)) => "created",
                (Some(_), None) => "deleted",
                _ => "modified",
            };
            let sha256 = match after {
                Some(Ok(bytes)) => Some(mop_cards::sha256_hex(bytes)),
                _ => None,
            };
            let mut proposed = 0;
            if propose && let Some(Ok(bytes)) = after {
                let old: Vec<CapturedCard> = match was {
                    Some(Ok(b)) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|t| cards_of(name, t, WORKDIR_LABEL).ok())
                        .unwrap_or_default(),
                    _ => Vec::new(),
                };
                let new = std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|t| cards_of(name, t, WORKDIR_LABEL).ok())
                    .unwrap_or_default();
                for c in new {
                    if !old.contains(&c) && cards.len() < MAX_CAPTURED {
                        cards.push(c);
                        proposed += 1;
                    }
                }
            }
            edits.push(WorkdirEdit {
                file: (*name).to_owned(),
                change: change.to_owned(),
                sha256,
                proposed,
            });
        }
        (edits, cards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &std::path::Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn topic_files_become_cards_and_the_index_and_links_are_skipped() {
        let c = CaptureDir::create().unwrap();
        let d = c.path();
        write(
            d,
            "user_prefs.md",
            "---\nname: Terse answers\ndescription: how Alice likes answers\nmetadata:\n  type: user\n---\nAnswer in one line.\n",
        );
        write(
            d,
            "feedback_deploy.md",
            "---\nname: Never deploy on Fridays\ndescription: a correction\ntype: feedback\n---\nAlice said so.\n",
        );
        write(
            d,
            "MEMORY.md",
            "- [Terse answers](user_prefs.md) — style\n- [Never deploy on Fridays](feedback_deploy.md) — rule\n",
        );
        let secret = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(secret.path(), "# Key\n\nthe runner's own file\n").unwrap();
        std::os::unix::fs::symlink(secret.path(), d.join("link.md")).unwrap();
        // A hard link the agent made: neither name is read.
        write(d, "hard1.md", "# Twice\n\nlinked\n");
        std::fs::hard_link(d.join("hard1.md"), d.join("hard2.md")).unwrap();
        std::fs::create_dir(d.join("sub.md")).unwrap();
        let found = c.collect();
        assert_eq!(found.files, 2, "{found:?}");
        let titles: Vec<(&str, mop_cards::CardType, bool)> = found
            .cards
            .iter()
            .map(|c| (c.card.title.as_str(), c.card.card_type, c.personal))
            .collect();
        assert_eq!(
            titles,
            [
                (
                    "Never deploy on Fridays",
                    mop_cards::CardType::HumanCorrection,
                    false
                ),
                ("Terse answers", mop_cards::CardType::Preference, true),
            ]
        );
        assert!(found.cards.iter().all(|c| c.card.labels == [NATIVE_LABEL]));
        let reasons: Vec<&str> = found.skipped.iter().map(|s| s.reason.as_str()).collect();
        // MEMORY.md, hard1.md and hard2.md, link.md, sub.md (a directory).
        assert_eq!(
            reasons,
            [
                "index",
                "not_a_file",
                "not_a_file",
                "not_a_file",
                "not_a_file"
            ],
            "{found:?}"
        );
        assert!(
            !found
                .cards
                .iter()
                .any(|c| c.card.body.contains("runner's own file"))
        );
    }

    #[test]
    fn a_file_another_user_put_in_the_directory_is_not_the_tasks() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true: this test needs root (CI runs as root)"
            );
            eprintln!("skipping: making a file of another user needs root");
            return;
        }
        let c = CaptureDir::create().unwrap();
        let topic = "---\nname: planted\ntype: project\n---\nSomeone else's text.\n";
        write(c.path(), "mine.md", topic);
        write(c.path(), "theirs.md", topic);
        nix::unistd::chown(&c.path().join("theirs.md"), Some(65534.into()), None).unwrap();
        // The agent opened the directory to everyone; the capture closes it again.
        std::fs::set_permissions(
            c.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let found = c.collect();
        assert_eq!(found.files, 1, "{found:?}");
        assert_eq!(found.skipped.len(), 1, "{found:?}");
        let mode = std::fs::metadata(c.path()).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }

    #[test]
    fn batches_stay_under_the_request_limit_and_keep_the_order() {
        let card = |n: usize| CapturedCard {
            personal: false,
            card: NewCard {
                card_type: mop_cards::CardType::Fact,
                title: format!("card {n}"),
                description: None,
                labels: Vec::new(),
                error_codes: Vec::new(),
                stacks: Vec::new(),
                scope: Default::default(),
                // Every quote is escaped: 60 KiB of them are 120 KiB of JSON.
                body: "\"".repeat(60 * 1024),
            },
        };
        let b = batches((0..5).map(card).collect());
        assert_eq!(b.iter().map(Vec::len).collect::<Vec<_>>(), [1, 1, 1, 1, 1]);
        for batch in &b {
            assert!(serde_json::to_vec(batch).unwrap().len() <= BATCH_BYTES);
        }
        let titles: Vec<String> = b.concat().into_iter().map(|c| c.card.title).collect();
        assert_eq!(titles, ["card 0", "card 1", "card 2", "card 3", "card 4"]);
        assert!(batches(Vec::new()).is_empty());
    }

    #[test]
    fn workdir_edits_are_reported_and_new_sections_proposed() {
        let w = tempfile::tempdir().unwrap();
        write(w.path(), "CLAUDE.md", "# Rules\n\nRun make check.\n");
        write(w.path(), "AGENTS.md", "# Old\n\nGone soon.\n");
        let fd = crate::sandbox::open_dir(w.path()).unwrap();
        let before = WorkdirFiles::read(&fd);
        write(
            w.path(),
            "CLAUDE.md",
            "# Rules\n\nRun make check.\n\n# Deploys\n\nUse the blue pool.\n",
        );
        std::fs::remove_file(w.path().join("AGENTS.md")).unwrap();
        write(w.path(), "CLAUDE.local.md", "# Mine\n\nTabs.\n");
        let after = WorkdirFiles::read(&fd);
        let (edits, none) = after.edits_since(&before, false);
        assert!(none.is_empty());
        let shown: Vec<(&str, &str)> = edits
            .iter()
            .map(|e| (e.file.as_str(), e.change.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("CLAUDE.md", "modified"),
                ("CLAUDE.local.md", "created"),
                ("AGENTS.md", "deleted")
            ]
        );
        let (edits, cards) = after.edits_since(&before, true);
        let titles: Vec<&str> = cards.iter().map(|c| c.card.title.as_str()).collect();
        assert_eq!(titles, ["Deploys", "Mine"]);
        assert_eq!(edits[0].proposed, 1);
        assert!(cards.iter().all(|c| c.card.labels == [WORKDIR_LABEL]));
        // Unchanged files are not edits.
        assert!(after.edits_since(&after, true).0.is_empty());
    }
}
