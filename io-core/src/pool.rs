//! Recycled read buffers.
//!
//! Every read needs a fresh buffer that is handed to the consumer as `Bytes`. Allocating it
//! with `malloc` each time costs more than the read on cached data: glibc returns freed memory
//! to the kernel and the next read faults it back in, zeroed (30% of the CPU of 64 KiB reads in
//! a profile). Buffers come from per-size-class pools instead and go back when the consumer
//! drops the last `Bytes` that views them. Each class holds a bounded number of buffers, and
//! hands out the one freed last: it is the most likely to still be in the CPU cache, which the
//! next read copies into.

use std::sync::OnceLock;

use parking_lot::Mutex;

/// Smallest pooled size (4 KiB); smaller reads use a 4 KiB buffer.
const MIN_SHIFT: u32 = 12;
/// Largest pooled size (4 MiB); larger reads are allocated and freed normally.
const MAX_SHIFT: u32 = 22;
/// Bytes each class may hold.
const CLASS_BYTES: usize = 16 << 20;

/// One size class: a stack of free buffers and how many it may hold.
struct Class {
    free: Mutex<Vec<Vec<u8>>>,
    limit: usize,
}

struct Pools {
    classes: Vec<Class>,
}

fn pools() -> &'static Pools {
    static POOLS: OnceLock<Pools> = OnceLock::new();
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

/// An empty vector with room for at least `len` bytes.
pub(crate) fn take(len: usize) -> Vec<u8> {
    match class(len) {
        Some(c) => pools().classes[c]
            .free
            .lock()
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(1 << (c as u32 + MIN_SHIFT))),
        None => Vec::with_capacity(len),
    }
}

/// Returns a vector from [`take`] to its pool (or frees it if the pool is full).
pub(crate) fn give(mut v: Vec<u8>) {
    let cap = v.capacity();
    if cap.is_power_of_two()
        && let Some(c) = class(cap)
        && cap == 1 << (c as u32 + MIN_SHIFT)
    {
        v.clear();
        let class = &pools().classes[c];
        let mut free = class.free.lock();
        if free.len() < class.limit {
            free.push(v);
        }
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
        let v = take(10_000);
        assert!(v.capacity() >= 10_000 && v.is_empty());
        give(v);
        let again = take(12_000);
        assert!(again.capacity() >= 12_000 && again.is_empty());
        // Odd capacities are not pooled.
        give(Vec::with_capacity(5000));
    }
}
