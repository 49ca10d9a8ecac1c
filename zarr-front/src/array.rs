//! [`Array`]: an opened Zarr array and its read path.
//!
//! A read is planned whole (`crate::plan`), its leaf chunks are located (through the shard
//! indexes, level by level, cached), all their byte ranges go to `zcrop-io` in one submission
//! (two for a large read of a sharded array from local files: its first [`FIRST_LOCATED`]
//! leaves are located and submitted alone, the rest located while those decode), and each
//! chunk is decoded on the rayon pool as soon as its bytes arrive, then copied into every
//! output block that needs it while it is still in cache. Results are taken from
//! `zcrop-io` only while few decode tasks wait (`crate::throttle`), so reading stays just
//! ahead of decoding.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use zcrop_io::{IoEngine, IoError, ObjectEngine, ReadRange, ReadRequest};

use crate::cache::LruCache;
use crate::decode::{DecodeError, LeafDecoder};
use crate::error::{Location, Result, ZarrError};
use crate::layout::{IndexEntry, Layout, ShardLevel};
use crate::node::Group;
use crate::plan::{DimSelection, Plan, PlanError};
use crate::stitch::{DisjointOut, contiguous_target};
use crate::store::{Reader, Store};
use crate::throttle::Throttle;
use crate::transform::StitchTransform;

/// Default byte budget of the shard-index cache of one array (64 MiB).
pub const DEFAULT_INDEX_CACHE_BYTES: usize = 64 << 20;

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
    /// Set it (from any thread) to stop the read early with [`ZarrError::Cancelled`].
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

/// The shared state of one read's stitch tasks.
struct StitchCtx<'p, 'o> {
    plan: &'p Plan,
    out: &'p DisjointOut<'o>,
    transform: Option<&'p dyn StitchTransform>,
    /// Copies still to write, per request; the task that writes a block's last copy finishes it
    /// (counted only with a transform, the only one that finishes blocks).
    remaining: Vec<AtomicU32>,
    failed: AtomicBool,
    /// The first failure.
    error: Mutex<Option<Failure>>,
    stats: Mutex<ReadStats>,
    cancel: Option<&'p AtomicBool>,
}

impl StitchCtx<'_, '_> {
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

    /// Writes every copy of leaf `i` from its decoded bytes.
    fn stitch_leaf(&self, i: usize, chunk: &[u8]) {
        for c in self.plan.copies(&self.plan.leaves[i]) {
            self.out
                .copy_from_chunk(self.plan, c, chunk, self.transform);
            self.copy_done(c.index);
        }
    }

    /// Writes every copy of leaf `i` with the fill value.
    fn fill_leaf(&self, i: usize, fill: &[u8]) {
        for c in self.plan.copies(&self.plan.leaves[i]) {
            self.out.fill(self.plan, c, fill, self.transform);
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

/// What an array has in storage (see [`Array::storage_summary`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StorageSummary {
    /// Storage chunks (files) in the grid.
    pub storage_chunks: u64,
    /// Of those, stored.
    pub storage_chunks_present: u64,
    /// Bytes of the stored chunk files.
    pub stored_bytes: u64,
    /// For a sharded array: inner chunks in all shards of the grid.
    pub inner_chunks: Option<u64>,
    /// For a sharded array: inner chunks the shard indexes list as stored.
    pub inner_chunks_present: Option<u64>,
}

/// An opened Zarr array (v2 or v3). Cheap to clone; clones share caches.
#[derive(Clone)]
pub struct Array {
    core: Arc<Core>,
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array")
            .field("name", &self.core.name)
            .field("shape", &self.core.layout.shape)
            .field("data_type", &self.data_type())
            .finish_non_exhaustive()
    }
}

struct Core {
    /// Path inside the store, `/`-rooted.
    name: String,
    /// Key prefix of this array relative to the store root (`""` or `a/b/`).
    key_prefix: String,
    /// The array's directory, or its key prefix in the object store.
    dir: PathBuf,
    meta: zarrs::array::Array<()>,
    layout: Layout,
    decoder: LeafDecoder,
    reader: Reader,
    /// How it was opened (its parent group opens the same way).
    options: OpenOptions,
    verify_checksums: bool,
    index_cache: IndexCache,
    chunk_cache: Option<ChunkCache>,
}

/// Where a leaf chunk's bytes are.
#[derive(Debug, Clone)]
enum Source {
    /// Not stored: fill value.
    Missing,
    /// In the decoded-chunk cache.
    Cached(Arc<[u8]>),
    /// These bytes of storage chunk `storage`.
    Read { storage: usize, range: ReadRange },
}

/// A storage chunk (a file) a read touches.
struct Storage {
    key: String,
    path: Arc<Path>,
    /// Its version, for the caches (see [`FileStamp`]).
    stamp: Option<FileStamp>,
}

/// One version of a local file: its identity, length and change times. A file replaced (for
/// instance written to a temporary file and renamed over, as zarr-python writes), rewritten in
/// place or deleted has another (or none). Cached shard indexes and decoded chunks are kept
/// with the stamp of the file they came from, and used only while the file still has it:
/// one `stat` per file per read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of the file at `path`; `None` if there is none.
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// The storage chunks a read has located so far: the list grows as the read locates more of
/// its leaves (see [`FIRST_LOCATED`]).
#[derive(Default)]
struct Storages {
    list: Vec<Storage>,
    /// Each one's index in `list`, by its coordinates in the storage grid.
    index: FxHashMap<Vec<u64>, usize>,
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

/// Where the bytes of an inner shard sit inside its file, while walking the shard levels.
#[derive(Debug, Clone, Copy)]
enum Cursor {
    Missing,
    /// `len` (unknown for a whole file) bytes at `base` of storage chunk `storage`.
    In {
        storage: usize,
        base: u64,
        len: Option<u64>,
    },
}

/// Decoded shard indexes by (file, level, shard start), with the version of their file.
type IndexCache = LruCache<(Arc<Path>, usize, u64), (Option<FileStamp>, Arc<[u64]>)>;

/// Decoded chunks by their leaf coordinates.
type ChunkCache = LruCache<Vec<u64>, (Option<FileStamp>, Arc<[u8]>)>;

/// Chunks decoded per task where the decoder gains from decoding several together: four
/// zstd chunks of more than 64 KiB interleave enough independent literal streams to keep a
/// core busy (grouped by two cost ~10% more per chunk, measured on the benchmark's v2 chunks;
/// smaller zstd chunks go by [`SMALL_ZSTD_DECODE_GROUP`]); small chunks of other codecs go at
/// least this many at a time for their prefetches (see [`SMALL_DECODE_GROUP`]).
const DECODE_GROUP: usize = 4;

/// Leaves a read of more than twice as many leaves of a sharded array from local files locates
/// first, on its own: their reads go out and their decoding starts while the read locates the
/// rest (a batch of crops locates thousands of leaves through the shard indexes, and the decode
/// threads waited for all of them). Not for unsharded arrays: on the benchmark's v2 array the
/// split cost 0.4 to 2.9% chunks/s (4 runs; its chunks are read, not mapped, and each takes
/// ~100 us to decode, so the serial start weighs little).
const FIRST_LOCATED: usize = 256;

/// Chunks of at most this many decoded bytes are decoded in groups (see [`SMALL_DECODE_GROUP`])
/// with the next chunk's bytes prefetched (see `Array::decode_and_stitch_each`).
const PREFETCHED_CHUNK_BYTES: usize = 64 << 10;

/// zstd chunks of at most [`PREFETCHED_CHUNK_BYTES`] decode in groups of this many: a crop's
/// band needs only one or two of such a chunk's four literal streams, so four chunks left the
/// lockstep with ~2.6 streams. Measured on the benchmark's 32 KiB chunks, 3 alternating runs:
/// groups of 4, 8, 16 gave 569-585, 586-598, 587-602 crops/s; 8 keeps tasks finer.
const SMALL_ZSTD_DECODE_GROUP: usize = 8;

/// Small chunks of codecs other than zstd (see [`PREFETCHED_CHUNK_BYTES`]) decode in groups of
/// up to this many, fewer where a read has too few chunks to give every thread 8 groups (but at
/// least [`DECODE_GROUP`]). Longer groups spawn fewer tasks and break the prefetch of the next
/// chunk's bytes less often. `zcrop bench --codec blosc-lz4` (32 KiB chunks, about 6000 a
/// batch), alternating runs: groups of 4 -> 16 gave 1572 -> 1676 crops/s (4 rounds); 16 -> 32
/// 1670 -> 1695 (3 rounds, within the noise then). Later, in runs whose batches alternated
/// between 16 and 32 (2026-11-25, after the stitch got cheaper), 32 gave a median 2.0% more
/// chunks/s over 6 runs (-1.4% to +4.0% each); 64 against 16 was mixed (-1.9% to +2.3%, 3 runs).
const SMALL_DECODE_GROUP: usize = 32;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Array {
    /// Builds an array from parsed metadata. `name` is its `/`-rooted path in the store,
    /// `key_prefix` its key prefix relative to the store root, `dir` its directory (or key
    /// prefix in `store`).
    pub(crate) fn from_metadata(
        name: String,
        key_prefix: String,
        dir: PathBuf,
        store: &Store,
        meta: zarrs::array::Array<()>,
        options: &OpenOptions,
    ) -> Result<Array> {
        let (layout, decoder) = Layout::new(&name, &meta, options.verify_checksums)?;
        let reader = store.reader(options.engine.as_ref())?;
        Ok(Array {
            core: Arc::new(Core {
                name,
                key_prefix,
                dir,
                meta,
                layout,
                decoder,
                reader,
                options: options.clone(),
                verify_checksums: options.verify_checksums,
                index_cache: LruCache::new(options.index_cache_bytes),
                chunk_cache: (options.chunk_cache_bytes > 0)
                    .then(|| LruCache::new(options.chunk_cache_bytes)),
            }),
        })
    }

    /// Opens the array at `path` (a directory holding `zarr.json` or `.zarray`, or the URL of
    /// one in an object store: `s3://bucket/data.zarr/temperature`).
    pub fn open(path: impl AsRef<Path>) -> Result<Array> {
        Self::open_with(path, &OpenOptions::default())
    }

    /// [`Array::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Array> {
        crate::node::open_array_at(path.as_ref(), options)
    }

