//! libFuzzer entry point; the check is `mop_fuzz::mcp_jsonrpc`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mop_fuzz::mcp_jsonrpc(data));
