//! The life of one physical read, shared by every backend so they behave identically:
//! [`PhysOp`] (planned) -> [`resolve`] (file open, range known) -> [`Active`] (permit held,
//! buffer allocated, being read) -> one [`Completion`] per request served, buffered in the
//! thread's [`Local`] state and delivered to the batch's [`Sink`] in bulk.

use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use crossbeam_channel::Sender;

use crate::budget::{Budget, Permit};
use crate::engine::MapFiles;
use crate::error::IoError;
use crate::fdcache::{FdCache, Mapping, OpenFile};
use crate::metrics::{Counters, Metrics};
use crate::request::{Completion, ReadRange, ReadRequest, RequestId};
use crate::sys::{self, ReadBuf};

/// Everything a backend worker shares with the engine.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) fds: FdCache,
    pub(crate) metrics: Metrics,
    pub(crate) budget: Arc<Budget>,
    pub(crate) direct: bool,
    /// Read buffers come from (and return to) the process's buffer pool.
    pub(crate) recycle: bool,
    /// When reads of batches that allow it are served from a mapping of the file.
    pub(crate) map_files: MapFiles,
    pub(crate) shutdown: AtomicBool,
}

impl Ctx {
    pub(crate) fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

/// Results a delivery has room for before it grows: the workers send theirs in runs of 64.
const DELIVERY_CAPACITY: usize = 64;

/// Where one batch's results go.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) tx: Sender<Delivery>,
    /// The batch's reads may be served from file mappings (`IoEngine::submit_mapped`, with a
    /// policy other than never).
    pub(crate) map: bool,
    /// The batch was dropped: nobody wants its results, so its reads not yet started are
    /// skipped (one of them might block forever, like the open of a FIFO nobody writes, and
    /// must not hold up whoever takes it from the queue, e.g. a consumer of another batch).
    pub(crate) dropped: AtomicBool,
    /// The batch's place in the order of submissions: files it reads are checked against
    /// their paths unless a check since its submission found them there (see [`FdCache`]).
    pub(crate) generation: u64,
}

/// The generation of the next batch submitted (see [`Sink::generation`]).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// A generation for a batch submitted now: greater than that of every batch before it.
pub(crate) fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, Ordering::AcqRel)
}

/// Results sent to a batch in one message. The permits are released when the consumer takes
/// the delivery off the channel.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    pub(crate) completions: Vec<Completion>,
    pub(crate) permits: Vec<Permit>,
}

/// One requested range served by a physical read.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) id: RequestId,
    /// The range as the caller asked for it (for error messages).
    pub(crate) range: ReadRange,
    /// Where its bytes start in the physical read.
    pub(crate) offset_in_read: u64,
    /// Its length; `None` takes the whole physical read (whole-file and suffix requests).
    pub(crate) len: Option<u64>,
}

/// The requests one physical read serves: usually one, so that case needs no allocation.
#[derive(Debug, Clone)]
pub(crate) enum Parts {
    One(Part),
    Many(Vec<Part>),
}

impl Parts {
    pub(crate) fn as_slice(&self) -> &[Part] {
        match self {
            Parts::One(p) => std::slice::from_ref(p),
            Parts::Many(v) => v,
        }
    }

    pub(crate) fn from_vec(mut v: Vec<Part>) -> Parts {
        if v.len() == 1 {
            Parts::One(v.swap_remove(0))
        } else {
            Parts::Many(v)
        }
    }
}

/// A planned physical read.
#[derive(Debug)]
pub(crate) struct PhysOp {
    /// The file it reads and the batch its results go to: an index into its run's targets.
    pub(crate) target: usize,
    pub(crate) range: ReadRange,
    pub(crate) parts: Parts,
}

/// The file a read reads and the batch its results go to. The reads of a [`Run`] share their
/// run's targets (one per file), so a read served within its run touches no reference count of
/// its own (on cached 4 KiB reads, two threads updating the counts of one shared path and batch
/// for every read cost several percent of the reads per second); a read that leaves its run
/// (to the ring, or back to the queue) takes a copy of its target along.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) path: Arc<Path>,
    pub(crate) sink: Arc<Sink>,
}

/// Planned reads of one batch, queued together: one queue operation per run instead of one per
/// read.
#[derive(Debug)]
pub(crate) struct Run {
    /// One per file the run reads, in the order of its reads.
    pub(crate) targets: Vec<Target>,
    /// At most [`RUN_LEN`], never empty.
    pub(crate) ops: Vec<PhysOp>,
}

/// An item of an engine's work queue.
#[derive(Debug)]
pub(crate) enum Work {
    /// A run of planned reads nobody has touched.
    Fresh(Run),
    /// A read whose file is open, not yet charged to the budget.
    Resolved(Resolved, Target),
    /// A read whose data was not in the page cache (found by a non-blocking attempt): it needs
    /// the device, so only a backend worker may take it. It holds its buffer but no budget (a
    /// queued item must not hold budget that the workers wait for); the worker charges it again.
    Missed(Box<Active>, Target),
}

impl Work {
    /// Fails every request of the item because the engine is shutting down (or gone).
    pub(crate) fn fail_shutdown(self, local: &mut Local) {
        match self {
            Work::Fresh(run) => {
                for op in run.ops {
                    let t = &run.targets[op.target];
                    op.fail_shutdown(t, local);
                }
            }
            Work::Resolved(r, t) => r.fail_shutdown(&t, local),
            Work::Missed(a, t) => a.fail_shutdown(&t, local),
        }
    }
}

/// Planned reads per [`Work::Fresh`] run. Whoever takes a run reads all of it, so runs stay
/// short: a run is also the unit by which IO threads and helping consumers share work.
pub(crate) const RUN_LEN: usize = 16;

