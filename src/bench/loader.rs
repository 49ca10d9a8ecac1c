//! `zcrop bench loader` and `cargo bench --bench loader`: the sampler's [`Loader`] against the
//! same batches read by calling zarr-front's `read_batch_into` directly in a loop.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use zcrop_sampler::{
    Cells, Dim, Loader, LoaderConfig, Mask, PinOptions, PinState, SampleSpec, Sampler, Shard,
    Source, Transform,
};
use zcrop_zarr::Array;

use super::synth::{Codec, Layout, Spec};

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
    /// The share of positions a full-resolution mask keeps (1: no mask).
    pub mask_keep: f64,
    /// Add a second source aligned by label tables (see [`LoaderBench::aligned`]).
    pub aligned: bool,
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
    /// The share of positions the mask kept (1: no mask).
    pub mask_keep: f64,
    /// The runs the mask was stored as (0: no mask).
    pub mask_runs: usize,
    /// Whether a second source aligned by label tables was read.
    pub aligned: bool,
    /// Whether the loader's buffers are page-locked.
    pub page_locked: bool,
    /// Whether they are registered with CUDA.
    pub cuda_registered: bool,
    /// Why not, when they are not.
    pub pin_note: Option<String>,
}

/// What one run of batches did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunStats {
    /// Batches timed.
    pub batches: u64,
    /// Bytes delivered (all sources).
    pub bytes: u64,
    /// Wall time of the timed batches.
    pub seconds: f64,
    /// Batches per second.
    pub batches_per_s: f64,
    /// Delivered GB (10^9 bytes) per second.
    pub gb_per_s: f64,
    /// Time the consumer spent waiting for data (the whole read, for the direct loop).
    pub wait_seconds: f64,
}

impl RunStats {
    fn new(batches: u64, bytes: u64, elapsed: Duration, wait: Duration) -> RunStats {
        let seconds = elapsed.as_secs_f64();
        RunStats {
            batches,
            bytes,
            seconds,
            batches_per_s: batches as f64 / seconds,
            gb_per_s: bytes as f64 / seconds / 1e9,
            wait_seconds: wait.as_secs_f64(),
        }
    }
}

/// The loader benchmark: `batches` batches of `batch_size` crops of `crop` from a (T, C, Y, X)
/// array (crops follow t, y and x and start at channel 0), after `warmup` untimed ones, read (a) by calling `read_batch_into`
/// directly in a loop and (b) through a [`Loader`]; after each batch the consumer "works" for
/// `consume` (a sleep, like waiting on a GPU step). Each is run `rounds` times; the fastest
/// round counts.
#[derive(Debug, Clone)]
pub struct LoaderBench {
    /// Crop shape.
    pub crop: [u64; 4],
    /// Crops per batch.
    pub batch_size: usize,
    /// Timed batches per round.
    pub batches: u64,
    /// Untimed batches before them.
    pub warmup: u64,
    /// The consumer's time per batch.
    pub consume: Duration,
    /// Rounds (the fastest counts).
    pub rounds: u32,
    /// The loader's prefetch depth.
    pub prefetch: usize,
    /// The loader's worker threads.
    pub workers: usize,
    /// The transform (the same in both loops).
    pub transform: Transform,
    /// Page-locking and CUDA registration of the loader's buffers.
    pub pin: PinOptions,
    /// The seed.
    pub seed: u64,
    /// The share of positions a full-resolution mask keeps (1: no mask): in each (t, y) row
    /// one stretch of x, placed by a hash, as a NaN-free region of real data would be.
    pub mask_keep: f64,
    /// A second source aligned by label tables, as coordinate alignment builds them: the
    /// frame at or before each position's on a 4x coarser time axis, and rows and columns
    /// looked up on a 4x coarser grid (crops of a quarter the size in y and x).
    pub aligned: bool,
}

