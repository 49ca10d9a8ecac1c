//! The server: S3-style path addressing (`/bucket/key`) over a directory (`root/bucket/key`),
//! GET and HEAD with `Range`, every response shaped and counted, faults injected on request,
//! and a control API under `/_cloudsim/` (not a valid bucket name, so it cannot shadow one).

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::faults::{Fault, FaultKind, Faults};
use crate::shaping::{Pacer, Shaping, piece_size};
use crate::stats::{Counters, Gauge, Stats};

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// How late tokio's timer fires on average (its resolution is a millisecond).
const TIMER_LATENESS: Duration = Duration::from_millis(1);

/// What every connection shares.
struct State {
    root: PathBuf,
    shaping: Mutex<Shaping>,
    total: Mutex<Pacer>,
    counters: Arc<Counters>,
    faults: Mutex<Faults>,
    seq: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    fn set_shaping(&self, shaping: Shaping) -> Result<(), String> {
        shaping.validate()?;
        lock(&self.total).set_rate(shaping.total_bytes_per_s);
        *lock(&self.shaping) = shaping;
        Ok(())
    }
}

/// A running simulator, on its own thread and tokio runtime; stopped when dropped.
pub struct Server {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves the buckets under `root` (each a directory) on `addr` (port 0 for a free one),
    /// shaped by `shaping`, with `threads` runtime threads.
    pub fn start(
        root: impl Into<PathBuf>,
        addr: SocketAddr,
        shaping: Shaping,
        threads: usize,
    ) -> io::Result<Server> {
        shaping
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            root: root.into(),
            total: Mutex::new(Pacer::new(shaping.total_bytes_per_s)),
            shaping: Mutex::new(shaping),
            counters: Arc::default(),
            faults: Mutex::default(),
            seq: AtomicU64::new(0),
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("cloudsim")
            .enable_all()
            .build()?;
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::clone(&state);
        let thread = std::thread::Builder::new()
            .name("cloudsim-accept".into())
            .spawn(move || runtime.block_on(accept(listener, shared, stopped)))?;
        Ok(Server {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, the endpoint URL clients are given.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The counters since the last reset.
    pub fn stats(&self) -> Stats {
        self.state.counters.snapshot()
    }

    /// Zeroes the counters.
    pub fn reset_stats(&self) {
        self.state.counters.reset();
    }

    /// The shaping in force.
    pub fn shaping(&self) -> Shaping {
        lock(&self.state.shaping).clone()
    }

    /// Changes the shaping for requests that arrive from now on.
    pub fn set_shaping(&self, shaping: Shaping) -> Result<(), String> {
        self.state.set_shaping(shaping)
    }

    /// Arms a fault rule.
    pub fn inject(&self, fault: Fault) {
        lock(&self.state.faults).add(fault);
    }

    /// Disarms every fault rule.
    pub fn clear_faults(&self) {
        lock(&self.state.faults).clear();
    }

    /// Blocks until the server stops (for the command line, which never stops it).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept(
    listener: std::net::TcpListener,
    state: Arc<State>,
    mut stopped: watch::Receiver<bool>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zcrop-cloudsim: cannot listen: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, Arc::clone(&state)));
                }
                // Out of file descriptors and the like: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            _ = stopped.changed() => return,
        }
    }
}

