//! Arbitrary bytes as array metadata (`zarr.json` or `.zarray`): opening must return an error or
//! an array, never panic; an opened array must answer its accessors and plan a small read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zcrop_zarr::{Array, OpenOptions};

fuzz_target!(|data: &[u8]| {
    let Some((&format, json)) = data.split_first() else { return };
    let format = if format & 1 == 0 { 2 } else { 3 };
    let dir = std::env::temp_dir().join("zcrop-fuzz-empty");
    if let Ok(a) = Array::from_metadata_json(json, format, &dir, &OpenOptions::default()) {
        let _ = (a.shape(), a.numpy_dtype(), a.chunk_shape(), a.shard_index_size());
        let nd = a.ndim();
        if nd > 0 && a.shape().iter().all(|&s| s > 0) && a.element_size() * nd <= 64 {
            let origin = vec![0u64; nd];
            let ones = vec![1u64; nd];
            let _ = a.output_len(&[ones.iter().map(|&len| zcrop_zarr::DimSelection::Range { start: 0, len }).collect()], 4);
            let _ = a.storage_key(&origin);
        }
    }
});
