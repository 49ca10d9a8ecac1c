//! Arbitrary bytes as a chunk of the fixtures' arrays (every codec chain: blosc, zstd, gzip,
//! zlib, crc32c, transpose, big-endian, raw): decoding returns the chunk or an error, never
//! panics or reads out of bounds.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zcrop_zarr::Array;

fn arrays() -> &'static Vec<Array> {
    static A: OnceLock<Vec<Array>> = OnceLock::new();
    A.get_or_init(|| {
        zcrop_fixtures::manifest()
            .iter()
            .filter(|f| f.array_path.is_empty())
            .filter_map(|f| Array::open(f.store_path()).ok())
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let arrays = arrays();
    let a = &arrays[pick as usize % arrays.len()];
    if let Ok(chunk) = a.decode_chunk(rest) {
        let n: u64 = a.chunk_shape().iter().product();
        assert_eq!(chunk.len() as u64, n * a.element_size() as u64);
    }
});
