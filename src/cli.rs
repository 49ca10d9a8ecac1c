//! The `zcrop` command line: parsing, dispatch, and error reporting as one clear line.
//!
//! [`main`] is the single entry point shared by the Rust binary and the Python console script.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use zcrop_io::BackendChoice;

use crate::bench::{self, ArrayBenchOptions, IoBenchOptions};
use crate::{info, synth};

/// Exit code for a command that ran and failed (bad data, IO error).
pub const EXIT_FAILURE: u8 = 1;
/// Exit code for a usage error (unknown flag, bad argument), as clap reports it.
pub const EXIT_USAGE: u8 = 2;

/// Fast random N-d crops from huge Zarr arrays.
#[derive(Debug, Parser)]
#[command(name = "zcrop", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
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
struct BenchCommand {
    #[command(subcommand)]
    mode: Option<BenchMode>,
    #[command(flatten)]
    array: ArrayBenchArgs,
}

#[derive(Debug, Subcommand)]
enum BenchMode {
    /// Random reads of one block size over a file, through io-core (the file is generated if
    /// none is given).
    Io(IoBenchArgs),
    /// The sampler's prefetching loader against calling read_batch directly in a loop, on a
    /// (T, C, Y, X) array (the generated dataset if no PATH is given).
    Loader(Box<LoaderBenchArgs>),
}

#[derive(Debug, Args)]
struct LoaderBenchArgs {
    /// A 4-d (T, C, Y, X) array; crop origins are random along T, Y and X, and channels
    /// are read from 0 (the crop's C).
    path: Option<PathBuf>,
    /// Crop shape.
    #[arg(long, default_value = "4,12,128,128", value_parser = parse_shape)]
    crop: Shape,
    /// Crops per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Timed batches per round.
    #[arg(long, default_value_t = 20)]
    batches: u64,
    /// Untimed batches first.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Rounds (the fastest of each loop counts).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Batches the loader reads ahead.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Batches the loader reads at once (the loader's default).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Milliseconds the consumer spends on each batch (a training step's stand-in).
    #[arg(long, default_value_t = 0)]
    consume_ms: u64,
    /// Convert to float32 in the stitch.
    #[arg(long)]
    to_f32: bool,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Size of the generated dataset.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    dataset_size: u64,
    /// Where generated datasets live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    synth::parse_size(s)
}

