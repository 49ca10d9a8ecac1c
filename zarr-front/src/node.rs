//! Opening arrays and groups from a local directory or an object store (a URL): v3
//! `zarr.json`; v2 `.zarray`, `.zgroup`, `.zattrs` and consolidated `.zmetadata`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use zcrop_io::{IoError, ObjectConfig, ObjectEngine, is_object_url};

use serde_json::{Map, Value};
use zarrs::array::ArrayCreateError;
use zarrs::metadata::ArrayMetadata;
use zarrs::metadata::v2::ArrayMetadataV2;
use zarrs::metadata::v3::ArrayMetadataV3;
use zarrs::plugin::PluginCreateError;

use crate::array::{Array, OpenOptions};
use crate::error::{Location, Result, ZarrError};
use crate::store::{Store, V2_META, V3_META, fetch_documents};

/// An array or a group.
#[derive(Debug, Clone)]
pub enum Node {
    /// An array.
    Array(Array),
    /// A group.
    Group(Group),
}

impl Node {
    /// "array" or "group".
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Array(_) => "array",
            Node::Group(_) => "group",
        }
    }
}

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
struct Consolidated {
    nodes: BTreeMap<String, NodeMeta>,
    /// Keys left out because no member can have them (`..`, empty or `.` path parts).
    skipped: Vec<String>,
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
enum NodeMeta {
    Array(Box<ArrayMetadata>),
    Group {
        zarr_format: u8,
        attributes: Map<String, Value>,
    },
}

impl NodeMeta {
    fn kind(&self) -> NodeKind {
        match self {
            NodeMeta::Array(_) => NodeKind::Array,
            NodeMeta::Group { .. } => NodeKind::Group,
        }
    }
}

/// An opened Zarr group. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Group {
    core: Arc<GroupCore>,
}

