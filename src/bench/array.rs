//! `zcrop bench`: random crops of one shape from a Zarr array, batch after batch, with what
//! they cost (chunks decoded, bytes decoded per output byte) and, for local arrays, the
//! decode rate of the same chunks in the caches on one core (the decode limit) as a reference.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use zcrop_io::{IoConfig, IoEngine, ObjectConfig, ObjectEngine, is_object_url};
use zcrop_zarr::{Array, Node, OpenOptions, ReadStats};

use super::{cpu_time, drop_page_cache, percentile, prewarm_tree, progress_bar};

/// Options of an array benchmark.
#[derive(Debug, Clone)]
pub struct ArrayBenchOptions {
    /// Crop shape (its length must match the array's dimensionality); `None` for
    /// [`default_crop`] of the array.
    pub crop: Option<Vec<u64>>,
    /// Crops per batch.
    pub batch_size: usize,
    /// Batches read at once, each by its own thread calling `read_batch_into` (as the
    /// sampler's loader reads with several workers); 1 reads one batch after the other.
    pub in_flight: usize,
    /// Batches to time (after `warmup`).
    pub batches: Option<usize>,
    /// Or: time batches for this long.
    pub duration: Option<Duration>,
    /// Untimed batches first (warm runs).
    pub warmup: usize,
    /// Seed of the crop origins.
    pub seed: u64,
    /// Drop the page cache first.
    pub cold: bool,
    /// For a warm run of local files: read every file of the array (its directory) once first,
    /// so all of it is in the page cache (skipped, and said so, when it exceeds half the
    /// available memory).
    pub prewarm: bool,
    /// IO engine configuration.
    pub io: IoConfig,
    /// Decoded-chunk cache budget (0 = off; `None`: the process-wide cache, as arrays open by
    /// default).
    pub chunk_cache_bytes: Option<usize>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// For a URL: the object store's options (endpoint, region, credentials, ...).
    pub storage_options: Vec<(String, String)>,
}

/// What the object store was asked during the timed batches of a benchmark of a URL.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ObjectReport {
    /// The bucket (or container, or host) the engine reads.
    pub store: String,
    /// Largest hole merged into one GET at most, bytes (where the measured bandwidth and
    /// latency make GETs cheaper than holes, the engine merges smaller ones only).
    pub coalesce_max_gap: u64,
    /// Longest merged GET, bytes.
    pub coalesce_max_len: u64,
    /// GETs in flight at most (the adaptive limit's ceiling).
    pub max_concurrency: usize,
    /// GETs in flight at most at the end of the run (the adaptive limit then).
    pub concurrency: usize,
    /// GETs the engine issued (after coalescing).
    pub gets: u64,
    /// GET requests sent over HTTP (retries and hedges included).
    pub http_gets: u64,
    /// HTTP requests that failed and were retried (or gave up).
    pub http_failures: u64,
    /// GETs sent a second time because their answer was late.
    pub hedged: u64,
    /// Bytes the GETs received (coalescing holes included).
    pub bytes_received: u64,
    /// GETs per batch.
    pub gets_per_batch: f64,
}

