//! Where the FFT's arrays and a job's state live: a local directory, or a prefix of an object
//! store (`s3://`, `gs://`, `az://`) that many machines share. One interface for both, and the
//! zarrs store that writes chunks there.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use zarrs::filesystem::FilesystemStore;
use zarrs::storage::byte_range::{ByteRangeIterator, extract_byte_ranges};
use zarrs::storage::{
    MaybeBytes, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits,
    ReadableWritableStorageTraits, StorageError, StoreKey, StorePrefix, WritableStorageTraits,
};
use zcrop_io::{ObjectConfig, ObjectEngine, is_object_url};
use zcrop_zarr::OpenOptions;

use super::io::write_err;
use super::options::FftError;

/// A directory, or a prefix of an object store; see the module documentation.
#[derive(Clone, Debug)]
pub(crate) enum Place {
    /// An absolute local path.
    Local(PathBuf),
    /// `key` (no leading or trailing `/`) under the root of `engine` (its bucket).
    Object {
        /// The engine of the bucket, shared with every reader of it in the process.
        engine: ObjectEngine,
        /// The key of this place in the bucket.
        key: String,
    },
}

impl Place {
    /// The place `location` names: a local path (made absolute; `storage_options` are then
    /// not used), or an object-store URL opened with `storage_options`.
    pub(crate) fn new(
        location: &Path,
        storage_options: &[(String, String)],
    ) -> Result<Place, FftError> {
        let Some(url) = location.to_str().filter(|s| is_object_url(s)) else {
            let local = location
                .to_str()
                .and_then(|s| s.strip_prefix("file://"))
                .map_or_else(|| location.to_path_buf(), PathBuf::from);
            let abs = std::path::absolute(&local).map_err(|e| write_err(&local, e))?;
            return Ok(Place::Local(abs));
        };
        let config = ObjectConfig::from_env().map_err(|e| FftError::Engine(e.into()))?;
        let (engine, key) = ObjectEngine::open_container_shared(url, storage_options, config)
            .map_err(|e| {
                FftError::InvalidArgument(format!("cannot open the object store of {url}: {e}"))
            })?;
        Ok(Place::Object {
            engine,
            key: key.trim_matches('/').to_string(),
        })
    }

    /// The path or URL, for messages and for [`zcrop_zarr::Array::open_with`].
    pub(crate) fn location(&self) -> PathBuf {
        match self {
            Place::Local(p) => p.clone(),
            Place::Object { engine, key } => PathBuf::from(engine.url_of(Path::new(key))),
        }
    }

    /// The path or URL as text.
    pub(crate) fn show(&self) -> String {
        self.location().display().to_string()
    }

    /// `name` (one or more `/`-separated parts) under this place.
    pub(crate) fn join(&self, name: &str) -> Place {
        match self {
            Place::Local(p) => Place::Local(p.join(name)),
            Place::Object { engine, key } => Place::Object {
                engine: engine.clone(),
                key: if key.is_empty() {
                    name.to_string()
                } else {
                    format!("{key}/{name}")
                },
            },
        }
    }

    /// Whether `self` and `other` are the same place or one lies under the other.
    pub(crate) fn overlaps(&self, other: &Place) -> bool {
        let under = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
        match (self, other) {
            (Place::Local(a), Place::Local(b)) => a.starts_with(b) || b.starts_with(a),
            (Place::Object { engine: e, key: a }, Place::Object { engine: f, key: b }) => {
                e.url() == f.url() && (under(a, b) || under(b, a) || a.is_empty() || b.is_empty())
            }
            _ => false,
        }
    }

    /// The engine options that read arrays under this place through its engine.
    pub(crate) fn open_options(&self, base: &OpenOptions) -> OpenOptions {
        let mut o = base.clone();
        if let Place::Object { engine, .. } = self {
            o.object_engine = Some(engine.clone());
        }
        o
    }