#[derive(Debug)]
struct GroupCore {
    name: String,
    key_prefix: String,
    dir: PathBuf,
    store: Store,
    zarr_format: u8,
    attributes: Map<String, Value>,
    consolidated: Option<Arc<Consolidated>>,
    options: OpenOptions,
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> ZarrError {
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
fn read_node(store: &Store, dir: &Path) -> Result<NodeDocs> {
    Ok(read_nodes(store, &[dir])?.pop().flatten())
}

/// Reads the metadata of the nodes in `dirs`. A local store reads each file when it needs it;
/// an object store fetches every node's `zarr.json` in one batch, then the v2 documents of
/// those that have none in another.
fn read_nodes(store: &Store, dirs: &[&Path]) -> Result<Vec<NodeDocs>> {
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
        let mut md: ArrayMetadataV2 = serde_json::from_value(v).map_err(|e| invalid(&zarray, e))?;
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

fn parse_v3(path: &Path, v: Value) -> Result<(NodeMeta, Option<Consolidated>)> {
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
                let mut md: ArrayMetadataV2 = serde_json::from_value(v.clone())
                    .map_err(|e| invalid(path, format!("{k}: {e}")))?;
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
fn codec_names(codecs: &[zarrs::metadata::v3::MetadataV3], out: &mut Vec<String>) {
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
fn v2_codec_names(md: &ArrayMetadataV2) -> Vec<String> {
    md.filters
        .iter()
        .flatten()
        .chain(md.compressor.iter())
        .map(|c| c.id().to_string())
        .collect()
}

/// Builds an [`Array`] from metadata, turning zarrs' complaints into typed errors.
fn make_array(
    name: String,
    key_prefix: String,
    dir: PathBuf,
    store: &Store,
    md: ArrayMetadata,
    options: &OpenOptions,
) -> Result<Array> {
    let meta_path = store.show(&dir.join(if matches!(md, ArrayMetadata::V2(_)) {
        ".zarray"
    } else {
        "zarr.json"
    }));
    if let ArrayMetadata::V3(m) = &md {
        if let Some((field, _)) = m
            .additional_fields
            .iter()
            .find(|(_, f)| f.must_understand())
        {
            return Err(ZarrError::Unsupported {
                array: name,
                feature: format!("the metadata extension {field:?} (must_understand)"),
            });
        }
        if let Some(t) = m.storage_transformers.first() {
            return Err(ZarrError::Unsupported {
                array: name,
                feature: format!("the storage transformer {:?}", t.name()),
            });
        }
        if m.chunk_grid.name() != "regular" {
            return Err(ZarrError::Unsupported {
                array: name,
                feature: format!(
                    "the chunk grid {:?} (only \"regular\")",
                    m.chunk_grid.name()
                ),
            });
        }
    }
    let names = match &md {
        ArrayMetadata::V3(m) => {
            let mut n = Vec::new();
            codec_names(&m.codecs, &mut n);
            n
        }
        ArrayMetadata::V2(m) => v2_codec_names(m),
    };
    let unsupported_codec = |msg: String| {
        let codec = names
            .iter()
            .find(|n| msg.contains(n.as_str()))
            .cloned()
            .unwrap_or_else(|| "unknown".into());
        ZarrError::UnsupportedCodec {
            array: name.clone(),
            codec,
            reason: msg,
        }
    };
    let meta = match zarrs::array::Array::new_with_metadata(Arc::new(()), "/", md) {
        Ok(a) => a,
        Err(ArrayCreateError::CodecsCreateError(e)) => {
            return Err(unsupported_codec(e.to_string()));
        }
        Err(ArrayCreateError::UnsupportedZarrV2Array(msg)) => return Err(unsupported_codec(msg)),
        Err(ArrayCreateError::DataTypeCreateError(PluginCreateError::Unsupported(e))) => {
            return Err(ZarrError::UnsupportedDataType {
                array: name,
                data_type: e.to_string(),
            });
        }
        Err(e) => return Err(invalid(&meta_path, e)),
    };
    Array::from_metadata(name, key_prefix, dir, store, meta, options)
}

/// Opens the array or group at `path`: a local directory, or a URL of an object store
/// (`s3://bucket/data.zarr`, `gs://...`, `az://...`, `https://...`; see
/// [`OpenOptions::storage_options`]).
pub fn open(path: impl AsRef<Path>) -> Result<Node> {
    open_with(path, &OpenOptions::default())
}

/// [`open`] with options (which apply to every array opened through the result).
pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Node> {
    let (store, dir) = locate(path.as_ref(), options)?;
    open_in(&store, &dir, options)
}

/// Opens the node at `dir` of `store` as the root of what is opened.
pub(crate) fn open_in(store: &Store, dir: &Path, options: &OpenOptions) -> Result<Node> {
    let Some((meta, consolidated)) = read_node(store, dir)? else {
        return Err(ZarrError::NodeNotFound {
            path: store.show(dir),
        });
    };
    node_from(
        meta,
        consolidated.map(Arc::new),
        "/".into(),
        String::new(),
        dir.to_path_buf(),
        store,
        options,
    )
}

/// Where what [`open`] was given lives: a local path (also as a `file://` URL), or an object
/// store URL, read through [`OpenOptions::object_engine`] or an engine opened for the URL's
/// bucket with [`OpenOptions::storage_options`]. Returns the store and the node's path in it.
pub(crate) fn locate(path: &Path, options: &OpenOptions) -> Result<(Store, PathBuf)> {
    let url = path.to_str().filter(|s| is_object_url(s));
    let Some(url) = url else {
        if !options.storage_options.is_empty() {
            return Err(ZarrError::InvalidArgument(format!(
                "storage options apply to object-store URLs (s3://, gs://, az://, https://); \
                 {} is a local path",
                path.display()
            )));
        }
        let local = path
            .to_str()
            .and_then(|s| s.strip_prefix("file://"))
            .map_or_else(|| path.to_path_buf(), PathBuf::from);
        return Ok((Store::Local, local));
    };
    let url = url.trim_end_matches('/');
    match &options.object_engine {
        Some(engine) => {
            let root = engine.url();
            let rest = url
                .strip_prefix(root)
                .filter(|r| r.is_empty() || r.starts_with('/'))
                .ok_or_else(|| {
                    ZarrError::InvalidArgument(format!(
                        "{url} is not under {root}, the root of the object engine given"
                    ))
                })?;
            Ok((
                Store::Object(engine.clone()),
                PathBuf::from(rest.trim_start_matches('/')),
            ))
        }
        None => {
            // Arrays and groups opened from one bucket with the same options share an engine.
            let (engine, key) = ObjectEngine::open_container_shared(
                url,
                &options.storage_options,
                ObjectConfig::from_env()?,
            )?;
            Ok((Store::Object(engine), PathBuf::from(key)))
        }
    }
}

fn node_from(
    meta: NodeMeta,
    consolidated: Option<Arc<Consolidated>>,
    name: String,
    key_prefix: String,
    dir: PathBuf,
    store: &Store,
    options: &OpenOptions,
) -> Result<Node> {
    match meta {
        NodeMeta::Array(md) => Ok(Node::Array(make_array(
            name, key_prefix, dir, store, *md, options,
        )?)),
        NodeMeta::Group {
            zarr_format,
            attributes,
        } => Ok(Node::Group(Group {
            core: Arc::new(GroupCore {
                name,
                key_prefix,
                dir,
                store: store.clone(),
                zarr_format,
                attributes,
                consolidated,
                options: options.clone(),
            }),
        })),
    }
}

/// Builds the array described by the metadata document `json` (a v3 `zarr.json`, or a v2
/// `.zarray` when `zarr_format` is 2), whose chunks live in `dir`.
pub(crate) fn array_from_json(
    json: &[u8],
    zarr_format: u8,
    dir: &Path,
    options: &OpenOptions,
) -> Result<Array> {
    let path = dir.join(if zarr_format == 2 {
        ".zarray"
    } else {
        "zarr.json"
    });
    let v: Value = parse_json(&path, json)?;
    let md = if zarr_format == 2 {
        let md: ArrayMetadataV2 = serde_json::from_value(v).map_err(|e| invalid(&path, e))?;
        ArrayMetadata::V2(md)
    } else {
        match parse_v3(&path, v)? {
            (NodeMeta::Array(md), _) => *md,
            (NodeMeta::Group { .. }, _) => {
                return Err(ZarrError::WrongNodeType {
                    path,
                    expected: "array",
                    found: "group",
                });
            }
        }
    };
    make_array(
        "/".into(),
        String::new(),
        dir.to_path_buf(),
        &Store::Local,
        md,
        options,
    )
}

/// Opens the array at `path`; a group there is an error.
pub(crate) fn open_array_at(path: &Path, options: &OpenOptions) -> Result<Array> {
    match open_with(path, options)? {
        Node::Array(a) => Ok(a),
        Node::Group(_) => Err(ZarrError::WrongNodeType {
            path: path.to_path_buf(),
            expected: "array",
            found: "group",
        }),
    }
}

impl Group {
    /// Opens the group at `path`; an array there is an error.
    pub fn open(path: impl AsRef<Path>) -> Result<Group> {
        Self::open_with(path, &OpenOptions::default())
    }

    /// [`Group::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Group> {
        match open_with(path.as_ref(), options)? {
            Node::Group(g) => Ok(g),
            Node::Array(_) => Err(ZarrError::WrongNodeType {
                path: path.as_ref().to_path_buf(),
                expected: "group",
                found: "array",
            }),
        }
    }

    /// The group's path in its store (`/` for the root).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The group's path relative to the store root.
    pub fn path(&self) -> &str {
        self.core.key_prefix.trim_end_matches('/')
    }

    /// The group's directory, or for an object store its key prefix under the bucket (or
    /// container, or host).
    pub fn dir(&self) -> &Path {
        &self.core.dir
    }

    /// Where the group is: its directory, or its URL.
    pub fn uri(&self) -> String {
        self.core.store.uri(&self.core.dir)
    }

    /// Zarr format: 2 or 3.
    pub fn zarr_format(&self) -> u8 {
        self.core.zarr_format
    }

    /// The group's attributes.
    pub fn attributes(&self) -> &Map<String, Value> {
        &self.core.attributes
    }

    /// Whether the group's metadata is consolidated.
    pub fn is_consolidated(&self) -> bool {
        self.core.consolidated.is_some()
    }

    /// Keys of the consolidated metadata that were left out because no member can have them
    /// (a path part that is empty, `.` or `..`); the rest of the group reads normally.
    pub fn skipped_consolidated_keys(&self) -> &[String] {
        self.core
            .consolidated
            .as_ref()
            .map_or(&[], |c| c.skipped.as_slice())
    }

    fn child_names(&self, rel: &str) -> (String, String, PathBuf) {
        let rel = rel.trim_matches('/');
        let name = if self.core.name == "/" {
            format!("/{rel}")
        } else {
            format!("{}/{rel}", self.core.name)
        };
        (
            name,
            format!("{}{rel}/", self.core.key_prefix),
            self.core.dir.join(rel),
        )
    }

    /// Opens the member at `path` (a name, or a `/`-separated path of nested members).
    pub fn get(&self, path: &str) -> Result<Node> {
        let rel = path.trim_matches('/');
        if rel.is_empty()
            || rel
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(ZarrError::InvalidArgument(format!(
                "invalid member path {path:?}"
            )));
        }
        let (name, key_prefix, dir) = self.child_names(rel);
        // A node's own metadata files are authoritative; consolidated metadata stands in where
        // they are absent.
        if let Some((meta, consolidated)) = read_node(&self.core.store, &dir)? {
            let consolidated = consolidated
                .map(Arc::new)
                .or_else(|| self.core.consolidated.clone());
            return node_from(
                meta,
                consolidated,
                name,
                key_prefix,
                dir,
                &self.core.store,
                &self.core.options,
            );
        }
        if let Some(c) = &self.core.consolidated {
            let full = format!("{}{rel}", self.core.key_prefix);
            let hit = c.nodes.get(rel).or_else(|| c.nodes.get(&full));
            if let Some(meta) = hit {
                return node_from(
                    meta.clone(),
                    Some(Arc::clone(c)),
                    name,
                    key_prefix,
                    dir,
                    &self.core.store,
                    &self.core.options,
                );
            }
        }
        Err(ZarrError::NodeNotFound {
            path: self.core.store.show(&dir),
        })
    }

    /// Whether there is a member at `path`.
    pub fn contains(&self, path: &str) -> bool {
        self.get(path).is_ok()
    }

    /// The direct members: `(name, kind)`, sorted by name.
    pub fn members(&self) -> Result<Vec<(String, NodeKind)>> {
        let mut out: BTreeMap<String, NodeKind> = BTreeMap::new();
        if let Some(c) = &self.core.consolidated {
            let prefix = self.core.key_prefix.clone();
            for (path, meta) in &c.nodes {
                let rel = path.strip_prefix(&prefix).unwrap_or(path);
                if !rel.is_empty()
                    && !rel.contains('/')
                    && (prefix.is_empty() || path.starts_with(&prefix))
                {
                    out.insert(rel.to_string(), meta.kind());
                }
            }
        }
        let store = &self.core.store;
        let names = match store.child_dirs(&self.core.dir) {
            Ok(names) => names,
            // Some object stores cannot list (plain HTTP); consolidated metadata says enough.
            Err(_) if self.core.consolidated.is_some() && matches!(store, Store::Object(_)) => {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let dirs: Vec<PathBuf> = names.iter().map(|n| self.core.dir.join(n)).collect();
        let dir_refs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
        for (name, node) in names.into_iter().zip(read_nodes(store, &dir_refs)?) {
            if let Some((meta, _)) = node {
                out.insert(name, meta.kind());
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Names of the member arrays.
    pub fn array_names(&self) -> Result<Vec<String>> {
        Ok(self
            .members()?
            .into_iter()
            .filter(|(_, k)| *k == NodeKind::Array)
            .map(|(n, _)| n)
            .collect())
    }

    /// Names of the member groups.
    pub fn group_names(&self) -> Result<Vec<String>> {
        Ok(self
            .members()?
            .into_iter()
            .filter(|(_, k)| *k == NodeKind::Group)
            .map(|(n, _)| n)
            .collect())
    }
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
