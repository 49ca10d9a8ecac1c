//! The decoded-chunk cache: by default one per process, shared by every array opened without
//! a budget of its own ([`OpenOptions::chunk_cache_bytes`]), so that a dataset of many
//! variables holds one budget, not one per variable.
//!
//! Entries are keyed by the array (a number given to each open) and the chunk's leaf
//! coordinates: an array opened again, which may see a rewritten store, never sees the
//! entries of an earlier open, and an array's entries leave the shared cache when it is
//! dropped. Each array remembers its own recently read chunks, which decide what it keeps
//! ([`DecodedChunks::keeps`]).
//!
//! Chunks that cost little to read again go into the shared cache only where it would serve
//! enough of their reads: chunks of local files that decode at about the speed of a copy (LZ4
//! inside blosc, no compressor), and large blosc chunks an object store serves by block (a
//! read fetches and decodes only the blocks it needs; keeping the chunk means fetching it
//! whole, and it is kept as fetched: see `Array::keeps_encoded_chunks`). The cache tracks the
//! keys it would hold if it kept every such chunk ([`Ghost`]), and an array's share of reads
//! found there is the hit rate keeping its chunks would give
//! ([`DecodedChunks::keeps_cheap_chunks`]). An array of large blosc chunks known to fit in the
//! cache whole is kept from its first reads ([`DecodedChunks::note_array_bytes`]).

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

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

/// Decoded chunks (encoded, as fetched, for arrays that keep them so), with the version of the
/// file they came from.
pub(crate) type ChunkCache = LruCache<ChunkKey, (Option<FileStamp>, Bytes)>;

/// The keys of chunks cheap to read again that the shared cache would hold if it kept every
/// one read through it, each costing its decoded bytes: a cache of keys only.
type Ghost = LruCache<ChunkKey, ()>;

/// Keeping a chunk cheap to read again pays where at least this share of an array's reads
/// would find it in the cache: a hit saves a decode that costs about a copy (or a GET of a
/// few blocks), and each chunk kept costs a whole decode into new memory (or a whole GET).
/// Between the share at which keeping LZ4 chunks cost reads and the share at which it paid
/// (docs/performance.md).
const KEEP_HIT_SHARE: f64 = 0.45;

/// An array whose chunks, as the cache keeps them, would all take at most this share of the
/// budget (numerator, denominator) is kept from its first reads, before its hit share decides
/// ([`DecodedChunks::note_array_bytes`]): every chunk kept is read from the cache from then on,
/// and a quarter of the budget stays for other arrays' chunks.
const FITS_SHARE: (usize, usize) = (3, 4);

/// Reads of an array before its hit share decides anything: twice as many as the cache holds
/// chunks of the array (by then the first reads of each chunk, misses whatever the cache,
/// weigh little), within these bounds.
const GHOST_MIN_READS: std::ops::RangeInclusive<u32> = 128..=512;

/// The read count at which an array's counts are halved, so that they follow how it is read
/// now.
const GHOST_DECAY_READS: u32 = 8192;

/// Chunks smaller than this are not tracked in the [`Ghost`] (and so never kept when they
/// are cheap to read again): it would hold too many keys for what their decoding costs.
const GHOST_MIN_CHUNK_BYTES: usize = 16 << 10;

/// Whether an array's chunks are cheap to read again: not known until its first read.
const CHEAP_UNKNOWN: u8 = 0;
const CHEAP_YES: u8 = 1;
const CHEAP_NO: u8 = 2;

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

/// The process-wide cache and its [`Ghost`] of the same budget, built on first use in each
/// process (a child of `fork` builds its own); `None` where the budget is 0.
static SHARED: PerProcess<Option<(Arc<ChunkCache>, Arc<Ghost>)>> = PerProcess::new();

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
fn shared() -> Option<&'static (Arc<ChunkCache>, Arc<Ghost>)> {
    SHARED
        .get_or_init(|| {
            let budget = shared_chunk_cache_budget().unwrap_or(DEFAULT_CHUNK_CACHE_BYTES);
            (budget > 0).then(|| {
                (
                    Arc::new(LruCache::admitted(budget)),
                    Arc::new(LruCache::new(budget)),
                )
            })
        })
        .as_ref()
}

