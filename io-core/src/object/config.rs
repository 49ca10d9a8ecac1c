//! How an [`ObjectEngine`](super::ObjectEngine) reads: [`ObjectConfig`], [`RetryPolicy`], and
//! the storage options users give (zcrop's own, fsspec's and s3fs's names, and
//! `object_store`'s keys), translated.

use std::sync::Arc;
use std::time::Duration;

use object_store::{BackoffConfig, RetryConfig};

use crate::budget::Budget;
use crate::coalesce::CoalesceLimits;
use crate::error::EngineError;

/// Default cap of the GETs one engine keeps in flight (the adaptive limit's ceiling).
pub const DEFAULT_OBJECT_CONCURRENCY: usize = 512;

/// GETs in flight when an engine starts, before its limit adapts.
pub const INITIAL_OBJECT_CONCURRENCY: usize = 64;

/// The adaptive limit's floor.
pub const MIN_OBJECT_CONCURRENCY: usize = 16;

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
    pub(crate) fn to_object_store(self) -> RetryConfig {
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

/// How an [`ObjectEngine`](crate::ObjectEngine) reads.
#[derive(Debug, Clone)]
pub struct ObjectConfig {
    /// When nearby ranges of one object merge into one GET.
    pub coalesce: CoalesceLimits,
    /// GETs in flight per engine at most: the adaptive limit's ceiling, or the fixed limit.
    pub max_concurrency: usize,
    /// Whether the number of GETs in flight adapts to the store's answers (from
    /// [`INITIAL_OBJECT_CONCURRENCY`], between [`MIN_OBJECT_CONCURRENCY`] and
    /// `max_concurrency`: growing while GETs stay as quick as the quickest recent ones,
    /// falling when they slow down or the store answers 503/429), or stays at
    /// `max_concurrency`.
    pub adaptive_concurrency: bool,
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
            adaptive_concurrency: true,
            budget: None,
            retry: RetryPolicy::default(),
            whole_object_charge: DEFAULT_WHOLE_OBJECT_CHARGE,
        }
    }
}

impl ObjectConfig {
    /// The defaults, overridden by `ZCROP_OBJECT_CONCURRENCY` (the cap),
    /// `ZCROP_OBJECT_ADAPTIVE` (`0` fixes the GETs in flight at the cap) and
    /// `ZCROP_OBJECT_MAX_RETRIES`. Unparsable values are reported as errors, not ignored.
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
        if let Some(n) = num("ZCROP_OBJECT_ADAPTIVE")? {
            c.adaptive_concurrency = n != 0;
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
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `(key, value)` for the store's builder.
    pub(crate) store: Vec<(String, String)>,
    /// Set by `anon` / `anonymous`: unsigned requests.
    pub(crate) anonymous: bool,
}

/// Splits `options` into zcrop's own (applied to `config`) and the store's, translating the
/// names fsspec, s3fs and gcsfs users pass (`anon`, `key`, `secret`, `region_name`; for GCS
/// `endpoint_url`, `token` and `project`). A `gs://` URL with no endpoint follows
/// `STORAGE_EMULATOR_HOST` as Google's clients do (unsigned, unless a token is given).
pub(crate) fn translate_options(
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
    let gcs = url.starts_with("gs://") || url.starts_with("gcs://");
    let mut token = false;
    for (key, value) in options {
        let k = normalise_key(key);
        if gcs {
            match k.as_str() {
                "endpoint_url" | "endpoint" => {
                    out.store.push(("google_base_url".into(), value.clone()));
                    continue;
                }
                // gcsfs's `token`: "anon", Google's default credentials, or a credentials file.
                "token" => {
                    token = true;
                    match value.trim() {
                        "anon" => out.anonymous = true,
                        "google_default" | "cloud" => {}
                        path => out
                            .store
                            .push(("google_application_credentials".into(), path.into())),
                    }
                    continue;
                }
                // Billing projects matter to writes and requester-pays buckets, not to reads.
                "project" => continue,
                _ => {}
            }
        }
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
            // HTTP/2 where the server offers it (ALPN), instead of object_store's HTTP/1.1 only.
            "http2" => out.store.push((
                "http1_only".into(),
                if truthy(value) { "false" } else { "true" }.into(),
            )),
            "key" if !gcs => out.store.push(("access_key_id".into(), value.clone())),
            "secret" if !gcs => out.store.push(("secret_access_key".into(), value.clone())),
            "region_name" if !gcs => out.store.push(("region".into(), value.clone())),
            _ => out.store.push((k, value.clone())),
        }
    }
    let has_base = |o: &Options| o.store.iter().any(|(k, _)| is_gcs_base(k));
    if gcs
        && !has_base(&out)
        && let Some(host) = std::env::var("STORAGE_EMULATOR_HOST")
            .ok()
            .filter(|h| !h.trim().is_empty())
    {
        let host = host.trim();
        let base = if host.contains("://") {
            host.to_string()
        } else {
            format!("http://{host}")
        };
        out.store.push(("google_base_url".into(), base));
        out.anonymous |= !token;
    }
    Ok(out)
}

/// Whether `key` names the GCS base URL.
fn is_gcs_base(key: &str) -> bool {
    matches!(key, "google_base_url" | "base_url")
}

/// Whether the GCS base URL in `options` is plain `http://` (an emulator on loopback): then
/// HTTP is allowed without saying so again.
pub(crate) fn gcs_base_is_http(options: &[(String, String)]) -> bool {
    options
        .iter()
        .any(|(k, v)| is_gcs_base(k) && v.trim().to_ascii_lowercase().starts_with("http://"))
}

/// Whether the S3 endpoint, from `options` or else the environment, is plain `http://` (a
/// local S3-compatible server): then HTTP is allowed without saying so again.
pub(crate) fn endpoint_is_http(options: &[(String, String)]) -> bool {
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
