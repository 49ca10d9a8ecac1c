//! Where a store's bytes live: a local directory tree, or an object store reached through a
//! [`zcrop_io::ObjectEngine`] (S3, GCS, Azure, HTTP).
//!
//! The planning and decoding path is the same for both: a storage chunk is named by a path
//! (a filesystem path, or an object key relative to the engine's root) and read through a
//! [`Reader`], whose batches yield the same [`Completion`]s. Local reads go to the
//! [`IoEngine`] exactly as before; the choice is made once per batch, not per read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use zcrop_io::{Completion, IoEngine, IoError, ObjectBatch, ObjectEngine, ReadRange, ReadRequest};

use crate::error::{Location, Result, ZarrError};

/// Where a node's files are.
#[derive(Debug, Clone)]
pub(crate) enum Store {
    /// A local directory tree: paths are filesystem paths.
    Local,
    /// An object store: paths are keys relative to the engine's root.
    Object(ObjectEngine),
}

/// How an array's chunks are read.
#[derive(Debug, Clone)]
pub(crate) enum Reader {
    /// Local files through the IO engine.
    Local(IoEngine),
    /// Objects through the object engine.
    Object(ObjectEngine),
}

/// The results of one batch, from either engine.
pub(crate) enum Completions {
    Local(Box<zcrop_io::Batch>),
    Object(ObjectBatch),
}

impl Iterator for Completions {
    type Item = Completion;

    fn next(&mut self) -> Option<Completion> {
        match self {
            Completions::Local(b) => b.next(),
            Completions::Object(b) => b.next(),
        }
    }
}

impl Reader {
    /// Whether `self` and `other` read through the same engine, so that one submission can
    /// carry requests of both.
    pub(crate) fn same_engine(&self, other: &Reader) -> bool {
        match (self, other) {
            (Reader::Local(a), Reader::Local(b)) => a.same_engine(b),
            (Reader::Object(a), Reader::Object(b)) => a.same_engine(b),
            _ => false,
        }
    }

    /// Submits a batch to the engine.
    pub(crate) fn submit(&self, requests: impl IntoIterator<Item = ReadRequest>) -> Completions {
        match self {
            Reader::Local(e) => Completions::Local(Box::new(e.submit(requests))),
            Reader::Object(e) => Completions::Object(e.submit(requests)),
        }
    }

    /// Submits a batch whose consumer checks each result with `zcrop_io::mapped_intact` (the
    /// check of `zcrop_io::check_mapped`; the read names the error once it is over) when it is
    /// done with the bytes: local reads may then be served from file mappings.
    pub(crate) fn submit_mapped(
        &self,
        requests: impl IntoIterator<Item = ReadRequest>,
    ) -> Completions {
        match self {
            Reader::Local(e) => Completions::Local(Box::new(e.submit_mapped(requests))),
            Reader::Object(e) => Completions::Object(e.submit(requests)),
        }
    }

    /// The store the chunks are in.
    pub(crate) fn store(&self) -> Store {
        match self {
            Reader::Local(_) => Store::Local,
            Reader::Object(e) => Store::Object(e.clone()),
        }
    }
}

/// The metadata documents a node may have, v3 first.
pub(crate) const V3_META: &str = "zarr.json";
/// The v2 metadata documents.
pub(crate) const V2_META: [&str; 4] = [".zarray", ".zattrs", ".zgroup", ".zmetadata"];

impl Store {
    /// How `path` is shown in messages: the path itself, or the object's URL.
    pub(crate) fn show(&self, path: &Path) -> PathBuf {
        match self {
            Store::Local => path.to_path_buf(),
            Store::Object(e) => PathBuf::from(e.url_of(path)),
        }
    }

    /// `path` as a string for messages.
    pub(crate) fn uri(&self, path: &Path) -> String {
        self.show(path).display().to_string()
    }

