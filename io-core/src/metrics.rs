//! Counters an engine keeps, for benchmarks and tests that count IO.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters of one engine.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) requests: AtomicU64,
    pub(crate) physical_reads: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) fast_path_hits: AtomicU64,
    pub(crate) fast_path_misses: AtomicU64,
    pub(crate) ring_enters: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) short_read_resubmits: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) direct_fallbacks: AtomicU64,
}

macro_rules! snapshot_fields {
    ($($f:ident),*) => {
        impl Metrics {
            pub(crate) fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $($f: self.$f.load(Ordering::Relaxed)),* }
            }
        }
    };
}
snapshot_fields!(
    requests,
    physical_reads,
    bytes_read,
    fast_path_hits,
    fast_path_misses,
    ring_enters,
    retries,
    short_read_resubmits,
    errors,
    direct_fallbacks
);

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// A copy of an engine's counters at one moment. Subtract two snapshots to measure a span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Requests submitted by callers.
    pub requests: u64,
    /// Reads issued to the OS after coalescing and deduplication (one per physical read, not per
    /// syscall: a short read completed by a second syscall still counts once).
    pub physical_reads: u64,
    /// Bytes read from files (including coalescing holes and `O_DIRECT` rounding).
    pub bytes_read: u64,
    /// Reads served straight from the page cache by `preadv2(RWF_NOWAIT)`.
    pub fast_path_hits: u64,
    /// `RWF_NOWAIT` attempts that found the data not cached and went to the ring.
    pub fast_path_misses: u64,
    /// `io_uring_enter` calls (submissions and waits).
    pub ring_enters: u64,
    /// Reads retried after `EINTR` or `EAGAIN`.
    pub retries: u64,
    /// Short reads completed by reading the rest.
    pub short_read_resubmits: u64,
    /// Requests that ended in an error.
    pub errors: u64,
    /// Files that refused `O_DIRECT` and were read buffered instead.
    pub direct_fallbacks: u64,
}

impl std::ops::Sub for MetricsSnapshot {
    type Output = MetricsSnapshot;
    fn sub(self, rhs: Self) -> Self {
        MetricsSnapshot {
            requests: self.requests - rhs.requests,
            physical_reads: self.physical_reads - rhs.physical_reads,
            bytes_read: self.bytes_read - rhs.bytes_read,
            fast_path_hits: self.fast_path_hits - rhs.fast_path_hits,
            fast_path_misses: self.fast_path_misses - rhs.fast_path_misses,
            ring_enters: self.ring_enters - rhs.ring_enters,
            retries: self.retries - rhs.retries,
            short_read_resubmits: self.short_read_resubmits - rhs.short_read_resubmits,
            errors: self.errors - rhs.errors,
            direct_fallbacks: self.direct_fallbacks - rhs.direct_fallbacks,
        }
    }
}
