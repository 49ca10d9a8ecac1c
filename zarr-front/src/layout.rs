//! The physical layout of an array: storage chunks (files), shard levels, and the leaf chunks
//! the decoder sees. Built once at open time from zarrs' view of the metadata; everything here
//! is a pure function of metadata and bytes.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::codec::{ShardingCodec, ShardingCodecConfiguration, ShardingIndexLocation};
use zarrs::array::{
    Array, ArrayToBytesCodecTraits, BytesRepresentation, CodecChain, CodecMetadataOptions,
    FillValue, data_type,
};
use zarrs::metadata::ConfigurationSerialize;
use zarrs::plugin::ExtensionName;

use crate::decode::LeafDecoder;
use crate::error::ZarrError;
use crate::shard::ShardLevel;

const TWO: NonZeroU64 = NonZeroU64::new(2).unwrap();

/// Variable-length data types (zarr-python's `string` and `bytes`; v2 `|O` with the
/// vlen-utf8 or vlen-bytes codec), read whole chunks at a time by `Array::read_variable`.
pub(crate) const VARIABLE_DATA_TYPES: &[&str] = &["string", "bytes"];

/// Data types zcrop reads through its fixed-size read path (v3 names).
pub(crate) const SUPPORTED_DATA_TYPES: &[&str] = &[
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "fixed_length_utf32",
    crate::dtype::NULL_TERMINATED_BYTES,
    "numpy.datetime64",
    "numpy.timedelta64",
];

/// How an array is laid out on storage.
#[derive(Debug)]
pub(crate) struct Layout {
    pub(crate) shape: Vec<u64>,
    pub(crate) elsize: usize,
    /// Elements of variable length (strings, bytes): `elsize` is 1, a plan's unit, and only
    /// `Array::read_variable` reads them.
    pub(crate) variable: bool,
    /// One fill element, native endian.
    pub(crate) fill: Vec<u8>,
    /// Shape of a storage chunk (a file): a chunk, or an outermost shard.
    pub(crate) storage_chunk: Vec<u64>,
    /// Sharding levels from the outermost in (empty when unsharded).
    pub(crate) levels: Vec<ShardLevel>,
    /// Shape of the chunks the decoder sees.
    pub(crate) leaf: Vec<u64>,
    /// [`Layout::locate`]'s answers per dimension, where the leaf grid is small enough.
    tables: Option<LocateTables>,
}

/// Per dimension `d` and leaf-grid index `i` along it: the storage chunk's coordinate, and at
/// each sharding level the inner chunk's coordinate in its shard times its C-order stride
/// there (so that an inner index is a sum of lookups). A batch locates thousands of leaves;
/// computed, each costs three divisions per dimension and level.
#[derive(Debug)]
struct LocateTables {
    /// `storage[d][i]`.
    storage: Vec<Vec<u64>>,
    /// `inner[level][d][i]`.
    inner: Vec<Vec<Vec<u64>>>,
}

/// Leaf-grid entries (summed over the dimensions) up to which [`LocateTables`] are built: at
/// most 2 MiB per table set (one, plus one per sharding level) of an open array.
const MAX_TABLE_ENTRIES: u64 = 1 << 18;