/// A shape on the command line, e.g. `4,12,128,128`.
#[derive(Debug, Clone)]
struct Shape(Vec<u64>);

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
struct IoArgs {
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
    queue_depth: usize,
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
    cold: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

impl IoArgs {
    /// The IO engine settings these switches ask for.
    fn config(&self) -> zcrop_io::IoConfig {
        zcrop_io::IoConfig {
            backend: self.backend,
            direct: self.direct,
            threads: self.io_threads,
            queue_depth: self.queue_depth,
            fast_path: bench::fast_path_for(self.no_fast_path),
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
struct ArrayBenchArgs {
    /// A Zarr array, or a group with --array: a local path or a URL (s3://bucket/data.zarr,
    /// see --storage-option). Without it, a synthetic sharded dataset is generated (or reused)
    /// under --data-dir.
    path: Option<PathBuf>,
    /// The array inside the group PATH.
    #[arg(long)]
    array: Option<String>,
    /// Crop shape.
    #[arg(long, default_value = "4,12,128,128", value_parser = parse_shape)]
    crop: Shape,
    /// Crops per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Batches read at once, each by a thread of its own calling read_batch (as the loader's
    /// workers read); 1 reads one batch after the other. --batches then counts whole rounds
    /// of this many.
    #[arg(long, default_value_t = 1)]
    in_flight: usize,
    /// Batches to time (instead of --duration).
    #[arg(long, conflicts_with = "duration")]
    batches: Option<usize>,
    /// Seconds to run.
    #[arg(long, default_value = "10", value_parser = parse_duration)]
    duration: Duration,
    /// Untimed batches before timing (skipped with --cold).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Decode threads (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Seed of the crop origins.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Decoded-chunk cache budget (e.g. 512M; default off).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    chunk_cache: u64,
    /// Size of the generated dataset (uncompressed).
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    dataset_size: u64,
    /// Compressor of the generated dataset.
    #[arg(long, value_enum, default_value = "zstd")]
    codec: synth::Codec,
    /// Layout of the generated dataset.
    #[arg(long, value_enum, default_value = "sharded")]
    layout: synth::Layout,
    /// Where generated datasets live (default $ZCROP_BENCH_DATA or <tmp>/zcrop-bench-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Generate (or find) the dataset, print its path, and stop.
    #[arg(long)]
    prepare_only: bool,
    /// Do not read the array's files first (a warm run of a local array normally pre-reads
    /// them into the page cache when they fit in half the available memory).
    #[arg(long)]
    no_prewarm: bool,
    /// For a URL (s3://, gs://, az://, https://): an object-store option KEY=VALUE (endpoint,
    /// region, anon, access_key_id, secret_access_key, ...; repeat for more). Credentials not
    /// given come from the usual environment variables (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, ...).
    #[arg(long = "storage-option", value_name = "KEY=VALUE", value_parser = parse_option)]
    storage_options: Vec<(String, String)>,
    #[command(flatten)]
    io: IoArgs,
}

fn parse_option(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("not KEY=VALUE: {s:?}")),
    }
}

#[derive(Debug, Args)]
struct IoBenchArgs {
    /// File to read (default: a generated file of --file-size under --data-dir).
    file: Option<PathBuf>,
    /// Bytes per read.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    block_size: u64,
    /// Reads to time.
    #[arg(long, default_value_t = 200_000)]
    reads: u64,
    /// Size of the generated file.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    file_size: u64,
    /// Where the generated file lives.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Do not read the whole file first (a warm run normally pre-reads it into the page cache).
    #[arg(long)]
    no_prewarm: bool,
    /// Seed of the offsets.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    io: IoArgs,
}

/// Runs the CLI on `args` (the program name first, as `std::env::args_os` gives them) and returns
/// the process exit code. Never panics on bad input; errors are printed as one line on stderr.
pub fn main<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    ExitCode::from(main_code(args))
}

/// [`main`], returning the exit code as a number (for the Python console script).
pub fn main_code<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // `--help` and `--version` are "errors" to clap but succeed for the user.
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            // A closed stdout (e.g. `zcrop --help | head -0`) must not panic.
            let _ = err.print();
            return code;
        }
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .try_init();
    match run(cli) {
        Ok(()) => 0,
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            // One line: the error and its causes.
            let _ = writeln!(std::io::stderr(), "zcrop: error: {e:#}");
            EXIT_FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Writes `text` to stdout (a closed pipe surfaces as an error the caller treats as success).
fn emit(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        None => emit(
            "zcrop: fast random crops from Zarr arrays. Try `zcrop --help`, `zcrop bench` or `zcrop info PATH`.\n",
        ),
        Some(Command::Info {
            path,
            json,
            storage_options,
        }) => emit(&info::run_with(&path, &storage_options, json)?),
        Some(Command::Bench(b)) => match b.mode {
            Some(BenchMode::Io(args)) => bench_io(&args),
            Some(BenchMode::Loader(args)) => bench_loader(&args),
            None => bench_array(&b.array),
        },
    }
}

fn configure_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        if rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .is_err()
            && rayon::current_num_threads() != n
        {
            log::warn!(
                "decode thread pool already started with {} threads",
                rayon::current_num_threads()
            );
        }
    }
    Ok(())
}

