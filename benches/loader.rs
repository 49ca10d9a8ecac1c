//! The loader against zarr-front's `read_batch_into` called directly in a loop, on the
//! loader benchmark's dataset (`LoaderBench::dataset`, written to a temporary directory).
//!
//! `cargo bench -p zcrop --bench loader` prints criterion's per-batch times for both,
//! then the `LoaderBench` summary (batches/s, GB/s, loader/direct time ratio) with a consumer
//! that takes no time and with one that takes 30 ms per batch (a GPU step), where the loader
//! overlaps reading with consumption and the direct loop cannot.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use zcrop::bench::loader::LoaderBench;
use zcrop::bench::synth;
use zcrop::sampler::{Loader, LoaderConfig, Shard};

fn loader(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dataset = LoaderBench::dataset();
    let path = synth::ensure(&dataset, dir.path(), &|_, _| {}).expect("the benchmark dataset");
    let bench = LoaderBench::default();
    let sampler = bench.sampler(&path).expect("the sampler");
    let batch_bytes = sampler.source(0).batch_bytes;

    let mut group = c.benchmark_group("loader");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Bytes(batch_bytes as u64));
    group.bench_function("direct_read_batch", |b| {
        let mut buf = vec![0u8; batch_bytes];
        let mut step = 0u64;
        b.iter(|| {
            let plan = sampler.plan(step, Shard::SINGLE).expect("a plan");
            sampler.read_into(&plan, 0, &mut buf, None).expect("a read");
            step += 1;
        });
    });
    group.bench_function("loader", |b| {
        let config = LoaderConfig {
            prefetch: bench.prefetch,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(sampler.clone(), config).expect("a loader");
        b.iter(|| drop(loader.next_batch().expect("a batch")));
    });
    group.finish();

    println!(
        "\ndataset: {:?} uint16 ({} MiB), shards {:?}, chunks {:?}, {:?}; crops {:?} x {} per batch",
        dataset.shape,
        dataset.bytes() >> 20,
        dataset.storage_chunk,
        dataset.inner_chunk,
        dataset.codec,
        bench.crop,
        bench.batch_size
    );
    for consume in [Duration::ZERO, Duration::from_millis(30)] {
        let run = LoaderBench {
            consume,
            ..bench.clone()
        };
        let report = run.run(&path).expect("the loader benchmark");
        println!("consumer {consume:?} per batch:\n{report}");
    }
}

criterion_group!(benches, loader);
criterion_main!(benches);