async fn connection(stream: tokio::net::TcpStream, state: Arc<State>) {
    let _open = Gauge::connection(&state.counters);
    let conn = Arc::new(Mutex::new(Pacer::new(0.0)));
    let service = service_fn(move |req| handle(req, Arc::clone(&state), Arc::clone(&conn)));
    // Errors here are the client's (it went away) or injected faults: nothing to report.
    let _ = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
    conn: Arc<Mutex<Pacer>>,
) -> io::Result<Response<Body>> {
    let path = req.uri().path().to_owned();
    if let Some(command) = path.strip_prefix("/_cloudsim/") {
        return Ok(control(command, req, &state).await);
    }
    let flight = Gauge::request(&state.counters);
    let counters = &state.counters;
    counters.requests.fetch_add(1, Relaxed);
    let head = match *req.method() {
        Method::GET => false,
        Method::HEAD => true,
        _ => {
            return Ok(s3_error(
                counters,
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                &path,
            ));
        }
    };
    (if head {
        &counters.heads
    } else {
        &counters.gets
    })
    .fetch_add(1, Relaxed);

    let n = state.seq.fetch_add(1, Relaxed);
    let shaping = lock(&state.shaping).clone();
    let fault = lock(&state.faults).take(&path);
    if fault.is_some() {
        counters.faults.fetch_add(1, Relaxed);
    }
    let delay = shaping.first_byte_delay(n);
    if !delay.is_zero() {
        // tokio's timer rounds a deadline up to its next millisecond and fires about a
        // millisecond late on average: aim that much early.
        tokio::time::sleep(delay.saturating_sub(TIMER_LATENESS)).await;
    }
    match fault {
        Some(FaultKind::SlowDown) => {
            return Ok(s3_error(
                counters,
                StatusCode::SERVICE_UNAVAILABLE,
                "SlowDown",
                &path,
            ));
        }
        Some(FaultKind::InternalError) => {
            return Ok(s3_error(
                counters,
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                &path,
            ));
        }
        Some(FaultKind::AccessDenied) => {
            return Ok(s3_error(
                counters,
                StatusCode::FORBIDDEN,
                "AccessDenied",
                &path,
            ));
        }
        Some(FaultKind::ExpiredToken) => {
            return Ok(s3_error(
                counters,
                StatusCode::FORBIDDEN,
                "ExpiredToken",
                &path,
            ));
        }
        Some(FaultKind::Reset) => {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "injected reset",
            ));
        }
        _ => {}
    }

    let Some((bucket, key)) = split_path(&path) else {
        return Ok(s3_error(
            counters,
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            &path,
        ));
    };
    let bucket_dir = state.root.join(&bucket);
    if !bucket_dir.is_dir() {
        return Ok(s3_error(
            counters,
            StatusCode::NOT_FOUND,
            "NoSuchBucket",
            &path,
        ));
    }
    if key.as_os_str().is_empty() {
        if head {
            let mut resp = Response::new(empty());
            resp.headers_mut()
                .insert("x-amz-bucket-region", HeaderValue::from_static("us-east-1"));
            return Ok(resp);
        }
        // Listing is not needed to read arrays, and not served.
        return Ok(s3_error(
            counters,
            StatusCode::NOT_IMPLEMENTED,
            "NotImplemented",
            &path,
        ));
    }
    let file_path = bucket_dir.join(&key);
    let (file, meta) =
        match std::fs::File::open(&file_path).and_then(|f| f.metadata().map(|m| (f, m))) {
            Ok((f, m)) if m.is_file() => (f, m),
            _ => {
                return Ok(s3_error(
                    counters,
                    StatusCode::NOT_FOUND,
                    "NoSuchKey",
                    &path,
                ));
            }
        };
    let size = meta.len();
    let range = match req.headers().get(header::RANGE) {
        None => Some((0, size)),
        Some(v) => match v.to_str().ok().and_then(|v| parse_range(v, size)) {
            Some(r) => Some(r),
            None => {
                let mut resp = s3_error(
                    counters,
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "InvalidRange",
                    &path,
                );
                resp.headers_mut()
                    .insert(header::CONTENT_RANGE, value(&format!("bytes */{size}")));
                return Ok(resp);
            }
        },
    };
    let partial = req.headers().contains_key(header::RANGE);
    let (start, mut end) = range.unwrap_or((0, size));
    let full_len = end - start;
    if fault == Some(FaultKind::Truncate) && !head {
        end = start + full_len / 2;
    }
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let mut resp = Response::new(empty());
    let headers = resp.headers_mut();
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::LAST_MODIFIED, value(&http_date(modified)));
    let mtime = modified
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    headers.insert(header::ETAG, value(&format!("\"{size:x}-{mtime:x}\"")));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    let declared = if fault == Some(FaultKind::Short) {
        full_len
    } else {
        end - start
    };
    headers.insert(header::CONTENT_LENGTH, value(&declared.to_string()));
    if partial {
        *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
        let last = (start + declared).max(start + 1) - 1;
        resp.headers_mut().insert(
            header::CONTENT_RANGE,
            value(&format!("bytes {start}-{last}/{size}")),
        );
    }
    if head {
        return Ok(resp);
    }
    let sent = match fault {
        Some(FaultKind::Short | FaultKind::Stall) => full_len / 2,
        _ => end - start,
    };
    let data = read_at(file, start, sent).await?;
    let stall = fault == Some(FaultKind::Stall);
    let cut = fault == Some(FaultKind::Short);
    *resp.body_mut() = shaped_body(data, &shaping, &state, conn, flight, stall, cut);
    Ok(resp)
}

