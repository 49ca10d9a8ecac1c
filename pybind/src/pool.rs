//! Thread pools for reads that run off the calling thread.
//!
//! Kept rather than tokio's blocking pool, which works the same way, because it hands a job to
//! an idle thread faster (docs/performance.md, "Own components and why").
//!
//! A pool starts a thread only when a queued job finds no waiting thread to take it (up to `max`
//! threads) and lets a thread go after [`IDLE_EXIT`] without work, so it costs nothing when
//! unused and never makes a job wait for an unrelated, slow one while it may grow. Handing a job
//! to a waiting thread is much cheaper than starting one.
//!
//! All bookkeeping (the queue, the waiting and live thread counts) sits under one mutex, so a
//! queued job always has a thread that will take it: one that was waiting and is woken, one
//! started for it, or (at `max`) a busy one that looks at the queue before it waits or leaves.
//! A thread leaves only with the queue empty, under the same lock. (An earlier lock-free version
//! counted "promises" to idle threads; a thread could take a job promised to another and the
//! count drifted upward until jobs were queued with no thread left: a hang.)

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A job.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// How long a thread waits for work before it exits.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// The state shared by a pool's threads.
#[derive(Default)]
struct State {
    /// Jobs not yet taken by a thread.
    queue: VecDeque<Job>,
    /// Threads waiting on the condition variable.
    waiting: usize,
    /// Threads alive (or being started).
    threads: usize,
}

/// A pool of threads running [`Job`]s.
pub(crate) struct Pool {
    name: &'static str,
    max: usize,
    idle_exit: Duration,
    state: Mutex<State>,
    work: Condvar,
}

impl Pool {
    /// A pool of at most `max` threads named `name-N`.
    pub(crate) fn new(name: &'static str, max: usize) -> Pool {
        Pool::with_idle_exit(name, max, IDLE_EXIT)
    }

    /// A pool whose threads leave after `idle_exit` without work.
    fn with_idle_exit(name: &'static str, max: usize, idle_exit: Duration) -> Pool {
        Pool {
            name,
            max: max.max(1),
            idle_exit,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Jobs run outside the lock and panics in them are caught, so poisoning cannot leave
        // the state half-updated; recover rather than fail.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`, starting a thread if no waiting thread is left to take it and the pool may
    /// grow. Gives the job back if no thread runs or can be started.
    pub(crate) fn execute(&'static self, job: Job) -> Result<(), Job> {
        let mut state = self.lock();
        state.queue.push_back(job);
        if state.waiting >= state.queue.len() {
            // Enough waiting threads for every queued job: wake one for this one.
            drop(state);
            self.work.notify_one();
            return Ok(());
        }
        if state.threads >= self.max {
            // Every thread is busy (or woken for an earlier job): a busy one takes it next.
            return Ok(());
        }
        state.threads += 1;
        let n = state.threads;
        drop(state);
        let started = std::thread::Builder::new()
            .name(format!("{}-{n}", self.name))
            .spawn(move || self.run())
            .is_ok();
        if started {
            return Ok(());
        }
        let mut state = self.lock();
        state.threads -= 1;
        if state.threads == 0 {
            // No thread will ever take it: give the newest job (this one) back.
            if let Some(job) = state.queue.pop_back() {
                return Err(job);
            }
        }
        Ok(())
    }

    /// A thread's life: take jobs while there are any; wait for more; leave after
    /// `idle_exit` without one, with the queue empty.
    fn run(&self) {
        let mut state = self.lock();
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                // A job that panics must not take the thread (and the pool's count) with it;
                // the jobs of this crate catch their own panics and report them.
                let _ = catch_unwind(AssertUnwindSafe(job));
                state = self.lock();
                continue;
            }
            state.waiting += 1;
            let (next, timeout) = self
                .work
                .wait_timeout(state, self.idle_exit)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            state.waiting -= 1;
            if timeout.timed_out() && state.queue.is_empty() {
                state.threads -= 1;
                return;
            }
        }
    }

    /// Threads alive and threads waiting (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, usize) {
        let state = self.lock();
        (state.threads, state.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Instant;

    fn leak(pool: Pool) -> &'static Pool {
        Box::leak(Box::new(pool))
    }

    /// Waits until `cond` holds (at most 10 s).
    fn eventually(mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "condition not reached in 10 s");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn every_job_runs_through_bursts_pauses_and_idle_exits() {
        // The regression: rounds of concurrent jobs separated by pauses longer than the idle
        // exit used to strand queued jobs once the idle count had drifted. Every job must run.
        let pool = leak(Pool::with_idle_exit("t-burst", 3, Duration::from_millis(5)));
        let done = Arc::new(AtomicUsize::new(0));
        let mut expected = 0;
        for round in 0..40 {
            let (tx, rx) = mpsc::channel();
            let jobs = 1 + round % 7;
            for i in 0..jobs {
                let tx = tx.clone();
                let done = Arc::clone(&done);
                let job: Job = Box::new(move || {
                    if i % 3 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    tx.send(()).unwrap();
                });
                assert!(pool.execute(job).is_ok());
            }
            for _ in 0..jobs {
                rx.recv_timeout(Duration::from_secs(10))
                    .expect("a queued job never ran");
            }
            expected += jobs;
            if round % 4 == 0 {
                // Longer than the idle exit: threads leave meanwhile.
                std::thread::sleep(Duration::from_millis(12));
            }
        }
        assert_eq!(done.load(Ordering::SeqCst), expected);
        // With nothing to do, every thread leaves.
        eventually(|| pool.counts() == (0, 0));
    }

    #[test]
    fn never_more_threads_than_max_and_a_busy_pool_still_runs_queued_jobs() {
        let pool = leak(Pool::with_idle_exit("t-max", 2, Duration::from_secs(5)));
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for _ in 0..20 {
            let (running, peak, tx) = (Arc::clone(&running), Arc::clone(&peak), tx.clone());
            let job: Job = Box::new(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                tx.send(()).unwrap();
            });
            assert!(pool.execute(job).is_ok());
        }
        for _ in 0..20 {
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
        assert!(pool.counts().0 <= 2);
    }

    #[test]
    fn a_panicking_job_keeps_its_thread_and_the_pool_working() {
        let pool = leak(Pool::with_idle_exit("t-panic", 1, Duration::from_secs(5)));
        let job: Job = Box::new(|| panic!("job failed"));
        assert!(pool.execute(job).is_ok());
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            tx.send(std::thread::current().name().map(String::from))
                .unwrap();
        });
        assert!(pool.execute(job).is_ok());
        let name = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(name.as_deref(), Some("t-panic-1"));
        assert_eq!(pool.counts().0, 1);
    }

    #[test]
    fn a_waiting_thread_is_reused_rather_than_a_new_one_started() {
        let pool = leak(Pool::with_idle_exit("t-reuse", 4, Duration::from_secs(5)));
        for _ in 0..5 {
            let (tx, rx) = mpsc::channel();
            let job: Job = Box::new(move || tx.send(()).unwrap());
            assert!(pool.execute(job).is_ok());
            rx.recv_timeout(Duration::from_secs(10)).unwrap();
            eventually(|| pool.counts().1 == 1);
        }
        assert_eq!(pool.counts(), (1, 1));
    }
}