    /// The reader for an array of this store: the IO engine given (or the process's shared
    /// one) for local files, the store's object engine for objects.
    pub(crate) fn reader(&self, local: Option<&IoEngine>) -> Result<Reader> {
        Ok(match self {
            Store::Local => Reader::Local(match local {
                Some(e) => e.clone(),
                None => IoEngine::shared()?,
            }),
            Store::Object(e) => Reader::Object(e.clone()),
        })
    }
}

/// Reads the metadata documents `names` of each node directory in `dirs` from an object
/// store, in one batch (local stores read their small files directly). `None` where a document
/// does not exist.
pub(crate) fn fetch_documents(
    engine: &ObjectEngine,
    dirs: &[&Path],
    names: &[&str],
) -> Result<Vec<Vec<Option<Bytes>>>> {
    let requests: Vec<ReadRequest> = dirs
        .iter()
        .flat_map(|d| names.iter().map(move |n| d.join(n)))
        .enumerate()
        .map(|(i, p)| ReadRequest::new(i as u64, p, ReadRange::Whole))
        .collect();
    let keys: Vec<PathBuf> = requests.iter().map(|r| r.path.to_path_buf()).collect();
    let results = engine.read_all(requests);
    let mut out: Vec<Vec<Option<Bytes>>> = Vec::with_capacity(dirs.len());
    let mut it = results.into_iter().zip(keys);
    for d in dirs {
        let mut docs = Vec::with_capacity(names.len());
        for _ in names {
            let Some((r, key)) = it.next() else { break };
            docs.push(match r {
                Ok(b) => Some(b),
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(metadata_read_error(d, &key, e)),
            });
        }
        out.push(docs);
    }
    Ok(out)
}

impl Store {
    /// The names of the sub-directories of `dir` that may hold nodes.
    pub(crate) fn child_dirs(&self, dir: &Path) -> Result<Vec<String>> {
        let failed = |e: std::io::Error| listing_error(self, dir, e);
        match self {
            Store::Local => {
                let entries = std::fs::read_dir(dir).map_err(failed)?;
                Ok(entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect())
            }
            Store::Object(e) => e.list_dirs(dir).map_err(failed),
        }
    }

    /// The sizes of the objects under `dir`, keyed by their path relative to `dir`; `None`
    /// for a local store (whose files are asked one by one).
    pub(crate) fn object_sizes(&self, dir: &Path) -> Result<Option<HashMap<String, u64>>> {
        let Store::Object(e) = self else {
            return Ok(None);
        };
        let listed = e.list(dir).map_err(|err| listing_error(self, dir, err))?;
        let prefix = dir.to_string_lossy();
        let prefix = prefix.trim_matches('/');
        Ok(Some(
            listed
                .into_iter()
                .filter_map(|(key, size)| {
                    let rel = if prefix.is_empty() {
                        key.as_str()
                    } else {
                        key.strip_prefix(prefix)?.strip_prefix('/')?
                    };
                    Some((rel.to_string(), size))
                })
                .collect(),
        ))
    }
}

/// A directory (or object prefix) of a store that cannot be listed: a store error.
fn listing_error(store: &Store, dir: &Path, e: std::io::Error) -> ZarrError {
    let shown: std::sync::Arc<Path> = std::sync::Arc::from(store.show(dir).as_path());
    ZarrError::Io {
        at: Box::new(Location {
            node: format!("/{}", dir.to_string_lossy().trim_matches('/')),
            key: shown.display().to_string(),
            range: None,
        }),
        source: Box::new(IoError::from_os(e, &shown, ReadRange::Whole)),
    }
}

/// A metadata document that exists but cannot be read (denied, the server failing).
fn metadata_read_error(dir: &Path, key: &Path, e: IoError) -> ZarrError {
    ZarrError::Io {
        at: Box::new(Location {
            node: format!("/{}", dir.to_string_lossy().trim_matches('/')),
            key: key.to_string_lossy().into_owned(),
            range: Some(e.range()),
        }),
        source: Box::new(e),
    }
}