/// Reads of one file in a row after which a thread reads it through its own open file
/// ([`OpenFile::reopen`]). Opening costs a few microseconds; this many reads make that cost
/// negligible, and a thread that hops between files never pays it.
const OWN_FILE_AFTER: u32 = 1024;

/// Reads whose budget a thread takes ahead at once ([`Local::charge`]): one update of the
/// shared counters per this many reads instead of per read.
const CREDIT_READS: usize = 16;
/// Reads larger than this are charged one by one (credit for many of them would hold a large
/// share of the byte budget idle).
const CREDIT_MAX_READ: u64 = 64 << 10;

/// Whether asking the page cache about a thread's reads keeps paying off: while at least half
/// of the last [`CacheProbe::WINDOW`] answers were "cached", every read asks; otherwise (a
/// cold file) only one read in [`CacheProbe::PROBE_EVERY`] does, and the others go straight to
/// the backend, sparing a system call each. Used for the `RWF_NOWAIT` fast path and for the
/// residency check before serving a read from a mapping.
#[derive(Debug, Default)]
pub(crate) struct CacheProbe {
    cold: bool,
    tries: u32,
    hits: u32,
    skipped: u32,
}

impl CacheProbe {
    /// Answers per verdict.
    const WINDOW: u32 = 64;
    /// While cold, one read in this many asks.
    const PROBE_EVERY: u32 = 32;

    /// Whether this read should ask (and then [`CacheProbe::record`] the answer).
    pub(crate) fn should_ask(&mut self) -> bool {
        if !self.cold {
            return true;
        }
        self.skipped += 1;
        self.skipped.is_multiple_of(Self::PROBE_EVERY)
    }

    /// Records an answer.
    pub(crate) fn record(&mut self, hit: bool) {
        self.tries += 1;
        self.hits += u32::from(hit);
        if self.tries >= Self::WINDOW {
            self.cold = self.hits * 2 < self.tries;
            self.tries = 0;
            self.hits = 0;
        }
    }
}

/// Which parts of one mapped file were found all in memory, and when: one `cachestat(2)`
/// call over an aligned [`ResidentMemo::WINDOW`] of the file answers, for every thread, for
/// the reads that fall inside it during the next [`ResidentMemo::FRESH`]
/// ([`MapFiles::WhenCached`]). The kernel's answer costs about 30 ns per 4 KiB page of the
/// window on top of the system call (Linux 6.18, ext4: 0.4 µs for 16 KiB, 8 µs for 1 MiB),
/// and a crop's chunks lie a few hundred KiB apart in their shard, so neither asking per read
/// nor asking per window and read run pays for itself: with one answer per window serving a
/// thread's next 64 reads at most, these checks took 7% of both cores in a blosc-lz4 crop
/// benchmark (14,600 calls a second). An answer kept for a while can be out of date: a page
/// evicted in between is faulted back in when it is read, slower, never wrong.
#[derive(Debug)]
pub(crate) struct ResidentMemo {
    /// Per window, the time ([`ResidentMemo::now`]) it was last found all in memory; 0: not
    /// since the file was mapped.
    found: Box<[AtomicU64]>,
    /// The mapping's length.
    len: usize,
}

impl ResidentMemo {
    /// Bytes per window, as a shift: 1 MiB.
    const WINDOW_SHIFT: u32 = 20;
    /// Bytes per window.
    pub(crate) const WINDOW: usize = 1 << Self::WINDOW_SHIFT;
    /// How long an answer is kept.
    pub(crate) const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

    /// A memo of nothing found yet, for a mapping of `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        let windows = len.div_ceil(Self::WINDOW);
        ResidentMemo {
            found: (0..windows).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Microseconds since the process's first call (never 0, so 0 can mean "never").
    pub(crate) fn now() -> u64 {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX) + 1
    }

    /// The windows `start..end` (non-empty, inside the mapping) touches.
    fn windows(start: usize, end: usize) -> std::ops::RangeInclusive<usize> {
        (start >> Self::WINDOW_SHIFT)..=((end - 1) >> Self::WINDOW_SHIFT)
    }

    /// Whether every window of `start..end` was found all in memory within
    /// [`ResidentMemo::FRESH`] before `now`.
    pub(crate) fn fresh(&self, start: usize, end: usize, now: u64) -> bool {
        let fresh = Self::FRESH.as_micros() as u64;
        Self::windows(start, end).all(|w| {
            let at = self.found[w].load(Ordering::Relaxed);
            at != 0 && now.saturating_sub(at) < fresh
        })
    }

    /// Asks the kernel whether the windows of `start..end` of `file` (mapped as this memo's
    /// mapping) are all in memory, and records a yes as of `now`. `false` on no, and where the
    /// kernel has no `cachestat` (asking `mincore` about more than the read costs more than
    /// it saves).
    pub(crate) fn ask(&self, file: &std::fs::File, start: usize, end: usize, now: u64) -> bool {
        let windows = Self::windows(start, end);
        let from = windows.start() << Self::WINDOW_SHIFT;
        let to = ((windows.end() + 1) << Self::WINDOW_SHIFT).min(self.len);
        if sys::cachestat_resident(file, from, to) != Some(true) {
            return false;
        }
        for w in windows {
            self.found[w].store(now, Ordering::Relaxed);
        }
        true
    }
}

/// A thread's record of how its window asks went: while a file is partly cold (a window of
/// it was not all in memory), reads ask about their own range alone, and only one in
/// [`WindowRetry::EVERY`] asks about its window first.
#[derive(Debug, Default)]
pub(crate) struct WindowRetry {
    /// Reads since a window that was not all in memory (0: the last one was).
    misses: u32,
}

impl WindowRetry {
    /// See [`WindowRetry`].
    const EVERY: u32 = 16;