    /// Builds the array described by a metadata document (`zarr.json` for `zarr_format` 3, a
    /// `.zarray` for 2) whose chunks live in `dir`, without reading the metadata from disk.
    pub fn from_metadata_json(
        json: &[u8],
        zarr_format: u8,
        dir: impl AsRef<Path>,
        options: &OpenOptions,
    ) -> Result<Array> {
        crate::node::array_from_json(json, zarr_format, dir.as_ref(), options)
    }

    /// Decodes the bytes of one chunk (for a sharded array: one innermost chunk) into its
    /// elements: C order, native endian, the full chunk shape ([`Array::chunk_shape`]).
    pub fn decode_chunk(&self, encoded: &[u8]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        crate::decode::zeroed(&mut out, self.core.decoder.chunk_bytes)
            .map_err(|e| decode_error(self.location("", None), e))?;
        self.decode_chunk_into(encoded, &mut out)?;
        Ok(out)
    }

    /// [`Array::decode_chunk`] into `out`, which must be exactly one decoded chunk long (an
    /// error otherwise): for callers that decode many chunks into one reused buffer.
    pub fn decode_chunk_into(&self, encoded: &[u8], out: &mut [u8]) -> Result<()> {
        self.core
            .decoder
            .decode_full_into(encoded, out)
            .map_err(|e| decode_error(self.location("", None), e))?;
        Ok(())
    }

    /// The bytes `range` of one decoded chunk (as [`Array::decode_chunk`] lays it out), decoding
    /// no more of it than the codecs need to produce them: zstd chunks of one block decode only
    /// the literal streams that hold the range, other codecs stop where they can. Parts of the
    /// chunk outside `range` are not verified.
    pub fn decode_chunk_range(&self, encoded: &[u8], range: Range<usize>) -> Result<Vec<u8>> {
        let full = self.core.decoder.chunk_bytes;
        if range.start > range.end || range.end > full {
            return Err(ZarrError::Codec {
                at: self.location("", None),
                reason: format!("range {range:?} outside a chunk of {full} bytes"),
            });
        }
        // As a read does before decoding a chunk (here it exercises its header parsing).
        self.core.decoder.prefetch(encoded, &range);
        let mut scratch = Vec::new();
        let (bytes, _) = self
            .core
            .decoder
            .with_decoded(encoded, range.clone(), &mut scratch, |chunk| {
                chunk[range.clone()].to_vec()
            })
            .map_err(|e| decode_error(self.location("", None), e))?;
        Ok(bytes)
    }

    /// Size in bytes of the index of an outermost shard; `None` for an unsharded array.
    pub fn shard_index_size(&self) -> Option<u64> {
        self.core.layout.levels.first().map(|l| l.index_bytes)
    }

