//! What a path holds: a [`Node`] (an [`Array`] or a [`Group`]), made from its metadata, and
//! [`Group`], whose members are nodes again (so both live here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use zarrs::array::ArrayCreateError;
use zarrs::metadata::ArrayMetadata;
use zarrs::plugin::PluginCreateError;

use crate::array::{Array, OpenOptions};
use crate::error::{Result, ZarrError};
use crate::place::NodePlace;
use crate::store::Store;

use super::metadata::{
    Consolidated, NodeKind, NodeMeta, codec_names, invalid, read_node, read_nodes, v2_codec_names,
};

/// An array or a group.
#[derive(Debug, Clone)]
pub enum Node {
    /// An array.
    Array(Array),
    /// A group.
    Group(Group),
}

impl Node {
    /// The array this node is; a group is an error naming its directory.
    pub(crate) fn into_array(self) -> Result<Array> {
        match self {
            Node::Array(a) => Ok(a),
            Node::Group(g) => Err(ZarrError::WrongNodeType {
                path: g.dir().to_path_buf(),
                expected: "array",
                found: "group",
            }),
        }
    }

    /// The group this node is; an array is an error naming its directory.
    pub(crate) fn into_group(self) -> Result<Group> {
        match self {
            Node::Group(g) => Ok(g),
            Node::Array(a) => Err(ZarrError::WrongNodeType {
                path: a.dir().to_path_buf(),
                expected: "group",
                found: "array",
            }),
        }
    }

    /// "array" or "group".
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Array(_) => "array",
            Node::Group(_) => "group",
        }
    }
}

/// Builds an [`Array`] from metadata, turning zarrs' complaints into typed errors.
pub(crate) fn make_array(
    place: NodePlace,
    store: &Store,
    md: ArrayMetadata,
    options: &OpenOptions,
) -> Result<Array> {
    let meta_path = store.show(&place.dir.join(if matches!(md, ArrayMetadata::V2(_)) {
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
                array: place.name,
                feature: format!("the metadata extension {field:?} (must_understand)"),
            });
        }
        if let Some(t) = m.storage_transformers.first() {
            return Err(ZarrError::Unsupported {
                array: place.name,
                feature: format!("the storage transformer {:?}", t.name()),
            });
        }
        if m.chunk_grid.name() != "regular" {
            return Err(ZarrError::Unsupported {
                array: place.name,
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
            array: place.name.clone(),
            codec,
            reason: msg,
        }
    };
    let stored = md.clone();
    let meta = match zarrs::array::Array::new_with_metadata(Arc::new(()), "/", v2_fill_explicit(md))
    {
        Ok(a) => a,
        Err(ArrayCreateError::CodecsCreateError(e)) => {
            return Err(unsupported_codec(e.to_string()));
        }
        Err(ArrayCreateError::UnsupportedZarrV2Array(msg)) => return Err(unsupported_codec(msg)),
        Err(ArrayCreateError::DataTypeCreateError(
            PluginCreateError::Unsupported(_) | PluginCreateError::NameInvalid { .. },
        )) => {
            return Err(ZarrError::UnsupportedDataType {
                array: place.name,
                data_type: stored_data_type(&stored),
            });
        }
        // Metadata zarrs refuses for a data type zcrop does not read anyway (a `|V4` with a
        // `null` fill, say): the data type is the error to report.
        Err(_) if !reads_data_type(&stored) => {
            return Err(ZarrError::UnsupportedDataType {
                array: place.name,
                data_type: stored_data_type(&stored),
            });
        }
        Err(e) => return Err(invalid(&meta_path, e)),
    };
    Array::from_metadata(place, store, meta, stored, options)
}

/// Whether zcrop reads the data type of `md` (zarrs creates it, and zcrop reads that).
fn reads_data_type(md: &ArrayMetadata) -> bool {
    let dt = match md {
        ArrayMetadata::V2(m) => zarrs::array::DataType::from_metadata(&m.dtype),
        ArrayMetadata::V3(m) => zarrs::array::DataType::from_metadata(&m.data_type),
    };
    dt.ok().and_then(|dt| dt.name_v3()).is_some_and(|n| {
        let n = n.as_ref();
        crate::layout::SUPPORTED_DATA_TYPES.contains(&n)
            || crate::layout::VARIABLE_DATA_TYPES.contains(&n)
    })
}

/// The data type as the metadata names it: the v2 dtype, or the v3 data type's name.
fn stored_data_type(md: &ArrayMetadata) -> String {
    match md {
        ArrayMetadata::V2(m) => match &m.dtype {
            zarrs::metadata::v2::DataTypeMetadataV2::Simple(s) => s.clone(),
            other @ zarrs::metadata::v2::DataTypeMetadataV2::Structured(_) => {
                serde_json::to_string(other).unwrap_or_default()
            }
        },
        ArrayMetadata::V3(m) => m.data_type.name().to_string(),
    }
}

/// v2 metadata with a `null` fill value of a string or time dtype made what zarr-python reads
/// it as (zarrs' data types refuse a `null` fill): `""` for `<U{n}` and `|S{n}`, NaT for `<M8`
/// and `<m8`. Other metadata as it is.
fn v2_fill_explicit(md: ArrayMetadata) -> ArrayMetadata {
    let ArrayMetadata::V2(mut m) = md else {
        return md;
    };
    if m.fill_value.is_null()
        && let zarrs::metadata::v2::DataTypeMetadataV2::Simple(dt) = &m.dtype
    {
        let kind = dt.trim_start_matches(['<', '>', '|', '=']).chars().next();
        match kind {
            Some('U' | 'S') => m.fill_value = "".into(),
            Some('M' | 'm') => m.fill_value = "NaT".into(),
            _ => {}
        }
    }
    ArrayMetadata::V2(m)
}

pub(crate) fn node_from(
    meta: NodeMeta,
    consolidated: Option<Arc<Consolidated>>,
    place: NodePlace,
    store: &Store,
    options: &OpenOptions,
) -> Result<Node> {
    match meta {
        NodeMeta::Array(md) => Ok(Node::Array(make_array(place, store, *md, options)?)),
        NodeMeta::Group {
            zarr_format,
            attributes,
        } => Ok(Node::Group(Group {
            core: Arc::new(GroupCore {
                place,
                store: store.clone(),
                zarr_format,
                attributes,
                consolidated,
                options: options.clone(),
                icechunk: None,
            }),
        })),
    }
}

/// An opened Zarr group. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Group {
    core: Arc<GroupCore>,
}

