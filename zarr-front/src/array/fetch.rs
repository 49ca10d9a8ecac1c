//! Executing a planned read: every located leaf's bytes submitted to `zcrop-io` at once,
//! each chunk decoded on the rayon pool as its bytes arrive (several at a time where the codec
//! gains from it) and copied into every output block that needs it while it is in cache.
//! Results are taken from `zcrop-io` only while few decode tasks wait ([`crate::throttle`]),
//! so reading stays just ahead of decoding.

use std::cell::RefCell;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytes::Bytes;
use rustc_hash::FxHashMap;
use zcrop_io::sync::Mutex;
use zcrop_io::{IoError, ReadRange, ReadRequest};

use crate::decode::DecodeError;
use crate::error::{Location, Result, ZarrError};
use crate::plan::Plan;
use crate::stitch::{DisjointOut, contiguous_target};
use crate::store::Reader;
use crate::throttle::{Throttle, decode_scope, decode_threads};
use crate::transform::StitchTransform;

use super::Array;
use super::blocks::{Guess, Guessed};
use super::locate::{FIRST_LOCATED, FileStamp};
use super::options::{ReadOptions, ReadStats, WholeReason};

/// The shared state of one read's stitch tasks.
pub(crate) struct StitchCtx<'p, 'o> {
    plan: &'p Plan,
    out: &'p DisjointOut<'o>,
    transform: Option<&'p dyn StitchTransform>,
    /// Copies still to write, per request; the task that writes a block's last copy finishes it
    /// (counted only with a transform, the only one that finishes blocks).
    remaining: Vec<AtomicU32>,
    failed: AtomicBool,
    /// The first failure.
    error: Mutex<Option<Failure>>,
    pub(crate) stats: Mutex<ReadStats>,
    cancel: Option<&'p AtomicBool>,
}

impl<'p, 'o> StitchCtx<'p, 'o> {
    /// The state of a read of `plan` into `out`.
    pub(crate) fn new(plan: &'p Plan, out: &'p DisjointOut<'o>, options: ReadOptions<'p>) -> Self {
        StitchCtx {
            plan,
            out,
            transform: options.transform,
            remaining: plan
                .copies_per_request
                .iter()
                .map(|&n| AtomicU32::new(n))
                .collect(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            stats: Mutex::new(ReadStats::default()),
            cancel: options.cancel,
        }
    }

    fn cancelled(&self) -> bool {
        self.cancel.is_some_and(|c| c.load(Ordering::Acquire))
    }

    fn fail(&self, e: ZarrError) {
        self.failed.store(true, Ordering::Release);
        self.error.lock().get_or_insert(Failure::Error(e));
    }

    /// Records a fault of the bytes of `chunk`.
    fn fail_chunk(&self, chunk: &Fetched, fault: ChunkFault) {
        self.failed.store(true, Ordering::Release);
        self.error.lock().get_or_insert(Failure::Chunk {
            storage: chunk.storage,
            range: chunk.range,
            fault,
        });
    }

    /// Writes every copy of leaf `i` from its decoded bytes (none if the transform skips them).
    fn stitch_leaf(&self, i: usize, chunk: &[u8]) {
        let skip = self.transform.is_some_and(|t| t.skips_chunk(chunk));
        for c in self.plan.copies(&self.plan.leaves[i]) {
            if !skip {
                self.out
                    .copy_from_chunk(self.plan, c, chunk, self.transform);
            }
            self.copy_done(c.index);
        }
    }

    /// Writes every copy of leaf `i` with the fill value (none if the transform skips it).
    fn fill_leaf(&self, i: usize, fill: &[u8]) {
        let skip = self.transform.is_some_and(|t| t.skips_chunk(fill));
        for c in self.plan.copies(&self.plan.leaves[i]) {
            if !skip {
                self.out.fill(self.plan, c, fill, self.transform);
            }
            self.copy_done(c.index);
        }
    }

    /// Records one finished copy of `request`; the last one finishes the block.
    fn copy_done(&self, request: usize) {
        // Only a transform finishes blocks; without one, counting would only bounce the
        // counters' cache lines between the threads.
        if self.transform.is_none() {
            return;
        }
        if self.remaining[request].fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish_block(request);
        }
    }

    fn finish_block(&self, request: usize) {
        let Some(t) = self.transform else { return };
        if self.failed.load(Ordering::Acquire) {
            return;
        }
        if let Err(reason) = self
            .out
            .with_block(self.plan, request, |block| t.finish_block(request, block))
        {
            self.fail(ZarrError::Transform { request, reason });
        }
    }
}

/// Where a leaf chunk's bytes are.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// Not stored: fill value.
    Missing,
    /// In the decoded-chunk cache.
    Cached(Bytes),
    /// These bytes of storage chunk `storage`.
    Read { storage: usize, range: ReadRange },
    /// Encoded bytes at hand (an Icechunk chunk inline in its manifest, `storage`).
    Inline { storage: usize, bytes: Bytes },
    /// Encoded chunk `storage` as the chunk cache keeps it (see [`Array::keeps_encoded_chunks`]).
    KeptEncoded { storage: usize, bytes: Bytes },
    /// The bytes `span` of blosc chunk `storage`: the blocks the read needs, which `index`
    /// rebuilds into a chunk (see [`super::blocks`]).
    Blocks {
        storage: usize,
        index: Arc<zcrop_codec::blosc::BlockIndex>,
        span: Range<usize>,
    },
    /// Blosc chunk `storage`, whose header is not known: its header and a guess of where the
    /// blocks the read needs are, fetched together (see [`super::blocks`]).
    Guessed { storage: usize, guess: Guess },
}