/// What an array benchmark measured. Field names are stable: scripts read them from `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArrayBenchReport {
    /// IO backend that ran (`io_uring` or `portable`).
    pub backend: String,
    /// Why io_uring was not used, if it was not.
    pub backend_fallback: Option<String>,
    /// The array benchmarked.
    pub path: String,
    /// Array shape.
    pub shape: Vec<u64>,
    /// Data type (v3 name).
    pub dtype: String,
    /// Shape of the chunks read and decoded.
    pub chunks: Vec<u64>,
    /// Shard shape, if sharded.
    pub shards: Option<Vec<u64>>,
    /// Crop shape.
    pub crop_shape: Vec<u64>,
    /// Crops per batch.
    pub batch_size: usize,
    /// Batches read at once (see `ArrayBenchOptions::in_flight`).
    pub in_flight: usize,
    /// Batches timed.
    pub batches: usize,
    /// Seconds timed.
    pub seconds: f64,
    /// Crops per second.
    pub crops_per_s: f64,
    /// Output bytes per second, in GB/s (10^9).
    pub output_gbps: f64,
    /// Encoded bytes read from storage per second, in GB/s.
    pub read_gbps: f64,
    /// Chunks decoded per second.
    pub chunks_per_s: f64,
    /// Bytes decoded per output byte (decode amplification).
    pub decoded_bytes_per_output_byte: f64,
    /// Per output byte, the bytes of each chunk the batches needed from its start to the last
    /// byte a crop needs of it (each chunk once per batch): what a decoder that stops after
    /// that byte but produces every byte before it decodes (libzstd, inflate). zcrop's zstd
    /// and blosc decoders produce only the blocks or sequences the needed bytes depend on, and
    /// can decode less.
    pub last_needed_bytes_per_output_byte: f64,
    /// Bytes decoded over the decoded chunks' full size: below 1 where chunks decode only the
    /// part crops need. The decode limit is measured on whole chunks, so a read that decodes
    /// partly can pass 100% of it.
    pub decoded_share_of_chunks: f64,
    /// Chunks decoded whole (every byte) over chunks decoded.
    pub decoded_whole_share_of_chunks: f64,
    /// Chunks decoded whole, by why (every reason of `zcrop_zarr::WholeReason`, zeros
    /// included): `needed_whole` where the crops needed all of a chunk, the others where
    /// a codec or a threshold made zcrop decode more than the crops needed.
    pub whole_chunk_reasons: BTreeMap<&'static str, u64>,
    /// Median batch latency, ms.
    pub p50_ms: f64,
    /// 99th percentile batch latency, ms.
    pub p99_ms: f64,
    /// CPU time over wall time (2.0 = two cores busy).
    pub cpu_cores_used: Option<f64>,
    /// Decode threads (rayon pool).
    pub threads: usize,
    /// Whether the page cache was dropped before the run.
    pub cold: bool,
    /// Why a requested cold run could not drop the cache.
    pub cold_note: Option<String>,
    /// Bytes of the array read into the page cache before a warm run (`prewarm`).
    pub prewarmed_bytes: Option<u64>,
    /// Why a warm run did not pre-read the store, if it did not.
    pub prewarm_note: Option<String>,
    /// `O_DIRECT` reads.
    pub direct: bool,
    /// When chunk reads are served from file mappings (`never`, `cached`, `always`; see
    /// `zcrop_io::MapFiles`).
    pub map_files: String,
    /// Share of the timed batches' physical reads served from file mappings.
    pub mapped_read_share: Option<f64>,
    /// Chunks per second one thread decodes (decode only, no IO or stitching), measured on a
    /// random sample of the array's chunks in the same run.
    pub single_core_chunks_per_s: Option<f64>,
    /// `chunks_per_s / (single_core_chunks_per_s * threads)`: how close the read comes to the
    /// decode limit of its threads.
    pub decode_efficiency: Option<f64>,
    /// Chunks per second all `threads` decode together (decode only, each thread its own copy
    /// of the sample): what the machine really gives when every core decodes at once.
    pub parallel_decode_chunks_per_s: Option<f64>,
    /// Like `parallel_decode_chunks_per_s`, on a sample of at least twice the last-level CPU
    /// cache per thread, so the encoded bytes come from memory as they do in a crop read of a
    /// large array, while the in-cache figures above keep them in the CPU's caches.
    pub memory_decode_chunks_per_s: Option<f64>,
    /// Encoded bytes of that sample per thread (256 random chunks, repeated until they reach
    /// twice the cache).
    pub memory_decode_sample_bytes: Option<u64>,
    /// The last-level CPU cache the sample is sized by (bytes).
    pub last_level_cache_bytes: u64,
    /// Budget of the decoded-chunk cache the array read through (0: none).
    pub chunk_cache_bytes: u64,
    /// Whether that cache is the process-wide one arrays share by default.
    pub chunk_cache_shared: bool,
    /// Slices of the decode-limit probes run between the timed batches: in a warm run, a
    /// 100 ms slice of each after every second of reading, so limit and reads see the same
    /// machine. 0 in a cold run (its samples would warm the cache; the limits are measured
    /// after its reads) and in a run shorter than a second.
    pub decode_probe_slices_between: usize,
    /// Seconds each decode-limit probe ran in all.
    pub decode_probe_seconds: f64,
    /// Totals over the timed batches.
    pub totals: TotalsReport,
    /// For a URL: the GETs the timed batches cost.
    pub object: Option<ObjectReport>,
}