    /// Decodes the index of an outermost shard (exactly [`Array::shard_index_size`] bytes) of a
    /// shard of `shard_len` bytes, if known: per inner chunk in C order, its `(offset, length)`
    /// in the shard, or `None` when it is not stored. Checks the checksum and that every entry
    /// lies inside the shard.
    pub fn decode_shard_index(
        &self,
        bytes: &[u8],
        shard_len: Option<u64>,
    ) -> Result<Vec<Option<(u64, u64)>>> {
        let bad = |reason: String| ZarrError::ShardIndex {
            at: self.location("", None),
            reason,
        };
        let Some(level) = self.core.layout.levels.first() else {
            return Err(ZarrError::InvalidArgument(format!(
                "array {:?} is not sharded",
                self.core.name
            )));
        };
        let index = level
            .decode_index(bytes, self.core.verify_checksums)
            .map_err(bad)?;
        (0..index.len() / 2)
            .map(
                |i| match ShardLevel::entry(&index, i, shard_len).map_err(bad)? {
                    IndexEntry::Missing => Ok(None),
                    IndexEntry::At { offset, len } => Ok(Some((offset, len))),
                },
            )
            .collect()
    }

    /// The array's path in its store, e.g. `/` or `/group/temperature`.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The array's path relative to the store root, e.g. `` or `group/temperature`.
    pub fn path(&self) -> &str {
        self.core.key_prefix.trim_end_matches('/')
    }

    /// The array's directory on disk, or for an object store its key prefix under the bucket
    /// (or container, or host).
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Where the array is: its directory, or its URL.
    pub fn uri(&self) -> String {
        self.store().uri(&self.core.dir)
    }

    /// The storage options the array was opened with (empty for a local array).
    pub fn storage_options(&self) -> &[(String, String)] {
        &self.core.options.storage_options
    }

    fn store(&self) -> Store {
        self.core.reader.store()
    }

    /// The group that holds the array's directory, opened the same way as the array (same
    /// store, same options); `None` where there is no group there (or no parent directory).
    pub fn parent(&self) -> Result<Option<Group>> {
        let Some(parent) = self.core.dir.parent() else {
            return Ok(None);
        };
        let store = self.store();
        if matches!(store, Store::Object(_)) && self.core.dir.as_os_str().is_empty() {
            return Ok(None);
        }
        match crate::node::open_in(&store, parent, &self.core.options) {
            Ok(crate::node::Node::Group(g)) => Ok(Some(g)),
            Ok(crate::node::Node::Array(_)) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Shape.
    pub fn shape(&self) -> &[u64] {
        &self.core.layout.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.core.layout.shape.len()
    }

    /// Zarr format: 2 or 3.
    pub fn zarr_format(&self) -> u8 {
        match self.core.meta.metadata() {
            zarrs::metadata::ArrayMetadata::V2(_) => 2,
            zarrs::metadata::ArrayMetadata::V3(_) => 3,
        }
    }

    /// The v3 data type name (`uint16`, `float32`, `bool`, ...).
    pub fn data_type(&self) -> String {
        self.core
            .meta
            .data_type()
            .name_v3()
            .map_or_else(String::new, std::borrow::Cow::into_owned)
    }

    /// The numpy dtype string zarr-python reports for this array: the stored byte order for v2
    /// (`>u2`), native order for v3 (where byte order belongs to the `bytes` codec).
    pub fn numpy_dtype(&self) -> String {
        numpy_dtype(&self.data_type(), self.core.meta.metadata())
    }

    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        self.core.layout.elsize
    }

    /// The fill value, one element of native-endian bytes.
    pub fn fill_value_bytes(&self) -> &[u8] {
        &self.core.layout.fill
    }

    /// Shape of a storage chunk: the chunk, or the shard of a sharded array.
    pub fn storage_chunk_shape(&self) -> &[u64] {
        &self.core.layout.storage_chunk
    }

    /// Shape of the chunks that are read and decoded: the chunk, or the innermost chunk of a
    /// sharded array (what zarr-python calls `chunks`).
    pub fn chunk_shape(&self) -> &[u64] {
        &self.core.layout.leaf
    }

    /// The shard shape of a sharded array (zarr-python's `shards`), else `None`.
    pub fn shard_shape(&self) -> Option<&[u64]> {
        (!self.core.layout.levels.is_empty()).then_some(&self.core.layout.storage_chunk[..])
    }

    /// Number of sharding levels (0 unsharded, 2 for sharding inside sharding).
    pub fn sharding_levels(&self) -> usize {
        self.core.layout.levels.len()
    }

    /// The array's attributes.
    pub fn attributes(&self) -> &serde_json::Map<String, serde_json::Value> {
        self.core.meta.attributes()
    }

    /// Dimension names (v3), if set.
    pub fn dimension_names(&self) -> Option<Vec<Option<String>>> {
        self.core.meta.dimension_names().as_ref().map(|names| {
            names
                .iter()
                .map(|n| n.as_ref().map(ToString::to_string))
                .collect()
        })
    }

    /// The array's metadata as JSON, as stored (v2 metadata merged with its attributes).
    pub fn metadata_json(&self) -> serde_json::Value {
        serde_json::to_value(self.core.meta.metadata()).unwrap_or(serde_json::Value::Null)
    }

    /// How leaf chunks are decoded, in words (for `zcrop info`).
    pub fn decoder_description(&self) -> String {
        self.core.decoder.describe()
    }

    /// The IO engine this array reads through, for an array of local files.
    pub fn engine(&self) -> Option<&IoEngine> {
        match &self.core.reader {
            Reader::Local(e) => Some(e),
            Reader::Object(_) => None,
        }
    }

    /// The object engine this array reads through, for an array in an object store.
    pub fn object_engine(&self) -> Option<&ObjectEngine> {
        match &self.core.reader {
            Reader::Object(e) => Some(e),
            Reader::Local(_) => None,
        }
    }

    /// The store key of storage chunk `coords`, relative to the store root.
    pub fn storage_key(&self, coords: &[u64]) -> String {
        format!(
            "{}{}",
            self.core.key_prefix,
            self.core.meta.chunk_key(coords)
        )
    }

    /// Number of storage chunks along each dimension.
    pub fn storage_grid_shape(&self) -> Vec<u64> {
        let l = &self.core.layout;
        l.shape
            .iter()
            .zip(&l.storage_chunk)
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    /// The encoded bytes of the chunks at `coords` (chunk-grid coordinates of
    /// [`Array::chunk_shape`] chunks; for a sharded array the innermost chunks), located through
    /// the shard indexes and read in one submission; `None` for a chunk that is not stored.
    pub fn read_encoded_chunks(&self, coords: &[Vec<u64>]) -> Result<Vec<Option<Bytes>>> {
        let l = &self.core.layout;
        let grid = l.leaf_grid();
        let sels: Vec<Vec<DimSelection>> = coords
            .iter()
            .map(|c| {
                if c.len() != grid.len() || c.iter().zip(&grid).any(|(x, g)| x >= g) {
                    return Err(ZarrError::OutOfBounds {
                        array: self.core.name.clone(),
                        shape: grid.clone(),
                        reason: format!("chunk {c:?} is outside the chunk grid {grid:?}"),
                    });
                }
                Ok(c.iter()
                    .zip(&l.leaf)
                    .map(|(x, s)| DimSelection::Range {
                        start: x * s,
                        len: 1,
                    })
                    .collect())
            })
            .collect::<Result<_>>()?;
        let plan = Plan::with_output_element(&l.shape, &l.leaf, l.elsize, l.elsize, &sels)
            .map_err(|e| self.plan_error(&e))?;
        let mut stats = ReadStats::default();
        let mut storages = Storages::default();
        let all = 0..plan.num_leaves();
        let sources = self.locate(
            &plan,
            all,
            vec![None; plan.num_leaves()],
            &mut storages,
            &mut stats,
        )?;
        let requests = sources.iter().enumerate().filter_map(|(i, s)| match s {
            Source::Read { storage, range } => Some(ReadRequest::new(
                i as u64,
                Arc::clone(&storages.list[*storage].path),
                *range,
            )),
            _ => None,
        });
        let mut by_leaf: Vec<Option<Bytes>> = vec![None; plan.num_leaves()];
        for done in self.core.reader.submit(requests) {
            let i = done.id as usize;
            let Source::Read { storage, .. } = &sources[i] else {
                continue;
            };
            match done.result {
                Ok(b) => by_leaf[i] = Some(b),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(self.chunk_read_error(
                        &storages.list[*storage].key,
                        e,
                        !l.levels.is_empty(),
                    ));
                }
            }
        }
        // Plan leaves are sorted; map each requested chunk back to its leaf.
        let index: HashMap<&[u64], usize> = plan
            .leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| (leaf.coords.as_slice(), i))
            .collect();
        Ok(coords
            .iter()
            .map(|c| index.get(c.as_slice()).and_then(|&i| by_leaf[i].clone()))
            .collect())
    }

