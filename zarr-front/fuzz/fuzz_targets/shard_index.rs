//! Arbitrary bytes as the shard index of the fixtures' sharded arrays (with and without a
//! crc32c): decoding returns entries or an error, never panics.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zcrop_zarr::Array;

fn arrays() -> &'static Vec<Array> {
    static A: OnceLock<Vec<Array>> = OnceLock::new();
    A.get_or_init(|| {
        ["v3_sharded_end", "v3_sharded_start", "v3_sharded_partial_nocrc_u1", "v3_nested_sharding"]
            .iter()
            .map(|n| Array::open(zcrop_fixtures::get(n).store_path()).expect("fixture opens"))
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let arrays = arrays();
    let a = &arrays[pick as usize % arrays.len()];
    let size = a.shard_index_size().unwrap_or(0) as usize;
    // Mostly well-sized inputs (so decoding goes deep), sometimes any length.
    let bytes: Vec<u8> = if pick & 0x80 == 0 { rest.iter().copied().cycle().take(size).collect() } else { rest.to_vec() };
    if let Ok(entries) = a.decode_shard_index(&bytes, Some(u64::from(pick) * 1000)) {
        assert!(entries.iter().flatten().all(|(o, n)| o.checked_add(*n).is_some()));
    }
});
