//! `zcrop bench loader`: the sampler's loader against the same batches read directly.

use std::time::Duration;

use anyhow::{Result, bail};
use zcrop_zarr::Array;

/// Options of the loader benchmark (`zcrop bench loader`).
#[derive(Debug, Clone)]
pub struct LoaderBenchOptions {
    /// Crop shape of the (T, C, Y, X) array.
    pub crop: [u64; 4],
    /// Crops per batch.
    pub batch_size: usize,
    /// Timed batches per round.
    pub batches: u64,
    /// Untimed batches first.
    pub warmup: u64,
    /// Rounds; the fastest of each loop counts.
    pub rounds: u32,
    /// Batches the loader reads ahead.
    pub prefetch: usize,
    /// Batches the loader reads at once.
    pub workers: usize,
    /// Time the consumer spends on each batch (like a training step).
    pub consume: Duration,
    /// Convert to float32 in the stitch.
    pub to_f32: bool,
    /// Seed.
    pub seed: u64,
}

/// What the loader benchmark measured (stable field names).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoaderBenchJson {
    /// The array.
    pub path: String,
    /// Crop shape.
    pub crop_shape: Vec<u64>,
    /// Crops per batch.
    pub batch_size: usize,
    /// Timed batches per round.
    pub batches: u64,
    /// Rounds run (the fastest of each loop is reported).
    pub rounds: u32,
    /// `read_batch_into` called directly in a loop: batches/s.
    pub direct_batches_per_s: f64,
    /// Its GB/s (delivered).
    pub direct_gbps: f64,
    /// The prefetching loader: batches/s.
    pub loader_batches_per_s: f64,
    /// Its GB/s.
    pub loader_gbps: f64,
    /// Loader time over direct time (the pipeline's cost; below 1 when it overlaps consuming).
    pub time_ratio: f64,
    /// Seconds the consumer waited for data over the loader's timed batches.
    pub loader_wait_s: f64,
    /// Whether the loader's buffers are page-locked.
    pub page_locked: bool,
    /// Whether they are registered with CUDA.
    pub cuda_registered: bool,
    /// Why not, when they are not.
    pub pin_note: Option<String>,
}

/// Runs the sampler's loader against direct `read_batch_into` calls on the (T, C, Y, X) array
/// at `path`, crops following (t, y, x) with all of C.
pub fn run_loader(path: &std::path::Path, opts: &LoaderBenchOptions) -> Result<LoaderBenchJson> {
    use zcrop_sampler::bench::LoaderBench;
    use zcrop_sampler::{Dim, SampleSpec, Sampler, Source, Transform};
    let array = Array::open(path)?;
    if array.ndim() != 4 {
        bail!(
            "the loader benchmark needs a 4-d (T, C, Y, X) array; {} is {}-d",
            path.display(),
            array.ndim()
        );
    }
    let bench = LoaderBench {
        crop: opts.crop,
        batch_size: opts.batch_size,
        batches: opts.batches,
        warmup: opts.warmup,
        consume: opts.consume,
        rounds: opts.rounds,
        prefetch: opts.prefetch,
        workers: opts.workers,
        transform: if opts.to_f32 {
            Transform::to_f32()
        } else {
            Transform::none()
        },
        seed: opts.seed,
        ..LoaderBench::default()
    };
    let source = Source::new("data", array, opts.crop.to_vec())
        .dims([
            Dim::along("t"),
            Dim::fixed(0),
            Dim::along("y"),
            Dim::along("x"),
        ])
        .transform(bench.transform.clone());
    let sampler = Sampler::new(
        SampleSpec::new(["t", "y", "x"])
            .source(source)
            .seed(opts.seed)
            .batch_size(opts.batch_size),
    )?;
    let (mut direct, mut pipeline, mut pin) = (None, None, None);
    for _ in 0..opts.rounds.max(1) {
        let d = bench.run_direct(&sampler)?;
        let (p, state) = bench.run_pipeline(&sampler)?;
        if direct
            .as_ref()
            .is_none_or(|b: &zcrop_sampler::bench::RunStats| d.seconds < b.seconds)
        {
            direct = Some(d);
        }
        if pipeline
            .as_ref()
            .is_none_or(|b: &zcrop_sampler::bench::RunStats| p.seconds < b.seconds)
        {
            pipeline = Some(p);
        }
        pin = Some(state);
    }
    let (Some(d), Some(p), Some(pin)) = (direct, pipeline, pin) else {
        bail!("no rounds ran");
    };
    Ok(LoaderBenchJson {
        path: path.display().to_string(),
        crop_shape: opts.crop.to_vec(),
        batch_size: opts.batch_size,
        batches: opts.batches,
        rounds: opts.rounds.max(1),
        direct_batches_per_s: d.batches_per_s,
        direct_gbps: d.gb_per_s,
        loader_batches_per_s: p.batches_per_s,
        loader_gbps: p.gb_per_s,
        time_ratio: p.seconds / d.seconds,
        loader_wait_s: p.wait_seconds,
        page_locked: pin.page_locked,
        cuda_registered: pin.cuda_registered,
        pin_note: pin.reason.clone(),
    })
}
