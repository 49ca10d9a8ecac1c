//! The object engine against zcrop-cloudsim, the loopback store with cloud latency (run
//! in-process): the faults a far store gives (503 SlowDown, resets, bodies that stall or end
//! early, answers with fewer bytes than asked, 403s) end in the data or in a typed error naming
//! URL and range within the retry deadline, never in a hang or a short buffer taken as data;
//! and the number of GETs in flight adapts to the store's latency.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use zcrop_cloudsim::{Fault, FaultKind, Server, Shaping};
use zcrop_fixtures::s3::options_for;
use zcrop_io::{
    INITIAL_OBJECT_CONCURRENCY, IoError, ObjectConfig, ObjectEngine, ReadRange, ReadRequest,
    RetryPolicy,
};

const BUCKET: &str = "sim-bucket";

/// A simulator serving `objects` under `s3://sim-bucket/store/`.
fn serve(objects: &[(&str, Vec<u8>)], shaping: Shaping) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for (key, data) in objects {
        let p = dir.path().join(BUCKET).join("store").join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    (Server::start(dir.path(), addr, shaping, 2).unwrap(), dir)
}

/// Quick retries (3 at most, none started after 5 s) and a 1 s request timeout.
fn quick() -> ObjectConfig {
    ObjectConfig {
        retry: RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(50),
            backoff_base: 2.0,
            retry_timeout: Duration::from_secs(5),
        },
        ..ObjectConfig::default()
    }
}

fn engine(server: &Server, config: ObjectConfig) -> ObjectEngine {
    let mut options = options_for(&server.endpoint());
    options.push(("timeout".into(), "1s".into()));
    ObjectEngine::open(&format!("s3://{BUCKET}/store"), &options, config).unwrap()
}

fn data(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

fn read(e: &ObjectEngine, key: &str, offset: u64, len: u64) -> Result<bytes::Bytes, IoError> {
    e.read_all(vec![ReadRequest::new(
        0,
        Path::new(key),
        ReadRange::new(offset, len),
    )])
    .pop()
    .unwrap()
}

fn fault(kind: FaultKind, count: u64) -> Fault {
    Fault {
        kind,
        count,
        key_contains: "store/x".into(),
    }
}

/// An IO error naming the object's URL and the range asked for.
fn assert_names_url_and_range(got: &Result<bytes::Bytes, IoError>, offset: u64, len: u64) {
    match got {
        Err(err @ IoError::Io { path, range, .. }) => {
            assert_eq!(path.to_str(), Some("s3://sim-bucket/store/x"));
            assert_eq!(*range, ReadRange::new(offset, len));
            let msg = err.to_string();
            assert!(msg.contains("s3://sim-bucket/store/x"), "{msg}");
            assert!(
                msg.contains(&format!("bytes {offset}..{}", offset + len)),
                "{msg}"
            );
        }
        other => panic!("expected an IO error, got {other:?}"),
    }
}

#[test]
fn slow_down_answers_are_retried_and_cut_the_gets_in_flight() {
    let d = data(100_000);
    let (server, _dir) = serve(&[("x", d.clone())], Shaping::default());
    let e = engine(&server, quick());
    server.inject(fault(FaultKind::SlowDown, 2));
    let got = read(&e, "x", 1000, 5000).unwrap();
    assert_eq!(got[..], d[1000..6000]);
    let m = e.metrics();
    assert_eq!((m.http_gets, m.http_throttled), (3, 2), "{m:?}");
    assert!(
        e.concurrency() < INITIAL_OBJECT_CONCURRENCY,
        "{}",
        e.concurrency()
    );
}

#[test]
fn resets_and_bodies_cut_short_are_retried() {
    let d = data(300_000);
    let (server, _dir) = serve(&[("x", d.clone())], Shaping::default());
    let e = engine(&server, quick());
    for kind in [FaultKind::Reset, FaultKind::Short, FaultKind::InternalError] {
        server.inject(fault(kind, 1));
        let got = read(&e, "x", 10, 200_000).unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(got[..], d[10..200_010], "{kind:?}");
    }
    assert_eq!(server.stats().faults, 3);
}

#[test]
fn a_store_that_keeps_failing_ends_in_an_error_naming_url_and_range_within_the_deadline() {
    let (server, _dir) = serve(&[("x", data(300_000))], Shaping::default());
    for kind in [
        FaultKind::Reset,
        FaultKind::Short,
        FaultKind::SlowDown,
        FaultKind::Stall,
    ] {
        let e = engine(&server, quick());
        server.clear_faults();
        server.inject(fault(kind, 0));
        let t = Instant::now();
        let got = read(&e, "x", 100, 200_000);
        // A stalled body waits out the 1 s request timeout per try.
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{kind:?} took {:?}",
            t.elapsed()
        );
        assert_names_url_and_range(&got, 100, 200_000);
        assert!(
            e.metrics().http_gets >= 2,
            "{kind:?} was not retried: {:?}",
            e.metrics()
        );
    }
}