fn bench_array(args: &ArrayBenchArgs) -> Result<()> {
    configure_threads(args.threads)?;
    if args.batch_size == 0 {
        bail!("--batch-size must be at least 1");
    }
    if args.in_flight == 0 {
        bail!("--in-flight must be at least 1");
    }
    let progress = !args.io.no_progress && !args.io.json;
    let path = match &args.path {
        Some(p) => p.clone(),
        None => generated_dataset(
            &synth::Spec::with_size(
                synth::checked_size(args.dataset_size)?,
                args.codec,
                args.layout,
            ),
            args.data_dir.as_deref(),
            progress,
            !args.io.json,
        )?,
    };
    if args.prepare_only {
        return emit(&format!("{}\n", path.display()));
    }
    let io = args.io.config();
    let opts = ArrayBenchOptions {
        crop: args.crop.0.clone(),
        batch_size: args.batch_size,
        in_flight: args.in_flight,
        batches: args.batches,
        duration: args.batches.is_none().then_some(args.duration),
        warmup: args.warmup,
        seed: args.seed,
        cold: args.io.cold,
        prewarm: !args.no_prewarm,
        io,
        chunk_cache_bytes: usize::try_from(args.chunk_cache).unwrap_or(usize::MAX),
        progress,
        storage_options: args.storage_options.clone(),
    };
    let r = bench::run_array(&path, args.array.as_deref(), &opts)?;
    if args.io.json {
        return emit(&(serde_json::to_string_pretty(&r)? + "\n"));
    }
    let mut t = String::new();
    let row = |t: &mut String, k: &str, v: String| {
        let _ = std::fmt::Write::write_fmt(t, format_args!("{k:<22} {v}\n"));
    };
    row(
        &mut t,
        "array",
        format!("{} {:?} {}", r.path, r.shape, r.dtype),
    );
    row(
        &mut t,
        "chunks / shards",
        format!(
            "{:?} / {}",
            r.chunks,
            r.shards.as_ref().map_or("-".into(), |s| format!("{s:?}"))
        ),
    );
    row(
        &mut t,
        "crop x batch",
        if r.in_flight > 1 {
            format!(
                "{:?} x {}, {} batches at once",
                r.crop_shape, r.batch_size, r.in_flight
            )
        } else {
            format!("{:?} x {}", r.crop_shape, r.batch_size)
        },
    );
    row(
        &mut t,
        "batches timed",
        format!("{} in {:.2} s", r.batches, r.seconds),
    );
    row(&mut t, "crops/s", format!("{:.1}", r.crops_per_s));
    row(&mut t, "output", format!("{:.3} GB/s", r.output_gbps));
    row(
        &mut t,
        "read from storage",
        format!("{:.3} GB/s", r.read_gbps),
    );
    row(&mut t, "chunks decoded/s", format!("{:.0}", r.chunks_per_s));
    if let (Some(single), Some(eff)) = (r.single_core_chunks_per_s, r.decode_efficiency) {
        row(
            &mut t,
            "decode limit",
            format!(
                "{single:.0} chunks/s per core x {} threads; reached {:.0}%{}",
                r.threads,
                eff * 100.0,
                if r.decoded_share_of_chunks < 0.99 {
                    format!(
                        " (limit of whole chunks; these decoded {:.0}% of theirs)",
                        r.decoded_share_of_chunks * 100.0
                    )
                } else {
                    String::new()
                }
            ),
        );
    }
    if let Some(par) = r.parallel_decode_chunks_per_s.filter(|_| r.threads > 1) {
        row(
            &mut t,
            "decode, all threads",
            format!(
                "{par:.0} chunks/s ({:.2}x one core); reached {:.0}%",
                r.single_core_chunks_per_s.map_or(f64::NAN, |s| par / s),
                r.chunks_per_s / par * 100.0
            ),
        );
    }
    if let (Some(mem), Some(bytes)) = (r.memory_decode_chunks_per_s, r.memory_decode_sample_bytes) {
        row(
            &mut t,
            "decode from memory",
            format!(
                "{mem:.0} chunks/s, all threads, samples of {} per thread (CPU cache {}); reached {:.0}%",
                info::human_bytes(bytes),
                info::human_bytes(r.last_level_cache_bytes),
                r.chunks_per_s / mem * 100.0
            ),
        );
    }
    if r.single_core_chunks_per_s.is_some() {
        row(
            &mut t,
            "decode limits timed",
            format!(
                "{:.1} s each, {}",
                r.decode_probe_seconds,
                if r.decode_probe_slices_between > 0 {
                    format!(
                        "{} slices between the timed batches",
                        r.decode_probe_slices_between
                    )
                } else {
                    "after the timed batches".to_string()
                }
            ),
        );
    }
    row(
        &mut t,
        "decoded/output bytes",
        format!("{:.2}", r.decoded_bytes_per_output_byte),
    );
    row(
        &mut t,
        "batch latency",
        format!("p50 {:.1} ms, p99 {:.1} ms", r.p50_ms, r.p99_ms),
    );
    row(
        &mut t,
        "CPU",
        r.cpu_cores_used.map_or("unknown".into(), |c| {
            format!("{c:.2} cores ({} decode threads)", r.threads)
        }),
    );
    let backend = match &r.backend_fallback {
        Some(why) => format!("{} (io_uring unavailable: {why})", r.backend),
        None => r.backend.clone(),
    };
    row(
        &mut t,
        "IO backend",
        format!(
            "{backend}{}{}",
            if r.direct { ", O_DIRECT" } else { "" },
            match r.mapped_read_share {
                Some(share) if r.map_files != "never" => format!(
                    ", files mapped {} ({:.0}% of reads)",
                    if r.map_files == "cached" {
                        "when cached"
                    } else {
                        "always"
                    },
                    share * 100.0
                ),
                _ => String::new(),
            }
        ),
    );
    match &r.object {
        Some(o) => {
            row(
                &mut t,
                "object store",
                format!(
                    "{}, {} GETs in flight at most, merging holes up to {} into GETs up to {}",
                    o.store,
                    o.max_concurrency,
                    info::human_bytes_binary(o.coalesce_max_gap),
                    info::human_bytes_binary(o.coalesce_max_len)
                ),
            );
            row(
                &mut t,
                "GETs",
                format!(
                    "{} ({:.1} per batch), {} sent over HTTP, {} failed and retried; {} received",
                    o.gets,
                    o.gets_per_batch,
                    o.http_gets,
                    o.http_failures,
                    info::human_bytes_binary(o.bytes_received)
                ),
            );
        }
        None => {
            let state = cache_state(r.cold, r.cold_note.as_deref());
            // (Both are `None` when a cold run was asked for.)
            let state = match (&r.prewarmed_bytes, &r.prewarm_note) {
                (Some(n), _) => format!("{state}, array pre-read ({})", info::human_bytes(*n)),
                (None, Some(why)) => {
                    format!("{state} after the warm-up only (not pre-read: {why})")
                }
                (None, None) => state,
            };
            row(&mut t, "page cache", state);
        }
    }
    emit(&t)
}

