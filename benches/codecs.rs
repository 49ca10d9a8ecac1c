//! Criterion benches of zcrop's own decoders (crate `zcrop-codec`) against the C libraries
//! they stand beside, on the chunks `zcrop bench` reads: (1, 1, 128, 128) uint16 inner chunks
//! of the synthetic sharded dataset, zstd level 1 and blosc-lz4 with byte shuffle, taken from
//! a small copy of it generated into the data directory. Each decoder decodes a whole chunk
//! and the part a crop needs: the first quarter (a prefix: rows 0..32) and a middle band
//! (rows 48..80, which a prefix decoder must reach by decoding everything before it).
//!
//! - `zstd`: zcrop's literal-stream decoder, one chunk at a time (`zstd::decode_range`) and
//!   all eight together as zarr-front groups small chunks (`zstd::decode_many`), forced to
//!   run whatever share of the literals it needs, against libzstd decoding the whole frame and
//!   streaming until the band's end (what zarr-front falls back to).
//! - `lz4`: zcrop's LZ4 block decoder against liblz4 (`LZ4_decompress_safe`, and
//!   `LZ4_decompress_safe_partial` up to the band's end), on the byte-shuffled chunk as blosc
//!   stores it.
//! - `blosc`: zcrop's blosc reader (`blosc::open` the range, then `Chunk::gather`) against
//!   c-blosc (`blosc_decompress_ctx` whole, `blosc_getitem` for the band).
//!
//! Results and the keep-or-replace decisions: `benches/results/codecs-2026-11.md` and
//! docs/performance.md ("Own components and why"). `cargo bench --bench codecs`.

use std::hint::black_box;
use std::ops::Range;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use zcrop::bench::synth::{self, Codec, Layout, Spec};
use zcrop::zarr::Array;
use zcrop_codec::{blosc, ffi, lz4, zstd};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Inner chunks taken from the dataset per codec (different channels and places).
const CHUNKS: u64 = 8;
/// Bytes of one (128, 128) uint16 chunk row.
const ROW: usize = 256;

