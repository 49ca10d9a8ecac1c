//! `zcrop bench` and its modes: options from the arguments, the run, the report (a table or
//! JSON).

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::bench::array::{ArrayBenchOptions, run_array};
use crate::bench::io::{IoBenchOptions, ensure_io_file, run_io};
use crate::bench::loader::{LoaderBenchOptions, run_loader};
use crate::bench::{progress_bar, synth};

use super::args::{ArrayBenchArgs, IoBenchArgs, LoaderBenchArgs};
use super::info;
use super::{configure_threads, emit};

pub(crate) fn bench_array(args: &ArrayBenchArgs) -> Result<()> {
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
        crop: args.crop.as_ref().map(|c| c.0.clone()),
        batch_size: args.batch_size,
        in_flight: args.in_flight,
        batches: args.batches,
        duration: args.batches.is_none().then_some(args.duration),
        warmup: args.warmup,
        seed: args.seed,
        cold: args.io.cold,
        prewarm: !args.no_prewarm,
        io,
        chunk_cache_bytes: args
            .chunk_cache
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        progress,
        storage_options: args.storage_options.clone(),
    };
    let r = run_array(&path, args.array.as_deref(), &opts)?;
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
        format!(
            "{:.2} (from each chunk's start to its last needed byte: {:.2})",
            r.decoded_bytes_per_output_byte, r.last_needed_bytes_per_output_byte
        ),
    );
    let reasons: Vec<String> = r
        .whole_chunk_reasons
        .iter()
        .filter(|&(_, &n)| n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    row(
        &mut t,
        "decoded whole",
        if reasons.is_empty() {
            format!("{:.1}% of chunks", r.decoded_whole_share_of_chunks * 100.0)
        } else {
            format!(
                "{:.1}% of chunks ({})",
                r.decoded_whole_share_of_chunks * 100.0,
                reasons.join(", ")
            )
        },
    );
    row(
        &mut t,
        "chunk cache",
        if r.chunk_cache_bytes == 0 {
            "none".to_string()
        } else {
            format!(
                "{} MiB{}, served {:.1}% of chunks",
                r.chunk_cache_bytes >> 20,
                if r.chunk_cache_shared {
                    " (process-wide)"
                } else {
                    ""
                },
                100.0 * r.totals.chunks_cached as f64 / r.totals.chunks.max(1) as f64
            )
        },
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
                    "{}, {} GETs in flight at the end (at most {}), merging holes up to {} into \
                     GETs up to {}",
                    o.store,
                    o.concurrency,
                    o.max_concurrency,
                    info::human_bytes_binary(o.coalesce_max_gap),
                    info::human_bytes_binary(o.coalesce_max_len)
                ),
            );
            row(
                &mut t,
                "GETs",
                format!(
                    "{} ({:.1} per batch), {} sent over HTTP, {} hedged, {} failed and retried; \
                     {} received",
                    o.gets,
                    o.gets_per_batch,
                    o.http_gets,
                    o.hedged,
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
    let bar = progress_bar(progress && fresh, None, None, "");
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

pub(crate) fn bench_loader(args: &LoaderBenchArgs) -> Result<()> {
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
    let opts = LoaderBenchOptions {
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
        mask_keep: args.mask_keep,
        aligned: args.aligned,
    };
    let r = run_loader(&path, &opts)?;
    if args.json {
        return emit(&(serde_json::to_string_pretty(&r)? + "\n"));
    }
    let mut t = String::new();
    let mut row = |k: &str, v: String| {
        let _ = std::fmt::Write::write_fmt(&mut t, format_args!("{k:<22} {v}\n"));
    };
    row("array", r.path.clone());
    if r.mask_runs > 0 {
        row(
            "mask",
            format!("keeps {} of positions in {} runs", r.mask_keep, r.mask_runs),
        );
    }
    if r.aligned {
        row("aligned source", "a second source by label tables".into());
    }
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

pub(crate) fn bench_io(args: &IoBenchArgs) -> Result<()> {
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
            ensure_io_file(&dir, args.file_size).context("creating the IO benchmark file")?
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
    let r = run_io(&path, &opts)?;
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
