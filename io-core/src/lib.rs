//! # zcrop-io: batched byte-range reads
//!
//! **Job:** turn huge batches of `(file, byte range)` reads into as few syscalls as possible and
//! keep the storage device saturated: Linux io_uring rings owned by IO threads, a portable
//! `pread` thread-pool fallback, coalescing of nearby ranges, and one in-flight budget shared
//! by every user in the process. Batches whose consumer allows it
//! ([`IoEngine::submit_mapped`]) are served from read-only file mappings without any copy
//! where their data is already in memory ([`MapFiles`]).
//!
//! **Must not know about:** Zarr, chunks, codecs, arrays or crops. Callers hand it byte ranges
//! tagged with their own ids and get bytes back.
//!
//! ## Use
//!
//! ```no_run
//! use zcrop_io::{IoEngine, ReadRange, ReadRequest};
//!
//! let engine = IoEngine::shared()?; // io_uring where it works, else pread; one per process
//! let reqs = vec![
//!     ReadRequest::new(0, std::path::Path::new("shard.bin"), ReadRange::Suffix(16 * 64 + 4)),
//!     ReadRequest::new(1, std::path::Path::new("shard.bin"), ReadRange::new(4096, 32 * 1024)),
//! ];
//! for done in engine.submit(reqs) {
//!     // Each result arrives as soon as it is read, tagged with its id.
//!     let bytes = done.result?;
//!     println!("request {} gave {} bytes", done.id, bytes.len());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Object stores
//!
//! [`ObjectEngine`] serves the same batch API from S3 and S3-compatible stores, Google Cloud
//! Storage, Azure Blob Storage and plain HTTP(S): requests name object keys under the URL the
//! engine was opened on, ranges are coalesced with larger gaps ([`CoalesceLimits::OBJECT`]),
//! GETs run concurrently under the same [`Budget`], transient failures are retried with
//! backoff. See the [`object`] module.
//!
//! ## Unsafe code
//!
//! Only four modules contain `unsafe`: `sys` (syscalls, the buffers the kernel fills, file
//! mappings), `uring` (handing those buffers to io_uring), `mapguard` (the `SIGBUS` handler
//! that keeps a truncated mapped file from killing the process) and [`fork`] (state of one
//! process generation, held by pointer). Every block carries a `// SAFETY:` comment.

pub mod budget;
pub mod coalesce;
mod config;
mod engine;
pub mod error;
mod files;
pub mod fork;
mod metrics;
pub mod object;
mod pool;
mod range;
pub mod request;
pub mod sync;
mod sys;
mod worker;

pub use budget::{Budget, Permit};
pub use coalesce::{CoalesceLimits, Coalesced, Member, MergedRead, coalesce};
pub use config::{
    BackendChoice, BackendKind, DEFAULT_FD_CACHE, DEFAULT_QUEUE_DEPTH, FastPath, IoConfig,
    MAP_MIN_FILE_BYTES, MapFiles, parse_size,
};
pub use engine::{Batch, IoEngine};
pub use error::{EngineError, IoError};
pub use files::mapping::{check_mapped, mapped_intact};
pub use metrics::MetricsSnapshot;
pub use object::{
    DEFAULT_OBJECT_CONCURRENCY, INITIAL_OBJECT_CONCURRENCY, MIN_OBJECT_CONCURRENCY, ObjectBatch,
    ObjectConfig, ObjectEngine, ObjectMetrics, ObjectVersion, RetryPolicy, is_object_url,
};
pub use request::{Completion, ReadRange, ReadRequest, RequestId};

/// Reads the whole regular file at `path` with plain blocking reads (for small documents such
/// as Zarr metadata). Like every read of the engine, it refuses FIFOs, devices and other files
/// that are not regular ones ([`IoError::NotRegularFile`]) instead of blocking on them.
pub fn read_file(path: &std::path::Path) -> Result<Vec<u8>, IoError> {
    use std::io::Read;
    let path: std::sync::Arc<std::path::Path> = std::sync::Arc::from(path);
    let whole = ReadRange::Whole;
    let mut file = sys::open(&path, false).map_err(|e| IoError::from_os(e, &path, whole))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| IoError::from_os(e, &path, whole))?;
    Ok(bytes)
}
