//! The object-store backend: [`ObjectEngine`] reads byte ranges of objects in S3 and
//! S3-compatible stores, Google Cloud Storage, Azure Blob Storage and plain HTTP(S) servers
//! (through the `object_store` crate), behind the same batch API as [`IoEngine`]: submit a
//! batch of [`ReadRequest`]s, iterate the [`Completion`](crate::Completion)s as they arrive.
//!
//! - **Addressing.** An engine is opened on a URL (`s3://bucket/data.zarr`,
//!   `https://host/data.zarr`, `gs://...`, `az://...`); a request's `path` is an object key
//!   relative to that root, `/`-separated (`temp/c/0/3`). Errors name the object's full URL.
//! - **Planning.** Requests for one object are merged within [`CoalesceLimits::OBJECT`] (a
//!   larger gap than for local files: a GET costs a round trip, a hole only bandwidth), and
//!   within the gap the engine's measured bandwidth and latency make worth it (see `limit`):
//!   one GET per merged range, one suffix-range GET (`Range: bytes=-n`) per distinct suffix
//!   length (shard indexes), one GET for all whole-object requests of an object.
//! - **Concurrency.** The GETs in flight per engine adapt to the store's answers, up to
//!   [`ObjectConfig::max_concurrency`] (see `limit`); a GET whose answer is late is sent again
//!   (hedged). Every GET holds a permit of the in-flight [`Budget`] (the process-wide one
//!   unless told otherwise, shared with the local engines) from when it is issued until its
//!   results are taken by the consumer.
//! - **Retries.** Transient failures (refused or dropped connections, timeouts, 5xx, 429, a body
//!   cut short) are retried by the HTTP client with exponential backoff, per [`RetryPolicy`];
//!   a body cut short resumes where it stopped. Missing objects and denied requests are not
//!   retried: they fail at once with [`IoError::NotFound`] and [`IoError::PermissionDenied`].
//! - **Counting.** [`ObjectEngine::metrics`] counts the GETs the engine planned and issued and
//!   the HTTP requests actually sent (retries included), so tests and benchmarks can check
//!   that no more GETs go out than the coalesced plan has ranges.
//! - **Whole objects.** [`ObjectEngine::put`], [`ObjectEngine::put_if_absent`],
//!   [`ObjectEngine::get`] and [`ObjectEngine::delete_prefix`] write, read and remove whole
//!   objects (see `write`), for jobs that keep their work on the store.
//! - **Runtime.** `object_store` is async: one small tokio runtime per process (threads named
//!   `zcrop-object`) runs every engine's requests, so callers stay synchronous.
//!
//! [`IoEngine`]: crate::IoEngine

mod batch;
mod client;
mod config;
mod limit;
pub(crate) mod plan;
mod write;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreScheme};

use crate::budget::Budget;
use crate::coalesce::CoalesceLimits;
use crate::error::{EngineError, IoError};
use crate::fork::{PerProcess, ProcessBound};
use crate::request::ReadRequest;

use self::batch::drive;
use self::client::{Counters, build_store, runtime};
use self::config::{Options, translate_options};
use self::limit::Limiter;

pub use self::batch::ObjectBatch;
pub use self::client::ObjectMetrics;
pub use self::config::{
    DEFAULT_OBJECT_CONCURRENCY, DEFAULT_WHOLE_OBJECT_CHARGE, INITIAL_OBJECT_CONCURRENCY,
    MIN_OBJECT_CONCURRENCY, ObjectConfig, RetryPolicy, is_object_url,
};
pub use self::write::ObjectVersion;

/// What every request of an engine shares.
struct Shared {
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// The root's URL, without a trailing `/`.
    url: String,
    coalesce: CoalesceLimits,
    budget: Arc<Budget>,
    limiter: Arc<Limiter>,
    whole_object_charge: u64,
    counters: Arc<Counters>,
    runtime: &'static tokio::runtime::Runtime,
    /// What the engine was built from, to build it again in a child of `fork` (its
    /// connections are its parent's there): the configuration, and the store's options
    /// (`None` for a store given as it is).
    config: ObjectConfig,
    options: Option<Options>,
    /// The engine that replaces this one in a child of `fork`.
    successor: PerProcess<ObjectEngine>,
}

