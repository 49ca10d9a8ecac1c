//! The decoded-chunk cache: by default one per process, shared by every array opened without
//! a budget of its own ([`OpenOptions::chunk_cache_bytes`]), so that a dataset of many
//! variables holds one budget, not one per variable.
//!
//! Entries are keyed by the array (a number given to each open) and the chunk's leaf
//! coordinates: an array opened again, which may see a rewritten store, never sees the
//! entries of an earlier open, and an array's entries leave the shared cache when it is
//! dropped. Each array remembers its own recently read chunks, which decide what it keeps
//! ([`DecodedChunks::keeps`]).

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use quick_cache::Equivalent;
use zcrop_io::fork::PerProcess;

use crate::cache::{LruCache, SeenRecently};
use crate::error::{Result, ZarrError};

use super::locate::FileStamp;
use super::options::OpenOptions;

/// Default byte budget of the process-wide decoded-chunk cache (256 MiB);
/// `ZCROP_CHUNK_CACHE` overrides it.
pub const DEFAULT_CHUNK_CACHE_BYTES: usize = 256 << 20;

/// The environment variable that sets the process-wide budget (`0` turns it off).
const ENV: &str = "ZCROP_CHUNK_CACHE";

/// A cache uses a chunk only if at least this many fit: fewer would evict each other (and
/// every other array's chunks in the shared cache) faster than reads come back to them.
const MIN_CHUNKS_IN_BUDGET: usize = 4;

/// The most keys an array remembers as recently read in the shared cache (8 bytes each):
/// bounds the memory of arrays of tiny chunks, of which a process may open hundreds.
const MAX_SHARED_SEEN: usize = 1 << 16;

/// Decoded chunks, with the version of the file they came from.
pub(crate) type ChunkCache = LruCache<ChunkKey, (Option<FileStamp>, Bytes)>;

/// An entry's key: the array's number and the chunk's leaf coordinates.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ChunkKey {
    array: u64,
    coords: Vec<u64>,
}

/// [`ChunkKey`] borrowed, to look up without allocating; hashes as the key does (a slice
/// and a `Vec` hash alike).
#[derive(Hash)]
struct ChunkKeyRef<'a> {
    array: u64,
    coords: &'a [u64],
}

impl Equivalent<ChunkKey> for ChunkKeyRef<'_> {
    fn equivalent(&self, key: &ChunkKey) -> bool {
        self.array == key.array && self.coords == key.coords.as_slice()
    }
}

/// The process-wide cache, built on first use in each process (a child of `fork` builds its
/// own); `None` where the budget is 0.
static SHARED: PerProcess<Option<Arc<ChunkCache>>> = PerProcess::new();

/// Numbers arrays for the keys of the shared cache.
static NEXT_ARRAY: AtomicU64 = AtomicU64::new(0);

/// A number no other array of this process has.
pub(crate) fn next_array_id() -> u64 {
    NEXT_ARRAY.fetch_add(1, Ordering::Relaxed)
}

/// The budget of the process-wide cache: `ZCROP_CHUNK_CACHE` (bytes, or a size such as
/// `512M`; `0` turns it off) where set, else [`DEFAULT_CHUNK_CACHE_BYTES`]. A value that
/// does not parse is an error.
pub fn shared_chunk_cache_budget() -> Result<usize> {
    match std::env::var(ENV).ok().filter(|v| !v.trim().is_empty()) {
        None => Ok(DEFAULT_CHUNK_CACHE_BYTES),
        Some(v) => zcrop_io::parse_size(&v)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                ZarrError::InvalidArgument(format!(
                    "{ENV}={v:?}: expected a size in bytes such as 268435456 or 256M (0: no cache)"
                ))
            }),
    }
}

/// The process-wide cache, if its budget is not 0. The budget is read once per process;
/// arrays check it when they open ([`check_options`]), so a bad value is reported there.
fn shared() -> Option<&'static Arc<ChunkCache>> {
    SHARED
        .get_or_init(|| {
            let budget = shared_chunk_cache_budget().unwrap_or(DEFAULT_CHUNK_CACHE_BYTES);
            (budget > 0).then(|| Arc::new(LruCache::admitted(budget)))
        })
        .as_ref()
}

