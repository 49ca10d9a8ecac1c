//! Opening a node at a path or URL: finding its documents (its own, or its parent's
//! consolidated metadata), and making an [`Array`] or a [`Group`] of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use zcrop_io::{ObjectConfig, ObjectEngine, is_object_url};

use serde_json::Value;
use zarrs::metadata::ArrayMetadata;
use zarrs::metadata::v2::ArrayMetadataV2;

use crate::array::{Array, OpenOptions};
use crate::error::{Result, ZarrError};
use crate::place::NodePlace;
use crate::store::Store;

use super::metadata::{NodeMeta, invalid, parse_json, parse_v3, read_node};
use super::node::{Group, Node, make_array, node_from};

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
        NodePlace::root(dir.to_path_buf()),
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

/// Builds the array described by the metadata document `json` (a v3 `zarr.json`, or a v2
/// `.zarray` when `zarr_format` is 2), whose chunks live in `dir`.
pub(crate) fn array_from_json(
    json: &[u8],
    zarr_format: u8,
    dir: &Path,
    options: &OpenOptions,
) -> Result<Array> {
    array_from_json_in(&Store::Local, json, zarr_format, dir, options)
}

/// [`array_from_json`] for an array of `store`.
pub(crate) fn array_from_json_in(
    store: &Store,
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
    make_array(NodePlace::root(dir.to_path_buf()), store, md, options)
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
}

impl Array {
    /// Opens the array at `path` (a directory holding `zarr.json` or `.zarray`, or the URL of
    /// one in an object store: `s3://bucket/data.zarr/temperature`).
    pub fn open(path: impl AsRef<Path>) -> Result<Array> {
        Self::open_with(path, &OpenOptions::default())
    }

    /// [`Array::open`] with options.
    pub fn open_with(path: impl AsRef<Path>, options: &OpenOptions) -> Result<Array> {
        open_array_at(path.as_ref(), options)
    }

    /// Builds the array described by a metadata document (`zarr.json` for `zarr_format` 3, a
    /// `.zarray` for 2) whose chunks live in `dir`, without reading the metadata from disk.
    pub fn from_metadata_json(
        json: &[u8],
        zarr_format: u8,
        dir: impl AsRef<Path>,
        options: &OpenOptions,
    ) -> Result<Array> {
        array_from_json(json, zarr_format, dir.as_ref(), options)
    }

    /// The group that holds the array's directory, opened the same way as the array (same
    /// store, same options); `None` where there is no group there (or no parent directory).
    pub fn parent(&self) -> Result<Option<Group>> {
        if let Some(chunks) = &self.core.icechunk {
            let name = self.name();
            let parent = &name[..name.rfind('/').unwrap_or(0)];
            return chunks.snapshot().group(parent).map(Some);
        }
        let Some(parent) = self.core.place.dir.parent() else {
            return Ok(None);
        };
        let store = self.store();
        if matches!(store, Store::Object(_)) && self.core.place.dir.as_os_str().is_empty() {
            return Ok(None);
        }
        match open_in(&store, parent, &self.core.options) {
            Ok(Node::Group(g)) => Ok(Some(g)),
            Ok(Node::Array(_)) => Ok(None),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
