//! The command line's arguments (clap), and the parsers of their values.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use zcrop_io::BackendChoice;

use crate::bench::io::fast_path_for;
use crate::bench::synth;

/// Fast random N-d crops from huge Zarr arrays.
#[derive(Debug, Parser)]
#[command(name = "zcrop", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Describe an array (shape, dtype, chunks, shards, codecs, what is stored) or a group tree.
    Info {
        /// A Zarr array or group: a local path or a URL (s3://bucket/data.zarr).
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// For a URL: an object-store option KEY=VALUE (repeat for more).
        #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = parse_option)]
        storage_options: Vec<(String, String)>,
    },
    /// Measure random-crop throughput of a Zarr array (a generated one if no PATH is given), of
    /// io-core alone (`zcrop bench io`), or of the sampler's loader (`zcrop bench loader`).
    #[command(args_conflicts_with_subcommands = true)]
    Bench(Box<BenchCommand>),
}

#[derive(Debug, Args)]
pub(crate) struct BenchCommand {
    #[command(subcommand)]
    pub(crate) mode: Option<BenchMode>,
    #[command(flatten)]
    pub(crate) array: ArrayBenchArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BenchMode {
    /// Random reads of one block size over a file, through io-core (the file is generated if
    /// none is given).
    Io(IoBenchArgs),
    /// The sampler's prefetching loader against calling read_batch directly in a loop, on a
    /// (T, C, Y, X) array (the generated dataset if no PATH is given).
    Loader(Box<LoaderBenchArgs>),
}

#[derive(Debug, Args)]
pub(crate) struct LoaderBenchArgs {
    /// A 4-d (T, C, Y, X) array; crop origins are random along T, Y and X, and channels
    /// are read from 0 (the crop's C).
    pub(crate) path: Option<PathBuf>,
    /// Crop shape.
    #[arg(long, default_value = "4,12,128,128", value_parser = parse_shape)]
    pub(crate) crop: Shape,
    /// Crops per batch.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch_size: usize,
    /// Timed batches per round.
    #[arg(long, default_value_t = 20)]
    pub(crate) batches: u64,
    /// Untimed batches first.
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: u64,
    /// Rounds (the fastest of each loop counts).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: u32,
    /// Batches the loader reads ahead.
    #[arg(long, default_value_t = 4)]
    pub(crate) prefetch: usize,
    /// Batches the loader reads at once (the loader's default).
    #[arg(long, default_value_t = 2)]
    pub(crate) workers: usize,
    /// Milliseconds the consumer spends on each batch (a training step's stand-in).
    #[arg(long, default_value_t = 0)]
    pub(crate) consume_ms: u64,
    /// Convert to float32 in the stitch.
    #[arg(long)]
    pub(crate) to_f32: bool,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Sample only a share of the positions, by a full-resolution mask (one stretch of x per
    /// (t, y) row, as runs); 1 is no mask.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) mask_keep: f64,
    /// Read a second source aligned by label tables (a 4x coarser time step and grid, as
    /// `align="previous"`/`"nearest"` build them).
    #[arg(long)]
    pub(crate) aligned: bool,
    /// Size of the generated dataset.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    pub(crate) dataset_size: u64,
    /// Where generated datasets live.
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    synth::parse_size(s)
}

/// A shape on the command line, e.g. `4,12,128,128`.
#[derive(Debug, Clone)]
pub(crate) struct Shape(pub(crate) Vec<u64>);

fn parse_shape(s: &str) -> Result<Shape, String> {
    s.split(',')
        .map(|p| {
            p.trim()
                .parse::<u64>()
                .map_err(|_| format!("not a shape: {s:?} (use e.g. 4,12,128,128)"))
        })
        .collect::<Result<Vec<u64>, String>>()
        .map(Shape)
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().trim_end_matches('s');
    t.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("not a duration in seconds: {s:?}"))
}

/// Settings every benchmark shares.
#[derive(Debug, Args, Clone)]
#[allow(clippy::struct_excessive_bools)] // command-line switches
pub(crate) struct IoArgs {
    /// IO backend.
    #[arg(long, default_value = "auto", value_parser = parse_backend)]
    backend: BackendChoice,
    /// Open files with O_DIRECT (bypass the page cache).
    #[arg(long)]
    direct: bool,
    /// IO threads (io_uring rings, or pread threads); 0 picks.
    #[arg(long, default_value_t = 0)]
    io_threads: usize,
    /// Reads in flight.
    #[arg(long, default_value_t = zcrop_io::DEFAULT_QUEUE_DEPTH)]
    pub(crate) queue_depth: usize,
    /// Never try the page-cache fast path (`preadv2(RWF_NOWAIT)`) of the io_uring backend.
    #[arg(long)]
    no_fast_path: bool,
    /// When chunk reads are served from read-only mappings of the files (no copy out of the
    /// page cache): `--mmap=never`, `--mmap=cached` (files of 1 MiB or more, ranges already in
    /// memory; the default) or `--mmap=always`; `--mmap` alone means always. See io-core's
    /// `MapFiles`. `zcrop bench io` reads as zarr-front reads chunks, so the same policy applies
    /// (the report counts the mapped reads); `--mmap=never` measures the copying reads alone.
    #[arg(long, value_name = "WHEN", default_value = "cached", num_args = 0..=1,
          require_equals = true, default_missing_value = "always", value_parser = parse_map_files)]
    mmap: zcrop_io::MapFiles,
    /// Drop the page cache before the run (needs root; the report says if it could not).
    #[arg(long)]
    pub(crate) cold: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// No progress bar.
    #[arg(long)]
    pub(crate) no_progress: bool,
}

