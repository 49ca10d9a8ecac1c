//! cargo-fuzz driver of `zcrop_zarr::fuzzing::chunk_range` (see there for what it checks).
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zcrop_zarr::fuzzing::chunk_range(common::root_arrays(), data));
