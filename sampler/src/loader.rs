//! The pipeline: background workers read the next batches through zarr-front into a ring of
//! reusable pinned host buffers, and hand them to the consumer in step order.
//!
//! * **Prefetch:** at most `prefetch` batches are claimed ahead of the consumer (in flight or
//!   ready). Workers never allocate: a batch needs a free buffer of the ring, and a buffer is
//!   free again only when the consumer drops the [`Batch`] that holds it (back-pressure).
//! * **Adaptive depth** (`prefetch_max`): the consumer's waits say whether the pipeline keeps up.
//!   Every window of [`ADAPT_WINDOW`] batches or twice the depth, a consumer that spent over 5% of
//!   its time waiting gets the depth Little's law asks for: the batches' measured read time over
//!   the consumer's own time per batch, plus one (at most 4x the depth in one step; half again as
//!   deep where that estimate is already reached). Buffers and, if needed, workers are added, up to
//!   `prefetch_max` and [`AUTO_PREFETCH_BYTES`] of buffers. The window after a change is left to
//!   settle; if the one after it does not deliver 5% more batches per second, the depth goes back
//!   (the extra buffers are released) and stays for 8 windows, twice as long after each further try
//!   that does not pay (up to 64). Reads far from the store (an object store at 20-80 ms) thus get
//!   enough batches in flight to hide their latency within a few windows, and reads bound by
//!   decoding, which more batches in flight do not speed up, keep their depth. The batches
//!   themselves do not depend on it.
//! * **Errors:** a batch that fails reaches the consumer, in its place in the step order, as a
//!   [`SamplerError::Read`] naming the step and the source; the next call returns the next step.
//! * **Shutdown:** dropping the [`Loader`] cancels the reads in flight (zarr-front's
//!   cancellation flag), stops and joins the workers. Batches still held stay valid.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zcrop_io::fork::ProcessBound;
use zcrop_io::sync::{Condvar, Mutex};
use zcrop_zarr::ReadStats;

use crate::error::{Result, SamplerError, spec_err};
use crate::pinned::{Element, PinOptions, PinState, PinnedBuffer, as_elements, page_size};
use crate::sampler::{BatchPlan, SampleMeta, Sampler, Shard};

/// How a [`Loader`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    /// The first step delivered (resume at step `k` by starting at `k`).
    pub start_step: u64,
    /// Stop before this step (`None`: never stop).
    pub end_step: Option<u64>,
    /// Which rank of how many this process is.
    pub shard: Shard,
    /// Batches read ahead of the consumer (in flight or ready), at least 1; with
    /// `prefetch_max`, where the adaptive depth starts.
    pub prefetch: usize,
    /// Let the depth read ahead adapt from `prefetch` up to this many batches (see the module
    /// documentation); `None` holds it at `prefetch`.
    pub prefetch_max: Option<usize>,
    /// Buffers in the ring; `0` means `prefetch + 1` (one batch held by the consumer while
    /// `prefetch` are read ahead). The consumer may hold up to `buffers - prefetch` batches
    /// without slowing the workers.
    pub buffers: usize,
    /// Threads producing batches concurrently (each batch is also decoded in parallel). The
    /// default, 2, keeps a second batch in flight: a batch starts with serial work (planning,
    /// locating its chunks, submitting its reads: about 1.2 ms of an 18 ms blosc-lz4 batch of
    /// 32 crops on 2 cores) during which one batch alone leaves the decode threads idle.
    pub workers: usize,
    /// Decode threads in a pool of the loader's own; `None` uses zcrop's decode pool.
    pub threads: Option<usize>,
    /// Page-locking and CUDA registration of the buffers.
    pub pin: PinOptions,
}

impl LoaderConfig {
    /// Buffers beyond the batches read ahead: those the consumer may hold.
    fn spare(&self) -> usize {
        self.buffers.saturating_sub(self.prefetch)
    }
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            start_step: 0,
            end_step: None,
            shard: Shard::SINGLE,
            prefetch: 2,
            prefetch_max: None,
            buffers: 0,
            workers: 2,
            threads: None,
            pin: PinOptions::default(),
        }
    }
}

