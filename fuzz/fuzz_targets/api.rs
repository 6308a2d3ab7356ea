//! Bytes -> a sequence of C API calls (valid and invalid), each checked against the reference
//! model. The decoder and checks live in tests/common, shared with the corpus replay test.
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/common/codec_ref.rs"]
mod codec_ref;

#[allow(dead_code)]
#[path = "../../tests/common/model.rs"]
mod model;

#[allow(dead_code)]
#[path = "../../tests/common/check.rs"]
mod check;

#[allow(dead_code)]
#[path = "../../tests/common/api_driver.rs"]
mod api_driver;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    api_driver::run_bytes(data);
});
