//! The io_uring backend: the unsafe module that hands buffers to the kernel.
//!
//! Each worker thread owns one ring and keeps up to its share of the queue depth in flight:
//! it pulls planned reads from the engine's queue, pushes one SQE per read, submits them in one
//! `io_uring_enter`, and reaps completions, resubmitting short reads and `EINTR`/`EAGAIN`. An
//! eventfd read stays armed in the ring so that new work wakes a worker that waits for
//! completions. A buffer handed to the kernel lives in the worker's slot table until its
//! completion arrives; the worker never exits, and never frees a buffer, while reads are in
//! flight.
//!
//! On data that is already in the page cache, a `preadv2(RWF_NOWAIT)` copies it with one
//! syscall and no ring round trip (io_uring loses to plain `pread` on cached data). The worker
//! tries that first while it keeps finding data cached, and skips it (probing now and then)
//! when reads keep missing the cache.
#![allow(unsafe_code)]

use std::borrow::Cow;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;
use io_uring::{IoUring, opcode, squeue, types};

use crate::config::FastPath;
use crate::error::{EngineError, IoError};
use crate::files::residency::CacheProbe;
use crate::sys::EventFd;

use super::Work;
use super::active::{Active, Attempt, is_retryable};
use super::local::Local;
use super::op::{Ctx, Run, Target};
use super::resolve::{Resolution, Resolved, resolve};

/// Results a worker buffers before sending them.
const FLUSH_AT: usize = 64;

/// `user_data` of the eventfd read.
const EVENTFD_TOKEN: u64 = u64::MAX;

/// Checks that this kernel and process can set up a ring and read through it.
pub(crate) fn probe() -> Result<(), String> {
    let ring = IoUring::new(8).map_err(|e| describe_setup_error(&e))?;
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("cannot probe io_uring opcodes: {e}"))?;
    if !probe.is_supported(opcode::Read::CODE) {
        return Err("this kernel's io_uring lacks IORING_OP_READ (needs Linux 5.6+)".into());
    }
    Ok(())
}

fn describe_setup_error(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => "the kernel has no io_uring (ENOSYS)".into(),
        Some(libc::EPERM) => "io_uring is forbidden here (EPERM: seccomp or sysctl \
                               kernel.io_uring_disabled)"
            .into(),
        Some(libc::ENOMEM) => "cannot lock memory for the ring (ENOMEM: RLIMIT_MEMLOCK)".into(),
        _ => format!("io_uring setup failed: {e}"),
    }
}

/// A running worker: its eventfd (to wake it) and its thread.
pub(crate) struct WorkerHandle {
    pub(crate) waker: Arc<EventFd>,
    pub(crate) thread: JoinHandle<()>,
}

/// Starts one worker with `depth` reads in flight at most. The ring is created on the worker
/// thread (so single-issuer rings are used by their creator); setup errors come back here.
pub(crate) fn spawn(
    index: usize,
    depth: usize,
    fast_path: FastPath,
    queue: &Receiver<Work>,
    ctx: &Arc<Ctx>,
) -> Result<WorkerHandle, EngineError> {
    let waker = Arc::new(EventFd::new().map_err(EngineError::Spawn)?);
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<Result<(), String>>(1);
    let queue = queue.clone();
    let ctx = Arc::clone(ctx);
    let wake = Arc::clone(&waker);
    let thread = std::thread::Builder::new()
        .name(format!("zcrop-uring-{index}"))
        .spawn(move || match build_ring(depth) {
            Ok(ring) => {
                let _ = ready_tx.send(Ok(()));
                Worker::new(ring, depth, fast_path, queue, wake, ctx).run();
            }
            Err(e) => {
                let _ = ready_tx.send(Err(describe_setup_error(&e)));
            }
        })
        .map_err(EngineError::Spawn)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(WorkerHandle { waker, thread }),
        Ok(Err(reason)) => {
            let _ = thread.join();
            Err(EngineError::UringUnavailable { reason })
        }
        Err(_) => Err(EngineError::UringUnavailable {
            reason: "io_uring worker exited during setup".into(),
        }),
    }
}

