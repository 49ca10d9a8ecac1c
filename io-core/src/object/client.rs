//! The HTTP side: the process's tokio runtime and TLS provider, the `object_store` client of
//! each scheme (S3, GCS, Azure, HTTP) built from a URL and options, and the connector that
//! counts the requests it sends ([`ObjectMetrics`]).

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::fork::PerProcess;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService, ReqwestConnector,
};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};

use crate::error::EngineError;

use super::config::{Options, endpoint_is_http, gcs_base_is_http};

/// A snapshot of an [`ObjectEngine`](crate::ObjectEngine)'s counters. Subtract two to measure a span.
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
    /// Among them, the store's requests to slow down (503, 429).
    pub http_throttled: u64,
    /// Answers with fewer bytes than asked (of an object that has them), tried again.
    pub short_answers: u64,
    /// GETs sent a second time because their answer was late (hedged).
    pub hedged: u64,
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
            http_throttled: self.http_throttled - o.http_throttled,
            short_answers: self.short_answers - o.short_answers,
            hedged: self.hedged - o.hedged,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) requests: AtomicU64,
    pub(crate) gets: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) errors: AtomicU64,
    http_gets: AtomicU64,
    http_other: AtomicU64,
    http_failures: AtomicU64,
    pub(crate) http_throttled: AtomicU64,
    pub(crate) short_answers: AtomicU64,
    pub(crate) hedged: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ObjectMetrics {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ObjectMetrics {
            requests: l(&self.requests),
            gets: l(&self.gets),
            bytes_read: l(&self.bytes_read),
            errors: l(&self.errors),
            http_gets: l(&self.http_gets),
            http_other: l(&self.http_other),
            http_failures: l(&self.http_failures),
            http_throttled: l(&self.http_throttled),
            short_answers: l(&self.short_answers),
            hedged: l(&self.hedged),
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
        let status = res.as_ref().ok().map(|r| r.status().as_u16());
        let throttled = matches!(status, Some(503 | 429));
        if throttled || status.is_none_or(|s| s >= 500) {
            Counters::add(&c.http_failures, 1);
        }
        if throttled {
            Counters::add(&c.http_throttled, 1);
        }
        res
    }
}

/// The process's runtime for object-store requests, started on first use (in each process: a
/// child of `fork` starts its own). Its size comes from `ZCROP_OBJECT_THREADS`, else the
/// number of cores (2 to 8).
pub(crate) fn runtime() -> Result<&'static tokio::runtime::Runtime, EngineError> {
    static RUNTIME: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    RUNTIME.get_or_try_init(|| {
        let threads = match std::env::var("ZCROP_OBJECT_THREADS") {
            Ok(v) if !v.is_empty() => v.parse::<usize>().map_err(|_| {
                EngineError::Config(format!("ZCROP_OBJECT_THREADS={v:?} is not a number"))
            })?,
            _ => std::thread::available_parallelism()
                .map_or(2, std::num::NonZero::get)
                .clamp(2, 8),
        };
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("zcrop-object")
            .enable_all()
            .build()
            .map_err(EngineError::Spawn)
    })
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

/// Builds the store for `url` with `options`; returns it and the root path inside it.
pub(crate) fn build_store(
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
            let mut b = GoogleCloudStorageBuilder::from_env().with_url(url_str);
            if gcs_base_is_http(&options.store)
                && !options.store.iter().any(|(k, _)| k.ends_with("allow_http"))
            {
                b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::AllowHttp), "true");
            }
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
