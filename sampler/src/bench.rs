//! The loader benchmark, for `cargo bench -p zcrop-sampler` and for a `zcrop bench loader`
//! command: the benchmark dataset (a scaled-down copy of the satellite workload zarr-front is
//! tuned for), and a run of `N` batches through the [`Loader`] against the same batches read by
//! calling zarr-front's `read_batch_into` directly in a loop.
//!
//! ```no_run
//! use zcrop_sampler::bench::{LoaderBench, Workload};
//! let dir = std::env::temp_dir().join("zcrop-bench.zarr");
//! Workload::default().write(&dir)?;
//! let report = LoaderBench::default().run(&dir)?;
//! println!("{report}");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zarrs::array::{ArrayBuilder, ArrayBytes, DataType, FillValue};
use zarrs::filesystem::FilesystemStore;
use zcrop_zarr::Array;

use crate::error::{Result, SamplerError};
use crate::loader::{Loader, LoaderConfig};
use crate::pinned::{PinOptions, PinState};
use crate::sampler::{SampleSpec, Sampler, Shard, Source};
use crate::transform::Transform;

/// The benchmark dataset: a `(t, c, y, x)` uint16 array, sharded, with small zstd inner chunks,
/// smooth data plus noise. The default is the workload of `shared/CONTEXT.md`
/// ((384, 12, 1024, 1024), shards (16, 12, 512, 512), inner chunks (1, 1, 128, 128)) scaled
/// down to 96 MiB along t, y and x.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Array shape.
    pub shape: [u64; 4],
    /// Shard shape.
    pub shard: [u64; 4],
    /// Inner chunk shape.
    pub chunk: [u64; 4],
    /// zstd level of the inner chunks.
    pub zstd_level: i32,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            shape: [16, 12, 512, 512],
            shard: [8, 12, 256, 256],
            chunk: [1, 1, 128, 128],
            zstd_level: 1,
        }
    }
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

impl Workload {
    /// Bytes of the array's data.
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * 2
    }

    /// Writes the array at `path` (a new directory), one shard at a time.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let store = Arc::new(FilesystemStore::new(path).map_err(io_err)?);
        let dt = DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new("uint16"))
            .map_err(io_err)?;
        let mut b = ArrayBuilder::new(
            self.shape.to_vec(),
            self.shard.to_vec(),
            dt,
            FillValue::new(vec![0, 0]),
        );
        b.subchunk_shape(self.chunk.to_vec());
        b.bytes_to_bytes_codecs(vec![Arc::new(zarrs::array::codec::ZstdCodec::new(
            self.zstd_level,
            false,
        ))]);
        b.dimension_names(Some(["t", "c", "y", "x"]));
        let array = b.build(store, "/").map_err(io_err)?;
        array.store_metadata().map_err(io_err)?;
        let grid: Vec<u64> = (0..4)
            .map(|d| self.shape[d].div_ceil(self.shard[d]))
            .collect();
        let [st, sc, sy, sx] = self.shard;
        let mut data = Vec::with_capacity((st * sc * sy * sx * 2) as usize);
        for gt in 0..grid[0] {
            for gc in 0..grid[1] {
                for gy in 0..grid[2] {
                    for gx in 0..grid[3] {
                        data.clear();
                        for t in gt * st..(gt + 1) * st {
                            for c in gc * sc..(gc + 1) * sc {
                                for y in gy * sy..(gy + 1) * sy {
                                    for x in gx * sx..(gx + 1) * sx {
                                        data.extend_from_slice(&pixel(t, c, y, x).to_ne_bytes());
                                    }
                                }
                            }
                        }
                        array
                            .store_chunk(&[gt, gc, gy, gx], ArrayBytes::new_flen(&data[..]))
                            .map_err(io_err)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Smooth fields plus noise, like imagery: compresses about as well as the real thing.
fn pixel(t: u64, c: u64, y: u64, x: u64) -> u16 {
    let (tf, cf, yf, xf) = (t as f64, c as f64, y as f64, x as f64);
    let smooth = 2000.0
        + 800.0 * ((xf + 7.0 * tf) / 37.0 + cf).sin() * ((yf - 3.0 * tf) / 53.0).cos()
        + 40.0 * cf;
    let mut noise = (t << 48) ^ (c << 40) ^ (y << 20) ^ x;
    noise = noise.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    noise ^= noise >> 31;
    (smooth as u64 + (noise & 63)) as u16
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

/// The loader benchmark: `batches` batches of `batch_size` crops of `crop` from the
/// [`Workload`] array, after `warmup` untimed ones, read (a) by calling `read_batch_into`
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
    /// The sampler this benchmark reads with, over the array at `path`.
    pub fn sampler(&self, path: &Path) -> Result<Sampler> {
        let array = Array::open(path).map_err(|error| SamplerError::Open {
            source_name: "workload".into(),
            error,
        })?;
        Sampler::new(
            SampleSpec::new(["t", "y", "x"])
                .source(Source::new("workload", array, self.crop).transform(self.transform.clone()))
                .seed(self.seed)
                .batch_size(self.batch_size),
        )
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
        let mut t0 = Instant::now();
        let mut wait = Duration::ZERO;
        for step in 0..self.warmup + self.batches {
            if step == self.warmup {
                t0 = Instant::now();
                wait = Duration::ZERO;
            }
            let w0 = Instant::now();
            let plan = sampler.plan(step, Shard::SINGLE)?;
            for (s, buf) in bufs.iter_mut().enumerate() {
                sampler.read_into(&plan, s, buf, None)?;
            }
            wait += w0.elapsed();
            self.consume();
        }
        Ok(RunStats::new(
            self.batches,
            bytes * self.batches,
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
        let mut t0 = Instant::now();
        let mut wait = Duration::ZERO;
        for step in 0..self.warmup + self.batches {
            if step == self.warmup {
                t0 = Instant::now();
                wait = Duration::ZERO;
            }
            let w0 = Instant::now();
            let batch = loader.next_batch()?;
            wait += w0.elapsed();
            self.consume();
            drop(batch);
        }
        Ok((
            RunStats::new(self.batches, bytes * self.batches, t0.elapsed(), wait),
            pin,
        ))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Workload {
        Workload {
            shape: [4, 3, 70, 90],
            shard: [2, 3, 64, 64],
            chunk: [1, 1, 32, 32],
            zstd_level: 1,
        }
    }

    #[test]
    fn the_workload_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.zarr");
        let w = tiny();
        w.write(&path).unwrap();
        let a = Array::open(&path).unwrap();
        assert_eq!(a.shape(), &w.shape);
        assert_eq!(a.chunk_shape(), &w.chunk);
        assert_eq!(a.shard_shape(), Some(&w.shard[..]));
        let got = a.read_region(&[0, 0, 0, 0], &w.shape).unwrap();
        let mut want = Vec::new();
        for t in 0..4 {
            for c in 0..3 {
                for y in 0..70 {
                    for x in 0..90 {
                        want.extend_from_slice(&pixel(t, c, y, x).to_ne_bytes());
                    }
                }
            }
        }
        assert!(got == want, "the dataset does not read back as written");
        assert_eq!(w.bytes(), want.len() as u64);
    }

    #[test]
    fn both_loops_deliver_the_same_bytes_and_count_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.zarr");
        tiny().write(&path).unwrap();
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
}
