//! cargo-fuzz driver of `zstd_range` in `zarr-front/tests/fuzz/targets.rs` (see there for what it checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/targets.rs"]
#[allow(dead_code)]
mod targets;

fuzz_target!(|data: &[u8]| targets::zstd_range(data));
