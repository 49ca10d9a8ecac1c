//! [`IoEngine`]: the batch API, backend selection and the planning of physical reads.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use rustc_hash::FxHashMap;

use crate::budget::Budget;
use crate::coalesce::{CoalesceLimits, coalesce};
use crate::error::{EngineError, IoError};
use crate::fdcache::FdCache;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::op::{
    Attempt, Ctx, Delivery, Local, Part, Parts, PhysOp, RUN_LEN, Resolution, Run, Sink, Target,
    Work, next_generation, resolve,
};
use crate::portable;
use crate::request::{Completion, ReadRange, ReadRequest};
#[cfg(target_os = "linux")]
use crate::uring;

/// When the io_uring backend tries `preadv2(RWF_NOWAIT)` before the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FastPath {
    /// While it keeps hitting the page cache (the default).
    #[default]
    Auto,
    /// For every read.
    Always,
    /// Never: every read goes through the ring.
    Never,
}

/// When reads of a batch submitted with [`IoEngine::submit_mapped`] are served from a
/// read-only mapping of their file (no copy out of the page cache, no IO thread) instead of
/// being read. Batches submitted with [`IoEngine::submit`] are always read.
///
/// A mapping serves only bounded ranges that lie inside it; anything else (whole-file and
/// suffix reads, ranges past the mapped length, `O_DIRECT` engines, files that cannot be
/// mapped) is read as usual. A file truncated by another process while mapped does not kill
/// the process: the lost pages read as zeros and [`check_mapped`] reports the result as
/// [`IoError::FileChanged`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapFiles {
    /// Never: every read is a read.
    Never,
    /// Files of at least [`MAP_MIN_FILE_BYTES`], for ranges whose pages are all in memory
    /// (asked with `cachestat` on Linux 6.5 and later about the aligned 1 MiB of the file
    /// around the read, an answer every thread then uses for the reads in that 1 MiB for one
    /// second, and per read where that stretch was not all in memory; else one `mincore` per
    /// read; while a thread's recent ranges were mostly not in memory, only one read in 32
    /// asks; the default). A page evicted after its stretch was found in memory is faulted
    /// back in when read: slower, never wrong. Cold ranges are read through the backend, so
    /// they keep its queue depth instead of faulting in one page at a time. For a file this
    /// process neither owns nor may write, Linux reports only the pages already mapped into
    /// the process, so cached pages not yet touched through the mapping are read.
    #[default]
    WhenCached,
    /// Every mappable read of every file, cached or not (cold bytes are then read by page
    /// faults, one at a time, as the consumer touches them).
    Always,
}

/// The smallest file [`MapFiles::WhenCached`] maps: a mapping costs two system calls and an
/// address-space entry, more than reading a small file (one file per chunk, Zarr v2).
pub const MAP_MIN_FILE_BYTES: u64 = 1 << 20;

impl MapFiles {
    /// The policy's name: `never`, `cached` or `always`.
    pub fn name(self) -> &'static str {
        match self {
            MapFiles::Never => "never",
            MapFiles::WhenCached => "cached",
            MapFiles::Always => "always",
        }
    }
}

impl std::str::FromStr for MapFiles {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "never" | "0" | "false" | "no" | "off" => Ok(MapFiles::Never),
            "cached" | "auto" | "resident" => Ok(MapFiles::WhenCached),
            "always" | "1" | "true" | "yes" | "on" => Ok(MapFiles::Always),
            other => Err(format!(
                "unknown mapping policy {other:?} (expected never, cached or always)"
            )),
        }
    }
}

/// Checks a result of a batch submitted with [`IoEngine::submit_mapped`] once the consumer is
/// done reading its bytes: an error if they came from a mapping of a file that lost pages
/// while mapped (another process truncated it), whose bytes then read as zeros. `path` and
/// `range` are the request's, for the error. One atomic load unless some mapping was damaged.
pub fn check_mapped(bytes: &Bytes, path: &Arc<Path>, range: ReadRange) -> Result<(), IoError> {
    if mapped_intact(bytes) {
        Ok(())
    } else {
        Err(IoError::FileChanged {
            path: Arc::clone(path),
            range,
        })
    }
}

/// [`check_mapped`] as a yes or no: whether `bytes` are free of pages lost from a mapping.
pub fn mapped_intact(bytes: &Bytes) -> bool {
    crate::mapguard::intact(bytes.as_ptr())
}

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring where it works, else the portable backend (and say why).
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// Blocking `pread` on a thread pool.
    Portable,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(BackendChoice::Uring),
            "portable" | "pread" => Ok(BackendChoice::Portable),
            other => Err(format!(
                "unknown IO backend {other:?} (expected auto, uring or portable)"
            )),
        }
    }
}

/// The backend an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Linux io_uring.
    Uring,
    /// Blocking `pread` on a thread pool.
    Portable,
}

