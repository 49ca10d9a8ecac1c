//! Counters an engine keeps, for benchmarks and tests that count IO.
//!
//! Threads count into their own [`Counters`] and publish them in bulk, so busy threads do not
//! fight over shared cache lines for every read.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[$doc:meta])* $f:ident),* $(,)?) => {
        /// Counts of one thread, not yet published.
        #[derive(Debug, Clone, Copy, Default)]
        pub(crate) struct Counters {
            $(pub(crate) $f: u64,)*
        }

        /// Live counters of one engine.
        #[derive(Debug, Default)]
        pub(crate) struct Metrics {
            $($f: AtomicU64,)*
        }

        impl Metrics {
            /// Adds `c` to the engine's counters and zeroes it.
            pub(crate) fn publish(&self, c: &mut Counters) {
                $(if c.$f != 0 {
                    self.$f.fetch_add(c.$f, Ordering::Relaxed);
                })*
                *c = Counters::default();
            }

            pub(crate) fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot { $($f: self.$f.load(Ordering::Relaxed)),* }
            }
        }

        /// A copy of an engine's counters at one moment. Subtract two snapshots to measure a
        /// span. Counts reach the snapshot when the threads that made them publish (at the
        /// latest when the results they concern are delivered).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct MetricsSnapshot {
            $($(#[$doc])* pub $f: u64,)*
        }

        impl std::ops::Sub for MetricsSnapshot {
            type Output = MetricsSnapshot;
            fn sub(self, rhs: Self) -> Self {
                MetricsSnapshot { $($f: self.$f - rhs.$f),* }
            }
        }
    };
}

counters!(
    /// Batches submitted by callers ([`crate::IoEngine::submit`] and `submit_mapped` calls).
    batches,
    /// Requests submitted by callers.
    requests,
    /// Reads issued to the OS after coalescing and deduplication (one per physical read, not
    /// per syscall: a short read completed by a second syscall still counts once).
    physical_reads,
    /// Bytes read from files (including coalescing holes and `O_DIRECT` rounding).
    bytes_read,
    /// Reads served straight from the page cache by `preadv2(RWF_NOWAIT)` (by an IO worker or
    /// by a consumer helping while it waits).
    fast_path_hits,
    /// `RWF_NOWAIT` attempts that found the data not cached and went to the device.
    fast_path_misses,
    /// Reads served from a mapping of their file (`IoEngine::submit_mapped`), without a copy.
    mapped_reads,
    /// Queued reads skipped because their batch had been dropped.
    skipped_reads,
    /// `io_uring_enter` calls (submissions and waits).
    ring_enters,
    /// Reads retried after `EINTR` or `EAGAIN`.
    retries,
    /// Short reads completed by reading the rest.
    short_read_resubmits,
    /// Requests that ended in an error.
    errors,
    /// Files that refused `O_DIRECT` and were read buffered instead.
    direct_fallbacks,
    /// Times a thread that kept reading one file opened its own copy of it to read through
    /// (see io-core's `OpenFile::reopen`).
    own_files,
);
