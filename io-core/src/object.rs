//! The object-store backend: [`ObjectEngine`] reads byte ranges of objects in S3 and
//! S3-compatible stores, Google Cloud Storage, Azure Blob Storage and plain HTTP(S) servers
//! (through the `object_store` crate), behind the same batch API as [`IoEngine`]: submit a
//! batch of [`ReadRequest`]s, iterate the [`Completion`]s as they arrive.
//!
//! - **Addressing.** An engine is opened on a URL (`s3://bucket/data.zarr`,
//!   `https://host/data.zarr`, `gs://...`, `az://...`); a request's `path` is an object key
//!   relative to that root, `/`-separated (`temp/c/0/3`). Errors name the object's full URL.
//! - **Planning.** Requests for one object are merged with [`CoalesceLimits::OBJECT`] (a larger
//!   gap than for local files: a GET costs a round trip, a hole only bandwidth): one GET per
//!   merged range, one suffix-range GET (`Range: bytes=-n`) per distinct suffix length (shard
//!   indexes), one GET for all whole-object requests of an object.
//! - **Concurrency.** At most [`ObjectConfig::max_concurrency`] GETs are in flight per engine,
//!   and every GET holds a permit of the in-flight [`Budget`] (the process-wide one unless
//!   told otherwise, shared with the local engines) from when it is issued until its results
//!   are taken by the consumer.
//! - **Retries.** Transient failures (refused or dropped connections, timeouts, 5xx, 429, a body
//!   cut short) are retried by the HTTP client with exponential backoff, per [`RetryPolicy`];
//!   a body cut short resumes where it stopped. Missing objects and denied requests are not
//!   retried: they fail at once with [`IoError::NotFound`] and [`IoError::PermissionDenied`].
//! - **Counting.** [`ObjectEngine::metrics`] counts the GETs the engine planned and issued and
//!   the HTTP requests actually sent (retries included), so tests and benchmarks can check
//!   that no more GETs go out than the coalesced plan has ranges.
//! - **Runtime.** `object_store` is async: one small tokio runtime per process (threads named
//!   `zcrop-object`) runs every engine's requests, so callers stay synchronous.
//!
//! [`IoEngine`]: crate::IoEngine

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use futures_util::TryStreamExt;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientConfigKey, ClientOptions, GetOptions, GetRange, ObjectStore,
    ObjectStoreExt, ObjectStoreScheme, RetryConfig,
};
use tokio::sync::Semaphore;

use crate::budget::{Budget, Permit};
use crate::coalesce::{CoalesceLimits, coalesce};
use crate::error::{EngineError, IoError};
use crate::request::{Completion, ReadRange, ReadRequest};

/// Default number of GETs one engine keeps in flight.
pub const DEFAULT_OBJECT_CONCURRENCY: usize = 64;

/// Default budget charge of a whole-object read, whose size is unknown until the response
/// arrives (the permit is re-charged with the real size then).
pub const DEFAULT_WHOLE_OBJECT_CHARGE: u64 = 1024 * 1024;

/// How failed requests are retried (by the HTTP client, per request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Retries of one request at most.
    pub max_retries: usize,
    /// Wait before the first retry; each later wait grows by `backoff_base`, with jitter.
    pub initial_backoff: Duration,
    /// Longest wait between two tries.
    pub max_backoff: Duration,
    /// Growth factor of the wait.
    pub backoff_base: f64,
    /// No retry is started after this long since the first try.
    pub retry_timeout: Duration,
}

impl Default for RetryPolicy {
    /// 10 retries, 100 ms doubling up to 15 s, none started after 60 s. With the HTTP
    /// client's default request timeout (30 s), a server that stops answering fails a read in
    /// about 90 s (`object_store`'s own default of 3 minutes held such reads for 181 s).
    fn default() -> Self {
        RetryPolicy {
            max_retries: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            backoff_base: 2.0,
            retry_timeout: Duration::from_mins(1),
        }
    }
}

impl RetryPolicy {
    fn to_object_store(self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: self.initial_backoff,
                max_backoff: self.max_backoff,
                base: self.backoff_base,
            },
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }
}

