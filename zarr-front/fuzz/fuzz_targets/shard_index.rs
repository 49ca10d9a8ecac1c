//! cargo-fuzz driver of `zcrop_zarr::fuzzing::shard_index` (see there for what it checks).
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zcrop_zarr::fuzzing::shard_index(common::root_arrays(), data));