/// Reads `len` bytes of `file` at `offset`, off the runtime's threads when large.
async fn read_at(file: std::fs::File, offset: u64, len: u64) -> io::Result<Bytes> {
    let read = move || {
        let mut buf = vec![0u8; len as usize];
        file.read_exact_at(&mut buf, offset)?;
        Ok::<_, io::Error>(Bytes::from(buf))
    };
    if len <= 64 << 10 {
        read()
    } else {
        tokio::task::spawn_blocking(read)
            .await
            .map_err(io::Error::other)?
    }
}

/// The body of `data`, sent in pieces paced by the connection's and the server's caps;
/// `stall` holds the connection after the data, `cut` ends it with an error (the connection
/// closes before the declared length).
fn shaped_body(
    data: Bytes,
    shaping: &Shaping,
    state: &Arc<State>,
    conn: Arc<Mutex<Pacer>>,
    flight: Gauge,
    stall: bool,
    cut: bool,
) -> Body {
    lock(&conn).set_rate(shaping.conn_bytes_per_s);
    let piece = piece_size(shaping.conn_bytes_per_s, shaping.total_bytes_per_s);
    let state = Arc::clone(state);
    let pieces = stream::unfold((data, Some(flight)), move |(mut rest, flight)| {
        let (state, conn) = (Arc::clone(&state), Arc::clone(&conn));
        async move {
            if rest.is_empty() {
                if stall {
                    tokio::time::sleep(Duration::from_mins(10)).await;
                }
                if cut || stall {
                    let err =
                        io::Error::new(io::ErrorKind::ConnectionAborted, "injected short body");
                    return flight.map(|_| (Err(err), (rest, None)));
                }
                return None;
            }
            let now_piece = rest.split_to(piece.min(rest.len()));
            let now = Instant::now();
            let conn_done = lock(&conn).reserve(now_piece.len(), now);
            let total_done = lock(&state.total).reserve(now_piece.len(), now);
            if let Some(done) = conn_done.into_iter().chain(total_done).max() {
                // Sent at most a millisecond early: the timer's resolution.
                if done > now + Duration::from_millis(1) {
                    tokio::time::sleep_until(done.into()).await;
                }
            }
            state
                .counters
                .bytes_sent
                .fetch_add(now_piece.len() as u64, Relaxed);
            Some((Ok(now_piece), (rest, flight)))
        }
    });
    StreamBody::new(pieces.map(|r| r.map(Frame::data))).boxed_unsync()
}

async fn control(command: &str, req: Request<Incoming>, state: &State) -> Response<Body> {
    let method = req.method().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            );
        }
    };
    match (command, method) {
        ("stats", Method::GET) => json(&state.counters.snapshot()),
        ("reset", Method::POST) => {
            state.counters.reset();
            json(&state.counters.snapshot())
        }
        ("shaping", Method::GET) => json(&*lock(&state.shaping)),
        ("shaping", Method::PUT | Method::POST) => match serde_json::from_slice::<Shaping>(&body)
            .map_err(|e| e.to_string())
            .and_then(|s| state.set_shaping(s))
        {
            Ok(()) => json(&*lock(&state.shaping)),
            Err(e) => text(StatusCode::BAD_REQUEST, e),
        },
        ("faults", Method::POST) => match serde_json::from_slice::<Fault>(&body) {
            Ok(f) => {
                lock(&state.faults).add(f);
                text(StatusCode::OK, String::new())
            }
            Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
        },
        ("faults", Method::DELETE) => {
            lock(&state.faults).clear();
            text(StatusCode::OK, String::new())
        }
        (other, m) => text(
            StatusCode::NOT_FOUND,
            format!("no control endpoint {m} /_cloudsim/{other}"),
        ),
    }
}