/// A snapshot of a loader's pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoaderStatus {
    /// Batches read and waiting for the consumer.
    pub ready: usize,
    /// Batches being read.
    pub in_flight: usize,
    /// Ring buffers free for the workers.
    pub free_buffers: usize,
    /// Ring buffers in all (the rest are held by ready batches or by the consumer).
    pub buffers: usize,
}

/// Where each source lies in a batch buffer: page-aligned regions.
#[derive(Debug)]
struct Layout {
    offsets: Vec<usize>,
    lens: Vec<usize>,
    total: usize,
}

impl Layout {
    fn new(sampler: &Sampler) -> Result<Layout> {
        let page = page_size();
        let mut offsets = Vec::new();
        let mut lens = Vec::new();
        let mut at = 0usize;
        for s in sampler.sources() {
            offsets.push(at);
            lens.push(s.batch_bytes);
            at = at
                .checked_add(s.batch_bytes)
                .and_then(|x| x.checked_next_multiple_of(page))
                .ok_or_else(|| spec_err("a batch is too large to address"))?;
        }
        Ok(Layout {
            offsets,
            lens,
            total: at,
        })
    }
}

struct Produced {
    plan: BatchPlan,
    buf: PinnedBuffer,
    stats: ReadStats,
    read_time: Duration,
}

struct State {
    generation: u64,
    next_claim: u64,
    next_deliver: u64,
    in_flight: usize,
    ready: BTreeMap<u64, std::result::Result<Produced, SamplerError>>,
    free: Vec<PinnedBuffer>,
    /// Batches claimed ahead of the consumer at most (`prefetch`, or the adaptive depth).
    depth: usize,
    /// Buffers in the ring (the adaptive depth adds some).
    buffers: usize,
    /// Buffers the ring keeps: after the adaptive depth goes back, free buffers above this
    /// are released.
    keep: usize,
    stop: bool,
    cancel: Arc<AtomicBool>,
}

struct Shared {
    state: Mutex<State>,
    /// Workers wait here for a claimable step and a free buffer.
    work: Condvar,
    /// The consumer waits here for its next step.
    ready: Condvar,
    sampler: Sampler,
    layout: Layout,
    config: LoaderConfig,
    pool: Option<rayon::ThreadPool>,
    pin_state: PinState,
    /// The depth read ahead, as last set (readable without the state's lock).
    gauge: DepthGauge,
}

/// The depth a [`Loader`] reads ahead, readable from any thread while the loader is in use
/// (for example while another thread waits in [`Loader::next_batch`]).
#[derive(Debug, Clone, Default)]
pub struct DepthGauge(Arc<std::sync::atomic::AtomicUsize>);

impl DepthGauge {
    /// Batches read ahead now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, depth: usize) {
        self.0.store(depth, Ordering::Relaxed);
    }
}

impl State {
    /// Takes the free buffers above `keep` out of the ring (to be dropped without the lock).
    fn shed(&mut self) -> Vec<PinnedBuffer> {
        let n = self.buffers.saturating_sub(self.keep).min(self.free.len());
        if n == 0 {
            return Vec::new();
        }
        self.buffers -= n;
        let at = self.free.len() - n;
        self.free.split_off(at)
    }
}

impl Shared {
    fn give_back(&self, buf: PinnedBuffer) {
        let mut st = self.state.lock();
        if st.stop {
            return;
        }
        st.free.push(buf);
        let shed = st.shed();
        drop(st);
        drop(shed);
        self.work.notify_all();
        self.ready.notify_all();
    }

    fn produce(
        &self,
        step: u64,
        buf: &mut PinnedBuffer,
        cancel: &AtomicBool,
    ) -> Result<(BatchPlan, ReadStats)> {
        let plan = self.sampler.plan(step, self.config.shard)?;
        let bytes = buf.as_mut_slice();
        let mut stats = ReadStats::default();
        for s in 0..self.layout.offsets.len() {
            let (off, len) = (self.layout.offsets[s], self.layout.lens[s]);
            let region = &mut bytes[off..off + len];
            stats += match &self.pool {
                Some(pool) => {
                    pool.install(|| self.sampler.read_into(&plan, s, region, Some(cancel)))?
                }
                None => self.sampler.read_into(&plan, s, region, Some(cancel))?,
            };
        }
        Ok((plan, stats))
    }