impl Shared {
    /// The full URL of `key`, for error messages.
    fn url_of(&self, key: &Path) -> Arc<Path> {
        let key = key.to_string_lossy();
        let key = key.trim_start_matches('/');
        if key.is_empty() {
            Arc::from(Path::new(&self.url))
        } else {
            Arc::from(Path::new(&format!("{}/{key}", self.url)))
        }
    }

    /// The store path of `key`.
    fn location(&self, key: &Path) -> Option<ObjectPath> {
        let key = key.to_str()?;
        let mut p = self.root.clone();
        p.extend(key.split('/'));
        Some(p)
    }
}

/// Reads byte ranges of objects in a cloud object store or over HTTP(S), batch by batch. Cheap
/// to clone; clones share the connection pool, the concurrency limit and the counters.
///
/// In a child of `fork`, an engine built by the parent builds a new client of the same store
/// and configuration on first use (the parent's connections and runtime are not the child's;
/// see [`crate::fork`]).
#[derive(Clone)]
pub struct ObjectEngine {
    shared: ProcessBound<Arc<Shared>>,
}

impl fmt::Debug for ObjectEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectEngine")
            .field("url", &self.live().url)
            .field("coalesce", &self.live().coalesce)
            .field("max_concurrency", &self.live().limiter.max())
            .finish_non_exhaustive()
    }
}

impl ObjectEngine {
    /// An engine for the objects under `url` (`s3://bucket/prefix`, `gs://bucket/prefix`,
    /// `az://container/prefix`, `https://host/prefix`, ...).
    ///
    /// `options` configure the store, with `object_store`'s keys (`endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `session_token`, `allow_http`, `timeout`, ...) or
    /// the names fsspec users know (`anon`, `key`, `secret`, `endpoint_url`, `region_name`);
    /// `anon = true` sends unsigned requests (public buckets); `http2 = true` negotiates HTTP/2
    /// where the server offers it (HTTP/1.1 otherwise). `max_retries`, `retry_timeout`
    /// (seconds) and `max_concurrency` override `config`. Credentials not given come from the
    /// usual environment variables (`AWS_ACCESS_KEY_ID`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
    /// `GOOGLE_APPLICATION_CREDENTIALS`, `AZURE_STORAGE_ACCOUNT_NAME`, ...). An `http://`
    /// endpoint allows plain HTTP. Unknown keys are errors.
    pub fn open(
        url: &str,
        options: &[(String, String)],
        config: ObjectConfig,
    ) -> Result<ObjectEngine, EngineError> {
        let mut config = config;
        let url = url.trim_end_matches('/');
        let options = translate_options(options, &mut config, url)?;
        Self::build(url, options, &config, Arc::new(Counters::default()))
    }

    /// Builds the store for `url` and an engine over it.
    fn build(
        url: &str,
        options: Options,
        config: &ObjectConfig,
        counters: Arc<Counters>,
    ) -> Result<ObjectEngine, EngineError> {
        let (store, root) = build_store(url, &options, config.retry.to_object_store(), &counters)?;
        Self::with_store(
            store,
            root,
            url.to_string(),
            config,
            counters,
            Some(options),
        )
    }

    /// The engine's state in this process: its own, or in a child of `fork` the engine that
    /// replaces it there.
    fn live(&self) -> &Arc<Shared> {
        if self.shared.is_current() {
            return &self.shared;
        }
        let old = &self.shared;
        let next = old.successor.get_or_try_init(|| {
            let mut config = old.config.clone();
            config.budget = config.budget.as_ref().map(Budget::live);
            let counters = Arc::clone(&old.counters);
            match &old.options {
                Some(options) => Self::build(&old.url, options.clone(), &config, counters),
                None => Self::with_store(
                    Arc::clone(&old.store),
                    old.root.clone(),
                    old.url.clone(),
                    &config,
                    counters,
                    None,
                ),
            }
        });
        match next {
            Ok(engine) => &engine.shared,
            Err(e) => {
                // Building the same store again can fail only for want of threads or memory;
                // the parent's engine then fails each request rather than hang.
                log::error!(
                    "zcrop-io: no object engine for {} in this forked process: {e}",
                    old.url
                );
                old
            }
        }
    }

