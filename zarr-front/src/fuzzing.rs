//! The fuzz targets of zarr-front's parsers and decoders, as plain functions: each takes
//! arbitrary bytes and must return (an error inside is fine) without panicking, aborting or
//! reading out of bounds.
//!
//! Two drivers run them. The cargo-fuzz binaries in `zarr-front/fuzz` (feature `fuzzing`,
//! coverage-guided, for long runs that grow the corpus) and, on the stable toolchain in every
//! `cargo test`, the runner below: it replays the corpus committed in `zarr-front/fuzz/corpus`
//! and then mutates it for a fixed time (`ZCROP_FUZZ_SECONDS` per target, 1 by default; CI
//! runs longer).

use crate::{Array, DimSelection, OpenOptions};

/// Arbitrary bytes as array metadata (`zarr.json` or `.zarray`, by the first byte's low bit):
/// opening returns an error or an array; an opened array answers its accessors and sizes a
/// small read.
pub fn metadata(data: &[u8]) {
    let Some((&format, json)) = data.split_first() else {
        return;
    };
    let format = if format & 1 == 0 { 2 } else { 3 };
    let dir = std::env::temp_dir().join("zcrop-fuzz-empty");
    if let Ok(a) = Array::from_metadata_json(json, format, &dir, &OpenOptions::default()) {
        let _ = (
            a.shape(),
            a.numpy_dtype(),
            a.chunk_shape(),
            a.shard_index_size(),
        );
        let nd = a.ndim();
        if nd > 0 && a.shape().iter().all(|&s| s > 0) && a.element_size() * nd <= 64 {
            let origin = vec![0u64; nd];
            let one: Vec<DimSelection> = (0..nd)
                .map(|_| DimSelection::Range { start: 0, len: 1 })
                .collect();
            let _ = a.output_len(&[one], 4);
            let _ = a.storage_key(&origin);
        }
    }
}

/// Arbitrary bytes as the shard index of one of `arrays` (the first byte picks it; its high
/// bit keeps the bytes' own length, else they are repeated to the index's size, so decoding
/// goes deep): entries or an error, every entry's end representable.
pub fn shard_index(arrays: &[Array], data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let sharded: Vec<&Array> = arrays
        .iter()
        .filter(|a| a.shard_index_size().is_some())
        .collect();
    if sharded.is_empty() {
        return;
    }
    let a = sharded[pick as usize % sharded.len()];
    let size = a.shard_index_size().unwrap_or(0) as usize;
    let bytes: Vec<u8> = if pick & 0x80 == 0 {
        rest.iter().copied().cycle().take(size).collect()
    } else {
        rest.to_vec()
    };
    if let Ok(entries) = a.decode_shard_index(&bytes, Some(u64::from(pick) * 1000)) {
        assert!(
            entries
                .iter()
                .flatten()
                .all(|(o, n)| o.checked_add(*n).is_some())
        );
    }
}

/// Arbitrary bytes as a chunk of one of `arrays` (the first byte picks it): the decoded chunk,
/// of exactly the chunk's size, or an error.
pub fn chunk(arrays: &[Array], data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if arrays.is_empty() {
        return;
    }
    let a = &arrays[pick as usize % arrays.len()];
    if let Ok(chunk) = a.decode_chunk(rest) {
        let n: u64 = a.chunk_shape().iter().product();
        assert_eq!(chunk.len() as u64, n * a.element_size() as u64);
    }
}

/// Arbitrary bytes as a chunk of one of `arrays`, decoded only over a range (the partial zstd
/// block decoder, blosc's block decode, stopping early): the range's bytes or an error. Head:
/// array (1 byte), start and length (u16 LE each).
pub fn chunk_range(arrays: &[Array], data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<5>() else {
        return;
    };
    if arrays.is_empty() {
        return;
    }
    let a = &arrays[head[0] as usize % arrays.len()];
    let n = (a.chunk_shape().iter().product::<u64>() as usize * a.element_size()).max(1);
    let start = u16::from_le_bytes([head[1], head[2]]) as usize % n;
    let end = (start + u16::from_le_bytes([head[3], head[4]]) as usize).min(n);
    if let Ok(bytes) = a.decode_chunk_range(rest, start..end) {
        assert_eq!(bytes.len(), end - start);
    }
}

/// Arbitrary bytes as an LZ4 block (head: output size and target, u16 LE each), decoded whole
/// and up to the target by zcrop's decoder and by liblz4: zcrop's never panics or writes
/// outside its buffer, and wherever liblz4 decodes the block whole, zcrop's gives the same
/// bytes (liblz4 also lets through an offset of 0, which zcrop refuses, so a block liblz4
/// decodes may still be an error here); a prefix is what the whole block starts with.
pub fn lz4(data: &[u8]) {
    let Some((head, block)) = data.split_first_chunk::<4>() else {
        return;
    };
    let cap = usize::from(u16::from_le_bytes([head[0], head[1]])) % 20_000;
    let want = usize::from(u16::from_le_bytes([head[2], head[3]])) % (cap + 1);
    let mut ours = vec![0u8; cap];
    let mut theirs = vec![0u8; cap];
    let whole = zcrop_codec::lz4::decompress(block, &mut ours, cap);
    if let Some(n) = whole {
        assert!(n <= cap);
    }
    if let (Some(n), Some(m)) = (
        whole,
        zcrop_codec::ffi::lz4_decompress(block, &mut theirs, cap),
    ) {
        assert_eq!(n, m);
        assert_eq!(ours[..n], theirs[..n]);
    }
    let mut part = vec![0u8; cap];
    if let Some(n) = zcrop_codec::lz4::decompress(block, &mut part, want) {
        assert!(n <= cap);
        if let Some(w) = whole
            && n >= want
        {
            assert!(w >= want);
            assert_eq!(part[..want], ours[..want]);
        }
    }
}