    fn worker(self: &Arc<Self>) {
        loop {
            let (step, generation, mut buf, cancel) = {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    let ahead = st.next_claim - st.next_deliver;
                    let before_end = self.config.end_step.is_none_or(|e| st.next_claim < e);
                    if before_end && ahead < st.depth as u64 && !st.free.is_empty() {
                        break;
                    }
                    self.work.wait(&mut st);
                }
                let buf = st.free.pop().expect("checked non-empty");
                let step = st.next_claim;
                st.next_claim += 1;
                st.in_flight += 1;
                (step, st.generation, buf, Arc::clone(&st.cancel))
            };
            let t0 = Instant::now();
            let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.produce(step, &mut buf, &cancel)
            }))
            .unwrap_or_else(|panic| {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(ToString::to_string)
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".into());
                Err(SamplerError::WorkerPanic { step, message })
            });
            let read_time = t0.elapsed();
            let mut st = self.state.lock();
            st.in_flight -= 1;
            if st.stop || st.generation != generation {
                // Cancelled by a seek or shutdown: the result is stale.
                if !st.stop {
                    st.free.push(buf);
                }
            } else {
                let entry = match result {
                    Ok((plan, stats)) => Ok(Produced {
                        plan,
                        buf,
                        stats,
                        read_time,
                    }),
                    Err(e) => {
                        st.free.push(buf);
                        Err(e)
                    }
                };
                st.ready.insert(step, entry);
            }
            drop(st);
            self.ready.notify_all();
            self.work.notify_all();
        }
    }
}

/// Batches per measurement of the adaptive depth, at least: a window spans twice the depth, as
/// batches read that far ahead arrive in bursts.
pub const ADAPT_WINDOW: u32 = 8;

/// The ring buffers an adaptive depth may grow to, in bytes (at least `prefetch` batches).
pub const AUTO_PREFETCH_BYTES: usize = 1 << 30;

/// The adaptive depth's controller (see the module documentation): fed the consumer's wait
/// and own time per batch and the batch's read time, it answers a new depth at the end of a
/// window that calls for one.
#[derive(Debug)]
struct Adapt {
    depth: usize,
    max: usize,
    seen: u32,
    /// Windows measured so far.
    windows: u64,
    waited: Duration,
    worked: Duration,
    /// Read time of the window's batches, and how many were timed (failed reads are not).
    read: Duration,
    timed: u32,
    /// The next window is not measured: the ring is filling up, or the depth just changed and
    /// the batches claimed for it are still on their way.
    settle: bool,
    /// The depth and rate before the last increase, until the next window judges it.
    trial: Option<(usize, f64)>,
    /// Windows to wait before trying again after an increase that did not pay.
    hold: u32,
    /// The next such wait: it doubles after each try that does not pay (up to 64 windows), so
    /// reads bound by decoding soon stop paying for tries, and an increase that pays resets it.
    backoff: u32,
}

impl Adapt {
    fn new(depth: usize, max: usize) -> Adapt {
        Adapt {
            depth,
            max,
            seen: 0,
            windows: 0,
            waited: Duration::ZERO,
            worked: Duration::ZERO,
            read: Duration::ZERO,
            timed: 0,
            settle: true,
            trial: None,
            hold: 0,
            backoff: 8,
        }
    }

    /// The depth a starved consumer tries next. By Little's law, batches that take `read` each
    /// keep a consumer needing `worked` per batch fed with `read / worked` of them in flight,
    /// plus the one it holds; one try goes at most 4x deeper, so a guess inflated by slow
    /// reads costs one window of extra buffers. Without that estimate (or where it is already
    /// reached while the consumer still waits), half again as deep.
    fn next_depth(&self) -> usize {
        let step = self.depth + (self.depth / 2).max(1);
        let little = (self.timed > 0).then(|| {
            let read = self.read.as_secs_f64() / f64::from(self.timed);
            let worked = self.worked.as_secs_f64() / f64::from(self.seen);
            let need = (read / worked.max(1e-6)).ceil() + 1.0;
            need.min(1e6) as usize
        });
        let next = match little {
            Some(need) if need > self.depth => need.min(self.depth * 4),
            _ => step,
        };
        next.min(self.max)
    }