/// Bytes the process-wide cache holds now, and its budget; `None` where it is off.
pub fn shared_chunk_cache_usage() -> Option<(usize, usize)> {
    shared().map(|c| (c.used(), c.budget()))
}

/// Checks what the options ask of the cache when an array opens: a bad `ZCROP_CHUNK_CACHE`
/// is an error then, not at the first read.
pub(crate) fn check_options(options: &OpenOptions) -> Result<()> {
    if options.chunk_cache_bytes.is_none() {
        shared_chunk_cache_budget()?;
    }
    Ok(())
}

/// An array's view of its decoded-chunk cache (its own or the shared one), and the chunks it
/// read recently, which decide what it keeps (see [`DecodedChunks::keeps`]).
pub(crate) struct DecodedChunks {
    chunks: Arc<ChunkCache>,
    /// Whether `chunks` is the process-wide cache.
    shared: bool,
    array: u64,
    seen: SeenRecently,
    /// Bytes of a decoded chunk (every entry's cost).
    chunk_bytes: usize,
}

impl DecodedChunks {
    /// The cache of an array numbered `array` whose chunks decode to `chunk_bytes`, as
    /// `options` asks for: the shared one (`None`), none (`Some(0)`) or one of its own.
    /// `None` where no cache is used, or it would hold too few of the array's chunks.
    pub(crate) fn for_array(options: &OpenOptions, array: u64, chunk_bytes: usize) -> Option<Self> {
        let (chunks, shared) = match options.chunk_cache_bytes {
            None => (Arc::clone(shared()?), true),
            Some(0) => return None,
            Some(budget) => (Arc::new(LruCache::admitted(budget)), false),
        };
        let budget = chunks.budget();
        if chunk_bytes == 0 || chunk_bytes > budget / MIN_CHUNKS_IN_BUDGET {
            return None;
        }
        // As many keys as chunks fit: a chunk read again within about a full cache's worth of
        // other chunks is one the cache would have served.
        let keys = budget / chunk_bytes;
        Some(DecodedChunks {
            seen: SeenRecently::new(if shared {
                keys.min(MAX_SHARED_SEEN)
            } else {
                keys
            }),
            chunks,
            shared,
            array,
            chunk_bytes,
        })
    }

    /// The cache's byte budget, and whether it is the process-wide one.
    pub(crate) fn budget(&self) -> (usize, bool) {
        (self.chunks.budget(), self.shared)
    }

    /// The chunk at `coords`, if cached, with the version of its file.
    pub(crate) fn get(&self, coords: &[u64]) -> Option<(Option<FileStamp>, Bytes)> {
        self.chunks.get(&ChunkKeyRef {
            array: self.array,
            coords,
        })
    }

    /// Keeps the chunk at `coords`, decoded from the file of version `stamp`.
    pub(crate) fn insert(&self, coords: &[u64], stamp: Option<FileStamp>, chunk: Bytes) {
        let cost = chunk.len();
        let key = ChunkKey {
            array: self.array,
            coords: coords.to_vec(),
        };
        self.chunks.insert(key, (stamp, chunk), cost);
    }

    /// Whether the chunk at `coords` is worth keeping: while the cache has room, every one is;
    /// once full, one read again while remembered. Each call counts as a read of `coords`. A
    /// chunk kept is decoded whole, which a read of part of it otherwise avoids, so chunks read
    /// once (an array many times the budget) never pay for it.
    pub(crate) fn keeps(&self, coords: &[u64]) -> bool {
        let again = self.seen.seen_again(coords);
        again || self.chunks.has_room_for(self.chunk_bytes)
    }

    /// Whether [`Self::keeps`] would keep the chunk at `coords` now, without counting a read.
    pub(crate) fn would_keep(&self, coords: &[u64]) -> bool {
        self.seen.seen(coords) || self.chunks.has_room_for(self.chunk_bytes)
    }

    /// Whether this is the process-wide cache.
    pub(crate) fn is_shared(&self) -> bool {
        self.shared
    }

    /// Forgets the array's chunks.
    pub(crate) fn clear(&self) {
        if self.shared {
            let array = self.array;
            self.chunks.retain(|key| key.array != array);
        } else {
            self.chunks.clear();
        }
    }
}

impl Drop for DecodedChunks {
    /// The shared cache lets go of the array's chunks with the array.
    fn drop(&mut self) {
        if self.shared {
            self.clear();
        }
    }
}
