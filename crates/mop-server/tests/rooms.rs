//! ARCHITECTURE.md's rules for the inside of mop-server, kept by a test: the arrows point
//! down (`api` and `console` → `state` → `service` → `store`), so no module names one above
//! it (comments and unit tests left out; the check itself, with its control experiment, is
//! `mop_testkit::rooms`).

use std::path::Path;

const RULES: &[mop_testkit::rooms::Rule<'static>] = &[
    (
        "store",
        &[
            "crate::service",
            "crate::api",
            "crate::console",
            "crate::state",
            "axum",
        ],
        "store reads and writes rows; what a request means is decided above it",
    ),
    (
        "service",
        &["crate::api", "crate::console", "crate::state", "axum"],
        "service decides without HTTP; handlers parse and answer",
    ),
    (
        "state.rs",
        &["crate::api", "crate::console"],
        "state sits below the handlers",
    ),
    (
        "metrics.rs",
        &["crate::api", "crate::state"],
        "metrics imports neither api nor state (api::track counts into it)",
    ),
    (
        "encoding.rs",
        &["crate::api", "crate::state"],
        "encoding sits below both state and api",
    ),
];

#[test]
fn each_module_keeps_to_its_rule() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let broken = mop_testkit::rooms::broken(&src, RULES);
    assert!(broken.is_empty(), "rules broken:\n{}", broken.join("\n"));
}