    fn observe(
        &mut self,
        waited: Duration,
        worked: Duration,
        read: Option<Duration>,
    ) -> Option<usize> {
        self.seen += 1;
        self.waited += waited;
        self.worked += worked;
        if let Some(read) = read {
            self.read += read;
            self.timed += 1;
        }
        let window = ADAPT_WINDOW.max(u32::try_from(2 * self.depth).unwrap_or(u32::MAX));
        if self.seen < window {
            return None;
        }
        self.windows += 1;
        let total = (self.waited + self.worked).as_secs_f64().max(1e-9);
        let rate = f64::from(self.seen) / total;
        let starved = self.waited.as_secs_f64() > 0.05 * total;
        let next = self.next_depth();
        (self.seen, self.waited, self.worked) = (0, Duration::ZERO, Duration::ZERO);
        (self.read, self.timed) = (Duration::ZERO, 0);
        if std::mem::replace(&mut self.settle, false) {
            return None;
        }
        if let Some((before, before_rate)) = self.trial.take() {
            if rate < before_rate * 1.05 {
                self.depth = before;
                self.hold = self.backoff;
                self.backoff = (self.backoff * 2).min(64);
                self.settle = true;
                return Some(before);
            }
            self.backoff = 8;
        }
        if self.hold > 0 {
            self.hold -= 1;
            return None;
        }
        if starved && self.depth < self.max {
            self.trial = Some((self.depth, rate));
            self.depth = next;
            self.settle = true;
            return Some(next);
        }
        None
    }
}

