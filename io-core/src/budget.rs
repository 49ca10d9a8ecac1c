//! One in-flight budget per process, shared by every engine, array and loader.
//!
//! Each physical read holds a [`Permit`] for one request and its length in bytes from the moment
//! it is issued until the consumer takes its result, so the memory held by reads that are
//! in flight or finished-but-unconsumed stays bounded. When the budget is spent, IO workers wait
//! (back-pressure) instead of allocating more. Several users of one process therefore share one
//! limit instead of multiplying their concurrency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::sync::{Condvar, Mutex};

use crate::fork::{self, PerProcess};

/// Default cap on requests in flight in one process (`ZCROP_IO_MAX_REQUESTS` overrides it).
pub const DEFAULT_MAX_REQUESTS: usize = 4096;
/// Default cap on bytes in flight in one process (`ZCROP_IO_MAX_BYTES` overrides it): 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

static GLOBAL: PerProcess<Arc<Budget>> = PerProcess::new();

/// A limit on requests and bytes in flight.
#[derive(Debug)]
pub struct Budget {
    max_requests: usize,
    max_bytes: u64,
    requests: AtomicUsize,
    bytes: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
    /// The process generation the budget was made in (see [`fork`]): in a child of `fork` it
    /// counts its parent's reads, which will never be released there.
    generation: u64,
    /// Whether this is a generation's [`Budget::global`].
    global: bool,
    /// The budget of the same limits that replaces this one in a child of `fork`.
    successor: PerProcess<Arc<Budget>>,
}

impl Budget {
    /// A budget of `max_requests` requests and `max_bytes` bytes (each at least 1).
    pub fn new(max_requests: usize, max_bytes: u64) -> Arc<Self> {
        Self::make(max_requests, max_bytes, false)
    }

    fn make(max_requests: usize, max_bytes: u64, global: bool) -> Arc<Self> {
        Arc::new(Budget {
            max_requests: max_requests.max(1),
            max_bytes: max_bytes.max(1),
            requests: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
            generation: fork::generation(),
            global,
            successor: PerProcess::new(),
        })
    }

    /// This budget, or in a child of `fork` the one that replaces it there: the child's own
    /// [`Budget::global`] for a parent's global budget, else one budget of the same limits per
    /// budget of the parent (so engines that shared one still share one).
    pub fn live(self: &Arc<Self>) -> Arc<Budget> {
        if self.generation == fork::generation() {
            Arc::clone(self)
        } else if self.global {
            Arc::clone(Budget::global())
        } else {
            Arc::clone(
                self.successor
                    .get_or_init(|| Budget::new(self.max_requests, self.max_bytes)),
            )
        }
    }

