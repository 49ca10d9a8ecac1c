//! The stable driver of the fuzz targets (`fuzz/targets.rs`): each target's committed corpus
//! replayed, then seeded mutations of it for a fixed time. `scripts/test.sh` runs it as its
//! own step (`cargo test -p zcrop-zarr --test fuzz`); the cargo-fuzz binaries in
//! `zarr-front/fuzz` run the same targets coverage-guided.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use zcrop_zarr::Array;

#[path = "fuzz/targets.rs"]
mod targets;

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
    run("metadata", targets::metadata);
}

#[test]
fn fuzz_shard_index() {
    let arrays = arrays();
    run("shard_index", |d| targets::shard_index(&arrays, d));
}

#[test]
fn fuzz_chunk() {
    let arrays = arrays();
    run("chunk", |d| targets::chunk(&arrays, d));
}

#[test]
fn fuzz_chunk_range() {
    let arrays = arrays();
    run("chunk_range", |d| targets::chunk_range(&arrays, d));
}

#[test]
fn fuzz_lz4() {
    run("lz4", targets::lz4);
}

#[test]
fn fuzz_zstd_range() {
    run("zstd_range", targets::zstd_range);
}

#[test]
fn fuzz_blosc_blocks() {
    run("blosc_blocks", targets::blosc_blocks);
}

#[test]
fn fuzz_icechunk() {
    run("icechunk", targets::icechunk);
}

#[test]
fn fuzz_vlen() {
    run("vlen", targets::vlen);
}