    /// Whether this read should ask about its window (then [`WindowRetry::record`] the answer).
    fn should_ask(&mut self) -> bool {
        if self.misses == 0 {
            return true;
        }
        self.misses += 1;
        self.misses.is_multiple_of(Self::EVERY)
    }

    fn record(&mut self, all_in_memory: bool) {
        self.misses = if all_in_memory { 0 } else { self.misses.max(1) };
    }
}

/// A thread's reading of [`ResidentMemo::now`], taken again every [`CoarseClock::READS`]
/// reads and after every flush (before the thread waits): the clock cost 3% of the thread that
/// serves a batch of crop reads when read for every read, and an answer's age need not be
/// known to the microsecond.
#[derive(Debug, Default)]
pub(crate) struct CoarseClock {
    now: u64,
    reads_left: u32,
}

impl CoarseClock {
    /// Reads per reading of the clock.
    const READS: u32 = 16;

    /// The time, at most [`CoarseClock::READS`] reads old.
    fn now(&mut self) -> u64 {
        if self.reads_left == 0 {
            self.now = ResidentMemo::now();
            self.reads_left = Self::READS;
        }
        self.reads_left -= 1;
        self.now
    }

    /// Reads the clock again at the next read.
    fn forget(&mut self) {
        self.reads_left = 0;
    }
}

/// Per-thread state of a worker (or a helping consumer): results not yet delivered, counters
/// not yet published, the last file used, and budget taken ahead.
#[derive(Debug, Default)]
pub(crate) struct Local {
    pending: Vec<(Arc<Sink>, Delivery)>,
    pending_count: usize,
    pub(crate) counters: Counters,
    last_file: Option<(Arc<Path>, Arc<OpenFile>)>,
    /// Uses of `last_file` in a row.
    streak: u32,
    /// Budget taken for this thread's next reads and not yet handed to one; given back at
    /// every flush, so a thread never sits on budget while it waits.
    credit: Option<Permit>,
    /// Whether ranges of mapped files keep being found in memory ([`MapFiles::WhenCached`]).
    map_probe: CacheProbe,
    /// How this thread's recent asks about whole windows of mapped files went.
    map_window: WindowRetry,
    /// The time for [`ResidentMemo`]'s answers.
    map_clock: CoarseClock,
}

impl Local {
    /// Buffers results for `sink`.
    fn deliver(
        &mut self,
        sink: &Arc<Sink>,
        completions: impl Iterator<Item = Completion>,
        permit: Option<Permit>,
    ) {
        let slot = match self.pending.iter().position(|(s, _)| Arc::ptr_eq(s, sink)) {
            Some(i) => i,
            None => {
                let d = Delivery {
                    completions: Vec::with_capacity(DELIVERY_CAPACITY),
                    permits: Vec::new(),
                };
                self.pending.push((Arc::clone(sink), d));
                self.pending.len() - 1
            }
        };
        let d = &mut self.pending[slot].1;
        let before = d.completions.len();
        d.completions.extend(completions);
        self.pending_count += d.completions.len() - before;
        if let Some(p) = permit {
            // One permit per delivery (and budget): one release when the consumer takes it.
            let unmerged = match d.permits.last_mut() {
                Some(last) => last.merge(p).err(),
                None => Some(p),
            };
            d.permits.extend(unmerged);
        }
    }

    /// Serves `request` from a mapping of its file right here, where [`resolve`] would serve
    /// it mapped and no system call is needed to know it (its file maps, its range is inside,
    /// and, by the policy, recently found in memory): its bytes, or `None` to plan and read it
    /// as usual (which also reports any error).
    ///
    /// It never opens a file the engine has not opened, nor maps one it has not mapped: those
    /// are left to the workers.
    pub(crate) fn try_mapped(
        &mut self,
        request: &ReadRequest,
        ctx: &Ctx,
        generation: u64,
    ) -> Option<Bytes> {
        let last = matches!(&self.last_file,
            Some((p, _)) if Arc::ptr_eq(p, &request.path) || **p == *request.path);
        if !last && !ctx.fds.is_open(&request.path, ctx.direct) {
            return None;
        }
        let file = self.file(&request.path, ctx, generation).ok()?;
        if !within(request.range, file.known_len()) {
            return None;
        }
        let map = file.mapped_if_known(&request.path, ctx.map_files)?;
        let (start, end) = mapped_range(
            request.range,
            &file.file,
            map,
            ctx.map_files,
            None,
            &mut self.map_clock,
        )?;
        self.counters.physical_reads += 1;
        self.counters.mapped_reads += 1;
        self.counters.bytes_read += (end - start) as u64;
        Some(map.bytes.slice(start..end))
    }

    /// Results buffered and not yet sent.
    pub(crate) fn pending(&self) -> usize {
        self.pending_count
    }

    /// Publishes the counters and sends every buffered delivery. Counters go first: whoever
    /// receives a delivery then also sees the counts of the reads that made it.
    pub(crate) fn flush(&mut self, ctx: &Ctx) {
        self.release_credit();
        self.map_clock.forget();
        ctx.metrics.publish(&mut self.counters);
        for (sink, d) in self.pending.drain(..) {
            // A dropped batch no longer listens; its permits are released right here.
            let _ = sink.tx.send(d);
        }
        self.pending_count = 0;
    }

    /// Takes the buffered deliveries for `sink` (a consumer helping itself skips the channel).
    pub(crate) fn take_for(&mut self, sink: &Arc<Sink>) -> Option<Delivery> {
        let i = self
            .pending
            .iter()
            .position(|(s, _)| Arc::ptr_eq(s, sink))?;
        let (_, d) = self.pending.swap_remove(i);
        self.pending_count -= d.completions.len();
        Some(d)
    }