#[cfg(test)]
mod runner {
    //! The stable driver: corpus replay, then seeded mutation for a fixed time per target.

    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    use crate::Array;

    /// Values that make length and offset fields interesting.
    const EDGES: [u64; 10] = [
        0,
        1,
        0x7f,
        0xff,
        0xffff,
        0x7fff_ffff,
        0xffff_ffff,
        1 << 33,
        1 << 62,
        u64::MAX,
    ];

    fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e} (the corpus is committed)", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{}: empty corpus", dir.display());
        files
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(&p).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// One mutation of `input`, sometimes spliced with `other`.
    fn mutate(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Vec<u8> {
        let mut v = input.to_vec();
        for _ in 0..rng.random_range(1..=4) {
            let len = v.len();
            match rng.random_range(0..8) {
                0 if len > 0 => {
                    let i = rng.random_range(0..len);
                    v[i] ^= 1 << rng.random_range(0..8);
                }
                1 if len > 0 => {
                    let i = rng.random_range(0..len);
                    v[i] = [0, 0xff, 0x7f, 0x80, b'[', b'{', b'"', b'9'][rng.random_range(0..8)];
                }
                2 if len >= 8 => {
                    // An interesting length or offset, little-endian, at a random place.
                    let i = rng.random_range(0..=len - 8);
                    let x = EDGES[rng.random_range(0..EDGES.len())];
                    v[i..i + 8].copy_from_slice(&x.to_le_bytes());
                }
                3 if len >= 4 => {
                    let i = rng.random_range(0..=len - 4);
                    let x = EDGES[rng.random_range(0..EDGES.len())] as u32;
                    v[i..i + 4].copy_from_slice(&x.to_le_bytes());
                }
                4 if len > 0 => v.truncate(rng.random_range(0..len)),
                5 if len > 0 => {
                    let a = rng.random_range(0..len);
                    let b = rng.random_range(a..=len.min(a + 64));
                    v.drain(a..b);
                }
                6 if len > 0 => {
                    // Repeat a slice in place (runs, nested brackets).
                    let a = rng.random_range(0..len);
                    let b = rng.random_range(a..=len.min(a + 32));
                    let piece = v[a..b].to_vec();
                    for _ in 0..rng.random_range(1..16) {
                        v.splice(a..a, piece.iter().copied());
                    }
                }
                _ if !other.is_empty() => {
                    let cut = rng.random_range(0..=v.len());
                    let from = rng.random_range(0..other.len());
                    v.truncate(cut);
                    v.extend_from_slice(&other[from..]);
                }
                _ => {}
            }
        }
        v
    }

    fn budget() -> Duration {
        let secs: f64 = std::env::var("ZCROP_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1.0);
        Duration::from_secs_f64(secs)
    }

    /// Replays `target`'s corpus through `f`, then mutations of it for the time budget. A
    /// panic names the input (and the seed that made it); an abort kills the test process,
    /// which fails the run as loudly.
    fn run(target: &str, f: impl Fn(&[u8])) {
        let f = AssertUnwindSafe(f);
        let entries = corpus(target);
        for (path, bytes) in &entries {
            if let Err(e) = catch_unwind(|| f(bytes)) {
                panic!("{target}: corpus entry {} fails: {e:?}", path.display());
            }
        }
        let seed: u64 = std::env::var("ZCROP_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(36);
        let mut rng = StdRng::seed_from_u64(seed ^ target.len() as u64);
        let (start, budget) = (Instant::now(), budget());
        let mut runs = 0u64;
        while start.elapsed() < budget {
            let (_, a) = &entries[rng.random_range(0..entries.len())];
            let (_, b) = &entries[rng.random_range(0..entries.len())];
            let input = mutate(&mut rng, a, b);
            if let Err(e) = catch_unwind(|| f(&input)) {
                let out = std::env::temp_dir().join(format!("zcrop-fuzz-{target}-{seed}-{runs}"));
                std::fs::write(&out, &input).unwrap();
                panic!(
                    "{target}: mutated input {runs} (ZCROP_FUZZ_SEED={seed}) fails: {e:?}; \
                     saved to {}",
                    out.display()
                );
            }
            runs += 1;
        }
        println!(
            "fuzz {target}: {} corpus entries, {runs} mutations in {:.1}s",
            entries.len(),
            start.elapsed().as_secs_f64()
        );
    }

    /// The fixtures' root arrays, as the cargo-fuzz targets open them.
    fn arrays() -> Vec<Array> {
        zcrop_fixtures::manifest()
            .iter()
            .filter(|f| f.array_path.is_empty())
            .filter_map(|f| Array::open(f.store_path()).ok())
            .collect()
    }

    #[test]
    fn fuzz_metadata() {
        run("metadata", super::metadata);
    }

    #[test]
    fn fuzz_shard_index() {
        let arrays = arrays();
        run("shard_index", |d| super::shard_index(&arrays, d));
    }

    #[test]
    fn fuzz_chunk() {
        let arrays = arrays();
        run("chunk", |d| super::chunk(&arrays, d));
    }

    #[test]
    fn fuzz_chunk_range() {
        let arrays = arrays();
        run("chunk_range", |d| super::chunk_range(&arrays, d));
    }

    #[test]
    fn fuzz_lz4() {
        run("lz4", super::lz4);
    }
}