impl BackendKind {
    /// A short stable name: `"io_uring"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Uring => "io_uring",
            BackendKind::Portable => "portable",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How an engine reads.
#[derive(Debug, Clone)]
pub struct IoConfig {
    /// Backend choice.
    pub backend: BackendChoice,
    /// Worker threads: rings for io_uring, pool threads for the portable backend. `0` picks:
    /// one ring per core but one (at least 1, at most 4) when the threads waiting for results
    /// read cached data themselves (the fast path, see [`Batch`]), else one per core (at most
    /// 4); or `queue_depth` pool threads (at most 64).
    pub threads: usize,
    /// Reads in flight per engine at most (split across rings).
    pub queue_depth: usize,
    /// Open files with `O_DIRECT` (bypassing the page cache), with ranges rounded out to the
    /// device's alignment and sliced back. Files whose filesystem refuses it are read buffered
    /// (counted in [`MetricsSnapshot::direct_fallbacks`]).
    pub direct: bool,
    /// When nearby ranges of one file merge into one read.
    pub coalesce: CoalesceLimits,
    /// When the io_uring backend tries a `preadv2(RWF_NOWAIT)` page-cache read first.
    pub fast_path: FastPath,
    /// Open files kept in the LRU cache at most (fewer where the process may open few: see
    /// [`IoEngine::open_files_limit`]).
    pub fd_cache_capacity: usize,
    /// The in-flight budget; `None` uses the process-wide [`Budget::global`].
    pub budget: Option<Arc<Budget>>,
    /// Take read buffers from the process's buffer pool, and return them to it when the last
    /// view of a result drops (the default). Recycling saves an allocation and page faults
    /// per read, but the pool keeps up to 16 MiB per size class (4 KiB to 4 MiB) alive; turn
    /// it off where memory is budgeted tightly.
    pub recycle_buffers: bool,
    /// When batches submitted with [`IoEngine::submit_mapped`] are served from read-only
    /// mappings of their files instead of read: no copy out of the page cache and no IO thread
    /// involved, the fastest way to read data that is already cached. See [`MapFiles`]; the
    /// default maps large files for ranges already in memory. Ignored with `direct`.
    pub map_files: MapFiles,
}

/// Requests planned (coalesced) together by [`IoEngine::submit`]. 4096 until 2026-11-26: the
/// consumer's calls that planned the next group then held it ~0.65 ms (sorting, merging and
/// resolving reads of a crop batch), while its decode threads waited for results. 1024 gave
/// +2.5 to +4.8% chunks/s one batch at a time (3 runs) and +1.1 to +1.8% two at a time (3 runs)
/// on `zcrop bench --codec blosc-lz4` (about 6000 cached reads a batch; batches alternating
/// between the two in one run); 256 gave +2.6 and +2.8%, −0.2 and +3.1%.
pub const PLAN_GROUP: usize = 1024;

/// Requests of a batch of more than [`WHOLE_PLAN_UP_TO`] planned first: its first reads go out
/// (and its consumer starts on their results) before the next [`PLAN_GROUP`] requests are
/// planned, at the cost of not coalescing reads across this one boundary. 256 until 2026-11-26; 32 gave +1.0 to +3.8%
/// chunks/s (7 runs, median +2.2%) on `zcrop bench --codec blosc-lz4` one batch at a time
/// (about 6000 cached reads a batch; batches alternating between the two in one run), −0.9 to
/// +2.8% (5 runs, median −0.3%) two at a time; 8 was no better (+3.2, +1.5%), nor a ramp of
/// 32, 256, 2048. Not by starting the decoding much sooner: `submit` went on to plan the next
/// 4096 ([`PLAN_GROUP`] then) before it returned (~0.65 ms of such a batch), and the first
/// decode task began 1.17–1.22 ms into a 16 ms batch, against 1.19–1.37 ms with 256.
const FIRST_PLAN_GROUP: usize = 32;

/// Batches of at most this many requests are planned whole, their reads coalesced as one (see
/// [`FIRST_PLAN_GROUP`]): planning them takes little longer than planning their first group.
const WHOLE_PLAN_UP_TO: usize = 256;

/// Requests a batch keeps handed to the workers but not yet taken by its consumer, in units of
/// the engine's queue depth (at least [`MIN_READ_AHEAD`]). Enough to keep the device busy while
/// the consumer works; more only makes the results pile up, and with them their buffers, which
/// then no longer fit in the CPU's caches (64 KiB cached reads on 2 cores: 176k reads/s with
/// up to 4096 results waiting, 206k with 128).
const READ_AHEAD_DEPTHS: usize = 4;
/// The least read-ahead of a batch, in requests.
const MIN_READ_AHEAD: usize = 64;

/// Default reads in flight per engine.
pub const DEFAULT_QUEUE_DEPTH: usize = 64;
/// Default number of open files cached.
pub const DEFAULT_FD_CACHE: usize = 1024;

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            backend: BackendChoice::Auto,
            threads: 0,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            direct: false,
            coalesce: CoalesceLimits::LOCAL,
            fast_path: FastPath::Auto,
            fd_cache_capacity: DEFAULT_FD_CACHE,
            budget: None,
            recycle_buffers: true,
            map_files: MapFiles::WhenCached,
        }
    }
}