/// The encoded bytes of `n` random chunks of `a` (those stored; seeded by `seed`).
pub fn sample_chunks(a: &Array, n: usize, seed: u64) -> Result<Vec<bytes::Bytes>> {
    let grid: Vec<u64> = a
        .shape()
        .iter()
        .zip(a.chunk_shape())
        .map(|(s, c)| s.div_ceil(*c))
        .collect();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let coords: Vec<Vec<u64>> = (0..n)
        .map(|_| grid.iter().map(|&g| rng.random_range(0..g)).collect())
        .collect();
    Ok(a.read_encoded_chunks(&coords)?
        .into_iter()
        .flatten()
        .collect())
}

/// A decode-rate probe: `threads` threads, each with its own copy of a random sample of an
/// array's stored chunks, that decode them in timed slices and add up what they decoded.
///
/// `zcrop bench` runs its probes in short slices between the batches it times, so a limit and
/// the reads measured against it see the same machine: on a shared VM the speed of a core can
/// drift by a third within a minute, and a limit measured only after the reads compared two
/// different machines.
pub struct DecodeProbe {
    threads: Vec<ProbeThread>,
    sample_bytes: u64,
    warm_first: bool,
}

/// One probe thread's sample, its reused output, where it stopped, and what it has counted.
struct ProbeThread {
    chunks: Vec<bytes::Bytes>,
    out: Vec<u8>,
    next: usize,
    decoded: u64,
    seconds: f64,
}

/// Chunks decoded between two looks at the clock (reading it costs about 1% of a small
/// blosc-lz4 chunk's decode).
const PROBE_CLOCK_EVERY: usize = 16;

impl DecodeProbe {
    /// A probe of `chunks` (encoded chunks of `a`, see [`sample_chunks`]) on `threads`
    /// threads; `None` if they hold no bytes. With `min_bytes`, each thread's copy repeats the
    /// sample until its encoded bytes reach that (every repetition a copy of its own, in memory
    /// of its own, so a sample larger than the CPU caches is decoded from memory). A probe
    /// whose sample is smaller (`min_bytes` 0) reads its sample through once, untimed, before
    /// each slice, so its rate is that of chunks whose bytes are in the CPU's caches.
    pub fn new(
        a: &Array,
        chunks: &[bytes::Bytes],
        min_bytes: u64,
        threads: usize,
    ) -> Result<Option<Self>> {
        let bytes: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        if bytes == 0 {
            return Ok(None);
        }
        let copies = usize::try_from(min_bytes.div_ceil(bytes).max(1))?;
        let chunk_bytes =
            usize::try_from(a.chunk_shape().iter().product::<u64>())? * a.element_size();
        let threads = (0..threads.max(1))
            .map(|_| ProbeThread {
                // Each thread decodes its own copy, so no two share cache lines of input.
                chunks: (0..copies)
                    .flat_map(|_| chunks.iter().map(|c| bytes::Bytes::copy_from_slice(c)))
                    .collect(),
                // One reused output, as a decoder that keeps up would have: allocating and
                // zeroing a chunk per decode is not decoding, and would flatter the reads
                // measured against it.
                out: vec![0u8; chunk_bytes],
                next: 0,
                decoded: 0,
                seconds: 0.0,
            })
            .collect();
        Ok(Some(DecodeProbe {
            threads,
            sample_bytes: bytes * copies as u64,
            warm_first: min_bytes == 0,
        }))
    }

