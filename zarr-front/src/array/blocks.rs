//! Fetching only the needed blocks of large unsharded blosc chunks from object stores.
//!
//! Stores like ARCO-ERA5 hold one blosc chunk of about 4 MB per time step and variable, and a
//! 64 x 64 window needs a band of its rows: one or two of its eight or so blocks. Where a
//! chunk's header (a short prefix holding the block offsets, cached per chunk object) is known,
//! a read fetches only the blocks its crops need, and decodes them from a rebuilt chunk
//! ([`BlockIndex`]). Where it is not, the array's other chunks tell where the needed blocks
//! usually lie ([`BlockLayout`]: compressed fields of one variable differ little from step to
//! step): the read fetches the header and a guessed range around those blocks together, in one
//! round trip, and fetches again only the chunks whose blocks fell outside it. Before any
//! header of the array is known, a read alone on the link fetches whole chunks (a round trip
//! for headers first costs more than the bytes it saves) and keeps their headers; a loader
//! reading ahead, whose rate the bytes moved bound rather than one batch's round trips, fetches
//! headers first.

use std::collections::VecDeque;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use zcrop_codec::blosc::BlockIndex;
use zcrop_io::{IoError, ReadRange, ReadRequest};

use crate::plan::Plan;
use crate::store::Reader;

use super::Array;
use super::fetch::{Source, Storages};
use super::options::{BlockFetch, ReadStats};

/// Chunks smaller than this are fetched whole: their blocks are few, and a round trip for
/// the header costs more than the bytes it saves.
const MIN_CHUNK: usize = 1 << 20;

/// A guessed range reaches this share of the needed blocks' spread past it on each side
/// (at least [`MIN_GUESS_PAD`]), for chunks that compress a little more or less than those
/// seen.
const GUESS_PAD_DIVISOR: usize = 16;
/// The least a guessed range reaches past the needed blocks on each side.
const MIN_GUESS_PAD: usize = 4096;

/// Headers a [`BlockLayout`] learns from: the last ones read, so that chunks unlike the rest
/// (an all-fill step, a burst of noise) stop widening its guesses once others follow.
const LAYOUT_HEADERS: usize = 16;

/// Where the blocks of an array's large blosc chunks tend to lie, learnt from the last
/// headers its reads have seen.
#[derive(Debug, Default)]
pub(crate) struct BlockLayout {
    /// Up to [`LAYOUT_HEADERS`] headers, the newest last, all splitting chunks alike.
    recent: VecDeque<Arc<BlockIndex>>,
}

/// Where to look for the blocks a read needs of a chunk whose header is not known: its header
/// (the first `head` bytes) and `body`, fetched together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Guess {
    pub(crate) head: usize,
    pub(crate) body: ReadRange,
}

impl BlockLayout {
    /// Learns from the header of one chunk. A chunk split otherwise (another block size)
    /// starts the layout again.
    fn learn(&mut self, index: &Arc<BlockIndex>) {
        let alike = self.recent.back().is_some_and(|s| {
            s.blocksize() == index.blocksize() && s.extents().len() == index.extents().len()
        });
        if !alike {
            self.recent.clear();
        }
        if self.recent.len() == LAYOUT_HEADERS {
            self.recent.pop_front();
        }
        self.recent.push_back(Arc::clone(index));
    }

    /// The mean encoded size of the chunks whose headers were seen; `None` before any.
    fn mean_encoded_len(&self) -> Option<u64> {
        let n = self.recent.len() as u64;
        let total: u64 = self.recent.iter().map(|i| i.encoded_len() as u64).sum();
        (n > 0).then(|| total / n)
    }

    /// Where the blocks holding the decoded bytes `want` of a chunk not seen yet probably
    /// are: from the lowest start to the highest end those blocks had in the chunks seen, and
    /// a little more. `None` before any header is known, where decoding `want` could read
    /// other blocks, or where the range would not save half of a chunk. Blocks that were the
    /// last of a chunk are asked for as the chunk's last bytes, so that a chunk a little
    /// shorter than those seen is not read past its end.
    fn guess(&self, want: &Range<usize>, elsize: usize) -> Option<Guess> {
        let sample = self.recent.back()?;
        let blocks = sample.blocks(want, elsize)?;
        let (mut lo, mut hi, mut last, mut largest) = (usize::MAX, 0, false, 0);
        for index in &self.recent {
            for e in &index.extents()[blocks.clone()] {
                (lo, hi) = (lo.min(e.start), hi.max(e.end));
                last |= e.end == index.encoded_len();
            }
            largest = largest.max(index.encoded_len());
        }
        let pad = ((hi - lo) / GUESS_PAD_DIVISOR).max(MIN_GUESS_PAD);
        let start = lo.saturating_sub(pad).max(sample.head_len());
        let (body, len) = if last {
            let len = largest.checked_sub(start)?;
            (ReadRange::Suffix(len as u64), len)
        } else {
            let len = hi + pad - start;
            (ReadRange::new(start as u64, len as u64), len)
        };
        ((len + sample.head_len()) * 2 <= largest).then_some(Guess {
            head: sample.head_len(),
            body,
        })
    }
}

