//! Thread pools for reads that run off the calling thread.
//!
//! A pool starts a thread only when a job finds no idle one (up to `max` threads) and lets a
//! thread go after [`IDLE_EXIT`] without work, so it costs nothing when unused and never makes a
//! job wait for an unrelated, slow one while it may grow. Handing a job to an idle thread costs
//! a few microseconds; starting a thread costs tens.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

/// A job.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// How long a thread waits for work before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// A pool of threads running [`Job`]s.
pub(crate) struct Pool {
    name: &'static str,
    max: usize,
    tx: Sender<Job>,
    rx: Receiver<Job>,
    /// Threads waiting for a job and not yet promised one.
    idle: AtomicUsize,
    /// Threads alive.
    threads: AtomicUsize,
}

impl Pool {
    /// A pool of at most `max` threads named `name-N`.
    pub(crate) fn new(name: &'static str, max: usize) -> Pool {
        let (tx, rx) = crossbeam_channel::unbounded();
        Pool {
            name,
            max: max.max(1),
            tx,
            rx,
            idle: AtomicUsize::new(0),
            threads: AtomicUsize::new(0),
        }
    }

    /// Queues `job`, starting a thread if none is idle and the pool may grow. Gives the job
    /// back if no thread runs or can be started.
    pub(crate) fn execute(&'static self, job: Job) -> Result<(), Job> {
        // Promise the job to an idle thread, or start one.
        let promised = self
            .idle
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if !promised && !self.grow() && self.threads.load(Ordering::Acquire) == 0 {
            return Err(job);
        }
        self.tx
            .send(job)
            .map_err(crossbeam_channel::SendError::into_inner)
    }

    /// Starts a thread if the pool is below `max`; whether it did.
    fn grow(&'static self) -> bool {
        let reserved = self
            .threads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok();
        if !reserved {
            return false;
        }
        let n = self.threads.load(Ordering::Acquire);
        let started = std::thread::Builder::new()
            .name(format!("{}-{n}", self.name))
            .spawn(move || self.work())
            .is_ok();
        if !started {
            self.threads.fetch_sub(1, Ordering::AcqRel);
        }
        started
    }

    /// A thread's life: run jobs; exit after `IDLE_EXIT` without one, unless one was promised.
    fn work(&self) {
        // A thread started for a job runs it first, without counting itself idle.
        let mut count_idle = false;
        loop {
            if count_idle {
                self.idle.fetch_add(1, Ordering::AcqRel);
            }
            match self.rx.recv_timeout(IDLE_EXIT) {
                Ok(job) => {
                    job();
                    count_idle = true;
                }
                Err(RecvTimeoutError::Timeout) => {
                    // Leave only if no job was promised to this thread meanwhile.
                    let left = self
                        .idle
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                        .is_ok();
                    if left {
                        self.threads.fetch_sub(1, Ordering::AcqRel);
                        return;
                    }
                    count_idle = false;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.threads.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
            }
        }
    }
}
