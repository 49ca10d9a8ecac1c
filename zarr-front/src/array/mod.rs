//! [`Array`]: an opened Zarr array, what it says of itself, and its read path:
//!
//! - [`read`]: the public read entry points (regions, batches of crops, selections), each
//!   planned whole ([`crate::plan`]) and executed;
//! - [`locate`]: where each leaf chunk's bytes are, through the shard indexes level by level
//!   (cached with their file's version);
//! - [`fetch`]: all those byte ranges to `zcrop-io` in one submission, each chunk decoded on
//!   the rayon pool as soon as its bytes arrive and copied into every output block that needs
//!   it while it is still in cache;
//! - [`options`]: how to open and read, and what a read did;
//! - [`decoded`]: the decoded-chunk cache, one per process unless an array has its own;
//! - [`variable`]: arrays of variable-length strings and bytes, read whole chunks at a time.

mod blocks;
mod decoded;
mod fetch;
mod locate;
pub(crate) mod options;
mod read;
mod variable;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use zcrop_io::fork::PerProcess;
use zcrop_io::{IoEngine, ObjectEngine, ReadRange, ReadRequest};

use crate::cache::LruCache;
use crate::decode::LeafDecoder;
use crate::error::{Location, Result, ZarrError};
use crate::layout::Layout;
use crate::place::NodePlace;
use crate::shard::{IndexEntry, ShardLevel};
use crate::store::{Reader, Store};

use self::decoded::DecodedChunks;
pub use self::decoded::{
    DEFAULT_CHUNK_CACHE_BYTES, shared_chunk_cache_budget, shared_chunk_cache_usage,
};
use self::fetch::decode_error;

use self::locate::FileStamp;
pub use self::options::{
    BlockFetch, OpenOptions, ReadOptions, ReadStats, WholeChunks, WholeReason,
};
pub use self::read::{ReadPart, read_many};
pub use self::variable::{VariableElements, VariableKind};

/// Default byte budget of the shard-index cache of one array (64 MiB).
pub const DEFAULT_INDEX_CACHE_BYTES: usize = 64 << 20;

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
    pub(crate) core: Arc<Core>,
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array")
            .field("name", &self.core.place.name)
            .field("shape", &self.core.layout.shape)
            .field("data_type", &self.data_type())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Core {
    /// Where the array is in its store.
    pub(crate) place: NodePlace,
    meta: zarrs::array::Array<()>,
    /// The metadata as stored (`meta` may hold a v2 `null` fill value made explicit).
    stored: zarrs::metadata::ArrayMetadata,
    layout: Layout,
    decoder: LeafDecoder,
    reader: Reader,
    /// How it was opened (its parent group opens the same way).
    pub(crate) options: OpenOptions,
    verify_checksums: bool,
    /// Built on first use in each process: a child of `fork` must not wait on a cache lock
    /// that a parent thread held at the fork.
    caches: PerProcess<Caches>,
    /// This open's number, which keys its chunks in the process-wide decoded-chunk cache.
    id: u64,
    /// For an array of an Icechunk repository: where its chunks are (not at their keys).
    pub(crate) icechunk: Option<Arc<crate::icechunk::ArrayChunks>>,
}

/// An array's caches.
struct Caches {
    index: IndexCache,
    /// Where the blocks of large blosc chunks are (see [`blocks`]), by chunk object.
    blosc: LruCache<Arc<Path>, Arc<zcrop_codec::blosc::BlockIndex>>,
    /// Where the blocks of its large blosc chunks tend to lie (see [`blocks`]).
    blosc_layout: zcrop_io::sync::Mutex<blocks::BlockLayout>,
    chunk: Option<DecodedChunks>,
}

impl Core {
    /// The array's caches in this process.
    fn caches(&self) -> &Caches {
        self.caches.get_or_init(|| Caches {
            index: LruCache::new(self.options.index_cache_bytes),
            blosc: LruCache::new(self.options.index_cache_bytes),
            blosc_layout: zcrop_io::sync::Mutex::default(),
            chunk: DecodedChunks::for_array(&self.options, self.id, self.decoder.chunk_bytes),
        })
    }
}

/// Decoded shard indexes by (file, level, shard start), with the version of their file.
type IndexCache = LruCache<(Arc<Path>, usize, u64), (Option<FileStamp>, Arc<[u64]>)>;

/// `ZCROP_BLOSC_BLOCK_FETCH` (`auto`, `always`, `never`), which overrides
/// [`OpenOptions::blosc_blocks`]; `None` where it is not set.
fn blosc_block_fetch_env() -> Result<Option<BlockFetch>> {
    const NAME: &str = "ZCROP_BLOSC_BLOCK_FETCH";
    match std::env::var(NAME).ok().filter(|v| !v.is_empty()) {
        None => Ok(None),
        Some(v) => BlockFetch::parse(&v).map(Some).ok_or_else(|| {
            ZarrError::InvalidArgument(format!("{NAME}={v:?}: expected auto, always or never"))
        }),
    }
}

impl Array {
    /// Builds the array at `place` of `store` from parsed metadata; `stored` is its metadata as
    /// stored.
    pub(crate) fn from_metadata(
        place: NodePlace,
        store: &Store,
        meta: zarrs::array::Array<()>,
        stored: zarrs::metadata::ArrayMetadata,
        options: &OpenOptions,
    ) -> Result<Array> {
        let (layout, decoder) = Layout::new(&place.name, &meta, options.verify_checksums)?;
        let reader = store.reader(options.engine.as_ref())?;
        let mut options = options.clone();
        if let Some(b) = blosc_block_fetch_env()? {
            options.blosc_blocks = b;
        }
        decoded::check_options(&options)?;
        Ok(Array {
            core: Arc::new(Core {
                place,
                meta,
                stored,
                layout,
                decoder,
                reader,
                verify_checksums: options.verify_checksums,
                options,
                caches: PerProcess::new(),
                id: decoded::next_array_id(),
                icechunk: None,
            }),
        })
    }

