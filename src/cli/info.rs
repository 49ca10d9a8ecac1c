//! `zcrop info`: what an array or a group holds.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use zcrop_zarr::{Array, Group, Node};

pub(super) use crate::bench::{human_bytes, scaled};

/// A description of one array, for `zcrop info` (field names stable for `--json`).
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct ArrayInfo {
    /// Path in the store (`/` for the root).
    pub name: String,
    /// Zarr format (2 or 3).
    pub zarr_format: u8,
    /// Shape.
    pub shape: Vec<u64>,
    /// Dimension names (v3 `dimension_names`, v2 xarray's `_ARRAY_DIMENSIONS`).
    pub dimension_names: Option<Vec<Option<String>>>,
    /// Data type (v3 name).
    pub dtype: String,
    /// numpy dtype as zarr-python reports it.
    pub numpy_dtype: String,
    /// Chunks read and decoded (the inner chunks of a sharded array).
    pub chunks: Vec<u64>,
    /// Shard shape, if sharded.
    pub shards: Option<Vec<u64>>,
    /// Sharding levels.
    pub sharding_levels: usize,
    /// Codecs as stored in the metadata.
    pub codecs: serde_json::Value,
    /// How zcrop decodes a chunk.
    pub decoder: String,
    /// Storage chunks (files) in the grid, and how many exist.
    pub storage_chunks: u64,
    /// Storage chunks present.
    pub storage_chunks_present: u64,
    /// Inner chunks of all shards, and how many the indexes list (sharded arrays).
    pub inner_chunks: Option<u64>,
    /// Inner chunks present.
    pub inner_chunks_present: Option<u64>,
    /// Bytes on disk (chunk files).
    pub stored_bytes: u64,
    /// Uncompressed bytes of the whole array (`None` for variable-length elements).
    pub logical_bytes: Option<u64>,
    /// Uncompressed bytes of the stored chunks over stored bytes.
    pub compression_ratio: Option<f64>,
    /// Attributes.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// First and last value and count of a 1-d numeric coordinate (an array named like its
    /// dimension, as xarray writes them), read when the group is described.
    pub coordinate: Option<CoordRange>,
}

/// The values of a 1-d coordinate array, as stored (CF `units` say what they mean).
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct CoordRange {
    /// The first value.
    pub first: f64,
    /// The last value.
    pub last: f64,
    /// How many values.
    pub count: u64,
}

/// CF attributes worth a line of their own in the text output.
const CF_ATTRIBUTES: &[&str] = &[
    "standard_name",
    "long_name",
    "units",
    "calendar",
    "scale_factor",
    "add_offset",
    "_FillValue",
    "missing_value",
];

/// Coordinates longer than this are described by their shape only (reading them would cost).
const MAX_COORDINATE_LEN: u64 = 1 << 22;

/// Dimension names: v3 `dimension_names`, else the `_ARRAY_DIMENSIONS` attribute xarray writes
/// to v2 arrays.
fn dimension_names(a: &Array) -> Option<Vec<Option<String>>> {
    a.dimension_names().or_else(|| {
        let names = a.attributes().get("_ARRAY_DIMENSIONS")?.as_array()?;
        Some(
            names
                .iter()
                .map(|n| n.as_str().map(str::to_string))
                .collect(),
        )
    })
}

/// The first and last value of a 1-d numeric array of at most [`MAX_COORDINATE_LEN`] values.
fn coordinate_range(a: &Array) -> Result<Option<CoordRange>> {
    let [n] = a.shape() else { return Ok(None) };
    if *n == 0 || *n > MAX_COORDINATE_LEN {
        return Ok(None);
    }
    let dtype = a.numpy_dtype();
    let Some(value) = numeric_reader(&dtype) else {
        return Ok(None);
    };
    let size = a.element_size();
    let first = a.read_region(&[0], &[1])?;
    let last = a.read_region(&[n - 1], &[1])?;
    Ok(Some(CoordRange {
        first: value(&first[..size]),
        last: value(&last[..size]),
        count: *n,
    }))
}

/// A function reading one element of numpy dtype `dtype` (`<f8`, `>i4`, `|u1`, ...) as f64.
// One `as f64` for every type: i64 and u64 have no lossless `From`.
#[allow(clippy::cast_lossless)]
fn numeric_reader(dtype: &str) -> Option<fn(&[u8]) -> f64> {
    macro_rules! reader {
        ($t:ty, $from:ident) => {
            |b: &[u8]| <$t>::$from(b.try_into().unwrap_or_default()) as f64
        };
    }
    let big = dtype.starts_with('>');
    Some(match (&dtype[1..], big) {
        ("i1", _) => reader!(i8, from_le_bytes),
        ("u1", _) => reader!(u8, from_le_bytes),
        ("i2", false) => reader!(i16, from_le_bytes),
        ("i2", true) => reader!(i16, from_be_bytes),
        ("u2", false) => reader!(u16, from_le_bytes),
        ("u2", true) => reader!(u16, from_be_bytes),
        ("i4", false) => reader!(i32, from_le_bytes),
        ("i4", true) => reader!(i32, from_be_bytes),
        ("u4", false) => reader!(u32, from_le_bytes),
        ("u4", true) => reader!(u32, from_be_bytes),
        ("i8", false) => reader!(i64, from_le_bytes),
        ("i8", true) => reader!(i64, from_be_bytes),
        ("u8", false) => reader!(u64, from_le_bytes),
        ("u8", true) => reader!(u64, from_be_bytes),
        ("f4", false) => reader!(f32, from_le_bytes),
        ("f4", true) => reader!(f32, from_be_bytes),
        ("f8", false) => reader!(f64, from_le_bytes),
        ("f8", true) => reader!(f64, from_be_bytes),
        _ => return None,
    })
}

