//! Arbitrary bytes as an LZ4 block, decoded whole and up to a target by zcrop's decoder and by
//! liblz4: zcrop's never panics or touches memory outside its buffers, and wherever liblz4
//! decodes the block whole, zcrop's gives the same bytes (liblz4 also lets through an offset of
//! 0, which zcrop refuses, so a block liblz4 decodes may still be an error here).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zcrop_zarr::fuzzing::{liblz4, lz4};

fuzz_target!(|data: &[u8]| {
    let Some((head, block)) = data.split_first_chunk::<4>() else { return };
    let cap = usize::from(u16::from_le_bytes([head[0], head[1]])) % 20_000;
    let want = usize::from(u16::from_le_bytes([head[2], head[3]])) % (cap + 1);
    let mut ours = vec![0u8; cap];
    let mut theirs = vec![0u8; cap];
    let whole = lz4(block, &mut ours, cap);
    if let Some(n) = whole {
        assert!(n <= cap);
    }
    if let (Some(n), Some(m)) = (whole, liblz4(block, &mut theirs, cap)) {
        assert_eq!(n, m);
        assert_eq!(ours[..n], theirs[..n]);
    }
    let mut part = vec![0u8; cap];
    if let Some(n) = lz4(block, &mut part, want) {
        assert!(n <= cap);
        // A prefix is what the whole block starts with.
        if let Some(w) = whole
            && n >= want
        {
            assert!(w >= want);
            assert_eq!(part[..want], ours[..want]);
        }
    }
});
