//! libFuzzer entry point; the check is `mop_fuzz::memory_md`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::memory_md(data));
