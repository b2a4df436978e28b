//! libFuzzer entry point; the check is `mop_fuzz::intake`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::intake(data));
