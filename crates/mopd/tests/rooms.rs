//! The "must not" column of ARCHITECTURE.md's table for mopd, kept by a test: each
//! module's code (comments and its unit tests left out) must not name what its row
//! forbids (the check itself, with its control experiment, is `mop_testkit::rooms`).

use std::path::Path;

/// A module (a file, or every file under a directory) and the names its code must not use,
/// each with the rule of ARCHITECTURE.md it keeps.
const RULES: &[mop_testkit::rooms::Rule<'static>] = &[
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

#[test]
fn each_module_keeps_to_its_row_of_the_table() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = mop_testkit::rooms::broken(&src, RULES);
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}