    /// Counts what is stored: storage chunks (files) present and their bytes, and for a sharded
    /// array the inner chunks its shard indexes list (all indexes read in one submission).
    pub fn storage_summary(&self) -> Result<StorageSummary> {
        let grid = self.storage_grid_shape();
        let total = grid
            .iter()
            .try_fold(1u64, |n, &g| n.checked_mul(g))
            .ok_or_else(|| {
                ZarrError::InvalidArgument(format!(
                    "array {:?}: its grid {grid:?} has more than 2^64 storage chunks to count",
                    self.core.name
                ))
            })?;
        let mut summary = StorageSummary {
            storage_chunks: total,
            ..StorageSummary::default()
        };
        let mut present: Vec<(String, Arc<Path>, u64)> = Vec::new();
        let mut coords = vec![0u64; grid.len()];
        // An object store lists the array's objects once; local files are asked one by one.
        let listed = self.store().object_sizes(&self.core.dir)?;
        for i in 0..total {
            let mut rem = i;
            for d in (0..grid.len()).rev() {
                coords[d] = rem % grid[d];
                rem /= grid[d];
            }
            let rel = self.core.meta.chunk_key(&coords).to_string();
            let path = self.core.dir.join(&rel);
            let size = match &listed {
                Some(sizes) => sizes.get(&rel).copied(),
                None => std::fs::metadata(&path)
                    .ok()
                    .filter(std::fs::Metadata::is_file)
                    .map(|m| m.len()),
            };
            if let Some(len) = size {
                summary.storage_chunks_present += 1;
                summary.stored_bytes += len;
                present.push((
                    format!("{}{rel}", self.core.key_prefix),
                    Arc::from(path.as_path()),
                    len,
                ));
            }
        }
        if let Some(level) = self.core.layout.levels.first() {
            let per_shard: u64 = level.per_shard.iter().product();
            summary.inner_chunks = Some(per_shard * total);
            let range = if level.index_at_start {
                ReadRange::new(0, level.index_bytes)
            } else {
                ReadRange::Suffix(level.index_bytes)
            };
            let requests = present
                .iter()
                .enumerate()
                .map(|(i, (_, path, _))| ReadRequest::new(i as u64, Arc::clone(path), range));
            let mut inner_present = 0u64;
            for done in self.core.reader.submit(requests) {
                let (key, _, len) = &present[done.id as usize];
                let bytes = done.result.map_err(|e| ZarrError::Io {
                    at: self.location(key, Some(range)),
                    source: Box::new(e),
                })?;
                let entries = self
                    .decode_shard_index(&bytes, Some(*len))
                    .map_err(|e| match e {
                        ZarrError::ShardIndex { reason, .. } => ZarrError::ShardIndex {
                            at: self.location(key, Some(range)),
                            reason,
                        },
                        other => other,
                    })?;
                inner_present += entries.iter().filter(|e| e.is_some()).count() as u64;
            }
            summary.inner_chunks_present = Some(inner_present);
        }
        Ok(summary)
    }

    /// Drops cached shard indexes and decoded chunks.
    pub fn clear_caches(&self) {
        self.core.index_cache.clear();
        if let Some(c) = &self.core.chunk_cache {
            c.clear();
        }
    }