impl Default for LoaderBench {
    fn default() -> Self {
        LoaderBench {
            crop: [4, 12, 128, 128],
            batch_size: 8,
            batches: 40,
            warmup: 4,
            consume: Duration::ZERO,
            rounds: 3,
            prefetch: 4,
            workers: 2,
            transform: Transform::none(),
            pin: PinOptions::default(),
            seed: 0,
            mask_keep: 1.0,
            aligned: false,
        }
    }
}

/// Both loops' results.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderBenchReport {
    /// `read_batch_into` called directly in a loop.
    pub direct: RunStats,
    /// The same batches through the loader.
    pub pipeline: RunStats,
    /// Pipeline wall time over direct wall time (below 1: the pipeline is faster).
    pub time_ratio: f64,
    /// The loader's buffers.
    pub pin_state: PinState,
}

impl std::fmt::Display for LoaderBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, r) in [
            ("direct read_batch", &self.direct),
            ("loader", &self.pipeline),
        ] {
            writeln!(
                f,
                "{name:>17}: {:>4} batches in {:>7.3} s = {:>7.1} batches/s, {:>6.3} GB/s, consumer waited {:.3} s",
                r.batches, r.seconds, r.batches_per_s, r.gb_per_s, r.wait_seconds
            )?;
        }
        write!(
            f,
            "loader / direct time: {:.3} (pinned: {}, CUDA-registered: {})",
            self.time_ratio, self.pin_state.page_locked, self.pin_state.cuda_registered
        )
    }
}

impl LoaderBench {
    /// The sampler this benchmark reads with, over the (T, C, Y, X) array at `path`.
    pub fn sampler(&self, path: &Path) -> Result<Sampler> {
        let array = Array::open(path)?;
        if array.ndim() != 4 {
            bail!(
                "the loader benchmark needs a 4-d (T, C, Y, X) array; {} is {}-d",
                path.display(),
                array.ndim()
            );
        }
        let shape = array.shape().to_vec();
        let source = Source::new("data", array.clone(), self.crop)
            .dims([
                Dim::along("t"),
                Dim::fixed(0),
                Dim::along("y"),
                Dim::along("x"),
            ])
            .transform(self.transform.clone());
        let mut spec = SampleSpec::new(["t", "y", "x"])
            .source(source)
            .seed(self.seed)
            .batch_size(self.batch_size);
        if self.aligned {
            // Tables as `align="previous"` (time) and `"nearest"` (space) give them.
            let [_, cc, cy, cx] = self.crop;
            let coarse = [1, cc, (cy / 4).max(1), (cx / 4).max(1)];
            let t: Vec<i64> = (0..shape[0] as i64).map(|p| p - p % 4).collect();
            let quarter = |n: u64| -> Vec<i64> { (0..n as i64).map(|p| (p + 2) / 4).collect() };
            spec = spec.source(
                Source::new("aligned", array, coarse)
                    .dims([
                        Dim::lookup("t", t),
                        Dim::fixed(0),
                        Dim::lookup("y", quarter(shape[2])),
                        Dim::lookup("x", quarter(shape[3])),
                    ])
                    .transform(self.transform.clone()),
            );
        }
        if self.mask_keep < 1.0 {
            spec = spec.mask(self.mask(&shape)?);
        }
        Ok(Sampler::new(spec)?)
    }

    /// The benchmark's mask over the (t, y, x) positions of an array of `shape`.
    pub fn mask(&self, shape: &[u64]) -> Result<Mask> {
        if !(self.mask_keep > 0.0 && self.mask_keep <= 1.0) {
            bail!(
                "the mask must keep a share in (0, 1], got {}",
                self.mask_keep
            );
        }
        let (t, y, x) = (shape[0], shape[2], shape[3]);
        let width = ((x as f64 * self.mask_keep).round() as u64).clamp(1, x);
        let runs = (0..t * y)
            .map(|row| {
                let start = row.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (x - width + 1);
                (row * x + start, row * x + start + width)
            })
            .collect();
        Ok(Mask::from_runs(
            vec![t, y, x],
            Cells::Size(vec![1, 1, 1]),
            runs,
        )?)
    }