    /// Budget for one read of `bytes`: from this thread's credit, which is refilled for
    /// [`CREDIT_READS`] reads of this size when it runs short (small reads only); `None` when
    /// the budget cannot spare even this one read now.
    pub(crate) fn charge(&mut self, budget: &Arc<Budget>, bytes: u64) -> Option<Permit> {
        if let Some(p) = self.credit.as_mut().and_then(|c| c.split(bytes)) {
            return Some(p);
        }
        // What is left goes back before more is taken.
        self.credit = None;
        if bytes <= CREDIT_MAX_READ
            && let Some(mut credit) =
                budget.try_acquire_many(CREDIT_READS, bytes * CREDIT_READS as u64)
        {
            let p = credit.split(bytes);
            self.credit = Some(credit);
            return p;
        }
        budget.try_acquire(bytes)
    }

    /// Gives back the budget taken ahead and not used.
    pub(crate) fn release_credit(&mut self) {
        self.credit = None;
    }

    /// The open file for `path` as a read of a batch of `generation` may use it, from the
    /// last one used or the engine's cache. After [`OWN_FILE_AFTER`] uses in a row, this
    /// thread reads the file through its own copy.
    fn file(
        &mut self,
        path: &Arc<Path>,
        ctx: &Ctx,
        generation: u64,
    ) -> std::io::Result<Arc<OpenFile>> {
        if let Some((p, f)) = &mut self.last_file
            && (Arc::ptr_eq(p, path) || **p == **path)
            && f.checked_for(generation)
        {
            self.streak = self.streak.saturating_add(1);
            if self.streak == OWN_FILE_AFTER
                && let Some(own) = f.reopen()
            {
                *f = Arc::new(own);
                self.counters.own_files += 1;
            }
            return Ok(Arc::clone(f));
        }
        self.last_file = None;
        let opened = ctx.fds.get(path, ctx.direct, generation)?;
        if opened.direct_fell_back {
            self.counters.direct_fallbacks += 1;
        }
        self.last_file = Some((Arc::clone(path), Arc::clone(&opened.file)));
        self.streak = 1;
        Ok(opened.file)
    }
}

impl PhysOp {
    /// Fails every request this read serves with `err`.
    pub(crate) fn fail(self, err: &IoError, t: &Target, local: &mut Local) {
        local.counters.errors += self.parts.as_slice().len() as u64;
        let completions = self.parts.as_slice().iter().map(|p| Completion {
            id: p.id,
            result: Err(err.with_range(p.range)),
        });
        local.deliver(&t.sink, completions, None);
    }

    /// Fails every request because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        let err = IoError::Shutdown {
            path: Arc::clone(&t.path),
            range: self.range,
        };
        self.fail(&err, t, local);
    }

    /// Serves the requests wholly inside the first `got` bytes of `data` (the physical read,
    /// cut short by the end of the file) and fails the others with
    /// [`IoError::RangePastEof`]; whole-file and suffix requests count as inside only when
    /// `open_ended_fit`.
    #[allow(clippy::too_many_arguments)]
    fn serve_within(
        self,
        data: Bytes,
        got: u64,
        open_ended_fit: bool,
        file_len: u64,
        permit: Option<Permit>,
        t: &Target,
        local: &mut Local,
    ) {
        let fits = |p: &Part| {
            p.len
                .map_or(open_ended_fit, |len| p.offset_in_read + len <= got)
        };
        if self.parts.as_slice().iter().all(fits) {
            self.serve(data, permit, t, local);
            return;
        }
        let mut errors = 0;
        let completions: Vec<Completion> = self
            .parts
            .as_slice()
            .iter()
            .map(|p| {
                let result = if fits(p) {
                    Ok(slice_part(&data, p))
                } else {
                    errors += 1;
                    Err(IoError::RangePastEof {
                        path: Arc::clone(&t.path),
                        range: p.range,
                        file_len,
                    })
                };
                Completion { id: p.id, result }
            })
            .collect();
        local.counters.errors += errors;
        local.deliver(&t.sink, completions.into_iter(), permit);
    }

    /// Serves every request from `data` (the bytes of the whole physical range).
    fn serve(self, data: Bytes, permit: Option<Permit>, t: &Target, local: &mut Local) {
        match self.parts {
            // The usual case: `data` itself is the result, no reference count to update.
            Parts::One(p)
                if p.offset_in_read == 0 && p.len.is_none_or(|l| l == data.len() as u64) =>
            {
                let completion = Completion {
                    id: p.id,
                    result: Ok(data),
                };
                local.deliver(&t.sink, std::iter::once(completion), permit);
            }
            parts => {
                let completions = parts.as_slice().iter().map(|p| Completion {
                    id: p.id,
                    result: Ok(slice_part(&data, p)),
                });
                local.deliver(&t.sink, completions, permit);
            }
        }
    }
}

fn slice_part(data: &Bytes, p: &Part) -> Bytes {
    let start = p.offset_in_read as usize;
    match p.len {
        Some(len) if start == 0 && len as usize == data.len() => data.clone(),
        Some(len) => data.slice(start..start + len as usize),
        None => data.clone(),
    }
}

/// A physical read whose file is open and whose byte range is known.
#[derive(Debug)]
pub(crate) struct Resolved {
    op: PhysOp,
    file: Arc<OpenFile>,
    /// Absolute offset of the requested bytes.
    offset: u64,
    /// Number of requested bytes.
    len: u64,
    /// Absolute offset where reading starts (`offset` rounded down under `O_DIRECT`).
    read_start: u64,
    /// Bytes to read from `read_start` (rounded up under `O_DIRECT`).
    read_len: u64,
    /// The buffer comes from the process's buffer pool.
    recycle: bool,
    /// The planned range ends past the end of the file and `len` was cut to what there is.
    past_eof: bool,
}

