//! `zcrop bench io`: random reads of one size from one file through io-core, against the
//! same reads with `pread` from the page cache.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use zcrop_io::{CoalesceLimits, FastPath, IoConfig, IoEngine, ReadRange, ReadRequest};

use super::{cpu_time, drop_page_cache, progress_bar, read_through};

/// Options of an io-core benchmark.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    /// Bytes per read.
    pub block_size: u64,
    /// Reads in flight.
    pub queue_depth: usize,
    /// Reads to time.
    pub reads: u64,
    /// Drop the page cache first.
    pub cold: bool,
    /// Backend and engine settings (queue depth, direct, threads).
    pub io: IoConfig,
    /// Read the whole file once first so it is in the page cache.
    pub prewarm: bool,
    /// Seed of the offsets.
    pub seed: u64,
    /// Progress bar.
    pub progress: bool,
}

/// What an io-core benchmark measured. Field names are stable.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IoBenchReport {
    /// Backend that ran.
    pub backend: String,
    /// Why io_uring was not used, if it was not.
    pub backend_fallback: Option<String>,
    /// File read.
    pub path: String,
    /// Its size.
    pub file_bytes: u64,
    /// Bytes per read.
    pub block_size: u64,
    /// Reads in flight.
    pub queue_depth: usize,
    /// IO threads (rings, or pool threads).
    pub threads: usize,
    /// Reads timed.
    pub reads: u64,
    /// Seconds timed.
    pub seconds: f64,
    /// Reads per second.
    pub reads_per_s: f64,
    /// GB/s (10^9 bytes).
    pub gbps: f64,
    /// CPU time per read, microseconds.
    pub cpu_us_per_read: Option<f64>,
    /// CPU time over wall time.
    pub cpu_cores_used: Option<f64>,
    /// Reads served by the `RWF_NOWAIT` page-cache fast path.
    pub fast_path_hits: u64,
    /// Reads served from a mapping of the file, without a copy (`IoConfig::map_files`).
    pub mapped_reads: u64,
    /// `io_uring_enter` calls.
    pub ring_enters: u64,
    /// Whether the page cache was dropped first.
    pub cold: bool,
    /// Why a requested cold run could not drop the cache.
    pub cold_note: Option<String>,
    /// `O_DIRECT`.
    pub direct: bool,
}