    /// This new array as an array of an Icechunk snapshot, its chunks where `chunks` says.
    pub(crate) fn in_icechunk(mut self, chunks: crate::icechunk::ArrayChunks) -> Array {
        if let Some(core) = Arc::get_mut(&mut self.core) {
            core.icechunk = Some(Arc::new(chunks));
        }
        self
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
        self.fixed_size_elements()?;
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
        self.fixed_size_elements()?;
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
                self.core.place.name
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
        &self.core.place.name
    }

    /// The array's path relative to the store root, e.g. `` or `group/temperature`.
    pub fn path(&self) -> &str {
        self.core.place.path()
    }

    /// The array's directory on disk, or for an object store its key prefix under the bucket
    /// (or container, or host).
    pub fn dir(&self) -> &Path {
        &self.core.place.dir
    }

    /// Where the array is: its directory, or its URL.
    pub fn uri(&self) -> String {
        self.store().uri(&self.core.place.dir)
    }

    /// The storage options the array was opened with (empty for a local array).
    pub fn storage_options(&self) -> &[(String, String)] {
        &self.core.options.storage_options
    }

    pub(crate) fn store(&self) -> Store {
        self.core.reader.store()
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
        numpy_dtype(self.core.meta.data_type(), &self.core.stored)
    }

    /// Bytes per element.
    pub fn element_size(&self) -> usize {
        self.core.layout.elsize
    }

    /// The fill value, one element of native-endian bytes (of a variable-length array: the
    /// fill element's bytes).
    pub fn fill_value_bytes(&self) -> &[u8] {
        if self.core.layout.variable {
            self.core.decoder.fill_bytes()
        } else {
            &self.core.layout.fill
        }
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
        serde_json::to_value(&self.core.stored).unwrap_or(serde_json::Value::Null)
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
            self.core.place.key_prefix,
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
                    self.core.place.name
                ))
            })?;
        let mut summary = StorageSummary {
            storage_chunks: total,
            ..StorageSummary::default()
        };
        let mut present: Vec<(String, Arc<Path>, u64)> = Vec::new();
        let mut coords = vec![0u64; grid.len()];
        // An object store lists the array's objects once; local files are asked one by one.
        let listed = self.store().object_sizes(&self.core.place.dir)?;
        for i in 0..total {
            let mut rem = i;
            for d in (0..grid.len()).rev() {
                coords[d] = rem % grid[d];
                rem /= grid[d];
            }
            let rel = self.core.meta.chunk_key(&coords).to_string();
            let path = self.core.place.dir.join(&rel);
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
                present.push((self.core.place.key(&rel), Arc::from(path.as_path()), len));
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

    /// The byte budget of the decoded-chunk cache reads of this array go through, and whether
    /// it is the process-wide one; `None` where they go through none (see
    /// [`OpenOptions::chunk_cache_bytes`]).
    pub fn chunk_cache(&self) -> Option<(usize, bool)> {
        self.core.caches().chunk.as_ref().map(DecodedChunks::budget)
    }

    /// Drops cached shard indexes, blosc headers and decoded chunks, and what reads learnt
    /// of where blosc chunks keep their blocks.
    pub fn clear_caches(&self) {
        let caches = self.core.caches();
        caches.index.clear();
        caches.blosc.clear();
        *caches.blosc_layout.lock() = blocks::BlockLayout::default();
        if let Some(c) = &caches.chunk {
            c.clear();
        }
    }

    #[allow(clippy::unnecessary_box_returns)] // errors box their location to stay small
    fn location(&self, key: &str, range: Option<ReadRange>) -> Box<Location> {
        Box::new(Location {
            node: self.core.place.name.clone(),
            key: key.to_string(),
            range,
        })
    }
}

/// The numpy dtype string zarr-python gives an array of data type `dt`.
fn numpy_dtype(dt: &zarrs::array::DataType, meta: &zarrs::metadata::ArrayMetadata) -> String {
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
    let name = dt.name_v3().unwrap_or_default();
    let config = |key: &str| dt.configuration_v3().get(key).cloned();
    let (kind, size) = match name.as_ref() {
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
        "fixed_length_utf32" => ('U', dt.fixed_size().unwrap_or_default() / 4),
        // Variable-length elements are Python objects in numpy's classic dtypes.
        "string" | "bytes" => return "|O".into(),
        crate::dtype::NULL_TERMINATED_BYTES => {
            return format!("|S{}", dt.fixed_size().unwrap_or_default());
        }
        "numpy.datetime64" | "numpy.timedelta64" => {
            let kind = if name == "numpy.datetime64" { 'M' } else { 'm' };
            let unit = config("unit").and_then(|u| u.as_str().map(str::to_string));
            let scale = config("scale_factor").and_then(|s| s.as_u64()).unwrap_or(1);
            let scale = if scale == 1 {
                String::new()
            } else {
                scale.to_string()
            };
            return format!("{native}{kind}8[{scale}{}]", unit.unwrap_or_default());
        }
        other => return other.to_string(),
    };
    format!("{native}{kind}{size}")
}
