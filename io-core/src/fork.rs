//! Process generations: what makes zcrop's state safe to use after `fork`.
//!
//! A child of `fork` gets a copy of its parent's memory but only the thread that forked: the
//! IO rings, thread pools and runtimes of the parent are gone from it, and a lock that one of
//! their threads held at that moment stays locked for ever. So state that owns threads or
//! locks records the *generation* it was built in, a fork handler counts the child one
//! generation on, and state of an older generation is never used or dropped:
//!
//! - [`PerProcess`] holds a value of the current generation, built on first use in each
//!   process (process-wide engines, pools, runtimes, caches);
//! - [`ProcessBound`] owns a value that is dropped only in the generation that made it; in a
//!   later one it is leaked, since dropping it would join threads that do not exist or take
//!   locks no one will release. The memory is the parent's, copied on write: leaking it costs
//!   the child nothing it did not already have.
//!
//! Objects that outlive a fork (an array opened in the parent and read in the child) use the
//! two together: they keep their parent's parts bound and build their own on first use.

#![allow(unsafe_code)]

use std::mem::ManuallyDrop;
use std::ops::Deref;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

/// The generation of this process: 0 in a process not forked since zcrop first ran, one more
/// in each child of `fork`.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Counts a child one generation on; runs in the child, right after `fork`, before anything
/// else (only an atomic update: the one thing that is safe there).
extern "C" fn forked() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current generation. The first call registers the fork handler, so every value made
/// with a generation from here is told apart from its copies in later children.
pub fn generation() -> u64 {
    static WATCH: Once = Once::new();
    WATCH.call_once(|| crate::sys::on_fork_in_child(forked));
    GENERATION.load(Ordering::Relaxed)
}

/// A value of the current process generation, built on first use in each: the process-wide
/// state that threads or locks belong to. Like `OnceLock`, but a child of `fork` does not see
/// its parent's value (which stays in memory, unused); it builds its own.
#[derive(Debug)]
pub struct PerProcess<T> {
    slot: AtomicPtr<Slot<T>>,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u64,
    value: T,
}

// SAFETY: like `OnceLock<T>`: the value is shared by reference between threads (so `T: Sync`)
// and may be dropped on another thread than the one that built it (so `T: Send`).
unsafe impl<T: Send + Sync> Sync for PerProcess<T> {}
// SAFETY: moving the holder moves the value with it.
unsafe impl<T: Send> Send for PerProcess<T> {}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> PerProcess<T> {
    /// An empty holder.
    pub const fn new() -> Self {
        PerProcess {
            slot: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This generation's value, if one was built.
    pub fn get(&self) -> Option<&T> {
        let now = generation();
        let slot = self.slot.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in `slot` came from `Box::into_raw` below and is freed only
        // by `Drop`, which has `&mut self`: it is valid for as long as `&self` is.
        unsafe { slot.as_ref() }
            .filter(|s| s.generation == now)
            .map(|s| &s.value)
    }

    /// This generation's value, built by `init` if there is none. Threads that race to build
    /// it each run `init`; one value is kept, the others dropped.
    pub fn get_or_init(&self, init: impl FnOnce() -> T) -> &T {
        match self.get_or_try_init(|| Ok::<T, std::convert::Infallible>(init())) {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// [`PerProcess::get_or_init`] with an `init` that may fail (nothing is kept then).
    pub fn get_or_try_init<E>(&self, init: impl FnOnce() -> Result<T, E>) -> Result<&T, E> {
        if let Some(v) = self.get() {
            return Ok(v);
        }
        let now = generation();
        let fresh = Box::into_raw(Box::new(Slot {
            generation: now,
            value: init()?,
        }));
        let mut seen = self.slot.load(Ordering::Acquire);
        loop {
            // SAFETY: as in `get`: a non-null pointer read from `slot` is a live `Slot`.
            if let Some(s) = unsafe { seen.as_ref() }
                && s.generation == now
            {
                // Another thread built this generation's value first: keep theirs.
                // SAFETY: `fresh` came from `Box::into_raw` above and was never shared.
                drop(unsafe { Box::from_raw(fresh) });
                return Ok(&s.value);
            }
            match self
                .slot
                .compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // An older generation's slot is left where it is (leaked): see the module.
                // SAFETY: `fresh` is now owned by `slot`, freed only by `Drop`.
                Ok(_) => return Ok(unsafe { &(*fresh).value }),
                Err(now_there) => seen = now_there,
            }
        }
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let slot = *self.slot.get_mut();
        if slot.is_null() {
            return;
        }
        // SAFETY: a non-null pointer in `slot` came from `Box::into_raw` and is owned by `self`.
        let slot = unsafe { Box::from_raw(slot) };
        if slot.generation != generation() {
            // Built by a parent process: see the module.
            std::mem::forget(slot);
        }
    }
}

/// A value dropped only in the process generation that made it, leaked in later ones (see the
/// module): for anything that owns threads, or locks that other threads take.
#[derive(Debug)]
pub struct ProcessBound<T> {
    generation: u64,
    value: ManuallyDrop<T>,
}

impl<T> ProcessBound<T> {
    /// Binds `value` to the current generation.
    pub fn new(value: T) -> Self {
        ProcessBound {
            generation: generation(),
            value: ManuallyDrop::new(value),
        }
    }

    /// Whether the value was made in this process generation (so it may be used).
    pub fn is_current(&self) -> bool {
        self.generation == generation()
    }
}

impl<T: Clone> Clone for ProcessBound<T> {
    /// A clone belongs to the same generation as the original.
    fn clone(&self) -> Self {
        ProcessBound {
            generation: self.generation,
            value: self.value.clone(),
        }
    }
}

impl<T> Deref for ProcessBound<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> Drop for ProcessBound<T> {
    fn drop(&mut self) {
        if self.is_current() {
            // SAFETY: `value` is dropped here once, and never used again.
            unsafe { ManuallyDrop::drop(&mut self.value) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    /// Counts its drops.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn per_process_builds_once_per_generation() {
        let holder: PerProcess<u32> = PerProcess::new();
        assert!(holder.get().is_none());
        let builds = AtomicUsize::new(0);
        let build = || {
            builds.fetch_add(1, Ordering::SeqCst);
            7
        };
        assert_eq!(*holder.get_or_init(build), 7);
        assert_eq!(*holder.get_or_init(build), 7);
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(holder.get(), Some(&7));
        let empty: PerProcess<u32> = PerProcess::new();
        assert_eq!(empty.get_or_try_init(|| Err("no")), Err("no"));
        assert!(empty.get().is_none(), "a failed build keeps nothing");
    }

    #[test]
    fn racing_builders_keep_one_value_and_drop_the_rest() {
        let drops = Arc::new(AtomicUsize::new(0));
        let holder: PerProcess<Counted> = PerProcess::new();
        let kept: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let v = holder.get_or_init(|| Counted(Arc::clone(&drops)));
                        std::ptr::from_ref(v) as usize
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            kept.windows(2).all(|w| w[0] == w[1]),
            "every thread sees one value"
        );
        let built = drops.load(Ordering::SeqCst);
        drop(holder);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            built + 1,
            "the kept one drops last"
        );
    }

    #[test]
    fn process_bound_drops_in_its_generation() {
        let drops = Arc::new(AtomicUsize::new(0));
        let bound = ProcessBound::new(Counted(Arc::clone(&drops)));
        assert!(bound.is_current());
        drop(bound);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }
}