/// Describes `a`.
pub(super) fn array_info(a: &Array) -> Result<ArrayInfo> {
    let s = a.storage_summary()?;
    // Saturating: an array may hold more than 2^64 bytes (mostly missing chunks).
    let bytes = |n: u64, shape: &[u64]| {
        shape
            .iter()
            .fold(n.saturating_mul(a.element_size() as u64), |b, &d| {
                b.saturating_mul(d)
            })
    };
    let logical = bytes(1, a.shape());
    let stored_logical = match (s.inner_chunks_present, a.shard_shape()) {
        (Some(n), Some(_)) => bytes(n, a.chunk_shape()),
        _ => bytes(s.storage_chunks_present, a.storage_chunk_shape()),
    };
    let meta = a.metadata_json();
    let codecs = match meta.get("codecs") {
        Some(c) => c.clone(),
        None => serde_json::json!({
            "filters": meta.get("filters").cloned().unwrap_or_default(),
            "compressor": meta.get("compressor").cloned().unwrap_or_default(),
            "order": meta.get("order").cloned().unwrap_or_default(),
        }),
    };
    let fixed = a.variable_kind().is_none();
    Ok(ArrayInfo {
        name: a.name().to_string(),
        zarr_format: a.zarr_format(),
        shape: a.shape().to_vec(),
        dimension_names: dimension_names(a),
        dtype: a.data_type(),
        numpy_dtype: a.numpy_dtype(),
        chunks: a.chunk_shape().to_vec(),
        shards: a.shard_shape().map(<[u64]>::to_vec),
        sharding_levels: a.sharding_levels(),
        codecs,
        decoder: a.decoder_description(),
        storage_chunks: s.storage_chunks,
        storage_chunks_present: s.storage_chunks_present,
        inner_chunks: s.inner_chunks,
        inner_chunks_present: s.inner_chunks_present,
        stored_bytes: s.stored_bytes,
        logical_bytes: fixed.then_some(logical),
        compression_ratio: (fixed && s.stored_bytes > 0)
            .then(|| stored_logical as f64 / s.stored_bytes as f64),
        attributes: a.attributes().clone(),
        coordinate: None,
    })
}

/// A group and everything below it.
#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct GroupInfo {
    /// Path in the store.
    pub name: String,
    /// Zarr format.
    pub zarr_format: u8,
    /// Attributes.
    pub attributes: serde_json::Map<String, serde_json::Value>,
    /// Member arrays.
    pub arrays: Vec<ArrayInfo>,
    /// Member groups.
    pub groups: Vec<GroupInfo>,
    /// Members zcrop cannot open, with the reason.
    pub unreadable: Vec<(String, String)>,
}

/// Describes `g` recursively.
pub(super) fn group_info(g: &Group) -> Result<GroupInfo> {
    let mut info = GroupInfo {
        name: g.name().to_string(),
        zarr_format: g.zarr_format(),
        attributes: g.attributes().clone(),
        arrays: Vec::new(),
        groups: Vec::new(),
        unreadable: Vec::new(),
    };
    for (name, _) in g.members()? {
        match g.get(&name) {
            Ok(Node::Array(a)) => {
                let mut ai = array_info(&a)?;
                let own_dimension = matches!(
                    ai.dimension_names.as_deref(),
                    Some([Some(d)]) if *d == name
                );
                if own_dimension {
                    ai.coordinate = coordinate_range(&a)?;
                }
                info.arrays.push(ai);
            }
            Ok(Node::Group(sub)) => info.groups.push(group_info(&sub)?),
            Err(e) => info.unreadable.push((name, e.to_string())),
        }
    }
    Ok(info)
}