/// How an [`ObjectEngine`] reads.
#[derive(Debug, Clone)]
pub struct ObjectConfig {
    /// When nearby ranges of one object merge into one GET.
    pub coalesce: CoalesceLimits,
    /// GETs in flight per engine at most.
    pub max_concurrency: usize,
    /// The in-flight budget; `None` uses the process-wide [`Budget::global`].
    pub budget: Option<Arc<Budget>>,
    /// Retries of failed requests.
    pub retry: RetryPolicy,
    /// Bytes a whole-object read is charged to the budget when it is issued (its size is
    /// unknown until the response arrives; the charge is corrected then).
    pub whole_object_charge: u64,
}

impl Default for ObjectConfig {
    fn default() -> Self {
        ObjectConfig {
            coalesce: CoalesceLimits::OBJECT,
            max_concurrency: DEFAULT_OBJECT_CONCURRENCY,
            budget: None,
            retry: RetryPolicy::default(),
            whole_object_charge: DEFAULT_WHOLE_OBJECT_CHARGE,
        }
    }
}

impl ObjectConfig {
    /// The defaults, overridden by `ZCROP_OBJECT_CONCURRENCY` and `ZCROP_OBJECT_MAX_RETRIES`.
    /// Unparsable values are reported as errors, not ignored.
    pub fn from_env() -> Result<Self, EngineError> {
        let mut c = ObjectConfig::default();
        let num = |name: &str| -> Result<Option<usize>, EngineError> {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .map(|v| {
                    v.parse::<usize>()
                        .map_err(|_| EngineError::Config(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        };
        if let Some(n) = num("ZCROP_OBJECT_CONCURRENCY")? {
            c.max_concurrency = n;
        }
        if let Some(n) = num("ZCROP_OBJECT_MAX_RETRIES")? {
            c.retry.max_retries = n;
        }
        Ok(c)
    }
}

/// Whether `s` looks like a URL zcrop should read through an object store (`s3://`, `gs://`,
/// `az://`, `http(s)://`, ...), rather than a local path. `file://` URLs are local paths.
pub fn is_object_url(s: &str) -> bool {
    match s.split_once("://") {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
                && !scheme.eq_ignore_ascii_case("file")
        }
        None => false,
    }
}

/// A snapshot of an [`ObjectEngine`]'s counters. Subtract two to measure a span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectMetrics {
    /// Requests submitted by callers.
    pub requests: u64,
    /// GETs the engine issued after coalescing: one per merged range, per distinct suffix
    /// length of an object, per object read whole. A GET the HTTP client retried counts once.
    pub gets: u64,
    /// Bytes received by those GETs (coalescing holes included).
    pub bytes_read: u64,
    /// Requests that ended in an error.
    pub errors: u64,
    /// GET requests sent over HTTP, retries included.
    pub http_gets: u64,
    /// Other HTTP requests sent (HEAD, LIST, credential fetches), retries included.
    pub http_other: u64,
    /// HTTP requests that got no response (refused or dropped connection, timeout) or were
    /// answered with a server error (5xx) or 429: the ones the client retries.
    pub http_failures: u64,
}

impl std::ops::Sub for ObjectMetrics {
    type Output = ObjectMetrics;
    fn sub(self, o: Self) -> Self {
        ObjectMetrics {
            requests: self.requests - o.requests,
            gets: self.gets - o.gets,
            bytes_read: self.bytes_read - o.bytes_read,
            errors: self.errors - o.errors,
            http_gets: self.http_gets - o.http_gets,
            http_other: self.http_other - o.http_other,
            http_failures: self.http_failures - o.http_failures,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    gets: AtomicU64,
    bytes_read: AtomicU64,
    errors: AtomicU64,
    http_gets: AtomicU64,
    http_other: AtomicU64,
    http_failures: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ObjectMetrics {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ObjectMetrics {
            requests: l(&self.requests),
            gets: l(&self.gets),
            bytes_read: l(&self.bytes_read),
            errors: l(&self.errors),
            http_gets: l(&self.http_gets),
            http_other: l(&self.http_other),
            http_failures: l(&self.http_failures),
        }
    }
}

/// The HTTP connector of every store an engine builds: `object_store`'s reqwest client, with
/// each request counted.
#[derive(Debug)]
struct CountingConnector {
    counters: Arc<Counters>,
}

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(CountingService {
            inner,
            counters: Arc::clone(&self.counters),
        }))
    }
}

#[derive(Debug)]
struct CountingService {
    inner: HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl HttpService for CountingService {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let c = &self.counters;
        if req.method().as_str() == "GET" {
            Counters::add(&c.http_gets, 1);
        } else {
            Counters::add(&c.http_other, 1);
        }
        let res = self.inner.execute(req).await;
        let failed = match &res {
            Err(_) => true,
            Ok(r) => r.status().is_server_error() || r.status().as_u16() == 429,
        };
        if failed {
            Counters::add(&c.http_failures, 1);
        }
        res
    }
}

/// The process's runtime for object-store requests, started on first use. Its size comes from
/// `ZCROP_OBJECT_THREADS`, else the number of cores (2 to 8).
fn runtime() -> Result<&'static tokio::runtime::Runtime, EngineError> {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    static START: parking_lot::Mutex<()> = parking_lot::Mutex::new(());
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let _starting = START.lock();
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let threads = match std::env::var("ZCROP_OBJECT_THREADS") {
        Ok(v) if !v.is_empty() => v.parse::<usize>().map_err(|_| {
            EngineError::Config(format!("ZCROP_OBJECT_THREADS={v:?} is not a number"))
        })?,
        _ => std::thread::available_parallelism()
            .map_or(2, std::num::NonZero::get)
            .clamp(2, 8),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name("zcrop-object")
        .enable_all()
        .build()
        .map_err(EngineError::Spawn)?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Makes sure rustls has a process-wide crypto provider before an HTTP client is built (the
/// client needs one even for plain `http://`): the `ring` provider, unless the application
/// installed another first.
fn ensure_tls_provider() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// A storage option as given (`anon`, `endpoint_url`, `region`, ...), normalised: the key in
/// lower case with `-` as `_`.
fn normalise_key(key: &str) -> String {
    key.trim().to_ascii_lowercase().replace('-', "_")
}

fn truthy(v: &str) -> bool {
    matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes" | "on" | "y"
    )
}

/// The options after zcrop's own and fsspec's names are translated to `object_store`'s keys.
struct Options {
    /// `(key, value)` for the store's builder.
    store: Vec<(String, String)>,
    /// Set by `anon` / `anonymous`: unsigned requests.
    anonymous: bool,
}

/// Splits `options` into zcrop's own (applied to `config`) and the store's, translating the
/// names fsspec and s3fs users pass (`anon`, `key`, `secret`, `region_name`).
fn translate_options(
    options: &[(String, String)],
    config: &mut ObjectConfig,
    url: &str,
) -> Result<Options, EngineError> {
    let bad = |key: &str, value: &str, what: &str| EngineError::Store {
        url: url.to_string(),
        reason: format!("storage option {key}={value:?}: {what}"),
    };
    let mut out = Options {
        store: Vec::new(),
        anonymous: false,
    };
    for (key, value) in options {
        let k = normalise_key(key);
        match k.as_str() {
            "anon" | "anonymous" | "skip_signature" => out.anonymous = truthy(value),
            "max_retries" => {
                config.retry.max_retries = value
                    .trim()
                    .parse()
                    .map_err(|_| bad(key, value, "not a number"))?;
            }
            "retry_timeout" => {
                let secs: f64 = value
                    .trim()
                    .parse()
                    .map_err(|_| bad(key, value, "not a number of seconds"))?;
                config.retry.retry_timeout = Duration::try_from_secs_f64(secs)
                    .map_err(|_| bad(key, value, "not a duration"))?;
            }
            "max_concurrency" => {
                config.max_concurrency = value
                    .trim()
                    .parse()
                    .map_err(|_| bad(key, value, "not a number"))?;
            }
            "key" => out.store.push(("access_key_id".into(), value.clone())),
            "secret" => out.store.push(("secret_access_key".into(), value.clone())),
            "region_name" => out.store.push(("region".into(), value.clone())),
            _ => out.store.push((k, value.clone())),
        }
    }
    Ok(out)
}

/// Whether the S3 endpoint, from `options` or else the environment, is plain `http://` (a
/// local S3-compatible server): then HTTP is allowed without saying so again.
fn endpoint_is_http(options: &[(String, String)]) -> bool {
    let is_endpoint = |k: &str| {
        matches!(
            k,
            "endpoint" | "endpoint_url" | "aws_endpoint" | "aws_endpoint_url"
        )
    };
    let http = |v: &str| v.trim().to_ascii_lowercase().starts_with("http://");
    match options.iter().find(|(k, _)| is_endpoint(k)) {
        Some((_, v)) => http(v),
        None => ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"]
            .iter()
            .find_map(|name| std::env::var(name).ok())
            .is_some_and(|v| http(&v)),
    }
}

/// Builds the store for `url` with `options`; returns it and the root path inside it.
fn build_store(
    url_str: &str,
    options: &Options,
    retry: RetryConfig,
    counters: &Arc<Counters>,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath), EngineError> {
    ensure_tls_provider();
    let fail = |reason: String| EngineError::Store {
        url: url_str.to_string(),
        reason,
    };
    let url = url::Url::parse(url_str).map_err(|e| fail(format!("not a valid URL: {e}")))?;
    let (scheme, root) = ObjectStoreScheme::parse(&url).map_err(|e| fail(e.to_string()))?;
    let connector = || CountingConnector {
        counters: Arc::clone(counters),
    };
    let unknown = |key: &str, store: &str| {
        fail(format!(
            "unknown storage option {key:?} for {store} (see the object_store crate's \
             configuration keys)"
        ))
    };
    let built = |r: object_store::Result<Arc<dyn ObjectStore>>| r.map_err(|e| fail(e.to_string()));
    // The cloud builders share their configuration steps but no trait: the caller's options
    // (keys of the builder's config-key type), anonymous access, retries and our connector.
    macro_rules! cloud_store {
        ($builder:expr, $key:ty, $name:literal) => {{
            let mut b = $builder;
            for (k, v) in &options.store {
                let key = <$key>::from_str(k).map_err(|_| unknown(k, $name))?;
                b = b.with_config(key, v.clone());
            }
            if options.anonymous {
                b = b.with_skip_signature(true);
            }
            built(
                b.with_retry(retry)
                    .with_http_connector(connector())
                    .build()
                    .map(|s| Arc::new(s) as _),
            )?
        }};
    }
    let store: Arc<dyn ObjectStore> = match scheme {
        ObjectStoreScheme::AmazonS3 => {
            let mut b = AmazonS3Builder::from_env().with_url(url_str);
            if endpoint_is_http(&options.store)
                && !options.store.iter().any(|(k, _)| k.ends_with("allow_http"))
            {
                b = b.with_config(
                    AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp),
                    "true",
                );
            }
            cloud_store!(b, AmazonS3ConfigKey, "S3")
        }
        ObjectStoreScheme::GoogleCloudStorage => {
            let b = GoogleCloudStorageBuilder::from_env().with_url(url_str);
            cloud_store!(b, GoogleConfigKey, "GCS")
        }
        ObjectStoreScheme::MicrosoftAzure => {
            let b = MicrosoftAzureBuilder::from_env().with_url(url_str);
            cloud_store!(b, AzureConfigKey, "Azure")
        }
        ObjectStoreScheme::Http => {
            let base = &url[..url::Position::BeforePath];
            let mut b = HttpBuilder::new().with_url(base);
            // An http:// URL asks for plain HTTP; object_store refuses it unless allowed.
            if url.scheme() == "http"
                && !options.store.iter().any(|(k, _)| k.ends_with("allow_http"))
            {
                b = b.with_config(ClientConfigKey::AllowHttp, "true");
            }
            for (k, v) in &options.store {
                let key = ClientConfigKey::from_str(k).map_err(|_| unknown(k, "HTTP"))?;
                b = b.with_config(key, v.clone());
            }
            built(
                b.with_retry(retry)
                    .with_http_connector(connector())
                    .build()
                    .map(|s| Arc::new(s) as _),
            )?
        }
        ObjectStoreScheme::Local => {
            return Err(fail(
                "a file:// URL is a local path; open it as a path".into(),
            ));
        }
        other => return Err(fail(format!("{other:?} stores are not supported"))),
    };
    Ok((store, root))
}

/// One requested range served by a GET.
#[derive(Debug, Clone, Copy)]
struct Part {
    /// The request's index in its batch.
    index: usize,
    /// The range as the caller asked for it (for error messages).
    range: ReadRange,
    /// Where its bytes start in the GET's bytes.
    offset_in_read: u64,
    /// Its length; `None` takes all the GET's bytes (whole-object and suffix requests).
    len: Option<u64>,
}

/// A planned GET.
#[derive(Debug)]
struct Op {
    key: Arc<Path>,
    range: ReadRange,
    parts: Vec<Part>,
}

impl Op {
    /// Bytes charged to the budget when the GET is issued.
    fn charge(&self, whole: u64) -> u64 {
        match self.range {
            ReadRange::Bounded { len, .. } => len,
            ReadRange::Suffix(n) => n,
            ReadRange::Whole => whole,
        }
    }
}

/// Groups requests by object and plans the GETs: coalesced bounded ranges, one GET per distinct
/// suffix length, one GET for all whole-object requests.
fn plan(requests: &[ReadRequest], limits: CoalesceLimits) -> Vec<Op> {
    #[derive(Default)]
    struct ObjectReqs {
        bounded: Vec<(u64, u64)>,
        bounded_index: Vec<usize>,
        whole: Vec<usize>,
        suffix: Vec<(u64, usize)>,
    }
    let mut objects: Vec<(Arc<Path>, ObjectReqs)> = Vec::new();
    let mut by_key: HashMap<&Path, usize> = HashMap::new();
    for (index, r) in requests.iter().enumerate() {
        let i = *by_key.entry(&*r.path).or_insert_with(|| {
            objects.push((Arc::clone(&r.path), ObjectReqs::default()));
            objects.len() - 1
        });
        let o = &mut objects[i].1;
        match r.range {
            ReadRange::Bounded { offset, len } => {
                o.bounded.push((offset, len));
                o.bounded_index.push(index);
            }
            ReadRange::Whole => o.whole.push(index),
            ReadRange::Suffix(n) => o.suffix.push((n, index)),
        }
    }
    let mut ops = Vec::new();
    for (key, o) in objects {
        for (m, members) in coalesce(&o.bounded, limits).iter() {
            ops.push(Op {
                key: Arc::clone(&key),
                range: ReadRange::new(m.offset, m.len),
                parts: members
                    .iter()
                    .map(|mem| {
                        let (offset, len) = o.bounded[mem.index];
                        Part {
                            index: o.bounded_index[mem.index],
                            range: ReadRange::new(offset, len),
                            offset_in_read: mem.offset_in_read,
                            len: Some(len),
                        }
                    })
                    .collect(),
            });
        }
        let whole_part = |index, range| Part {
            index,
            range,
            offset_in_read: 0,
            len: None,
        };
        if !o.whole.is_empty() {
            ops.push(Op {
                key: Arc::clone(&key),
                range: ReadRange::Whole,
                parts: o
                    .whole
                    .into_iter()
                    .map(|i| whole_part(i, ReadRange::Whole))
                    .collect(),
            });
        }
        let mut suffix = o.suffix;
        suffix.sort_unstable_by_key(|&(n, _)| n);
        for group in suffix.chunk_by(|a, b| a.0 == b.0) {
            let range = ReadRange::Suffix(group[0].0);
            ops.push(Op {
                key: Arc::clone(&key),
                range,
                parts: group.iter().map(|&(_, i)| whole_part(i, range)).collect(),
            });
        }
    }
    ops
}

/// Results sent to a batch in one message; the permit is released when the consumer takes it.
#[derive(Debug)]
struct Delivery {
    done: Vec<(usize, Result<Bytes, IoError>)>,
    permit: Option<Permit>,
}

/// What every request of an engine shares.
struct Shared {
    store: Arc<dyn ObjectStore>,
    root: ObjectPath,
    /// The root's URL, without a trailing `/`.
    url: String,
    coalesce: CoalesceLimits,
    budget: Arc<Budget>,
    slots: Arc<Semaphore>,
    max_concurrency: usize,
    whole_object_charge: u64,
    counters: Arc<Counters>,
    runtime: &'static tokio::runtime::Runtime,
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
#[derive(Clone)]
pub struct ObjectEngine {
    shared: Arc<Shared>,
}

impl fmt::Debug for ObjectEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectEngine")
            .field("url", &self.shared.url)
            .field("coalesce", &self.shared.coalesce)
            .field("max_concurrency", &self.shared.max_concurrency)
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
    /// `anon = true` sends unsigned requests (public buckets). `max_retries`, `retry_timeout`
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
        let counters = Arc::new(Counters::default());
        let (store, root) = build_store(url, &options, config.retry.to_object_store(), &counters)?;
        Self::with_store(store, root, url.to_string(), &config, counters)
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
                Self::with_store(store, ObjectPath::ROOT, c.to_string(), &config, counters)?,
                key,
            )),
            None => Ok((
                Self::with_store(store, root, url.to_string(), &config, counters)?,
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
        type Engines = parking_lot::Mutex<HashMap<String, std::sync::Weak<Shared>>>;
        static ENGINES: OnceLock<Engines> = OnceLock::new();
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
            return Ok((ObjectEngine { shared }, root.as_ref().to_string()));
        }
        let (engine, key) = Self::open_container(url, options, config)?;
        // Only engines rooted at the container serve other URLs in it.
        if engine.url() == container {
            let mut map = engines.lock();
            map.retain(|_, weak| weak.strong_count() > 0);
            map.insert(id, Arc::downgrade(&engine.shared));
        }
        Ok((engine, key))
    }

    /// Whether `self` and `other` are the same engine (clones of one another).
    pub fn same_engine(&self, other: &ObjectEngine) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// An engine over an existing store (tests use an in-memory one).
    fn with_store(
        store: Arc<dyn ObjectStore>,
        root: ObjectPath,
        url: String,
        config: &ObjectConfig,
        counters: Arc<Counters>,
    ) -> Result<ObjectEngine, EngineError> {
        if config.max_concurrency == 0 {
            return Err(EngineError::Config(
                "max_concurrency must be at least 1".into(),
            ));
        }
        let runtime = runtime()?;
        Ok(ObjectEngine {
            shared: Arc::new(Shared {
                store,
                root,
                url,
                coalesce: config.coalesce,
                budget: config
                    .budget
                    .clone()
                    .unwrap_or_else(|| Arc::clone(Budget::global())),
                slots: Arc::new(Semaphore::new(config.max_concurrency)),
                max_concurrency: config.max_concurrency,
                whole_object_charge: config.whole_object_charge,
                counters,
                runtime,
            }),
        })
    }

    /// The root URL (without a trailing `/`).
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// The full URL of `key` (relative to the root).
    pub fn url_of(&self, key: &Path) -> String {
        self.shared.url_of(key).to_string_lossy().into_owned()
    }

    /// The coalescing limits.
    pub fn coalesce_limits(&self) -> CoalesceLimits {
        self.shared.coalesce
    }

    /// GETs in flight at most.
    pub fn max_concurrency(&self) -> usize {
        self.shared.max_concurrency
    }

    /// The engine's counters now.
    pub fn metrics(&self) -> ObjectMetrics {
        self.shared.counters.snapshot()
    }

    /// Runs `fut` on the engine's runtime and waits for its output, from any thread (also one
    /// inside another tokio runtime). `None` if the runtime dropped it.
    fn wait<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.shared.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
    }

    /// Every object under `prefix` (a key relative to the root; `""` for all): its key relative
    /// to the root and its size. One paginated LIST.
    pub fn list(&self, prefix: &Path) -> std::io::Result<Vec<(String, u64)>> {
        let shared = Arc::clone(&self.shared);
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
        let shared = Arc::clone(&self.shared);
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
        self.shared.location(key).ok_or_else(|| {
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
        let shared = &self.shared;
        Counters::add(&shared.counters.requests, requests.len() as u64);
        let (tx, rx) = crossbeam_channel::unbounded();
        let cancel = Arc::new(AtomicBool::new(false));
        let ops = plan(&requests, shared.coalesce);
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
                        path: self.shared.url_of(&req.path),
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
    let kind = match e {
        object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => std::io::ErrorKind::PermissionDenied,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. } => {
            std::io::ErrorKind::Unsupported
        }
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, format!("listing {what}: {e}"))
}

/// Issues a batch's GETs, each once the budget and a concurrency slot allow, until done or
/// the batch is dropped.
async fn drive(shared: Arc<Shared>, ops: Vec<Op>, tx: Sender<Delivery>, cancel: Arc<AtomicBool>) {
    for op in ops {
        if cancel.load(Ordering::Acquire) {
            return;
        }
        let charge = op.charge(shared.whole_object_charge);
        let permit = match shared.budget.try_acquire(charge) {
            Some(p) => p,
            None => {
                let budget = Arc::clone(&shared.budget);
                let give_up = Arc::clone(&cancel);
                let waited = tokio::task::spawn_blocking(move || {
                    budget.acquire(charge, || give_up.load(Ordering::Acquire))
                })
                .await;
                match waited {
                    Ok(Some(p)) => p,
                    // Cancelled (the batch was dropped) or the runtime is stopping.
                    _ => return,
                }
            }
        };
        let Ok(slot) = Arc::clone(&shared.slots).acquire_owned().await else {
            return;
        };
        let shared = Arc::clone(&shared);
        let tx = tx.clone();
        tokio::spawn(async move {
            let done = run_op(&shared, &op, Some(permit)).await;
            drop(slot);
            // A dropped batch no longer listens; the permit is released right here then.
            let _ = tx.send(done);
        });
    }
}

/// Performs one GET and cuts each request's bytes out of it.
async fn run_op(shared: &Shared, op: &Op, mut permit: Option<Permit>) -> Delivery {
    let url = || shared.url_of(&op.key);
    let serve = |data: &Bytes, parts: &[Part]| -> Vec<(usize, Result<Bytes, IoError>)> {
        parts
            .iter()
            .map(|p| {
                let start = p.offset_in_read as usize;
                let bytes = match p.len {
                    Some(len) => data.slice(start..start + len as usize),
                    None => data.clone(),
                };
                (p.index, Ok(bytes))
            })
            .collect()
    };
    let fail = |err: &IoError, permit: Option<Permit>| {
        Counters::add(&shared.counters.errors, op.parts.len() as u64);
        Delivery {
            done: op
                .parts
                .iter()
                .map(|p| (p.index, Err(err.with_range(p.range))))
                .collect(),
            permit,
        }
    };
    let get_range = match op.range {
        // Nothing to fetch: zero-length ranges are served without a request.
        ReadRange::Bounded { len: 0, .. } | ReadRange::Suffix(0) => {
            return Delivery {
                done: serve(&Bytes::new(), &op.parts),
                permit: None,
            };
        }
        ReadRange::Bounded { offset, len } => Some(GetRange::Bounded(offset..offset + len)),
        ReadRange::Suffix(n) => Some(GetRange::Suffix(n)),
        ReadRange::Whole => None,
    };
    let Some(location) = shared.location(&op.key) else {
        let err = IoError::Io {
            path: url(),
            range: op.range,
            source: Arc::new(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the object key is not valid UTF-8",
            )),
        };
        return fail(&err, permit);
    };
    Counters::add(&shared.counters.gets, 1);
    let options = GetOptions::default().with_range(get_range);
    let got = match shared.store.get_opts(&location, options).await {
        Ok(r) => {
            let size = r.meta.size;
            r.bytes().await.map(|b| (b, size))
        }
        Err(e) => Err(e),
    };
    let (data, object_len) = match got {
        Ok(got) => got,
        Err(e) => {
            let err = classify(shared, &location, op.range, url(), e).await;
            return fail(&err, permit);
        }
    };
    Counters::add(&shared.counters.bytes_read, data.len() as u64);
    if op.range == ReadRange::Whole
        && let Some(p) = permit.as_mut()
    {
        p.resize(data.len() as u64);
    }
    let wanted = match op.range {
        ReadRange::Bounded { len, .. } => len,
        ReadRange::Suffix(n) => n,
        ReadRange::Whole => data.len() as u64,
    };
    if data.len() as u64 >= wanted {
        // Never longer, unless a server sent more than was asked for.
        let data = match op.range {
            _ if data.len() as u64 == wanted => data,
            ReadRange::Suffix(_) => data.slice(data.len() - wanted as usize..),
            _ => data.slice(..wanted as usize),
        };
        return Delivery {
            done: serve(&data, &op.parts),
            permit,
        };
    }
    // The object ended before the range did: requests inside the bytes obtained succeed, the
    // others are past the end.
    let got = data.len() as u64;
    let mut errors = 0;
    let done = op
        .parts
        .iter()
        .map(|p| {
            let fits = p
                .len
                .is_some_and(|len| p.offset_in_read.saturating_add(len) <= got);
            if fits {
                let start = p.offset_in_read as usize;
                let len = p.len.unwrap_or(0) as usize;
                (p.index, Ok(data.slice(start..start + len)))
            } else {
                errors += 1;
                (
                    p.index,
                    Err(IoError::RangePastEof {
                        path: url(),
                        range: p.range,
                        file_len: object_len,
                    }),
                )
            }
        })
        .collect();
    Counters::add(&shared.counters.errors, errors);
    Delivery { done, permit }
}