    /// Decodes on all of the probe's threads at once for about `time` (each thread goes on
    /// from where it stopped the slice before), adding to the counts.
    pub fn run(&mut self, a: &Array, time: Duration) -> Result<()> {
        let ready = std::sync::Barrier::new(self.threads.len());
        let warm_first = self.warm_first;
        std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .threads
                .iter_mut()
                .map(|t| {
                    let ready = &ready;
                    scope.spawn(move || -> Result<()> {
                        if warm_first {
                            // Bring the sample back into the caches the reads since the last
                            // slice evicted.
                            let sum = t
                                .chunks
                                .iter()
                                .flat_map(|c| c.iter().step_by(64))
                                .fold(0u8, |s, &b| s.wrapping_add(b));
                            std::hint::black_box(sum);
                            std::hint::black_box(&mut t.out).fill(0);
                        }
                        // The clocks start together once every thread is ready.
                        ready.wait();
                        let start = Instant::now();
                        loop {
                            for _ in 0..PROBE_CLOCK_EVERY {
                                a.decode_chunk_into(&t.chunks[t.next], &mut t.out)?;
                                std::hint::black_box(&mut t.out);
                                t.next = (t.next + 1) % t.chunks.len();
                                t.decoded += 1;
                            }
                            if start.elapsed() >= time {
                                break;
                            }
                        }
                        t.seconds += start.elapsed().as_secs_f64();
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("a decode thread panicked"))?
            })
        })
    }

    /// Chunks per second, all threads together, over every slice so far (0 before any).
    pub fn chunks_per_s(&self) -> f64 {
        self.threads
            .iter()
            .filter(|t| t.seconds > 0.0)
            .map(|t| t.decoded as f64 / t.seconds)
            .sum()
    }

    /// Seconds each thread has decoded so far.
    pub fn seconds(&self) -> f64 {
        self.threads.first().map_or(0.0, |t| t.seconds)
    }

    /// Encoded bytes of each thread's sample.
    pub fn sample_bytes(&self) -> u64 {
        self.sample_bytes
    }
}

/// Seconds of reading between two slices of the decode probes.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Each probe's slice.
const PROBE_SLICE: Duration = Duration::from_millis(100);

/// Each probe's least time in all.
const PROBE_MIN: Duration = Duration::from_millis(700);

/// Reads one batch of crops of `crop` per entry of `origins` into the matching buffer of
/// `outs`, all at once: each but the first on a thread of its own, all decoding on the one
/// decode pool. Returns each batch's result and latency.
fn read_at_once(
    a: &Array,
    origins: &[Vec<u64>],
    crop: &[u64],
    outs: &mut [Vec<u8>],
) -> Vec<(Result<ReadStats>, Duration)> {
    let read = |origins: &[u64], out: &mut [u8]| {
        let t0 = Instant::now();
        let r = a.read_batch_into(origins, crop, out).map_err(Into::into);
        (r, t0.elapsed())
    };
    let Some(((first_origins, rest_origins), (first_out, rest_outs))) =
        origins.split_first().zip(outs.split_first_mut())
    else {
        return Vec::new();
    };
    std::thread::scope(|s| {
        let others: Vec<_> = rest_origins
            .iter()
            .zip(rest_outs.iter_mut())
            .map(|(o, out)| s.spawn(move || read(o, out)))
            .collect();
        let mut results = vec![read(first_origins, first_out)];
        results.extend(others.into_iter().map(|h| {
            h.join().unwrap_or_else(|_| {
                let e = anyhow::anyhow!("a batch's reading thread panicked");
                (Err(e), Duration::ZERO)
            })
        }));
        results
    })
}

/// The three decode limits `zcrop bench` measures a read against: one core and all threads
/// on samples that stay in the CPU's caches, and all threads on samples from memory.
struct Probes {
    single: Option<DecodeProbe>,
    /// `None` with one thread (the single-core probe is that).
    parallel: Option<DecodeProbe>,
    memory: Option<DecodeProbe>,
}

impl Probes {
    /// One sample of 256 random chunks of `a` for all three; the from-memory probe repeats it
    /// to twice `llc` per thread.
    fn new(a: &Array, seed: u64, threads: usize, llc: u64) -> Result<Self> {
        let chunks = sample_chunks(a, 256, seed)?;
        Ok(Probes {
            single: DecodeProbe::new(a, &chunks, 0, 1)?,
            parallel: if threads > 1 {
                DecodeProbe::new(a, &chunks, 0, threads)?
            } else {
                None
            },
            memory: DecodeProbe::new(a, &chunks, 2 * llc, threads)?,
        })
    }

    /// A slice of `time` of each probe, one after the other; returns the process CPU time it
    /// took (zero where that cannot be read).
    fn run(&mut self, a: &Array, time: Duration) -> Result<Duration> {
        let cpu0 = cpu_time();
        for p in [&mut self.single, &mut self.parallel, &mut self.memory]
            .into_iter()
            .flatten()
        {
            p.run(a, time)?;
        }
        Ok(cpu0
            .zip(cpu_time())
            .map_or(Duration::ZERO, |(a, b)| b.saturating_sub(a)))
    }

