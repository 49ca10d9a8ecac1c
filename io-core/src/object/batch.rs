//! Running GETs and handing their results over: the async driver of one batch (each GET
//! under the concurrency limit and the in-flight budget, its errors classified) and
//! [`ObjectBatch`], the synchronous iterator of its [`Completion`]s.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use futures_util::future::{Either, select};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt};

use crate::budget::Permit;
use crate::error::IoError;
use crate::request::{Completion, ReadRange, ReadRequest};

use super::client::Counters;
use super::plan::{Op, Part};
use super::{ObjectEngine, Shared};

/// Results sent to a batch in one message; the permit is released when the consumer takes it.
#[derive(Debug)]
pub(crate) struct Delivery {
    done: Vec<(usize, Result<Bytes, IoError>)>,
    permit: Option<Permit>,
    /// How long the GET's answer took to start (its headers), when it succeeded.
    first_byte: Option<Duration>,
}

/// Issues a batch's GETs, each once the budget and a concurrency slot allow, until done or
/// the batch is dropped.
pub(crate) async fn drive(
    shared: Arc<Shared>,
    ops: Vec<Op>,
    tx: Sender<Delivery>,
    cancel: Arc<AtomicBool>,
) {
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
        let Some(slot) = shared.limiter.acquire().await else {
            return;
        };
        let shared = Arc::clone(&shared);
        let tx = tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let done = run_op(&shared, &op, Some(permit)).await;
            // A GET's time says how loaded the store is only when it succeeded.
            let ok = done.done.iter().all(|(_, r)| r.is_ok());
            let throttled = shared.counters.http_throttled.load(Ordering::Relaxed);
            let bytes = match op.range {
                ReadRange::Bounded { len, .. } => len,
                ReadRange::Suffix(n) => n,
                ReadRange::Whole => done
                    .done
                    .first()
                    .and_then(|(_, r)| r.as_ref().ok())
                    .map_or(0, |b| b.len() as u64),
            };
            let took = ok.then(|| started.elapsed());
            slot.finish(took, done.first_byte, bytes, throttled);
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
            first_byte: None,
        }
    };
    let get_range = match op.range {
        // Nothing to fetch: zero-length ranges are served without a request.
        ReadRange::Bounded { len: 0, .. } | ReadRange::Suffix(0) => {
            return Delivery {
                done: serve(&Bytes::new(), &op.parts),
                permit: None,
                first_byte: None,
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
    let retry = shared.config.retry;
    let first_try = Instant::now();
    let mut tries = 0;
    let mut first_byte = None;
    let (data, object_len) = loop {
        let asked = Instant::now();
        let got = match get_hedged(shared, &location, get_range.as_ref()).await {
            Ok(r) => {
                first_byte = Some(asked.elapsed());
                let size = r.meta.size;
                r.bytes().await.map(|b| (b, size))
            }
            Err(e) => Err(e),
        };
        let short = got.as_ref().is_err_and(is_unexpected_range);
        if short && tries < retry.max_retries && first_try.elapsed() < retry.retry_timeout {
            // An answer with fewer bytes than asked, of an object that has them: the HTTP
            // client does not retry it; try again as it would after a failure.
            Counters::add(&shared.counters.short_answers, 1);
            let wait = retry.initial_backoff.as_secs_f64() * retry.backoff_base.powi(tries as i32);
            tokio::time::sleep(Duration::from_secs_f64(wait).min(retry.max_backoff)).await;
            tries += 1;
            continue;
        }
        match got {
            Ok(got) => break got,
            Err(e) => {
                let err = classify(shared, &location, op.range, url(), e).await;
                return fail(&err, permit);
            }
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
            first_byte,
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
    Delivery {
        done,
        permit,
        first_byte,
    }
}

/// Sends a GET and waits for its answer to start (its headers). If none has come after the
/// hedging delay (the slowest recent first bytes', see [`Limiter::hedge_delay`]), sends the
/// same GET again: the first answer wins, the other request is dropped. A straggler (a slow
/// server, a lost packet) then costs about that delay instead of its whole time.
///
/// [`Limiter::hedge_delay`]: super::limit::Limiter::hedge_delay
async fn get_hedged(
    shared: &Shared,
    location: &ObjectPath,
    range: Option<&GetRange>,
) -> object_store::Result<object_store::GetResult> {
    let get = || {
        let options = GetOptions::default().with_range(range.cloned());
        shared.store.get_opts(location, options)
    };
    let Some(delay) = shared.limiter.hedge_delay() else {
        return get().await;
    };
    let first = std::pin::pin!(get());
    let wait = std::pin::pin!(tokio::time::sleep(delay));
    let first = match select(first, wait).await {
        Either::Left((answer, _)) => return answer,
        Either::Right(((), first)) => first,
    };
    Counters::add(&shared.counters.hedged, 1);
    let second = std::pin::pin!(get());
    match select(first, second).await {
        Either::Left((answer, _)) | Either::Right((answer, _)) => answer,
    }
}

/// Whether `object_store` refused an answer because its `Content-Range` is not the range
/// asked for (its `UnexpectedRange`, which it does not export: recognised by its message,
/// `Requested {expected:?}, got {actual:?}`; io-core/tests/cloudsim.rs pins it).
fn is_unexpected_range(e: &object_store::Error) -> bool {
    match e {
        object_store::Error::Generic { source, .. } => {
            let msg = source.to_string();
            msg.starts_with("Requested ") && msg.contains(", got ")
        }
        _ => false,
    }
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
            IoError::PermissionDenied {
                path,
                range,
                reason: Some(denial_reason(&e.to_string()).into()),
            }
        }
        e if is_credential_fetch(&e.to_string()) => IoError::PermissionDenied {
            path,
            range,
            reason: Some(no_credentials_reason(&e.to_string()).into()),
        },
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

/// Whether an error is the S3 client's failure to fetch credentials from the instance
/// metadata service (what it tries when none were given or found in the environment).
fn is_credential_fetch(msg: &str) -> bool {
    msg.contains("/latest/api/token") || msg.contains("/latest/meta-data")
}

/// What to say when no credentials were found (`msg`: the metadata service's failure).
fn no_credentials_reason(msg: &str) -> String {
    let first = msg.lines().next().unwrap_or(msg);
    // Without the XML error document the service's answer may start on that line.
    let first = first
        .split("<?xml")
        .next()
        .unwrap_or(first)
        .trim_end_matches([' ', ':']);
    format!(
        "no credentials found: none in storage_options (key and secret), none in the \
         environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a web identity or container \
         credentials), and the instance metadata service gave none ({first}); pass them, or \
         anon=True for a public bucket"
    )
}

/// What a denial means, from the S3 error code in the store's answer (`msg`), when there is
/// one: expired or wrong credentials, or credentials that may not read the object.
fn denial_reason(msg: &str) -> String {
    let code = msg
        .split("<Code>")
        .nth(1)
        .and_then(|rest| rest.split("</Code>").next())
        .unwrap_or("");
    match code {
        "ExpiredToken" | "TokenRefreshRequired" => {
            "the store answered ExpiredToken: the credentials have expired; refresh them".into()
        }
        "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "InvalidToken" => {
            format!("the store answered {code}: the key, secret or session token is wrong")
        }
        "" => "the store refused the request".into(),
        code => format!(
            "the store answered {code}: the credentials may not read it (for a public bucket, \
             anon=True sends unsigned requests)"
        ),
    }
}

/// The results of one [`ObjectEngine::submit`], in completion order. Iterating blocks until
/// the next result arrives and ends after the last one. Dropping it early is fine: no further
/// GETs are issued, and those in flight finish and are discarded.
#[derive(Debug)]
pub struct ObjectBatch {
    pub(super) rx: Receiver<Delivery>,
    pub(super) ready: VecDeque<Completion>,
    pub(super) remaining: usize,
    pub(super) requests: Vec<ReadRequest>,
    pub(super) delivered: Vec<bool>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) engine: ObjectEngine,
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
