//! How to open an array ([`OpenOptions`]) and read it ([`ReadOptions`]), and what a read did
//! ([`ReadStats`], with why chunks were decoded whole: [`WholeReason`]).

use std::sync::atomic::AtomicBool;

use zcrop_io::{Budget, IoConfig, IoEngine, ObjectEngine};

use crate::decode::DecodeCost;
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
    /// The decoded-chunk cache: `None` (the default) shares the process-wide one (of
    /// [`crate::shared_chunk_cache_budget`] bytes) with every array opened so; `Some(0)` uses
    /// none; `Some(n)` gives the array one of its own of `n` bytes. Once full, a cache takes
    /// only chunks read again while remembered, so that chunks read once are still decoded in
    /// part; it holds no chunk of which fewer than four fit.
    pub chunk_cache_bytes: Option<usize>,
    /// Verify checksums (crc32c, zstd, gzip, zlib) while decoding. On by default; turning it off
    /// lets gzip and zlib chunks stop decoding early.
    pub verify_checksums: bool,
    /// From an object store, when to fetch only the blocks a read needs of a large unsharded
    /// blosc chunk (its header first, then those blocks). `ZCROP_BLOSC_BLOCK_FETCH` (`auto`,
    /// `always`, `never`) in the environment overrides it for every array opened.
    pub blosc_blocks: BlockFetch,
}

/// When reads fetch large blosc chunks by block ([`OpenOptions::blosc_blocks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockFetch {
    /// Where the header is cached, or other GETs are in flight (a loader reading ahead, whose
    /// rate the bytes moved bound, not one read's round trips); a read alone on the link
    /// fetches whole chunks.
    #[default]
    Auto,
    /// Always (where it saves at least half of a chunk): for slow links, where the bytes
    /// saved outweigh a round trip even for a read alone.
    Always,
    /// Never: chunks are fetched whole.
    Never,
}

impl BlockFetch {
    /// `auto`, `always` or `never`.
    pub fn parse(s: &str) -> Option<BlockFetch> {
        match s {
            "auto" => Some(BlockFetch::Auto),
            "always" => Some(BlockFetch::Always),
            "never" => Some(BlockFetch::Never),
            _ => None,
        }
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            engine: None,
            storage_options: Vec::new(),
            object_engine: None,
            index_cache_bytes: DEFAULT_INDEX_CACHE_BYTES,
            chunk_cache_bytes: None,
            verify_checksums: true,
            blosc_blocks: BlockFetch::Auto,
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
    /// Encoded bytes of the chunks read (of a chunk read by block: its header and blocks).
    pub chunk_bytes_read: u64,
    /// Shard indexes, and headers of blosc chunks read by block, read from storage.
    pub index_reads: u64,
    /// Shard indexes and blosc headers served by the index cache.
    pub index_cache_hits: u64,
    /// Blosc chunks fetched by block before their header was known: the header and a range
    /// around the blocks the read needs, where the array's other chunks hold them, together.
    pub block_guesses: u64,
    /// Of those, chunks whose needed blocks lay outside the range, fetched again.
    pub block_guess_misses: u64,
    /// Bytes written to the output.
    pub output_bytes: u64,
    /// Of each leaf chunk the read needed, the bytes from its start to the last one the crops
    /// need (summed): what a decoder that produces every byte up to there decodes (libzstd
    /// stopping early, inflate), where no chunk is cached.
    pub bytes_to_last_needed: u64,
    /// Of the chunks decoded, those decoded whole (all of the chunk's bytes), by why.
    pub whole_chunks: WholeChunks,
}

/// Why a chunk was decoded whole rather than only the part crops need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WholeReason {
    /// The crops need every byte of the chunk.
    NeededWhole,
    /// The codec stops only after a prefix (gzip, zlib) and the crops need the chunk's end.
    NeededEnd,
    /// A checksum of the whole chunk is verified (a zstd frame checksum, the gzip or zlib
    /// trailer) while checksums are verified.
    Checksum,
    /// zstd: decoding the needed literal streams and sequences would cost more than
    /// [`zcrop_codec::zstd::MAX_SHARE`] of libzstd decoding the block, so libzstd decodes it.
    ZstdNeededShareOverMax,
    /// zstd: decoding the sequences the range needs would cost more than libzstd decoding the
    /// whole block.
    ZstdTooManySequences,
    /// zstd: a frame of several blocks (chunks over 128 KiB) whose needed bytes reach its last
    /// block (libzstd stops only between blocks).
    ZstdMultiBlockFrame,
    /// zstd: anything else the partial decoder leaves to libzstd (a dictionary, bytes after the
    /// frame, a frame it calls damaged).
    ZstdOther,
    /// blosc: splits compressed by a codec other than LZ4 or zstd (blosclz, zlib, snappy).
    BloscOtherCompressor,
    /// blosc: anything else left to c-blosc whose needed bytes span all its blocks.
    BloscOther,
    /// The chain goes through zarrs' codec chain (filters, transposes, other compressors),
    /// which decodes whole chunks.
    CodecChain,
    /// The decoded-chunk cache keeps whole chunks.
    ChunkCache,
}

