//! Recycled read buffers.
//!
//! Kept rather than plain allocation: faster with glibc, and with mimalloc after a pause
//! between batches (docs/performance.md, "Own components and why").
//!
//! Every read needs a fresh buffer that is handed to the consumer as `Bytes`. Allocating it
//! each time can cost more than the read on cached data: an allocator returns freed memory to
//! the kernel and the next read faults it back in, zeroed, and glibc frees buffers allocated by
//! another thread slowly. Buffers come from per-size-class pools instead and go back when the
//! consumer drops the last `Bytes` that views them. Each class holds a bounded number of buffers, and
//! hands out the one freed last: it is the most likely to still be in the CPU cache, which the
//! next read copies into.
//!
//! Small classes (up to 64 KiB) also keep a few buffers per thread, so a thread that reads and
//! frees many small buffers does not take a lock shared with the other threads each time. A thread's
//! cache refills from and spills to the shared class in runs of [`local_batch`] buffers; it
//! goes back to the shared classes when the thread exits.

use std::cell::RefCell;

use crate::sync::Mutex;

use crate::fork::PerProcess;

/// Smallest pooled size (4 KiB); smaller reads use a 4 KiB buffer.
const MIN_SHIFT: u32 = 12;
/// Largest pooled size (4 MiB); larger reads are allocated and freed normally.
const MAX_SHIFT: u32 = 22;
/// Bytes each class may hold.
const CLASS_BYTES: usize = 16 << 20;
/// Largest class kept in the per-thread caches (64 KiB).
const LOCAL_MAX_SHIFT: u32 = 16;
/// Bytes each per-thread class may hold.
const LOCAL_BYTES: usize = 256 << 10;

/// One size class: a stack of free buffers and how many it may hold.
struct Class {
    free: Mutex<Vec<Vec<u8>>>,
    limit: usize,
}

struct Pools {
    classes: Vec<Class>,
}

/// The process's pools; a child of `fork` starts with empty ones (a class lock a parent thread
/// held at the fork would never be released).
fn pools() -> &'static Pools {
    static POOLS: PerProcess<Pools> = PerProcess::new();
    POOLS.get_or_init(|| Pools {
        classes: (MIN_SHIFT..=MAX_SHIFT)
            .map(|shift| Class {
                free: Mutex::new(Vec::new()),
                limit: (CLASS_BYTES >> shift).max(4),
            })
            .collect(),
    })
}

/// The class of a buffer of `len` bytes, if pooled.
fn class(len: usize) -> Option<usize> {
    let shift = len
        .max(1)
        .next_power_of_two()
        .trailing_zeros()
        .max(MIN_SHIFT);
    (shift <= MAX_SHIFT).then(|| (shift - MIN_SHIFT) as usize)
}

/// Buffers a thread's cache of class `c` moves to or from the shared class at once (the cache
/// holds up to twice as many); 0 for classes not cached per thread.
fn local_batch(c: usize) -> usize {
    let shift = c as u32 + MIN_SHIFT;
    if shift > LOCAL_MAX_SHIFT {
        0
    } else {
        (LOCAL_BYTES >> shift) / 2
    }
}

/// One thread's buffers, per class; handed back to the shared classes when the thread exits.
struct LocalCache {
    classes: Vec<Vec<Vec<u8>>>,
}

impl Drop for LocalCache {
    fn drop(&mut self) {
        for (c, bufs) in self.classes.iter_mut().enumerate() {
            spill(c, bufs.drain(..));
        }
    }
}

thread_local! {
    static LOCAL: RefCell<LocalCache> = const { RefCell::new(LocalCache { classes: Vec::new() }) };
}

/// Moves `bufs` into the shared class `c`, freeing those it has no room for.
fn spill(c: usize, bufs: impl Iterator<Item = Vec<u8>>) {
    let class = &pools().classes[c];
    let mut free = class.free.lock();
    for v in bufs {
        if free.len() < class.limit {
            free.push(v);
        }
    }
}

/// Runs `f` on this thread's cache of class `c`; `None` when the thread is exiting (its cache
/// is gone) or already inside `f`.
fn with_local<R>(c: usize, f: impl FnOnce(&mut Vec<Vec<u8>>) -> R) -> Option<R> {
    LOCAL
        .try_with(|cell| {
            let mut cache = cell.try_borrow_mut().ok()?;
            if cache.classes.len() <= c {
                cache.classes.resize_with(c + 1, Vec::new);
            }
            Some(f(&mut cache.classes[c]))
        })
        .ok()
        .flatten()
}

