//! ARCHITECTURE.md's "must not" rules, kept by a test: each module's code (comment lines
//! and its top-level `#[cfg(test)]` items left out) must not name what its rule forbids.
//! A crate's `tests/rooms.rs` lists its rules and calls [`broken`]; a rule Rust's privacy
//! cannot express becomes a failed test instead of a sentence nobody checks.

use std::path::{Path, PathBuf};

/// A module (a file, or every file under a directory, relative to the crate's `src`), the
/// names its code must not use, and the rule of ARCHITECTURE.md they keep.
pub type Rule<'a> = (&'a str, &'a [&'a str], &'a str);

/// Every place under `src` where a module names what its rule forbids, as
/// `file:line: `name` (rule)`; empty when every rule holds.
pub fn broken(src: &Path, rules: &[Rule<'_>]) -> Vec<String> {
    let mut out = Vec::new();
    for (module, forbidden, rule) in rules {
        for file in files(src, module) {
            for (line, text) in code(&file) {
                for name in *forbidden {
                    if text.contains(name) {
                        out.push(format!(
                            "{}:{line}: `{name}` ({rule})",
                            file.strip_prefix(src).unwrap_or(&file).display()
                        ));
                    }
                }
            }
        }
    }
    out
}

/// The files of a module: the file itself, or every `.rs` file under its directory.
fn files(src: &Path, module: &str) -> Vec<PathBuf> {
    let path = src.join(module);
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
pub fn code(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The control experiment: the check finds a forbidden name where one is, and only
    /// there.
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
        let found = broken(
            dir.path(),
            &[("x.rs", &["crate::pool", "crate::tasks"], "a rule")],
        );
        assert_eq!(found, ["x.rs:2: `crate::pool` (a rule)"]);
    }
}
