//! Criterion benches of zcrop's hot paths: coalescing, planning a batch, shard-index decoding,
//! decode + stitch of a whole shard, and random reads through io-core's backends.
//!
//! `cargo bench --bench hot_paths` (datasets are generated once under `<tmp>/zcrop-bench-data`).
//! For peer comparisons and cold-cache runs use `zcrop bench` and `benches/*.py`.

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use zcrop::bench::io::ensure_io_file;
use zcrop::bench::synth::{self, Codec, Layout, Spec};
use zcrop::io::{
    BackendChoice, CoalesceLimits, FastPath, IoConfig, IoEngine, ReadRange, ReadRequest, coalesce,
};
use zcrop::zarr::{Array, DimSelection, Plan};

fn dataset() -> std::path::PathBuf {
    // (16, 12, 1024, 1024) uint16, shards (16, 12, 512, 512), inner chunks (1, 1, 128, 128).
    let spec = Spec::with_size(200 << 20, Codec::Zstd, Layout::Sharded);
    synth::ensure(&spec, &synth::default_data_dir(), &|_, _| {}).expect("benchmark dataset")
}

fn random_crops(shape: &[u64], crop: &[u64], n: usize, seed: u64) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .flat_map(|_| {
            shape
                .iter()
                .zip(crop)
                .map(|(s, c)| rng.random_range(0..s - c + 1))
                .collect::<Vec<_>>()
        })
        .collect()
}

fn bench_coalesce(c: &mut Criterion) {
    let mut g = c.benchmark_group("coalesce");
    for n in [1_000usize, 100_000] {
        let mut rng = StdRng::seed_from_u64(1);
        let ranges: Vec<(u64, u64)> = (0..n)
            .map(|_| {
                (
                    rng.random_range(0..1 << 30),
                    4096 + rng.random_range(0..60_000),
                )
            })
            .collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("random_ranges", n), &ranges, |b, r| {
            b.iter(|| coalesce(black_box(r), CoalesceLimits::LOCAL));
        });
    }
    g.finish();
}

fn bench_plan(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan");
    let shape = [512u64, 12, 2048, 2048];
    let crop = [4u64, 12, 128, 128];
    for n in [32usize, 256] {
        let origins = random_crops(&shape, &crop, n, 2);
        let sels: Vec<Vec<DimSelection>> = origins
            .chunks_exact(4)
            .map(|o| {
                o.iter()
                    .zip(&crop)
                    .map(|(&start, &len)| DimSelection::Range { start, len })
                    .collect()
            })
            .collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("crops_4x12x128x128", n), &sels, |b, s| {
            b.iter(|| {
                Plan::with_output_element(&shape, &[1, 1, 128, 128], 2, 2, black_box(s))
                    .map(|p| p.num_leaves())
            });
        });
    }
    g.finish();
}

fn bench_shard_index(c: &mut Criterion) {
    let path = dataset();
    let a = Array::open(&path).expect("open");
    let size = a.shard_index_size().expect("sharded") as usize;
    let shard = std::fs::read(path.join("c/0/0/0/0")).expect("shard file");
    let index = shard[shard.len() - size..].to_vec();
    let mut g = c.benchmark_group("shard_index");
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function("decode_3072_entries_crc32c", |b| {
        b.iter(|| {
            a.decode_shard_index(black_box(&index), Some(shard.len() as u64))
                .map(|e| e.len())
        });
    });
    g.finish();
}

fn bench_decode_stitch(c: &mut Criterion) {
    let path = dataset();
    let a = Array::open(&path).expect("open");
    let mut g = c.benchmark_group("decode_stitch");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    // One whole shard (3072 inner chunks, 96 MiB decoded), read warm into one buffer.
    let shard = [16u64, 12, 512, 512];
    let mut out = vec![0u8; shard.iter().product::<u64>() as usize * 2];
    a.read_region_into(&[0, 0, 0, 0], &shard, &mut out)
        .expect("warm-up read");
    g.throughput(Throughput::Bytes(out.len() as u64));
    g.bench_function("one_shard_aligned", |b| {
        b.iter(|| {
            a.read_region_into(&[0, 0, 0, 0], &shard, &mut out)
                .map(|s| s.chunks_decoded)
        });
    });
    // The same amount of data as 32 random (4, 12, 128, 128) crops (unaligned: 4 chunks each).
    let crop = [4u64, 12, 128, 128];
    let origins = random_crops(a.shape(), &crop, 32, 3);
    let mut batch = vec![0u8; 32 * crop.iter().product::<u64>() as usize * 2];
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("batch_32_random_crops", |b| {
        b.iter(|| {
            a.read_batch_into(black_box(&origins), &crop, &mut batch)
                .map(|s| s.chunks_decoded)
        });
    });
    g.finish();
}

fn bench_io(c: &mut Criterion) {
    let file = ensure_io_file(&synth::default_data_dir(), 1 << 30).expect("io file");
    std::io::copy(
        &mut std::fs::File::open(&file).expect("open"),
        &mut std::io::sink(),
    )
    .expect("pre-read");
    let path: Arc<Path> = Arc::from(file.as_path());
    let mut g = c.benchmark_group("io_random_reads");
    g.sample_size(10);
    for (label, backend, direct) in [
        ("uring_warm", BackendChoice::Uring, false),
        ("portable_warm", BackendChoice::Portable, false),
        ("uring_direct", BackendChoice::Uring, true),
        ("portable_direct", BackendChoice::Portable, true),
    ] {
        for block in [4096u64, 65536] {
            let engine = IoEngine::new(IoConfig {
                backend,
                direct,
                queue_depth: 64,
                fast_path: FastPath::Auto,
                coalesce: CoalesceLimits {
                    max_gap: 0,
                    max_merged_len: 1,
                },
                ..IoConfig::default()
            })
            .expect("engine");
            let n = if direct { 2_000 } else { 20_000 };
            let mut rng = StdRng::seed_from_u64(block);
            let blocks = (1u64 << 30) / block;
            let reqs: Vec<ReadRequest> = (0..n)
                .map(|i| {
                    ReadRequest::new(
                        i,
                        Arc::clone(&path),
                        ReadRange::new(rng.random_range(0..blocks) * block, block),
                    )
                })
                .collect();
            g.throughput(Throughput::Elements(n));
            g.bench_function(BenchmarkId::new(label, block), |b| {
                b.iter(|| {
                    engine
                        .submit(reqs.clone())
                        .filter(|c| c.result.is_ok())
                        .count()
                });
            });
        }
    }
    g.finish();
}

criterion_group!(
    benches,
    bench_coalesce,
    bench_plan,
    bench_shard_index,
    bench_decode_stitch,
    bench_io
);
criterion_main!(benches);