impl WholeReason {
    /// Every reason, in the order of [`WholeChunks`]'s counts.
    pub const ALL: [WholeReason; 11] = [
        WholeReason::NeededWhole,
        WholeReason::NeededEnd,
        WholeReason::Checksum,
        WholeReason::ZstdNeededShareOverMax,
        WholeReason::ZstdTooManySequences,
        WholeReason::ZstdMultiBlockFrame,
        WholeReason::ZstdOther,
        WholeReason::BloscOtherCompressor,
        WholeReason::BloscOther,
        WholeReason::CodecChain,
        WholeReason::ChunkCache,
    ];

    /// A stable snake_case name (the keys of `zcrop bench --json`'s `whole_chunk_reasons`).
    pub fn name(self) -> &'static str {
        match self {
            WholeReason::NeededWhole => "needed_whole",
            WholeReason::NeededEnd => "needed_end",
            WholeReason::Checksum => "checksum",
            WholeReason::ZstdNeededShareOverMax => "zstd_needed_share_over_max",
            WholeReason::ZstdTooManySequences => "zstd_too_many_sequences",
            WholeReason::ZstdMultiBlockFrame => "zstd_multi_block_frame",
            WholeReason::ZstdOther => "zstd_other",
            WholeReason::BloscOtherCompressor => "blosc_other_compressor",
            WholeReason::BloscOther => "blosc_other",
            WholeReason::CodecChain => "codec_chain",
            WholeReason::ChunkCache => "chunk_cache",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Chunks decoded whole, counted by [`WholeReason`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WholeChunks {
    counts: [u64; WholeReason::ALL.len()],
}

impl WholeChunks {
    /// One chunk decoded whole for `reason`.
    pub fn add(&mut self, reason: WholeReason) {
        self.counts[reason.index()] += 1;
    }

    /// Chunks decoded whole for `reason`.
    pub fn get(&self, reason: WholeReason) -> u64 {
        self.counts[reason.index()]
    }

    /// Chunks decoded whole, for any reason.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Each reason with its count (zero counts included), in [`WholeReason::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (WholeReason, u64)> + '_ {
        WholeReason::ALL.iter().map(|&r| (r, self.get(r)))
    }
}

impl std::ops::AddAssign for WholeChunks {
    fn add_assign(&mut self, o: Self) {
        for (a, b) in self.counts.iter_mut().zip(o.counts) {
            *a += b;
        }
    }
}

impl ReadStats {
    /// What a read of `plan` counts before it runs: its leaf chunks, its output, and how far
    /// into each leaf its crops reach.
    pub(crate) fn for_plan(plan: &crate::plan::Plan) -> Self {
        ReadStats {
            chunks: plan.num_leaves() as u64,
            output_bytes: plan.out_len as u64,
            bytes_to_last_needed: plan.leaves.iter().map(|l| l.needed.end as u64).sum(),
            ..ReadStats::default()
        }
    }

    /// Adds what decoding one chunk cost.
    pub(crate) fn add_cost(&mut self, cost: DecodeCost) {
        self.bytes_decoded += cost.bytes_decoded;
        if let Some(reason) = cost.whole {
            self.whole_chunks.add(reason);
        }
    }
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
        self.block_guesses += o.block_guesses;
        self.block_guess_misses += o.block_guess_misses;
        self.output_bytes += o.output_bytes;
        self.bytes_to_last_needed += o.bytes_to_last_needed;
        self.whole_chunks += o.whole_chunks;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_chunk_reasons_are_counted_and_summed() {
        for (i, r) in WholeReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
        let mut a = ReadStats::default();
        a.add_cost(DecodeCost {
            bytes_decoded: 100,
            whole: Some(WholeReason::ZstdTooManySequences),
        });
        a.add_cost(DecodeCost {
            bytes_decoded: 10,
            whole: None,
        });
        let mut b = ReadStats::default();
        b.add_cost(DecodeCost {
            bytes_decoded: 100,
            whole: Some(WholeReason::ZstdTooManySequences),
        });
        b.add_cost(DecodeCost {
            bytes_decoded: 100,
            whole: Some(WholeReason::BloscOtherCompressor),
        });
        a += b;
        assert_eq!(a.bytes_decoded, 310);
        assert_eq!(a.whole_chunks.get(WholeReason::ZstdTooManySequences), 2);
        assert_eq!(a.whole_chunks.get(WholeReason::BloscOtherCompressor), 1);
        assert_eq!(a.whole_chunks.get(WholeReason::NeededWhole), 0);
        assert_eq!(a.whole_chunks.total(), 3);
        let names: std::collections::HashSet<_> =
            WholeReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), WholeReason::ALL.len(), "names are distinct");
    }
}