    /// Seconds the single-core probe has decoded (the probes run for the same times).
    fn seconds(&self) -> f64 {
        self.single.as_ref().map_or(0.0, DecodeProbe::seconds)
    }
}

/// The size of the last-level CPU cache (sysfs on Linux; 32 MiB where it cannot be read).
fn last_level_cache_bytes() -> u64 {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    (0..8)
        .filter_map(|i| std::fs::read_to_string(dir.join(format!("index{i}/size"))).ok())
        .filter_map(|s| {
            let s = s.trim();
            let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
            let n: u64 = n.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                _ => n,
            })
        })
        .max()
        .unwrap_or(32 << 20)
}

/// Totals of [`ReadStats`] over the timed batches.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TotalsReport {
    /// Distinct chunks needed.
    pub chunks: u64,
    /// Chunks decoded.
    pub chunks_decoded: u64,
    /// Of those, chunks decoded whole.
    pub chunks_decoded_whole: u64,
    /// Chunks absent from storage (fill value).
    pub chunks_missing: u64,
    /// Chunks served by the decoded-chunk cache.
    pub chunks_cached: u64,
    /// Bytes decoded.
    pub bytes_decoded: u64,
    /// Encoded chunk bytes read.
    pub chunk_bytes_read: u64,
    /// Shard indexes and blosc headers read.
    pub index_reads: u64,
    /// Blosc chunks fetched by block before their header was known (a guess of where their
    /// blocks are, with the header in the same round trip).
    pub block_guesses: u64,
    /// Of those, chunks whose needed blocks lay outside the guess, fetched again.
    pub block_guess_misses: u64,
    /// Output bytes.
    pub output_bytes: u64,
}

/// Opens `path` (an array, or a group with `array` inside) with `options`.
pub fn open_array(
    path: &std::path::Path,
    array: Option<&str>,
    options: &OpenOptions,
) -> Result<Array> {
    let node = zcrop_zarr::open_with(path, options)?;
    match (node, array) {
        (Node::Array(a), None) => Ok(a),
        (Node::Array(_), Some(name)) => bail!(
            "{} is an array; --array {name} names a member of a group",
            path.display()
        ),
        (Node::Group(g), Some(name)) => match g.get(name)? {
            Node::Array(a) => Ok(a),
            Node::Group(_) => bail!("{name} in {} is a group, not an array", path.display()),
        },
        (Node::Group(g), None) => {
            let names = g.array_names()?;
            bail!(
                "{} is a group; choose an array with --array (arrays here: {})",
                path.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )
        }
    }
}

/// The crop `zcrop bench` reads by default: 4 time steps x 12 channels x 128 x 128.
pub const DEFAULT_CROP: [u64; 4] = [4, 12, 128, 128];

/// [`DEFAULT_CROP`] fitted to an array of `shape`: its last dimensions against the array's
/// last ones (1 for any dimension before them), each clipped to the array's length (at least 1).
pub fn default_crop(shape: &[u64]) -> Vec<u64> {
    let skip = DEFAULT_CROP.len().saturating_sub(shape.len());
    let tail = &DEFAULT_CROP[skip..];
    let lead = shape.len() - tail.len();
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            let want = if d < lead { 1 } else { tail[d - lead] };
            want.min(n).max(1)
        })
        .collect()
}

