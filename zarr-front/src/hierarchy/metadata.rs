//! Metadata documents: reading them (a FIFO refused, a missing one not an error), parsing JSON
//! (nesting bounded), and turning a node's documents into what it is ([`NodeMeta`]): v3
//! `zarr.json`; v2 `.zarray`, `.zgroup`, `.zattrs`; consolidated metadata of both formats.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use zcrop_io::IoError;

use serde_json::{Map, Value};
use zarrs::metadata::ArrayMetadata;
use zarrs::metadata::v2::ArrayMetadataV2;
use zarrs::metadata::v3::ArrayMetadataV3;

use crate::error::{Location, Result, ZarrError};
use crate::store::{Store, V2_META, V3_META, fetch_documents};

/// What kind of node a member is, without opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// An array.
    Array,
    /// A group.
    Group,
}

/// Consolidated metadata of a store: node path (relative to the store root) -> metadata.
#[derive(Debug, Default)]
pub(crate) struct Consolidated {
    pub(crate) nodes: BTreeMap<String, NodeMeta>,
    /// Keys left out because no member can have them (`..`, empty or `.` path parts).
    pub(crate) skipped: Vec<String>,
}

/// Whether `path`, a node's path in consolidated metadata, can name a member: the root (empty)
/// or `/`-separated names, none empty, `.` or `..`.
fn is_member_path(path: &str) -> bool {
    path.is_empty()
        || path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
}

/// Parsed node metadata.
#[derive(Debug, Clone)]
pub(crate) enum NodeMeta {
    Array(Box<ArrayMetadata>),
    Group {
        zarr_format: u8,
        attributes: Map<String, Value>,
    },
}

impl NodeMeta {
    pub(crate) fn kind(&self) -> NodeKind {
        match self {
            NodeMeta::Array(_) => NodeKind::Array,
            NodeMeta::Group { .. } => NodeKind::Group,
        }
    }
}