/// An empty vector with room for at least `len` bytes; `None` if a new one is needed and the
/// memory cannot be had.
pub(crate) fn try_take(len: usize) -> Option<Vec<u8>> {
    let Some(c) = class(len) else {
        return with_capacity(len);
    };
    let batch = local_batch(c);
    let from_thread = if batch > 0 {
        with_local(c, |mine| {
            if mine.is_empty() {
                // Refill: the shared class's most recently freed buffers, in their order.
                let mut free = pools().classes[c].free.lock();
                let from = free.len().saturating_sub(batch);
                mine.extend(free.drain(from..));
            }
            mine.pop()
        })
    } else {
        None
    };
    // Not cached per thread (or the thread is exiting): straight from the shared class.
    let reused = from_thread.unwrap_or_else(|| pools().classes[c].free.lock().pop());
    match reused {
        Some(v) => Some(v),
        None => with_capacity(1 << (c as u32 + MIN_SHIFT)),
    }
}

/// A new empty vector with room for exactly `len` bytes, or `None`.
fn with_capacity(len: usize) -> Option<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).ok()?;
    Some(v)
}

/// Returns a vector from [`take`] to its pool (or frees it if the pool is full).
pub(crate) fn give(mut v: Vec<u8>) {
    let cap = v.capacity();
    let Some(c) = class(cap).filter(|&c| cap == 1 << (c as u32 + MIN_SHIFT)) else {
        return; // Not a pooled size: freed.
    };
    v.clear();
    let batch = local_batch(c);
    let mut v = Some(v);
    if batch > 0 {
        with_local(c, |mine| {
            mine.extend(v.take());
            if mine.len() > 2 * batch {
                // Spill the oldest half; the most recently freed stay with this thread.
                spill(c, mine.drain(..batch));
            }
        });
    }
    // Not cached per thread, or the thread's cache is gone (the thread is exiting).
    if let Some(v) = v {
        spill(c, std::iter::once(v));
    }
}

/// A filled pooled vector, handed out as the owner of `Bytes`; goes back to the pool on drop.
pub(crate) struct Pooled(pub(crate) Vec<u8>);

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_and_reuse() {
        assert_eq!(class(1), Some(0));
        assert_eq!(class(4096), Some(0));
        assert_eq!(class(4097), Some(1));
        assert_eq!(class(4 << 20), Some(10));
        assert_eq!(class((4 << 20) + 1), None);
        let v = try_take(10_000).unwrap();
        assert!(v.capacity() >= 10_000 && v.is_empty());
        give(v);
        let again = try_take(12_000).unwrap();
        assert!(again.capacity() >= 12_000 && again.is_empty());
        // Odd capacities are not pooled.
        give(Vec::with_capacity(5000));
    }

    fn local_len(c: usize) -> usize {
        with_local(c, |mine| mine.len()).unwrap()
    }

    #[test]
    fn thread_cache_is_lifo_and_bounded() {
        // On a thread of its own: its cache starts empty and no other test touches it.
        std::thread::spawn(|| {
            let c = class(8192).unwrap();
            let batch = local_batch(c);
            assert!(batch >= 2, "8 KiB buffers are cached per thread");
            assert_eq!(
                local_batch(class(1 << 20).unwrap()),
                0,
                "1 MiB ones are not"
            );
            let v = try_take(8192).unwrap();
            let p = v.as_ptr();
            give(v);
            let again = try_take(8000).unwrap();
            assert_eq!(again.as_ptr(), p, "the buffer freed last comes back first");
            give(again);
            let held: Vec<Vec<u8>> = (0..=2 * batch).map(|_| try_take(8192).unwrap()).collect();
            let before = local_len(c);
            for v in held {
                give(v);
                assert!(local_len(c) <= 2 * batch, "the thread cache stays bounded");
            }
            assert_eq!(
                local_len(c),
                (before + 2 * batch + 1) - batch,
                "one spill of the oldest half"
            );
        })
        .join()
        .unwrap();
    }
}