impl Source {
    /// The storage chunk and byte range to read, for a source that is read.
    fn read(&self) -> Option<(usize, ReadRange)> {
        match self {
            Source::Read { storage, range } => Some((*storage, *range)),
            Source::Blocks { storage, span, .. } => Some((
                *storage,
                ReadRange::new(span.start as u64, span.len() as u64),
            )),
            Source::Guessed { storage, guess } => Some((*storage, guess.body)),
            Source::Missing
            | Source::Cached(_)
            | Source::Inline { .. }
            | Source::KeptEncoded { .. } => None,
        }
    }
}

/// A storage chunk (a file) a read touches.
pub(crate) struct Storage {
    pub(crate) key: String,
    pub(crate) path: Arc<Path>,
    /// Its version, for the caches (see [`FileStamp`]).
    pub(crate) stamp: Option<FileStamp>,
    /// The reader of a storage chunk outside the array's store (an Icechunk virtual chunk's
    /// file or object); `None` for the array's own reader.
    pub(crate) reader: Option<Reader>,
}

/// The storage chunks a read has located so far: the list grows as the read locates more of
/// its leaves (see [`FIRST_LOCATED`]).
#[derive(Default)]
pub(crate) struct Storages {
    pub(crate) list: Vec<Storage>,
    /// Each one's index in `list`, by its coordinates in the storage grid.
    pub(crate) index: FxHashMap<Vec<u64>, usize>,
    /// Each one's index in `list`, by its key (an Icechunk array's chunk objects).
    pub(crate) by_key: FxHashMap<String, usize>,
    /// The Icechunk manifests the read has fetched.
    pub(crate) manifests: crate::icechunk::HeldManifests,
}

/// A leaf's encoded bytes, as read, and where they are from.
struct Fetched {
    leaf: usize,
    bytes: Bytes,
    /// The storage chunk (an index in [`Storages::list`]) and the range of it.
    storage: usize,
    range: ReadRange,
    /// The storage chunk's version when the read located it.
    stamp: Option<FileStamp>,
    /// Whether `bytes` were assembled from the blocks the read needs (see [`super::blocks`]),
    /// so decode only to those: such a chunk is never kept whole.
    blocks_only: bool,
    /// Whether `bytes` came from the chunk cache (an encoded chunk it keeps), not storage.
    cached: bool,
}

impl Fetched {
    /// Encoded bytes this leaf read from storage (none where the chunk cache had them).
    fn read_len(&self) -> u64 {
        if self.cached {
            0
        } else {
            self.bytes.len() as u64
        }
    }
}

/// The first failure of a read. A decode task names a faulty chunk by its storage chunk's
/// index: the storage list grows while tasks run, so the read names the key once it is over.
enum Failure {
    Error(ZarrError),
    Chunk {
        storage: usize,
        range: ReadRange,
        fault: ChunkFault,
    },
}

/// What was wrong with a chunk's bytes.
enum ChunkFault {
    /// They came from a mapping of a file that shrank meanwhile.
    Lost,
    /// The codec rejected them, or there was no memory to decode them into.
    Decode(DecodeError),
}

/// Chunks decoded per task where the decoder gains from decoding several together: four
/// zstd chunks of more than 64 KiB interleave enough independent literal streams to keep a
/// core busy (smaller zstd chunks go by [`SMALL_ZSTD_DECODE_GROUP`]); small chunks of other
/// codecs go at least this many at a time for their prefetches (see [`SMALL_DECODE_GROUP`]).
const DECODE_GROUP: usize = 4;

/// Chunks of at most this many decoded bytes are decoded in groups (see [`SMALL_DECODE_GROUP`])
/// with the next chunk's bytes prefetched (see `Array::decode_and_stitch_each`).
const PREFETCHED_CHUNK_BYTES: usize = 64 << 10;

/// zstd chunks of at most [`PREFETCHED_CHUNK_BYTES`] decode in groups of this many: a crop's
/// band needs only one or two of such a chunk's four literal streams, so more chunks are
/// needed to keep the streams' lockstep busy; larger groups gain nothing more and make
/// tasks coarser.
const SMALL_ZSTD_DECODE_GROUP: usize = 8;

/// The largest group size up to `group` that splits `n` chunks into a multiple of `threads`
/// tasks of near-equal size: a small read's last round of tasks then does not leave threads
/// idle (12 chunks in groups of 4 on 2 threads take 8 chunks' time, in groups of 3 only 6).
fn balanced_group(n: usize, group: usize, threads: usize) -> usize {
    let tasks = n.div_ceil(group).next_multiple_of(threads.max(1)).max(1);
    n.div_ceil(tasks).clamp(1, group)
}