/// Runs the array benchmark on `path`.
pub fn run_array(
    path: &std::path::Path,
    array: Option<&str>,
    opts: &ArrayBenchOptions,
) -> Result<ArrayBenchReport> {
    let url = path.to_str().filter(|p| is_object_url(p));
    let mut cold_note = None;
    let cold = if opts.cold && url.is_some() {
        cold_note = Some("the store is remote: there is no local cache to drop".to_string());
        false
    } else if opts.cold {
        match drop_page_cache() {
            Ok(()) => true,
            Err(e) => {
                cold_note = Some(e);
                false
            }
        }
    } else {
        false
    };
    let (prewarmed_bytes, prewarm_note) = match url {
        _ if opts.cold => (None, None),
        Some(_) => (None, Some("the store is remote".to_string())),
        None if !opts.prewarm => (None, Some("not asked to".to_string())),
        None => match prewarm_tree(
            &array.map_or_else(|| path.to_path_buf(), |a| path.join(a)),
            opts.progress,
        )? {
            Ok(bytes) => (Some(bytes), None),
            Err(why) => (None, Some(why)),
        },
    };
    // A URL is read through an object engine of its own (its counters are this run's);
    // local files through an IO engine of the configuration asked for.
    let (engine, object) = match url {
        Some(u) => {
            let config = ObjectConfig::from_env().context("object-store configuration")?;
            let (e, _) = ObjectEngine::open_container(u, &opts.storage_options, config)
                .with_context(|| format!("opening {u}"))?;
            (None, Some(e))
        }
        None => {
            if !opts.storage_options.is_empty() {
                bail!("--storage-option applies to URLs (s3://, gs://, az://, https://)");
            }
            let e = IoEngine::new(opts.io.clone()).context("starting the IO engine")?;
            (Some(e), None)
        }
    };
    let options = OpenOptions {
        engine: engine.clone(),
        object_engine: object.clone(),
        storage_options: opts.storage_options.clone(),
        chunk_cache_bytes: opts.chunk_cache_bytes,
        ..OpenOptions::default()
    };
    let a = open_array(path, array, &options)?;
    let chunk_cache = a.chunk_cache();
    let shape = a.shape().to_vec();
    let crop = match &opts.crop {
        Some(c) => c.clone(),
        None => {
            let crop = default_crop(&shape);
            if crop != DEFAULT_CROP {
                eprintln!(
                    "crop {crop:?}: the default {DEFAULT_CROP:?} fitted to the array's shape \
                     {shape:?} (--crop sets it)"
                );
            }
            crop
        }
    };
    if crop.len() != shape.len() {
        bail!(
            "--crop has {} dimensions but the array has {} (shape {shape:?})",
            crop.len(),
            shape.len()
        );
    }
    if let Some((d, _)) = crop
        .iter()
        .zip(&shape)
        .enumerate()
        .find(|(_, (c, s))| *c > *s || **c == 0)
    {
        bail!("--crop {crop:?} does not fit in the array's shape {shape:?} (dimension {d})");
    }
    let nd = shape.len();
    let crop_bytes = crop.iter().product::<u64>() as usize * a.element_size();
    if opts.in_flight == 0 {
        bail!("at least one batch must be in flight");
    }
    let mut outs = vec![vec![0u8; crop_bytes * opts.batch_size]; opts.in_flight];
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut origins = vec![vec![0u64; nd * opts.batch_size]; opts.in_flight];
    let mut draw = |origins: &mut [Vec<u64>]| {
        for o in origins.iter_mut().flat_map(|o| o.chunks_exact_mut(nd)) {
            for d in 0..nd {
                o[d] = rng.random_range(0..shape[d] - crop[d] + 1);
            }
        }
    };
    let warmup = if cold { 0 } else { opts.warmup };
    for _ in 0..warmup {
        draw(&mut origins);
        for (r, _) in read_at_once(&a, &origins, &crop, &mut outs) {
            r?;
        }
    }
    // The decode limits are measured in slices between the timed batches, on the machine the
    // reads see. A cold run measures them after its reads instead: preparing the samples reads
    // chunks (and shard indexes), which would warm what the run is to find cold.
    let threads = rayon::current_num_threads();
    let llc = last_level_cache_bytes();
    let mut probes = if cold {
        None
    } else {
        Some(Probes::new(&a, opts.seed, threads, llc)?)
    };
    let bar = progress_bar(
        opts.progress,
        opts.batches.map(|b| b as u64),
        opts.duration,
        "batches",
    );
    let mut latencies = Vec::new();
    let mut totals = ReadStats::default();
    let object0 = object.as_ref().map(ObjectEngine::metrics);
    let io0 = engine.as_ref().map(IoEngine::metrics);
    let cpu0 = cpu_time();
    let mut probe_cpu = Duration::ZERO;
    let mut read_time = Duration::ZERO;
    let mut since_probe = Duration::ZERO;
    let mut slices_between = 0;
    loop {
        let n = latencies.len();
        if opts.batches.is_some_and(|b| n >= b)
            || opts.duration.is_some_and(|d| read_time >= d && n > 0)
        {
            break;
        }
        draw(&mut origins);
        let t0 = Instant::now();
        let results = read_at_once(&a, &origins, &crop, &mut outs);
        let took = t0.elapsed();
        for (stats, latency) in results {
            totals += stats?;
            latencies.push(latency.as_secs_f64() * 1e3);
        }
        read_time += took;
        since_probe += took;
        if let Some(b) = &bar {
            if opts.batches.is_some() {
                b.inc(opts.in_flight as u64);
            } else {
                b.set_position(read_time.as_secs());
            }
        }
        if let Some(p) = probes.as_mut().filter(|_| since_probe >= PROBE_EVERY) {
            probe_cpu += p.run(&a, PROBE_SLICE)?;
            since_probe = Duration::ZERO;
            slices_between += 1;
        }
    }
    let wall = read_time.as_secs_f64();
    let cpu = cpu0
        .zip(cpu_time())
        .map(|(a, b)| b.saturating_sub(a).saturating_sub(probe_cpu).as_secs_f64() / wall);
    let mapped_read_share = engine.as_ref().zip(io0).map(|(e, m0)| {
        let m = e.metrics() - m0;
        m.mapped_reads as f64 / m.physical_reads.max(1) as f64
    });
    let object_report = object.as_ref().zip(object0).map(|(e, m0)| {
        let m = e.metrics() - m0;
        let limits = e.coalesce_limits();
        ObjectReport {
            store: e.url().to_string(),
            coalesce_max_gap: limits.max_gap,
            coalesce_max_len: limits.max_merged_len,
            max_concurrency: e.max_concurrency(),
            concurrency: e.concurrency(),
            gets: m.gets,
            http_gets: m.http_gets,
            http_failures: m.http_failures,
            hedged: m.hedged,
            bytes_received: m.bytes_read,
            gets_per_batch: m.gets as f64 / latencies.len().max(1) as f64,
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    latencies.sort_by(f64::total_cmp);
    let crops = (latencies.len() * opts.batch_size) as f64;
    let mut probes = match probes {
        Some(p) => p,
        None => Probes::new(&a, opts.seed, threads, llc)?,
    };
    // A short run, or one whose last slice was long ago, ends with a slice of its own; every
    // probe gets at least PROBE_MIN in all.
    let probed = probes.seconds();
    if probed < PROBE_MIN.as_secs_f64() || since_probe >= PROBE_EVERY / 2 {
        let rest = PROBE_MIN.saturating_sub(Duration::from_secs_f64(probed));
        probes.run(&a, rest.max(PROBE_SLICE))?;
    }
    let single = probes.single.as_ref().map(DecodeProbe::chunks_per_s);
    let parallel = match &probes.parallel {
        Some(p) => Some(p.chunks_per_s()),
        None => single,
    };
    let from_memory = probes.memory.as_ref();
    let chunks_per_s = totals.chunks_decoded as f64 / wall;
    Ok(ArrayBenchReport {
        backend: engine
            .as_ref()
            .map_or("object_store", |e| e.backend().name())
            .to_string(),
        backend_fallback: engine
            .as_ref()
            .and_then(IoEngine::fallback_reason)
            .map(str::to_string),
        path: array
            .map_or_else(|| path.to_path_buf(), |name| path.join(name))
            .display()
            .to_string(),
        shape,
        dtype: a.data_type(),
        chunks: a.chunk_shape().to_vec(),
        shards: a.shard_shape().map(<[u64]>::to_vec),
        crop_shape: crop.clone(),
        batch_size: opts.batch_size,
        in_flight: opts.in_flight,
        batches: latencies.len(),
        seconds: wall,
        crops_per_s: crops / wall,
        output_gbps: totals.output_bytes as f64 / wall / 1e9,
        read_gbps: totals.chunk_bytes_read as f64 / wall / 1e9,
        chunks_per_s,
        decoded_bytes_per_output_byte: totals.bytes_decoded as f64
            / totals.output_bytes.max(1) as f64,
        last_needed_bytes_per_output_byte: totals.bytes_to_last_needed as f64
            / totals.output_bytes.max(1) as f64,
        decoded_share_of_chunks: totals.bytes_decoded as f64
            / (totals.chunks_decoded.max(1) as f64
                * a.chunk_shape().iter().product::<u64>() as f64
                * a.element_size() as f64),
        decoded_whole_share_of_chunks: totals.whole_chunks.total() as f64
            / totals.chunks_decoded.max(1) as f64,
        whole_chunk_reasons: totals
            .whole_chunks
            .iter()
            .map(|(reason, n)| (reason.name(), n))
            .collect(),
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        cpu_cores_used: cpu,
        threads,
        cold,
        cold_note,
        prewarmed_bytes,
        prewarm_note,
        direct: opts.io.direct,
        map_files: if opts.io.direct {
            zcrop_io::MapFiles::Never
        } else {
            opts.io.map_files
        }
        .name()
        .to_string(),
        mapped_read_share,
        single_core_chunks_per_s: single,
        decode_efficiency: single.map(|s| chunks_per_s / (s * threads as f64)),
        parallel_decode_chunks_per_s: parallel,
        memory_decode_chunks_per_s: from_memory.map(DecodeProbe::chunks_per_s),
        memory_decode_sample_bytes: from_memory.map(DecodeProbe::sample_bytes),
        decode_probe_slices_between: slices_between,
        decode_probe_seconds: probes.seconds(),
        last_level_cache_bytes: llc,
        chunk_cache_bytes: chunk_cache.map_or(0, |(b, _)| b as u64),
        chunk_cache_shared: chunk_cache.is_some_and(|(_, shared)| shared),
        totals: TotalsReport {
            chunks: totals.chunks,
            chunks_decoded: totals.chunks_decoded,
            chunks_decoded_whole: totals.whole_chunks.total(),
            chunks_missing: totals.chunks_missing,
            chunks_cached: totals.chunks_cached,
            bytes_decoded: totals.bytes_decoded,
            chunk_bytes_read: totals.chunk_bytes_read,
            index_reads: totals.index_reads,
            block_guesses: totals.block_guesses,
            block_guess_misses: totals.block_guess_misses,
            output_bytes: totals.output_bytes,
        },
        object: object_report,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_crop_fits_any_array() {
        assert_eq!(default_crop(&[100, 12, 1024, 1024]), DEFAULT_CROP.to_vec());
        assert_eq!(default_crop(&[96, 4, 181, 360]), vec![4, 4, 128, 128]);
        assert_eq!(default_crop(&[365, 721, 1440]), vec![12, 128, 128]);
        assert_eq!(default_crop(&[10, 2, 3, 50, 50]), vec![1, 2, 3, 50, 50]);
        assert_eq!(
            default_crop(&[0, 7]),
            vec![1, 7],
            "at least 1, even for empty axes"
        );
        assert!(default_crop(&[]).is_empty());
    }

    #[test]
    fn a_decode_probe_adds_up_its_slices() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/data/v3_workload_4d_u2.zarr");
        let a = open_array(&path, None, &OpenOptions::default()).unwrap();
        let chunks = sample_chunks(&a, 8, 1).unwrap();
        assert_eq!(chunks.len(), 8, "every chunk of the fixture is stored");
        let mut p = DecodeProbe::new(&a, &chunks, 0, 2).unwrap().unwrap();
        assert!(p.chunks_per_s() <= 0.0, "nothing decoded yet");
        p.run(&a, Duration::from_millis(20)).unwrap();
        let (first, rate) = (p.seconds(), p.chunks_per_s());
        assert!(first >= 0.02 && rate > 0.0, "{first} {rate}");
        // A second slice adds to the first; each thread goes on round its own sample.
        p.run(&a, Duration::from_millis(20)).unwrap();
        assert!(p.seconds() >= first + 0.02, "{}", p.seconds());
        for t in &p.threads {
            assert_eq!(t.chunks.len(), 8);
            assert_eq!(t.next as u64, t.decoded % 8);
            assert!(t.decoded >= 2 * PROBE_CLOCK_EVERY as u64);
        }
        // Repeated to a byte count: copies of the sample until it is reached.
        let big = DecodeProbe::new(&a, &chunks, 10 * p.sample_bytes(), 1)
            .unwrap()
            .unwrap();
        assert_eq!(big.sample_bytes(), 10 * p.sample_bytes());
        assert_eq!(big.threads[0].chunks.len(), 80);
    }
}
