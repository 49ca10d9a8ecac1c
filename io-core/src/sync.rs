//! Locks for zcrop's crates: `std::sync`'s, without poisoning, with `parking_lot`'s calling
//! convention (`lock()` returns the guard; a condition variable waits on `&mut guard`).
//!
//! Not `parking_lot` itself: its waiting threads queue in one process-wide table whose bucket
//! locks any thread may hold for a moment, and a child of `fork` inherits a bucket held by a
//! parent thread locked for ever; its next wait on an address of that bucket (or the table's
//! growth, which locks every bucket) never returns. `std`'s locks wait on their own word.
//! A lock that panicked while held is used as it is: every lock here guards counters or
//! queues that stay consistent between statements.

use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::time::Duration;

/// A mutual-exclusion lock (see the module).
#[derive(Debug, Default)]
pub struct Mutex<T>(std::sync::Mutex<T>);

/// The guard of a [`Mutex`]: the lock is held while it lives.
#[derive(Debug)]
pub struct MutexGuard<'a, T>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    /// A lock around `value`.
    pub const fn new(value: T) -> Self {
        Mutex(std::sync::Mutex::new(value))
    }

    /// Waits for the lock.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    /// The value, through `&mut self` (no locking).
    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value, consuming the lock.
    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> MutexGuard<'_, T> {
    fn held(&self) -> &std::sync::MutexGuard<'_, T> {
        match &self.0 {
            Some(g) => g,
            // Empty only inside `Condvar::wait*`, which holds the only `&mut` to it.
            None => unreachable!("a guard is empty only while a condition variable waits"),
        }
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.held()
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.0 {
            Some(g) => g,
            None => unreachable!("a guard is empty only while a condition variable waits"),
        }
    }
}

/// A condition variable for [`Mutex`] (see the module).
#[derive(Debug, Default)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    /// A condition variable no one waits on.
    pub const fn new() -> Self {
        Condvar(std::sync::Condvar::new())
    }

    /// Releases `guard`'s lock, waits for a notification (or a spurious wake-up) and takes the
    /// lock again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        if let Some(g) = guard.0.take() {
            guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
        }
    }

    /// [`Condvar::wait`], for at most `timeout`.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) {
        if let Some(g) = guard.0.take() {
            let (g, _) = self
                .0
                .wait_timeout(g, timeout)
                .unwrap_or_else(PoisonError::into_inner);
            guard.0 = Some(g);
        }
    }

    /// Wakes one waiting thread.
    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    /// Wakes every waiting thread.
    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_waiter_wakes_with_the_lock_held_again() {
        let pair = Arc::new((Mutex::new(0), Condvar::new()));
        let other = Arc::clone(&pair);
        let t = std::thread::spawn(move || {
            let (m, c) = &*other;
            *m.lock() = 1;
            c.notify_all();
        });
        let (m, c) = &*pair;
        let mut g = m.lock();
        while *g == 0 {
            c.wait_for(&mut g, Duration::from_millis(50));
        }
        *g += 1;
        drop(g);
        t.join().unwrap();
        assert_eq!(*m.lock(), 2);
    }

    #[test]
    fn a_panic_while_held_does_not_poison() {
        let m = Arc::new(Mutex::new(5));
        let other = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = other.lock();
            panic!("while holding the lock");
        })
        .join();
        assert_eq!(*m.lock(), 5);
    }
}