impl Resolved {
    /// Bytes the budget is charged for.
    pub(crate) fn charge(&self) -> u64 {
        self.read_len
    }

    /// Fails the read because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        self.op.fail_shutdown(t, local);
    }

    /// Allocates the buffer under `permit`; `None` when the memory cannot be had (the read
    /// then fails with [`IoError::OutOfMemory`], delivered here).
    pub(crate) fn activate(self, permit: Permit, t: &Target, local: &mut Local) -> Option<Active> {
        let align = self.file.direct_align.map(|(mem, _)| mem);
        let Some(buf) = usize::try_from(self.read_len)
            .ok()
            .and_then(|len| ReadBuf::try_new(len, align, self.recycle))
        else {
            let err = IoError::OutOfMemory {
                path: Arc::clone(&t.path),
                range: self.op.range,
                bytes: self.read_len,
            };
            self.op.fail(&err, t, local);
            return None;
        };
        Some(Active {
            res: self,
            buf,
            permit: Some(permit),
        })
    }
}

/// What [`resolve`] made of a planned read.
pub(crate) enum Resolution {
    /// Ready to be charged to the budget and read.
    Read(Resolved),
    /// Finished without IO (an error, or an empty range) and already delivered.
    Finished,
}

/// The part of `map` (a mapped file) that serves a read of `range`, if the engine's policy
/// says to serve it from the mapping: bounded ranges inside an intact mapping, and for
/// [`MapFiles::WhenCached`] only ranges whose pages are all in memory (the file's size was
/// checked when it was mapped) or lie in windows recently found so ([`ResidentMemo`]), asked
/// only as often as `probe` and `retry` say; without them (`ask` is `None`), only the latter.
fn mapped_range(
    range: ReadRange,
    file: &std::fs::File,
    map: &Mapping,
    policy: MapFiles,
    ask: Option<(&mut CacheProbe, &mut WindowRetry)>,
    clock: &mut CoarseClock,
) -> Option<(usize, usize)> {
    let whole = &map.bytes;
    let ReadRange::Bounded { offset, len } = range else {
        return None;
    };
    let end = offset.checked_add(len)?;
    if len == 0 || end > whole.len() as u64 || !crate::mapguard::intact(whole.as_ptr()) {
        return None;
    }
    let (start, end) = (offset as usize, end as usize);
    match policy {
        MapFiles::Never => None,
        MapFiles::Always => Some((start, end)),
        MapFiles::WhenCached => {
            let now = clock.now();
            if map.resident.fresh(start, end, now) {
                return Some((start, end));
            }
            let (probe, retry) = ask?;
            if !probe.should_ask() {
                return None;
            }
            if retry.should_ask() {
                let all = map.resident.ask(file, start, end, now);
                retry.record(all);
                if all {
                    probe.record(true);
                    return Some((start, end));
                }
            }
            let cached = sys::resident(file, whole, start, end);
            probe.record(cached);
            cached.then_some((start, end))
        }
    }
}

/// Whether `range` is a bounded range ending within `len` bytes: a mapping (made at the
/// file's length then) serves no more than the file's length as last checked, so that a file
/// found shrunk is read, not faulted on.
fn within(range: ReadRange, len: u64) -> bool {
    matches!(range, ReadRange::Bounded { offset, len: n }
        if offset.checked_add(n).is_some_and(|end| end <= len))
}

/// Serves `op` from `data`, its bytes in a mapped file, without a copy (one "physical read",
/// as reading the range would have been).
fn serve_mapped(op: PhysOp, data: Bytes, t: &Target, local: &mut Local) {
    local.counters.physical_reads += 1;
    local.counters.mapped_reads += 1;
    local.counters.bytes_read += data.len() as u64;
    op.serve(data, None, t, local);
}

/// Opens the file and fixes the byte range. Errors and empty ranges are delivered here.
pub(crate) fn resolve(op: PhysOp, t: &Target, ctx: &Ctx, local: &mut Local) -> Resolution {
    if t.sink.dropped.load(Ordering::Acquire) {
        local.counters.skipped_reads += 1;
        return Resolution::Finished;
    }
    let file = match local.file(&t.path, ctx, t.sink.generation) {
        Ok(f) => f,
        Err(e) => {
            let err = IoError::from_os(e, &t.path, op.range);
            op.fail(&err, t, local);
            return Resolution::Finished;
        }
    };
    // (`sink.map` is never set on an `O_DIRECT` engine.)
    if t.sink.map
        && within(op.range, file.known_len())
        && let Some(map) = file.mapped(&t.path, ctx.map_files)
        && let Some((start, end)) = mapped_range(
            op.range,
            &file.file,
            map,
            ctx.map_files,
            Some((&mut local.map_probe, &mut local.map_window)),
            &mut local.map_clock,
        )
    {
        let data = map.bytes.slice(start..end);
        serve_mapped(op, data, t, local);
        return Resolution::Finished;
    }
    let (offset, len, past_eof) = match op.range {
        // A range is checked against the file's length before its buffer is allocated: the
        // range may come from a corrupt index (a length of 2^62 must not become an
        // allocation). Within the length known from the last check, that costs nothing.
        ReadRange::Bounded { offset, len } if len > 0 => {
            let end = offset.checked_add(len);
            if end.is_some_and(|end| end <= file.known_len()) {
                (offset, len, false)
            } else {
                let file_len = match file.current_len() {
                    Ok(n) => n,
                    Err(e) => {
                        let err = IoError::from_os(e, &t.path, op.range);
                        op.fail(&err, t, local);
                        return Resolution::Finished;
                    }
                };
                if end.is_some_and(|end| end <= file_len) {
                    (offset, len, false)
                } else if offset < file_len {
                    // Read what there is; the requests past the end fail once it is read.
                    (offset, file_len - offset, true)
                } else {
                    op.serve_within(Bytes::new(), 0, false, file_len, None, t, local);
                    return Resolution::Finished;
                }
            }
        }
        // Whole-file, suffix and empty reads need the length now.
        range => {
            let file_len = match file.file.metadata() {
                Ok(m) => m.len(),
                Err(e) => {
                    let err = IoError::from_os(e, &t.path, range);
                    op.fail(&err, t, local);
                    return Resolution::Finished;
                }
            };
            match range.resolve(file_len) {
                Some((offset, len)) => (offset, len, false),
                None => {
                    let err = IoError::RangePastEof {
                        path: Arc::clone(&t.path),
                        range,
                        file_len,
                    };
                    op.fail(&err, t, local);
                    return Resolution::Finished;
                }
            }
        }
    };
    if len == 0 {
        op.serve(Bytes::new(), None, t, local);
        return Resolution::Finished;
    }
    let (read_start, read_len) = match file.direct_align {
        Some((_, a)) => {
            let start = offset & !(a - 1);
            let end = (offset + len).div_ceil(a) * a;
            (start, end - start)
        }
        None => (offset, len),
    };
    Resolution::Read(Resolved {
        op,
        file,
        offset,
        len,
        read_start,
        read_len,
        recycle: ctx.recycle,
        past_eof,
    })
}

