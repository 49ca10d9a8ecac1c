//! Whole objects: writing, reading and removing them, for work kept on an object store
//! (small documents, markers, chunks a job writes itself) beside the batched range reads.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::{StreamExt, TryStreamExt};
use object_store::{GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use super::{ObjectEngine, shutdown_io, store_error};

/// What a HEAD request says about an object's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectVersion {
    /// Its length in bytes.
    pub size: u64,
    /// When it was last written, in seconds since the Unix epoch.
    pub last_modified_secs: i64,
    /// Its entity tag, where the store gives one.
    pub e_tag: Option<String>,
}

impl ObjectEngine {
    /// Writes `data` as the object `key` (relative to the root), replacing any object there.
    pub fn put(&self, key: &Path, data: Bytes) -> std::io::Result<()> {
        self.put_mode(key, data, PutMode::Overwrite).map(|_| ())
    }

    /// Writes `data` as the object `key` only if there is none (a conditional PUT, atomic on
    /// the store); `false` if there was one, which is left as it was.
    pub fn put_if_absent(&self, key: &Path, data: Bytes) -> std::io::Result<bool> {
        self.put_mode(key, data, PutMode::Create)
    }

    fn put_mode(&self, key: &Path, data: Bytes, mode: PutMode) -> std::io::Result<bool> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(key);
        let location = self.location_or_err(key)?;
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let done = self
            .wait(async move { shared.store.put_opts(&location, data.into(), opts).await })
            .ok_or_else(|| shutdown_io(&what))?;
        match done {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(e) => Err(store_error("writing", &what, &e)),
        }
    }

    /// Starts writing `data` as the object `key` (replacing any) and returns at once; `done`
    /// gets the outcome, on the engine's runtime (it must not block). It is called exactly
    /// once, with an error if the runtime stops first.
    pub fn put_background(
        &self,
        key: &Path,
        data: Bytes,
        done: impl FnOnce(std::io::Result<()>) + Send + 'static,
    ) {
        let what = self.url_of(key);
        let location = match self.location_or_err(key) {
            Ok(l) => l,
            Err(e) => return done(Err(e)),
        };
        let shared = Arc::clone(self.live());
        let runtime = shared.runtime;
        let mut once = Once(Some(Box::new(done)), what.clone());
        runtime.spawn(async move {
            let put = shared
                .store
                .put_opts(&location, data.into(), PutOptions::default());
            let outcome = put.await.map(|_| ());
            once.call(outcome.map_err(|e| store_error("writing", &what, &e)));
        });
    }

    /// The whole object `key`, or `None` if there is none.
    pub fn get(&self, key: &Path) -> std::io::Result<Option<Bytes>> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(key);
        let location = self.location_or_err(key)?;
        let got = self
            .wait(async move {
                let r = shared
                    .store
                    .get_opts(&location, GetOptions::default())
                    .await?;
                r.bytes().await
            })
            .ok_or_else(|| shutdown_io(&what))?;
        match got {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_error("reading", &what, &e)),
        }
    }

    /// The version of each object of `keys` (`None` for one that does not exist), asked for
    /// with HEAD requests sent together (as many at a time as the engine's concurrency).
    pub fn head_many(&self, keys: &[&Path]) -> Vec<std::io::Result<Option<ObjectVersion>>> {
        let shared = Arc::clone(self.live());
        let mut out: Vec<std::io::Result<Option<ObjectVersion>>> = Vec::with_capacity(keys.len());
        let mut asked = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            match self.location_or_err(key) {
                Ok(location) => {
                    asked.push((i, location));
                    out.push(Ok(None));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        let locations: Vec<_> = asked.iter().map(|(_, l)| l.clone()).collect();
        let in_flight = self.max_concurrency().max(1);
        let answers = self.wait(async move {
            let store = &shared.store;
            futures_util::stream::iter(locations)
                .map(|l| async move { store.head(&l).await })
                .buffered(in_flight)
                .collect::<Vec<_>>()
                .await
        });
        let Some(answers) = answers else {
            let what = self.url();
            return keys.iter().map(|_| Err(shutdown_io(what))).collect();
        };
        for ((i, _), answer) in asked.into_iter().zip(answers) {
            out[i] = match answer {
                Ok(meta) => Ok(Some(ObjectVersion {
                    size: meta.size,
                    last_modified_secs: meta.last_modified.timestamp(),
                    e_tag: meta.e_tag,
                })),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(store_error("asking for", &self.url_of(keys[i]), &e)),
            };
        }
        out
    }

    /// Removes the object `key`; removing one that does not exist is not an error.
    pub fn delete(&self, key: &Path) -> std::io::Result<()> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(key);
        let location = self.location_or_err(key)?;
        let done = self
            .wait(async move { shared.store.delete(&location).await })
            .ok_or_else(|| shutdown_io(&what))?;
        match done {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error("removing", &what, &e)),
        }
    }

    /// Removes every object under `prefix` (a key relative to the root; `prefix/...`, and an
    /// object named `prefix` itself); returns how many there were.
    pub fn delete_prefix(&self, prefix: &Path) -> std::io::Result<usize> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(prefix);
        let location = self.location_or_err(prefix)?;
        let removed = self
            .wait(async move {
                let store: &Arc<dyn ObjectStore> = &shared.store;
                let mut found: Vec<object_store::path::Path> = store
                    .list(Some(&location))
                    .map_ok(|m| m.location)
                    .try_collect()
                    .await?;
                // `list` gives what lies under `prefix/`; an object named `prefix` is not there.
                if store.head(&location).await.is_ok() {
                    found.push(location.clone());
                }
                let n = found.len();
                let paths = futures_util::stream::iter(found.into_iter().map(Ok)).boxed();
                store
                    .delete_stream(paths)
                    .try_for_each(|_| async { Ok(()) })
                    .await
                    .map(|()| n)
            })
            .ok_or_else(|| shutdown_io(&what))?;
        removed.map_err(|e| store_error("removing", &what, &e))
    }
}

type Callback = Box<dyn FnOnce(std::io::Result<()>) + Send>;

/// A completion callback called exactly once: by [`Once::call`], or on drop (a task the
/// runtime dropped unrun) with a shutdown error naming the object.
struct Once(Option<Callback>, String);

impl Once {
    fn call(&mut self, outcome: std::io::Result<()>) {
        if let Some(f) = self.0.take() {
            f(outcome);
        }
    }
}

impl Drop for Once {
    fn drop(&mut self) {
        let what = std::mem::take(&mut self.1);
        self.call(Err(shutdown_io(&what)));
    }
}