/// A background pipeline of batches. See the module documentation.
///
/// Batches arrive in step order from `config.start_step`. Each holds one ring buffer until it
/// is dropped, so keep a batch alive until its data has been copied (for an asynchronous
/// host-to-device copy: until the copy has completed), then drop it.
pub struct Loader {
    /// Bound to the process that started the workers: in a child of `fork` a parent's loader
    /// (its threads gone, its locks perhaps held for ever) is leaked, not dropped.
    shared: ProcessBound<Arc<Shared>>,
    workers: Vec<JoinHandle<()>>,
    /// The adaptive depth's controller (`prefetch_max` given).
    adapt: Option<Adapt>,
    /// When the last batch was returned: the consumer's own time runs from there.
    returned: Option<Instant>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("config", &self.shared.config)
            .field("buffer_bytes", &self.shared.layout.total)
            .field("pin_state", &self.shared.pin_state)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// Allocates the ring and starts the workers, which begin reading at
    /// `config.start_step` at once.
    pub fn new(sampler: Sampler, mut config: LoaderConfig) -> Result<Loader> {
        if config.prefetch == 0 {
            return Err(spec_err("prefetch must be at least 1"));
        }
        if config.workers == 0 {
            return Err(spec_err("a loader needs at least one worker"));
        }
        if config.buffers == 0 {
            config.buffers = config.prefetch + 1;
        }
        let layout = Layout::new(&sampler)?;
        if let Some(max) = config.prefetch_max {
            if max < config.prefetch {
                return Err(spec_err(format!(
                    "prefetch_max ({max}) is below prefetch ({})",
                    config.prefetch
                )));
            }
            // The buffers a deeper pipeline would add stay within the budget.
            let fit = (AUTO_PREFETCH_BYTES / layout.total.max(1)).saturating_sub(config.spare());
            config.prefetch_max = Some(max.min(fit).max(config.prefetch));
        }
        if config.shard.world_size == 0 || config.shard.rank >= config.shard.world_size {
            return Err(spec_err(format!(
                "rank {} of world size {} is not a valid shard",
                config.shard.rank, config.shard.world_size
            )));
        }
        let mut free = Vec::with_capacity(config.buffers);
        for _ in 0..config.buffers {
            free.push(PinnedBuffer::new(layout.total, &config.pin).map_err(|e| {
                SamplerError::Alloc {
                    bytes: layout.total,
                    reason: e.to_string(),
                }
            })?);
        }
        let pin_state = PinState::combine(free.iter().map(PinnedBuffer::state));
        let pool = match config.threads {
            None => None,
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("zcrop-decode-{i}"))
                    .build()
                    .map_err(|e| spec_err(format!("cannot start {n} decode threads: {e}")))?,
            ),
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                generation: 0,
                next_claim: config.start_step,
                next_deliver: config.start_step,
                in_flight: 0,
                ready: BTreeMap::new(),
                free,
                depth: config.prefetch,
                buffers: config.buffers,
                keep: config.buffers,
                stop: false,
                cancel: Arc::new(AtomicBool::new(false)),
            }),
            work: Condvar::new(),
            ready: Condvar::new(),
            sampler,
            layout,
            pool,
            pin_state,
            gauge: DepthGauge::default(),
            config,
        });
        shared.gauge.set(shared.config.prefetch);
        let workers = (0..shared.config.workers)
            .map(|i| Self::spawn_worker(&shared, i))
            .collect::<Result<Vec<_>>>()?;
        let adapt = shared
            .config
            .prefetch_max
            .map(|max| Adapt::new(shared.config.prefetch, max));
        Ok(Loader {
            shared: ProcessBound::new(shared),
            workers,
            adapt,
            returned: None,
        })
    }

    /// Starts a worker thread.
    fn spawn_worker(shared: &Arc<Shared>, i: usize) -> Result<JoinHandle<()>> {
        let s = Arc::clone(shared);
        std::thread::Builder::new()
            .name(format!("zcrop-loader-{i}"))
            .spawn(move || s.worker())
            .map_err(|e| spec_err(format!("cannot start a loader thread: {e}")))
    }

    /// Sets the depth read ahead to `depth`. Buffers and workers are added for a deeper one
    /// (a buffer that cannot be allocated leaves the depth where the buffers allow); for a
    /// shallower one the ring releases its extra buffers as they come back free, and the
    /// extra workers stay. Returns the depth set.
    fn set_depth(&mut self, depth: usize) -> usize {
        let shared = Arc::clone(&self.shared);
        let spare = shared.config.spare();
        let want = depth + spare;
        let have = shared.state.lock().buffers;
        let mut added = Vec::new();
        for _ in have..want {
            match PinnedBuffer::new(shared.layout.total, &shared.config.pin) {
                Ok(b) => added.push(b),
                Err(_) => break,
            }
        }
        let mut st = shared.state.lock();
        st.buffers += added.len();
        st.free.extend(added);
        st.depth = depth.min(st.buffers.saturating_sub(spare)).max(1);
        st.keep = want.max(shared.config.buffers);
        let depth = st.depth;
        let shed = st.shed();
        shared.gauge.set(depth);
        drop(st);
        drop(shed);
        while self.workers.len() < depth.max(shared.config.workers) {
            match Self::spawn_worker(&shared, self.workers.len()) {
                Ok(w) => self.workers.push(w),
                Err(_) => break,
            }
        }
        shared.work.notify_all();
        depth
    }

    /// The depth read ahead now: `prefetch`, or where the adaptive depth stands.
    pub fn depth(&self) -> usize {
        self.shared.gauge.get()
    }

    /// A handle on [`Loader::depth`] for other threads.
    pub fn depth_gauge(&self) -> DepthGauge {
        self.shared.gauge.clone()
    }

    /// The next batch, in step order; waits for it if needed. A failed batch is returned as
    /// its error and the loader moves on to the next step.
    pub fn next_batch(&mut self) -> Result<Batch> {
        let called = Instant::now();
        let got = self.wait_batch();
        let now = Instant::now();
        let read = got.as_ref().ok().map(Batch::read_time);
        if let (Some(adapt), Some(returned)) = (&mut self.adapt, self.returned)
            && let Some(depth) = adapt.observe(now - called, called - returned, read)
        {
            let set = self.set_depth(depth);
            if let Some(adapt) = &mut self.adapt {
                adapt.depth = set;
            }
        }
        self.returned = Some(Instant::now());
        got
    }

    fn wait_batch(&mut self) -> Result<Batch> {
        let shared = &self.shared;
        let mut st = shared.state.lock();
        loop {
            let step = st.next_deliver;
            if let Some(end) = shared.config.end_step
                && step >= end
            {
                return Err(SamplerError::Exhausted { end });
            }
            if let Some(entry) = st.ready.remove(&step) {
                st.next_deliver += 1;
                drop(st);
                shared.work.notify_all();
                let p = entry?;
                return Ok(Batch {
                    plan: p.plan,
                    buf: Some(p.buf),
                    stats: p.stats,
                    read_time: p.read_time,
                    home: ProcessBound::new(Arc::clone(shared)),
                });
            }
            if st.next_claim == step && st.in_flight == 0 && st.free.is_empty() {
                return Err(SamplerError::AllBuffersHeld {
                    buffers: st.buffers,
                });
            }
            shared.ready.wait(&mut st);
        }
    }

    /// Restarts the stream at `step`: cancels reads in flight, drops prefetched batches, and
    /// starts reading `step` at once. The next batch is `step`.
    pub fn seek(&mut self, step: u64) {
        let mut st = self.shared.state.lock();
        st.cancel.store(true, Ordering::Release);
        st.cancel = Arc::new(AtomicBool::new(false));
        st.generation += 1;
        st.next_claim = step;
        st.next_deliver = step;
        let ready = std::mem::take(&mut st.ready);
        for (_, entry) in ready {
            if let Ok(p) = entry {
                st.free.push(p.buf);
            }
        }
        drop(st);
        self.shared.work.notify_all();
    }

    /// What the pipeline holds right now.
    pub fn status(&self) -> LoaderStatus {
        let st = self.shared.state.lock();
        LoaderStatus {
            ready: st.ready.len(),
            in_flight: st.in_flight,
            free_buffers: st.free.len(),
            buffers: st.buffers,
        }
    }

    /// The step the next [`Loader::next_batch`] returns.
    pub fn next_step(&self) -> u64 {
        self.shared.state.lock().next_deliver
    }

    /// Whether the ring's buffers are page-locked and CUDA-registered, and why not.
    pub fn pin_state(&self) -> &PinState {
        &self.shared.pin_state
    }

    /// The configuration (with `buffers` resolved).
    pub fn config(&self) -> &LoaderConfig {
        &self.shared.config
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.shared.sampler
    }

    /// Bytes of one ring buffer (all sources of one batch, each page-aligned).
    pub fn buffer_bytes(&self) -> usize {
        self.shared.layout.total
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    /// The next batch; `None` once `end_step` is reached.
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_batch() {
            Err(SamplerError::Exhausted { .. }) => None,
            other => Some(other),
        }
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        if !self.shared.is_current() {
            std::mem::forget(std::mem::take(&mut self.workers));
            return;
        }
        {
            let mut st = self.shared.state.lock();
            st.stop = true;
            st.cancel.store(true, Ordering::Release);
            st.ready.clear();
            st.free.clear();
        }
        self.shared.work.notify_all();
        self.shared.ready.notify_all();
        for w in self.workers.drain(..) {
            // A worker that panicked outside a read has nothing left to clean up.
            let _ = w.join();
        }
    }
}