impl IoArgs {
    /// The IO engine settings these switches ask for.
    pub(crate) fn config(&self) -> zcrop_io::IoConfig {
        zcrop_io::IoConfig {
            backend: self.backend,
            direct: self.direct,
            threads: self.io_threads,
            queue_depth: self.queue_depth,
            fast_path: fast_path_for(self.no_fast_path),
            map_files: self.mmap,
            ..zcrop_io::IoConfig::default()
        }
    }
}

fn parse_backend(s: &str) -> Result<BackendChoice, String> {
    s.parse()
}

fn parse_map_files(s: &str) -> Result<zcrop_io::MapFiles, String> {
    s.parse()
}

#[derive(Debug, Args)]
pub(crate) struct ArrayBenchArgs {
    /// A Zarr array, or a group with --array: a local path or a URL (s3://bucket/data.zarr,
    /// see --storage-option). Without it, a synthetic sharded dataset is generated (or reused)
    /// under --data-dir.
    pub(crate) path: Option<PathBuf>,
    /// The array inside the group PATH.
    #[arg(long)]
    pub(crate) array: Option<String>,
    /// Crop shape [default: 4,12,128,128 for a 4-d array; for others its last dimensions
    /// (128 x 128 in the last two), each clipped to the array's shape].
    #[arg(long, value_parser = parse_shape)]
    pub(crate) crop: Option<Shape>,
    /// Crops per batch.
    #[arg(long, default_value_t = 32)]
    pub(crate) batch_size: usize,
    /// Batches read at once, each by a thread of its own calling read_batch (as the loader's
    /// workers read); 1 reads one batch after the other. --batches then counts whole rounds
    /// of this many.
    #[arg(long, default_value_t = 1)]
    pub(crate) in_flight: usize,
    /// Batches to time (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    pub(crate) batches: Option<usize>,
    /// Seconds to run.
    #[arg(long, default_value = "10", value_parser = parse_duration)]
    pub(crate) duration: Duration,
    /// Untimed batches before timing (skipped with --cold).
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: usize,
    /// Decode threads (default: one per core).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// Seed of the crop origins.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Decoded-chunk cache of the array's own (e.g. 512M; 0: none). Default: the process-wide
    /// cache arrays share (256M, or ZCROP_CHUNK_CACHE).
    #[arg(long, value_parser = parse_size)]
    pub(crate) chunk_cache: Option<u64>,
    /// Size of the generated dataset (uncompressed).
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    pub(crate) dataset_size: u64,
    /// Compressor of the generated dataset.
    #[arg(long, value_enum, default_value = "zstd")]
    pub(crate) codec: synth::Codec,
    /// Layout of the generated dataset.
    #[arg(long, value_enum, default_value = "sharded")]
    pub(crate) layout: synth::Layout,
    /// Where generated datasets live (default $ZCROP_BENCH_DATA or <tmp>/zcrop-bench-data).
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Generate (or find) the dataset, print its path, and stop.
    #[arg(long)]
    pub(crate) prepare_only: bool,
    /// Do not read the array's files first (a warm run of a local array normally pre-reads
    /// them into the page cache when they fit in half the available memory).
    #[arg(long)]
    pub(crate) no_prewarm: bool,
    /// For a URL (s3://, gs://, az://, https://): an object-store option KEY=VALUE (endpoint,
    /// region, anon, access_key_id, secret_access_key, ...; repeat for more). Credentials not
    /// given come from the usual environment variables (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...).
    #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = parse_option)]
    pub(crate) storage_options: Vec<(String, String)>,
    #[command(flatten)]
    pub(crate) io: IoArgs,
}

fn parse_option(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("not KEY=VALUE: {s:?}")),
    }
}

#[derive(Debug, Args)]
pub(crate) struct IoBenchArgs {
    /// File to read (default: a generated file of --file-size under --data-dir).
    pub(crate) file: Option<PathBuf>,
    /// Bytes per read.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub(crate) block_size: u64,
    /// Reads to time.
    #[arg(long, default_value_t = 200_000)]
    pub(crate) reads: u64,
    /// Size of the generated file.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    pub(crate) file_size: u64,
    /// Where the generated file lives.
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// Do not read the whole file first (a warm run normally pre-reads it into the page cache).
    #[arg(long)]
    pub(crate) no_prewarm: bool,
    /// Seed of the offsets.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    #[command(flatten)]
    pub(crate) io: IoArgs,
}