#[derive(Debug)]
struct GroupCore {
    place: NodePlace,
    store: Store,
    zarr_format: u8,
    attributes: Map<String, Value>,
    consolidated: Option<Arc<Consolidated>>,
    options: OpenOptions,
    /// For a group of an Icechunk snapshot: the snapshot, which holds its members' metadata.
    icechunk: Option<crate::icechunk::IcechunkSnapshot>,
}

impl Group {
    /// This new group as a group of the Icechunk snapshot `snapshot`.
    pub(crate) fn in_icechunk(mut self, snapshot: crate::icechunk::IcechunkSnapshot) -> Group {
        if let Some(core) = Arc::get_mut(&mut self.core) {
            core.icechunk = Some(snapshot);
        }
        self
    }

    /// The Icechunk snapshot the group belongs to, if it is one's.
    pub fn icechunk(&self) -> Option<&crate::icechunk::IcechunkSnapshot> {
        self.core.icechunk.as_ref()
    }

    /// The group's path in its store (`/` for the root).
    pub fn name(&self) -> &str {
        &self.core.place.name
    }

    /// The group's path relative to the store root.
    pub fn path(&self) -> &str {
        self.core.place.path()
    }

    /// The group's directory, or for an object store its key prefix under the bucket (or
    /// container, or host).
    pub fn dir(&self) -> &Path {
        &self.core.place.dir
    }

    /// Where the group is: its directory, or its URL.
    pub fn uri(&self) -> String {
        self.core.store.uri(&self.core.place.dir)
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
        if let Some(snapshot) = &self.core.icechunk {
            return snapshot.get(&self.core.place.key(rel));
        }
        let place = self.core.place.child(rel);
        // A node's own metadata files are authoritative; consolidated metadata stands in where
        // they are absent.
        if let Some((meta, consolidated)) = read_node(&self.core.store, &place.dir)? {
            let consolidated = consolidated
                .map(Arc::new)
                .or_else(|| self.core.consolidated.clone());
            return node_from(
                meta,
                consolidated,
                place,
                &self.core.store,
                &self.core.options,
            );
        }
        if let Some(c) = &self.core.consolidated {
            let full = self.core.place.key(rel);
            let hit = c.nodes.get(rel).or_else(|| c.nodes.get(&full));
            if let Some(meta) = hit {
                return node_from(
                    meta.clone(),
                    Some(Arc::clone(c)),
                    place,
                    &self.core.store,
                    &self.core.options,
                );
            }
        }
        Err(ZarrError::NodeNotFound {
            path: self.core.store.show(&place.dir),
        })
    }

    /// Whether there is a member at `path`.
    pub fn contains(&self, path: &str) -> bool {
        self.get(path).is_ok()
    }

    /// The direct members: `(name, kind)`, sorted by name.
    pub fn members(&self) -> Result<Vec<(String, NodeKind)>> {
        if let Some(snapshot) = &self.core.icechunk {
            return Ok(snapshot.members(&self.core.place.key_prefix));
        }
        let mut out: BTreeMap<String, NodeKind> = BTreeMap::new();
        if let Some(c) = &self.core.consolidated {
            let prefix = self.core.place.key_prefix.clone();
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
        let names = match store.child_dirs(&self.core.place.dir) {
            Ok(names) => names,
            // Some object stores cannot list (plain HTTP); consolidated metadata says enough.
            Err(_) if self.core.consolidated.is_some() && matches!(store, Store::Object(_)) => {
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let dirs: Vec<PathBuf> = names.iter().map(|n| self.core.place.dir.join(n)).collect();
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
