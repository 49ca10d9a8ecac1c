//! How to open an array ([`OpenOptions`]) and read it ([`ReadOptions`]), and what a read did
//! ([`ReadStats`]).

use std::sync::atomic::AtomicBool;

use zcrop_io::{Budget, IoConfig, IoEngine, ObjectEngine};

use crate::error::ZarrError;
use crate::transform::StitchTransform;

use super::DEFAULT_INDEX_CACHE_BYTES;

/// How to open an array.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The IO engine for local files; `None` uses the process-wide [`IoEngine::shared`].
    pub engine: Option<IoEngine>,
    /// Options of the object store a URL names (`endpoint`, `region`, `anon`,
    /// `access_key_id`, `secret_access_key`, ...; see [`ObjectEngine::open`]). Only for URLs:
    /// a local path with storage options is an error.
    pub storage_options: Vec<(String, String)>,
    /// The object engine to read URLs through; the URL opened must lie under its root. `None`
    /// uses an engine for the URL's bucket (or container, or host) with `storage_options`,
    /// shared with every other open of that bucket with the same options while one is in use
    /// ([`ObjectEngine::open_container_shared`]).
    pub object_engine: Option<ObjectEngine>,
    /// Byte budget of the shard-index cache.
    pub index_cache_bytes: usize,
    /// Byte budget of the decoded-chunk cache; `0` (the default) turns it off. Worth enabling
    /// when crops of successive reads overlap.
    pub chunk_cache_bytes: usize,
    /// Verify checksums (crc32c, zstd, gzip, zlib) while decoding. On by default; turning it off
    /// lets gzip and zlib chunks stop decoding early.
    pub verify_checksums: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            engine: None,
            storage_options: Vec::new(),
            object_engine: None,
            index_cache_bytes: DEFAULT_INDEX_CACHE_BYTES,
            chunk_cache_bytes: 0,
            verify_checksums: true,
        }
    }
}

impl OpenOptions {
    /// These options with an IO engine of the array's own whose reads in flight hold at most
    /// `in_flight_bytes` (a budget of its own, buffers not pooled): for work that must stay
    /// within a memory budget, such as the out-of-core FFT, whatever else the process reads.
    pub fn with_private_io(self, in_flight_bytes: u64) -> Result<Self, ZarrError> {
        let engine = IoEngine::new(IoConfig {
            budget: Some(Budget::new(256, in_flight_bytes)),
            threads: 2,
            queue_depth: 32,
            // Pooled buffers outlive their reads; the budget counts only what is in use.
            recycle_buffers: false,
            ..IoConfig::default()
        })?;
        Ok(OpenOptions {
            engine: Some(engine),
            ..self
        })
    }
}

/// What one read did, for benchmarks and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Leaf chunks the read needed (each counted once, however many crops share it).
    pub chunks: u64,
    /// Of those, chunks absent from storage (filled with the fill value, no IO).
    pub chunks_missing: u64,
    /// Of those, chunks served by the decoded-chunk cache.
    pub chunks_cached: u64,
    /// Chunks decoded.
    pub chunks_decoded: u64,
    /// Bytes produced by decoding (less than the chunks' size where decoding stopped early).
    pub bytes_decoded: u64,
    /// Encoded bytes of the chunks read.
    pub chunk_bytes_read: u64,
    /// Shard indexes read from storage.
    pub index_reads: u64,
    /// Shard indexes served by the index cache.
    pub index_cache_hits: u64,
    /// Bytes written to the output.
    pub output_bytes: u64,
}

impl std::ops::AddAssign for ReadStats {
    fn add_assign(&mut self, o: Self) {
        self.chunks += o.chunks;
        self.chunks_missing += o.chunks_missing;
        self.chunks_cached += o.chunks_cached;
        self.chunks_decoded += o.chunks_decoded;
        self.bytes_decoded += o.bytes_decoded;
        self.chunk_bytes_read += o.chunk_bytes_read;
        self.index_reads += o.index_reads;
        self.index_cache_hits += o.index_cache_hits;
        self.output_bytes += o.output_bytes;
    }
}

/// Options of one read.
#[derive(Clone, Copy, Default)]
pub struct ReadOptions<'a> {
    /// Element conversion fused into the stitch, and a per-block finishing step.
    pub transform: Option<&'a dyn StitchTransform>,
    /// Set it (from any thread) to stop the read early with [`ZarrError::Cancelled`](crate::ZarrError::Cancelled).
    pub cancel: Option<&'a AtomicBool>,
}

impl std::fmt::Debug for ReadOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOptions")
            .field("transform", &self.transform.is_some())
            .field("cancel", &self.cancel.is_some())
            .finish()
    }
}