/// Reads queued in the ring are handed to the kernel as soon as this many wait, not all at
/// once when the worker next waits for completions. A batch of reads submitted together
/// reaches the disk as one plugged batch; on this project's virtual disk, cold 4 KiB reads at
/// queue depth 64 ran at 79-81k/s submitted as the worker refilled the ring (one enter per
/// 16 reads) and 94-97k/s submitted every 1 or 4 (fio: 84k/s submitting one at a time, 75-77k
/// in batches of 64). Reads served from the page cache never reach the ring, so the extra
/// system calls are paid only by reads that wait for the disk.
const SUBMIT_EVERY: usize = 4;

/// A ring with room for `depth` reads plus the eventfd read, with the cheapest task-running
/// mode the kernel offers.
fn build_ring(depth: usize) -> io::Result<IoUring> {
    let entries = (depth + 1).next_power_of_two() as u32;
    let tuned = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(entries);
    match tuned {
        Ok(r) => Ok(r),
        // Kernels before 6.1 reject DEFER_TASKRUN; use a plain ring.
        Err(_) => IoUring::new(entries),
    }
}

/// A read that needs budget before it can go on.
#[derive(Debug)]
enum Charge {
    /// Not started: gets its buffer once charged, and may try the page cache.
    New(Resolved),
    /// Missed the page cache (found by a consumer): straight to the ring once charged.
    Missed(Active),
}

impl Charge {
    fn bytes(&self) -> u64 {
        match self {
            Charge::New(r) => r.charge(),
            Charge::Missed(a) => a.charge(),
        }
    }

    fn fail_shutdown(self, t: &Target, local: &mut Local) {
        match self {
            Charge::New(r) => r.fail_shutdown(t, local),
            Charge::Missed(a) => a.fail_shutdown(t, local),
        }
    }
}

/// Tracks whether `RWF_NOWAIT` reads keep finding data in the page cache.
struct FastPathState {
    mode: FastPath,
    probe: CacheProbe,
}

impl FastPathState {
    fn should_try(&mut self) -> bool {
        match self.mode {
            FastPath::Never => false,
            FastPath::Always => true,
            FastPath::Auto => self.probe.should_ask(),
        }
    }
}

struct Worker {
    ring: IoUring,
    depth: usize,
    queue: Receiver<Work>,
    waker: Arc<EventFd>,
    /// Target of the armed eventfd read; boxed so its address is stable.
    waker_buf: Box<[u8; 8]>,
    waker_armed: bool,
    /// Reads handed to the kernel, indexed by `user_data`.
    slots: Vec<Option<(Active, Target)>>,
    free: Vec<usize>,
    in_flight: usize,
    /// A read waiting for budget while this worker's own reads are in flight.
    waiting: Option<(Charge, Target)>,
    /// The rest of the last run taken from the queue, last op first.
    fresh: Option<Run>,
    fast: FastPathState,
    local: Local,
    ctx: Arc<Ctx>,
}

impl Worker {
    fn new(
        ring: IoUring,
        depth: usize,
        fast_path: FastPath,
        queue: Receiver<Work>,
        waker: Arc<EventFd>,
        ctx: Arc<Ctx>,
    ) -> Self {
        let direct = ctx.direct;
        Worker {
            ring,
            depth: depth.max(1),
            queue,
            waker,
            waker_buf: Box::new([0; 8]),
            waker_armed: false,
            slots: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            waiting: None,
            fresh: None,
            fast: FastPathState {
                // O_DIRECT reads bypass the page cache; RWF_NOWAIT would only add a syscall.
                mode: if direct { FastPath::Never } else { fast_path },
                probe: CacheProbe::default(),
            },
            local: Local::default(),
            ctx,
        }
    }