fn empty() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp
}

fn json<T: serde::Serialize>(v: &T) -> Response<Body> {
    let mut resp = text(StatusCode::OK, serde_json::to_string(v).unwrap_or_default());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// An S3 error response: `<Error><Code>...` as S3 writes it.
fn s3_error(counters: &Counters, status: StatusCode, code: &str, resource: &str) -> Response<Body> {
    counters.errors.fetch_add(1, Relaxed);
    let message = status.canonical_reason().unwrap_or("error");
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message>\
         <Resource>{}</Resource><RequestId>zcrop-cloudsim</RequestId></Error>",
        xml_escape(resource)
    );
    let mut resp = text(status, body);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/xml"),
    );
    resp
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `/bucket/key/parts` as (bucket, relative key path), percent-decoded; `None` for a path
/// that leaves its bucket (`..`, absolute parts) or names no bucket.
fn split_path(path: &str) -> Option<(String, PathBuf)> {
    let decoded = percent_decode(path.strip_prefix('/')?)?;
    let (bucket, key) = decoded.split_once('/').unwrap_or((&decoded, ""));
    if bucket.is_empty() || bucket.starts_with('.') {
        return None;
    }
    let key = Path::new(key);
    if !key.components().all(|c| matches!(c, Component::Normal(_))) {
        return None;
    }
    Some((bucket.to_owned(), key.to_path_buf()))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A single `bytes=` range of an object of `size` bytes, as `[start, end)`; `None` where it
/// is malformed, multiple or unsatisfiable.
fn parse_range(header: &str, size: u64) -> Option<(u64, u64)> {
    let spec = header.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().ok()?;
        (size.saturating_sub(n), size)
    } else {
        let start: u64 = a.parse().ok()?;
        let end = if b.is_empty() {
            size
        } else {
            b.parse::<u64>().ok()?.saturating_add(1).min(size)
        };
        (start, end)
    };
    (start < end && start < size).then_some((start, end))
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date(t: SystemTime) -> String {
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_as_s3_reads_them() {
        assert_eq!(parse_range("bytes=0-9", 100), Some((0, 10)));
        assert_eq!(parse_range("bytes=90-", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=-10", 100), Some((90, 100)));
        assert_eq!(parse_range("bytes=-1000", 100), Some((0, 100)));
        assert_eq!(parse_range("bytes=95-200", 100), Some((95, 100)));
        assert_eq!(parse_range("bytes=100-", 100), None);
        assert_eq!(parse_range("bytes=0-1,5-6", 100), None);
        assert_eq!(parse_range("items=0-1", 100), None);
    }

    #[test]
    fn paths_stay_inside_their_bucket() {
        assert_eq!(
            split_path("/b/a.zarr/c/0/1"),
            Some(("b".into(), PathBuf::from("a.zarr/c/0/1")))
        );
        assert_eq!(
            split_path("/b/a%2Fb"),
            Some(("b".into(), PathBuf::from("a/b")))
        );
        assert_eq!(split_path("/b"), Some(("b".into(), PathBuf::new())));
        assert_eq!(split_path("/b/../x"), None);
        assert_eq!(split_path("/../etc/passwd"), None);
        assert_eq!(split_path("/b/%2E%2E/x"), None);
        assert_eq!(split_path("//x"), None);
    }

    #[test]
    fn http_dates_are_rfc_7231() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(http_date(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(http_date(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
    }
}
