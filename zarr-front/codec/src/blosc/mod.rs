//! Reading a byte range of a blosc chunk without decoding all of it.
//!
//! c-blosc (format 2, as every c-blosc 1.x and numcodecs writes) decodes whole blocks: each of
//! a block's splits (one byte stream per byte of the type, when shuffled) is decompressed or
//! copied into a temporary buffer, then the whole block is unshuffled into the output. A crop
//! that needs a quarter of a chunk pays for all of it, and a blosc chunk of imagery is mostly
//! copying: the low bytes of 16-bit samples do not compress, so their split is stored raw and
//! c-blosc copies it only to read it again when unshuffling.
//!
//! This module parses the buffer itself and, for each block that holds needed bytes:
//! - takes splits stored raw straight from the encoded bytes, without copying them;
//! - decompresses LZ4 splits only as far as the last needed byte ([`crate::lz4`]);
//! - decodes zstd splits (one zstd frame each) in part where that pays ([`crate::zstd`]), else
//!   whole with libzstd;
//!
//! and [`Chunk::gather`] unshuffles just the bytes asked for, into a scratch chunk or straight
//! into the crops ([`Chunk::gather_group`] into a stitch's [`crate::dest::Rows`]), so the
//! needed bytes are touched once.
//!
//! A bitshuffled block stores bit `b` of byte `k` of every element in row `8 * k + b`, so any
//! band of elements needs a band of every row, and its splits decode (almost) whole. Only the
//! needed groups of 8 elements are transposed back, into byte planes laid out as the byte
//! shuffle's, which the unshuffle then reads like a byte-shuffled block.
//!
//! Left to c-blosc (an `Err` here, and the caller falls back): splits compressed with anything
//! but LZ4 or zstd (blosclz, zlib, snappy), and anything this parser calls damaged (c-blosc then
//! words the error). As with any decoder that stops early, the bytes of a chunk
//! outside the needed range are not verified.

mod blocks;
mod frame;
mod gather;

pub use blocks::BlockIndex;
pub use frame::{
    Chunk, Error, OTHER_COMPRESSOR, Scratch, decoded_size, decodes_fast, open, prefetch,
};

#[cfg(test)]
mod tests {
    use super::frame::{HEADER, MEMCPYED, Seg};
    use super::*;
    use crate::ffi::compress::blosc_compress as compress;
    use rand::{RngExt, SeedableRng};

