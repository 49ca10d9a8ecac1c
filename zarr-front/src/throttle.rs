//! A bound on decode tasks spawned and not yet finished.
//!
//! The read loop takes each chunk's bytes from `zcrop-io` as they arrive and spawns a decode
//! task for them. On cached data the reads outrun the decoders, and without a bound the whole
//! batch's encoded bytes would be read before most of it is decoded: hundreds of MiB of read
//! buffers waiting in the pool's queue, long out of the CPU caches when their turn comes, and
//! churning through the allocator. With the bound, the loop stops taking results while the
//! decoders are busy, which in turn stops `zcrop-io` a bounded distance ahead (its read-ahead
//! counts results not yet taken), so each chunk is read shortly before it is decoded.
//!
//! A thread of the rayon pool that has to wait (a read run inside `ThreadPool::install`) runs
//! pool tasks meanwhile instead of blocking, so a pool of one thread still makes progress.
//!
//! Decode tasks run on the rayon pool of the thread that reads when it is a pool thread (a
//! loader's own pool), else on zcrop's decode pool: never on rayon's global pool, which a
//! child of `fork` inherits without its threads and cannot replace.

use zcrop_io::EngineError;
use zcrop_io::fork::PerProcess;
use zcrop_io::sync::{Condvar, Mutex};

/// The process's decode threads, one per core, started on first use (in each process).
fn own_pool() -> Result<&'static rayon::ThreadPool, EngineError> {
    static POOL: PerProcess<rayon::ThreadPool> = PerProcess::new();
    POOL.get_or_try_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("zcrop-decode-{i}"))
            .build()
            .map_err(|e| EngineError::Spawn(std::io::Error::other(e)))
    })
}

/// Threads that decode the chunks of reads made from this thread: those of the rayon pool it
/// runs on, else those of zcrop's decode pool (one per core).
pub fn decode_threads() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        own_pool().map_or(1, rayon::ThreadPool::current_num_threads)
    }
}

/// Runs `op` on the pool decode tasks from this thread run on (see the module), so rayon's
/// parallel iterators inside it use zcrop's threads: never rayon's global pool, which a child
/// of `fork` inherits without its threads.
pub fn on_decode_pool<R: Send>(op: impl FnOnce() -> R + Send) -> Result<R, EngineError> {
    if rayon::current_thread_index().is_some() {
        Ok(op())
    } else {
        Ok(own_pool()?.install(op))
    }
}

/// `rayon::in_place_scope` on the pool decode tasks spawned from this thread run on (see the
/// module): `op` runs on this thread, its spawns on that pool.
pub(crate) fn decode_scope<'scope, R>(
    op: impl FnOnce(&rayon::Scope<'scope>) -> R,
) -> Result<R, EngineError> {
    if rayon::current_thread_index().is_some() {
        Ok(rayon::in_place_scope(op))
    } else {
        Ok(own_pool()?.in_place_scope(op))
    }
}

/// Decode tasks allowed in flight per decode thread. A waiting reader refills when half of
/// them have finished: enough that decoders do not run dry, few enough to bound the memory of
/// results waiting to be decoded.
pub(crate) const TASKS_PER_THREAD: usize = 64;

/// Counts tasks in flight; when `limit` are, [`Throttle::acquire`] waits until half of them
/// have finished.
#[derive(Debug)]
pub(crate) struct Throttle {
    in_flight: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

/// One task's place; frees it when dropped (also when the task unwinds).
#[derive(Debug)]
pub(crate) struct Slot<'a>(&'a Throttle);

impl Throttle {
    /// A throttle allowing `limit` tasks (at least 1) at once.
    pub(crate) fn new(limit: usize) -> Self {
        Throttle {
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            limit: limit.max(1),
        }
    }

    /// A throttle for the pool of [`decode_scope`]: [`TASKS_PER_THREAD`] per thread.
    pub(crate) fn for_decode_threads() -> Self {
        Self::new(TASKS_PER_THREAD * decode_threads())
    }

    /// Takes a place, first waiting (see [`Throttle`]) if `limit` tasks are in flight.
    pub(crate) fn acquire(&self) -> Slot<'_> {
        loop {
            let mut n = self.in_flight.lock();
            if *n < self.limit {
                *n += 1;
                return Slot(self);
            }
            if rayon::current_thread_index().is_none() {
                // Not a pool thread: sleep until half the tasks have finished, then refill in
                // one go (waking on every finished task costs a context switch per task).
                while *n > self.low() {
                    self.freed.wait(&mut n);
                }
                *n += 1;
                return Slot(self);
            }
            drop(n);
            // A pool thread: run a task (perhaps one of ours) instead of blocking the pool;
            // if there is none to run, the tasks in flight run on other threads: wait for one.
            if !matches!(rayon::yield_now(), Some(rayon::Yield::Executed)) {
                let mut n = self.in_flight.lock();
                if *n > self.low() {
                    self.freed.wait(&mut n);
                }
            }
        }
    }

    /// The count a waiting thread waits for.
    fn low(&self) -> usize {
        self.limit / 2
    }

    /// Tasks in flight now.
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        *self.in_flight.lock()
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut n = self.0.in_flight.lock();
        *n -= 1;
        let wake = *n == self.0.low();
        drop(n);
        if wake {
            self.0.freed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Spawns `tasks` tasks through the throttle from the calling thread and returns the most
    /// that ever ran at once.
    fn peak_in_flight(limit: usize, tasks: usize) -> usize {
        let throttle = Throttle::new(limit);
        let running = AtomicUsize::new(0);
        let peak = AtomicUsize::new(0);
        rayon::in_place_scope(|scope| {
            for _ in 0..tasks {
                let slot = throttle.acquire();
                let (running, peak) = (&running, &peak);
                scope.spawn(move |_| {
                    let _slot = slot;
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    running.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(throttle.in_flight(), 0, "every slot is given back");
        peak.into_inner()
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn never_more_than_the_limit_in_flight() {
        let peak = pool(4).install(|| peak_in_flight(2, 64));
        assert!(peak <= 2, "peak {peak} tasks at once with a limit of 2");
        // Outside the pool, the caller blocks instead of running tasks.
        let peak = std::thread::scope(|s| s.spawn(|| peak_in_flight(3, 64)).join().unwrap());
        assert!(peak <= 3, "peak {peak} tasks at once with a limit of 3");
    }

    #[test]
    fn a_pool_of_one_thread_runs_the_tasks_while_it_waits() {
        // Would never return if the only pool thread blocked waiting for its own tasks.
        let peak = pool(1).install(|| peak_in_flight(1, 32));
        assert_eq!(peak, 1);
    }

    #[test]
    fn a_task_that_panics_gives_its_slot_back() {
        let throttle = Throttle::new(1);
        let slot = throttle.acquire();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _slot = slot;
            panic!("decode failed");
        }));
        assert!(r.is_err());
        assert_eq!(throttle.in_flight(), 0);
        drop(throttle.acquire());
    }
}
