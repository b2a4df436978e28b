//! libFuzzer entry point; the check is `mop_fuzz::card_parser`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::card_parser(data));
