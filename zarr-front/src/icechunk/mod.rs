//! Icechunk repositories, read-only: a version (branch, tag or snapshot id) resolved to its
//! snapshot, the snapshot's nodes (each with its `zarr.json`), and where each chunk's bytes
//! are (inline in a manifest, a byte range of a chunk object, or a virtual reference).
//!
//! The `icechunk-format` crate parses the metadata files (flatbuffers behind a 39-byte header,
//! zstd-compressed); zcrop reads every file itself, from a directory or an object store, so
//! the chunk reads can go through its own planner. Both spec versions are read: v1 keeps refs
//! as `refs/{branch,tag}.<name>/ref.json`, v2 keeps them in one `repo` file.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use icechunk_format::format_constants::{
    CompressionAlgorithmBin, FileTypeBin, ICECHUNK_FILE_HEADER_LEN, SpecVersionBin,
    parse_file_header,
};
use icechunk_format::manifest::{ChunkPayload, Manifest, ManifestExtents};
use icechunk_format::repo_info::RepoInfo;
use icechunk_format::serializers::{
    deserialize_manifest, deserialize_repo_info, deserialize_snapshot,
};
use icechunk_format::snapshot::{NodeData, Snapshot};
use icechunk_format::{ChunkIndices, IcechunkFormatErrorKind, ManifestId, NodeId, SnapshotId};

use crate::error::{Result, ZarrError};
use crate::store::Store;

mod config;
mod session;
mod virtuals;
pub use session::{SessionRepository, session_repository};
pub use virtuals::VirtualContainer;
pub(crate) use virtuals::{VirtualChecksum, VirtualTargets, versions};

/// The largest metadata file zcrop decompresses (a snapshot or manifest this large is
/// refused rather than allowed to exhaust memory).
const MAX_METADATA_BYTES: u64 = 1 << 31;

/// Which version of a repository to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    /// The tip of a branch (`"main"`).
    Branch(String),
    /// A tag.
    Tag(String),
    /// A snapshot id (20 characters of Crockford base32).
    Snapshot(String),
}

/// One snapshot of an Icechunk repository, read-only: its nodes, opened as zcrop groups and
/// arrays whose chunks are read through zcrop's planner (inline in the manifests, or byte
/// ranges of the repository's chunk objects, batched and coalesced like any shard's). Cheap to
/// clone.
#[derive(Clone)]
pub struct IcechunkSnapshot {
    shared: Arc<Shared>,
}

struct Shared {
    repo: Arc<Repository>,
    id: String,
    /// By path (`/`, `/group/array`).
    nodes: BTreeMap<String, Node>,
    options: crate::array::OpenOptions,
    virtuals: VirtualTargets,
}

impl std::fmt::Debug for IcechunkSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IcechunkSnapshot")
            .field("repository", &self.shared.repo.show(""))
            .field("id", &self.shared.id)
            .finish_non_exhaustive()
    }
}

impl IcechunkSnapshot {
    /// The snapshot `version` names in the repository at `location` (a local directory or an
    /// object-store URL, opened with `options.storage_options`). Its virtual chunks are read
    /// from under the prefixes of `containers` only (a virtual chunk elsewhere is an error when
    /// it is read).
    pub fn open(
        location: impl AsRef<Path>,
        version: &Version,
        options: &crate::array::OpenOptions,
        containers: Vec<VirtualContainer>,
    ) -> Result<IcechunkSnapshot> {
        let (store, root) = crate::hierarchy::open::locate(location.as_ref(), options)?;
        let mut repo = Repository::open(store, root)?;
        repo.manifest_budget = options.index_cache_bytes;
        repo.local.clone_from(&options.engine);
        let declared = repo.declared_containers();
        let repo = Arc::new(repo);
        let id = repo.snapshot_id(version)?;
        let snapshot = repo.snapshot(&id)?;
        let nodes = repo
            .nodes(&snapshot)?
            .into_iter()
            .map(|n| (n.path.clone(), n))
            .collect();
        Ok(IcechunkSnapshot {
            shared: Arc::new(Shared {
                repo,
                id: id.to_string(),
                nodes,
                options: options.clone(),
                virtuals: VirtualTargets::new(containers, declared, options.engine.clone()),
            }),
        })
    }

    /// The snapshot's id.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Where the repository is: its directory, or its URL.
    pub fn uri(&self) -> String {
        self.shared.repo.store.uri(&self.shared.repo.root)
    }

    /// Every node's path (`/`, `/group/array`) and whether it is an array, in path order.
    pub fn nodes(&self) -> Vec<(String, bool)> {
        self.shared
            .nodes
            .values()
            .map(|n| (n.path.clone(), n.array.is_some()))
            .collect()
    }