    fn run(mut self) {
        loop {
            self.fill();
            let shutting_down = self.ctx.shutting_down();
            if !self.waker_armed && !shutting_down {
                self.arm_waker();
            }
            if self.in_flight == 0 && !self.waker_armed {
                if shutting_down
                    && self.waiting.is_none()
                    && self.fresh.is_none()
                    && self.queue.is_empty()
                {
                    self.local.flush(&self.ctx);
                    return;
                }
                // Shutting down with work queued: `fill` fails it on the next turn.
                continue;
            }
            // Deliver what is done before waiting: consumers wait for it, and it holds budget.
            self.local.flush(&self.ctx);
            if let Err(e) = self.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    // Interrupted, or the kernel is short of memory / the completion queue is
                    // full: reap what is there and try again.
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY) => {}
                    _ => {
                        log::error!("io_uring_enter failed: {e}; failing this worker's reads");
                        self.abandon(&e);
                        self.local.flush(&self.ctx);
                        return;
                    }
                }
            }
            self.local.counters.ring_enters += 1;
            self.reap();
        }
    }

    /// Takes reads from the queue until the ring holds `depth` of them or the queue is empty.
    fn fill(&mut self) {
        let ctx = Arc::clone(&self.ctx);
        // The run being taken apart lives here, outside `self`, so that its reads can borrow
        // its target while `self` is busy; what is left of it goes back at the end.
        let mut fresh = self.fresh.take();
        while self.in_flight < self.depth {
            if self.waiting.is_none() && fresh.as_ref().is_none_or(|r| r.ops.is_empty()) {
                match self.queue.try_recv() {
                    Ok(Work::Fresh(mut run)) => {
                        run.ops.reverse();
                        fresh = Some(run);
                    }
                    Ok(Work::Resolved(r, t)) => self.waiting = Some((Charge::New(r), t)),
                    Ok(Work::Missed(active, t)) if ctx.shutting_down() => {
                        active.fail_shutdown(&t, &mut self.local);
                        continue;
                    }
                    Ok(Work::Missed(active, t)) => {
                        self.waiting = Some((Charge::Missed(*active), t));
                    }
                    Err(_) => break,
                }
            }
            let (item, t): (Charge, Cow<'_, Target>) = match self.waiting.take() {
                Some((c, t)) => (c, Cow::Owned(t)),
                None => {
                    let Some(run) = fresh.as_mut() else { continue };
                    let Some(op) = run.ops.pop() else { continue };
                    let t = &run.targets[op.target];
                    if ctx.shutting_down() {
                        op.fail_shutdown(t, &mut self.local);
                        continue;
                    }
                    match resolve(op, t, &ctx, &mut self.local) {
                        Resolution::Read(r) => (Charge::New(r), Cow::Borrowed(t)),
                        Resolution::Finished => continue,
                    }
                }
            };
            let permit = match self.local.charge(&ctx.budget, item.bytes()) {
                Some(p) => p,
                // Our own completions will free budget: go reap them first.
                None if self.in_flight > 0 => {
                    self.waiting = Some((item, t.into_owned()));
                    break;
                }
                // Nothing of ours in flight: others hold the budget; hand over what we hold
                // and wait for them.
                None => {
                    self.local.flush(&ctx);
                    match ctx.budget.acquire(item.bytes(), || ctx.shutting_down()) {
                        Some(p) => p,
                        None => {
                            item.fail_shutdown(&t, &mut self.local);
                            continue;
                        }
                    }
                }
            };
            let resolved = match item {
                Charge::New(r) => r,
                // Already known not to be cached: straight to the ring.
                Charge::Missed(active) => {
                    self.push(active.with_budget(permit), t.into_owned());
                    continue;
                }
            };
            let Some(active) = resolved.activate(permit, &t, &mut self.local) else {
                continue;
            };
            if !self.fast.should_try() {
                self.push(active, t.into_owned());
                continue;
            }
            match active.try_cached(&t, &mut self.local) {
                Attempt::Done => {
                    self.fast.probe.record(true);
                    // Served from the page cache without the ring: deliver as we go, not only
                    // when the queue runs dry (consumers wait for these; they hold buffers).
                    if self.local.pending() >= FLUSH_AT {
                        self.local.flush(&ctx);
                    }
                }
                Attempt::Missed(rest) => {
                    self.fast.probe.record(false);
                    self.push(rest, t.into_owned());
                }
                Attempt::Unsupported(rest) => {
                    // This filesystem has no RWF_NOWAIT: stop trying.
                    self.fast.mode = FastPath::Never;
                    self.push(rest, t.into_owned());
                }
            }
        }
        self.fresh = fresh.filter(|r| !r.ops.is_empty());
    }

    /// Hands `active`'s next read to the kernel; `t` is where its results go.
    fn push(&mut self, mut active: Active, t: Target) {
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        let next = active.next_read();
        let entry = opcode::Read::new(types::Fd(next.fd), next.ptr, next.len)
            .offset(next.offset)
            .build()
            .user_data(slot as u64);
        self.slots[slot] = Some((active, t));
        self.in_flight += 1;
        self.push_entry(&entry);
        if self.ring.submission().len() >= SUBMIT_EVERY {
            self.submit_queued();
        }
    }

    /// Hands the queued entries to the kernel now, without waiting.
    fn submit_queued(&mut self) {
        if let Err(e) = self.ring.submit()
            && !matches!(
                e.raw_os_error(),
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
            )
        {
            log::error!("io_uring submit failed: {e}");
        }
        self.local.counters.ring_enters += 1;
    }

    fn arm_waker(&mut self) {
        let entry = opcode::Read::new(types::Fd(self.waker.raw()), self.waker_buf.as_mut_ptr(), 8)
            .build()
            .user_data(EVENTFD_TOKEN);
        self.waker_armed = true;
        self.push_entry(&entry);
    }

    fn push_entry(&mut self, entry: &squeue::Entry) {
        loop {
            // SAFETY: the entry's buffer is either the eventfd buffer (boxed, owned by this
            // worker, which does not exit while the read is armed) or the buffer of an `Active`
            // now stored in `self.slots`, which stays there, unmoved in memory (the heap
            // allocation does not move when the `Active` moves), until its completion is reaped.
            // The file descriptor is kept open by the `Active`'s `Arc<OpenFile>` (or the
            // worker's eventfd) for as long.
            let pushed = unsafe { self.ring.submission().push(entry) };
            if pushed.is_ok() {
                return;
            }
            // Queue full: hand the queued entries to the kernel and retry. The ring has room
            // for `depth + 1` entries and at most that many are outstanding, so this is rare.
            self.submit_queued();
        }
    }

    /// Handles every completion that has arrived.
    fn reap(&mut self) {
        let done: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|cqe| (cqe.user_data(), cqe.result()))
            .collect();
        for (token, res) in done {
            if token == EVENTFD_TOKEN {
                self.waker_armed = false;
                continue;
            }
            let slot = token as usize;
            let Some((mut active, t)) = self.slots.get_mut(slot).and_then(Option::take) else {
                log::error!("io_uring completion for unknown slot {slot}");
                continue;
            };
            self.in_flight -= 1;
            self.free.push(slot);
            if res < 0 {
                let e = io::Error::from_raw_os_error(-res);
                if is_retryable(&e) {
                    self.local.counters.retries += 1;
                    self.push(active, t);
                } else {
                    active.finish_err(e, &t, &mut self.local);
                }
            } else {
                let n = res as usize;
                // SAFETY: the kernel reports having written `n` bytes at the pointer of the
                // read we issued for this slot, which was `active.next_read()`'s: the start of
                // the buffer's spare capacity.
                unsafe { active.buf_mut().advance(n) };
                if let Some(rest) = active.after_read(n, &t, &mut self.local) {
                    self.push(rest, t);
                }
            }
        }
    }

    /// The ring is unusable: fail every read. Buffers the kernel may still write are leaked,
    /// not freed, so a late write cannot land in reused memory.
    fn abandon(&mut self, e: &io::Error) {
        for (active, t) in self.slots.drain(..).flatten() {
            active.abandon(e, &t, &mut self.local);
        }
        if let Some((c, t)) = self.waiting.take() {
            c.fail_shutdown(&t, &mut self.local);
        }
        if let Some(run) = self.fresh.take() {
            for op in run.ops {
                let t = &run.targets[op.target];
                let err =
                    IoError::from_os(io::Error::new(e.kind(), e.to_string()), &t.path, op.range);
                op.fail(&err, t, &mut self.local);
            }
        }
        // Leak the eventfd buffer for the same reason.
        std::mem::forget(std::mem::replace(&mut self.waker_buf, Box::new([0; 8])));
        // Other workers (if any) serve the rest of the queue.
    }
}