/// `n` bytes in binary units (`1.0 MiB`): for sizes that are powers of two.
pub(super) fn human_bytes_binary(n: u64) -> String {
    scaled(n, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"])
}

/// Text for one array, indented by `indent`.
pub(super) fn format_array(a: &ArrayInfo, indent: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{indent}{} (array, Zarr v{})", a.name, a.zarr_format);
    let dims = match &a.dimension_names {
        Some(names) => format!(
            " ({})",
            names
                .iter()
                .map(|n| n.as_deref().unwrap_or("-"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    let _ = writeln!(s, "{indent}  shape        {:?}{dims}", a.shape);
    if let Some(c) = &a.coordinate {
        let units = a
            .attributes
            .get("units")
            .and_then(|u| u.as_str())
            .map(|u| format!(" {u}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{indent}  values       {} .. {}{units} ({} values)",
            c.first, c.last, c.count
        );
    }
    let _ = writeln!(s, "{indent}  dtype        {} ({})", a.dtype, a.numpy_dtype);
    let _ = writeln!(s, "{indent}  chunks       {:?}", a.chunks);
    if let Some(sh) = &a.shards {
        let nested = if a.sharding_levels > 1 {
            format!(" ({} levels)", a.sharding_levels)
        } else {
            String::new()
        };
        let _ = writeln!(s, "{indent}  shards       {sh:?}{nested}");
    }
    let _ = writeln!(s, "{indent}  codecs       {}", a.codecs);
    let _ = writeln!(s, "{indent}  decoder      {}", a.decoder);
    let label = if a.shards.is_some() {
        "shards"
    } else {
        "chunks"
    };
    let _ = writeln!(
        s,
        "{indent}  stored       {} of {} {label}{}",
        a.storage_chunks_present,
        a.storage_chunks,
        match (a.inner_chunks_present, a.inner_chunks) {
            (Some(p), Some(t)) => format!(", {p} of {t} inner chunks"),
            _ => String::new(),
        }
    );
    let _ = writeln!(
        s,
        "{indent}  size         {} on disk{}{}",
        human_bytes(a.stored_bytes),
        a.logical_bytes.map_or_else(
            || " (variable-length elements)".to_string(),
            |b| format!(", {} uncompressed", human_bytes(b))
        ),
        a.compression_ratio
            .map(|r| format!(", compression ratio {r:.2}"))
            .unwrap_or_default()
    );
    let cf: Vec<String> = CF_ATTRIBUTES
        .iter()
        .filter_map(|k| a.attributes.get(*k).map(|v| format!("{k}={v}")))
        .collect();
    if !cf.is_empty() {
        let _ = writeln!(s, "{indent}  cf           {}", cf.join(" "));
    }
    if !a.attributes.is_empty() {
        let _ = writeln!(
            s,
            "{indent}  attributes   {}",
            serde_json::Value::Object(a.attributes.clone())
        );
    }
    s
}

/// Text for a group tree.
pub(super) fn format_group(g: &GroupInfo, indent: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{indent}{} (group, Zarr v{})", g.name, g.zarr_format);
    if !g.attributes.is_empty() {
        let _ = writeln!(
            s,
            "{indent}  attributes   {}",
            serde_json::Value::Object(g.attributes.clone())
        );
    }
    let deeper = format!("{indent}  ");
    for a in &g.arrays {
        s.push_str(&format_array(a, &deeper));
    }
    for sub in &g.groups {
        s.push_str(&format_group(sub, &deeper));
    }
    for (name, why) in &g.unreadable {
        let _ = writeln!(s, "{deeper}{name} (cannot be read: {why})");
    }
    s
}

/// Runs `zcrop info` on `path` (a local path or a URL such as `s3://bucket/data.zarr`, with
/// storage options); returns the text or JSON to print.
pub(super) fn run_with(
    path: &Path,
    storage_options: &[(String, String)],
    json: bool,
) -> Result<String> {
    let options = zcrop_zarr::OpenOptions {
        storage_options: storage_options.to_vec(),
        ..zcrop_zarr::OpenOptions::default()
    };
    let node = zcrop_zarr::open_with(path, &options)?;
    // An array opened by its own path is the root of its store: name it by that path.
    let named = |a: &Array| -> Result<ArrayInfo> {
        let mut info = array_info(a)?;
        if info.name == "/" {
            info.name = path.display().to_string();
        }
        Ok(info)
    };
    Ok(match (node, json) {
        (Node::Array(a), false) => format_array(&named(&a)?, ""),
        (Node::Array(a), true) => serde_json::to_string_pretty(&named(&a)?)? + "\n",
        (Node::Group(g), false) => format_group(&group_info(&g)?, ""),
        (Node::Group(g), true) => serde_json::to_string_pretty(&group_info(&g)?)? + "\n",
    })
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, human_bytes_binary};

    #[test]
    fn sizes_in_decimal_and_binary_units() {
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(1_500_000), "1.5 MB");
        assert_eq!(human_bytes_binary(1023), "1023 B");
        assert_eq!(human_bytes_binary(1 << 20), "1.0 MiB");
        assert_eq!(human_bytes_binary(16 << 20), "16.0 MiB");
        assert_eq!(
            human_bytes_binary(1 << 50),
            "1024.0 TiB",
            "the largest unit keeps going"
        );
    }
}
