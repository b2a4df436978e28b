//! libFuzzer entry point; the check is `mop_fuzz::daemon_requests`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::daemon_requests(data));