/// A physical read in progress: its buffer fills as the kernel delivers bytes.
#[derive(Debug)]
pub(crate) struct Active {
    res: Resolved,
    buf: ReadBuf,
    /// Its share of the budget; `None` only while it waits in the queue as [`Work::Missed`].
    permit: Option<Permit>,
}

/// What the next syscall of an [`Active`] read should do.
pub(crate) struct NextRead {
    pub(crate) fd: RawFd,
    pub(crate) ptr: *mut u8,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

/// Largest single read syscall we issue (the kernel caps reads near 2 GiB anyway).
const MAX_READ_PER_CALL: usize = 1 << 30;

/// The outcome of one non-blocking attempt at a read.
pub(crate) enum Attempt {
    /// Finished (served from the page cache, or failed) and delivered.
    Done,
    /// Not (all) in the page cache: the device must be asked.
    Missed(Active),
    /// This file (or filesystem) does not support non-blocking reads.
    Unsupported(Active),
}

impl Active {
    /// Gives the budget back (before queueing the read as [`Work::Missed`]).
    pub(crate) fn release_budget(mut self) -> Self {
        self.permit = None;
        self
    }

    /// Bytes the budget is charged for.
    pub(crate) fn charge(&self) -> u64 {
        self.res.read_len
    }

    /// Takes `permit` as its budget.
    pub(crate) fn with_budget(mut self, permit: Permit) -> Self {
        self.permit = Some(permit);
        self
    }

    /// Buffer bytes needed before the request is satisfied.
    fn need(&self) -> usize {
        (self.res.offset - self.res.read_start + self.res.len) as usize
    }

    /// Whether all requested bytes have arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.buf.filled() >= self.need()
    }

    /// Whether a short read means the end of the file: a read returned 0, or an `O_DIRECT`
    /// read stopped at an unaligned length (which only the end of the file produces).
    fn hit_eof(&self, last: usize) -> bool {
        last == 0
            || self
                .res
                .file
                .direct_align
                .is_some_and(|(_, a)| !(self.buf.filled() as u64).is_multiple_of(a))
    }

    /// The next read to issue for the missing bytes.
    pub(crate) fn next_read(&mut self) -> NextRead {
        let filled = self.buf.filled();
        let (ptr, spare) = self.buf.spare();
        NextRead {
            fd: self.res.file.file.as_raw_fd(),
            ptr,
            len: spare.min(MAX_READ_PER_CALL) as u32,
            offset: self.res.read_start + filled as u64,
        }
    }

    /// The buffer, for the io_uring backend to record what the kernel wrote into it.
    pub(crate) fn buf_mut(&mut self) -> &mut ReadBuf {
        &mut self.buf
    }

    /// One `pread` (or `preadv2(RWF_NOWAIT)`) for the missing bytes.
    pub(crate) fn pread_once(&mut self, nowait: bool) -> std::io::Result<usize> {
        let offset = self.res.read_start + self.buf.filled() as u64;
        sys::pread(
            &self.res.file.file,
            &mut self.buf,
            offset,
            MAX_READ_PER_CALL,
            nowait,
        )
    }

    /// After a syscall returned `n` bytes (already recorded): finishes and delivers the read if
    /// it is over and returns `None`, or returns the read if more must be read (a short read:
    /// the caller issues [`Self::next_read`] again).
    pub(crate) fn after_read(self, n: usize, t: &Target, local: &mut Local) -> Option<Self> {
        if self.is_complete() {
            self.finish_ok(t, local);
            None
        } else if self.hit_eof(n) {
            self.finish_eof(t, local);
            None
        } else {
            local.counters.short_read_resubmits += 1;
            Some(self)
        }
    }

