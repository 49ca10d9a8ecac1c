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
    /// Uncompressed bytes of the whole array.
    pub logical_bytes: u64,
    /// Uncompressed bytes of the stored chunks over stored bytes.
    pub compression_ratio: Option<f64>,
    /// Attributes.
    pub attributes: serde_json::Map<String, serde_json::Value>,
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
    Ok(ArrayInfo {
        name: a.name().to_string(),
        zarr_format: a.zarr_format(),
        shape: a.shape().to_vec(),
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
        logical_bytes: logical,
        compression_ratio: (s.stored_bytes > 0)
            .then(|| stored_logical as f64 / s.stored_bytes as f64),
        attributes: a.attributes().clone(),
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
}

/// Describes `g` recursively.
pub(super) fn group_info(g: &Group) -> Result<GroupInfo> {
    let mut info = GroupInfo {
        name: g.name().to_string(),
        zarr_format: g.zarr_format(),
        attributes: g.attributes().clone(),
        arrays: Vec::new(),
        groups: Vec::new(),
    };
    for (name, _) in g.members()? {
        match g.get(&name)? {
            Node::Array(a) => info.arrays.push(array_info(&a)?),
            Node::Group(sub) => info.groups.push(group_info(&sub)?),
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
    let _ = writeln!(s, "{indent}  shape        {:?}", a.shape);
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
        "{indent}  size         {} on disk, {} uncompressed{}",
        human_bytes(a.stored_bytes),
        human_bytes(a.logical_bytes),
        a.compression_ratio
            .map(|r| format!(", compression ratio {r:.2}"))
            .unwrap_or_default()
    );
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
    Ok(match (node, json) {
        (Node::Array(a), false) => format_array(&array_info(&a)?, ""),
        (Node::Array(a), true) => serde_json::to_string_pretty(&array_info(&a)?)? + "\n",
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