    /// Imagery-like 16-bit samples: a smooth field plus noise in the low byte.
    fn imagery(rng: &mut rand::rngs::StdRng, n: usize, elsize: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * elsize);
        let mut v: u64 = rng.random();
        for i in 0..n {
            if i % 97 == 0 {
                v = v.wrapping_add(rng.random_range(0..1000));
            }
            let x = v.wrapping_add(rng.random_range(0..256u64)) ^ ((i as u64 / 128) << 9);
            out.extend((0..elsize).map(|b| x.to_le_bytes()[b % 8]));
        }
        out
    }

    #[test]
    fn the_header_tells_which_chunks_decode_at_copy_speed() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let plain = imagery(&mut rng, 1 << 14, 2);
        for (cname, fast) in [
            ("lz4", true),
            ("lz4hc", true),
            ("blosclz", true),
            ("zstd", false),
            ("zlib", false),
        ] {
            let encoded = compress(&plain, 2, 1, cname, 0);
            assert_eq!(decodes_fast(&encoded), fast, "{cname}");
        }
        // Stored raw (random bytes do not compress): a copy.
        let noise: Vec<u8> = (0..1 << 14).map(|_| rng.random()).collect();
        let stored = compress(&noise, 1, 0, "zstd", 0);
        assert_ne!(stored[2] & MEMCPYED, 0);
        assert!(decodes_fast(&stored));
        assert!(!decodes_fast(&stored[..2]), "no header");
    }

    fn check_ranges(encoded: &[u8], expected: &[u8], rng: &mut rand::rngs::StdRng, what: &str) {
        let mut scratch = Scratch::default();
        let len = expected.len();
        for t in 0..40 {
            let (a, b) = match t {
                0 => (0, len),
                1 => (0, 1.min(len)),
                2 => (len.saturating_sub(3), len),
                _ => {
                    let a = rng.random_range(0..=len);
                    (a, rng.random_range(a..=len))
                }
            };
            prefetch(encoded, a..b);
            let chunk =
                open(encoded, a..b, &mut scratch).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let mut out = vec![0xAAu8; b - a];
            chunk.gather(a, &mut out);
            assert_eq!(out, expected[a..b], "{what}: range {a}..{b}");
            // Gathered in pieces, as the stitch asks for rows.
            if b > a {
                let mid = rng.random_range(a..=b);
                let mut pieces = vec![0u8; b - a];
                let (head, tail) = pieces.split_at_mut(mid - a);
                chunk.gather(a, head);
                chunk.gather(mid, tail);
                assert_eq!(
                    pieces,
                    expected[a..b],
                    "{what}: pieces of {a}..{b} at {mid}"
                );
            }
        }
    }

    #[test]
    fn ranges_equal_c_blosc_across_layouts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut tried, mut several_blocks, mut bits) = (0, 0, 0);
        for &elsize in &[1usize, 2, 4, 8, 3, 16] {
            for &n in &[1usize, 7, 100, 1000, 16384, 40000, 150_000] {
                for &(shuffle, cname) in &[
                    (1, "lz4"),
                    (0, "lz4"),
                    (1, "lz4hc"),
                    (1, "blosclz"),
                    (2, "lz4"),
                    (1, "zstd"),
                    (0, "zstd"),
                    (2, "zstd"),
                ] {
                    for &blocksize in &[0usize, 4096] {
                        let data = if rng.random_bool(0.3) {
                            (0..n * elsize).map(|_| rng.random()).collect()
                        } else {
                            imagery(&mut rng, n, elsize)
                        };
                        let encoded = compress(&data, elsize, shuffle, cname, blocksize);
                        let what = format!(
                            "elsize {elsize} n {n} shuffle {shuffle} {cname} bs {blocksize}"
                        );
                        match open(&encoded, 0..data.len(), &mut Scratch::default()) {
                            Ok(chunk) => {
                                if chunk.layout.blocksize < chunk.layout.nbytes {
                                    several_blocks += 1;
                                }
                                if chunk.layout.bits {
                                    bits += 1;
                                }
                                check_ranges(&encoded, &data, &mut rng, &what);
                                tried += 1;
                            }
                            // blosclz (when a split compresses) is c-blosc's.
                            Err(Error::Unsupported(_)) => {
                                assert!(cname == "blosclz", "{what}");
                            }
                            Err(e) => panic!("{what}: {e:?}"),
                        }
                    }
                }
            }
        }
        assert!(tried > 300, "only {tried} layouts took this path");
        assert!(bits > 50, "only {bits} bitshuffled layouts");
        assert!(
            several_blocks > 20,
            "only {several_blocks} chunks of several blocks"
        );
    }

    #[test]
    fn the_bit_transpose_swaps_rows_and_columns() {
        // Row 0 all ones: bit 0 of every byte. The diagonal stays.
        assert_eq!(frame::transpose_bits(0xFF), 0x0101_0101_0101_0101);
        let diagonal = u64::from_le_bytes(std::array::from_fn(|r| 1u8 << r));
        assert_eq!(frame::transpose_bits(diagonal), diagonal);
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..1000 {
            let x: u64 = rng.random();
            let t = frame::transpose_bits(x);
            for (r, c) in (0..8).flat_map(|r| (0..8).map(move |c| (r, c))) {
                assert_eq!(
                    (x >> (8 * r + c)) & 1,
                    (t >> (8 * c + r)) & 1,
                    "{x:#x} bit {r},{c}"
                );
            }
        }
    }

    #[test]
    fn a_needed_prefix_stops_the_lz4_split_early() {
        // Constant high bytes compress; random low bytes are stored raw.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let data: Vec<u8> = (0..16384).flat_map(|_| [rng.random::<u8>(), 7u8]).collect();
        let encoded = compress(&data, 2, 1, "lz4", 0);
        let mut scratch = Scratch::default();
        let chunk = open(&encoded, 0..200, &mut scratch).unwrap();
        // 100 elements: 100 bytes of each of the two splits.
        assert_eq!(chunk.decoded_bytes(), 200);
        assert_eq!(chunk.segs, [Seg::Raw(24), Seg::Decoded]);
        let chunk = open(&encoded, 1000..1001, &mut scratch).unwrap();
        // Both splits up to element 500: the LZ4 one decodes that far, the raw one is only
        // read at element 500.
        assert_eq!(chunk.decoded_bytes(), 2 * 501);
        let mut out = [0u8];
        chunk.gather(1000, &mut out);
        assert_eq!(out[0], data[1000]);
        // A prefix of most of the LZ4 split decodes only that far too: 15000 elements of each
        // split.
        let chunk = open(&encoded, 0..30000, &mut scratch).unwrap();
        assert_eq!(chunk.decoded_bytes(), 2 * 15000);
        let mut out = vec![0u8; 30000];
        chunk.gather(0, &mut out);
        assert_eq!(out, data[..30000]);
    }

    /// c-blosc does not split zstd blocks: a shuffled block is one zstd frame of its byte
    /// planes one after the other, so a band of elements needs a band of each plane.
    #[test]
    fn zstd_blocks_decode_in_part_where_the_band_is_early() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let data = imagery(&mut rng, 16384, 2);
        let mut scratch = Scratch::default();
        let plain = compress(&data, 2, 0, "zstd", 0);
        let chunk = open(&plain, 0..4000, &mut scratch).unwrap();
        assert!(chunk.decoded_bytes() < 8000, "{}", chunk.decoded_bytes());
        let mut out = vec![0u8; 4000];
        chunk.gather(0, &mut out);
        assert_eq!(out, data[..4000]);
        // Shuffled: the high bytes' plane starts half way, so even a short band needs more
        // than half of the block, and libzstd decodes it whole.
        let shuffled = compress(&data, 2, 1, "zstd", 0);
        let chunk = open(&shuffled, 0..4000, &mut scratch).unwrap();
        assert_eq!(chunk.decoded_bytes(), data.len());
        chunk.gather(0, &mut out);
        assert_eq!(out, data[..4000]);
    }

    #[test]
    fn damaged_buffers_are_errors_not_panics() {
        for cname in ["lz4", "zstd"] {
            damaged_buffers_of(cname);
        }
    }

    fn damaged_buffers_of(cname: &str) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let data = imagery(&mut rng, 16384, 2);
        let good = compress(&data, 2, 1, cname, 0);
        let mut corrupt = 0;
        for t in 0..3000 {
            let mut bad = good.clone();
            match t % 3 {
                0 => bad.truncate(rng.random_range(0..good.len())),
                1 => {
                    for _ in 0..rng.random_range(1..4) {
                        let i = rng.random_range(0..bad.len());
                        bad[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                _ => {
                    let i = rng.random_range(HEADER..bad.len());
                    for b in &mut bad[i..] {
                        *b = rng.random();
                    }
                }
            }
            let a = rng.random_range(0..data.len());
            let b = rng.random_range(a..=data.len());
            // Prefetching reads the header too, and must not trip over damage either.
            prefetch(&bad, a..b);
            match open(&bad, a..b, &mut Scratch::default()) {
                Ok(chunk) => {
                    let mut out = vec![0; b - a];
                    chunk.gather(a, &mut out);
                }
                Err(Error::Corrupt(_)) => corrupt += 1,
                Err(Error::Unsupported(_)) => {}
            }
        }
        assert!(
            corrupt > 500,
            "{cname}: only {corrupt} damaged buffers detected"
        );
        // Found by fuzzing: a compressed size below the header's own.
        for ctbytes in [0i32, 3, 15] {
            let mut bad = good.clone();
            bad[12..16].copy_from_slice(&ctbytes.to_le_bytes());
            assert!(matches!(
                open(&bad, 0..10, &mut Scratch::default()),
                Err(Error::Corrupt(_))
            ));
        }
    }

    #[test]
    fn stored_chunks_and_a_range_past_the_end() {
        let data: Vec<u8> = (0..=255).collect();
        // Random bytes do not compress: c-blosc stores the chunk (the memcpyed flag).
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let noise: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        let stored = compress(&noise, 1, 0, "lz4", 0);
        assert_ne!(stored[2] & MEMCPYED, 0, "expected a stored chunk");
        check_ranges(&stored, &noise, &mut rng, "stored");
        let encoded = compress(&data, 1, 0, "lz4", 0);
        assert!(matches!(
            open(&encoded, 0..257, &mut Scratch::default()),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(decoded_size(&encoded), Some(256));
    }
}