/// Small chunks of codecs other than zstd (see [`PREFETCHED_CHUNK_BYTES`]) decode in groups of
/// up to this many, fewer where a read has too few chunks to give every thread 8 groups (but at
/// least [`DECODE_GROUP`]). Longer groups spawn fewer tasks and break the prefetch of the next
/// chunk's bytes less often.
const SMALL_DECODE_GROUP: usize = 32;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Array {
    /// Runs a plan: locate, fetch, decode and stitch.
    pub(super) fn execute(
        &self,
        plan: &Plan,
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        let mut stats = ReadStats::for_plan(plan);
        self.fixed_size_elements()?;
        if options.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(ZarrError::Cancelled);
        }
        let out_buf = DisjointOut::for_plan(out, plan);
        let ctx = StitchCtx::new(plan, &out_buf, options);
        if plan.num_leaves() > 0 {
            self.fetch_and_stitch(&ctx, &mut stats)?;
        }
        stats += ctx.stats.into_inner();
        Ok(stats)
    }

    pub(crate) fn fetch_and_stitch(
        &self,
        ctx: &StitchCtx<'_, '_>,
        stats: &mut ReadStats,
    ) -> Result<()> {
        fetch_and_stitch_parts(&[Part { array: self, ctx }], std::slice::from_mut(stats))
    }

    /// The leaves of `ctx`'s plan known without reading storage (decoded-chunk cache hits),
    /// and how many leaves to locate before the first reads go out.
    fn prepare(
        &self,
        ctx: &StitchCtx<'_, '_>,
        stats: &mut ReadStats,
    ) -> (Vec<Option<Source>>, usize) {
        let core = &*self.core;
        let plan = ctx.plan;
        let n = plan.num_leaves();
        let mut known: Vec<Option<Source>> = vec![None; n];
        // (An array whose cache keeps encoded chunks reads them once located: see
        // `fetch_needed_blocks`.)
        if let Some(cache) = &core.caches().chunk
            && !self.keeps_encoded_chunks()
        {
            // A cached chunk counts while its file is the one it was decoded from.
            let mut stamps: FxHashMap<Vec<u64>, Option<FileStamp>> = FxHashMap::default();
            let (mut storage, mut inner) = (Vec::new(), vec![0; core.layout.levels.len()]);
            for (i, leaf) in plan.leaves.iter().enumerate() {
                if let Some((stamp, chunk)) = cache.get(&leaf.coords) {
                    core.layout.locate(&leaf.coords, &mut storage, &mut inner);
                    let now = match stamps.get(&storage) {
                        Some(&s) => s,
                        None => {
                            let rel = core.meta.chunk_key(&storage).to_string();
                            let s = self.stamp(&core.place.dir.join(rel));
                            stamps.insert(storage.clone(), s);
                            s
                        }
                    };
                    if now == stamp {
                        known[i] = Some(Source::Cached(chunk));
                        stats.chunks_cached += 1;
                    }
                }
            }
        }
        // A large read of a sharded array from local files locates its first leaves alone (see
        // FIRST_LOCATED); from an object store the rest would wait for the first reads' round
        // trips.
        let sharded = !core.layout.levels.is_empty();
        let first = if sharded && matches!(core.reader, Reader::Local(_)) && n > 2 * FIRST_LOCATED {
            FIRST_LOCATED
        } else {
            n
        };
        (known, first)
    }

    /// Chunks of this array decoded per task (see [`DECODE_GROUP`]) in a read of `n` leaves.
    fn group_size(&self, n: usize) -> usize {
        let core = &*self.core;
        // zstd chunks decode their needed parts faster several at a time (their literal
        // streams interleave): completions go to tasks in groups.
        // Small chunks go to tasks in groups too, decoded one after the other, each with
        // the next one's bytes asked for meanwhile (see `decode_and_stitch_each`).
        let small = core.decoder.chunk_bytes <= PREFETCHED_CHUNK_BYTES;
        if core.decoder.decodes_in_groups() {
            let group = if small {
                SMALL_ZSTD_DECODE_GROUP
            } else {
                DECODE_GROUP
            };
            balanced_group(n, group, decode_threads())
        } else if small {
            // Up to SMALL_DECODE_GROUP while every thread still gets 8 groups; never
            // fewer than DECODE_GROUP chunks a group.
            (n / (8 * decode_threads())).clamp(DECODE_GROUP, SMALL_DECODE_GROUP)
        } else {
            1
        }
    }

    /// Decodes and stitches a group of this array's fetched leaves (one decode task).
    fn decode_group(&self, ctx: &StitchCtx<'_, '_>, group: &[Fetched]) {
        if ctx.failed.load(Ordering::Acquire) {
            return;
        }
        if ctx.cancelled() {
            ctx.fail(ZarrError::Cancelled);
            return;
        }
        let decoded = if group.len() == 1 {
            vec![self.decode_and_stitch(ctx, &group[0])]
        } else if self.core.decoder.decodes_in_groups() {
            self.decode_and_stitch_group(ctx, group)
        } else {
            self.decode_and_stitch_each(ctx, group)
        };
        // Summed here, added to the shared total once per group.
        let mut group_stats = ReadStats::default();
        for (chunk, decoded) in group.iter().zip(decoded) {
            // Bytes from a mapping of a file truncated meanwhile read as zeros: that, not what
            // the decoder made of them, is the error.
            if !zcrop_io::mapped_intact(&chunk.bytes) {
                ctx.fail_chunk(chunk, ChunkFault::Lost);
                return;
            }
            match decoded {
                Ok(s) => group_stats += s,
                Err(e) => ctx.fail_chunk(chunk, ChunkFault::Decode(e)),
            }
        }
        *ctx.stats.lock() += group_stats;
    }

    /// The error of a read whose stitch state recorded `failure`.
    fn failure_error(&self, failure: Failure, storages: &Storages) -> ZarrError {
        match failure {
            Failure::Error(e) => e,
            Failure::Chunk {
                storage,
                range,
                fault,
            } => {
                let Storage { key, path, .. } = &storages.list[storage];
                let at = self.location(key, Some(range));
                match fault {
                    ChunkFault::Lost => ZarrError::Io {
                        at,
                        source: Box::new(IoError::FileChanged {
                            path: Arc::clone(path),
                            range,
                        }),
                    },
                    ChunkFault::Decode(e) => decode_error(at, e),
                }
            }
        }
    }

    pub(crate) fn chunk_read_error(&self, key: &str, e: IoError, sharded: bool) -> ZarrError {
        match e {
            IoError::RangePastEof {
                range, file_len, ..
            } if sharded => ZarrError::ShardIndex {
                at: self.location(key, Some(range)),
                reason: format!("it points past the end of the shard file ({file_len} bytes)"),
            },
            e => ZarrError::Io {
                at: self.location(key, Some(e.range())),
                source: Box::new(e),
            },
        }
    }

    /// Decodes the leaves of `group` together where the decoder can
    /// ([`LeafDecoder::with_decoded_group`]) and writes all their copies; returns each one's
    /// cost. Leaves needed whole take [`Self::decode_and_stitch`] (straight into the output).
    fn decode_and_stitch_group(
        &self,
        ctx: &StitchCtx<'_, '_>,
        group: &[Fetched],
    ) -> Vec<Result<ReadStats, DecodeError>> {
        let core = &*self.core;
        let plan = ctx.plan;
        let full = core.decoder.chunk_bytes;
        let mut results: Vec<Option<Result<ReadStats, DecodeError>>> = vec![None; group.len()];
        let mut members = Vec::with_capacity(group.len());
        for (k, chunk) in group.iter().enumerate() {
            if plan.leaves[chunk.leaf].needed.len() >= full {
                results[k] = Some(self.decode_and_stitch(ctx, chunk));
            } else if self.keeps(ctx, chunk) {
                results[k] = Some(self.decode_and_keep(ctx, chunk));
            } else {
                members.push(k);
            }
        }
        for &k in &members {
            zcrop_codec::dest::prefetch_read(&group[k].bytes);
        }
        let items: Vec<(&[u8], Range<usize>)> = members
            .iter()
            .map(|&k| {
                let chunk = &group[k];
                (&chunk.bytes[..], plan.leaves[chunk.leaf].needed.clone())
            })
            .collect();
        let costs = core.decoder.with_decoded_group(&items, |m, chunk| {
            ctx.stitch_leaf(group[members[m]].leaf, chunk);
        });
        for (&k, cost) in members.iter().zip(costs) {
            results[k] = Some(cost.map(|c| {
                let mut stats = ReadStats {
                    chunks_decoded: 1,
                    chunk_bytes_read: group[k].read_len(),
                    ..ReadStats::default()
                };
                stats.add_cost(c);
                stats
            }));
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(DecodeError::from("chunk left undecoded"))))
            .collect()
    }

    /// Decodes the leaves of `group` one after the other ([`Self::decode_and_stitch`]); while
    /// one decodes, the next one's encoded bytes are asked for, so that they come from memory
    /// (a mapping of the page cache, which the CPU has not seen) in parallel rather than one
    /// cache miss at a time as the decoder reaches them.
    fn decode_and_stitch_each(
        &self,
        ctx: &StitchCtx<'_, '_>,
        group: &[Fetched],
    ) -> Vec<Result<ReadStats, DecodeError>> {
        let decoder = &self.core.decoder;
        // Two steps ahead, the first cache line (a blosc header); one step ahead, what the
        // decoder reads from there.
        let first_line =
            |bytes: &Bytes| zcrop_codec::dest::prefetch_read(&bytes[..bytes.len().min(64)]);
        for chunk in group.iter().take(2) {
            first_line(&chunk.bytes);
        }
        group
            .iter()
            .enumerate()
            .map(|(k, chunk)| {
                if let Some(later) = group.get(k + 2) {
                    first_line(&later.bytes);
                }
                if let Some(next) = group.get(k + 1) {
                    decoder.prefetch(&next.bytes, &ctx.plan.leaves[next.leaf].needed);
                }
                self.decode_and_stitch(ctx, chunk)
            })
            .collect()
    }

    /// Whether the leaf `fetched` holds goes into the decoded-chunk cache (see
    /// [`super::DecodedChunks::keeps`]); counts as its read there, even where only its
    /// blocks were fetched. Ask once per leaf. The process-wide cache keeps chunks cheap to
    /// read again only where it would serve enough of their reads
    /// ([`super::DecodedChunks::keeps_cheap_chunks`]): chunks of local files that decode at
    /// about the speed of a copy (LZ4 inside blosc, no compressor), which read again from the
    /// page cache cost about what a copy out of the cache does, and large blosc chunks from an
    /// object store, read again as the few blocks a read needs ([`Self::fetches_blosc_blocks`]).
    /// Keeping the first costs a whole decode into new memory, the second a whole GET (they
    /// are kept as fetched). A chunk read from the cache is not kept again.
    fn keeps(&self, ctx: &StitchCtx<'_, '_>, fetched: &Fetched) -> bool {
        let core = &*self.core;
        let Some(cache) = core.caches().chunk.as_ref() else {
            return false;
        };
        let coords = &ctx.plan.leaves[fetched.leaf].coords;
        let again = cache.keeps(coords);
        let cheap = cache.keeps_cheap_chunks(|| match core.reader {
            Reader::Local(_) => core.decoder.decodes_fast(&fetched.bytes),
            Reader::Object(_) => self.fetches_blosc_blocks(),
        });
        again && cheap && !fetched.blocks_only && !fetched.cached
    }

    /// Decodes the leaf `fetched` holds, writes all its copies and keeps it in the chunk
    /// cache: decoded whole, or as fetched where the array's cache keeps encoded chunks
    /// ([`Self::keeps_encoded_chunks`]; then decoded only where its crops need); returns what
    /// it cost.
    fn decode_and_keep(
        &self,
        ctx: &StitchCtx<'_, '_>,
        fetched: &Fetched,
    ) -> Result<ReadStats, DecodeError> {
        if !self.keeps_encoded_chunks() {
            return self.decode_whole_and_keep(ctx, fetched);
        }
        let stats = self.decode_part_and_stitch(ctx, fetched)?;
        if let Some(cache) = &self.core.caches().chunk {
            let coords = &ctx.plan.leaves[fetched.leaf].coords;
            cache.insert(coords, fetched.stamp, fetched.bytes.clone());
        }
        Ok(stats)
    }

    /// Decodes the leaf `fetched` holds whole, writes all its copies and keeps it in the
    /// decoded-chunk cache; returns what it cost.
    fn decode_whole_and_keep(
        &self,
        ctx: &StitchCtx<'_, '_>,
        fetched: &Fetched,
    ) -> Result<ReadStats, DecodeError> {
        let (i, bytes) = (fetched.leaf, &fetched.bytes);
        let core = &*self.core;
        let leaf = &ctx.plan.leaves[i];
        let mut stats = ReadStats {
            chunks_decoded: 1,
            chunk_bytes_read: fetched.read_len(),
            ..ReadStats::default()
        };
        let mut chunk = Vec::new();
        crate::decode::zeroed(&mut chunk, core.decoder.chunk_bytes)?;
        let mut cost = core.decoder.decode_full_into(bytes, &mut chunk)?;
        if cost.whole.is_some() && leaf.needed.len() < core.decoder.chunk_bytes {
            cost.whole = Some(WholeReason::ChunkCache);
        }
        stats.add_cost(cost);
        // Kept without a copy: `Bytes` takes the vector's allocation.
        let chunk = Bytes::from(chunk);
        ctx.stitch_leaf(i, &chunk);
        // The caller reports lost bytes; a chunk decoded from them is not kept. Nor is a chunk
        // of a local file read without its file's version (read before the cache took the
        // array's chunks): it could never be served.
        if let Some(cache) = &core.caches().chunk
            && zcrop_io::mapped_intact(bytes)
            && (fetched.stamp.is_some() || !matches!(core.reader, Reader::Local(_)))
        {
            cache.insert(&leaf.coords, fetched.stamp, chunk);
        }
        Ok(stats)
    }

    /// Decodes the leaf `fetched` holds and writes all its copies; returns what it cost.
    fn decode_and_stitch(
        &self,
        ctx: &StitchCtx<'_, '_>,
        fetched: &Fetched,
    ) -> Result<ReadStats, DecodeError> {
        if self.keeps(ctx, fetched) {
            return self.decode_and_keep(ctx, fetched);
        }
        self.decode_part_and_stitch(ctx, fetched)
    }

    /// Decodes what crops need of the leaf `fetched` holds and writes all its copies; returns
    /// what it cost.
    fn decode_part_and_stitch(
        &self,
        ctx: &StitchCtx<'_, '_>,
        fetched: &Fetched,
    ) -> Result<ReadStats, DecodeError> {
        let (i, bytes) = (fetched.leaf, &fetched.bytes);
        let core = &*self.core;
        let plan = ctx.plan;
        let leaf = &plan.leaves[i];
        let mut stats = ReadStats {
            chunks_decoded: 1,
            chunk_bytes_read: fetched.read_len(),
            ..ReadStats::default()
        };
        // A copy that takes the whole chunk contiguously: decode straight into the output, then
        // serve the chunk's other copies from there.
        if core.decoder.decodes_in_place()
            && ctx.transform.is_none()
            && let Some(direct) = plan
                .copies(leaf)
                .find(|c| contiguous_target(plan, *c).is_some())
            && let Some(decoded) = ctx.out.with_whole_chunk_target(plan, direct, |target| {
                core.decoder.decode_full_into(bytes, target)
            })
        {
            let range = contiguous_target(plan, direct).unwrap_or_default();
            stats.add_cost(decoded?);
            let chunk = ctx.out.written(range.clone());
            for c in plan.copies(leaf) {
                if contiguous_target(plan, c) != Some(range.clone()) {
                    ctx.out.copy_from_chunk(plan, c, chunk, None);
                }
            }
            // Count the copies only after the direct one has been read back from.
            for c in plan.copies(leaf) {
                ctx.copy_done(c.index);
            }
            return Ok(stats);
        }
        // A blosc chunk unshuffles just the bytes each crop needs, straight into it.
        if ctx.transform.is_none()
            && let Some(opened) =
                core.decoder
                    .with_blosc_chunk(bytes, leaf.needed.clone(), |chunk| {
                        for c in plan.copies(leaf) {
                            ctx.out
                                .copy_groups_with(plan, c, |g, rows| chunk.gather_group(g, rows));
                            ctx.copy_done(c.index);
                        }
                    })
        {
            let ((), cost) = opened?;
            stats.add_cost(cost);
            return Ok(stats);
        }
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let ((), cost) =
                core.decoder
                    .with_decoded(bytes, leaf.needed.clone(), &mut scratch, |chunk| {
                        ctx.stitch_leaf(i, chunk);
                    })?;
            stats.add_cost(cost);
            Ok(stats)
        })
    }
}

