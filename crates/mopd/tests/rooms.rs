//! The "must not" column of ARCHITECTURE.md's table for mopd, kept by a test: each
//! module's code (comments and its unit tests left out) must not name what its row
//! forbids. A rule that Rust's privacy cannot express is a failed test here instead of a
//! sentence nobody checks.

use std::path::{Path, PathBuf};

/// A module (a file, or every file under a directory) and the names its code must not use,
/// each with the rule of ARCHITECTURE.md it keeps.
const RULES: &[(&str, &[&str], &str)] = &[
    (
        "paths.rs",
        &["std::fs", "tokio::fs", "fs::", "crate::"],
        "paths must not touch the file system",
    ),
    (
        "state.rs",
        &[
            "std::fs",
            "tokio::fs",
            "crate::files",
            "crate::pool",
            "crate::tasks",
        ],
        "state must not do I/O",
    ),
    (
        "client.rs",
        &["crate::pool", "crate::tasks", "crate::sync", "crate::files"],
        "client must not write into the pool",
    ),
    (
        "sync/plan.rs",
        &[
            "std::fs",
            "tokio",
            "crate::client",
            "reqwest",
            "crate::pool",
        ],
        "sync::plan must not do I/O",
    ),
    (
        "sync/fetch.rs",
        &["super::plan", "crate::sync::plan"],
        "sync::fetch must not decide what to fetch",
    ),
    (
        "sync",
        &["crate::tasks", "crate::sockets", "crate::status"],
        "sync must not touch task views, and keeps its own status record",
    ),
    (
        "pool",
        &[
            "crate::client",
            "crate::tasks",
            "crate::sockets",
            "crate::sync",
            "reqwest",
            "axum",
        ],
        "pool must not know of the network or tasks",
    ),
    (
        "tasks",
        &[
            "axum",
            "hyper",
            "reqwest",
            "crate::client",
            "crate::sockets",
        ],
        "tasks must not speak HTTP",
    ),
    (
        "receipts.rs",
        &["crate::sockets", "crate::tasks", "crate::agent"],
        "receipts must not decide what a task sees",
    ),
    (
        "spool.rs",
        &["crate::sockets", "crate::tasks", "crate::agent"],
        "spool must not decide what a store does",
    ),
    (
        "sockets",
        &["crate::pool", "crate::sync"],
        "sockets must not decide about tasks or pools",
    ),
    (
        "workspaces.rs",
        &["crate::client", "crate::sync::plan", "crate::sync::fetch"],
        "workspaces must not sync by itself",
    ),
    (
        "status",
        &[
            "crate::files",
            "fs::write",
            "File::create",
            "create_dir",
            "fs::rename",
            "record::save",
        ],
        "status must not change anything",
    ),
    (
        "metrics.rs",
        &["std::fs", "tokio::fs", "crate::tasks", "crate::pool"],
        "metrics must not do I/O or know of tasks",
    ),
    (
        "agent.rs",
        &["axum", "hyper", "crate::sockets"],
        "agent decides; HTTP is the socket's",
    ),
    (
        "files.rs",
        &["crate::"],
        "files knows nothing of mop's data",
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The files of a module: the file itself, or every `.rs` file under its directory.
fn files(module: &str) -> Vec<PathBuf> {
    let path = src().join(module);
    if path.is_file() {
        return vec![path];
    }
    let mut out = Vec::new();
    let mut stack = vec![path.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    assert!(
        !out.is_empty(),
        "{module}: no source files at {}",
        path.display()
    );
    out
}

/// A file's code: its lines numbered, without comment lines and without its top-level
/// `#[cfg(test)]` items (from the attribute to the item's closing `}` in column 0, or its
/// `;`).
fn code(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut in_test = false;
    for (i, line) in text.lines().enumerate() {
        if in_test {
            in_test = !(line == "}" || (line.ends_with(';') && !line.starts_with(' ')));
            continue;
        }
        if line.starts_with("#[cfg(test)]") {
            in_test = true;
            continue;
        }
        if !line.trim_start().starts_with("//") {
            out.push((i + 1, line.to_owned()));
        }
    }
    out
}

#[test]
fn each_module_keeps_to_its_row_of_the_table() {
    let mut broken = Vec::new();
    for (module, forbidden, rule) in RULES {
        for file in files(module) {
            for (line, text) in code(&file) {
                for name in *forbidden {
                    if text.contains(name) {
                        broken.push(format!(
                            "{}:{line}: `{name}` ({rule})",
                            file.strip_prefix(src()).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}

/// The control experiment: the check finds a forbidden name where one is.
#[test]
fn the_check_sees_a_forbidden_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "// crate::pool in a comment is fine\nuse crate::pool::Pool;\n#[cfg(test)]\nuse crate::tasks;\n\
         #[cfg(test)]\nmod tests {\n    use crate::sync;\n}\nfn after() { crate::files::replace(); }\n",
    )
    .unwrap();
    let lines = code(&file);
    let names: Vec<usize> = lines.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, [2, 9], "{lines:?}");
    assert!(lines[0].1.contains("crate::pool"));
    assert!(lines[1].1.contains("crate::files"));
}