/// Makes (or reuses) a file of `bytes` pseudo-random bytes for IO benchmarks.
pub fn ensure_io_file(dir: &std::path::Path, bytes: u64) -> Result<PathBuf> {
    let path = dir.join(format!("io-bench-{bytes}.bin"));
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes) {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("partial");
    let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&tmp)?);
    let mut rng = StdRng::seed_from_u64(7);
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            w.copy_from_slice(&rng.random::<u64>().to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    f.into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Random reads of `block_size` at block-aligned offsets of `path` (each block at most once in
/// a cold run; warm runs of more reads than blocks go round the same permutation again).
pub fn run_io(path: &std::path::Path, opts: &IoBenchOptions) -> Result<IoBenchReport> {
    let file_bytes = std::fs::metadata(path)
        .with_context(|| format!("{}", path.display()))?
        .len();
    let blocks = file_bytes / opts.block_size;
    if blocks == 0 {
        bail!(
            "{} ({file_bytes} bytes) is smaller than one block of {}",
            path.display(),
            opts.block_size
        );
    }
    // Cold runs read each block at most once (a block read twice would be cached); warm runs
    // may go round the file again, so that fast reads of a small file still last long enough.
    let reads = if opts.cold {
        opts.reads.min(blocks)
    } else {
        opts.reads
    };
    if opts.prewarm && !opts.cold {
        read_through(path)?;
    }
    let mut cold_note = None;
    let cold = opts.cold
        && match drop_page_cache() {
            Ok(()) => true,
            Err(e) => {
                cold_note = Some(e);
                false
            }
        };
    // Distinct blocks in a uniformly random order (warm runs longer than the file go round it
    // again in the same order).
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let order = shuffled_prefix(blocks, reads.min(blocks), &mut rng);
    let offset_of = |i: u64| order[(i % order.len() as u64) as usize] * opts.block_size;
    let p: Arc<std::path::Path> = Arc::from(path);
    let requests: Vec<ReadRequest> = (0..reads)
        .map(|i| {
            ReadRequest::new(
                i,
                Arc::clone(&p),
                ReadRange::new(offset_of(i), opts.block_size),
            )
        })
        .collect();
    let mut io = opts.io.clone();
    io.queue_depth = opts.queue_depth;
    // No merging: every request is one read, like fio's random reads.
    io.coalesce = CoalesceLimits {
        max_gap: 0,
        max_merged_len: 1,
    };
    let engine = IoEngine::new(io.clone()).context("starting the IO engine")?;
    let threads = engine.worker_threads();
    let bar = progress_bar(opts.progress, Some(reads), None, "reads");
    let before = engine.metrics();
    let cpu0 = cpu_time();
    let start = Instant::now();
    let mut done = 0u64;
    // As zarr-front reads chunks: ranges may be served from a mapping of the file when the
    // engine's `map_files` says so (the default: when their pages are in memory), and every
    // result is checked for pages lost to a truncation once read.
    for c in engine.submit_mapped(requests) {
        let bytes = c
            .result
            .with_context(|| format!("read {} of {}", c.id, path.display()))?;
        zcrop_io::check_mapped(&bytes, &p, ReadRange::new(offset_of(c.id), opts.block_size))?;
        done += 1;
        if let Some(b) = &bar
            && done.is_multiple_of(4096)
        {
            b.set_position(done);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu0
        .zip(cpu_time())
        .map(|(a, b)| b.saturating_sub(a).as_secs_f64());
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let m = engine.metrics() - before;
    Ok(IoBenchReport {
        backend: engine.backend().name().to_string(),
        backend_fallback: engine.fallback_reason().map(str::to_string),
        path: path.display().to_string(),
        file_bytes,
        block_size: opts.block_size,
        queue_depth: opts.queue_depth,
        threads,
        reads: done,
        seconds: wall,
        reads_per_s: done as f64 / wall,
        gbps: (done * opts.block_size) as f64 / wall / 1e9,
        cpu_us_per_read: cpu.map(|c| c * 1e6 / done as f64),
        cpu_cores_used: cpu.map(|c| c / wall),
        fast_path_hits: m.fast_path_hits,
        mapped_reads: m.mapped_reads,
        ring_enters: m.ring_enters,
        cold,
        cold_note,
        direct: io.direct,
    })
}

/// The first `n` values of a uniformly random permutation of `0..len` (`n <= len`): a partial
/// Fisher-Yates shuffle that keeps only the positions it moved, so it costs O(n), not O(len).
/// Uniformly random offsets, as fio's random reads are (an affine walk `start + i * step`, used
/// before, reads an arithmetic progression of offsets).
fn shuffled_prefix(len: u64, n: u64, rng: &mut StdRng) -> Vec<u64> {
    let mut moved: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    (0..n)
        .map(|i| {
            let j = i + rng.random_range(0..len - i);
            let at_j = moved.get(&j).copied().unwrap_or(j);
            let at_i = moved.get(&i).copied().unwrap_or(i);
            moved.insert(j, at_i);
            at_j
        })
        .collect()
}

/// The fast-path setting for a backend choice on the command line.
pub fn fast_path_for(no_fast_path: bool) -> FastPath {
    if no_fast_path {
        FastPath::Never
    } else {
        FastPath::Auto
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffled_prefixes_are_distinct_and_whole_ones_are_permutations() {
        let mut rng = StdRng::seed_from_u64(3);
        let whole = shuffled_prefix(1000, 1000, &mut rng);
        let mut sorted = whole.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<u64>>());
        assert_ne!(whole, sorted, "shuffled");
        let part = shuffled_prefix(1 << 40, 5000, &mut rng);
        let distinct: std::collections::HashSet<u64> = part.iter().copied().collect();
        assert_eq!(distinct.len(), 5000);
        assert!(part.iter().all(|&b| b < 1 << 40));
        // Spread over the range, not bunched at its start.
        assert!(part.iter().filter(|&&b| b >= 1 << 39).count() > 2000);
    }
}