    /// The node at `path` (`""` or `/` for the root group, `group/array`).
    pub fn get(&self, path: &str) -> Result<crate::Node> {
        let rel = path.trim_matches('/');
        let repo = &self.shared.repo;
        let node =
            self.shared
                .nodes
                .get(&format!("/{rel}"))
                .ok_or_else(|| ZarrError::NodeNotFound {
                    path: repo.store.show(&repo.root.join(rel)),
                })?;
        let root = crate::place::NodePlace::root(repo.root.clone());
        let place = if rel.is_empty() {
            root
        } else {
            root.child(rel)
        };
        let doc_path = place.dir.join("zarr.json");
        let doc = crate::hierarchy::metadata::parse_json(&doc_path, &node.zarr_json)?;
        let (meta, _) = crate::hierarchy::metadata::parse_v3(&doc_path, doc)?;
        let options = &self.shared.options;
        match (meta, &node.array) {
            (crate::hierarchy::metadata::NodeMeta::Array(md), Some(array)) => {
                let a = crate::hierarchy::node::make_array(place, &repo.store, *md, options)?;
                let chunks = ArrayChunks::new(self.clone(), array.clone());
                Ok(crate::Node::Array(a.in_icechunk(chunks)))
            }
            (meta @ crate::hierarchy::metadata::NodeMeta::Group { .. }, None) => {
                let group =
                    crate::hierarchy::node::node_from(meta, None, place, &repo.store, options)?;
                if let crate::Node::Group(g) = group {
                    return Ok(crate::Node::Group(g.in_icechunk(self.clone())));
                }
                Err(repo.invalid(&doc_path, "group metadata that opens as an array"))
            }
            _ => Err(repo.invalid(
                &doc_path,
                "its node_type disagrees with the snapshot's node (array or group)",
            )),
        }
    }

    /// The array at `path`.
    pub fn array(&self, path: &str) -> Result<crate::Array> {
        self.get(path)?.into_array()
    }

    /// The group at `path` (`""` for the root).
    pub fn group(&self, path: &str) -> Result<crate::Group> {
        self.get(path)?.into_group()
    }

    /// The direct members of the group whose key prefix is `prefix` (`""` or `a/b/`), sorted
    /// by name.
    pub(crate) fn members(&self, prefix: &str) -> Vec<(String, crate::hierarchy::NodeKind)> {
        let below = format!("/{prefix}");
        self.shared
            .nodes
            .range(below.clone()..)
            .take_while(|(p, _)| p.starts_with(&below))
            .filter_map(|(p, n)| {
                let name = &p[below.len()..];
                (!name.is_empty() && !name.contains('/')).then(|| {
                    let kind = if n.array.is_some() {
                        crate::hierarchy::NodeKind::Array
                    } else {
                        crate::hierarchy::NodeKind::Group
                    };
                    (name.to_string(), kind)
                })
            })
            .collect()
    }
}

/// A repository at `root` of `store`.
pub(crate) struct Repository {
    store: Store,
    root: PathBuf,
    /// Manifests read so far, within a byte budget (their decompressed sizes); built in each
    /// process, so that a forked child never waits on a lock its parent held.
    manifests: zcrop_io::fork::PerProcess<crate::cache::LruCache<ManifestId, Arc<Manifest>>>,
    manifest_budget: usize,
    /// The IO engine local manifests are read through (the shared one if `None`).
    local: Option<zcrop_io::IoEngine>,
    /// The `repo` file (spec v2: refs and configuration), read once when opened; `None` for a
    /// spec-v1 repository.
    repo_file: Option<Bytes>,
}

/// One node of a snapshot.
#[derive(Clone)]
pub(crate) struct Node {
    /// Its path in the hierarchy (`/`, `/group/array`).
    pub(crate) path: String,
    /// Its Zarr v3 `zarr.json`.
    pub(crate) zarr_json: Bytes,
    /// For an array: its id and manifests.
    pub(crate) array: Option<ArrayNode>,
}

/// What locating an array's chunks needs: its node id, and its manifests with the chunk
/// indexes each covers.
#[derive(Clone)]
pub(crate) struct ArrayNode {
    pub(crate) id: NodeId,
    pub(crate) manifests: Vec<(ManifestId, ManifestExtents)>,
}

/// An Icechunk array's chunk locations, as its [`crate::Array`] holds them: its snapshot and
/// its node (manifests are fetched by the reads that need them).
pub(crate) struct ArrayChunks {
    snapshot: IcechunkSnapshot,
    node: ArrayNode,
}

/// The manifests one read has fetched, by their index in the array's list: a read fetches each
/// manifest it needs at most once, whatever the repository's manifest cache evicts meanwhile.
pub(crate) type HeldManifests = rustc_hash::FxHashMap<usize, Arc<Manifest>>;

impl ArrayChunks {
    /// The chunks of `node`; its manifests are fetched when reads need them.
    pub(crate) fn new(snapshot: IcechunkSnapshot, node: ArrayNode) -> ArrayChunks {
        ArrayChunks { snapshot, node }
    }

    /// The snapshot the array belongs to.
    pub(crate) fn snapshot(&self) -> &IcechunkSnapshot {
        &self.snapshot
    }

    /// Where the snapshot's virtual chunks are read from.
    pub(crate) fn virtual_targets(&self) -> &VirtualTargets {
        &self.snapshot.shared.virtuals
    }

    /// The indexes (in the array's list) of the manifests whose extents hold chunk `index`.
    fn covering<'a>(&'a self, index: &'a [u32]) -> impl Iterator<Item = usize> + 'a {
        self.node
            .manifests
            .iter()
            .enumerate()
            .filter(move |(_, (_, extents))| extents.contains(index))
            .map(|(i, _)| i)
    }