/// How the page cache stood for a run, in words.
fn cache_state(cold: bool, note: Option<&str>) -> String {
    match (note, cold) {
        (Some(note), _) => format!("warm (cold requested, but {note})"),
        (None, true) => "cold (dropped before the run)".into(),
        (None, false) => "warm".into(),
    }
}

/// The generated benchmark dataset for `spec` under `data_dir` (or the default place), written
/// first if it is not there yet, with a note and a progress bar when asked.
fn generated_dataset(
    spec: &synth::Spec,
    data_dir: Option<&std::path::Path>,
    progress: bool,
    note: bool,
) -> Result<PathBuf> {
    let dir = data_dir.map_or_else(synth::default_data_dir, std::path::Path::to_path_buf);
    let target = dir.join(spec.dir_name());
    let fresh = !target.join(".zcrop-complete").exists();
    if fresh && note {
        let _ = writeln!(
            std::io::stderr(),
            "zcrop: writing a {} synthetic dataset {:?} to {} (once; later runs reuse it)",
            info::human_bytes(spec.bytes()),
            spec.shape,
            target.display()
        );
    }
    let bar = bench::progress_bar(progress && fresh, None, None, "");
    let report = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let p = synth::ensure(spec, &dir, &report).context("generating the benchmark dataset")?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(p)
}

fn bench_loader(args: &LoaderBenchArgs) -> Result<()> {
    let Ok(crop) = <[u64; 4]>::try_from(args.crop.0.clone()) else {
        bail!("--crop must have 4 numbers (T, C, Y, X)");
    };
    let path = match &args.path {
        Some(p) => p.clone(),
        None => generated_dataset(
            &synth::Spec::with_size(
                synth::checked_size(args.dataset_size)?,
                synth::Codec::Zstd,
                synth::Layout::Sharded,
            ),
            args.data_dir.as_deref(),
            !args.json,
            !args.json,
        )?,
    };
    let opts = bench::LoaderBenchOptions {
        crop,
        batch_size: args.batch_size,
        batches: args.batches,
        warmup: args.warmup,
        rounds: args.rounds,
        prefetch: args.prefetch,
        workers: args.workers,
        consume: Duration::from_millis(args.consume_ms),
        to_f32: args.to_f32,
        seed: args.seed,
    };
    let r = bench::run_loader(&path, &opts)?;
    if args.json {
        return emit(&(serde_json::to_string_pretty(&r)? + "\n"));
    }
    let mut t = String::new();
    let mut row = |k: &str, v: String| {
        let _ = std::fmt::Write::write_fmt(&mut t, format_args!("{k:<22} {v}\n"));
    };
    row("array", r.path.clone());
    row(
        "crop x batch",
        format!("{:?} x {}", r.crop_shape, r.batch_size),
    );
    row(
        "direct read_batch",
        format!(
            "{:.2} batches/s, {:.3} GB/s",
            r.direct_batches_per_s, r.direct_gbps
        ),
    );
    row(
        "loader",
        format!(
            "{:.2} batches/s, {:.3} GB/s",
            r.loader_batches_per_s, r.loader_gbps
        ),
    );
    row(
        "loader / direct time",
        format!(
            "{:.3} (consumer waited {:.3} s)",
            r.time_ratio, r.loader_wait_s
        ),
    );
    row(
        "buffers",
        format!(
            "page-locked: {}, CUDA-registered: {}{}",
            r.page_locked,
            r.cuda_registered,
            r.pin_note
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ),
    );
    emit(&t)
}