#[test]
fn an_answer_with_fewer_bytes_than_asked_is_tried_again_and_never_taken_as_data() {
    let d = data(100_000);
    let (server, _dir) = serve(&[("x", d.clone())], Shaping::default());
    let e = engine(&server, quick());
    // Once: the second try has the bytes.
    server.inject(fault(FaultKind::Truncate, 1));
    assert_eq!(read(&e, "x", 1000, 50_000).unwrap()[..], d[1000..51_000]);
    assert_eq!(e.metrics().short_answers, 1);
    // Always: an error naming URL, range and what came back, after the retries.
    server.inject(fault(FaultKind::Truncate, 0));
    let got = read(&e, "x", 1000, 50_000);
    assert_names_url_and_range(&got, 1000, 50_000);
    let msg = got.unwrap_err().to_string();
    assert!(
        msg.contains("Requested 1000..51000, got 1000..26000"),
        "{msg}"
    );
    assert_eq!(
        e.metrics().short_answers,
        1 + 3,
        "three retries: {:?}",
        e.metrics()
    );
    server.clear_faults();
    assert_eq!(read(&e, "x", 1000, 50_000).unwrap()[..], d[1000..51_000]);
}

#[test]
fn missing_credentials_are_an_error_that_says_so() {
    if std::env::vars().any(|(k, _)| k == "AWS_ACCESS_KEY_ID" || k == "AWS_WEB_IDENTITY_TOKEN_FILE")
    {
        eprintln!("skipped: this environment has AWS credentials");
        return;
    }
    let (server, _dir) = serve(&[("x", data(1000))], Shaping::default());
    // No key or secret: the client asks the instance metadata service, here the simulator
    // (which refuses the token request).
    let options: Vec<(String, String)> = [
        ("endpoint", server.endpoint()),
        ("region", "us-east-1".to_string()),
        ("metadata_endpoint", server.endpoint()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let e = ObjectEngine::open(&format!("s3://{BUCKET}/store"), &options, quick()).unwrap();
    let t = Instant::now();
    match &read(&e, "x", 0, 100) {
        Err(err @ IoError::PermissionDenied { path, .. }) => {
            assert_eq!(path.to_str(), Some("s3://sim-bucket/store/x"));
            let msg = err.to_string();
            assert!(msg.contains("no credentials found"), "{msg}");
            assert!(msg.contains("anon=True"), "{msg}");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(server.stats().gets, 0, "no unsigned GET went out");
}

#[test]
fn denied_and_expired_credentials_fail_at_once() {
    let (server, _dir) = serve(&[("x", data(1000))], Shaping::default());
    for kind in [FaultKind::AccessDenied, FaultKind::ExpiredToken] {
        let e = engine(&server, quick());
        server.clear_faults();
        server.inject(fault(kind, 0));
        let got = read(&e, "x", 0, 100);
        match &got {
            Err(err @ IoError::PermissionDenied { path, .. }) => {
                assert_eq!(path.to_str(), Some("s3://sim-bucket/store/x"));
                let msg = err.to_string();
                assert!(msg.contains("s3://sim-bucket/store/x"), "{msg}");
                let (code, meaning) = match kind {
                    FaultKind::ExpiredToken => ("ExpiredToken", "have expired"),
                    _ => ("AccessDenied", "may not read it"),
                };
                assert!(msg.contains(code) && msg.contains(meaning), "{msg}");
            }
            other => panic!("{kind:?}: expected PermissionDenied, got {other:?}"),
        }
        assert_eq!(e.metrics().http_gets, 1, "{kind:?} was retried");
    }
}

/// A simulator serving `n` small objects, and a batch of one read of each (nothing to
/// coalesce: one GET each).
struct ManyObjects {
    server: Server,
    /// The served directory, removed when dropped.
    _dir: tempfile::TempDir,
    objects: Vec<Vec<u8>>,
    requests: Vec<ReadRequest>,
}

impl ManyObjects {
    fn serve(n: usize, shaping: Shaping) -> Self {
        let keys: Vec<String> = (0..n).map(|i| format!("o/{i}")).collect();
        let objects: Vec<Vec<u8>> = (0..n).map(|i| data(2000 + i)).collect();
        let named: Vec<(&str, Vec<u8>)> = keys
            .iter()
            .map(String::as_str)
            .zip(objects.iter().cloned())
            .collect();
        let (server, dir) = serve(&named, shaping);
        let requests = keys
            .iter()
            .enumerate()
            .map(|(i, k)| ReadRequest::new(i as u64, Path::new(k), ReadRange::new(0, 1000)))
            .collect();
        ManyObjects {
            server,
            _dir: dir,
            objects,
            requests,
        }
    }

    /// Reads the batch with `e` and checks every result.
    fn read(&self, e: &ObjectEngine) {
        let got = e.read_all(self.requests.clone());
        for (r, d) in got.iter().zip(&self.objects) {
            assert_eq!(r.as_ref().unwrap()[..], d[..1000]);
        }
    }
}

#[test]
fn gets_in_flight_grow_at_latency_unless_fixed() {
    let shaping = Shaping {
        latency_ms: 20.0,
        ..Shaping::default()
    };
    let many = ManyObjects::serve(1500, shaping);
    let server = &many.server;

    let fixed = engine(
        server,
        ObjectConfig {
            max_concurrency: 64,
            adaptive_concurrency: false,
            ..quick()
        },
    );
    many.read(&fixed);
    let fixed_peak = server.stats().max_in_flight;
    assert!(fixed_peak <= 64, "{fixed_peak}");
    assert_eq!(fixed.concurrency(), 64);

    server.reset_stats();
    let adaptive = engine(server, quick());
    many.read(&adaptive);
    let peak = server.stats().max_in_flight;
    assert!(
        peak > 2 * INITIAL_OBJECT_CONCURRENCY as u64,
        "peak {peak} GETs in flight"
    );
    assert!(
        adaptive.concurrency() > 2 * INITIAL_OBJECT_CONCURRENCY,
        "{}",
        adaptive.concurrency()
    );
}

#[test]
fn holes_stop_merging_where_bandwidth_is_scarce() {
    // 256 ranges of 8 KiB, 32 KiB apart: merged, a GET brings five bytes per byte needed.
    let d = data(12 << 20);
    let shaping = Shaping {
        latency_ms: 20.0,
        total_bytes_per_s: 50e6,
        ..Shaping::default()
    };
    let (server, _dir) = serve(&[("x", d.clone())], shaping);
    let e = engine(&server, quick());
    let batch = || -> Vec<ReadRequest> {
        (0..256u64)
            .map(|i| ReadRequest::new(i, Path::new("x"), ReadRange::new((i * 40) << 10, 8 << 10)))
            .collect()
    };
    let needed = 256 * (8 << 10) as u64;
    let mut fetched = Vec::new();
    for _ in 0..3 {
        server.reset_stats();
        let got = e.read_all(batch());
        for (i, r) in got.iter().enumerate() {
            let at = (i * 40) << 10;
            assert_eq!(r.as_ref().unwrap()[..], d[at..at + (8 << 10)]);
        }
        fetched.push(server.stats().bytes_sent as f64 / needed as f64);
    }
    // The first batch merges with the default gap (1 MiB); once 50 MB/s and 20 ms are
    // measured, a GET per range costs less than the holes.
    assert!(fetched[0] > 4.0, "{fetched:?}");
    assert!(fetched[2] < 1.3, "{fetched:?}");
}

#[test]
fn late_answers_are_hedged() {
    // 1% of answers take 50 times the 20 ms: a batch of 300 GETs has three on average.
    let shaping = Shaping {
        latency_ms: 20.0,
        tail_fraction: 0.01,
        tail_factor: 50.0,
        seed: 3,
        ..Shaping::default()
    };
    let many = ManyObjects::serve(300, shaping);
    let e = engine(&many.server, quick());
    // The first batch times the store (nothing is hedged before 64 GETs are timed).
    many.read(&e);
    // Unhedged, a batch waits a second for a straggler but 5% of the time; hedged, only where
    // the GET sent again is a straggler too (about 3% of batches).
    let mut quick_batches = 0;
    for _ in 0..4 {
        let t = Instant::now();
        many.read(&e);
        quick_batches += u32::from(t.elapsed() < Duration::from_millis(600));
    }
    assert!(
        quick_batches >= 3,
        "{quick_batches} of 4 batches missed their stragglers"
    );
    let hedged = e.metrics().hedged;
    assert!((4..120).contains(&hedged), "{hedged} GETs hedged");
}
