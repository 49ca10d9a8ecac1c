//! Arbitrary bytes as a chunk of the fixtures' arrays (every codec chain: blosc, zstd, gzip,
//! zlib, crc32c, transpose, big-endian, raw): decoding returns the chunk or an error, never
//! panics or reads out of bounds.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let arrays = common::root_arrays();
    let a = &arrays[pick as usize % arrays.len()];
    if let Ok(chunk) = a.decode_chunk(rest) {
        let n: u64 = a.chunk_shape().iter().product();
        assert_eq!(chunk.len() as u64, n * a.element_size() as u64);
    }
});
