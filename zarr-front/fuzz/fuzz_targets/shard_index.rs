//! cargo-fuzz driver of `shard_index` in `zarr-front/tests/fuzz/targets.rs` (see there for what it checks).
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/fuzz/targets.rs"]
#[allow(dead_code)]
mod targets;

fuzz_target!(|data: &[u8]| targets::shard_index(common::root_arrays(), data));