    /// The benchmark dataset of `cargo bench --bench loader`: the default workload's layout
    /// (shards of (T, 12, Y, X) with zstd inner chunks of (1, 1, 128, 128)) at 96 MiB.
    pub fn dataset() -> Spec {
        Spec::new([16, 12, 512, 512], Codec::Zstd, Layout::Sharded)
            .chunked([8, 12, 256, 256], [1, 1, 128, 128])
    }

    fn consume(&self) {
        if !self.consume.is_zero() {
            std::thread::sleep(self.consume);
        }
    }

    /// Times the direct loop: plan, `read_batch_into` every source, consume.
    pub fn run_direct(&self, sampler: &Sampler) -> Result<RunStats> {
        let mut bufs: Vec<Vec<u8>> = sampler
            .sources()
            .iter()
            .map(|s| vec![0u8; s.batch_bytes])
            .collect();
        let bytes: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.timed(bytes, |step| {
            let plan = sampler.plan(step, Shard::SINGLE)?;
            for (s, buf) in bufs.iter_mut().enumerate() {
                sampler.read_into(&plan, s, buf, None)?;
            }
            Ok(())
        })
    }

    /// Runs `warmup + batches` steps of `fetch` then consume, timing the last `batches`: the
    /// wall time and the time spent in `fetch`. What `fetch` returns is dropped after consuming.
    fn timed<T>(
        &self,
        batch_bytes: u64,
        mut fetch: impl FnMut(u64) -> Result<T>,
    ) -> Result<RunStats> {
        let mut t0 = Instant::now();
        let mut wait = Duration::ZERO;
        for step in 0..self.warmup + self.batches {
            if step == self.warmup {
                t0 = Instant::now();
                wait = Duration::ZERO;
            }
            let w0 = Instant::now();
            let item = fetch(step)?;
            wait += w0.elapsed();
            self.consume();
            drop(item);
        }
        Ok(RunStats::new(
            self.batches,
            batch_bytes * self.batches,
            t0.elapsed(),
            wait,
        ))
    }