    /// One non-blocking read from the page cache (`preadv2(RWF_NOWAIT)`).
    pub(crate) fn try_cached(mut self, t: &Target, local: &mut Local) -> Attempt {
        match self.pread_once(true) {
            Ok(n) => {
                local.counters.fast_path_hits += 1;
                match self.after_read(n, t, local) {
                    None => Attempt::Done,
                    // Partly cached: the device reads the rest.
                    Some(rest) => Attempt::Missed(rest),
                }
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    local.counters.fast_path_misses += 1;
                    Attempt::Missed(self)
                }
                Some(libc::EOPNOTSUPP) => Attempt::Unsupported(self),
                Some(libc::EINTR) => Attempt::Missed(self),
                _ => {
                    self.finish_err(e, t, local);
                    Attempt::Done
                }
            },
        }
    }

    /// Completes every request from the buffer.
    fn finish_ok(self, t: &Target, local: &mut Local) {
        if self.res.past_eof {
            return self.finish_eof(t, local);
        }
        local.counters.physical_reads += 1;
        local.counters.bytes_read += self.buf.filled() as u64;
        let lead = (self.res.offset - self.res.read_start) as usize;
        let len = self.res.len as usize;
        let all = self.buf.into_bytes();
        let data = if lead == 0 && len == all.len() {
            all
        } else {
            all.slice(lead..lead + len)
        };
        self.res.op.serve(data, self.permit, t, local);
    }

    /// The file ended before the read did: requests wholly inside the bytes obtained succeed,
    /// the others fail with [`IoError::RangePastEof`].
    fn finish_eof(self, t: &Target, local: &mut Local) {
        local.counters.physical_reads += 1;
        local.counters.bytes_read += self.buf.filled() as u64;
        let lead = (self.res.offset - self.res.read_start) as usize;
        let got = self.buf.filled().saturating_sub(lead);
        let file_len = self
            .res
            .file
            .file
            .metadata()
            .map_or(self.res.read_start + self.buf.filled() as u64, |m| m.len());
        let data = self.buf.into_bytes();
        let data = data.slice(lead.min(data.len())..);
        // A whole-file or suffix read that ended early lost bytes it was sized for.
        self.res
            .op
            .serve_within(data, got as u64, false, file_len, self.permit, t, local);
    }

    /// Fails every request with the OS error `e`.
    pub(crate) fn finish_err(self, e: std::io::Error, t: &Target, local: &mut Local) {
        let err = IoError::from_os(e, &t.path, self.res.op.range);
        let Active { res, permit, .. } = self;
        res.op.fail(&err, t, local);
        drop(permit);
    }

    /// Fails every request because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        let Active { res, permit, .. } = self;
        res.op.fail_shutdown(t, local);
        drop(permit);
    }

    /// Fails every request with `e` and leaks the buffer instead of freeing it: for reads the
    /// kernel may still be writing into (an io_uring ring that broke mid-flight).
    pub(crate) fn abandon(self, e: &std::io::Error, t: &Target, local: &mut Local) {
        let err = IoError::from_os(
            std::io::Error::new(e.kind(), e.to_string()),
            &t.path,
            self.res.op.range,
        );
        let Active { res, buf, permit } = self;
        std::mem::forget(buf);
        res.op.fail(&err, t, local);
        drop(permit);
    }

    /// Reads to the end with blocking `pread`s.
    pub(crate) fn run_blocking(mut self, t: &Target, local: &mut Local) {
        loop {
            match self.pread_once(false) {
                Ok(n) => match self.after_read(n, t, local) {
                    None => return,
                    Some(again) => self = again,
                },
                Err(e) if is_retryable(&e) => local.counters.retries += 1,
                Err(e) => return self.finish_err(e, t, local),
            }
        }
    }
}