    /// Fetches, in one submission, the manifests covering the storage chunks `coords` that
    /// `held` lacks (from the repository's cache where they are).
    pub(crate) fn prefetch<'a>(
        &self,
        coords: impl IntoIterator<Item = &'a [u64]>,
        held: &mut HeldManifests,
    ) -> Result<()> {
        let mut wanted: Vec<usize> = Vec::new();
        for c in coords {
            let Ok(index) = chunk_index(c) else { continue };
            for i in self.covering(&index) {
                if !held.contains_key(&i) && !wanted.contains(&i) {
                    wanted.push(i);
                }
            }
            if wanted.len() + held.len() == self.node.manifests.len() {
                break;
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let ids: Vec<&ManifestId> = wanted.iter().map(|&i| &self.node.manifests[i].0).collect();
        let got = self.snapshot.shared.repo.manifests(&ids)?;
        held.extend(wanted.into_iter().zip(got));
        Ok(())
    }

    /// Where the chunk (for a sharded array: the shard) at `coords` of the storage grid is;
    /// the manifests it needs are fetched into `held` if they are not there.
    pub(crate) fn payload(
        &self,
        coords: &[u64],
        held: &mut HeldManifests,
    ) -> Result<Option<Payload>> {
        let index = chunk_index(coords)?;
        let covering: Vec<usize> = self.covering(&index).collect();
        if covering.iter().any(|i| !held.contains_key(i)) {
            self.prefetch([coords], held)?;
        }
        let candidates = covering
            .iter()
            .map(|i| (&self.node.manifests[*i].0, &held[i]));
        self.snapshot
            .shared
            .repo
            .payload(&self.node, candidates, &index)
    }

    /// The path (local) or key (object store) of the repository's file `rel`.
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.snapshot.shared.repo.root.join(rel)
    }

    /// `rel` as messages name it.
    pub(crate) fn show(&self, rel: &str) -> String {
        self.snapshot.shared.repo.show(rel)
    }
}

/// Storage-grid coordinates as a manifest's chunk index.
fn chunk_index(coords: &[u64]) -> Result<Vec<u32>> {
    coords
        .iter()
        .map(|&c| u32::try_from(c))
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| ZarrError::InvalidArgument(format!("chunk {coords:?} past u32")))
}

/// Where one chunk's encoded bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Payload {
    /// In the manifest itself.
    Inline(Bytes),
    /// `length` bytes at `offset` of the repository's object `key` (`chunks/<id>`).
    Stored {
        key: String,
        offset: u64,
        length: u64,
    },
    /// `length` bytes at `offset` of the file or object at `url`, outside the repository.
    Virtual {
        url: String,
        offset: u64,
        length: u64,
        /// The version of the target the reference recorded.
        checksum: Option<VirtualChecksum>,
    },
}

impl Repository {
    /// The repository at `root`: an error naming it if it has neither a `repo` file (spec v2)
    /// nor a `refs` directory (spec v1).
    pub(crate) fn open(store: Store, root: PathBuf) -> Result<Repository> {
        let mut repo = Repository {
            store,
            root,
            manifests: zcrop_io::fork::PerProcess::new(),
            manifest_budget: crate::array::DEFAULT_INDEX_CACHE_BYTES,
            local: None,
            repo_file: None,
        };
        repo.repo_file = repo.read("repo")?;
        let v2 = repo.repo_file.is_some();
        // A store that cannot list (plain HTTP, some S3-compatible servers) still shows a
        // spec-v1 repository by its main branch's ref.
        if !v2 && !repo.has_v1_refs() && repo.read("refs/branch.main/ref.json")?.is_none() {
            return Err(ZarrError::NodeNotFound {
                path: repo.store.show(&repo.root.join("repo")),
            });
        }
        Ok(repo)
    }