    /// Times the loader: `next_batch`, consume, drop.
    pub fn run_pipeline(&self, sampler: &Sampler) -> Result<(RunStats, PinState)> {
        let config = LoaderConfig {
            end_step: Some(self.warmup + self.batches),
            prefetch: self.prefetch,
            workers: self.workers,
            pin: self.pin.clone(),
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(sampler.clone(), config)?;
        let pin = loader.pin_state().clone();
        let bytes: u64 = sampler.sources().iter().map(|s| s.batch_bytes as u64).sum();
        let stats = self.timed(bytes, |_| Ok(loader.next_batch()?))?;
        Ok((stats, pin))
    }

    /// Runs both loops `rounds` times, alternating, on the array at `path`.
    pub fn run(&self, path: &Path) -> Result<LoaderBenchReport> {
        let sampler = self.sampler(path)?;
        let mut direct = self.run_direct(&sampler)?;
        let (mut pipeline, pin_state) = self.run_pipeline(&sampler)?;
        for _ in 1..self.rounds {
            let d = self.run_direct(&sampler)?;
            if d.seconds < direct.seconds {
                direct = d;
            }
            let (p, _) = self.run_pipeline(&sampler)?;
            if p.seconds < pipeline.seconds {
                pipeline = p;
            }
        }
        Ok(LoaderBenchReport {
            time_ratio: pipeline.seconds / direct.seconds,
            direct,
            pipeline,
            pin_state,
        })
    }
}

/// Runs the sampler's loader against direct `read_batch_into` calls on the (T, C, Y, X) array
/// at `path`, crops following (t, y, x) with all of C.
pub fn run_loader(path: &Path, opts: &LoaderBenchOptions) -> Result<LoaderBenchJson> {
    let bench = LoaderBench {
        crop: opts.crop,
        batch_size: opts.batch_size,
        batches: opts.batches,
        warmup: opts.warmup,
        consume: opts.consume,
        rounds: opts.rounds.max(1),
        prefetch: opts.prefetch,
        workers: opts.workers,
        transform: if opts.to_f32 {
            Transform::to_f32()
        } else {
            Transform::none()
        },
        seed: opts.seed,
        mask_keep: opts.mask_keep,
        aligned: opts.aligned,
        ..LoaderBench::default()
    };
    let shape = Array::open(path)?.shape().to_vec();
    let mask_runs = if opts.mask_keep < 1.0 && shape.len() == 4 {
        bench.mask(&shape)?.runs().len()
    } else {
        0
    };
    let r = bench.run(path)?;
    let (d, p, pin) = (r.direct, r.pipeline, r.pin_state);
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
        mask_keep: opts.mask_keep,
        mask_runs,
        aligned: opts.aligned,
        page_locked: pin.page_locked,
        cuda_registered: pin.cuda_registered,
        pin_note: pin.reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_loops_deliver_the_same_bytes_and_count_them() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec::new([4, 3, 70, 90], Codec::Zstd, Layout::Sharded)
            .chunked([2, 3, 64, 64], [1, 1, 32, 32]);
        let path = super::super::synth::ensure(&spec, dir.path(), &|_, _| {}).unwrap();
        let bench = LoaderBench {
            crop: [2, 3, 16, 16],
            batch_size: 3,
            batches: 5,
            warmup: 1,
            rounds: 1,
            pin: PinOptions::pageable(),
            ..LoaderBench::default()
        };
        let r = bench.run(&path).unwrap();
        let batch_bytes = 3 * 2 * 3 * 16 * 16 * 2;
        for s in [&r.direct, &r.pipeline] {
            assert_eq!(s.batches, 5);
            assert_eq!(s.bytes, 5 * batch_bytes);
            assert!(s.seconds > 0.0 && s.batches_per_s > 0.0 && s.gb_per_s > 0.0);
            assert!(s.wait_seconds <= s.seconds);
        }
        assert!((r.time_ratio - r.pipeline.seconds / r.direct.seconds).abs() < 1e-12);
        assert!(r.to_string().contains("loader / direct time"));
    }

    #[test]
    fn a_mask_and_an_aligned_source_shape_the_samples() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec::new([8, 3, 64, 64], Codec::Zstd, Layout::Sharded)
            .chunked([4, 3, 32, 32], [1, 1, 16, 16]);
        let path = super::super::synth::ensure(&spec, dir.path(), &|_, _| {}).unwrap();
        let bench = LoaderBench {
            crop: [2, 3, 16, 16],
            batch_size: 4,
            batches: 3,
            warmup: 0,
            rounds: 1,
            pin: PinOptions::pageable(),
            mask_keep: 0.25,
            aligned: true,
            ..LoaderBench::default()
        };
        let sampler = bench.sampler(&path).unwrap();
        let mask = bench.mask(&[8, 3, 64, 64]).unwrap();
        assert_eq!(mask.runs().len(), 8 * 64);
        for step in 0..5 {
            let plan = sampler.plan(step, Shard::SINGLE).unwrap();
            for i in 0..plan.len() {
                let p = plan.position(i);
                assert_eq!(mask.allows(p), Some(true), "{p:?}");
                let a = plan.origin(1, i);
                let want = [p[0] - p[0] % 4, 0, (p[1] + 2) / 4, (p[2] + 2) / 4];
                assert_eq!(a, want.map(|x| x as i64));
            }
        }
        let r = bench.run(&path).unwrap();
        let per_batch = 4 * (2 * 3 * 16 * 16 + 3 * 4 * 4) * 2;
        assert_eq!(r.direct.bytes, 3 * per_batch);
        assert_eq!(r.pipeline.bytes, 3 * per_batch);
        let bad = LoaderBench {
            mask_keep: 0.0,
            ..bench
        };
        assert!(bad.sampler(&path).is_err());
    }
}
