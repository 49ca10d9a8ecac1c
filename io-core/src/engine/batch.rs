//! [`Batch`]: one submission's results as they complete, in completion order. Its consumer
//! hands planned reads to the workers a bounded distance ahead, serves reads that a mapping
//! answers without a system call as it plans them, and helps with queued reads while it
//! waits.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Receiver;

use crate::config::MapFiles;
use crate::request::{Completion, ReadRequest};
use crate::worker::Work;
use crate::worker::active::Attempt;
use crate::worker::local::Local;
use crate::worker::op::{Delivery, PhysOp, Run, Sink, Target, next_generation};
use crate::worker::resolve::{Resolution, resolve};

use super::plan::{FIRST_PLAN_GROUP, PLAN_GROUP, WHOLE_PLAN_UP_TO, plan};
use super::state::Inner;

/// Requests a batch keeps handed to the workers but not yet taken by its consumer, in units of
/// the engine's queue depth (at least [`MIN_READ_AHEAD`]). Enough to keep the device busy while
/// the consumer works; more only makes the results pile up, and with them their buffers, which
/// then no longer fit in the CPU's caches (64 KiB cached reads on 2 cores: 176k reads/s with
/// up to 4096 results waiting, 206k with 128).
pub(crate) const READ_AHEAD_DEPTHS: usize = 4;

/// The least read-ahead of a batch, in requests.
pub(crate) const MIN_READ_AHEAD: usize = 64;

/// The results of one [`IoEngine::submit`](crate::IoEngine::submit), in completion order. Iterating blocks until the
/// next result arrives and ends after the last one. Dropping it early is fine: reads still in
/// flight finish and their results are discarded.
///
/// With [`IoEngine::submit_mapped`](crate::IoEngine::submit_mapped), a read whose bytes a mapping of its file serves without a
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
    engine: Arc<Inner>,
}

/// Requests in a row a batch failed to serve from mappings as it planned them (files not
/// mapped, such as small ones, or data not recently found in memory) after which it stops
/// trying for the rest of the batch: each try looks its file up among the open ones, which
/// costs more than it saves on stores of many small files.
const INLINE_MISSES: u32 = 64;

/// Misses in a row after which a batch pauses helping (its data is not cached).
const HELP_MISSES: u32 = 8;

/// Results returned before a batch that paused helping tries again. Trying costs at most
/// [`HELP_MISSES`] non-blocking reads that miss, against this many reads served by workers.
const HELP_PAUSE: usize = 1024;

/// Results for other batches a helping consumer holds before sending them.
const HELP_FLUSH_AT: usize = 64;

impl Batch {
    /// Plans `requests` (the first group now) and hands the first reads to the workers.
    pub(super) fn new(engine: Arc<Inner>, requests: Vec<ReadRequest>, map: bool) -> Batch {
        let (tx, rx) = crossbeam_channel::unbounded();
        let map = map
            && engine.ctx.map_files != MapFiles::Never
            && crate::files::mapguard::check_in_place();
        let sink = Arc::new(Sink {
            tx,
            map,
            dropped: AtomicBool::new(false),
            generation: next_generation(),
        });
        let total = requests.len();
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
            unsent: requests.into_iter(),
            sent: 0,
            planned: VecDeque::new(),
            queued: 0,
            read_ahead: (engine.queue_depth * READ_AHEAD_DEPTHS).max(MIN_READ_AHEAD),
            local,
            helping: engine.consumers_help,
            misses_in_a_row: 0,
            help_resume_at: 0,
            unwoken: false,
            engine,
        };
        // Submitting starts the reads: the workers are woken whoever iterates, and when.
        batch.feed(false);
        batch
    }

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
    pub(crate) fn feed(&mut self, iterating: bool) {
        let returned_by_workers = self.returned() - self.inline_taken;
        let inner = Arc::clone(&self.engine);
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
        self.engine.wake();
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
                    let ctx = Arc::clone(&self.engine.ctx);
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
            let ctx = &self.engine.ctx;
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
        let inner = Arc::clone(&self.engine);
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
        let ctx = Arc::clone(&self.engine.ctx);
        self.local.flush(&ctx);
    }
}