/// One array's share of a read of one or more arrays: the array and its stitch state.
pub(crate) struct Part<'a, 'p, 'o> {
    pub(crate) array: &'a Array,
    pub(crate) ctx: &'a StitchCtx<'p, 'o>,
}

/// A part's leaves of one submission: each one's index in the plan (in increasing order) and
/// where it is.
struct Located {
    sources: Vec<(usize, Source)>,
}

impl Located {
    /// Leaves `base..` of a plan.
    fn from(base: usize, sources: Vec<Source>) -> Self {
        Located {
            sources: (base..).zip(sources).collect(),
        }
    }

    /// Where leaf `i` is, if it is one of these.
    fn get(&self, i: usize) -> Option<&Source> {
        let at = self.sources.binary_search_by_key(&i, |(j, _)| *j).ok()?;
        Some(&self.sources[at].1)
    }
}

/// Whether any part has leaves in `located`.
fn any_located(located: &[Option<Located>]) -> bool {
    located
        .iter()
        .any(|l| l.as_ref().is_some_and(|l| !l.sources.is_empty()))
}

/// Reads the leaves of every part: locates them, submits the reads of all parts that share an
/// engine as one batch, and decodes and stitches each part's chunks as their bytes arrive.
/// Part `k`'s locating costs go to `stats[k]`; the first failure of any part is the error.
pub(crate) fn fetch_and_stitch_parts(
    parts: &[Part<'_, '_, '_>],
    stats: &mut [ReadStats],
) -> Result<()> {
    // Request ids: part k's leaf i is `offsets[k] + i`.
    let mut offsets = Vec::with_capacity(parts.len());
    let mut total = 0usize;
    for p in parts {
        offsets.push(total);
        total += p.ctx.plan.num_leaves();
    }
    let mut storages: Vec<Storages> = parts.iter().map(|_| Storages::default()).collect();
    let mut rest: Vec<(usize, Vec<Option<Source>>)> = Vec::with_capacity(parts.len());
    let mut first: Vec<Option<Located>> = Vec::with_capacity(parts.len());
    for (k, p) in parts.iter().enumerate() {
        let (mut known, n_first) = p.array.prepare(p.ctx, &mut stats[k]);
        let rest_known = known.split_off(n_first);
        let mut sources = p.array.locate(
            p.ctx.plan,
            0..n_first,
            known,
            &mut storages[k],
            &mut stats[k],
        )?;
        p.array
            .fetch_needed_blocks(p.ctx.plan, 0, &mut sources, &storages[k], &mut stats[k]);
        rest.push((n_first, rest_known));
        first.push(Some(Located::from(0, sources)));
    }
    // Parts submit together when they read through the same engine as an earlier part.
    let submitter: Vec<usize> = (0..parts.len())
        .map(|k| {
            (0..k)
                .find(|&j| {
                    parts[j]
                        .array
                        .core
                        .reader
                        .same_engine(&parts[k].array.core.reader)
                })
                .unwrap_or(k)
        })
        .collect();
    let group_sizes: Vec<usize> = parts
        .iter()
        .map(|p| p.array.group_size(p.ctx.plan.num_leaves()))
        .collect();
    let any_failed = || parts.iter().any(|p| p.ctx.failed.load(Ordering::Acquire));

    let throttle = Throttle::for_decode_threads();
    let throttle = &throttle;
    decode_scope(|scope| {
        let spawn_group = |k: usize, group: Vec<Fetched>| {
            let Part { array, ctx } = parts[k];
            let slot = throttle.acquire();
            scope.spawn(move |_| {
                let _slot = slot;
                array.decode_group(ctx, &group);
            });
        };
        let mut groups: Vec<Vec<Fetched>> =
            group_sizes.iter().map(|&g| Vec::with_capacity(g)).collect();
        // Fetches, decodes and stitches the leaves `located[k]` of each part; returns the
        // leaves to fetch again (blosc chunks whose needed blocks a guess missed).
        let mut run = |located: &[Option<Located>], storages: &[Storages]| {
            let mut again: Vec<Vec<(usize, Source)>> = parts.iter().map(|_| Vec::new()).collect();
            // One batch per engine: each part's (sharing its submitter's), then the engines of
            // storage chunks outside the parts' stores.
            let mut batches: Vec<(Option<Reader>, Vec<ReadRequest>)> =
                (0..parts.len()).map(|_| (None, Vec::new())).collect();
            for (k, loc) in located.iter().enumerate() {
                let Some(Located { sources }) = loc else {
                    continue;
                };
                let Part { array, ctx } = parts[k];
                let core = &*array.core;
                let mut missing = 0;
                for &(i, ref s) in sources {
                    match s {
                        Source::Missing => {
                            missing += 1;
                            scope.spawn(move |_| ctx.fill_leaf(i, &core.layout.fill));
                        }
                        Source::Cached(chunk) => {
                            let chunk = chunk.clone();
                            scope.spawn(move |_| ctx.stitch_leaf(i, &chunk));
                        }
                        Source::Inline { storage, bytes }
                        | Source::KeptEncoded { storage, bytes } => {
                            groups[k].push(Fetched {
                                leaf: i,
                                bytes: bytes.clone(),
                                storage: *storage,
                                range: ReadRange::new(0, bytes.len() as u64),
                                stamp: None,
                                blocks_only: false,
                                cached: matches!(s, Source::KeptEncoded { .. }),
                            });
                            if groups[k].len() == group_sizes[k] {
                                let full = std::mem::replace(
                                    &mut groups[k],
                                    Vec::with_capacity(group_sizes[k]),
                                );
                                spawn_group(k, full);
                            }
                        }
                        Source::Read { .. } | Source::Blocks { .. } | Source::Guessed { .. } => {
                            let Some((storage, range)) = s.read() else {
                                continue;
                            };
                            let st = &storages[k].list[storage];
                            let id = offsets[k] + i;
                            let mut requests =
                                vec![ReadRequest::new(id as u64, Arc::clone(&st.path), range)];
                            // A guess's header goes with its blocks, under an id past the leaves'.
                            if let Source::Guessed { guess, .. } = s {
                                let head = ReadRange::new(0, guess.head as u64);
                                let path = Arc::clone(&st.path);
                                requests.push(ReadRequest::new((total + id) as u64, path, head));
                            }
                            match &st.reader {
                                None => batches[submitter[k]].1.extend(requests),
                                Some(r) => {
                                    let own = batches[parts.len()..].iter_mut().find(|(b, _)| {
                                        b.as_ref().is_some_and(|b| b.same_engine(r))
                                    });
                                    match own {
                                        Some((_, own)) => own.extend(requests),
                                        None => batches.push((Some(r.clone()), requests)),
                                    }
                                }
                            }
                        }
                    }
                }
                ctx.stats.lock().chunks_missing += missing;
            }
            // The half of a guess (header or blocks) that came first, by leaf request id.
            let mut halves: FxHashMap<usize, std::result::Result<Bytes, IoError>> =
                FxHashMap::default();
            for (j, (reader, requests)) in batches.into_iter().enumerate() {
                if requests.is_empty() {
                    continue;
                }
                let reader = reader
                    .as_ref()
                    .unwrap_or_else(|| &parts[j].array.core.reader);
                // Mapped results are checked once decoded (`decode_group`).
                for done in reader.submit_mapped(requests) {
                    if any_failed() {
                        break;
                    }
                    if let Some(p) = parts.iter().find(|p| p.ctx.cancelled()) {
                        p.ctx.fail(ZarrError::Cancelled);
                        break;
                    }
                    let (id, head) = match (done.id as usize).checked_sub(total) {
                        Some(id) => (id, true),
                        None => (done.id as usize, false),
                    };
                    let k = offsets.partition_point(|&o| o <= id) - 1;
                    let i = id - offsets[k];
                    let Some(source) = located[k].as_ref().and_then(|l| l.get(i)) else {
                        continue;
                    };
                    let Some((storage, range)) = source.read() else {
                        continue;
                    };
                    let Part { array, ctx } = parts[k];
                    let core = &*array.core;
                    let sharded = !core.layout.levels.is_empty();
                    let path = &storages[k].list[storage].path;
                    let result = match source {
                        // Blocks fetched alone become a chunk of their own (the header's, then
                        // theirs), which decodes the needed bytes as the whole chunk would.
                        Source::Blocks { index, span, .. } => match done.result {
                            Ok(bytes) => match index.assemble(span, &bytes) {
                                Ok(chunk) => Ok(Bytes::from(chunk)),
                                Err(reason) => {
                                    let key = &storages[k].list[storage].key;
                                    ctx.fail(ZarrError::Codec {
                                        at: array.location(key, Some(range)),
                                        reason,
                                    });
                                    continue;
                                }
                            },
                            Err(e) => Err(e),
                        },
                        // A guess needs its header and its blocks: the first to come waits.
                        Source::Guessed { .. } => {
                            let Some(first) = halves.remove(&id) else {
                                halves.insert(id, done.result);
                                continue;
                            };
                            let (head, body) = if head {
                                (done.result, first)
                            } else {
                                (first, done.result)
                            };
                            let needed = &ctx.plan.leaves[i].needed;
                            match array.take_guess(path, needed, head, body, range) {
                                Ok(Guessed::Chunk(chunk)) => Ok(Bytes::from(chunk)),
                                Ok(Guessed::Refetch(index, span)) => {
                                    ctx.stats.lock().block_guess_misses += 1;
                                    again[k].push((
                                        i,
                                        Source::Blocks {
                                            storage,
                                            index,
                                            span,
                                        },
                                    ));
                                    continue;
                                }
                                Ok(Guessed::Whole) => {
                                    let range = ReadRange::Whole;
                                    again[k].push((i, Source::Read { storage, range }));
                                    continue;
                                }
                                Err(e) => Err(e),
                            }
                        }
                        _ => done.result,
                    };
                    let blocks_only =
                        matches!(source, Source::Blocks { .. } | Source::Guessed { .. });
                    match result {
                        Ok(bytes) => {
                            if !blocks_only && range == ReadRange::Whole {
                                array.note_block_index(path, &bytes);
                            }
                            groups[k].push(Fetched {
                                leaf: i,
                                bytes,
                                storage,
                                range,
                                stamp: storages[k].list[storage].stamp,
                                blocks_only,
                                cached: false,
                            });
                            if groups[k].len() == group_sizes[k] {
                                let full = std::mem::replace(
                                    &mut groups[k],
                                    Vec::with_capacity(group_sizes[k]),
                                );
                                spawn_group(k, full);
                            }
                        }
                        // An unsharded chunk that does not exist is all fill value (not so
                        // an Icechunk chunk: its manifest says it exists).
                        Err(e) if e.is_not_found() && !sharded && core.icechunk.is_none() => {
                            scope.spawn(move |_| ctx.fill_leaf(i, &core.layout.fill));
                            ctx.stats.lock().chunks_missing += 1;
                        }
                        Err(e) => {
                            let key = &storages[k].list[storage].key;
                            ctx.fail(array.chunk_read_error(key, e, sharded));
                        }
                    }
                }
            }
            again
                .into_iter()
                .map(|mut sources| {
                    sources.sort_by_key(|&(i, _)| i);
                    Some(Located { sources })
                })
                .collect::<Vec<_>>()
        };
        // Runs `located`, then what it leaves to fetch again (which leaves nothing more: its
        // leaves are read by block or whole).
        let mut run_all = |mut located: Vec<Option<Located>>, storages: &[Storages]| {
            while any_located(&located) && !any_failed() {
                located = run(&located, storages);
            }
        };
        run_all(first, &storages);
        if !any_failed() {
            let mut later: Vec<Option<Located>> = Vec::with_capacity(parts.len());
            for (k, (n_first, known)) in rest.into_iter().enumerate() {
                let Part { array, ctx } = parts[k];
                let n = ctx.plan.num_leaves();
                later.push(if n_first < n {
                    match array.locate(ctx.plan, n_first..n, known, &mut storages[k], &mut stats[k])
                    {
                        Ok(mut sources) => {
                            array.fetch_needed_blocks(
                                ctx.plan,
                                n_first,
                                &mut sources,
                                &storages[k],
                                &mut stats[k],
                            );
                            Some(Located::from(n_first, sources))
                        }
                        Err(e) => {
                            ctx.fail(e);
                            None
                        }
                    }
                } else {
                    None
                });
            }
            run_all(later, &storages);
        }
        for (k, group) in groups.into_iter().enumerate() {
            if !group.is_empty() {
                spawn_group(k, group);
            }
        }
    })?;
    for (k, p) in parts.iter().enumerate() {
        if let Some(failure) = p.ctx.error.lock().take() {
            return Err(p.array.failure_error(failure, &storages[k]));
        }
    }
    Ok(())
}

/// The error for a chunk at `at` that did not decode.
pub(crate) fn decode_error(at: Box<Location>, e: DecodeError) -> ZarrError {
    match e {
        DecodeError::Corrupt(reason) => ZarrError::Codec { at, reason },
        DecodeError::NoMemory(bytes) => ZarrError::OutOfMemory {
            what: format!("{at}: decoding a chunk"),
            bytes: bytes as u64,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::balanced_group;

    #[test]
    fn balanced_groups_fill_every_thread() {
        for threads in 1..=8 {
            for group in [1, 4, 8] {
                for n in 1..200 {
                    let g = balanced_group(n, group, threads);
                    assert!(
                        (1..=group).contains(&g),
                        "n {n} group {group} threads {threads}"
                    );
                    // Never more rounds of tasks, nor more chunks per thread, than groups of
                    // `group` would take.
                    let rounds = n.div_ceil(g).div_ceil(threads);
                    let unbalanced = n.div_ceil(group).div_ceil(threads);
                    assert!(rounds <= unbalanced);
                    assert!(rounds * g <= unbalanced * group);
                }
            }
        }
        assert_eq!(balanced_group(12, 4, 2), 3);
        assert_eq!(balanced_group(16, 4, 2), 4);
        assert_eq!(balanced_group(740, 4, 2), 4);
    }
}