    /// Bytes of one output element block of `shape`.
    fn block_bytes(&self, shape: &[u64]) -> Result<usize> {
        shape
            .iter()
            .try_fold(self.core.layout.elsize as u64, |a, &n| a.checked_mul(n))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                ZarrError::InvalidArgument(format!("a region of shape {shape:?} is too large"))
            })
    }

    /// Reads the region of `shape` at `origin` into a new buffer (C order, native endian).
    pub fn read_region(&self, origin: &[u64], shape: &[u64]) -> Result<Vec<u8>> {
        let mut out = output_buffer(self.block_bytes(shape)?)?;
        self.read_region_into(origin, shape, &mut out)?;
        Ok(out)
    }

    /// Reads the region of `shape` at `origin` into `out` (exactly its size).
    pub fn read_region_into(
        &self,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_region_into_with(origin, shape, out, ReadOptions::default())
    }

    /// [`Array::read_region_into`] with a transform and/or a cancellation flag.
    pub fn read_region_into_with(
        &self,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        self.check_dims(origin.len(), "origin")?;
        self.check_dims(shape.len(), "shape")?;
        let sel: Vec<DimSelection> = origin
            .iter()
            .zip(shape)
            .map(|(&start, &len)| DimSelection::Range { start, len })
            .collect();
        self.read_selections_into_with(&[sel], out, options)
    }

    /// Reads `origins.len() / ndim` crops of one `shape` (origins flattened, `ndim` numbers per
    /// crop) into one new `(N, *shape)` buffer, planned and fetched as one batch.
    pub fn read_batch(&self, origins: &[u64], shape: &[u64]) -> Result<Vec<u8>> {
        let n = self.crop_count(origins)?;
        let bytes = self
            .block_bytes(shape)?
            .checked_mul(n)
            .ok_or_else(|| ZarrError::InvalidArgument("the batch is too large".into()))?;
        let mut out = output_buffer(bytes)?;
        self.read_batch_into(origins, shape, &mut out)?;
        Ok(out)
    }

    /// [`Array::read_batch`] into `out` (exactly `N * prod(shape) * element_size` bytes).
    pub fn read_batch_into(
        &self,
        origins: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_batch_into_with(origins, shape, out, ReadOptions::default())
    }

    /// [`Array::read_batch_into`] with a transform fused into the stitch (then `out` holds
    /// `N * prod(shape)` output elements of the transform's size) and/or a cancellation flag.
    pub fn read_batch_into_with(
        &self,
        origins: &[u64],
        shape: &[u64],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        self.check_dims(shape.len(), "crop shape")?;
        self.crop_count(origins)?;
        let sels = self.crop_selections(origins, shape);
        self.read_selections_into_with(&sels, out, options)
    }

    /// The selections of crops of `shape` at `origins` (flattened, `ndim` numbers each).
    fn crop_selections(&self, origins: &[u64], shape: &[u64]) -> Vec<Vec<DimSelection>> {
        let nd = self.ndim();
        if nd == 0 {
            return vec![Vec::new()];
        }
        origins
            .chunks_exact(nd)
            .map(|o| {
                o.iter()
                    .zip(shape)
                    .map(|(&start, &len)| DimSelection::Range { start, len })
                    .collect()
            })
            .collect()
    }

    /// Reads an orthogonal selection (a range or a list of indices per dimension) into `out`,
    /// in C order of the selection's shape.
    pub fn read_selection_into(
        &self,
        selection: &[DimSelection],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_selections_into(&[selection.to_vec()], out)
    }

    /// Reads several selections, each into its block of `out`, one after the other: the most
    /// general read, planned and fetched as one batch.
    pub fn read_selections_into(
        &self,
        selections: &[Vec<DimSelection>],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_selections_into_with(selections, out, ReadOptions::default())
    }

    /// [`Array::read_selections_into`] with a transform and/or a cancellation flag.
    pub fn read_selections_into_with(
        &self,
        selections: &[Vec<DimSelection>],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        let l = &self.core.layout;
        let out_elsize = options
            .transform
            .map_or(l.elsize, StitchTransform::output_element_size);
        if out_elsize == 0 {
            return Err(ZarrError::InvalidArgument(
                "a transform with 0-byte output elements".into(),
            ));
        }
        let plan = Plan::with_output_element(&l.shape, &l.leaf, l.elsize, out_elsize, selections)
            .map_err(|e| self.plan_error(&e))?;
        if out.len() != plan.out_len {
            return Err(ZarrError::InvalidArgument(format!(
                "output buffer has {} bytes, the read produces {}",
                out.len(),
                plan.out_len
            )));
        }
        self.execute(&plan, out, options)
    }

    /// Bytes [`Array::read_selections_into`] writes for `selections` with output elements of
    /// `out_elsize` bytes.
    pub fn output_len(&self, selections: &[Vec<DimSelection>], out_elsize: usize) -> Result<usize> {
        let l = &self.core.layout;
        Plan::with_output_element(&l.shape, &l.leaf, l.elsize, out_elsize, selections)
            .map(|p| p.out_len)
            .map_err(|e| self.plan_error(&e))
    }

    fn crop_count(&self, origins: &[u64]) -> Result<usize> {
        let nd = self.ndim();
        if nd == 0 {
            return Ok(1);
        }
        if !origins.len().is_multiple_of(nd) {
            return Err(ZarrError::InvalidArgument(format!(
                "{} origin numbers is not a whole number of {nd}-d origins",
                origins.len()
            )));
        }
        Ok(origins.len() / nd)
    }

    fn check_dims(&self, got: usize, what: &str) -> Result<()> {
        if got == self.ndim() {
            return Ok(());
        }
        Err(ZarrError::OutOfBounds {
            array: self.core.name.clone(),
            shape: self.shape().to_vec(),
            reason: format!("{what} has {got} dimensions, the array has {}", self.ndim()),
        })
    }

    fn plan_error(&self, e: &PlanError) -> ZarrError {
        match e {
            PlanError::TooLarge | PlanError::TooManyChunks => {
                ZarrError::InvalidArgument(format!("array {:?}: {e}", self.core.name))
            }
            _ => ZarrError::OutOfBounds {
                array: self.core.name.clone(),
                shape: self.shape().to_vec(),
                reason: e.to_string(),
            },
        }
    }

    #[allow(clippy::unnecessary_box_returns)] // errors box their location to stay small
    fn location(&self, key: &str, range: Option<ReadRange>) -> Box<Location> {
        Box::new(Location {
            node: self.core.name.clone(),
            key: key.to_string(),
            range,
        })
    }

    /// Runs a plan: locate, fetch, decode and stitch.
    fn execute(&self, plan: &Plan, out: &mut [u8], options: ReadOptions<'_>) -> Result<ReadStats> {
        let mut stats = ReadStats {
            chunks: plan.num_leaves() as u64,
            output_bytes: plan.out_len as u64,
            ..ReadStats::default()
        };
        if options.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(ZarrError::Cancelled);
        }
        let out_buf = DisjointOut::new(out, plan);
        let ctx = StitchCtx {
            plan,
            out: &out_buf,
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
        };
        if plan.num_leaves() > 0 {
            self.fetch_and_stitch(&ctx, &mut stats)?;
        }
        stats += ctx.stats.into_inner();
        Ok(stats)
    }

    fn fetch_and_stitch(&self, ctx: &StitchCtx<'_, '_>, stats: &mut ReadStats) -> Result<()> {
        let core = &*self.core;
        let plan = ctx.plan;
        let n = plan.num_leaves();
        let mut known: Vec<Option<Source>> = vec![None; n];
        if let Some(cache) = &core.chunk_cache {
            // A cached chunk counts while its file is the one it was decoded from.
            let mut stamps: FxHashMap<Vec<u64>, Option<FileStamp>> = FxHashMap::default();
            let (mut storage, mut inner) = (Vec::new(), vec![0; core.layout.levels.len()]);
            for (i, leaf) in plan.leaves.iter().enumerate() {
                if let Some((stamp, chunk)) = cache.get(leaf.coords.as_slice()) {
                    core.layout.locate(&leaf.coords, &mut storage, &mut inner);
                    let now = match stamps.get(&storage) {
                        Some(&s) => s,
                        None => {
                            let rel = core.meta.chunk_key(&storage).to_string();
                            let s = self.stamp(&core.dir.join(rel));
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
        let rest_known = known.split_off(first);
        let mut storages = Storages::default();
        let first_sources = self.locate(plan, 0..first, known, &mut storages, stats)?;

        let throttle = Throttle::for_current_pool();
        let throttle = &throttle;
        // zstd chunks decode their needed parts faster several at a time (their literal
        // streams interleave): completions go to tasks in groups.
        // Small chunks go to tasks in groups too, decoded one after the other, each with
        // the next one's bytes asked for meanwhile (see `decode_and_stitch_each`).
        let small = core.decoder.chunk_bytes <= PREFETCHED_CHUNK_BYTES;
        let group_size = if core.chunk_cache.is_some() {
            1
        } else if core.decoder.decodes_in_groups() {
            if small {
                SMALL_ZSTD_DECODE_GROUP
            } else {
                DECODE_GROUP
            }
        } else if small {
            // Up to SMALL_DECODE_GROUP while every thread still gets 8 groups; never
            // fewer than DECODE_GROUP chunks a group.
            (n / (8 * rayon::current_num_threads())).clamp(DECODE_GROUP, SMALL_DECODE_GROUP)
        } else {
            1
        };
        rayon::in_place_scope(|scope| {
            let spawn_group = |group: Vec<Fetched>| {
                let slot = throttle.acquire();
                scope.spawn(move |_| {
                    let _slot = slot;
                    if ctx.failed.load(Ordering::Acquire) {
                        return;
                    }
                    if ctx.cancelled() {
                        ctx.fail(ZarrError::Cancelled);
                        return;
                    }
                    let decoded = if group.len() == 1 {
                        vec![self.decode_and_stitch(ctx, &group[0])]
                    } else if core.decoder.decodes_in_groups() {
                        self.decode_and_stitch_group(ctx, &group)
                    } else {
                        self.decode_and_stitch_each(ctx, &group)
                    };
                    // Summed here, added to the shared total once per group.
                    let mut group_stats = ReadStats::default();
                    for (chunk, decoded) in group.iter().zip(decoded) {
                        // Bytes from a mapping of a file truncated meanwhile read as zeros:
                        // that, not what the decoder made of them, is the error.
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
                });
            };
            let mut group: Vec<Fetched> = Vec::with_capacity(group_size);
            // Fetches, decodes and stitches the leaves from `base` on, located as `sources`.
            let mut run = |base: usize, sources: &[Source], storages: &Storages| {
                let mut requests = Vec::with_capacity(sources.len());
                let mut missing = 0;
                for (i, s) in (base..).zip(sources) {
                    match s {
                        Source::Missing => {
                            missing += 1;
                            scope.spawn(move |_| ctx.fill_leaf(i, &core.layout.fill));
                        }
                        Source::Cached(chunk) => {
                            let chunk = Arc::clone(chunk);
                            scope.spawn(move |_| ctx.stitch_leaf(i, &chunk));
                        }
                        Source::Read { storage, range } => requests.push(ReadRequest::new(
                            i as u64,
                            Arc::clone(&storages.list[*storage].path),
                            *range,
                        )),
                    }
                }
                ctx.stats.lock().chunks_missing += missing;
                if requests.is_empty() {
                    return;
                }
                // Mapped results are checked once decoded (above).
                for done in core.reader.submit_mapped(requests) {
                    if ctx.failed.load(Ordering::Acquire) {
                        break;
                    }
                    if ctx.cancelled() {
                        ctx.fail(ZarrError::Cancelled);
                        break;
                    }
                    let i = done.id as usize;
                    let source = i.checked_sub(base).and_then(|j| sources.get(j));
                    let Some(&Source::Read { storage, range }) = source else {
                        continue;
                    };
                    match done.result {
                        Ok(bytes) => {
                            group.push(Fetched {
                                leaf: i,
                                bytes,
                                storage,
                                range,
                                stamp: storages.list[storage].stamp,
                            });
                            if group.len() == group_size {
                                spawn_group(std::mem::replace(
                                    &mut group,
                                    Vec::with_capacity(group_size),
                                ));
                            }
                        }
                        // An unsharded chunk that does not exist is all fill value.
                        Err(e) if e.is_not_found() && !sharded => {
                            scope.spawn(move |_| ctx.fill_leaf(i, &core.layout.fill));
                            ctx.stats.lock().chunks_missing += 1;
                        }
                        Err(e) => {
                            let key = &storages.list[storage].key;
                            ctx.fail(self.chunk_read_error(key, e, sharded));
                        }
                    }
                }
            };
            run(0, &first_sources, &storages);
            if first < n && !ctx.failed.load(Ordering::Acquire) {
                match self.locate(plan, first..n, rest_known, &mut storages, stats) {
                    Ok(sources) => run(first, &sources, &storages),
                    Err(e) => ctx.fail(e),
                }
            }
            if !group.is_empty() {
                spawn_group(group);
            }
        });
        match ctx.error.lock().take() {
            None => Ok(()),
            Some(Failure::Error(e)) => Err(e),
            Some(Failure::Chunk {
                storage,
                range,
                fault,
            }) => {
                let Storage { key, path, .. } = &storages.list[storage];
                let at = self.location(key, Some(range));
                Err(match fault {
                    ChunkFault::Lost => ZarrError::Io {
                        at,
                        source: Box::new(IoError::FileChanged {
                            path: Arc::clone(path),
                            range,
                        }),
                    },
                    ChunkFault::Decode(e) => decode_error(at, e),
                })
            }
        }
    }

    /// The version of the local file at `path`, where the caches need it (a sharded array's
    /// index cache, the decoded-chunk cache); `None` elsewhere, and for object stores (whose
    /// caches last as long as the array: open it again to see a rewritten store).
    fn stamp(&self, path: &Path) -> Option<FileStamp> {
        let core = &*self.core;
        let cached = !core.layout.levels.is_empty() || core.chunk_cache.is_some();
        if cached && matches!(core.reader, Reader::Local(_)) {
            FileStamp::of(path)
        } else {
            None
        }
    }

    fn chunk_read_error(&self, key: &str, e: IoError, sharded: bool) -> ZarrError {
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
            } else {
                members.push(k);
            }
        }
        for &k in &members {
            crate::stitch::prefetch_read(&group[k].bytes);
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
            results[k] = Some(cost.map(|c| ReadStats {
                chunks_decoded: 1,
                chunk_bytes_read: group[k].bytes.len() as u64,
                bytes_decoded: c.bytes_decoded,
                ..ReadStats::default()
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
            |bytes: &Bytes| crate::stitch::prefetch_read(&bytes[..bytes.len().min(64)]);
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

    /// Decodes the leaf `fetched` holds and writes all its copies; returns what it cost.
    fn decode_and_stitch(
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
            chunk_bytes_read: bytes.len() as u64,
            ..ReadStats::default()
        };
        if let Some(cache) = &core.chunk_cache {
            let mut chunk = Vec::new();
            crate::decode::zeroed(&mut chunk, core.decoder.chunk_bytes)?;
            let cost = core.decoder.decode_full_into(bytes, &mut chunk)?;
            stats.bytes_decoded = cost.bytes_decoded;
            let chunk: Arc<[u8]> = chunk.into();
            ctx.stitch_leaf(i, &chunk);
            if !zcrop_io::mapped_intact(bytes) {
                // The caller reports it; a chunk decoded from lost bytes is not kept.
                return Ok(stats);
            }
            cache.insert(
                leaf.coords.to_vec(),
                (fetched.stamp, Arc::clone(&chunk)),
                chunk.len(),
            );
            return Ok(stats);
        }
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
            stats.bytes_decoded = decoded?.bytes_decoded;
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
            stats.bytes_decoded = cost.bytes_decoded;
            return Ok(stats);
        }
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let ((), cost) =
                core.decoder
                    .with_decoded(bytes, leaf.needed.clone(), &mut scratch, |chunk| {
                        ctx.stitch_leaf(i, chunk);
                    })?;
            stats.bytes_decoded = cost.bytes_decoded;
            Ok(stats)
        })
    }

    /// Finds where each leaf chunk's bytes are: through the shard indexes of every level for a
    /// sharded array (fetched in one submission per level, cached), or the chunk's file.
    fn locate(
        &self,
        plan: &Plan,
        leaves: Range<usize>,
        known: Vec<Option<Source>>,
        storages: &mut Storages,
        stats: &mut ReadStats,
    ) -> Result<Vec<Source>> {
        let core = &*self.core;
        let layout = &core.layout;
        // Per leaf, its inner chunk's index in each level's shard: a row of `row` slots (at
        // least one, so that every leaf has a row when there are no levels).
        let levels = layout.levels.len();
        let row = levels.max(1);
        let mut inner_of: Vec<usize> = vec![0; leaves.len() * row];
        let mut cursors: Vec<Cursor> = Vec::with_capacity(leaves.len());
        let mut coords = Vec::new();
        let (mut last_coords, mut last_storage) = (Vec::new(), None::<usize>);
        for ((leaf, known), inner) in plan.leaves[leaves]
            .iter()
            .zip(&known)
            .zip(inner_of.chunks_exact_mut(row))
        {
            if known.is_some() {
                cursors.push(Cursor::Missing);
                continue;
            }
            layout.locate(&leaf.coords, &mut coords, &mut inner[..levels]);
            // Leaves come in C order of their coordinates: most share the last one's file.
            let s = if let Some(s) = last_storage.filter(|_| coords == last_coords) {
                s
            } else if let Some(&s) = storages.index.get(coords.as_slice()) {
                s
            } else {
                let rel = core.meta.chunk_key(&coords).to_string();
                let path: Arc<Path> = Arc::from(core.dir.join(&rel).as_path());
                storages.list.push(Storage {
                    key: format!("{}{rel}", core.key_prefix),
                    stamp: self.stamp(&path),
                    path,
                });
                storages
                    .index
                    .insert(coords.clone(), storages.list.len() - 1);
                storages.list.len() - 1
            };
            if last_storage != Some(s) {
                last_storage = Some(s);
                last_coords.clone_from(&coords);
            }
            cursors.push(Cursor::In {
                storage: s,
                base: 0,
                len: None,
            });
        }

        for (level_no, level) in layout.levels.iter().enumerate() {
            // The indexes this level needs: one per distinct (file, shard start).
            let mut wanted: FxHashMap<(usize, u64), Option<Arc<[u64]>>> = FxHashMap::default();
            let mut last = None;
            for c in &cursors {
                if let Cursor::In { storage, base, .. } = *c
                    && last != Some((storage, base))
                {
                    last = Some((storage, base));
                    wanted.entry((storage, base)).or_insert(None);
                }
            }
            let mut to_read: Vec<((usize, u64), ReadRange)> = Vec::new();
            for (&(storage, base), slot) in &mut wanted {
                let key = (Arc::clone(&storages.list[storage].path), level_no, base);
                let stamp = storages.list[storage].stamp;
                if let Some((_, idx)) = core.index_cache.get(&key).filter(|(s, _)| *s == stamp) {
                    *slot = Some(idx);
                    stats.index_cache_hits += 1;
                } else {
                    let len = cursors.iter().find_map(|c| match *c {
                        Cursor::In {
                            storage: s,
                            base: b,
                            len,
                        } if s == storage && b == base => Some(len),
                        _ => None,
                    });
                    let range = index_range(level, base, len.flatten()).map_err(|reason| {
                        ZarrError::ShardIndex {
                            at: self.location(&storages.list[storage].key, None),
                            reason,
                        }
                    })?;
                    to_read.push(((storage, base), range));
                }
            }
            if !to_read.is_empty() {
                stats.index_reads += to_read.len() as u64;
                let requests = to_read
                    .iter()
                    .enumerate()
                    .map(|(i, ((storage, _), range))| {
                        ReadRequest::new(
                            i as u64,
                            Arc::clone(&storages.list[*storage].path),
                            *range,
                        )
                    });
                for done in core.reader.submit(requests) {
                    let ((storage, base), range) = to_read[done.id as usize];
                    let key = &storages.list[storage].key;
                    match done.result {
                        Ok(bytes) => {
                            let idx = level.decode_index(&bytes, core.verify_checksums).map_err(
                                |reason| ZarrError::ShardIndex {
                                    at: self.location(key, Some(range)),
                                    reason,
                                },
                            )?;
                            core.index_cache.insert(
                                (Arc::clone(&storages.list[storage].path), level_no, base),
                                (storages.list[storage].stamp, Arc::clone(&idx)),
                                idx.len() * 8 + 64,
                            );
                            wanted.insert((storage, base), Some(idx));
                        }
                        // No shard file: every chunk in it is fill value.
                        Err(e) if e.is_not_found() && level_no == 0 => {}
                        Err(IoError::RangePastEof { file_len, .. }) => {
                            return Err(ZarrError::ShardIndex {
                                at: self.location(key, Some(range)),
                                reason: format!(
                                    "the shard ({file_len} bytes) is shorter than its index"
                                ),
                            });
                        }
                        Err(e) => {
                            return Err(ZarrError::Io {
                                at: self.location(key, Some(e.range())),
                                source: Box::new(e),
                            });
                        }
                    }
                }
            }
            // Step every leaf one level in (most in the same shard as the leaf before).
            let (mut last_key, mut last_index) = (None, None);
            for (c, inner) in cursors.iter_mut().zip(inner_of.chunks_exact(row)) {
                let Cursor::In { storage, base, len } = *c else {
                    continue;
                };
                if last_key != Some((storage, base)) {
                    last_key = Some((storage, base));
                    last_index = wanted.get(&(storage, base)).and_then(Option::as_ref);
                }
                let Some(idx) = last_index else {
                    *c = Cursor::Missing;
                    continue;
                };
                let entry = ShardLevel::entry(idx, inner[level_no], len).map_err(|reason| {
                    ZarrError::ShardIndex {
                        at: self.location(&storages.list[storage].key, None),
                        reason,
                    }
                })?;
                *c = match entry {
                    IndexEntry::Missing => Cursor::Missing,
                    IndexEntry::At { offset, len: n } => Cursor::In {
                        storage,
                        base: base + offset,
                        len: Some(n),
                    },
                };
            }
        }

        let sources = known
            .into_iter()
            .zip(cursors)
            .map(|(k, c)| match (k, c) {
                (Some(s), _) => s,
                (None, Cursor::Missing) => Source::Missing,
                (None, Cursor::In { storage, base, len }) => Source::Read {
                    storage,
                    range: match len {
                        Some(n) => ReadRange::new(base, n),
                        None => ReadRange::Whole,
                    },
                },
            })
            .collect();
        Ok(sources)
    }
}

/// A zeroed output buffer of `len` bytes, or an error if the memory cannot be had.
fn output_buffer(len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    crate::decode::zeroed(&mut out, len).map_err(|_| ZarrError::OutOfMemory {
        what: "the output of a read".into(),
        bytes: len as u64,
    })?;
    Ok(out)
}

/// The error for a chunk at `at` that did not decode.
fn decode_error(at: Box<Location>, e: DecodeError) -> ZarrError {
    match e {
        DecodeError::Corrupt(reason) => ZarrError::Codec { at, reason },
        DecodeError::NoMemory(bytes) => ZarrError::OutOfMemory {
            what: format!("{at}: decoding a chunk"),
            bytes: bytes as u64,
        },
    }
}

/// Where the index of a shard of `level` is: `len` bytes at `base` of its file (`len` unknown
/// for an outermost shard, which is a whole file).
fn index_range(level: &ShardLevel, base: u64, len: Option<u64>) -> Result<ReadRange, String> {
    let n = level.index_bytes;
    match (level.index_at_start, len) {
        (true, _) => Ok(ReadRange::new(base, n)),
        (false, None) => Ok(ReadRange::Suffix(n)),
        (false, Some(len)) if len >= n => Ok(ReadRange::new(base + len - n, n)),
        (false, Some(len)) => Err(format!(
            "an inner shard of {len} bytes is shorter than its {n}-byte index"
        )),
    }
}

/// The numpy dtype string zarr-python gives an array of v3 data type `name`.
fn numpy_dtype(name: &str, meta: &zarrs::metadata::ArrayMetadata) -> String {
    if let zarrs::metadata::ArrayMetadata::V2(m) = meta
        && let zarrs::metadata::v2::DataTypeMetadataV2::Simple(s) = &m.dtype
    {
        return s.clone();
    }
    let native = if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    let (kind, size) = match name {
        "bool" => return "|b1".into(),
        "int8" => return "|i1".into(),
        "uint8" => return "|u1".into(),
        "int16" => ('i', 2),
        "int32" => ('i', 4),
        "int64" => ('i', 8),
        "uint16" => ('u', 2),
        "uint32" => ('u', 4),
        "uint64" => ('u', 8),
        "float16" => ('f', 2),
        "float32" => ('f', 4),
        "float64" => ('f', 8),
        "complex64" => ('c', 8),
        "complex128" => ('c', 16),
        other => return other.to_string(),
    };
    format!("{native}{kind}{size}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every leaf of every sharded fixture (nested sharding, shapes that are not whole numbers
    /// of shards) is located the same through the layout's tables as computed.
    #[test]
    fn locate_tables_agree_with_the_computation() {
        let mut sharded = 0;
        for f in zcrop_fixtures::manifest() {
            let Ok(a) = Array::open(f.array_dir()) else {
                continue;
            };
            let layout = &a.core.layout;
            if layout.levels.is_empty() {
                continue;
            }
            sharded += 1;
            assert!(layout.has_locate_tables(), "{}", f.name);
            let grid = layout.leaf_grid();
            let levels = layout.levels.len();
            let (mut s1, mut s2) = (Vec::new(), Vec::new());
            let (mut i1, mut i2) = (vec![0; levels], vec![0; levels]);
            let mut leaf = vec![0u64; grid.len()];
            'leaves: loop {
                layout.locate(&leaf, &mut s1, &mut i1);
                layout.locate_computed(&leaf, &mut s2, &mut i2);
                assert_eq!((&s1, &i1), (&s2, &i2), "{} leaf {leaf:?}", f.name);
                for d in (0..grid.len()).rev() {
                    leaf[d] += 1;
                    if leaf[d] < grid[d] {
                        continue 'leaves;
                    }
                    leaf[d] = 0;
                }
                break;
            }
            // A leaf past the grid is computed, not looked up out of bounds.
            let past: Vec<u64> = grid.clone();
            layout.locate(&past, &mut s1, &mut i1);
            layout.locate_computed(&past, &mut s2, &mut i2);
            assert_eq!((&s1, &i1), (&s2, &i2), "{}", f.name);
        }
        assert!(sharded >= 3, "{sharded} sharded fixtures");
    }
}