impl LocateTables {
    fn new(
        shape: &[u64],
        leaf: &[u64],
        storage_chunk: &[u64],
        levels: &[ShardLevel],
    ) -> Option<Self> {
        let grid: Vec<u64> = shape
            .iter()
            .zip(leaf)
            .map(|(s, c)| s.div_ceil(*c))
            .collect();
        if grid.iter().sum::<u64>() > MAX_TABLE_ENTRIES {
            return None;
        }
        let storage = (0..shape.len())
            .map(|d| {
                (0..grid[d])
                    .map(|i| i * leaf[d] / storage_chunk[d])
                    .collect()
            })
            .collect();
        let inner = levels
            .iter()
            .map(|lvl| {
                (0..shape.len())
                    .map(|d| {
                        let stride: u64 = lvl.per_shard[d + 1..].iter().product();
                        (0..grid[d])
                            .map(|i| {
                                (i * leaf[d] % lvl.shard_shape[d]) / lvl.inner_shape[d] * stride
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        Some(LocateTables { storage, inner })
    }
}

impl Layout {
    /// Analyses `array` (named `name` in messages) and builds the decoder of its leaf chunks.
    pub(crate) fn new(
        name: &str,
        array: &Array<()>,
        verify_checksums: bool,
    ) -> Result<(Layout, LeafDecoder), ZarrError> {
        let dt = array.data_type();
        let dt_name = dt.name_v3().map(Cow::into_owned);
        let variable = dt_name
            .as_deref()
            .is_some_and(|n| VARIABLE_DATA_TYPES.contains(&n))
            && dt.fixed_size().is_none();
        let elsize = match (&dt_name, dt.fixed_size()) {
            (Some(n), Some(size)) if SUPPORTED_DATA_TYPES.contains(&n.as_str()) => size,
            // Variable-length elements count as one unit in plans; `Array::read_variable`
            // reads them, the fixed-size paths refuse them.
            _ if variable => 1,
            _ => {
                return Err(ZarrError::UnsupportedDataType {
                    array: name.to_string(),
                    data_type: dt.to_string(),
                });
            }
        };
        let shape = array.shape().to_vec();
        let nd = shape.len();
        let storage_chunk: Vec<u64> = array
            .chunk_shape(&vec![0; nd])
            .map_err(|e| unsupported(name, format!("its chunk grid ({e})")))?
            .iter()
            .map(|c| c.get())
            .collect();

        let mut levels = Vec::new();
        let mut chain: Arc<CodecChain> = array.codecs();
        let mut outer = storage_chunk.clone();
        loop {
            let a2b = chain.array_to_bytes_codec();
            if !a2b.as_any().is::<ShardingCodec>() {
                break;
            }
            if !chain.array_to_array_codecs().is_empty() {
                return Err(unsupported_codec(
                    name,
                    &crate::decode::codec_name(chain.array_to_array_codecs()[0].name_v3()),
                    "array-to-array codecs before sharding_indexed",
                ));
            }
            if let Some(c) = chain.bytes_to_bytes_codecs().first() {
                return Err(unsupported_codec(
                    name,
                    &crate::decode::codec_name(c.name_v3()),
                    "bytes-to-bytes codecs after sharding_indexed (they encode whole shards)",
                ));
            }
            let cfg = a2b
                .configuration_v3(&CodecMetadataOptions::default())
                .ok_or_else(|| unsupported_codec(name, "sharding_indexed", "no configuration"))?;
            let ShardingCodecConfiguration::V1(sh) =
                ShardingCodecConfiguration::try_from_configuration(cfg)
                    .map_err(|e| unsupported_codec(name, "sharding_indexed", &e.to_string()))?
            else {
                return Err(unsupported_codec(
                    name,
                    "sharding_indexed",
                    "unknown configuration version",
                ));
            };
            let inner: Vec<u64> = sh.chunk_shape.iter().map(|c| c.get()).collect();
            if inner.len() != nd || outer.iter().zip(&inner).any(|(o, i)| o % i != 0) {
                return Err(unsupported_codec(
                    name,
                    "sharding_indexed",
                    &format!("inner chunk shape {inner:?} does not divide shard shape {outer:?}"),
                ));
            }
            let per_shard: Vec<u64> = outer.iter().zip(&inner).map(|(o, i)| o / i).collect();
            // Two u64 per inner chunk, allocated when the index is read.
            check_bytes(name, "a shard index", &per_shard, 16, MAX_ALLOC)?;
            let index_chain =
                Arc::new(CodecChain::from_metadata(&sh.index_codecs).map_err(|e| {
                    unsupported_codec(name, "sharding_indexed", &format!("index codecs: {e}"))
                })?);
            let mut index_shape: Vec<NonZeroU64> = per_shard
                .iter()
                .filter_map(|&p| NonZeroU64::new(p))
                .collect();
            index_shape.push(TWO);
            let Ok(BytesRepresentation::FixedSize(index_bytes)) = index_chain
                .encoded_representation(
                    &index_shape,
                    &data_type::uint64(),
                    &FillValue::from(u64::MAX),
                )
            else {
                return Err(unsupported_codec(
                    name,
                    "sharding_indexed",
                    "index codecs of variable size (only fixed-size index codecs such as bytes + crc32c)",
                ));
            };
            let next = Arc::new(CodecChain::from_metadata(&sh.codecs).map_err(|e| {
                unsupported_codec(name, "sharding_indexed", &format!("inner codecs: {e}"))
            })?);
            levels.push(ShardLevel {
                shard_shape: outer.clone(),
                inner_shape: inner.clone(),
                per_shard,
                index_at_start: matches!(sh.index_location, ShardingIndexLocation::Start),
                index_bytes,
                index_chain,
                index_shape,
            });
            outer = inner;
            chain = next;
        }
        if variable {
            let a2b = crate::decode::codec_name(chain.array_to_bytes_codec().name_v3());
            if !matches!(a2b.as_str(), "vlen-utf8" | "vlen-bytes") {
                return Err(unsupported_codec(
                    name,
                    &a2b,
                    "variable-length elements are read with vlen-utf8 or vlen-bytes",
                ));
            }
            if let Some(c) = chain.array_to_array_codecs().first() {
                return Err(unsupported_codec(
                    name,
                    &crate::decode::codec_name(c.name_v3()),
                    "array-to-array codecs before vlen-utf8 / vlen-bytes",
                ));
            }
        }
        let leaf = outer;
        let leaf_nz: Vec<NonZeroU64> = leaf.iter().filter_map(|&c| NonZeroU64::new(c)).collect();
        if leaf_nz.len() != nd {
            return Err(unsupported(name, "a chunk shape with a zero extent".into()));
        }
        let chunk_bytes = check_bytes(name, "a chunk", &leaf, elsize as u64, MAX_ALLOC)?;
        let decoder = LeafDecoder::new(
            chain,
            chunk_bytes,
            leaf_nz,
            dt.clone(),
            array.fill_value().clone(),
            elsize,
            verify_checksums,
        );
        let fill = if variable {
            vec![0]
        } else {
            array.fill_value().as_ne_bytes().to_vec()
        };
        if fill.len() != elsize {
            return Err(unsupported(
                name,
                format!(
                    "a fill value of {} bytes for {elsize}-byte elements",
                    fill.len()
                ),
            ));
        }
        Ok((
            Layout {
                tables: LocateTables::new(&shape, &leaf, &storage_chunk, &levels),
                shape,
                elsize,
                variable,
                fill,
                storage_chunk,
                levels,
                leaf,
            },
            decoder,
        ))
    }

    /// The leaf-chunk grid shape.
    pub(crate) fn leaf_grid(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.leaf)
            .map(|(s, c)| s.div_ceil(*c))
            .collect()
    }

    /// Where leaf chunk `leaf` lives: the coordinates of its storage chunk (into `storage`), and
    /// its C-order index within the shard of each sharding level (into `inner`, one slot per
    /// level). Into the caller's buffers, without allocating: reads locate every chunk of a
    /// batch.
    pub(crate) fn locate(&self, leaf: &[u64], storage: &mut Vec<u64>, inner: &mut [usize]) {
        storage.clear();
        if let Some(t) = &self.tables
            && leaf.len() == t.storage.len()
        {
            for (&i, table) in leaf.iter().zip(&t.storage) {
                let Some(&s) = lookup(table, i) else {
                    // Outside the grid (no read plans such a leaf): as computed.
                    return self.locate_computed(leaf, storage, inner);
                };
                storage.push(s);
            }
            for (tables, slot) in t.inner.iter().zip(inner.iter_mut()) {
                let mut linear = 0;
                for (&i, table) in leaf.iter().zip(tables) {
                    linear += lookup(table, i).copied().unwrap_or_default();
                }
                *slot = linear as usize;
            }
            return;
        }
        self.locate_computed(leaf, storage, inner);
    }

    /// Whether [`Layout::locate`] looks its answers up in tables.
    #[cfg(test)]
    pub(crate) fn has_locate_tables(&self) -> bool {
        self.tables.is_some()
    }

    /// [`Layout::locate`] without tables.
    pub(crate) fn locate_computed(
        &self,
        leaf: &[u64],
        storage: &mut Vec<u64>,
        inner: &mut [usize],
    ) {
        let element = |d: usize| leaf[d] * self.leaf[d];
        storage.clear();
        storage.extend((0..leaf.len()).map(|d| element(d) / self.storage_chunk[d]));
        for (lvl, slot) in self.levels.iter().zip(inner) {
            let mut linear = 0u64;
            for d in 0..leaf.len() {
                let within = (element(d) % lvl.shard_shape[d]) / lvl.inner_shape[d];
                linear = linear * lvl.per_shard[d] + within;
            }
            *slot = linear as usize;
        }
    }
}

/// The most bytes one allocation may hold (Rust's limit for any allocation).
const MAX_ALLOC: u128 = isize::MAX as u128;

/// `elsize` times the product of `dims`, if at most `limit`; otherwise a metadata error
/// naming `what` (so that no size derived from metadata can wrap later).
fn check_bytes(
    name: &str,
    what: &str,
    dims: &[u64],
    elsize: u64,
    limit: u128,
) -> Result<usize, ZarrError> {
    let bytes = dims
        .iter()
        .try_fold(u128::from(elsize), |n, &d| n.checked_mul(u128::from(d)))
        .filter(|&n| n <= limit);
    match bytes.and_then(|n| usize::try_from(n).ok()) {
        Some(n) => Ok(n),
        None => Err(ZarrError::Oversized {
            array: name.to_string(),
            reason: format!(
                "{what} of shape {dims:?} with {elsize}-byte elements is larger than {limit} bytes"
            ),
        }),
    }
}

/// `table[i]`, if there.
fn lookup(table: &[u64], i: u64) -> Option<&u64> {
    usize::try_from(i).ok().and_then(|i| table.get(i))
}

fn unsupported(name: &str, feature: String) -> ZarrError {
    ZarrError::Unsupported {
        array: name.to_string(),
        feature,
    }
}

fn unsupported_codec(name: &str, codec: &str, reason: &str) -> ZarrError {
    ZarrError::UnsupportedCodec {
        array: name.to_string(),
        codec: codec.to_string(),
        reason: reason.to_string(),
    }
}