/// Maps a failed GET to an [`IoError`]. A ranged GET that failed otherwise than "not found" or
/// "denied" may have asked for bytes past the end of the object (`416 Range Not Satisfiable`
/// comes back as a generic error): one HEAD tells.
async fn classify(
    shared: &Shared,
    location: &ObjectPath,
    range: ReadRange,
    path: Arc<Path>,
    e: object_store::Error,
) -> IoError {
    match e {
        object_store::Error::NotFound { .. } => IoError::NotFound { path, range },
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => {
            log::debug!("zcrop-io: {}: {e}", path.display());
            IoError::PermissionDenied { path, range }
        }
        e => {
            if range != ReadRange::Whole {
                match shared.store.head(location).await {
                    Ok(meta) if range.resolve(meta.size).is_none() => {
                        return IoError::RangePastEof {
                            path,
                            range,
                            file_len: meta.size,
                        };
                    }
                    Err(object_store::Error::NotFound { .. }) => {
                        return IoError::NotFound { path, range };
                    }
                    _ => {}
                }
            }
            IoError::Io {
                path,
                range,
                source: Arc::new(std::io::Error::other(e)),
            }
        }
    }
}

/// The results of one [`ObjectEngine::submit`], in completion order. Iterating blocks until
/// the next result arrives and ends after the last one. Dropping it early is fine: no further
/// GETs are issued, and those in flight finish and are discarded.
#[derive(Debug)]
pub struct ObjectBatch {
    rx: Receiver<Delivery>,
    ready: VecDeque<Completion>,
    remaining: usize,
    requests: Vec<ReadRequest>,
    delivered: Vec<bool>,
    cancel: Arc<AtomicBool>,
    engine: ObjectEngine,
}