/// Bytes the process-wide cache holds now, and its budget; `None` where it is off.
pub fn shared_chunk_cache_usage() -> Option<(usize, usize)> {
    shared().map(|(c, _)| (c.used(), c.budget()))
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
    array: u64,
    seen: SeenRecently,
    /// Bytes of a decoded chunk (every entry's cost).
    chunk_bytes: usize,
    /// The process-wide cache's [`Ghost`] where `chunks` is that cache (`None` for a cache of
    /// the array's own).
    ghost: Option<Arc<Ghost>>,
    /// Whether the array's chunks are cheap to read again (`CHEAP_*`), learnt at its first
    /// read.
    cheap: AtomicU8,
    /// Reads of the array tracked in the ghost before its hit share counts (`GHOST_MIN_READS`).
    min_reads: u32,
    /// Reads of the array tracked in the ghost, and those it held (both halved now and then).
    ghost_reads: AtomicU32,
    ghost_hits: AtomicU32,
    /// Whether all the array's chunks fit in [`FITS_SHARE`] of the budget, as last noted
    /// ([`Self::note_array_bytes`]).
    fits: AtomicBool,
}

impl DecodedChunks {
    /// The cache of an array numbered `array` whose chunks decode to `chunk_bytes`, as
    /// `options` asks for: the shared one (`None`), none (`Some(0)`) or one of its own.
    /// `None` where no cache is used, or it would hold too few of the array's chunks.
    pub(crate) fn for_array(options: &OpenOptions, array: u64, chunk_bytes: usize) -> Option<Self> {
        let (chunks, ghost) = match options.chunk_cache_bytes {
            None => {
                let (chunks, ghost) = shared()?;
                (Arc::clone(chunks), Some(Arc::clone(ghost)))
            }
            Some(0) => return None,
            Some(budget) => (Arc::new(LruCache::admitted(budget)), None),
        };
        let shared = ghost.is_some();
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
            array,
            chunk_bytes,
            ghost,
            cheap: AtomicU8::new(CHEAP_UNKNOWN),
            min_reads: min_reads(keys),
            ghost_reads: AtomicU32::new(0),
            ghost_hits: AtomicU32::new(0),
            fits: AtomicBool::new(false),
        })
    }

    /// The cache's byte budget, and whether it is the process-wide one.
    pub(crate) fn budget(&self) -> (usize, bool) {
        (self.chunks.budget(), self.is_shared())
    }

    /// The chunk at `coords`, if cached, with the version of its file. Counts as a read of
    /// it in the ghost where that tracks the array ([`Self::keeps_cheap_chunks`]).
    pub(crate) fn get(&self, coords: &[u64]) -> Option<(Option<FileStamp>, Bytes)> {
        let key = ChunkKeyRef {
            array: self.array,
            coords,
        };
        if let Some(ghost) = &self.ghost
            && self.cheap.load(Ordering::Relaxed) == CHEAP_YES
            && self.chunk_bytes >= GHOST_MIN_CHUNK_BYTES
        {
            let held = ghost.get(&key).is_some();
            if !held {
                let key = ChunkKey {
                    array: self.array,
                    coords: coords.to_vec(),
                };
                ghost.insert(key, (), self.chunk_bytes);
            }
            let reads = self.ghost_reads.fetch_add(1, Ordering::Relaxed) + 1;
            let hits = self
                .ghost_hits
                .fetch_add(u32::from(held), Ordering::Relaxed)
                + u32::from(held);
            if reads >= GHOST_DECAY_READS {
                // Racing reads may lose a count here: the share stays about right.
                self.ghost_reads.store(reads / 2, Ordering::Relaxed);
                self.ghost_hits.store(hits / 2, Ordering::Relaxed);
            }
        }
        self.chunks.get(&key)
    }

    /// Whether the array's chunks may go into its cache as far as the cost of reading them
    /// again goes: always for a cache of the array's own, and for chunks that are not cheap to
    /// read again (as `cheap` tells, asked once per array); in the shared cache, chunks that
    /// are only where the ghost has seen enough reads of the array (`GHOST_MIN_READS`) and the
    /// share of them it held is `KEEP_HIT_SHARE` or more, or before that where the whole array
    /// fits ([`Self::may_keep`]).
    pub(crate) fn keeps_cheap_chunks(&self, cheap: impl FnOnce() -> bool) -> bool {
        if self.ghost.is_none() {
            return true;
        }
        if self.cheap.load(Ordering::Relaxed) == CHEAP_UNKNOWN {
            let f = if cheap() { CHEAP_YES } else { CHEAP_NO };
            self.cheap.store(f, Ordering::Relaxed);
        }
        self.may_keep()
    }

    /// Whether the cache may keep or serve the array's chunks now: false while they are cheap
    /// to read again and their hit share does not pay, unless the whole array fits and its hit
    /// share has not been judged yet (the read path then skips what only a kept chunk needs,
    /// such as the version of each chunk's file).
    pub(crate) fn may_keep(&self) -> bool {
        if self.cheap.load(Ordering::Relaxed) != CHEAP_YES {
            return true;
        }
        let reads = self.ghost_reads.load(Ordering::Relaxed);
        if reads < self.min_reads {
            return self.fits.load(Ordering::Relaxed);
        }
        let hits = self.ghost_hits.load(Ordering::Relaxed);
        f64::from(hits) >= KEEP_HIT_SHARE * f64::from(reads)
    }

    /// Notes that the array's chunks, as the cache keeps them, come to about `bytes` in all.
    /// An array whose chunks fit in [`FITS_SHARE`] of the budget is kept from its first reads
    /// instead of after its hit share is judged ([`Self::may_keep`]): its hit share tends to
    /// one, and the reads before the judgement are where keeping saves the most. The ghost
    /// still judges it, which stops keeping an array that several others crowd out.
    pub(crate) fn note_array_bytes(&self, bytes: u64) {
        let (num, den) = FITS_SHARE;
        let room = (self.chunks.budget() / den).saturating_mul(num);
        let fits = usize::try_from(bytes).is_ok_and(|b| b <= room);
        self.fits.store(fits, Ordering::Relaxed);
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
    /// once (an array many times the budget) never pay for it. Chunks cheap to read again go
    /// into the shared cache only when read again, room or not (unless the whole array fits):
    /// keeping one costs more than decoding it again, and one read once may never come back.
    pub(crate) fn keeps(&self, coords: &[u64]) -> bool {
        self.seen.seen_again(coords) || self.fills_room()
    }

    /// Whether [`Self::keeps`] would keep the chunk at `coords` now, without counting a read.
    pub(crate) fn would_keep(&self, coords: &[u64]) -> bool {
        self.seen.seen(coords) || self.fills_room()
    }

    /// Whether a chunk read for the first time goes into the cache: while it has room, except
    /// chunks cheap to read again in the shared cache (see [`Self::keeps`]).
    fn fills_room(&self) -> bool {
        let cheap = self.ghost.is_some()
            && self.cheap.load(Ordering::Relaxed) == CHEAP_YES
            && !self.fits.load(Ordering::Relaxed);
        !cheap && self.chunks.has_room_for(self.chunk_bytes)
    }

    /// Whether this is the process-wide cache.
    pub(crate) fn is_shared(&self) -> bool {
        self.ghost.is_some()
    }

    /// Forgets the array's chunks.
    pub(crate) fn clear(&self) {
        if let Some(ghost) = &self.ghost {
            let array = self.array;
            self.chunks.retain(|key| key.array != array);
            ghost.retain(|key| key.array != array);
        } else {
            self.chunks.clear();
        }
    }
}