pub(crate) fn invalid(path: &Path, reason: impl std::fmt::Display) -> ZarrError {
    ZarrError::InvalidMetadata {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match zcrop_io::read_file(path) {
        Ok(bytes) => parse_json(path, &bytes).map(Some),
        Err(e) if e.is_not_found() => Ok(None),
        Err(IoError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotADirectory => {
            Ok(None)
        }
        // The document exists but cannot be read: a store error, not bad metadata.
        Err(e) => Err(ZarrError::Io {
            at: Box::new(Location {
                node: path
                    .parent()
                    .map_or_else(String::new, |d| d.display().to_string()),
                key: path
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
                range: None,
            }),
            source: Box::new(e),
        }),
    }
}

/// The deepest nesting of arrays and objects a metadata document may have: more than
/// serde_json's own limit (128), since zarr-python (through Python's `json`) reads deeper
/// documents. Parsing, converting and dropping a document recurse once per level, a few KiB a
/// level in a debug build: 256 levels stay within half of a 2 MiB thread stack.
const MAX_JSON_DEPTH: usize = 256;

/// Parses the metadata document at `path` (for messages).
pub(crate) fn parse_json(path: &Path, bytes: &[u8]) -> Result<Value> {
    let depth = json_depth(bytes);
    if depth > MAX_JSON_DEPTH {
        return Err(invalid(
            path,
            format!(
                "JSON nested {depth} levels deep; zcrop reads metadata up to {MAX_JSON_DEPTH} levels"
            ),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    de.disable_recursion_limit();
    let v = serde::Deserialize::deserialize(&mut de).map_err(|e| invalid(path, e))?;
    de.end().map_err(|e| invalid(path, e))?;
    Ok(v)
}

/// How deeply arrays and objects nest in the JSON text `bytes` (brackets inside strings do
/// not count); for text that is not JSON, a number the parser's error will make moot.
fn json_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in bytes {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

fn attributes_of(path: &Path, v: Option<Value>) -> Result<Map<String, Value>> {
    match v {
        None => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(_) => Err(invalid(path, "attributes must be a JSON object")),
    }
}

/// A node's metadata, with the consolidated metadata it holds.
type NodeDocs = Option<(NodeMeta, Option<Consolidated>)>;

/// Reads the metadata of the node in `dir` from its own files.
pub(crate) fn read_node(store: &Store, dir: &Path) -> Result<NodeDocs> {
    Ok(read_nodes(store, &[dir])?.pop().flatten())
}

/// Reads the metadata of the nodes in `dirs`. A local store reads each file when it needs it;
/// an object store fetches every node's `zarr.json` in one batch, then the v2 documents of
/// those that have none in another.
pub(crate) fn read_nodes(store: &Store, dirs: &[&Path]) -> Result<Vec<NodeDocs>> {
    let engine = match store {
        Store::Local => {
            return dirs
                .iter()
                .map(|d| parse_node(&|n| d.join(n), &mut |n| read_json(&d.join(n))))
                .collect();
        }
        Store::Object(e) => e,
    };
    let v3 = fetch_documents(engine, dirs, &[V3_META])?;
    let need_v2: Vec<&Path> = dirs
        .iter()
        .zip(&v3)
        .filter(|(_, docs)| docs[0].is_none())
        .map(|(d, _)| *d)
        .collect();
    let mut v2 = if need_v2.is_empty() {
        Vec::new()
    } else {
        fetch_documents(engine, &need_v2, &V2_META)?
    }
    .into_iter();
    dirs.iter()
        .zip(v3)
        .map(|(d, mut v3docs)| {
            let mut docs: HashMap<&str, Bytes> = HashMap::new();
            match v3docs.pop().flatten() {
                Some(b) => {
                    docs.insert(V3_META, b);
                }
                None => {
                    for (name, doc) in V2_META.iter().zip(v2.next().unwrap_or_default()) {
                        if let Some(b) = doc {
                            docs.insert(name, b);
                        }
                    }
                }
            }
            let show = |n: &str| store.show(&d.join(n));
            parse_node(&show, &mut |n| match docs.get(n) {
                Some(b) => parse_json(&show(n), b).map(Some),
                None => Ok(None),
            })
        })
        .collect()
}

/// Parses a node's metadata; `get(name)` gives the document `name` (`zarr.json`, `.zarray`,
/// ...) of the node, `show(name)` its path for messages.
fn parse_node(
    show: &dyn Fn(&str) -> PathBuf,
    get: &mut dyn FnMut(&str) -> Result<Option<Value>>,
) -> Result<NodeDocs> {
    let zarr_json = show("zarr.json");
    if let Some(v) = get("zarr.json")? {
        return parse_v3(&zarr_json, v).map(Some);
    }
    let zarray = show(".zarray");
    if let Some(v) = get(".zarray")? {
        let mut md = parse_v2_array(v).map_err(|e| invalid(&zarray, e))?;
        let zattrs = show(".zattrs");
        md.attributes = attributes_of(&zattrs, get(".zattrs")?)?;
        return Ok(Some((
            NodeMeta::Array(Box::new(ArrayMetadata::V2(md))),
            None,
        )));
    }
    let zmetadata = show(".zmetadata");
    let group = get(".zgroup")?;
    let consolidated = match get(".zmetadata")? {
        Some(v) => Some(parse_zmetadata(&zmetadata, &v)?),
        None => None,
    };
    if group.is_some() || consolidated.is_some() {
        let zattrs = show(".zattrs");
        let attributes = attributes_of(&zattrs, get(".zattrs")?)?;
        return Ok(Some((
            NodeMeta::Group {
                zarr_format: 2,
                attributes,
            },
            consolidated,
        )));
    }
    Ok(None)
}

pub(crate) fn parse_v3(path: &Path, v: Value) -> Result<(NodeMeta, Option<Consolidated>)> {
    match v.get("node_type").and_then(Value::as_str) {
        Some("array") => {
            let md: ArrayMetadataV3 = serde_json::from_value(v).map_err(|e| invalid(path, e))?;
            Ok((NodeMeta::Array(Box::new(ArrayMetadata::V3(md))), None))
        }
        Some("group") => {
            let attributes = attributes_of(path, v.get("attributes").cloned())?;
            let consolidated = match v.get("consolidated_metadata") {
                Some(Value::Object(cm)) => Some(parse_v3_consolidated(path, cm)?),
                _ => None,
            };
            Ok((
                NodeMeta::Group {
                    zarr_format: 3,
                    attributes,
                },
                consolidated,
            ))
        }
        Some(other) => Err(invalid(path, format!("unknown node_type {other:?}"))),
        None => Err(invalid(path, "no node_type")),
    }
}

fn parse_v3_consolidated(path: &Path, cm: &Map<String, Value>) -> Result<Consolidated> {
    let mut nodes = BTreeMap::new();
    let mut skipped = Vec::new();
    if let Some(Value::Object(meta)) = cm.get("metadata") {
        for (k, v) in meta {
            if !is_member_path(k) {
                skipped.push(k.clone());
                continue;
            }
            let (node, _) = parse_v3(path, v.clone())?;
            nodes.insert(k.clone(), node);
        }
    }
    Ok(Consolidated { nodes, skipped })
}

/// Parses a v2 `.zarray` document. A dtype zarrs cannot parse (a structured dtype with
/// subarray fields, say) is kept as its JSON text, so that opening the array names the data
/// type it does not read rather than calling valid metadata invalid.
fn parse_v2_array(v: Value) -> serde_json::Result<ArrayMetadataV2> {
    match serde_json::from_value(v.clone()) {
        Ok(md) => Ok(md),
        Err(e) => {
            let mut v = v;
            match v.get_mut("dtype") {
                Some(dtype) if !dtype.is_string() => {
                    *dtype = Value::String(dtype.to_string());
                    serde_json::from_value(v).map_err(|_| e)
                }
                _ => Err(e),
            }
        }
    }
}

/// Parses a v2 `.zmetadata` file.
fn parse_zmetadata(path: &Path, v: &Value) -> Result<Consolidated> {
    let Some(Value::Object(meta)) = v.get("metadata") else {
        return Err(invalid(path, "no \"metadata\" object"));
    };
    let mut nodes = BTreeMap::new();
    let mut skipped = Vec::new();
    for (k, v) in meta {
        let (node_path, file) = match k.rsplit_once('/') {
            Some((p, f)) => (p.to_string(), f),
            None => (String::new(), k.as_str()),
        };
        if !is_member_path(&node_path) {
            skipped.push(k.clone());
            continue;
        }
        let attrs_key = if node_path.is_empty() {
            ".zattrs".to_string()
        } else {
            format!("{node_path}/.zattrs")
        };
        let attrs = || attributes_of(path, meta.get(&attrs_key).cloned());
        match file {
            ".zarray" => {
                let mut md =
                    parse_v2_array(v.clone()).map_err(|e| invalid(path, format!("{k}: {e}")))?;
                md.attributes = attrs()?;
                nodes.insert(node_path, NodeMeta::Array(Box::new(ArrayMetadata::V2(md))));
            }
            ".zgroup" => {
                nodes.insert(
                    node_path,
                    NodeMeta::Group {
                        zarr_format: 2,
                        attributes: attrs()?,
                    },
                );
            }
            _ => {}
        }
    }
    Ok(Consolidated { nodes, skipped })
}

/// Every codec name in v3 codec metadata, nested sharding included.
pub(crate) fn codec_names(codecs: &[zarrs::metadata::v3::MetadataV3], out: &mut Vec<String>) {
    for c in codecs {
        out.push(c.name().to_string());
        if let Some(cfg) = c.configuration() {
            for key in ["codecs", "index_codecs"] {
                if let Some(inner) = cfg.get(key)
                    && let Ok(inner) = serde_json::from_value::<Vec<zarrs::metadata::v3::MetadataV3>>(
                        inner.clone(),
                    )
                {
                    codec_names(&inner, out);
                }
            }
        }
    }
}

/// Names of the codecs of v2 metadata.
pub(crate) fn v2_codec_names(md: &ArrayMetadataV2) -> Vec<String> {
    md.filters
        .iter()
        .flatten()
        .chain(md.compressor.iter())
        .map(|c| c.id().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_depth_counts_nesting_outside_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(br#"{"a": [1, {"b": []}]}"#), 4);
        assert_eq!(json_depth(br#"{"a": "[[[[{{"}"#), 1);
        assert_eq!(json_depth(br#"["\"[[", [[]]]"#), 3);
        assert_eq!(json_depth(br#"["\\", [[]]]"#), 3);
    }

    #[test]
    fn metadata_nests_up_to_the_limit_on_a_small_thread_stack() {
        let doc = |depth: usize| {
            format!(
                r#"{{"zarr_format": 3, "node_type": "group", "attributes": {{"x": {}1{}}}}}"#,
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let path = Path::new("zarr.json");
        // Parsing, converting and dropping recurse once per level: on a 1 MiB stack (threads
        // get 2 MiB), debug build included.
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                let v = parse_json(path, doc(MAX_JSON_DEPTH - 2).as_bytes()).unwrap();
                let (meta, _) = parse_v3(path, v).unwrap();
                drop(meta);
                let err = parse_json(path, doc(MAX_JSON_DEPTH).as_bytes()).unwrap_err();
                assert!(err.to_string().contains("nested"), "{err}");
            })
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn consolidated_keys_no_member_can_have_are_skipped() {
        for (path, ok) in [
            ("", true),
            ("a", true),
            ("a/b", true),
            ("..", false),
            ("a/../b", false),
            ("./a", false),
            ("a//b", false),
            ("/a", false),
        ] {
            assert_eq!(is_member_path(path), ok, "{path:?}");
        }
    }
}