fn bench_io(args: &IoBenchArgs) -> Result<()> {
    if args.block_size == 0 || args.io.queue_depth == 0 {
        bail!("--block-size and --queue-depth must be positive");
    }
    let path = match &args.file {
        Some(f) => f.clone(),
        None => {
            let dir = args
                .data_dir
                .clone()
                .unwrap_or_else(synth::default_data_dir);
            bench::ensure_io_file(&dir, args.file_size).context("creating the IO benchmark file")?
        }
    };
    let io = args.io.config();
    let opts = IoBenchOptions {
        block_size: args.block_size,
        queue_depth: args.io.queue_depth,
        reads: args.reads,
        cold: args.io.cold,
        io,
        prewarm: !args.no_prewarm,
        seed: args.seed,
        progress: !args.io.no_progress && !args.io.json,
    };
    let r = bench::run_io(&path, &opts)?;
    if args.io.json {
        return emit(&(serde_json::to_string_pretty(&r)? + "\n"));
    }
    let mut t = String::new();
    let mut row = |k: &str, v: String| {
        let _ = std::fmt::Write::write_fmt(&mut t, format_args!("{k:<16} {v}\n"));
    };
    row(
        "file",
        format!("{} ({})", r.path, info::human_bytes(r.file_bytes)),
    );
    row(
        "reads",
        format!(
            "{} x {} B, queue depth {}",
            r.reads, r.block_size, r.queue_depth
        ),
    );
    row("reads/s", format!("{:.0}", r.reads_per_s));
    row("throughput", format!("{:.3} GB/s", r.gbps));
    row(
        "CPU",
        match (r.cpu_cores_used, r.cpu_us_per_read) {
            (Some(c), Some(u)) => format!("{c:.2} cores, {u:.2} us per read"),
            _ => "unknown".into(),
        },
    );
    row(
        "backend",
        format!(
            "{} ({} threads){}{}",
            r.backend,
            r.threads,
            if r.direct { ", O_DIRECT" } else { "" },
            r.backend_fallback
                .as_ref()
                .map(|w| format!(" [io_uring unavailable: {w}]"))
                .unwrap_or_default()
        ),
    );
    row("fast path hits", format!("{}", r.fast_path_hits));
    row("mapped reads", format!("{} (no copy)", r.mapped_reads));
    row("page cache", cache_state(r.cold, r.cold_note.as_deref()));
    emit(&t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bench_arguments_parse() {
        let cli = Cli::try_parse_from([
            "zcrop",
            "bench",
            "--crop",
            "1,2,3",
            "--batch-size",
            "4",
            "--dataset-size",
            "1G",
        ])
        .unwrap();
        let Some(Command::Bench(b)) = cli.command else {
            panic!()
        };
        assert!(b.mode.is_none());
        assert_eq!(b.array.crop.0, vec![1, 2, 3]);
        assert_eq!(b.array.dataset_size, 1 << 30);
        let cli = Cli::try_parse_from([
            "zcrop",
            "bench",
            "io",
            "--block-size",
            "64K",
            "--queue-depth",
            "32",
            "--cold",
        ])
        .unwrap();
        let Some(Command::Bench(b)) = cli.command else {
            panic!()
        };
        let Some(BenchMode::Io(io)) = b.mode else {
            panic!()
        };
        assert_eq!(
            (io.block_size, io.io.queue_depth, io.io.cold),
            (65536, 32, true)
        );
        assert!(Cli::try_parse_from(["zcrop", "bench", "--crop", "1,x"]).is_err());
        assert!(Cli::try_parse_from(["zcrop", "bench", "--backend", "nope"]).is_err());
    }
}