/// One delivered batch: its buffer (one page-aligned region per source) and its metadata.
/// Dropping it returns the buffer to the ring.
pub struct Batch {
    plan: BatchPlan,
    buf: Option<PinnedBuffer>,
    stats: ReadStats,
    read_time: Duration,
    /// Bound as the loader is (see [`Loader`]).
    home: ProcessBound<Arc<Shared>>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("step", &self.plan.step())
            .field("len", &self.plan.len())
            .finish_non_exhaustive()
    }
}

impl Batch {
    fn bytes(&self) -> &[u8] {
        // The buffer is only taken out by `drop`.
        self.buf.as_ref().map_or(&[], PinnedBuffer::as_slice)
    }

    /// The step.
    pub fn step(&self) -> u64 {
        self.plan.step()
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.plan.len()
    }

    /// Whether the batch has no samples (never).
    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// The plan: positions, origins and epochs, flat.
    pub fn plan(&self) -> &BatchPlan {
        &self.plan
    }

    /// Metadata of sample `i`.
    pub fn sample(&self, i: usize) -> SampleMeta {
        self.plan.sample(i)
    }

    /// Metadata of every sample.
    pub fn samples(&self) -> Vec<SampleMeta> {
        self.plan.samples()
    }

    /// Number of sources.
    pub fn num_sources(&self) -> usize {
        self.home.layout.offsets.len()
    }