impl ObjectBatch {
    /// Results not yet returned.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    fn take(&mut self, d: Delivery) {
        for (i, result) in d.done {
            if !std::mem::replace(&mut self.delivered[i], true) {
                self.ready.push_back(Completion {
                    id: self.requests[i].id,
                    result,
                });
            }
        }
        drop(d.permit);
    }

    /// The runtime dropped the batch's work (it is shutting down): every request not yet
    /// answered fails with [`IoError::Shutdown`].
    fn fail_rest(&mut self) {
        for (i, r) in self.requests.iter().enumerate() {
            if !std::mem::replace(&mut self.delivered[i], true) {
                self.ready.push_back(Completion {
                    id: r.id,
                    result: Err(IoError::Shutdown {
                        path: self.engine.shared.url_of(&r.path),
                        range: r.range,
                    }),
                });
            }
        }
    }
}

impl Iterator for ObjectBatch {
    type Item = Completion;

    fn next(&mut self) -> Option<Completion> {
        loop {
            if let Some(c) = self.ready.pop_front() {
                self.remaining -= 1;
                return Some(c);
            }
            if self.remaining == 0 {
                return None;
            }
            match self.rx.recv() {
                Ok(d) => self.take(d),
                Err(_) => {
                    self.fail_rest();
                    if self.ready.is_empty() {
                        self.remaining = 0;
                        return None;
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.ready.len(), Some(self.remaining))
    }
}

impl Drop for ObjectBatch {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

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
        let ops = plan(&requests, CoalesceLimits::OBJECT);
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
