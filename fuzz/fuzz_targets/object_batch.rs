//! libFuzzer entry point; the check is `mop_fuzz::object_batch`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::object_batch(data));