    /// The bytes of source `s`: `(batch_size, *crop)` elements of [`Batch::dtype`], C order.
    pub fn source(&self, s: usize) -> &[u8] {
        let (off, len) = (self.home.layout.offsets[s], self.home.layout.lens[s]);
        &self.bytes()[off..off + len]
    }

    /// Where source `s`'s bytes start in the batch's buffer.
    pub fn source_offset(&self, s: usize) -> usize {
        self.home.layout.offsets[s]
    }

    /// The memory file of the batch's buffer when the loader maps its ring shared
    /// ([`PinOptions::shared`]): the file, its size and where the buffer starts in it.
    pub fn shared_memory(&self) -> Option<(std::os::fd::BorrowedFd<'_>, usize, usize)> {
        self.buf.as_ref().and_then(PinnedBuffer::shared_memory)
    }

    /// The bytes of the source named `name`.
    pub fn source_by_name(&self, name: &str) -> Option<&[u8]> {
        let s = (0..self.num_sources()).find(|&s| &*self.home.sampler.source(s).name == name)?;
        Some(self.source(s))
    }

    /// Source `s` as elements of `T` (`None` if `T`'s size does not divide the data or the data
    /// is not aligned for it; each source starts on a page boundary).
    pub fn typed<T: Element>(&self, s: usize) -> Option<&[T]> {
        as_elements(self.source(s))
    }

    /// The v3 name of source `s`'s element type.
    pub fn dtype(&self, s: usize) -> &str {
        &self.home.sampler.source(s).dtype
    }

    /// The shape of source `s`: `(batch_size, *crop)`.
    pub fn shape(&self, s: usize) -> Vec<u64> {
        let mut shape = vec![self.len() as u64];
        shape.extend_from_slice(&self.home.sampler.source(s).crop);
        shape
    }

    /// Address of source `s`'s data (page-aligned, in pinned memory when
    /// [`Batch::pin_state`] says so), valid while the batch lives.
    pub fn as_ptr(&self, s: usize) -> *const u8 {
        self.source(s).as_ptr()
    }

    /// Whether the buffer is page-locked and CUDA-registered.
    pub fn pin_state(&self) -> &PinState {
        self.buf
            .as_ref()
            .map_or(&self.home.pin_state, PinnedBuffer::state)
    }

    /// What the reads of this batch did (summed over sources).
    pub fn stats(&self) -> ReadStats {
        self.stats
    }