/// Reads of an array of whose chunks the cache holds `keys` before its hit share counts.
fn min_reads(keys: usize) -> u32 {
    let twice = u32::try_from(keys.saturating_mul(2)).unwrap_or(u32::MAX);
    twice.clamp(*GHOST_MIN_READS.start(), *GHOST_MIN_READS.end())
}

impl Drop for DecodedChunks {
    /// The shared cache lets go of the array's chunks with the array.
    fn drop(&mut self) {
        if self.is_shared() {
            self.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A view of a shared cache of `chunks` chunks of 16 KiB, with its ghost, for array 0.
    fn shared_view(chunks: usize) -> DecodedChunks {
        let chunk_bytes = GHOST_MIN_CHUNK_BYTES;
        let budget = chunks * chunk_bytes;
        DecodedChunks {
            chunks: Arc::new(LruCache::admitted(budget)),
            array: 0,
            seen: SeenRecently::new(chunks),
            chunk_bytes,
            ghost: Some(Arc::new(LruCache::new(budget))),
            cheap: AtomicU8::new(CHEAP_UNKNOWN),
            min_reads: min_reads(chunks),
            ghost_reads: AtomicU32::new(0),
            ghost_hits: AtomicU32::new(0),
            fits: AtomicBool::new(false),
        }
    }

    /// Reads `keys` chunks in turn, `rounds` times over, as the read path asks the cache.
    fn read_in_turn(view: &DecodedChunks, keys: u64, rounds: u64) {
        for _ in 0..rounds {
            for k in 0..keys {
                if view.get(&[k]).is_none() {
                    view.keeps_cheap_chunks(|| true);
                }
            }
        }
    }

    #[test]
    fn cheap_chunks_are_kept_only_where_the_cache_would_serve_their_reads() {
        // A cache of the array's own keeps every chunk, without asking how fast it decodes.
        let mut own = shared_view(64);
        own.ghost = None;
        assert!(own.keeps_cheap_chunks(|| unreachable!("not asked")));

        // Chunks not cheap to read again are not judged.
        let slow = shared_view(64);
        assert!(slow.keeps_cheap_chunks(|| false));
        slow.get(&[1]);
        assert_eq!(slow.ghost_reads.load(Ordering::Relaxed), 0);

        // 16 chunks read in turn fit in a cache of 64: nearly every read would be served.
        let fits = shared_view(64);
        read_in_turn(&fits, 16, 2);
        assert!(
            !fits.keeps_cheap_chunks(|| true),
            "judged before enough reads"
        );
        read_in_turn(&fits, 16, u64::from(fits.min_reads) / 16);
        assert!(fits.keeps_cheap_chunks(|| unreachable!("asked once")));

        // 256 chunks read in turn through a cache of 64: an LRU serves none of them.
        let larger = shared_view(64);
        read_in_turn(&larger, 256, 8);
        assert!(larger.ghost_reads.load(Ordering::Relaxed) >= larger.min_reads);
        assert!(!larger.keeps_cheap_chunks(|| true));

        // Counts halve as reads go on, and follow a change in how the array is read.
        read_in_turn(&larger, 8, u64::from(GHOST_DECAY_READS) / 4);
        assert!(larger.ghost_reads.load(Ordering::Relaxed) < GHOST_DECAY_READS);
        assert!(larger.keeps_cheap_chunks(|| true));

        // Judged after twice the chunks the cache holds, within bounds.
        assert_eq!([4, 64, 200, 4096].map(min_reads), [128, 128, 400, 512]);

        // Dropping the view takes the array's keys out of the ghost too.
        let ghost = Arc::clone(fits.ghost.as_ref().unwrap());
        assert!(ghost.used() > 0);
        drop(fits);
        assert_eq!(ghost.used(), 0);
    }

    #[test]
    fn cheap_chunks_fill_the_room_only_where_their_array_fits() {
        // Chunks costly to decode fill an empty cache from their first read.
        let slow = shared_view(64);
        slow.keeps_cheap_chunks(|| false);
        assert!(slow.would_keep(&[1]) && slow.keeps(&[1]));

        // Cheap ones only when read again, though the cache is empty...
        let cheap = shared_view(64);
        cheap.keeps_cheap_chunks(|| true);
        assert!(!cheap.would_keep(&[1]) && !cheap.keeps(&[1]));
        assert!(cheap.would_keep(&[1]) && cheap.keeps(&[1]));

        // ...unless their whole array fits.
        cheap.note_array_bytes(GHOST_MIN_CHUNK_BYTES as u64);
        assert!(cheap.keeps(&[2]));

        // A cache of the array's own keeps cheap chunks as any others.
        let mut own = shared_view(64);
        own.ghost = None;
        own.cheap.store(CHEAP_YES, Ordering::Relaxed);
        assert!(own.keeps(&[1]));
    }

    #[test]
    fn an_array_that_fits_is_kept_until_its_hit_share_says_otherwise() {
        let budget = 64 * GHOST_MIN_CHUNK_BYTES;
        let view = shared_view(64);
        view.note_array_bytes((budget / 2) as u64);
        assert!(view.keeps_cheap_chunks(|| true), "kept from the first read");
        view.note_array_bytes(budget as u64);
        assert!(
            !view.keeps_cheap_chunks(|| true),
            "more than 3/4 of the budget"
        );
        view.note_array_bytes((budget * 3 / 4) as u64);
        read_in_turn(&view, 16, 2);
        assert!(view.keeps_cheap_chunks(|| true));

        // Past the judgement the ghost decides: reads that an LRU of the budget would not
        // serve (other arrays crowding this one out) stop the keeping.
        read_in_turn(&view, 256, 4);
        assert!(view.ghost_reads.load(Ordering::Relaxed) >= view.min_reads);
        assert!(!view.keeps_cheap_chunks(|| true));
    }
}