    /// The process-wide budget every engine uses unless given another. Its limits come from
    /// `ZCROP_IO_MAX_REQUESTS` and `ZCROP_IO_MAX_BYTES` when set, else the defaults. A child of
    /// `fork` gets a fresh one.
    pub fn global() -> &'static Arc<Budget> {
        GLOBAL.get_or_init(|| {
            let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
            Budget::make(
                env("ZCROP_IO_MAX_REQUESTS").map_or(DEFAULT_MAX_REQUESTS, |v| v as usize),
                env("ZCROP_IO_MAX_BYTES").unwrap_or(DEFAULT_MAX_BYTES),
                true,
            )
        })
    }

    /// How a permit of this budget refers to it: the global budget without a reference count
    /// (permits are made and merged for every read, on several threads at once; a shared count
    /// would be one contended atomic update more per read).
    fn holder(self: &Arc<Self>) -> Holder {
        match GLOBAL.get() {
            Some(g) if Arc::ptr_eq(g, self) => Holder::Global(g),
            _ => Holder::Shared(Arc::clone(self)),
        }
    }

    /// The request limit.
    pub fn max_requests(&self) -> usize {
        self.max_requests
    }

    /// The byte limit.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Requests and bytes held right now.
    pub fn in_flight(&self) -> (usize, u64) {
        (
            self.requests.load(Ordering::Acquire),
            self.bytes.load(Ordering::Acquire),
        )
    }

    /// Takes one request of `bytes` bytes if the budget allows it now. A read larger than the
    /// whole byte budget is admitted when nothing else holds bytes, so it cannot starve.
    pub fn try_acquire(self: &Arc<Self>, bytes: u64) -> Option<Permit> {
        self.try_acquire_many(1, bytes)
    }

    /// Takes `requests` requests and `bytes` bytes at once, all or nothing, if the budget allows
    /// it now: a reader that takes credit for its next reads in one update of the shared
    /// counters and hands it out with [`Permit::split`].
    pub fn try_acquire_many(self: &Arc<Self>, requests: usize, bytes: u64) -> Option<Permit> {
        let p = self.take(requests, bytes);
        if p.is_none() {
            // A request slot taken and given back may have let another waiter in.
            self.notify_waiters();
        }
        p
    }

    /// [`Budget::try_acquire_many`] without waking waiters on failure, for callers that hold
    /// `self.lock` (waking would lock it again).
    fn take(self: &Arc<Self>, requests: usize, bytes: u64) -> Option<Permit> {
        // Compare-and-swap, so the counters never exceed the limits, not even for an instant.
        self.requests
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r + requests <= self.max_requests).then_some(r + requests)
            })
            .ok()?;
        let took_bytes = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                let fits = b == 0 || b.saturating_add(bytes) <= self.max_bytes;
                fits.then_some(b.saturating_add(bytes))
            })
            .is_ok();
        if !took_bytes {
            self.requests.fetch_sub(requests, Ordering::AcqRel);
            return None;
        }
        Some(Permit {
            budget: self.holder(),
            requests,
            bytes,
        })
    }

    /// Waits until one request of `bytes` bytes fits, checking `give_up` now and then; returns
    /// `None` if `give_up` said so first (e.g. the engine is shutting down).
    pub fn acquire(self: &Arc<Self>, bytes: u64, give_up: impl Fn() -> bool) -> Option<Permit> {
        loop {
            if let Some(p) = self.try_acquire(bytes) {
                return Some(p);
            }
            if give_up() {
                return None;
            }
            let mut guard = self.lock.lock();
            self.waiters.fetch_add(1, Ordering::AcqRel);
            // Re-check under the lock: a release between the failed try and here notifies
            // under the same lock, so the wake-up cannot be lost. (`take`, not `try_acquire`:
            // its wake-up would lock `self.lock` again and deadlock.)
            if let Some(p) = self.take(1, bytes) {
                self.waiters.fetch_sub(1, Ordering::AcqRel);
                return Some(p);
            }
            // The request slot `take` took and gave back may let another waiter in.
            self.freed.notify_all();
            self.freed.wait_for(&mut guard, Duration::from_millis(20));
            self.waiters.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn release(&self, requests: usize, bytes: u64) {
        if requests == 0 && bytes == 0 {
            return;
        }
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.requests.fetch_sub(requests, Ordering::AcqRel);
        self.notify_waiters();
    }

    fn notify_waiters(&self) {
        // A parent's budget in a child of `fork` (its reads' permits dropped there): its
        // waiters are the parent's threads, and its lock may be held by one of them for ever.
        if self.waiters.load(Ordering::Acquire) > 0 && self.generation == fork::generation() {
            let _guard = self.lock.lock();
            self.freed.notify_all();
        }
    }
}

/// How a [`Permit`] refers to its budget.
#[derive(Debug)]
enum Holder {
    /// [`Budget::global`], which lives as long as the process.
    Global(&'static Budget),
    Shared(Arc<Budget>),
}

impl Holder {
    fn budget(&self) -> &Budget {
        match self {
            Holder::Global(b) => b,
            Holder::Shared(b) => b,
        }
    }

    fn same(&self, other: &Holder) -> bool {
        std::ptr::eq(self.budget(), other.budget())
    }

    fn share(&self) -> Holder {
        match self {
            Holder::Global(b) => Holder::Global(b),
            Holder::Shared(b) => Holder::Shared(Arc::clone(b)),
        }
    }
}

/// A share of a [`Budget`]: one request (or several, merged) and its bytes; released on drop.
#[derive(Debug)]
pub struct Permit {
    budget: Holder,
    requests: usize,
    bytes: u64,
}

impl Permit {
    /// Bytes this permit holds.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Requests this permit holds (1, or more after [`Permit::merge`]).
    pub fn requests(&self) -> usize {
        self.requests
    }

    /// Takes over `other`'s requests and bytes, to release them all at once (one update of the
    /// shared counters instead of one per request). Fails, returning `other`, if it belongs to
    /// another budget.
    pub fn merge(&mut self, mut other: Permit) -> Result<(), Permit> {
        if !self.budget.same(&other.budget) {
            return Err(other);
        }
        self.requests += std::mem::take(&mut other.requests);
        self.bytes += std::mem::take(&mut other.bytes);
        Ok(())
    }

    /// Splits one request of `bytes` bytes off this permit (credit taken ahead with
    /// [`Budget::try_acquire_many`]), if it holds that much; the shared counters are not
    /// touched.
    pub fn split(&mut self, bytes: u64) -> Option<Permit> {
        if self.requests == 0 || self.bytes < bytes {
            return None;
        }
        self.requests -= 1;
        self.bytes -= bytes;
        Some(Permit {
            budget: self.budget.share(),
            requests: 1,
            bytes,
        })
    }

    /// Re-charges the permit for `bytes` bytes, without waiting: for a read whose size was
    /// only an estimate when it was admitted (a whole object of unknown length), once the real
    /// size is known. The bytes are held already, so the budget counts them even past its
    /// limit (as it admits an oversized read); later requests wait until they are released.
    pub fn resize(&mut self, bytes: u64) {
        if bytes > self.bytes {
            self.budget
                .budget()
                .bytes
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
        } else if bytes < self.bytes {
            let budget = self.budget.budget();
            budget.bytes.fetch_sub(self.bytes - bytes, Ordering::AcqRel);
            budget.notify_waiters();
        }
        self.bytes = bytes;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.budget.budget().release(self.requests, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_requests_and_bytes() {
        let b = Budget::new(2, 100);
        let p1 = b.try_acquire(60).unwrap();
        assert!(b.try_acquire(60).is_none(), "bytes over the cap");
        let p2 = b.try_acquire(40).unwrap();
        assert!(b.try_acquire(0).is_none(), "requests over the cap");
        assert_eq!(b.in_flight(), (2, 100));
        drop(p1);
        assert_eq!(b.in_flight(), (1, 40));
        drop(p2);
        assert_eq!(b.in_flight(), (0, 0));
    }

    #[test]
    fn oversized_read_is_admitted_alone() {
        let b = Budget::new(10, 100);
        let big = b.try_acquire(1000).expect("nothing else in flight");
        assert!(b.try_acquire(1).is_none());
        drop(big);
        assert!(b.try_acquire(1).is_some());
    }

    #[test]
    fn acquire_waits_for_release() {
        let b = Budget::new(1, 10);
        let held = b.try_acquire(10).unwrap();
        let b2 = Arc::clone(&b);
        let waiter = std::thread::spawn(move || b2.acquire(10, || false).map(|p| p.bytes()));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "must wait while the budget is spent");
        drop(held);
        assert_eq!(waiter.join().unwrap(), Some(10));
    }

    /// A waiter that gets a request slot but not the bytes must not deadlock on the budget's
    /// own lock (it did: the failed re-check woke waiters while holding the lock). The scenario
    /// runs on its own thread so that a deadlock fails the test instead of hanging it.
    #[test]
    fn acquire_waits_for_bytes_without_deadlock() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let b = Budget::new(10, 100);
            let held = b.try_acquire(90).unwrap();
            let b2 = Arc::clone(&b);
            let waiter = std::thread::spawn(move || b2.acquire(50, || false).map(|p| p.bytes()));
            std::thread::sleep(Duration::from_millis(50));
            let waited = !waiter.is_finished();
            drop(held);
            tx.send((waited, waiter.join().unwrap())).unwrap();
        });
        let got = rx.recv_timeout(Duration::from_secs(20));
        assert_eq!(
            got,
            Ok((true, Some(50))),
            "the waiter must wait, then get the bytes"
        );
    }

    #[test]
    fn resize_recharges_without_waiting() {
        let b = Budget::new(10, 100);
        let mut p = b.try_acquire(10).unwrap();
        p.resize(150);
        assert_eq!(
            b.in_flight(),
            (1, 150),
            "the real size counts, past the limit"
        );
        assert!(
            b.try_acquire(1).is_none(),
            "nothing else fits while it is held"
        );
        p.resize(40);
        assert_eq!(b.in_flight(), (1, 40));
        assert!(b.try_acquire(60).is_some());
        drop(p);
        assert_eq!(b.in_flight(), (0, 0));
    }

    #[test]
    fn merged_permits_release_together() {
        let b = Budget::new(10, 100);
        let other = Budget::new(10, 100);
        let mut p = b.try_acquire(10).unwrap();
        p.merge(b.try_acquire(20).unwrap()).unwrap();
        p.merge(b.try_acquire(5).unwrap()).unwrap();
        assert_eq!((p.requests(), p.bytes()), (3, 35));
        assert_eq!(b.in_flight(), (3, 35), "merging releases nothing");
        let foreign = p.merge(other.try_acquire(7).unwrap()).unwrap_err();
        assert_eq!(
            other.in_flight(),
            (1, 7),
            "another budget's permit is handed back"
        );
        drop(foreign);
        assert_eq!(other.in_flight(), (0, 0));
        drop(p);
        assert_eq!(b.in_flight(), (0, 0), "all three released at once");
    }

    #[test]
    fn credit_is_taken_at_once_and_split_without_touching_the_counters() {
        let b = Budget::new(4, 100);
        let mut credit = b.try_acquire_many(3, 30).unwrap();
        assert_eq!(b.in_flight(), (3, 30));
        assert!(b.try_acquire_many(2, 10).is_none(), "all or nothing");
        assert_eq!(b.in_flight(), (3, 30), "a refused request takes nothing");
        let one = credit.split(10).unwrap();
        let two = credit.split(15).unwrap();
        assert!(credit.split(10).is_none(), "5 bytes are left");
        assert_eq!((credit.requests(), credit.bytes()), (1, 5));
        assert_eq!(b.in_flight(), (3, 30), "splitting moves nothing");
        drop(one);
        assert_eq!(b.in_flight(), (2, 20));
        drop(credit);
        assert_eq!(b.in_flight(), (1, 15));
        drop(two);
        assert_eq!(b.in_flight(), (0, 0));
        let mut last = b.try_acquire_many(1, 10).unwrap();
        assert!(last.split(0).is_some());
        assert!(last.split(0).is_none(), "no request left");
    }

    #[test]
    fn permits_of_the_global_budget_merge_only_with_each_other() {
        let g = Budget::global();
        let mut a = g.try_acquire(1).unwrap();
        a.merge(g.try_acquire(2).unwrap()).unwrap();
        let mut credit = g.try_acquire_many(2, 6).unwrap();
        a.merge(credit.split(3).unwrap()).unwrap();
        assert_eq!((a.requests(), a.bytes()), (3, 6));
        let other = Budget::new(1, 10);
        let foreign = a.merge(other.try_acquire(4).unwrap()).unwrap_err();
        drop(foreign);
        assert_eq!(other.in_flight(), (0, 0));
        let mut o = other.try_acquire(1).unwrap();
        assert!(
            o.merge(credit).is_err(),
            "a global permit does not join another budget's"
        );
    }

    #[test]
    fn acquire_gives_up() {
        let b = Budget::new(1, 10);
        let _held = b.try_acquire(1).unwrap();
        assert!(b.acquire(1, || true).is_none());
    }
}
