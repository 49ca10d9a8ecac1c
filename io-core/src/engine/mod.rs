//! [`IoEngine`]: the batch API and backend selection. Planning is in [`plan`], a batch's
//! consumer in [`batch`].

pub(crate) mod batch;
pub(crate) mod plan;
mod state;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;

use crossbeam_channel::Receiver;

use crate::budget::Budget;
use crate::config::{BackendChoice, BackendKind, FastPath, IoConfig, MapFiles};
use crate::error::{EngineError, IoError};
use crate::files::cache::FdCache;
use crate::fork::{self, PerProcess};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::request::{ReadRange, ReadRequest};
use crate::worker::op::{Ctx, RUN_LEN};
#[cfg(target_os = "linux")]
use crate::worker::uring;
use crate::worker::{Work, portable};

use self::state::Inner;

pub use self::batch::Batch;

/// A batch-first reader of byte ranges. Cheap to clone; the workers stop when the last clone
/// and the last [`Batch`] are dropped.
///
/// In a child of `fork` an engine started by the parent has no workers: it starts one of the
/// same configuration there on first use (the child's [`IoEngine::shared`] for the parent's),
/// and leaves the parent's as it is (see [`crate::fork`]).
#[derive(Debug, Clone)]
pub struct IoEngine {
    inner: Arc<Inner>,
}

impl IoEngine {
    /// Whether `self` and `other` are the same engine (clones of one another).
    pub fn same_engine(&self, other: &IoEngine) -> bool {
        Arc::ptr_eq(self.live(), other.live())
    }

    /// The engine's state in this process: its own, or in a child of `fork` the engine that
    /// replaces it there.
    fn live(&self) -> &Arc<Inner> {
        if self.inner.generation == fork::generation() {
            return &self.inner;
        }
        let next = self.inner.successor.get_or_init(|| {
            let started = if self.inner.shared {
                IoEngine::shared()
            } else {
                let mut config = self.inner.config.clone();
                config.budget = config.budget.as_ref().map(Budget::live);
                IoEngine::new(config)
            };
            // Threads that cannot be started in the child: every read fails, naming its range.
            started.unwrap_or_else(|e| {
                log::error!("zcrop-io: no engine in this forked process: {e}");
                IoEngine::stopped(&self.inner.config)
            })
        });
        &next.inner
    }

    /// Starts an engine.
    pub fn new(config: IoConfig) -> Result<Self, EngineError> {
        Self::start(config, false)
    }

    /// An engine without workers: every read fails with [`IoError::Shutdown`].
    fn stopped(config: &IoConfig) -> IoEngine {
        let (_, rx) = crossbeam_channel::unbounded::<Work>();
        IoEngine::from_inner(Inner {
            queue: None,
            helper: rx,
            consumers_help: false,
            ctx: Arc::new(Ctx {
                fds: FdCache::new(1),
                metrics: Metrics::default(),
                budget: Arc::clone(Budget::global()),
                direct: false,
                recycle: false,
                map_files: MapFiles::Never,
                shutdown: AtomicBool::new(true),
            }),
            backend: BackendKind::Portable,
            fallback_reason: None,
            coalesce: config.coalesce,
            queue_depth: config.queue_depth,
            run_len: 1,
            threads: Vec::new(),
            #[cfg(target_os = "linux")]
            wakers: Vec::new(),
            config: config.clone(),
            shared: false,
            successor: PerProcess::new(),
            generation: fork::generation(),
        })
    }

    fn from_inner(inner: Inner) -> IoEngine {
        IoEngine {
            inner: Arc::new(inner),
        }
    }

    #[allow(clippy::needless_pass_by_value)] // a config is consumed by starting an engine
    fn start(config: IoConfig, shared: bool) -> Result<Self, EngineError> {
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
                    return Ok(IoEngine::from_inner(Inner {
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
                        config,
                        shared,
                        successor: PerProcess::new(),
                        generation: fork::generation(),
                    }));
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
        Ok(IoEngine::from_inner(Inner {
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
            config,
            shared,
            successor: PerProcess::new(),
            generation: fork::generation(),
        }))
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

    /// The process-wide engine, configured by [`IoConfig::from_env`] on first use (in each
    /// process: a child of `fork` starts its own). Every array and loader that is not given an
    /// engine shares this one (and [`Budget::global`]).
    pub fn shared() -> Result<IoEngine, EngineError> {
        static SHARED: PerProcess<IoEngine> = PerProcess::new();
        SHARED
            .get_or_try_init(|| IoEngine::start(IoConfig::from_env()?, true))
            .cloned()
    }

    /// The backend this engine runs.
    pub fn backend(&self) -> BackendKind {
        self.live().backend
    }

    /// Why io_uring was not used, when [`BackendChoice::Auto`] fell back to the portable backend.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.live().fallback_reason.as_deref()
    }

    /// Reads in flight per engine at most.
    pub fn queue_depth(&self) -> usize {
        self.live().queue_depth
    }

    /// Worker threads the engine started: io_uring rings, or `pread` threads.
    pub fn worker_threads(&self) -> usize {
        self.live().threads.len()
    }

    /// How many files the engine keeps open at most between reads: the configured
    /// [`IoConfig::fd_cache_capacity`], or a quarter of the descriptors the process could
    /// still open when the engine started, if that is fewer.
    pub fn open_files_limit(&self) -> usize {
        self.live().ctx.fds.capacity()
    }

    /// The engine's counters now.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.live().ctx.metrics.snapshot()
    }

    /// Submits a batch of reads and returns at once. Iterate the returned [`Batch`] to receive
    /// each result as it completes, tagged with its request's id.
    ///
    /// Nearby ranges of one file are merged into one read and identical ones read once (see
    /// [`CoalesceLimits`](crate::CoalesceLimits)); each request still gets its own [`Completion`](crate::Completion). Requests are planned
    /// in groups of `PLAN_GROUP` (in the order given; a batch of more than 256 plans its first
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
    /// [`check_mapped`](crate::check_mapped), which reports bytes lost to a file truncated meanwhile.
    pub fn submit_mapped(&self, requests: impl IntoIterator<Item = ReadRequest>) -> Batch {
        self.submit_inner(requests, true)
    }

    fn submit_inner(&self, requests: impl IntoIterator<Item = ReadRequest>, map: bool) -> Batch {
        Batch::new(Arc::clone(self.live()), requests.into_iter().collect(), map)
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

#[cfg(test)]
mod tests {
    use super::*;

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