/// What the header and guessed range of a chunk ([`Guess`]) came to.
pub(crate) enum Guessed {
    /// The chunk rebuilt from its header and the needed blocks, which the range held.
    Chunk(Vec<u8>),
    /// The needed blocks of the chunk, which the range missed: fetched again, by block.
    Refetch(Arc<BlockIndex>, Range<usize>),
    /// The header does not parse as one of a chunk read by block: the chunk is fetched
    /// whole, and its decoder words any error.
    Whole,
}

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

    /// Whether the chunk cache keeps this array's chunks encoded, as fetched
    /// ([`Self::fetches_blosc_blocks`]): a read of a kept chunk decodes only the blocks it
    /// needs, at about the speed of a copy, and keeping it costs no decode into new memory and
    /// about half the bytes of the decoded chunk.
    pub(crate) fn keeps_encoded_chunks(&self) -> bool {
        self.fetches_blosc_blocks()
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
    /// and keeps it in the index cache; `None` where the chunk cannot be read by block. Tells
    /// the chunk cache, which keeps these chunks as fetched, what the whole array would take
    /// there: its chunk count times the mean size of the chunks seen.
    fn keep_block_index(&self, path: &Arc<Path>, bytes: &[u8]) -> Option<Arc<BlockIndex>> {
        let index = Arc::new(BlockIndex::parse(bytes, self.core.decoder.chunk_bytes)?);
        let cost = index.head_len() + 64;
        let caches = self.core.caches();
        caches
            .blosc
            .insert(Arc::clone(path), Arc::clone(&index), cost);
        let mut layout = caches.blosc_layout.lock();
        layout.learn(&index);
        if let Some(chunks) = &caches.chunk
            && let Some(mean) = layout.mean_encoded_len()
        {
            let count =
                (self.core.layout.leaf_grid().iter()).fold(1u64, |n, &c| n.saturating_mul(c));
            chunks.note_array_bytes(count.saturating_mul(mean));
        }
        Some(index)
    }

    /// What the header `head` and the bytes `body` (asked for as `asked`) of a chunk at `path`
    /// fetched on a guess ([`Guess`]) come to, for its decoded bytes `want`; an error of either
    /// read (a body asked past the end of a chunk shorter than guessed is a miss, not an
    /// error).
    pub(crate) fn take_guess(
        &self,
        path: &Arc<Path>,
        want: &Range<usize>,
        head: Result<Bytes, IoError>,
        body: Result<Bytes, IoError>,
        asked: ReadRange,
    ) -> Result<Guessed, IoError> {
        let head = head?;
        let body = match body {
            Ok(body) => Some(body),
            Err(IoError::RangePastEof { .. }) => None,
            Err(e) => return Err(e),
        };
        let Some(index) = self.keep_block_index(path, &head) else {
            return Ok(Guessed::Whole);
        };
        let Some(extent) = index.extent(want, self.core.layout.elsize) else {
            return Ok(Guessed::Whole);
        };
        // Where the body starts in the chunk (a suffix: by the length its header gives).
        let start = asked.resolve(index.encoded_len() as u64);
        let held = body.as_ref().zip(start).and_then(|(body, (start, _))| {
            let at = extent.start.checked_sub(start as usize)?;
            body.get(at..at + extent.len())
        });
        Ok(match held.map(|blocks| index.assemble(&extent, blocks)) {
            Some(Ok(chunk)) => Guessed::Chunk(chunk),
            Some(Err(_)) => Guessed::Whole,
            None => Guessed::Refetch(index, extent),
        })
    }

    /// Turns the whole-chunk reads among `sources` (plan leaves `base..`) into reads of the
    /// blocks each leaf needs, where that saves at least half of a chunk: by the cached
    /// header, else with the header at a guessed range ([`BlockLayout`]; resolved as the
    /// read's results come, [`Self::take_guess`]). Where the array has no header to guess
    /// from, the headers are fetched first, in one submission, where that round trip pays
    /// (see [`Self::worth_a_round_trip`]); a chunk whose header cannot be had or read
    /// (missing, shorter than the prefix, damaged, one block) stays a whole read, which
    /// reports what is wrong with it.
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
        // Chunks the cache keeps (encoded) are read from there.
        if let Some(chunks) = &core.caches().chunk {
            for (i, s) in sources.iter_mut().enumerate() {
                if let Source::Read {
                    storage,
                    range: ReadRange::Whole,
                } = *s
                    && let Some((_, bytes)) = chunks.get(&plan.leaves[base + i].coords)
                {
                    stats.chunks_cached += 1;
                    *s = Source::KeptEncoded { storage, bytes };
                }
            }
        }
        let elsize = core.layout.elsize;
        let mut indexes: FxHashMap<usize, Option<Arc<BlockIndex>>> = FxHashMap::default();
        let mut guesses: FxHashMap<usize, Guess> = FxHashMap::default();
        let mut to_read: Vec<usize> = Vec::new();
        {
            let layout = core.caches().blosc_layout.lock();
            for (i, s) in sources.iter().enumerate() {
                let Some(storage) = partial(i, s) else {
                    continue;
                };
                let index = indexes.entry(storage).or_insert_with(|| {
                    let hit = cache.get(&storages.list[storage].path);
                    if hit.is_some() {
                        stats.index_cache_hits += 1;
                    }
                    hit
                });
                if index.is_some() {
                    continue;
                }
                match layout.guess(&plan.leaves[base + i].needed, elsize) {
                    Some(guess) => {
                        guesses.insert(i, guess);
                    }
                    None if !to_read.contains(&storage) => to_read.push(storage),
                    None => {}
                }
            }
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
        for (i, s) in sources.iter_mut().enumerate() {
            let Some(storage) = partial(i, s) else {
                continue;
            };
            match (indexes.get(&storage), guesses.get(&i)) {
                (Some(Some(index)), _) => {
                    if let Some(span) = index.span(&plan.leaves[base + i].needed, elsize) {
                        *s = Source::Blocks {
                            storage,
                            index: Arc::clone(index),
                            span,
                        };
                    }
                }
                (_, Some(&guess)) => {
                    stats.index_reads += 1;
                    stats.block_guesses += 1;
                    *s = Source::Guessed { storage, guess };
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zcrop_codec::ffi::compress::blosc_compress;

    const ROWS: usize = 512;
    const ROW: usize = 640 * 4;

    /// The header of a chunk of `ROWS` rows of float32, blosc-lz4 in 256 KiB blocks, whose
    /// values carry `noise` bits of noise.
    fn header(noise: u32, seed: u64) -> Arc<BlockIndex> {
        let plain: Vec<u8> = (0..ROWS * ROW / 4)
            .flat_map(|i| {
                let h = ((i as u64 ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as u32;
                let v = ((i % 640) as f32 * 0.01).sin() * 100.0;
                f32::from_bits(v.to_bits() ^ (h & ((1 << noise) - 1))).to_le_bytes()
            })
            .collect();
        let chunk = blosc_compress(&plain, 4, 1, "lz4", 65536);
        Arc::new(
            BlockIndex::parse(&chunk[..BlockIndex::prefix_len(plain.len())], plain.len()).unwrap(),
        )
    }

    fn rows(r: Range<usize>) -> Range<usize> {
        r.start * ROW..r.end * ROW
    }

    /// The range a guess asks for, as offsets in a chunk of `len` bytes.
    fn span(guess: Guess, len: usize) -> Range<usize> {
        match guess.body {
            ReadRange::Bounded { offset, len } => offset as usize..(offset + len) as usize,
            ReadRange::Suffix(n) => len - n as usize..len,
            ReadRange::Whole => 0..len,
        }
    }

    /// Guesses cover the needed blocks of chunks like those seen, ask for the last blocks as
    /// a suffix, and forget a chunk unlike the rest once [`LAYOUT_HEADERS`] others follow.
    #[test]
    fn guesses_cover_chunks_like_those_seen() {
        let mut layout = BlockLayout::default();
        let band = rows(200..264);
        assert_eq!(layout.guess(&band, 4), None);
        let seen = header(6, 1);
        layout.learn(&seen);
        let other = header(6, 2);
        let guess = layout.guess(&band, 4).unwrap();
        assert_eq!(guess.head, seen.head_len());
        assert!(matches!(guess.body, ReadRange::Bounded { .. }));
        let needed = other.extent(&band, 4).unwrap();
        let asked = span(guess, other.encoded_len());
        assert!(
            asked.start <= needed.start && needed.end <= asked.end,
            "{asked:?} {needed:?}"
        );
        assert!(asked.len() * 2 <= other.encoded_len());
        // The last rows: the chunk's last bytes, whatever its length.
        let last = layout.guess(&rows(440..504), 4).unwrap();
        assert!(matches!(last.body, ReadRange::Suffix(_)));
        let needed = other.extent(&rows(440..504), 4).unwrap();
        let asked = span(last, other.encoded_len());
        assert!(asked.start <= needed.start && needed.end == asked.end);
        // Most of a chunk: no guess.
        assert_eq!(layout.guess(&rows(10..400), 4), None);
        // A noisy chunk widens the guesses (no guess saves half), until enough others follow.
        layout.learn(&header(20, 3));
        assert_eq!(layout.guess(&band, 4), None);
        let mut fresh = BlockLayout::default();
        for seed in 0..LAYOUT_HEADERS as u64 {
            layout.learn(&header(6, 10 + seed));
            fresh.learn(&header(6, 10 + seed));
        }
        assert!(layout.guess(&band, 4).is_some());
        assert_eq!(layout.guess(&band, 4), fresh.guess(&band, 4));
    }
}