/// `EINTR` and `EAGAIN`: try the same read again.
pub(crate) fn is_retryable(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

#[cfg(test)]
mod tests {
    use super::{
        CacheProbe, CoarseClock, MapFiles, Mapping, ResidentMemo, WindowRetry, mapped_range,
    };
    use crate::request::ReadRange;
    use crate::sys;
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    /// A temporary file of `len` bytes, its mapping, and an open descriptor.
    fn mapped_file(len: usize) -> (tempfile::NamedTempFile, std::fs::File, bytes::Bytes) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![9u8; len]).unwrap();
        f.as_file().sync_all().unwrap();
        let file = f.reopen().unwrap();
        let whole = sys::map_file(&file).unwrap();
        (f, file, whole)
    }

    fn range(start: usize, end: usize) -> ReadRange {
        ReadRange::Bounded {
            offset: start as u64,
            len: (end - start) as u64,
        }
    }

    /// The mapping of `whole` with nothing known of what is in memory.
    fn mapping(whole: bytes::Bytes) -> Mapping {
        Mapping {
            resident: Arc::new(ResidentMemo::new(whole.len())),
            bytes: whole,
        }
    }

    /// On a file all in memory, one ask answers for every thread's reads in its aligned
    /// window (a read across two windows asks about both) until the answer is
    /// [`ResidentMemo::FRESH`] old.
    #[test]
    fn one_ask_serves_every_threads_reads_in_its_window() {
        const W: usize = ResidentMemo::WINDOW;
        let (_f, file, whole) = mapped_file(4 * W + 1000);
        if sys::cachestat_resident(&file, 0, 4096).is_none() {
            return; // No cachestat: no windows (mincore's cost grows with the range).
        }
        let map = mapping(whole);
        let stamps = |m: &Mapping| -> Vec<u64> {
            m.resident
                .found
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect()
        };
        assert_eq!(stamps(&map), [0; 5]);
        let serve = |start: usize, end: usize, local: &mut (CacheProbe, WindowRetry)| {
            mapped_range(
                range(start, end),
                &file,
                &map,
                MapFiles::WhenCached,
                Some((&mut local.0, &mut local.1)),
                &mut CoarseClock::default(),
            )
        };
        // Without asking (as a consumer serves reads while it plans them): only windows
        // already found all in memory.
        let unasked = |start: usize, end: usize| {
            let r = range(start, end);
            let clock = &mut CoarseClock::default();
            mapped_range(r, &file, &map, MapFiles::WhenCached, None, clock)
        };
        assert_eq!(
            unasked(1000, 20_000),
            None,
            "resident, but never asked about"
        );
        let (mut a, mut b) = Default::default();
        let before = ResidentMemo::now();
        assert_eq!(serve(1000, 20_000, &mut a), Some((1000, 20_000)));
        assert_eq!(
            unasked(30_000, 40_000),
            Some((30_000, 40_000)),
            "its window was found"
        );
        assert_eq!(unasked(W + 1, W + 2), None, "another window");
        let first = stamps(&map)[0];
        assert!(first >= before);
        assert_eq!(
            stamps(&map)[1..],
            [0; 4],
            "only the read's window was asked about"
        );
        // Other reads in window 0, by either thread: no new ask (the stamp stays).
        for k in 0..200 {
            let at = (k * 5_003) % (W - 100);
            let local = if k % 2 == 0 { &mut a } else { &mut b };
            assert_eq!(serve(at, at + 100, local), Some((at, at + 100)));
        }
        assert_eq!(stamps(&map)[0], first);
        // Across windows 1 and 2: both asked about at once.
        assert_eq!(
            serve(2 * W - 10, 2 * W + 10, &mut b),
            Some((2 * W - 10, 2 * W + 10))
        );
        let s = stamps(&map);
        assert!(s[1] > 0 && s[1] == s[2], "{s:?}");
        assert_eq!(s[3..], [0; 2]);
        // The last window, shorter than the others.
        assert_eq!(
            serve(4 * W, 4 * W + 1000, &mut a),
            Some((4 * W, 4 * W + 1000))
        );
        assert!(stamps(&map)[4] > 0);
        // Answers go stale.
        let fresh = ResidentMemo::FRESH.as_micros() as u64;
        assert!(map.resident.fresh(0, W, first + fresh - 1));
        assert!(!map.resident.fresh(0, W, first + fresh));
        assert!(
            !map.resident.fresh(W - 1, W + 1, s[1] + fresh),
            "one stale window of two"
        );
        assert!(
            !map.resident.fresh(3 * W, 3 * W + 1, first),
            "never asked about"
        );
    }

    /// Served from the mapping only where every page is in memory, whatever the windows said
    /// before: a file dropped from the page cache with three of every four 16 KiB read back in
    /// (so no window is all in memory, and most reads are), read in runs going forward through
    /// it (as the windows expect) and at random.
    #[test]
    fn only_resident_ranges_are_served_from_the_mapping() {
        const LEN: usize = 8 << 20;
        let (_f, file, whole) = mapped_file(LEN);
        sys::drop_from_page_cache(&file);
        for at in (0..LEN).step_by(16 << 10).filter(|at| at % (64 << 10) != 0) {
            let mut buf = sys::ReadBuf::new(16 << 10, None, false);
            sys::pread(&file, &mut buf, at as u64, 16 << 10, false).unwrap();
        }
        let map = mapping(whole);
        let (mut probe, mut retry) = (CacheProbe::default(), WindowRetry::default());
        let mut clock = CoarseClock::default();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) as usize % n
        };
        let (mut served, mut asked) = (0, 0);
        for run in 0..400 {
            let mut at = next(LEN - (1 << 20));
            for _ in 0..16 {
                let end = at + 1 + next(4 << 10);
                let got = mapped_range(
                    range(at, end),
                    &file,
                    &map,
                    MapFiles::WhenCached,
                    Some((&mut probe, &mut retry)),
                    &mut clock,
                );
                if let Some(r) = got {
                    assert_eq!(r, (at, end));
                    assert!(
                        sys::resident(&file, &map.bytes, at, end),
                        "run {run}: {at}..{end} served but not in memory"
                    );
                    served += 1;
                }
                asked += 1;
                at = if run % 2 == 0 {
                    end + next(64 << 10)
                } else {
                    next(LEN - (4 << 10) - 1)
                };
            }
        }
        assert!(
            served * 2 > asked,
            "{served} of {asked} reads served from the mapping"
        );
    }

    /// The clock is read again after [`CoarseClock::READS`] reads, and at the first read
    /// after a flush.
    #[test]
    fn a_coarse_clock_reads_the_clock_every_16_reads_and_after_forgetting() {
        let pause = || std::thread::sleep(std::time::Duration::from_millis(1));
        let mut c = CoarseClock::default();
        let t0 = c.now();
        for _ in 1..CoarseClock::READS {
            pause();
            assert_eq!(c.now(), t0);
        }
        pause();
        let t1 = c.now();
        assert!(t1 > t0);
        pause();
        c.forget();
        assert!(c.now() > t1);
    }

    /// Asks of `n` reads, each answered `hit`.
    fn asks(p: &mut CacheProbe, n: u32, hit: bool) -> u32 {
        let mut asked = 0;
        for _ in 0..n {
            if p.should_ask() {
                p.record(hit);
                asked += 1;
            }
        }
        asked
    }

    #[test]
    fn a_cold_probe_asks_one_read_in_32_and_warms_up_again() {
        let mut p = CacheProbe::default();
        assert_eq!(asks(&mut p, 1024, true), 1024, "warm: every read asks");
        assert_eq!(asks(&mut p, 64, false), 64, "a window of misses");
        assert_eq!(asks(&mut p, 2048, false), 64, "cold: one read in 32");
        // Hits come back: a window of 64 answers (64 * 32 reads) turns it warm again.
        let n = 64 * CacheProbe::PROBE_EVERY;
        assert_eq!(asks(&mut p, n, true), 64);
        assert_eq!(asks(&mut p, 500, true), 500, "warm again");
        // Half hits keep it warm.
        for _ in 0..10 {
            assert_eq!(asks(&mut p, 32, true) + asks(&mut p, 32, false), 64);
        }
    }
}
