//! cargo-fuzz driver of `zcrop_zarr::fuzzing::lz4` (see there for what it checks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| zcrop_zarr::fuzzing::lz4(data));
