//! Replays every kept fuzz input (the seeds and each crash `fuzz/run.sh` found, saved in
//! `fuzz/regressions/<target>/`) through the same checks the fuzz targets run, so a bug
//! found by fuzzing once stays fixed. `fuzz/run.sh` does the fuzzing itself.

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files: Vec<PathBuf> = ["seeds", "regressions"]
        .iter()
        .flat_map(|kind| {
            std::fs::read_dir(root.join(kind).join(target))
                .unwrap_or_else(|e| panic!("fuzz/{kind}/{target}: {e}"))
                .map(|e| e.unwrap().path())
        })
        .filter(|p| p.file_name().is_some_and(|n| n != ".gitkeep"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no kept inputs for {target}");
    files
}

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let files = inputs(target);
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!("{} fails its fuzz check again", f.display());
        }
    }
    files.len()
}

#[test]
fn card_parser_inputs_still_pass() {
    // The regression: a frontmatter key made of control characters parsed, was kept as an
    // unknown key, and then could not be rendered back. Raw control characters in the
    // frontmatter, and keys that are not plain names, are now refused.
    let n = replay("card_parser", mop_fuzz::card_parser);
    assert!(n >= 13, "{n}");
    let crash = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/regressions/card_parser/control-chars-in-unknown-key"),
    )
    .unwrap();
    let err = mop_cards::parse_card(&crash).unwrap_err();
    assert!(
        err.to_string().contains("control character U+0016"),
        "{err}"
    );
}

#[test]
fn memory_md_inputs_still_pass() {
    replay("memory_md", mop_fuzz::memory_md);
}

#[test]
fn daemon_request_inputs_still_pass() {
    replay("daemon_requests", mop_fuzz::daemon_requests);
}

#[test]
fn object_batch_inputs_still_pass() {
    let n = replay("object_batch", mop_fuzz::object_batch);
    assert!(n >= 5, "{n}");
}

#[test]
fn mcp_jsonrpc_inputs_still_pass() {
    let n = replay("mcp_jsonrpc", mop_fuzz::mcp_jsonrpc);
    assert!(n >= 7, "{n}");
}

#[test]
fn intake_inputs_still_pass() {
    let n = replay("intake", mop_fuzz::intake);
    assert!(n >= 7, "{n}");
}