    /// [`ObjectEngine::open`] on the container that holds `url` (the bucket, the Azure
    /// container, the HTTP host), and the key of `url` in it: opening `s3://bucket/a/b.zarr`
    /// gives an engine rooted at `s3://bucket` and `a/b.zarr`, so keys above the URL (a
    /// parent group) are reachable too.
    pub fn open_container(
        url: &str,
        options: &[(String, String)],
        config: ObjectConfig,
    ) -> Result<(ObjectEngine, String), EngineError> {
        let mut config = config;
        let url = url.trim_end_matches('/');
        let options = translate_options(options, &mut config, url)?;
        let counters = Arc::new(Counters::default());
        let (store, root) = build_store(url, &options, config.retry.to_object_store(), &counters)?;
        // The URL ends with the root path unless that is percent-encoded in it; then the
        // engine stays rooted at the URL.
        let key = root.as_ref().to_string();
        let container = if key.is_empty() {
            Some(url)
        } else {
            url.strip_suffix(key.as_str())
                .and_then(|c| c.strip_suffix('/'))
        };
        match container {
            Some(c) => Ok((
                Self::with_store(
                    store,
                    ObjectPath::ROOT,
                    c.to_string(),
                    &config,
                    counters,
                    Some(options.clone()),
                )?,
                key,
            )),
            None => Ok((
                Self::with_store(
                    store,
                    root,
                    url.to_string(),
                    &config,
                    counters,
                    Some(options),
                )?,
                String::new(),
            )),
        }
    }

    /// [`ObjectEngine::open_container`], but one engine per container, options and
    /// configuration in the process while any user holds it: arrays opened from the same bucket
    /// share its connection pool, credentials, concurrency limit and counters instead of each
    /// building their own. The engine is built anew once every user has dropped it.
    pub fn open_container_shared(
        url: &str,
        options: &[(String, String)],
        config: ObjectConfig,
    ) -> Result<(ObjectEngine, String), EngineError> {
        type Engines = crate::sync::Mutex<HashMap<String, std::sync::Weak<Shared>>>;
        static ENGINES: PerProcess<Engines> = PerProcess::new();
        let url = url.trim_end_matches('/');
        let parsed = url::Url::parse(url).map_err(|e| EngineError::Store {
            url: url.to_string(),
            reason: format!("not a valid URL: {e}"),
        })?;
        let container = &parsed[..url::Position::BeforePath];
        let mut sorted = options.to_vec();
        sorted.sort();
        let id = format!("{container}\n{sorted:?}\n{config:?}");
        let engines = ENGINES.get_or_init(Engines::default);
        let found = engines.lock().get(&id).and_then(std::sync::Weak::upgrade);
        if let Some(shared) = found {
            // The key as `open_container` derives it: the URL's path in the store.
            let (_, root) = ObjectStoreScheme::parse(&parsed).map_err(|e| EngineError::Store {
                url: url.to_string(),
                reason: e.to_string(),
            })?;
            return Ok((
                ObjectEngine {
                    shared: ProcessBound::new(shared),
                },
                root.as_ref().to_string(),
            ));
        }
        let (engine, key) = Self::open_container(url, options, config)?;
        // Only engines rooted at the container serve other URLs in it.
        if engine.url() == container {
            let mut map = engines.lock();
            map.retain(|_, weak| weak.strong_count() > 0);
            map.insert(id, Arc::downgrade(&*engine.shared));
        }
        Ok((engine, key))
    }