    /// Runs `f`, a call into `icechunk-format` over bytes read from storage. The crate panics
    /// on some malformed flatbuffers (a union of type NONE, say); that becomes an error
    /// naming `path`, as any other damage to the file.
    fn parsing<T>(&self, path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a malformed flatbuffer".into());
            Err(self.invalid(path, format!("malformed: {message}")))
        })
    }

    /// `f` of the spec-v2 `repo` file's contents; `None` for a spec-v1 repository.
    fn with_repo_info<T>(&self, f: impl FnOnce(&RepoInfo) -> Result<T>) -> Result<Option<T>> {
        let Some(raw) = &self.repo_file else {
            return Ok(None);
        };
        let (spec, body) = self.metadata_body("repo", raw, FileTypeBin::RepoInfo)?;
        let path = self.root.join("repo");
        self.parsing(&path, || {
            let info = deserialize_repo_info(spec, body).map_err(|e| self.invalid(&path, e))?;
            f(&info)
        })
        .map(Some)
    }

    /// The repository's file `rel` as messages name it.
    fn show(&self, rel: &str) -> String {
        self.store.show(&self.root.join(rel)).display().to_string()
    }

    fn has_v1_refs(&self) -> bool {
        !self
            .store
            .child_dirs(&self.root.join("refs"))
            .unwrap_or_default()
            .is_empty()
    }

    /// The file or object `rel` under the root; `None` if there is none.
    fn read(&self, rel: &str) -> Result<Option<Bytes>> {
        let path = self.root.join(rel);
        match &self.store {
            Store::Local => match std::fs::read(&path) {
                Ok(b) => Ok(Some(Bytes::from(b))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(self.io_error(&path, &e)),
            },
            Store::Object(engine) => engine.get(&path).map_err(|e| self.io_error(&path, &e)),
        }
    }

    fn io_error(&self, path: &Path, e: &std::io::Error) -> ZarrError {
        self.invalid(path, format!("cannot read it: {e}"))
    }

    fn invalid(&self, path: &Path, reason: impl std::fmt::Display) -> ZarrError {
        ZarrError::InvalidMetadata {
            path: self.store.show(path),
            reason: reason.to_string(),
        }
    }

    /// A metadata file's spec version and body (decompressed), checking its header says
    /// `kind`.
    fn metadata_file(&self, rel: &str, kind: FileTypeBin) -> Result<(SpecVersionBin, Vec<u8>)> {
        let raw = self.read(rel)?.ok_or_else(|| ZarrError::NodeNotFound {
            path: self.store.show(&self.root.join(rel)),
        })?;
        self.metadata_body(rel, &raw, kind)
    }

    /// The spec version and body (decompressed) of the metadata file `rel` read as `raw`,
    /// checking its header says `kind`.
    fn metadata_body(
        &self,
        rel: &str,
        raw: &[u8],
        kind: FileTypeBin,
    ) -> Result<(SpecVersionBin, Vec<u8>)> {
        let path = self.root.join(rel);
        let header = parse_file_header(raw).map_err(|e| self.invalid(&path, e))?;
        if header.file_type != kind {
            return Err(self.invalid(
                &path,
                format!(
                    "an Icechunk {:?} file where a {kind:?} was expected",
                    header.file_type
                ),
            ));
        }
        let body = &raw[ICECHUNK_FILE_HEADER_LEN..];
        let body = match header.compression {
            CompressionAlgorithmBin::Zstd => {
                let mut out = Vec::new();
                zstd::stream::Decoder::new(body)
                    .and_then(|d| d.take(MAX_METADATA_BYTES + 1).read_to_end(&mut out))
                    .map_err(|e| self.invalid(&path, format!("bad zstd body: {e}")))?;
                if out.len() as u64 > MAX_METADATA_BYTES {
                    return Err(self.invalid(
                        &path,
                        format!("decompresses to more than {MAX_METADATA_BYTES} bytes"),
                    ));
                }
                out
            }
            CompressionAlgorithmBin::None => body.to_vec(),
        };
        Ok((header.spec_version, body))
    }

    /// The snapshot id `version` names.
    pub(crate) fn snapshot_id(&self, version: &Version) -> Result<SnapshotId> {
        let (kind, name) = match version {
            Version::Snapshot(id) => {
                return SnapshotId::try_from(id.as_str()).map_err(|e| {
                    ZarrError::InvalidArgument(format!(
                        "{id:?} is not an Icechunk snapshot id: {e}"
                    ))
                });
            }
            Version::Branch(n) => ("branch", n),
            Version::Tag(n) => ("tag", n),
        };
        let missing = || {
            ZarrError::InvalidArgument(format!(
                "the Icechunk repository {} has no {kind} {name:?}",
                self.store.show(&self.root).display()
            ))
        };
        let found = self.with_repo_info(|info| {
            Ok(if kind == "tag" {
                info.resolve_tag(name)
            } else {
                info.resolve_branch(name)
            })
        })?;
        if let Some(found) = found {
            return found.map_err(|_| missing());
        }
        let rel = format!("refs/{kind}.{name}/ref.json");
        if kind == "tag"
            && self
                .read(&format!("refs/tag.{name}/ref.json.deleted"))?
                .is_some()
        {
            return Err(missing());
        }
        let path = self.root.join(&rel);
        let text = self.read(&rel)?.ok_or_else(missing)?;
        let doc: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| self.invalid(&path, e))?;
        let id = doc["snapshot"]
            .as_str()
            .ok_or_else(|| self.invalid(&path, "no \"snapshot\" field"))?;
        SnapshotId::try_from(id).map_err(|e| self.invalid(&path, e))
    }

    /// The virtual chunk containers the repository's configuration declares (none where it
    /// has no configuration); why they cannot be known if the configuration does not read.
    pub(crate) fn declared_containers(
        &self,
    ) -> std::result::Result<Vec<config::DeclaredContainer>, String> {
        let path = self.root.join("repo");
        let v2 = self
            .with_repo_info(|info| {
                info.config::<config::RepoConfig>()
                    .map_err(|e| self.invalid(&path, e))
            })
            .map_err(|e| e.to_string())?;
        if let Some(config) = v2 {
            return Ok(config.unwrap_or_default().containers());
        }
        match self.read("config.yaml").map_err(|e| e.to_string())? {
            None => Ok(Vec::new()),
            Some(yaml) => config::RepoConfig::from_yaml(&yaml)
                .map(config::RepoConfig::containers)
                .map_err(|e| format!("{}: {e}", self.show("config.yaml"))),
        }
    }

    /// The snapshot `id`.
    pub(crate) fn snapshot(&self, id: &SnapshotId) -> Result<Snapshot> {
        let rel = format!("snapshots/{id}");
        let (spec, body) = self.metadata_file(&rel, FileTypeBin::Snapshot)?;
        let path = self.root.join(&rel);
        self.parsing(&path, || {
            deserialize_snapshot(spec, body).map_err(|e| self.invalid(&path, e))
        })
    }

    /// Every node of `snapshot`.
    pub(crate) fn nodes(&self, snapshot: &Snapshot) -> Result<Vec<Node>> {
        let path = self.root.join(format!("snapshots/{}", snapshot.id()));
        self.parsing(&path, || self.nodes_of(snapshot, &path))
    }

    fn nodes_of(&self, snapshot: &Snapshot, path: &Path) -> Result<Vec<Node>> {
        snapshot
            .iter()
            .map(|node| {
                let node = node.map_err(|e| self.invalid(path, e))?;
                let array = match node.node_data {
                    NodeData::Array { manifests, .. } => Some(ArrayNode {
                        id: node.id.clone(),
                        manifests: manifests
                            .into_iter()
                            .map(|m| (m.object_id, m.extents))
                            .collect(),
                    }),
                    NodeData::Group => None,
                };
                Ok(Node {
                    path: node.path.to_string(),
                    zarr_json: node.user_data,
                    array,
                })
            })
            .collect()
    }

    /// The manifests `ids`: from the cache, the others read in one submission and cached.
    pub(crate) fn manifests(&self, ids: &[&ManifestId]) -> Result<Vec<Arc<Manifest>>> {
        let cache = self
            .manifests
            .get_or_init(|| crate::cache::LruCache::new(self.manifest_budget));
        let mut out: Vec<Option<Arc<Manifest>>> = ids.iter().map(|id| cache.get(*id)).collect();
        let missing: Vec<usize> = (0..ids.len()).filter(|&i| out[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(out.into_iter().flatten().collect());
        }
        let rels: Vec<String> = missing
            .iter()
            .map(|&i| format!("manifests/{}", ids[i]))
            .collect();
        let reader = self.store.reader(self.local.as_ref())?;
        let requests = rels.iter().enumerate().map(|(n, rel)| {
            zcrop_io::ReadRequest::new(
                n as u64,
                Arc::from(self.root.join(rel).as_path()),
                zcrop_io::ReadRange::Whole,
            )
        });
        let mut raw: Vec<Option<std::result::Result<Bytes, zcrop_io::IoError>>> =
            vec![None; rels.len()];
        for done in reader.submit(requests.collect::<Vec<_>>()) {
            if let Some(slot) = usize::try_from(done.id).ok().and_then(|n| raw.get_mut(n)) {
                *slot = Some(done.result);
            }
        }
        for ((n, rel), &i) in rels.iter().enumerate().zip(&missing) {
            let path = self.root.join(rel);
            let bytes = match raw[n].take() {
                Some(Ok(b)) => b,
                Some(Err(e)) if e.is_not_found() => {
                    return Err(ZarrError::NodeNotFound {
                        path: self.store.show(&path),
                    });
                }
                Some(Err(e)) => return Err(self.invalid(&path, format!("cannot read it: {e}"))),
                None => return Err(self.invalid(&path, "the read returned nothing")),
            };
            let (spec, body) = self.metadata_body(rel, &bytes, FileTypeBin::Manifest)?;
            let cost = body.len();
            let manifest = self.parsing(&path, || {
                deserialize_manifest(spec, body)
                    .map(Arc::new)
                    .map_err(|e| self.invalid(&path, e))
            })?;
            cache.insert(ids[i].clone(), Arc::clone(&manifest), cost);
            out[i] = Some(manifest);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Where chunk `index` of `array` is, looked up in `candidates` (the manifests whose
    /// extents hold it, in the array's order); `None` for a chunk that was never written
    /// (fill value).
    pub(crate) fn payload<'a>(
        &self,
        array: &ArrayNode,
        candidates: impl Iterator<Item = (&'a ManifestId, &'a Arc<Manifest>)>,
        index: &[u32],
    ) -> Result<Option<Payload>> {
        let coords = ChunkIndices(index.to_vec());
        for (id, m) in candidates {
            let path = self.root.join(format!("manifests/{id}"));
            let got = self.parsing(&path, || Ok(m.get_chunk_payload(&array.id, &coords)))?;
            let p = match got {
                Ok(p) => p,
                // Not in this manifest (an array's chunks may span several).
                Err(e)
                    if matches!(
                        e.kind(),
                        IcechunkFormatErrorKind::ChunkCoordinatesNotFound { .. }
                            | IcechunkFormatErrorKind::NodeNotFound { .. }
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    let path = self.root.join(format!("manifests/{id}"));
                    return Err(self.invalid(&path, format!("chunk {index:?}: {e}")));
                }
            };
            return Ok(Some(match p {
                ChunkPayload::Inline(b) => Payload::Inline(b),
                ChunkPayload::Ref(r) => Payload::Stored {
                    key: format!("chunks/{}", r.id),
                    offset: r.offset,
                    length: r.length,
                },
                ChunkPayload::Virtual(v) => Payload::Virtual {
                    url: v.location.url().to_string(),
                    offset: v.offset,
                    length: v.length,
                    checksum: v.checksum.map(|c| match c {
                        icechunk_format::manifest::Checksum::LastModified(t) => {
                            VirtualChecksum::LastModified(t.0)
                        }
                        icechunk_format::manifest::Checksum::ETag(t) => VirtualChecksum::ETag(t.0),
                    }),
                },
                other => {
                    let path = self.root.join(format!("manifests/{id}"));
                    return Err(self.invalid(
                        &path,
                        format!("chunk {index:?}: a payload zcrop does not know: {other:?}"),
                    ));
                }
            }));
        }
        Ok(None)
    }
}

#[cfg(test)]
// Values are compared exactly: they were written exactly.
#[allow(clippy::float_cmp)]
mod tests {
    use super::*;

    fn repo(spec: &str) -> Repository {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fixtures/icechunk-repos")
            .join(spec);
        Repository::open(Store::Local, root).unwrap()
    }

    /// The bytes of chunk `index` of the array at `path` in the snapshot `version` names.
    fn chunk(r: &Repository, version: &Version, path: &str, index: &[u32]) -> Option<Vec<u8>> {
        let snap = r.snapshot(&r.snapshot_id(version).unwrap()).unwrap();
        let nodes = r.nodes(&snap).unwrap();
        let node = nodes.iter().find(|n| n.path == path).unwrap();
        let array = node.array.as_ref().unwrap();
        let ids: Vec<_> = array.manifests.iter().map(|(id, _)| id).collect();
        let manifests = r.manifests(&ids).unwrap();
        let candidates = ids.iter().copied().zip(&manifests);
        match r.payload(array, candidates, index).unwrap()? {
            Payload::Inline(b) => Some(b.to_vec()),
            Payload::Stored {
                key,
                offset,
                length,
            } => {
                let all = r.read(&key).unwrap().unwrap();
                Some(all[offset as usize..(offset + length) as usize].to_vec())
            }
            Payload::Virtual { url, .. } => panic!("no virtual chunks in the fixtures: {url}"),
        }
    }

    /// The tip of `main` in the local repository at `root`.
    fn tip_of(root: &Path) -> IcechunkSnapshot {
        IcechunkSnapshot::open(
            root,
            &Version::Branch("main".into()),
            &crate::array::OpenOptions::default(),
            Vec::new(),
        )
        .unwrap()
    }

    fn floats(encoded: &[u8]) -> Vec<f32> {
        let raw = zstd::stream::decode_all(encoded).unwrap();
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn ints(raw: &[u8]) -> Vec<i32> {
        raw.chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    /// Spec v1 (icechunk 1.1.21) and v2 (2.3.0), written by `fixtures/icechunk_generate.py`:
    /// branches, tags and snapshot ids resolve, every node has its zarr.json, and chunks inline
    /// and in chunk objects hold what was written in each commit.
    #[test]
    fn both_spec_versions_read_as_written() {
        for spec in ["v1", "v2"] {
            let r = repo(spec);
            let main = Version::Branch("main".into());
            let tag = Version::Tag("v1".into());
            let (tip, first) = (r.snapshot_id(&main).unwrap(), r.snapshot_id(&tag).unwrap());
            assert_ne!(tip, first, "{spec}");
            assert_eq!(
                r.snapshot_id(&Version::Snapshot(first.to_string()))
                    .unwrap(),
                first
            );

            let snap = r.snapshot(&tip).unwrap();
            let nodes = r.nodes(&snap).unwrap();
            let mut paths: Vec<_> = nodes.iter().map(|n| n.path.as_str()).collect();
            paths.sort_unstable();
            assert_eq!(
                paths,
                [
                    "/",
                    "/grp",
                    "/grp/big",
                    "/grp/raw",
                    "/grp/sharded",
                    "/small"
                ],
                "{spec}"
            );
            for n in &nodes {
                let doc: serde_json::Value = serde_json::from_slice(&n.zarr_json).unwrap();
                let kind = if n.array.is_some() { "array" } else { "group" };
                assert_eq!(doc["node_type"], kind, "{spec} {}", n.path);
            }

            // grp/big: zstd, inline; its first chunk was overwritten in the second commit.
            let want_first: Vec<f32> = (0..5)
                .flat_map(|y| (0..10).map(move |x| (y * 20 + x) as f32))
                .collect();
            let got = floats(&chunk(&r, &tag, "/grp/big", &[0, 0]).unwrap());
            assert_eq!(got, want_first, "{spec}");
            let got = floats(&chunk(&r, &main, "/grp/big", &[0, 0]).unwrap());
            assert_eq!(got, vec![-1.0; 50], "{spec}");
            let got = floats(&chunk(&r, &main, "/grp/big", &[1, 1]).unwrap());
            assert_eq!(got[0], 110.0, "{spec}");
            // small: inline, uncompressed; raw: chunk objects.
            assert_eq!(ints(&chunk(&r, &main, "/small", &[1]).unwrap()), [3, 4]);
            let got = ints(&chunk(&r, &main, "/grp/raw", &[1]).unwrap());
            assert_eq!(got, (200..400).collect::<Vec<_>>(), "{spec}");
            // A chunk past the grid was never written: fill value.
            assert!(chunk(&r, &main, "/grp/raw", &[7]).is_none());
        }
    }

    /// Arrays of both spec versions read through zcrop's planner equal what was written, at
    /// the branch tip and at the tag.
    #[test]
    fn arrays_read_through_the_planner() {
        for spec in ["v1", "v2"] {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/icechunk-repos")
                .join(spec);
            for (version, first_chunk) in [("main", -1.0f32), ("v1", f32::NAN)] {
                let v = if version == "main" {
                    Version::Branch(version.into())
                } else {
                    Version::Tag(version.into())
                };
                let snap = IcechunkSnapshot::open(
                    &root,
                    &v,
                    &crate::array::OpenOptions::default(),
                    Vec::new(),
                )
                .unwrap();
                let open = |path: &str| snap.array(path).unwrap();
                let big = open("/grp/big");
                let got: Vec<f32> = big
                    .read_region(&[0, 0], &[10, 20])
                    .unwrap()
                    .chunks_exact(4)
                    .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
                    .collect();
                for (i, g) in got.iter().enumerate() {
                    let (y, x) = (i / 20, i % 20);
                    let want = if y < 5 && x < 10 && !first_chunk.is_nan() {
                        first_chunk
                    } else {
                        i as f32
                    };
                    assert_eq!(*g, want, "{spec} {version} element {i}");
                }
                let raw = open("/grp/raw").read_region(&[150], &[100]).unwrap();
                let want: Vec<u8> = (150..250i32).flat_map(i32::to_ne_bytes).collect();
                assert_eq!(raw, want, "{spec} {version}");
                let small = open("/small").read_region(&[0], &[4]).unwrap();
                let want: Vec<u8> = [1i32, 2, 3, 4]
                    .iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .collect();
                assert_eq!(small, want, "{spec} {version}");
            }
        }
    }

    /// The public API, on the local fixture and on a copy uploaded to an S3 server.
    #[test]
    fn snapshots_open_locally_and_from_an_object_store() {
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/icechunk-repos/v2");
        let mut places = vec![(
            local.display().to_string(),
            crate::array::OpenOptions::default(),
        )];
        if let Some(moto) = zcrop_fixtures::s3::Moto::shared() {
            moto.create_bucket("icechunk-v2");
            moto.upload_dir("icechunk-v2", "repo", &local);
            let options = crate::array::OpenOptions {
                storage_options: moto.storage_options(),
                ..crate::array::OpenOptions::default()
            };
            places.push(("s3://icechunk-v2/repo".into(), options));
        }
        for (location, options) in places {
            let tip = IcechunkSnapshot::open(
                &location,
                &Version::Branch("main".into()),
                &options,
                Vec::new(),
            )
            .unwrap();
            let tag =
                IcechunkSnapshot::open(&location, &Version::Tag("v1".into()), &options, Vec::new())
                    .unwrap();
            assert_ne!(tip.id(), tag.id());
            let again = IcechunkSnapshot::open(
                &location,
                &Version::Snapshot(tag.id().into()),
                &options,
                Vec::new(),
            )
            .unwrap();
            assert_eq!(again.id(), tag.id());
            let arrays: Vec<String> = tip
                .nodes()
                .into_iter()
                .filter(|(_, a)| *a)
                .map(|(p, _)| p)
                .collect();
            assert_eq!(
                arrays,
                ["/grp/big", "/grp/raw", "/grp/sharded", "/small"],
                "{location}"
            );
            let raw = tip
                .array("grp/raw")
                .unwrap()
                .read_region(&[0], &[400])
                .unwrap();
            let want: Vec<u8> = (0..400i32).flat_map(i32::to_ne_bytes).collect();
            assert_eq!(raw, want, "{location}");
            let big = tag
                .array("/grp/big")
                .unwrap()
                .read_region(&[0, 0], &[1, 3])
                .unwrap();
            let want: Vec<u8> = [0f32, 1.0, 2.0]
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect();
            assert_eq!(big, want, "{location}");
            let e = tip.array("nope").unwrap_err();
            assert!(matches!(e, ZarrError::NodeNotFound { .. }), "{e}");
        }
    }

    /// A snapshot's groups list their members from the snapshot, open them as zcrop nodes
    /// with their paths, and an array's parent is its group in the same snapshot.
    #[test]
    fn groups_walk_the_snapshot() {
        use crate::hierarchy::NodeKind;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/icechunk-repos/v1");
        let snap = tip_of(&root);
        let top = snap.group("").unwrap();
        assert_eq!(top.name(), "/");
        assert_eq!(
            top.members().unwrap(),
            [
                ("grp".to_string(), NodeKind::Group),
                ("small".to_string(), NodeKind::Array)
            ]
        );
        let grp = match top.get("grp").unwrap() {
            crate::Node::Group(g) => g,
            crate::Node::Array(_) => panic!("grp is a group"),
        };
        assert_eq!((grp.name(), grp.path()), ("/grp", "grp"));
        assert_eq!(grp.array_names().unwrap(), ["big", "raw", "sharded"]);
        let raw = match grp.get("raw").unwrap() {
            crate::Node::Array(a) => a,
            crate::Node::Group(_) => panic!("raw is an array"),
        };
        assert_eq!((raw.name(), raw.path()), ("/grp/raw", "grp/raw"));
        let via_top = match top.get("grp/raw").unwrap() {
            crate::Node::Array(a) => a,
            crate::Node::Group(_) => panic!("grp/raw is an array"),
        };
        assert_eq!(
            via_top.read_region(&[0], &[400]).unwrap(),
            raw.read_region(&[0], &[400]).unwrap()
        );
        assert_eq!(raw.parent().unwrap().unwrap().name(), "/grp");
        assert!(grp.get("nope").unwrap_err().is_not_found());
        assert!(matches!(
            snap.group("small").unwrap_err(),
            ZarrError::WrongNodeType { .. }
        ));
        assert!(matches!(
            snap.array("grp").unwrap_err(),
            ZarrError::WrongNodeType { .. }
        ));
    }

    /// Reads from S3 count their GETs: opening an array reads no manifest; a read fetches
    /// each manifest it needs once (the next read finds it cached), and the inner chunks of
    /// a shard come in coalesced ranges of its chunk object.
    #[test]
    fn reads_fetch_a_manifest_once_and_coalesce_chunks() {
        let Some(moto) = zcrop_fixtures::s3::Moto::shared() else {
            return;
        };
        let local = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/icechunk-repos/v1");
        moto.create_bucket("icechunk-counts");
        moto.upload_dir("icechunk-counts", "repo", &local);
        let engine = zcrop_io::ObjectEngine::open(
            "s3://icechunk-counts",
            &moto.storage_options(),
            zcrop_io::ObjectConfig::default(),
        )
        .unwrap();
        let options = crate::array::OpenOptions {
            object_engine: Some(engine.clone()),
            // Counts the GETs of reads that decode: no decoded-chunk cache.
            chunk_cache_bytes: Some(0),
            ..crate::array::OpenOptions::default()
        };
        let snap = IcechunkSnapshot::open(
            "s3://icechunk-counts/repo",
            &Version::Branch("main".into()),
            &options,
            Vec::new(),
        )
        .unwrap();
        let before = engine.metrics();
        let a = snap.array("grp/sharded").unwrap();
        assert_eq!(
            (engine.metrics() - before).gets,
            0,
            "opening reads no manifest"
        );

        // Rows 1-2 and 5-6, columns 40-199: inner chunks 1..=6 of both rows of both shards.
        let read = |origin: [u64; 2]| a.read_region(&origin, &[2, 160]).unwrap();
        let before = engine.metrics();
        let got = [read([1, 40]), read([5, 40])];
        for (rows, g) in [(1u16, &got[0]), (5, &got[1])] {
            let want: Vec<u8> = (rows..rows + 2)
                .flat_map(|r| (40..200).map(move |c| r * 256 + c))
                .flat_map(u16::to_ne_bytes)
                .collect();
            assert_eq!(g, &want);
        }
        let first = engine.metrics() - before;
        let before = engine.metrics();
        read([1, 40]);
        let again = engine.metrics() - before;
        // Again: the shard's index is cached, and its 12 inner chunks come in one GET.
        assert_eq!((again.requests, again.gets), (12, 1), "{again:?}");
        // The first two reads: the manifest once, then each shard's index and data.
        assert_eq!(first.gets, 1 + 2 * 2, "{first:?}");
    }

    /// Unknown versions and damaged files are typed errors naming the file, not panics.
    #[test]
    fn bad_versions_and_damaged_files_are_errors() {
        let r = repo("v1");
        let e = r.snapshot_id(&Version::Branch("nope".into())).unwrap_err();
        assert!(e.to_string().contains("no branch \"nope\""), "{e}");
        assert!(
            r.snapshot_id(&Version::Snapshot("not-an-id".into()))
                .is_err()
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(Repository::open(Store::Local, dir.path().to_path_buf()).is_err());

        // A copy of the v2 repository whose files are cut short or flipped.
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/icechunk-repos/v2");
        let r2 = repo("v2");
        let tip = r2.snapshot_id(&Version::Branch("main".into())).unwrap();
        let snap = std::fs::read(src.join(format!("snapshots/{tip}"))).unwrap();
        for (name, bytes) in [
            ("short", snap[..20].to_vec()),
            ("truncated", snap[..snap.len() / 2].to_vec()),
            ("flipped", {
                let mut b = snap.clone();
                let mid = b.len() - 10;
                b[mid] ^= 0xff;
                b
            }),
        ] {
            let root = dir.path().join(name);
            copy_tree(&src, &root);
            std::fs::write(root.join(format!("snapshots/{tip}")), bytes).unwrap();
            let r = Repository::open(Store::Local, root).unwrap();
            let got = r.snapshot(&tip).and_then(|s| r.nodes(&s));
            let e = got
                .err()
                .unwrap_or_else(|| panic!("{name}: a damaged snapshot read"));
            assert!(
                e.to_string().contains(&format!("snapshots/{tip}")),
                "{name}: {e}"
            );
        }

        // Every manifest cut short: opening still works (it reads none), reading names the
        // manifest.
        let root = dir.path().join("manifests-cut");
        copy_tree(&src, &root);
        for e in std::fs::read_dir(root.join("manifests")).unwrap() {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
        }
        let snap = tip_of(&root);
        let e = snap
            .array("grp/raw")
            .unwrap()
            .read_region(&[0], &[400])
            .unwrap_err();
        assert!(
            matches!(&e, ZarrError::InvalidMetadata { path, .. }
                if path.to_string_lossy().contains("manifests/")),
            "{e}"
        );
    }

    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dest = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy_tree(&e.path(), &dest);
            } else {
                std::fs::copy(e.path(), dest).unwrap();
            }
        }
    }
}