impl IoConfig {
    /// The defaults, overridden by `ZCROP_IO_BACKEND` (`auto`, `uring`, `portable`),
    /// `ZCROP_IO_DIRECT` (`1`), `ZCROP_IO_MMAP` (`never`, `cached`, `always`; `0` and `1` for
    /// never and always), `ZCROP_IO_THREADS` and `ZCROP_IO_QUEUE_DEPTH`. Unparsable values
    /// are reported as errors, not ignored.
    pub fn from_env() -> Result<Self, EngineError> {
        let mut c = IoConfig::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(v) = var("ZCROP_IO_BACKEND") {
            c.backend = v
                .parse()
                .map_err(|e| EngineError::Config(format!("ZCROP_IO_BACKEND: {e}")))?;
        }
        if let Some(v) = var("ZCROP_IO_DIRECT") {
            c.direct = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = var("ZCROP_IO_MMAP") {
            c.map_files = v
                .parse()
                .map_err(|e| EngineError::Config(format!("ZCROP_IO_MMAP: {e}")))?;
        }
        let num = |name: &str| -> Result<Option<usize>, EngineError> {
            var(name)
                .map(|v| {
                    v.parse::<usize>()
                        .map_err(|_| EngineError::Config(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        };
        if let Some(n) = num("ZCROP_IO_THREADS")? {
            c.threads = n;
        }
        if let Some(n) = num("ZCROP_IO_QUEUE_DEPTH")? {
            c.queue_depth = n;
        }
        Ok(c)
    }
}

/// A batch-first reader of byte ranges. Cheap to clone; the workers stop when the last clone
/// and the last [`Batch`] are dropped.
#[derive(Debug, Clone)]
pub struct IoEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Option<Sender<Work>>,
    /// The queue's receiving end, for consumers that help while they wait.
    helper: Receiver<Work>,
    /// Whether consumers try page-cache reads while they wait (not with `O_DIRECT`, nor with
    /// [`FastPath::Never`]).
    consumers_help: bool,
    ctx: Arc<Ctx>,
    backend: BackendKind,
    fallback_reason: Option<String>,
    coalesce: CoalesceLimits,
    queue_depth: usize,
    /// Planned reads per queued run: [`RUN_LEN`] for io_uring; 1 for the portable backend,
    /// whose threads each block on one read at a time (longer runs would leave threads idle).
    run_len: usize,
    threads: Vec<JoinHandle<()>>,
    #[cfg(target_os = "linux")]
    wakers: Vec<Arc<crate::sys::EventFd>>,
}

impl IoEngine {
    /// Starts an engine.
    #[allow(clippy::needless_pass_by_value)] // a config is consumed by starting an engine
    pub fn new(config: IoConfig) -> Result<Self, EngineError> {
        if config.queue_depth == 0 {
            return Err(EngineError::Config("queue_depth must be at least 1".into()));
        }
        let ctx = Arc::new(Ctx {
            fds: FdCache::new(config.fd_cache_capacity),
            metrics: Metrics::default(),
            budget: config
                .budget
                .clone()
                .unwrap_or_else(|| Arc::clone(Budget::global())),
            direct: config.direct,
            recycle: config.recycle_buffers,
            map_files: if config.direct {
                MapFiles::Never
            } else {
                config.map_files
            },
            shutdown: AtomicBool::new(false),
        });
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        let consumers_help = !config.direct && config.fast_path != FastPath::Never;
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);

        let mut fallback_reason = None;
        if config.backend != BackendChoice::Portable {
            match Self::start_uring(&config, cores, &rx, &ctx) {
                Ok((threads, wakers)) => {
                    log::info!(
                        "zcrop-io: io_uring backend, {} ring(s), queue depth {}",
                        threads.len(),
                        config.queue_depth
                    );
                    return Ok(IoEngine {
                        inner: Arc::new(Inner {
                            queue: Some(tx),
                            helper: rx,
                            consumers_help,
                            ctx,
                            backend: BackendKind::Uring,
                            fallback_reason: None,
                            coalesce: config.coalesce,
                            queue_depth: config.queue_depth,
                            run_len: RUN_LEN,
                            threads,
                            #[cfg(target_os = "linux")]
                            wakers,
                        }),
                    });
                }
                Err(EngineError::UringUnavailable { reason })
                    if config.backend == BackendChoice::Auto =>
                {
                    log::warn!("zcrop-io: io_uring unavailable ({reason}); using portable pread");
                    fallback_reason = Some(reason);
                }
                Err(e) => return Err(e),
            }
        }
        let n = if config.threads == 0 {
            config.queue_depth.min(64)
        } else {
            config.threads
        };
        let threads = portable::spawn(n, &rx, &ctx)?;
        log::info!("zcrop-io: portable backend, {n} pread thread(s)");
        Ok(IoEngine {
            inner: Arc::new(Inner {
                queue: Some(tx),
                helper: rx,
                consumers_help,
                ctx,
                backend: BackendKind::Portable,
                fallback_reason,
                coalesce: config.coalesce,
                queue_depth: config.queue_depth,
                run_len: 1,
                threads,
                #[cfg(target_os = "linux")]
                wakers: Vec::new(),
            }),
        })
    }

    #[cfg(target_os = "linux")]
    #[allow(clippy::type_complexity)]
    fn start_uring(
        config: &IoConfig,
        cores: usize,
        rx: &Receiver<Work>,
        ctx: &Arc<Ctx>,
    ) -> Result<(Vec<JoinHandle<()>>, Vec<Arc<crate::sys::EventFd>>), EngineError> {
        uring::probe().map_err(|reason| EngineError::UringUnavailable { reason })?;
        let rings = if config.threads == 0 {
            default_rings(cores, !config.direct && config.fast_path != FastPath::Never)
        } else {
            config.threads
        }
        .min(config.queue_depth);
        let mut threads = Vec::with_capacity(rings);
        let mut wakers = Vec::with_capacity(rings);
        for i in 0..rings {
            // Split the depth so the rings together keep `queue_depth` reads in flight.
            let depth = config.queue_depth / rings + usize::from(i < config.queue_depth % rings);
            match uring::spawn(i, depth, config.fast_path, rx, ctx) {
                Ok(h) => {
                    threads.push(h.thread);
                    wakers.push(h.waker);
                }
                Err(e) => {
                    // Stop the rings already started before reporting.
                    ctx.shutdown.store(true, Ordering::Release);
                    for w in &wakers {
                        w.notify();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    ctx.shutdown.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok((threads, wakers))
    }

    #[cfg(not(target_os = "linux"))]
    #[allow(clippy::type_complexity)]
    fn start_uring(
        _config: &IoConfig,
        _cores: usize,
        _rx: &Receiver<Work>,
        _ctx: &Arc<Ctx>,
    ) -> Result<(Vec<JoinHandle<()>>, Vec<()>), EngineError> {
        Err(EngineError::UringUnavailable {
            reason: "io_uring exists only on Linux".into(),
        })
    }

    /// The process-wide engine, configured by [`IoConfig::from_env`] on first use. Every array
    /// and loader that is not given an engine shares this one (and [`Budget::global`]).
    pub fn shared() -> Result<IoEngine, EngineError> {
        static SHARED: Mutex<Option<IoEngine>> = Mutex::new(None);
        let mut guard = SHARED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = guard.as_ref() {
            return Ok(e.clone());
        }
        let engine = IoEngine::new(IoConfig::from_env()?)?;
        *guard = Some(engine.clone());
        Ok(engine)
    }

    /// The backend this engine runs.
    pub fn backend(&self) -> BackendKind {
        self.inner.backend
    }

    /// Why io_uring was not used, when [`BackendChoice::Auto`] fell back to the portable backend.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.inner.fallback_reason.as_deref()
    }

    /// Reads in flight per engine at most.
    pub fn queue_depth(&self) -> usize {
        self.inner.queue_depth
    }

    /// Worker threads the engine started: io_uring rings, or `pread` threads.
    pub fn worker_threads(&self) -> usize {
        self.inner.threads.len()
    }

    /// How many files the engine keeps open at most between reads: the configured
    /// [`IoConfig::fd_cache_capacity`], or a quarter of the descriptors the process could
    /// still open when the engine started, if that is fewer.
    pub fn open_files_limit(&self) -> usize {
        self.inner.ctx.fds.capacity()
    }

    /// The engine's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.ctx.metrics.snapshot()
    }

    /// Submits a batch of reads and returns at once. Iterate the returned [`Batch`] to receive
    /// each result as it completes, tagged with its request's id.
    ///
    /// Nearby ranges of one file are merged into one read and identical ones read once (see
    /// [`CoalesceLimits`]); each request still gets its own [`Completion`]. Requests are planned
    /// in groups of [`PLAN_GROUP`] (in the order given; a batch of more than 256 plans its first
    /// 32 alone, so that its first reads go out sooner), so merging applies within a group, and
    /// planned reads are handed to the workers as results are taken, four queue depths (at
    /// least 64 requests) ahead of the consumer: memory stays bounded however large the batch,
    /// and the buffers of results waiting for the consumer stay few enough to be in cache.
    pub fn submit(&self, requests: impl IntoIterator<Item = ReadRequest>) -> Batch {
        self.submit_inner(requests, false)
    }

    /// Like [`IoEngine::submit`], but reads may be served from mappings of their files (as
    /// [`IoConfig::map_files`] says): each result's bytes may then be a view of the page cache.
    /// The caller promises to pass every result, once it has finished reading its bytes, to
    /// [`check_mapped`], which reports bytes lost to a file truncated meanwhile.
    pub fn submit_mapped(&self, requests: impl IntoIterator<Item = ReadRequest>) -> Batch {
        self.submit_inner(requests, true)
    }

    fn submit_inner(&self, requests: impl IntoIterator<Item = ReadRequest>, map: bool) -> Batch {
        let (tx, rx) = crossbeam_channel::unbounded();
        let sink = Arc::new(Sink {
            tx,
            map: map && self.inner.ctx.map_files != MapFiles::Never,
            dropped: AtomicBool::new(false),
            generation: next_generation(),
        });
        let unsent: Vec<ReadRequest> = requests.into_iter().collect();
        let total = unsent.len();
        let mut local = Local::default();
        local.counters.batches = 1;
        local.counters.requests = total as u64;
        let mut batch = Batch {
            rx,
            sink,
            ready: VecDeque::new(),
            inline: VecDeque::new(),
            inline_taken: 0,
            inline_misses: 0,
            remaining: total,
            unsent: unsent.into_iter(),
            sent: 0,
            planned: VecDeque::new(),
            queued: 0,
            read_ahead: (self.inner.queue_depth * READ_AHEAD_DEPTHS).max(MIN_READ_AHEAD),
            local,
            helping: self.inner.consumers_help,
            misses_in_a_row: 0,
            help_resume_at: 0,
            unwoken: false,
            engine: self.clone(),
        };
        // Submitting starts the reads: the workers are woken whoever iterates, and when.
        batch.feed(false);
        batch
    }

    /// Reads a batch and returns every result in the order of `requests` (ids are ignored).
    pub fn read_all(&self, requests: Vec<ReadRequest>) -> Vec<Result<Bytes, IoError>> {
        let described: Vec<(Arc<Path>, ReadRange)> = requests
            .iter()
            .map(|r| (Arc::clone(&r.path), r.range))
            .collect();
        let batch = self.submit(
            requests
                .into_iter()
                .enumerate()
                .map(|(i, r)| ReadRequest { id: i as u64, ..r }),
        );
        let mut out: Vec<Option<Result<Bytes, IoError>>> = vec![None; described.len()];
        for c in batch {
            out[c.id as usize] = Some(c.result);
        }
        out.into_iter()
            .zip(described)
            .map(|(r, (path, range))| r.unwrap_or(Err(IoError::Shutdown { path, range })))
            .collect()
    }
}

impl Inner {
    /// Wakes the io_uring workers (the portable workers wake on their own).
    fn wake(&self) {
        #[cfg(target_os = "linux")]
        for w in &self.wakers {
            w.notify();
        }
    }

    /// Hands an item back to the backend workers.
    fn requeue(&self, work: Work, local: &mut Local) {
        match &self.queue {
            Some(q) => match q.send(work) {
                Ok(()) => self.wake(),
                Err(crossbeam_channel::SendError(w)) => w.fail_shutdown(local),
            },
            None => work.fail_shutdown(local),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ctx.shutdown.store(true, Ordering::Release);
        // Closing the queue ends the portable workers' loops.
        self.queue.take();
        #[cfg(target_os = "linux")]
        for w in &self.wakers {
            w.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The address an `Arc<Path>` points to.
fn arc_addr(p: &Arc<Path>) -> usize {
    Arc::as_ptr(p).cast::<u8>().addr()
}

/// Groups requests by file and plans the physical reads: coalesced bounded ranges, one read per
/// distinct suffix length, one read for all whole-file requests; in runs of at most `run_len`
/// reads, each with the number of requests it serves.
fn plan(
    requests: impl IntoIterator<Item = ReadRequest>,
    limits: CoalesceLimits,
    sink: &Arc<Sink>,
    run_len: usize,
) -> Vec<(Run, usize)> {
    #[derive(Default)]
    struct FileReqs {
        bounded: Vec<(u64, u64)>,
        bounded_ids: Vec<u64>,
        whole: Vec<u64>,
        suffix: Vec<(u64, u64)>, // (n, id)
    }
    let mut files: Vec<(Arc<Path>, FileReqs)> = Vec::new();
    let mut index: FxHashMap<Arc<Path>, usize> = FxHashMap::default();
    // Callers usually name a file by one `Arc` in all its requests, which come interleaved
    // with other files' (a batch of crops reads from several shards by turns): the `Arc`'s
    // address finds the file without hashing the path. Every `Arc` seen stays alive in
    // `by_arc`, so an address is never reused by another path meanwhile.
    let mut by_arc: FxHashMap<usize, (Arc<Path>, usize)> = FxHashMap::default();
    for r in requests {
        let i = match files.last() {
            Some((p, _)) if Arc::ptr_eq(p, &r.path) => files.len() - 1,
            _ => match by_arc.get(&arc_addr(&r.path)) {
                Some(&(_, i)) => i,
                None => {
                    let i = *index.entry(Arc::clone(&r.path)).or_insert_with(|| {
                        files.push((Arc::clone(&r.path), FileReqs::default()));
                        files.len() - 1
                    });
                    by_arc.insert(arc_addr(&r.path), (Arc::clone(&r.path), i));
                    i
                }
            },
        };
        let f = &mut files[i].1;
        match r.range {
            ReadRange::Bounded { offset, len } => {
                f.bounded.push((offset, len));
                f.bounded_ids.push(r.id);
            }
            ReadRange::Whole => f.whole.push(r.id),
            ReadRange::Suffix(n) => f.suffix.push((n, r.id)),
        }
    }
    // Reads grouped by file; `target` is the file's index in `files` until the runs are cut.
    let mut ops = Vec::new();
    let mut paths = Vec::with_capacity(files.len());
    for (target, (path, f)) in files.into_iter().enumerate() {
        paths.push(path);
        let planned = coalesce(&f.bounded, limits);
        for (m, members) in planned.iter() {
            let part = |mem: &crate::coalesce::Member| {
                let (offset, len) = f.bounded[mem.index];
                Part {
                    id: f.bounded_ids[mem.index],
                    range: ReadRange::Bounded { offset, len },
                    offset_in_read: mem.offset_in_read,
                    len: Some(len),
                }
            };
            let parts = match members {
                [one] => Parts::One(part(one)),
                many => Parts::Many(many.iter().map(part).collect()),
            };
            ops.push(PhysOp {
                target,
                range: ReadRange::Bounded {
                    offset: m.offset,
                    len: m.len,
                },
                parts,
            });
        }
        let whole_parts = |ids: &mut dyn Iterator<Item = u64>, range: ReadRange| -> Parts {
            Parts::from_vec(
                ids.map(|id| Part {
                    id,
                    range,
                    offset_in_read: 0,
                    len: None,
                })
                .collect(),
            )
        };
        if !f.whole.is_empty() {
            ops.push(PhysOp {
                target,
                range: ReadRange::Whole,
                parts: whole_parts(&mut f.whole.into_iter(), ReadRange::Whole),
            });
        }
        let mut suffix = f.suffix;
        suffix.sort_unstable_by_key(|&(n, _)| n);
        for group in suffix.chunk_by(|a, b| a.0 == b.0) {
            let range = ReadRange::Suffix(group[0].0);
            ops.push(PhysOp {
                target,
                range,
                parts: whole_parts(&mut group.iter().map(|&(_, id)| id), range),
            });
        }
    }
    // Cut into runs; each run gets one target per file it reads (its reads of a file are
    // consecutive) and its reads index those.
    let mut runs = Vec::with_capacity(ops.len().div_ceil(run_len));
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        let mut targets: Vec<Target> = Vec::new();
        let mut file = usize::MAX;
        let mut requests = 0;
        let run: Vec<PhysOp> = ops
            .by_ref()
            .take(run_len)
            .map(|mut op| {
                if op.target != file {
                    file = op.target;
                    targets.push(Target {
                        path: Arc::clone(&paths[file]),
                        sink: Arc::clone(sink),
                    });
                }
                op.target = targets.len() - 1;
                requests += op.parts.as_slice().len();
                op
            })
            .collect();
        runs.push((Run { targets, ops: run }, requests));
    }
    runs
}

/// Rings started on a machine of `cores` cores when the caller does not say. The threads that
/// wait for results read cached data themselves when `consumers_help`; a ring per core beside
/// them would make one thread more than there are cores, all busy on cached data (2 cores, warm
/// 4 KiB reads, `benches/results/io_vs_fio.md`: 871k reads/s with one ring against 738k with
/// two). Cold reads need few cores: one ring keeps 64 reads in flight with half a core.
fn default_rings(cores: usize, consumers_help: bool) -> usize {
    if consumers_help {
        cores.saturating_sub(1).clamp(1, 4)
    } else {
        cores.clamp(1, 4)
    }
}

/// The results of one [`IoEngine::submit`], in completion order. Iterating blocks until the
/// next result arrives and ends after the last one. Dropping it early is fine: reads still in
/// flight finish and their results are discarded.
///
/// With [`IoEngine::submit_mapped`], a read whose bytes a mapping of its file serves without a
/// system call (its window of the file recently found in memory) is served by the iterating
/// thread as it plans the batch, with no plan, queue or hand-off.
///
/// While it waits, the iterating thread helps: it takes planned reads off the engine's queue and
/// tries them with a non-blocking page-cache read (`preadv2(RWF_NOWAIT)`). Cached data is then
/// read by the thread that wants it, without a hand-off; a read that misses the cache goes back
/// to the backend's workers (a batch that keeps missing pauses helping for a while, then tries
/// again: data that was cold may be cached by then). Submitting wakes the workers; reads handed
/// out later, while the consumer keeps serving its reads from the cache, wait for the consumer
/// instead (no wake-up of an IO thread per run), until it misses or is about to wait.
#[derive(Debug)]
pub struct Batch {
    rx: Receiver<Delivery>,
    sink: Arc<Sink>,
    ready: VecDeque<Completion>,
    /// Results this thread served from mappings as it planned (see [`Batch::feed`]): they
    /// took no read of the workers, so they do not count against `read_ahead`.
    inline: VecDeque<Completion>,
    /// Of those, returned so far.
    inline_taken: usize,
    /// Requests in a row not served so (see [`INLINE_MISSES`]).
    inline_misses: u32,
    remaining: usize,
    /// Requests not yet planned.
    unsent: std::vec::IntoIter<ReadRequest>,
    /// Requests planned so far.
    sent: usize,
    /// Planned runs not yet handed to the workers, with the requests each serves.
    planned: VecDeque<(Run, usize)>,
    /// Requests handed to the workers so far.
    queued: usize,
    /// Requests handed out but not yet returned, at most (see [`READ_AHEAD_DEPTHS`]).
    read_ahead: usize,
    /// Results this thread produced for other batches, and its counters.
    local: Local,
    helping: bool,
    misses_in_a_row: u32,
    /// After a run of misses, helping resumes once this many results have been returned.
    help_resume_at: usize,
    /// Runs were handed out without waking the workers (see [`Batch::feed`]).
    unwoken: bool,
    engine: IoEngine,
}

/// Requests in a row a batch failed to serve from mappings as it planned them (files not
/// mapped, such as small ones, or data not recently found in memory) after which it stops
/// trying for the rest of the batch: each try looks its file up among the open ones, and on
/// the benchmark's v2 array (thousands of small files a batch) trying every request cost
/// 1-5% chunks/s.
const INLINE_MISSES: u32 = 64;

/// Misses in a row after which a batch pauses helping (its data is not cached).
const HELP_MISSES: u32 = 8;
/// Results returned before a batch that paused helping tries again. Trying costs at most
/// [`HELP_MISSES`] non-blocking reads that miss, against this many reads served by workers.
const HELP_PAUSE: usize = 1024;
/// Results for other batches a helping consumer holds before sending them.
const HELP_FLUSH_AT: usize = 64;

impl Batch {
    /// Results not yet returned.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Results returned so far.
    fn returned(&self) -> usize {
        self.sent + self.unsent.len() - self.remaining
    }

    /// The next result if one is available, without waiting for the device.
    pub fn try_next(&mut self) -> Option<Completion> {
        self.next_inner(false)
    }

    /// Hands planned runs to the workers while fewer than `read_ahead` requests are out, and
    /// plans the next group of requests when the runs planned so far are all out. Requests
    /// whose bytes a mapping serves without a system call are served here as the group is
    /// planned (as a helping consumer would serve them once planned and queued, with no plan,
    /// queue or hand-off), while fewer than `read_ahead` of those wait to be returned.
    fn feed(&mut self, iterating: bool) {
        let returned_by_workers = self.returned() - self.inline_taken;
        let inner = Arc::clone(&self.engine.inner);
        let mut handed_out = false;
        while self.queued - returned_by_workers < self.read_ahead {
            let Some((run, requests)) = self.planned.pop_front() else {
                if self.unsent.len() == 0 || self.inline.len() >= self.read_ahead {
                    break;
                }
                let take = if self.sent == 0 && self.unsent.len() > WHOLE_PLAN_UP_TO {
                    FIRST_PLAN_GROUP
                } else {
                    PLAN_GROUP
                };
                let mut group: Vec<ReadRequest> = self.unsent.by_ref().take(take).collect();
                self.sent += group.len();
                if self.sink.map && self.helping {
                    let ctx = &inner.ctx;
                    group.retain(|r| {
                        if self.inline_misses >= INLINE_MISSES {
                            return true;
                        }
                        let Some(bytes) = self.local.try_mapped(r, ctx, self.sink.generation)
                        else {
                            self.inline_misses += 1;
                            return true;
                        };
                        self.inline_misses = 0;
                        self.inline.push_back(Completion {
                            id: r.id,
                            result: Ok(bytes),
                        });
                        false
                    });
                }
                self.planned
                    .extend(plan(group, inner.coalesce, &self.sink, inner.run_len));
                continue;
            };
            self.queued += requests;
            handed_out = true;
            let sent = match &inner.queue {
                Some(queue) => queue.send(Work::Fresh(run)).map_err(|e| e.0),
                None => Err(Work::Fresh(run)),
            };
            if let Err(w) = sent {
                w.fail_shutdown(&mut self.local);
            }
        }
        if handed_out {
            // While the consumer iterating serves the runs it hands out itself (its last try
            // was cached), waking an IO thread too only costs an eventfd write here and a
            // thread switch there, for reads this thread would have served as soon: they wait
            // unwoken until it misses (the runs it gives back wake the workers), is about to
            // wait, or returns without a result.
            if iterating
                && self.helping
                && self.misses_in_a_row == 0
                && self.returned() >= self.help_resume_at
            {
                self.unwoken = true;
            } else {
                self.wake_workers();
            }
        }
    }

    /// Wakes the workers.
    fn wake_workers(&mut self) {
        self.unwoken = false;
        self.engine.inner.wake();
    }

    /// Wakes the workers if runs were handed out without waking them.
    fn wake_if_unwoken(&mut self) {
        if self.unwoken {
            self.wake_workers();
        }
    }

    fn take(&mut self, d: Delivery) {
        if self.ready.is_empty() {
            // Adopt the delivery's vector: no copy of its completions.
            self.ready = VecDeque::from(d.completions);
        } else {
            self.ready.extend(d.completions);
        }
        // The permits are released here, as the consumer takes the results.
        drop(d.permits);
    }

    fn next_inner(&mut self, block: bool) -> Option<Completion> {
        loop {
            if !self.planned.is_empty() || self.unsent.len() > 0 {
                self.feed(true);
            }
            // Workers' results first: they hold budget until taken.
            if let Some(c) = self.ready.pop_front() {
                self.remaining -= 1;
                return Some(c);
            }
            if let Some(c) = self.inline.pop_front() {
                self.remaining -= 1;
                self.inline_taken += 1;
                if self.inline.is_empty() {
                    // Their counts reach the metrics by the time the last one is returned.
                    let ctx = Arc::clone(&self.engine.inner.ctx);
                    self.local.flush(&ctx);
                }
                return Some(c);
            }
            if self.remaining == 0 {
                return None;
            }
            if let Ok(d) = self.rx.try_recv() {
                self.take(d);
                continue;
            }
            if self.help() {
                continue;
            }
            // Nothing to do but wait: first hand over what this thread holds for others, and
            // wake the workers for what it handed out.
            self.wake_if_unwoken();
            let ctx = &self.engine.inner.ctx;
            self.local.flush(ctx);
            if !block {
                return None;
            }
            match self.rx.recv() {
                Ok(d) => self.take(d),
                Err(_) => {
                    log::error!(
                        "zcrop-io: workers stopped with {} reads pending",
                        self.remaining
                    );
                    self.remaining = 0;
                }
            }
        }
    }

    /// Runs one queued run of reads from the page cache, if any and while that keeps working;
    /// returns whether it did anything.
    fn help(&mut self) -> bool {
        if !self.helping || self.returned() < self.help_resume_at {
            return false;
        }
        let inner = Arc::clone(&self.engine.inner);
        let Ok(work) = inner.helper.try_recv() else {
            return false;
        };
        let run = match work {
            Work::Fresh(run) => run,
            // Work that needs the device (or budget) belongs to the workers; this thread waits
            // for a result before it looks at the queue again.
            other => {
                inner.requeue(other, &mut self.local);
                return false;
            }
        };
        let ctx = &inner.ctx;
        let Run { targets, ops } = run;
        let mut ops = ops.into_iter();
        while let Some(op) = ops.next() {
            let target = &targets[op.target];
            if let Some((handed_back, short_of_budget)) = self.help_one(op, target, &inner) {
                // The rest of the run goes back too, to the workers that wait for it.
                let rest: Vec<PhysOp> = ops.collect();
                inner.requeue(handed_back, &mut self.local);
                if !rest.is_empty() {
                    let rest = Run { targets, ops: rest };
                    inner.requeue(Work::Fresh(rest), &mut self.local);
                }
                if short_of_budget {
                    // Results this thread takes free budget: wait for one.
                    self.collect_own();
                    return false;
                }
                break;
            }
            if self.local.pending() >= HELP_FLUSH_AT {
                self.local.flush(ctx);
            }
        }
        // Budget taken ahead for this run must not outlive it: this thread may wait next.
        self.local.release_credit();
        self.collect_own()
    }

    /// Reads `op` (of a run for `target`) from the page cache; returns what must go back to
    /// the workers when it could not, and whether that was for lack of budget (a miss pauses
    /// or stops helping as the outcome says).
    fn help_one(&mut self, op: PhysOp, target: &Target, inner: &Inner) -> Option<(Work, bool)> {
        let ctx = &inner.ctx;
        if ctx.shutting_down() {
            op.fail_shutdown(target, &mut self.local);
            return None;
        }
        let resolved = match resolve(op, target, ctx, &mut self.local) {
            Resolution::Read(r) => r,
            Resolution::Finished => return None,
        };
        let Some(permit) = self.local.charge(&ctx.budget, resolved.charge()) else {
            return Some((Work::Resolved(resolved, target.clone()), true));
        };
        let active = resolved.activate(permit, target, &mut self.local)?;
        match active.try_cached(target, &mut self.local) {
            Attempt::Done => {
                self.misses_in_a_row = 0;
                None
            }
            Attempt::Missed(active) => {
                self.misses_in_a_row += 1;
                if self.misses_in_a_row >= HELP_MISSES {
                    self.misses_in_a_row = 0;
                    self.help_resume_at = self.returned() + HELP_PAUSE;
                }
                let back = Work::Missed(Box::new(active.release_budget()), target.clone());
                Some((back, false))
            }
            Attempt::Unsupported(active) => {
                self.helping = false;
                let back = Work::Missed(Box::new(active.release_budget()), target.clone());
                Some((back, false))
            }
        }
    }

    /// Moves this batch's own results out of the local buffer.
    fn collect_own(&mut self) -> bool {
        if let Some(d) = self.local.take_for(&self.sink) {
            self.take(d);
        }
        true
    }
}

impl Iterator for Batch {
    type Item = Completion;

    fn next(&mut self) -> Option<Completion> {
        self.next_inner(true)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.ready.len() + self.inline.len(), Some(self.remaining))
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // Reads of this batch still queued are skipped by whoever takes them.
        self.sink.dropped.store(true, Ordering::Release);
        self.wake_if_unwoken();
        // Results held for other batches must reach them.
        let ctx = Arc::clone(&self.engine.inner.ctx);
        self.local.flush(&ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Runs hold reads of several files; each read names its own file's target, and a run has
    /// one target per file it reads.
    #[test]
    fn runs_index_one_target_per_file_they_read() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let sink = Arc::new(Sink {
            tx,
            map: false,
            dropped: AtomicBool::new(false),
            generation: 1,
        });
        let paths: Vec<Arc<Path>> = ["a", "b", "c"]
            .iter()
            .map(|p| Arc::from(Path::new(p)))
            .collect();
        // File a again through an `Arc` of its own: the same file.
        let a_again: Arc<Path> = Arc::from(Path::new("a"));
        let mut requests = Vec::new();
        let mut named = HashMap::new();
        for (group, (file, reads)) in [(0, 2), (1, 1), (2, 6), (0, 1), (0, 2)]
            .into_iter()
            .enumerate()
        {
            for _ in 0..reads {
                let id = requests.len() as u64;
                let path = if group == 4 { &a_again } else { &paths[file] };
                requests.push(ReadRequest::new(
                    id,
                    Arc::clone(path),
                    ReadRange::new(id * 100, 10),
                ));
                named.insert(id, Arc::clone(&paths[file]));
            }
        }
        let no_merging = CoalesceLimits {
            max_gap: 0,
            max_merged_len: 1,
        };
        let runs = plan(requests, no_merging, &sink, 4);
        let shape: Vec<(usize, usize, usize)> = runs
            .iter()
            .map(|(r, n)| (r.ops.len(), *n, r.targets.len()))
            .collect();
        // a: 5 reads, b: 1, c: 6, cut in fours: [a a a a] [a b c c] [c c c c].
        assert_eq!(shape, vec![(4, 4, 1), (4, 4, 3), (4, 4, 1)]);
        for (run, _) in &runs {
            for op in &run.ops {
                let t = &run.targets[op.target];
                assert!(Arc::ptr_eq(&t.sink, &sink));
                for part in op.parts.as_slice() {
                    assert_eq!(t.path, named[&part.id], "request {}", part.id);
                }
            }
        }
    }

    #[test]
    fn default_rings_leave_a_core_to_helping_consumers() {
        let helping: Vec<usize> = [1, 2, 3, 4, 5, 8, 64]
            .iter()
            .map(|&c| default_rings(c, true))
            .collect();
        assert_eq!(helping, [1, 1, 2, 3, 4, 4, 4]);
        let alone: Vec<usize> = [1, 2, 3, 4, 5, 64]
            .iter()
            .map(|&c| default_rings(c, false))
            .collect();
        assert_eq!(alone, [1, 2, 3, 4, 4, 4]);
    }
}