/// The ranges of a decoded chunk each decoder is asked for.
fn parts(n: usize) -> [(&'static str, Range<usize>); 3] {
    [
        ("whole", 0..n),
        ("first_quarter", 0..32 * ROW),
        ("middle_band", 48 * ROW..80 * ROW),
    ]
}

/// `CHUNKS` encoded inner chunks of the synthetic dataset written with `codec`, and each one
/// decoded (by zarr-front, checked against its libraries by the tests).
fn chunks(codec: Codec) -> Vec<(Vec<u8>, Vec<u8>)> {
    let spec = Spec::new([16, 12, 512, 512], codec, Layout::Sharded);
    let dir = synth::default_data_dir();
    std::fs::create_dir_all(&dir).expect("data directory");
    let path = synth::ensure(&spec, &dir, &|_, _| {}).expect("the synthetic dataset");
    let a = Array::open(&path).expect("open the synthetic dataset");
    let coords: Vec<Vec<u64>> = (0..CHUNKS)
        .map(|i| vec![i, i % 12, i % 4, (i + 1) % 4])
        .collect();
    a.read_encoded_chunks(&coords)
        .expect("read chunks")
        .into_iter()
        .map(|c| {
            let encoded = c.expect("every inner chunk is stored").to_vec();
            let decoded = a.decode_chunk(&encoded).expect("decode");
            (encoded, decoded)
        })
        .collect()
}

/// Byte shuffle of 2-byte elements, as blosc stores them before LZ4.
fn shuffle2(data: &[u8]) -> Vec<u8> {
    let (lo, hi): (Vec<u8>, Vec<u8>) = data.chunks_exact(2).map(|e| (e[0], e[1])).unzip();
    [lo, hi].concat()
}

/// libzstd, streaming `src` until `out` is full.
fn libzstd_prefix(dctx: &mut ::zstd::zstd_safe::DCtx<'_>, src: &[u8], out: &mut [u8]) {
    use ::zstd::zstd_safe::{InBuffer, OutBuffer, ResetDirective};
    dctx.reset(ResetDirective::SessionOnly).expect("reset");
    let want = out.len();
    let mut ob = OutBuffer::around(out);
    let mut ib = InBuffer::around(src);
    while ob.pos() < want {
        dctx.decompress_stream(&mut ob, &mut ib).expect("zstd");
    }
}

fn bench_zstd(c: &mut Criterion) {
    let chunks = chunks(Codec::Zstd);
    let n = chunks[0].1.len();
    let mut g = c.benchmark_group("zstd");
    let mut dctx = ::zstd::zstd_safe::DCtx::create();
    let (mut out, mut scratch) = (vec![0u8; n], Vec::new());
    for (part, range) in parts(n) {
        g.throughput(Throughput::Bytes((range.len() * chunks.len()) as u64));
        g.bench_function(BenchmarkId::new("zcrop", part), |b| {
            b.iter(|| {
                for (src, want) in &chunks {
                    let got = zstd::decode_range(src, &mut out, range.clone(), &mut scratch, 1.0)
                        .expect("own zstd");
                    debug_assert_eq!(out[range.clone()], want[range.clone()]);
                    black_box(got);
                }
            });
        });
        // As zarr-front decodes small chunks: several at once, their literal streams
        // interleaved (`zstd::decode_many`).
        let mut outs = vec![vec![0u8; n]; chunks.len()];
        let mut scratches = vec![Vec::new(); chunks.len()];
        g.bench_function(BenchmarkId::new("zcrop_many", part), |b| {
            b.iter(|| {
                let mut jobs: Vec<zstd::Job<'_>> = chunks
                    .iter()
                    .zip(outs.iter_mut().zip(scratches.iter_mut()))
                    .map(|((src, _), (out, scratch))| zstd::Job {
                        src,
                        out,
                        want: range.clone(),
                        scratch,
                    })
                    .collect();
                for r in zstd::decode_many(&mut jobs, 1.0) {
                    black_box(r.expect("own zstd"));
                }
            });
        });
        g.bench_function(BenchmarkId::new("libzstd_whole", part), |b| {
            b.iter(|| {
                for (src, _) in &chunks {
                    black_box(dctx.decompress(&mut out, src).expect("libzstd"));
                }
            });
        });
        g.bench_function(BenchmarkId::new("libzstd_prefix", part), |b| {
            b.iter(|| {
                for (src, _) in &chunks {
                    libzstd_prefix(&mut dctx, src, &mut out[..range.end]);
                    black_box(&out);
                }
            });
        });
    }
    g.finish();
}

fn bench_lz4(c: &mut Criterion) {
    let blocks: Vec<(Vec<u8>, Vec<u8>)> = chunks(Codec::BloscLz4)
        .into_iter()
        .map(|(_, decoded)| {
            let shuffled = shuffle2(&decoded);
            (ffi::compress::lz4_compress(&shuffled, false), shuffled)
        })
        .collect();
    let n = blocks[0].1.len();
    let mut g = c.benchmark_group("lz4");
    let mut out = vec![0u8; n];
    for (part, range) in parts(n) {
        g.throughput(Throughput::Bytes((range.len() * blocks.len()) as u64));
        g.bench_function(BenchmarkId::new("zcrop", part), |b| {
            b.iter(|| {
                for (src, want) in &blocks {
                    let got = lz4::decompress(src, &mut out, range.end).expect("own lz4");
                    debug_assert_eq!(out[..range.end], want[..range.end]);
                    black_box(got);
                }
            });
        });
        g.bench_function(BenchmarkId::new("liblz4", part), |b| {
            b.iter(|| {
                for (src, _) in &blocks {
                    black_box(ffi::lz4_decompress(src, &mut out, range.end).expect("liblz4"));
                }
            });
        });
    }
    g.finish();
}

fn bench_blosc(c: &mut Criterion) {
    let chunks = chunks(Codec::BloscLz4);
    let n = chunks[0].1.len();
    let mut g = c.benchmark_group("blosc");
    let mut out = vec![0u8; n];
    let mut scratch = blosc::Scratch::default();
    for (part, range) in parts(n) {
        g.throughput(Throughput::Bytes((range.len() * chunks.len()) as u64));
        g.bench_function(BenchmarkId::new("zcrop", part), |b| {
            b.iter(|| {
                for (src, want) in &chunks {
                    let chunk = blosc::open(src, range.clone(), &mut scratch).expect("own blosc");
                    chunk.gather(range.start, &mut out[range.clone()]);
                    debug_assert_eq!(out[range.clone()], want[range.clone()]);
                }
                black_box(&out);
            });
        });
        g.bench_function(BenchmarkId::new("c-blosc", part), |b| {
            b.iter(|| {
                for (src, _) in &chunks {
                    let header = ffi::blosc_header(src).expect("header");
                    if range.len() == n {
                        ffi::blosc_decompress(src, &header, &mut out).expect("c-blosc");
                    } else {
                        ffi::blosc_getitem(src, &header, range.start, &mut out[range.clone()])
                            .expect("c-blosc getitem");
                    }
                }
                black_box(&out);
            });
        });
    }
    g.finish();
}

criterion_group!(benches, bench_zstd, bench_lz4, bench_blosc);
criterion_main!(benches);
