//! Arbitrary bytes as a chunk of the fixtures' arrays, decoded only over a range (the partial
//! zstd block decoder, blosc's block decode, stopping early): returns the range's bytes or an
//! error, never panics or reads out of bounds.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<5>() else { return };
    let arrays = common::root_arrays();
    let a = &arrays[head[0] as usize % arrays.len()];
    let n = (a.chunk_shape().iter().product::<u64>() as usize * a.element_size()).max(1);
    let start = u16::from_le_bytes([head[1], head[2]]) as usize % n;
    let end = (start + u16::from_le_bytes([head[3], head[4]]) as usize).min(n);
    if let Ok(bytes) = a.decode_chunk_range(rest, start..end) {
        assert_eq!(bytes.len(), end - start);
    }
});
