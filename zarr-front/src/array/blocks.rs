//! Fetching only the needed blocks of large unsharded blosc chunks from object stores.
//!
//! Stores like ARCO-ERA5 hold one blosc chunk of about 4 MB per time step and variable, and a
//! 64 x 64 window needs a band of its rows: one or two of its eight or so blocks. A read
//! fetches such a chunk's header first (a short prefix holding the block offsets, cached per
//! chunk object), then only the blocks its crops need, and decodes them from a rebuilt chunk
//! ([`BlockIndex`]). That moves a quarter of the bytes or less, for one more round trip on the
//! first read of a chunk: the trade a loader reading ahead wants, where the link and the CPU
//! time spent receiving bytes bound the rate, not the latency of one batch. A read alone on
//! the link fetches whole chunks, unless told otherwise, and keeps their headers: a later read
//! of such a chunk fetches only its blocks, with no round trip for the header.

use std::path::Path;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use zcrop_codec::blosc::BlockIndex;
use zcrop_io::{ReadRange, ReadRequest};

use crate::plan::Plan;
use crate::store::Reader;

use super::Array;
use super::fetch::{Source, Storages};
use super::options::{BlockFetch, ReadStats};

/// Chunks smaller than this are fetched whole: their blocks are few, and a round trip for
/// the header costs more than the bytes it saves.
const MIN_CHUNK: usize = 1 << 20;

impl Array {
    /// Whether reads of this array fetch large blosc chunks by block: an unsharded array on an
    /// object store, decoded by the blosc fast path. Chunks the decoded-chunk cache would keep
    /// (which it holds whole) are still fetched whole; the process-wide cache keeps such
    /// chunks only where it would serve enough of their reads (see [`super::DecodedChunks`]).
    pub(crate) fn fetches_blosc_blocks(&self) -> bool {
        let core = &*self.core;
        core.options.blosc_blocks != BlockFetch::Never
            && matches!(core.reader, Reader::Object(_))
            && core.layout.levels.is_empty()
            && core.icechunk.is_none()
            && core.decoder.is_plain_blosc()
            && core.decoder.chunk_bytes >= MIN_CHUNK
    }

    /// Whether fetching headers first (one more round trip) pays: when other GETs are in
    /// flight, as where a loader reads batches ahead, the round trip overlaps their transfers
    /// and the bytes saved are what bounds the rate. A read alone on the link waits for the
    /// round trip whole, which the bytes saved outweigh only on a slow link
    /// ([`BlockFetch::Always`] for those).
    fn worth_a_round_trip(&self) -> bool {
        if self.core.options.blosc_blocks == BlockFetch::Always {
            return true;
        }
        match &self.core.reader {
            Reader::Object(engine) => engine.gets_in_flight() > 0,
            Reader::Local(_) => false,
        }
    }

    /// Remembers the block index of a large blosc chunk fetched whole (its header and block
    /// offsets are at the start of `bytes`), so that later reads of the chunk fetch only the
    /// blocks they need without a round trip for the header.
    pub(crate) fn note_block_index(&self, path: &Arc<Path>, bytes: &[u8]) {
        if self.fetches_blosc_blocks() && self.core.caches().blosc.get(path).is_none() {
            self.keep_block_index(path, bytes);
        }
    }

    /// Parses the block index at the start of `bytes`, the chunk at `path` or a prefix of it,
    /// and keeps it in the index cache; `None` where the chunk cannot be read by block.
    fn keep_block_index(&self, path: &Arc<Path>, bytes: &[u8]) -> Option<Arc<BlockIndex>> {
        let index = Arc::new(BlockIndex::parse(bytes, self.core.decoder.chunk_bytes)?);
        let cost = index.head_len() + 64;
        (self.core.caches().blosc).insert(Arc::clone(path), Arc::clone(&index), cost);
        Some(index)
    }

    /// Turns the whole-chunk reads among `sources` (plan leaves `base..`) into reads of the
    /// blocks each leaf needs, where that saves at least half of a chunk. The headers not
    /// cached yet are fetched first, in one submission, where that round trip pays (see
    /// [`Self::worth_a_round_trip`]); a chunk whose header cannot be had or read (missing,
    /// shorter than the prefix, damaged, one block) stays a whole read, which reports what
    /// is wrong with it.
    pub(crate) fn fetch_needed_blocks(
        &self,
        plan: &Plan,
        base: usize,
        sources: &mut [Source],
        storages: &Storages,
        stats: &mut ReadStats,
    ) {
        if !self.fetches_blosc_blocks() {
            return;
        }
        let core = &*self.core;
        let full = core.decoder.chunk_bytes;
        let cache = &core.caches().blosc;
        // A chunk the cache keeps is fetched whole, where its hit share pays for that (these
        // chunks are cheap to read again: their blocks only).
        let kept = |i: usize| {
            (core.caches().chunk.as_ref()).is_some_and(|c| {
                c.keeps_cheap_chunks(|| true) && c.would_keep(&plan.leaves[base + i].coords)
            })
        };
        let partial = |i: usize, s: &Source| match s {
            Source::Read {
                storage,
                range: ReadRange::Whole,
            } if plan.leaves[base + i].needed.len() < full && !kept(i) => Some(*storage),
            _ => None,
        };
        let mut indexes: FxHashMap<usize, Option<Arc<BlockIndex>>> = FxHashMap::default();
        let mut to_read: Vec<usize> = Vec::new();
        for (i, s) in sources.iter().enumerate() {
            let Some(storage) = partial(i, s) else {
                continue;
            };
            indexes.entry(storage).or_insert_with(|| {
                let hit = cache.get(&storages.list[storage].path);
                if hit.is_some() {
                    stats.index_cache_hits += 1;
                } else {
                    to_read.push(storage);
                }
                hit
            });
        }
        if !to_read.is_empty() && !self.worth_a_round_trip() {
            to_read.clear();
        }
        if !to_read.is_empty() {
            stats.index_reads += to_read.len() as u64;
            let prefix = BlockIndex::prefix_len(full) as u64;
            let requests = to_read.iter().enumerate().map(|(id, &storage)| {
                let path = Arc::clone(&storages.list[storage].path);
                ReadRequest::new(id as u64, path, ReadRange::new(0, prefix))
            });
            for done in core.reader.submit(requests) {
                let storage = to_read[done.id as usize];
                let Ok(bytes) = done.result else {
                    continue;
                };
                if let Some(index) = self.keep_block_index(&storages.list[storage].path, &bytes) {
                    indexes.insert(storage, Some(index));
                }
            }
        }
        let elsize = core.layout.elsize;
        for (i, s) in sources.iter_mut().enumerate() {
            let Some(storage) = partial(i, s) else {
                continue;
            };
            let Some(Some(index)) = indexes.get(&storage) else {
                continue;
            };
            if let Some(span) = index.span(&plan.leaves[base + i].needed, elsize) {
                *s = Source::Blocks {
                    storage,
                    index: Arc::clone(index),
                    span,
                };
            }
        }
    }
}