    /// The file or object's bytes; `None` if there is none.
    pub(crate) fn read(&self) -> Result<Option<Vec<u8>>, FftError> {
        match self {
            Place::Local(p) => match std::fs::read(p) {
                Ok(b) => Ok(Some(b)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(read_err(p, &e)),
            },
            Place::Object { engine, key } => engine
                .get(Path::new(key))
                .map(|b| b.map(|b| b.to_vec()))
                .map_err(FftError::Storage),
        }
    }

    /// Writes the file or object, replacing any there at once (a reader sees the old or the
    /// new bytes, never a part).
    pub(crate) fn write(&self, data: &[u8]) -> Result<(), FftError> {
        match self {
            Place::Local(p) => {
                let mut tmp = p.clone().into_os_string();
                tmp.push(format!(".tmp-{}", std::process::id()));
                let tmp = PathBuf::from(tmp);
                std::fs::write(&tmp, data).map_err(|e| write_err(&tmp, e))?;
                std::fs::rename(&tmp, p).map_err(|e| write_err(p, e))
            }
            Place::Object { engine, key } => engine
                .put(Path::new(key), Bytes::copy_from_slice(data))
                .map_err(FftError::Storage),
        }
    }

    /// Whether the file or object exists.
    pub(crate) fn exists(&self) -> Result<bool, FftError> {
        match self {
            Place::Local(p) => Ok(p.is_file()),
            Place::Object { .. } => self.read().map(|b| b.is_some()),
        }
    }

    /// Removes the file or object, if there is one.
    pub(crate) fn remove(&self) -> Result<(), FftError> {
        match self {
            Place::Local(p) => match std::fs::remove_file(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(write_err(p, e)),
                _ => Ok(()),
            },
            Place::Object { engine, key } => {
                engine.delete(Path::new(key)).map_err(FftError::Storage)
            }
        }
    }

    /// Whether nothing lies under this place (a directory that is absent or empty, a prefix
    /// with no object under it); a local path that is a file is not empty.
    pub(crate) fn is_empty(&self) -> Result<bool, FftError> {
        match self {
            Place::Local(p) => match std::fs::read_dir(p) {
                Ok(mut d) => Ok(d.next().is_none()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
                Err(_) => Ok(false),
            },
            Place::Object { engine, key } => engine
                .list(Path::new(key))
                .map(|l| l.is_empty())
                .map_err(FftError::Storage),
        }
    }

    /// The names of the files or objects directly under this place.
    pub(crate) fn names(&self) -> Result<Vec<String>, FftError> {
        match self {
            Place::Local(p) => match std::fs::read_dir(p) {
                Ok(d) => Ok(d
                    .filter_map(Result::ok)
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(read_err(p, &e)),
            },
            Place::Object { engine, key } => {
                let listed = engine.list(Path::new(key)).map_err(FftError::Storage)?;
                let prefix = format!("{key}/");
                Ok(listed
                    .into_iter()
                    .filter_map(|(k, _)| {
                        let rest = k.strip_prefix(&prefix)?;
                        (!rest.contains('/')).then(|| rest.to_string())
                    })
                    .collect())
            }
        }
    }

    /// Removes everything under this place (a local directory and what it holds).
    pub(crate) fn remove_all(&self) -> Result<(), FftError> {
        match self {
            Place::Local(p) => match std::fs::remove_dir_all(p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(write_err(p, e)),
                _ => Ok(()),
            },
            Place::Object { engine, key } => engine
                .delete_prefix(Path::new(key))
                .map(|_| ())
                .map_err(FftError::Storage),
        }
    }

    /// Removes the Zarr array here, refusing a place that is not one (so a mistyped output
    /// path cannot delete anything else).
    pub(crate) fn remove_zarr(&self) -> Result<(), FftError> {
        if !(self.join("zarr.json").exists()? || self.join(".zarray").exists()?) {
            return Err(FftError::InvalidArgument(format!(
                "the output {} exists and is not a Zarr array; it is not removed even with \
                 overwrite",
                self.show()
            )));
        }
        self.remove_all()
    }

    /// Makes the local directory (and its parents); an object store needs none.
    pub(crate) fn make_dir(&self) -> Result<(), FftError> {
        match self {
            Place::Local(p) => std::fs::create_dir_all(p).map_err(|e| write_err(p, e)),
            Place::Object { .. } => Ok(()),
        }
    }

    /// A zarrs store rooted at this place. On an object store its writes go out in the
    /// background, tracked by `writes` (see [`Writes`]); a local store writes at once.
    pub(crate) fn store(
        &self,
        writes: &Arc<Writes>,
    ) -> Result<Arc<dyn ReadableWritableStorageTraits>, FftError> {
        match self {
            Place::Local(p) => Ok(Arc::new(
                FilesystemStore::new(p).map_err(|e| write_err(p, e))?,
            )),
            Place::Object { engine, key } => Ok(Arc::new(ObjectStorage {
                engine: engine.clone(),
                key: key.clone(),
                writes: Arc::clone(writes),
            })),
        }
    }
}

/// PUTs in flight to an object store: up to `limit` bytes of them at once (one of any size
/// when none is), so that a writer waits on the store's latency once per batch of chunks, not
/// once per chunk. The first failure is kept and returned by the next write or [`Writes::wait`].
pub(crate) struct Writes {
    state: Mutex<InFlight>,
    changed: Condvar,
    limit: usize,
}

#[derive(Default)]
struct InFlight {
    bytes: usize,
    count: usize,
    error: Option<std::io::Error>,
}

impl Writes {
    /// At most `limit` bytes in flight.
    pub(crate) fn new(limit: usize) -> Arc<Writes> {
        Arc::new(Writes {
            state: Mutex::new(InFlight::default()),
            changed: Condvar::new(),
            limit,
        })
    }

    fn lock(&self) -> MutexGuard<'_, InFlight> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `bytes` more fit, then counts them in; the first failure so far instead.
    fn admit(&self, bytes: usize) -> std::io::Result<()> {
        let mut s = self.lock();
        while s.error.is_none() && s.count > 0 && s.bytes + bytes > self.limit {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(e) = s.error.take() {
            return Err(e);
        }
        s.bytes += bytes;
        s.count += 1;
        Ok(())
    }

    fn done(&self, bytes: usize, outcome: std::io::Result<()>) {
        let mut s = self.lock();
        s.bytes -= bytes;
        s.count -= 1;
        if let Err(e) = outcome {
            s.error.get_or_insert(e);
        }
        self.changed.notify_all();
    }

    /// Waits for every write in flight; the first that failed, if one did.
    pub(crate) fn wait(&self) -> std::io::Result<()> {
        let mut s = self.lock();
        while s.count > 0 {
            s = self.changed.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.error.take().map_or(Ok(()), Err)
    }
}

/// A failed read or listing of the local `path`.
fn read_err(path: &Path, e: &std::io::Error) -> FftError {
    let message = format!("reading {}: {e}", path.display());
    FftError::Storage(std::io::Error::new(e.kind(), message))
}

/// A zarrs store over the objects under `key` of an [`ObjectEngine`]: whole values are read,
/// written (in the background, see [`Writes`]) and removed (object stores write no part of an
/// object).
struct ObjectStorage {
    engine: ObjectEngine,
    key: String,
    writes: Arc<Writes>,
}

impl ObjectStorage {
    fn path(&self, key: &str) -> PathBuf {
        if self.key.is_empty() {
            PathBuf::from(key)
        } else {
            PathBuf::from(format!("{}/{key}", self.key))
        }
    }
}

fn storage_err(e: std::io::Error) -> StorageError {
    StorageError::IOError(Arc::new(e))
}

impl ReadableStorageTraits for ObjectStorage {
    fn get(&self, key: &StoreKey) -> Result<MaybeBytes, StorageError> {
        // A value read back is the one last written.
        self.writes.wait().map_err(storage_err)?;
        self.engine
            .get(&self.path(key.as_str()))
            .map_err(storage_err)
    }

    fn get_partial_many<'a>(
        &'a self,
        key: &StoreKey,
        byte_ranges: ByteRangeIterator<'a>,
    ) -> Result<MaybeBytesIterator<'a>, StorageError> {
        let Some(value) = self.get(key)? else {
            return Ok(None);
        };
        let parts = extract_byte_ranges(&value, byte_ranges)?;
        Ok(Some(Box::new(
            parts.into_iter().map(|p| Ok(Bytes::from(p))),
        )))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        Ok(self.get(key)?.map(|b| b.len() as u64))
    }

    fn supports_get_partial(&self) -> bool {
        false
    }
}

impl WritableStorageTraits for ObjectStorage {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        let n = value.len();
        self.writes.admit(n).map_err(storage_err)?;
        let writes = Arc::clone(&self.writes);
        self.engine
            .put_background(&self.path(key.as_str()), value, move |outcome| {
                writes.done(n, outcome);
            });
        Ok(())
    }

    fn set_partial_many(
        &self,
        key: &StoreKey,
        _offset_values: OffsetBytesIterator,
    ) -> Result<(), StorageError> {
        Err(StorageError::Unsupported(format!(
            "{}: an object store writes whole objects only",
            self.engine.url_of(&self.path(key.as_str()))
        )))
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        // After any write of the same key still in flight.
        self.writes.wait().map_err(storage_err)?;
        self.engine
            .delete(&self.path(key.as_str()))
            .map_err(storage_err)
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        self.writes.wait().map_err(storage_err)?;
        let p = prefix.as_str().trim_end_matches('/');
        self.engine
            .delete_prefix(&self.path(p))
            .map(|_| ())
            .map_err(storage_err)
    }

    fn supports_set_partial(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk write that fails in the background is reported by the next write or by
    /// `wait`, naming the object; writes within the limit all land.
    #[test]
    fn background_write_failures_are_reported() {
        let Some(moto) = zcrop_fixtures::s3::Moto::shared() else {
            return;
        };
        let key = |k: &str| StoreKey::new(k).unwrap();
        moto.create_bucket("fft-place");
        let place = Place::new(Path::new("s3://fft-place/a"), &moto.storage_options()).unwrap();
        let writes = Writes::new(3000);
        let store = place.store(&writes).unwrap();
        for i in 0..10u8 {
            store
                .set(&key(&format!("c/{i}")), Bytes::from(vec![i; 1000]))
                .unwrap();
        }
        writes.wait().unwrap();
        assert_eq!(place.join("c").names().unwrap().len(), 10);
        // Reads wait for the writes before them.
        store.set(&key("c/0"), Bytes::from_static(b"new")).unwrap();
        assert_eq!(store.get(&key("c/0")).unwrap().unwrap(), &b"new"[..]);

        let gone = Place::new(Path::new("s3://fft-no-bucket/a"), &moto.storage_options()).unwrap();
        let writes = Writes::new(3000);
        let store = gone.store(&writes).unwrap();
        store.set(&key("c/0"), Bytes::from_static(b"x")).unwrap();
        let e = writes.wait().unwrap_err().to_string();
        assert!(e.contains("s3://fft-no-bucket/a/c/0"), "{e}");
        // Once reported, the failure is not reported again.
        writes.wait().unwrap();
    }
}