    /// Whether `self` and `other` are the same engine (clones of one another).
    pub fn same_engine(&self, other: &ObjectEngine) -> bool {
        Arc::ptr_eq(self.live(), other.live())
    }

    /// An engine over an existing store (tests use an in-memory one).
    fn with_store(
        store: Arc<dyn ObjectStore>,
        root: ObjectPath,
        url: String,
        config: &ObjectConfig,
        counters: Arc<Counters>,
        options: Option<Options>,
    ) -> Result<ObjectEngine, EngineError> {
        if config.max_concurrency == 0 {
            return Err(EngineError::Config(
                "max_concurrency must be at least 1".into(),
            ));
        }
        let runtime = runtime()?;
        Ok(ObjectEngine {
            shared: ProcessBound::new(Arc::new(Shared {
                store,
                root,
                url,
                coalesce: config.coalesce,
                budget: config
                    .budget
                    .clone()
                    .unwrap_or_else(|| Arc::clone(Budget::global())),
                limiter: Limiter::new(
                    INITIAL_OBJECT_CONCURRENCY,
                    MIN_OBJECT_CONCURRENCY,
                    config.max_concurrency,
                    config.adaptive_concurrency,
                ),
                whole_object_charge: config.whole_object_charge,
                counters,
                runtime,
                config: config.clone(),
                options,
                successor: PerProcess::new(),
            })),
        })
    }

    /// The root URL (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.live().url
    }

    /// The full URL of `key` (relative to the root).
    pub fn url_of(&self, key: &Path) -> String {
        self.live().url_of(key).to_string_lossy().into_owned()
    }

    /// The coalescing limits.
    pub fn coalesce_limits(&self) -> CoalesceLimits {
        self.live().coalesce
    }

    /// GETs in flight at most: the cap of the adaptive limit, or the fixed limit.
    pub fn max_concurrency(&self) -> usize {
        self.live().limiter.max()
    }

    /// GETs in flight at most right now (the adaptive limit's current value; see
    /// [`ObjectConfig::adaptive_concurrency`]).
    pub fn concurrency(&self) -> usize {
        self.live().limiter.limit()
    }

    /// GETs in flight now (of every read through this engine).
    pub fn gets_in_flight(&self) -> usize {
        self.live().limiter.in_flight()
    }

    /// The engine's counters now.
    pub fn metrics(&self) -> ObjectMetrics {
        self.live().counters.snapshot()
    }

    /// Runs `fut` on the engine's runtime and waits for its output, from any thread (also one
    /// inside another tokio runtime). `None` if the runtime dropped it.
    fn wait<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.live().runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    /// Every object under `prefix` (a key relative to the root; `""` for all): its key relative
    /// to the root and its size. One paginated LIST.
    pub fn list(&self, prefix: &Path) -> std::io::Result<Vec<(String, u64)>> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(prefix);
        let location = self.location_or_err(prefix)?;
        let listed = self
            .wait(async move {
                let root = shared.root.clone();
                let found: Vec<object_store::ObjectMeta> =
                    shared.store.list(Some(&location)).try_collect().await?;
                Ok::<_, object_store::Error>(
                    found
                        .into_iter()
                        .filter_map(|m| {
                            let rel: Vec<String> = m
                                .location
                                .prefix_match(&root)?
                                .map(|p| p.as_ref().to_string())
                                .collect();
                            Some((rel.join("/"), m.size))
                        })
                        .collect(),
                )
            })
            .ok_or_else(|| shutdown_io(&what))?;
        listed.map_err(|e| listing_error(&what, &e))
    }

    /// The names of the "directories" directly under `prefix`: the common prefixes of its
    /// objects at the next `/`.
    pub fn list_dirs(&self, prefix: &Path) -> std::io::Result<Vec<String>> {
        let shared = Arc::clone(self.live());
        let what = self.url_of(prefix);
        let location = self.location_or_err(prefix)?;
        let listed = self
            .wait(async move {
                let r = shared.store.list_with_delimiter(Some(&location)).await?;
                Ok::<_, object_store::Error>(
                    r.common_prefixes
                        .into_iter()
                        .filter_map(|p| p.filename().map(String::from))
                        .collect(),
                )
            })
            .ok_or_else(|| shutdown_io(&what))?;
        listed.map_err(|e| listing_error(&what, &e))
    }

    fn location_or_err(&self, key: &Path) -> std::io::Result<ObjectPath> {
        self.live().location(key).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}: the key is not valid UTF-8", key.display()),
            )
        })
    }

    /// Submits a batch of reads and returns at once; iterate the returned [`ObjectBatch`] to
    /// receive each result as it completes, tagged with its request's id. Each request's
    /// `path` is an object key relative to the engine's root.
    pub fn submit(&self, requests: impl IntoIterator<Item = ReadRequest>) -> ObjectBatch {
        let requests: Vec<ReadRequest> = requests.into_iter().collect();
        let shared = self.live();
        Counters::add(&shared.counters.requests, requests.len() as u64);
        let (tx, rx) = crossbeam_channel::unbounded();
        let cancel = Arc::new(AtomicBool::new(false));
        // Holes merge while cheaper than a GET at the measured bandwidth and latency.
        let limits = CoalesceLimits {
            max_gap: shared.limiter.max_gap(shared.coalesce.max_gap),
            ..shared.coalesce
        };
        let ops = plan::plan(&requests, limits);
        if !ops.is_empty() {
            shared
                .runtime
                .spawn(drive(Arc::clone(shared), ops, tx, Arc::clone(&cancel)));
        }
        ObjectBatch {
            rx,
            ready: VecDeque::new(),
            remaining: requests.len(),
            delivered: vec![false; requests.len()],
            requests,
            cancel,
            engine: self.clone(),
        }
    }

    /// Reads a batch and returns every result in the order of `requests` (ids are ignored).
    pub fn read_all(&self, requests: Vec<ReadRequest>) -> Vec<Result<Bytes, IoError>> {
        let n = requests.len();
        let tagged = requests
            .into_iter()
            .enumerate()
            .map(|(i, r)| ReadRequest { id: i as u64, ..r });
        let mut out: Vec<Option<Result<Bytes, IoError>>> = vec![None; n];
        let mut batch = self.submit(tagged);
        for c in batch.by_ref() {
            out[c.id as usize] = Some(c.result);
        }
        out.into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.unwrap_or_else(|| {
                    let req = &batch.requests[i];
                    Err(IoError::Shutdown {
                        path: self.live().url_of(&req.path),
                        range: req.range,
                    })
                })
            })
            .collect()
    }
}

