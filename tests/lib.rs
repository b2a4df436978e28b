//! mop's whole-system tests: each file under `tests/` is one test binary, run against the
//! real binaries. The worlds they build (servers, daemons, PostgreSQL, cards) come from
//! the `mop-testkit` crate, which the benchmarks share.