    /// How long a worker took to plan and read this batch.
    pub fn read_time(&self) -> Duration {
        self.read_time
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            if self.home.is_current() {
                self.home.give_back(buf);
            } else {
                // A parent's batch in a child of `fork`: its ring is the parent's.
                drop(buf);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    /// Feeds `windows` windows of batches with the consumer waiting `wait(depth)` and working
    /// `work` per batch, and batches read in `read` each; returns the depths the controller
    /// asked for, in order.
    fn run(
        a: &mut Adapt,
        windows: u32,
        work: u64,
        read: u64,
        wait: impl Fn(usize) -> u64,
    ) -> Vec<usize> {
        let mut asked = Vec::new();
        let end = a.windows + u64::from(windows);
        while a.windows < end {
            if let Some(d) = a.observe(ms(wait(a.depth)), ms(work), Some(ms(read))) {
                asked.push(d);
            }
        }
        asked
    }

    #[test]
    fn a_starved_consumer_gets_the_depth_littles_law_asks_for() {
        // Reads of 100 ms, a consumer needing 10 ms: 10 batches in flight plus the one held
        // keep it fed; the first try goes 4x deeper, the second to 11.
        let mut a = Adapt::new(2, 16);
        let wait = |d: usize| (100 / d as u64).saturating_sub(10);
        let asked = run(&mut a, 8, 10, 100, wait);
        assert_eq!(asked, [8, 11]);
        assert!(
            run(&mut a, 8, 10, 100, wait).is_empty(),
            "fed: no more changes"
        );
    }

    #[test]
    fn without_an_estimate_or_past_it_the_depth_grows_by_half() {
        // Failed reads are not timed: half again as deep each try.
        let mut a = Adapt::new(2, 16);
        let mut asked = Vec::new();
        while a.windows < 8 {
            let wait = (100 / a.depth as u64).saturating_sub(10);
            if let Some(d) = a.observe(ms(wait), ms(10), None) {
                asked.push(d);
            }
        }
        assert_eq!(asked[..3], [3, 4, 6]);
        // Reads that claim 20 ms while the consumer still waits at depth 4: Little's law says
        // 3, the waits say more.
        let mut a = Adapt::new(4, 16);
        assert_eq!(run(&mut a, 2, 10, 20, |d| 60 / d as u64), [6]);
    }

    #[test]
    fn a_window_spans_twice_the_depth() {
        let mut a = Adapt::new(16, 64);
        for _ in 0..31 {
            assert_eq!(a.observe(ms(50), ms(1), Some(ms(200))), None);
        }
        assert_eq!(a.windows, 0);
        a.observe(ms(50), ms(1), Some(ms(200)));
        assert_eq!(a.windows, 1);
        let mut a = Adapt::new(2, 64);
        run(&mut a, 1, 1, 200, |_| 50);
        assert_eq!(a.seen, 0, "8 batches at depth 2");
    }

    #[test]
    fn depth_that_does_not_pay_is_given_back_and_held() {
        // Decoding is the limit: the consumer waits 20 ms whatever the depth.
        let mut a = Adapt::new(2, 16);
        let asked = run(&mut a, 4, 10, 30, |_| 20);
        assert_eq!(asked, [4, 2], "tried Little's depth, went back");
        assert!(
            run(&mut a, 9, 10, 30, |_| 20).is_empty(),
            "held after a failed try"
        );
        assert_eq!(run(&mut a, 3, 10, 30, |_| 20), [4, 2], "then tries again");
        assert!(
            run(&mut a, 17, 10, 30, |_| 20).is_empty(),
            "held twice as long"
        );
        assert_eq!(run(&mut a, 3, 10, 30, |_| 20), [4, 2]);
    }

    #[test]
    fn a_fed_consumer_keeps_its_depth_and_the_cap_holds() {
        let mut a = Adapt::new(2, 16);
        assert!(run(&mut a, 10, 10, 15, |_| 0).is_empty());
        let mut a = Adapt::new(2, 4);
        let asked = run(&mut a, 12, 1, 100, |d| 100 / d as u64);
        assert_eq!(asked, [4]);
    }

    #[test]
    fn a_shallower_depth_releases_the_extra_buffers_as_they_come_back() {
        let f = zcrop_fixtures::get("v3_workload_4d_u2");
        let array = zcrop_zarr::Array::open(f.store_path()).unwrap();
        let spec = crate::SampleSpec::new(["t", "y", "x"])
            .source(crate::Source::new("s", array, [1, 3, 16, 16]))
            .seed(1)
            .batch_size(2);
        // No `prefetch_max`: the controller stays out of the way of the depths set here.
        let config = LoaderConfig {
            pin: PinOptions::pageable(),
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(Sampler::new(spec).unwrap(), config).unwrap();
        assert_eq!(loader.status().buffers, 3);
        assert_eq!(loader.set_depth(8), 8);
        assert_eq!(loader.status().buffers, 9);
        let held: Vec<Batch> = (0..4).map(|_| loader.next_batch().unwrap()).collect();
        assert_eq!(loader.set_depth(2), 2);
        assert!(loader.status().buffers >= 4, "held batches keep theirs");
        drop(held);
        for step in 4..24 {
            assert_eq!(loader.next_batch().unwrap().step(), step);
        }
        assert_eq!(loader.status().buffers, 3);
        assert_eq!(loader.set_depth(5), 5);
        assert_eq!(loader.status().buffers, 6);
    }
}