fn shutdown_io(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Interrupted,
        format!("{what}: the object-store runtime stopped"),
    )
}

fn listing_error(what: &str, e: &object_store::Error) -> std::io::Error {
    store_error("listing", what, e)
}

/// An `object_store` error of `action` ("listing", "writing", ...) on `what` (a URL).
fn store_error(action: &str, what: &str, e: &object_store::Error) -> std::io::Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => std::io::ErrorKind::PermissionDenied,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            std::io::ErrorKind::Unsupported
        }
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, format!("{action} {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::range::ReadRange;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};
    use std::time::Duration;

    /// An object whose byte at offset `o` is a hash of `o`, so misplaced slices are caught.
    fn content(len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|o| (o.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
            .collect()
    }

    fn engine(config: &ObjectConfig, objects: &[(&str, usize)]) -> ObjectEngine {
        let store = Arc::new(InMemory::new());
        let e = ObjectEngine::with_store(
            Arc::clone(&store) as Arc<dyn ObjectStore>,
            ObjectPath::from("root/data.zarr"),
            "memory:///root/data.zarr".into(),
            config,
            Arc::new(Counters::default()),
            None,
        )
        .unwrap();
        for (key, len) in objects {
            let path = ObjectPath::from(format!("root/data.zarr/{key}").as_str());
            let payload = PutPayload::from(content(*len));
            let s = Arc::clone(&store);
            e.wait(async move { s.put(&path, payload).await.unwrap() })
                .unwrap();
        }
        e
    }

    fn req(id: u64, key: &str, range: ReadRange) -> ReadRequest {
        ReadRequest::new(id, Path::new(key), range)
    }

    #[test]
    fn plans_one_get_per_merged_range_suffix_and_whole_object() {
        let requests = vec![
            req(0, "a", ReadRange::new(0, 10)),
            req(1, "a", ReadRange::new(100, 10)),
            req(2, "a", ReadRange::new(5_000_000, 10)),
            req(3, "a", ReadRange::Suffix(16)),
            req(4, "a", ReadRange::Suffix(16)),
            req(5, "a", ReadRange::Suffix(32)),
            req(6, "b", ReadRange::Whole),
            req(7, "b", ReadRange::Whole),
        ];
        let ops = plan::plan(&requests, CoalesceLimits::OBJECT);
        let got: Vec<(String, ReadRange, usize)> = ops
            .iter()
            .map(|o| (o.key.display().to_string(), o.range, o.parts.len()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), ReadRange::new(0, 110), 2),
                ("a".into(), ReadRange::new(5_000_000, 10), 1),
                ("a".into(), ReadRange::Suffix(16), 2),
                ("a".into(), ReadRange::Suffix(32), 1),
                ("b".into(), ReadRange::Whole, 2),
            ]
        );
    }

    #[test]
    fn reads_ranges_suffixes_and_whole_objects() {
        let e = engine(&ObjectConfig::default(), &[("a", 10_000), ("b/c", 300)]);
        let a = content(10_000);
        let got = e.read_all(vec![
            req(0, "a", ReadRange::new(10, 20)),
            req(0, "a", ReadRange::new(25, 100)),
            req(0, "a", ReadRange::Suffix(64)),
            req(0, "b/c", ReadRange::Whole),
            req(0, "a", ReadRange::new(50, 0)),
        ]);
        let got: Vec<Vec<u8>> = got.into_iter().map(|r| r.unwrap().to_vec()).collect();
        assert_eq!(got[0], a[10..30]);
        assert_eq!(got[1], a[25..125]);
        assert_eq!(got[2], a[10_000 - 64..]);
        assert_eq!(got[3], content(300));
        assert!(got[4].is_empty());
        let m = e.metrics();
        // The two nearby ranges are one GET; the empty range needs none.
        assert_eq!((m.requests, m.gets, m.errors), (5, 3, 0));
    }

    #[test]
    fn missing_objects_and_ranges_past_the_end_are_typed_errors() {
        let e = engine(&ObjectConfig::default(), &[("a", 100)]);
        let got = e.read_all(vec![
            req(0, "nope", ReadRange::Whole),
            req(0, "a", ReadRange::new(90, 20)),
            req(0, "a", ReadRange::new(0, 10)),
            req(0, "a", ReadRange::Suffix(200)),
            req(0, "a", ReadRange::new(500, 10)),
            req(0, "a", ReadRange::new(u64::MAX - 5, 10)),
        ]);
        match &got[0] {
            Err(IoError::NotFound { path, .. }) => {
                assert_eq!(path.to_str(), Some("memory:///root/data.zarr/nope"));
            }
            other => panic!("{other:?}"),
        }
        // Merged with (0, 10) into one GET that the object cuts short: only this one fails.
        assert!(
            matches!(&got[1], Err(IoError::RangePastEof { file_len: 100, .. })),
            "{:?}",
            got[1]
        );
        assert_eq!(got[2].as_ref().unwrap()[..], content(100)[..10]);
        assert!(
            matches!(&got[3], Err(IoError::RangePastEof { file_len: 100, .. })),
            "{:?}",
            got[3]
        );
        for r in &got[4..] {
            assert!(
                matches!(r, Err(IoError::RangePastEof { file_len: 100, .. })),
                "{r:?}"
            );
        }
    }

    #[test]
    fn budget_bounds_what_is_held_and_whole_reads_are_recharged() {
        let budget = Budget::new(2, 1 << 20);
        let config = ObjectConfig {
            budget: Some(Arc::clone(&budget)),
            coalesce: CoalesceLimits::ADJACENT_ONLY,
            whole_object_charge: 10,
            ..ObjectConfig::default()
        };
        let e = engine(&config, &[("a", 4096), ("w", 5000)]);
        let batch = e.submit(
            (0..20u64)
                .map(|i| req(i, "a", ReadRange::new(i * 200, 100)))
                .chain(std::iter::once(req(99, "w", ReadRange::Whole))),
        );
        // Nothing taken yet: at most two GETs' results are held.
        std::thread::sleep(Duration::from_millis(100));
        let (held, _) = budget.in_flight();
        assert!(held <= 2, "{held} requests held with a budget of 2");
        let mut seen = 0;
        let mut whole = None;
        for c in batch {
            if c.id == 99 {
                whole = Some(c.result.unwrap());
            } else {
                let i = c.id as usize;
                assert_eq!(c.result.unwrap()[..], content(4096)[i * 200..i * 200 + 100]);
            }
            seen += 1;
        }
        assert_eq!(seen, 21);
        assert_eq!(whole.unwrap().len(), 5000);
        assert_eq!(budget.in_flight(), (0, 0), "every permit is released");
    }

    #[test]
    fn dropping_a_batch_stops_issuing_gets() {
        let budget = Budget::new(1, 1 << 20);
        let config = ObjectConfig {
            budget: Some(Arc::clone(&budget)),
            coalesce: CoalesceLimits::ADJACENT_ONLY,
            ..ObjectConfig::default()
        };
        let e = engine(&config, &[("a", 100_000)]);
        let mut batch = e.submit((0..100u64).map(|i| req(i, "a", ReadRange::new(i * 1000, 10))));
        assert!(batch.next().is_some());
        drop(batch);
        std::thread::sleep(Duration::from_millis(200));
        let gets = e.metrics().gets;
        assert!(gets < 100, "{gets} GETs after the batch was dropped");
        assert_eq!(budget.in_flight(), (0, 0));
    }

    #[test]
    fn lists_objects_and_directories() {
        let e = engine(
            &ObjectConfig::default(),
            &[
                ("zarr.json", 10),
                ("t/zarr.json", 5),
                ("t/c/0", 7),
                ("u/x", 1),
            ],
        );
        let mut all = e.list(Path::new("")).unwrap();
        all.sort();
        assert_eq!(
            all,
            vec![
                ("t/c/0".to_string(), 7),
                ("t/zarr.json".to_string(), 5),
                ("u/x".to_string(), 1),
                ("zarr.json".to_string(), 10),
            ]
        );
        let mut dirs = e.list_dirs(Path::new("")).unwrap();
        dirs.sort();
        assert_eq!(dirs, vec!["t".to_string(), "u".to_string()]);
        assert_eq!(e.list_dirs(Path::new("t")).unwrap(), vec!["c".to_string()]);
    }

    #[test]
    fn url_detection() {
        for url in [
            "s3://b/k",
            "gs://b",
            "https://h/x.zarr",
            "az://c/p",
            "s3a://b",
        ] {
            assert!(is_object_url(url), "{url}");
        }
        for path in [
            "/data/x.zarr",
            "x.zarr",
            "file:///data/x.zarr",
            "C:\\x",
            "://x",
        ] {
            assert!(!is_object_url(path), "{path}");
        }
    }

    #[test]
    fn options_are_translated_and_unknown_ones_refused() {
        let opts = |kv: &[(&str, &str)]| -> Vec<(String, String)> {
            kv.iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        let mut config = ObjectConfig::default();
        let t = translate_options(
            &opts(&[
                ("anon", "True"),
                ("key", "K"),
                ("Region-Name", "eu-west-1"),
                ("max_retries", "3"),
                ("retry_timeout", "2.5"),
            ]),
            &mut config,
            "s3://b",
        )
        .unwrap();
        assert!(t.anonymous);
        assert_eq!(
            t.store,
            opts(&[("access_key_id", "K"), ("region", "eu-west-1")])
        );
        assert_eq!(config.retry.max_retries, 3);
        assert_eq!(config.retry.retry_timeout, Duration::from_millis(2500));
        let err = ObjectEngine::open(
            "s3://bucket/x.zarr",
            &opts(&[("no_such_option", "1")]),
            ObjectConfig::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("no_such_option") && err.to_string().contains("s3://bucket"),
            "{err}"
        );
        let t = translate_options(&opts(&[("http2", "true")]), &mut config, "https://h").unwrap();
        assert_eq!(t.store, opts(&[("http1_only", "false")]));
        // gcsfs's names for a gs:// URL; S3's `key` is not translated there.
        let t = translate_options(
            &opts(&[
                ("endpoint_url", "http://127.0.0.1:9"),
                ("token", "anon"),
                ("project", "p"),
            ]),
            &mut config,
            "gs://b",
        )
        .unwrap();
        assert!(t.anonymous);
        assert_eq!(t.store, opts(&[("google_base_url", "http://127.0.0.1:9")]));
        assert!(config::gcs_base_is_http(&t.store));
        let t = translate_options(
            &opts(&[("token", "/creds.json"), ("key", "K")]),
            &mut config,
            "gs://b",
        )
        .unwrap();
        if std::env::var_os("STORAGE_EMULATOR_HOST").is_none() {
            assert!(!t.anonymous);
            assert_eq!(
                t.store,
                opts(&[
                    ("google_application_credentials", "/creds.json"),
                    ("key", "K")
                ])
            );
        }
        let err = ObjectEngine::open("file:///x", &[], ObjectConfig::default()).unwrap_err();
        assert!(err.to_string().contains("local path"), "{err}");
        let err = ObjectEngine::open(
            "s3://b/x",
            &opts(&[("max_retries", "many")]),
            ObjectConfig::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("max_retries"), "{err}");
    }

    #[test]
    fn engines_are_shared_per_container_and_options_while_in_use() {
        // Building an S3 engine does not connect, so an unreachable endpoint is fine here.
        let opts = |region: &str| -> Vec<(String, String)> {
            [
                ("endpoint", "http://127.0.0.1:9"),
                ("region", region),
                ("access_key_id", "K"),
                ("secret_access_key", "S"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
        };
        let open = |url: &str, o: &[(String, String)]| {
            ObjectEngine::open_container_shared(url, o, ObjectConfig::default()).unwrap()
        };
        let (a, key_a) = open("s3://zcrop-share/x/a.zarr", &opts("r1"));
        let (b, key_b) = open("s3://zcrop-share/y/b.zarr/", &opts("r1"));
        assert!(a.same_engine(&b));
        assert_eq!((key_a.as_str(), key_b.as_str()), ("x/a.zarr", "y/b.zarr"));
        assert_eq!(a.url(), "s3://zcrop-share");
        // Another bucket, other options or another configuration: another engine.
        assert!(!a.same_engine(&open("s3://zcrop-other/x/a.zarr", &opts("r1")).0));
        assert!(!a.same_engine(&open("s3://zcrop-share/x/a.zarr", &opts("r2")).0));
        let config = ObjectConfig {
            max_concurrency: 3,
            ..ObjectConfig::default()
        };
        let (fewer, _) =
            ObjectEngine::open_container_shared("s3://zcrop-share/x", &opts("r1"), config).unwrap();
        assert!(!a.same_engine(&fewer) && fewer.max_concurrency() == 3);
        // The process keeps no engine alive: once every user dropped it, it is gone, and the
        // next open builds a new one that later opens share again.
        let weak = Arc::downgrade(&a.shared);
        drop((a, b));
        assert!(weak.upgrade().is_none());
        let (fresh, _) = open("s3://zcrop-share/x/a.zarr", &opts("r1"));
        let (again, _) = open("s3://zcrop-share/z", &opts("r1"));
        assert!(fresh.same_engine(&again));
    }
}
