//! The object-store backend against a real S3-compatible server (moto) on loopback: every read
//! compared with the same read of a local copy, typed errors for missing keys, bad ranges and
//! denied requests, retries through a proxy that drops connections, and GETs counted at the
//! wire against the coalesced plan.
//!
//! Skipped (saying so) where moto is not installed, unless `ZCROP_REQUIRE_S3=1`.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use zcrop_fixtures::s3::{Moto, options_for};
use zcrop_io::{
    BackendChoice, CoalesceLimits, IoConfig, IoEngine, IoError, ObjectConfig, ObjectEngine,
    ReadRange, ReadRequest, RetryPolicy, coalesce,
};

/// Quick retries, so failure tests take milliseconds.
fn quick(max_retries: usize) -> ObjectConfig {
    ObjectConfig {
        retry: RetryPolicy {
            max_retries,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(50),
            backoff_base: 2.0,
            retry_timeout: Duration::from_secs(30),
        },
        ..ObjectConfig::default()
    }
}

fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random::<u8>()).collect()
}

/// Uploads `objects` to a fresh bucket and writes the same files under a temporary directory.
fn setup(moto: &Moto, bucket: &str, objects: &[(&str, Vec<u8>)]) -> (String, tempfile::TempDir) {
    moto.create_bucket(bucket);
    let dir = tempfile::tempdir().unwrap();
    for (key, data) in objects {
        moto.put(bucket, &format!("store/{key}"), data);
        let p = dir.path().join(key);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
    }
    (format!("s3://{bucket}/store"), dir)
}

/// The GETs a batch should cost: coalesced bounded ranges, distinct suffixes, whole objects,
/// per object (empty ranges cost none).
fn planned_gets(requests: &[ReadRequest], limits: CoalesceLimits) -> u64 {
    /// Per object: bounded ranges, distinct suffix lengths, whether it is read whole.
    type Wanted = (Vec<(u64, u64)>, HashSet<u64>, bool);
    let mut by_key: BTreeMap<&Path, Wanted> = BTreeMap::new();
    for r in requests {
        let e = by_key.entry(&r.path).or_default();
        match r.range {
            ReadRange::Bounded { offset, len } => e.0.push((offset, len)),
            ReadRange::Suffix(n) if n > 0 => {
                e.1.insert(n);
            }
            ReadRange::Suffix(_) => {}
            ReadRange::Whole => e.2 = true,
        }
    }
    by_key
        .values()
        .map(|(b, s, w)| {
            let merged = coalesce(b, limits)
                .reads
                .iter()
                .filter(|r| r.len > 0)
                .count();
            (merged + s.len() + usize::from(*w)) as u64
        })
        .sum()
}

#[test]
fn reads_equal_local_reads_and_gets_match_the_plan() {
    let Some(moto) = Moto::shared() else { return };
    let objects = vec![
        ("big", bytes_of(1, 3 << 20)),
        ("dir/small", bytes_of(2, 1000)),
        ("dir/sub/tiny", bytes_of(3, 17)),
        ("empty", Vec::new()),
    ];
    let (url, dir) = setup(moto, "io-compare", &objects);
    let object =
        ObjectEngine::open(&url, &moto.storage_options(), ObjectConfig::default()).unwrap();
    let local = IoEngine::new(IoConfig {
        backend: BackendChoice::Portable,
        ..IoConfig::default()
    })
    .unwrap();

    let mut rng = StdRng::seed_from_u64(7);
    let mut keyed = Vec::new();
    for i in 0..300u64 {
        let (key, data) = &objects[rng.random_range(0..3)];
        let len = data.len() as u64;
        let range = match rng.random_range(0..10) {
            0 => ReadRange::Whole,
            1 => ReadRange::Suffix(rng.random_range(0..=len.min(4096))),
            _ => {
                let off = rng.random_range(0..len);
                ReadRange::new(off, rng.random_range(0..=(len - off).min(200_000)))
            }
        };
        keyed.push((i, *key, range));
    }
    keyed.push((300, "empty", ReadRange::Whole));
    let object_reqs: Vec<ReadRequest> = keyed
        .iter()
        .map(|(i, k, r)| ReadRequest::new(*i, Path::new(k), *r))
        .collect();
    let local_reqs: Vec<ReadRequest> = keyed
        .iter()
        .map(|(i, k, r)| ReadRequest::new(*i, dir.path().join(k), *r))
        .collect();

    let before = object.metrics();
    let got = object.read_all(object_reqs.clone());
    let m = object.metrics() - before;
    let want = local.read_all(local_reqs);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
        let w = w.as_ref().unwrap();
        assert_eq!(g, w, "request {i} {:?}", keyed[i]);
    }
    let planned = planned_gets(&object_reqs, CoalesceLimits::OBJECT);
    assert_eq!(m.requests, 301);
    assert_eq!(m.gets, planned, "GETs issued vs the coalesced plan: {m:?}");
    assert_eq!(
        m.http_gets, planned,
        "GETs sent over HTTP vs the coalesced plan: {m:?}"
    );
    assert_eq!(
        (m.http_other, m.http_failures, m.errors),
        (0, 0, 0),
        "{m:?}"
    );
    assert!(planned < 300, "coalescing merged nothing: {planned} GETs");
}

#[test]
fn missing_keys_are_not_found_and_bad_ranges_past_the_end() {
    let Some(moto) = Moto::shared() else { return };
    let (url, _dir) = setup(moto, "io-errors", &[("obj", bytes_of(4, 100))]);
    let e = ObjectEngine::open(&url, &moto.storage_options(), quick(2)).unwrap();
    let got = e.read_all(vec![
        ReadRequest::new(0, Path::new("nope/c/0"), ReadRange::new(10, 20)),
        ReadRequest::new(1, Path::new("nope/c/1"), ReadRange::Whole),
        ReadRequest::new(2, Path::new("nope/c/2"), ReadRange::Suffix(8)),
        ReadRequest::new(3, Path::new("obj"), ReadRange::new(1000, 10)),
        ReadRequest::new(4, Path::new("obj"), ReadRange::Suffix(101)),
    ]);
    match &got[0] {
        Err(err @ IoError::NotFound { path, range }) => {
            assert_eq!(path.to_str(), Some("s3://io-errors/store/nope/c/0"));
            assert_eq!(*range, ReadRange::new(10, 20));
            let msg = err.to_string();
            assert!(
                msg.contains("s3://io-errors/store/nope/c/0") && msg.contains("bytes 10..30"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        got[1].as_ref().is_err_and(IoError::is_not_found),
        "{:?}",
        got[1]
    );
    assert!(
        got[2].as_ref().is_err_and(IoError::is_not_found),
        "{:?}",
        got[2]
    );
    for r in &got[3..] {
        assert!(
            matches!(r, Err(IoError::RangePastEof { file_len: 100, .. })),
            "{r:?}"
        );
    }
    // Not found is not retried.
    let m = e.metrics();
    assert_eq!(m.http_failures, 0, "{m:?}");
}

#[test]
fn anonymous_requests_to_a_private_bucket_are_denied() {
    let Some(moto) = Moto::shared() else { return };
    let (url, _dir) = setup(moto, "io-private", &[("a/b", bytes_of(9, 100))]);
    let anon = vec![
        ("endpoint".to_string(), moto.endpoint()),
        ("anon".to_string(), "true".to_string()),
    ];
    let e = ObjectEngine::open(&url, &anon, quick(3)).unwrap();
    let got = e.read_all(vec![
        ReadRequest::new(0, Path::new("a/b"), ReadRange::new(5, 10)),
        ReadRequest::new(1, Path::new("a/b"), ReadRange::Whole),
    ]);
    match &got[0] {
        Err(err @ IoError::PermissionDenied { path, range, .. }) => {
            assert_eq!(path.to_str(), Some("s3://io-private/store/a/b"));
            assert_eq!(*range, ReadRange::new(5, 10));
            assert!(err.to_string().contains("permission denied"), "{err}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(got[1], Err(IoError::PermissionDenied { .. })),
        "{:?}",
        got[1]
    );
    // Denials are not retried.
    let m = e.metrics();
    assert_eq!((m.gets, m.http_gets, m.http_failures), (2, 2, 0), "{m:?}");
}

#[test]
fn anonymous_requests_and_plain_http_read_a_public_bucket() {
    let Some(moto) = Moto::shared() else { return };
    let data = bytes_of(5, 5000);
    moto.create_public_bucket("io-anon");
    moto.put_public("io-anon", "store/a/b", &data);
    let url = "s3://io-anon/store".to_string();
    let mut anon = options_for(&moto.endpoint());
    anon.retain(|(k, _)| k == "endpoint" || k == "region");
    anon.push(("anon".into(), "true".into()));
    let s3 = ObjectEngine::open(&url, &anon, ObjectConfig::default()).unwrap();
    // moto serves objects at http://host/bucket/key to unsigned GETs.
    let http = ObjectEngine::open(
        &format!("{}/io-anon/store", moto.endpoint()),
        &[("allow_http".into(), "true".into())],
        ObjectConfig::default(),
    )
    .unwrap();
    for e in [&s3, &http] {
        let got = e.read_all(vec![
            ReadRequest::new(0, Path::new("a/b"), ReadRange::new(100, 50)),
            ReadRequest::new(1, Path::new("a/b"), ReadRange::Suffix(64)),
            ReadRequest::new(2, Path::new("a/b"), ReadRange::Whole),
        ]);
        assert_eq!(got[0].as_ref().unwrap()[..], data[100..150], "{}", e.url());
        assert_eq!(
            got[1].as_ref().unwrap()[..],
            data[5000 - 64..],
            "{}",
            e.url()
        );
        assert_eq!(got[2].as_ref().unwrap()[..], data[..], "{}", e.url());
    }
}

/// A TCP proxy in front of moto: drops the first `drop_first` connections after reading their
/// request (no response), forwards the others, and counts the GET requests it forwards.
struct Proxy {
    port: u16,
    dropped: Arc<AtomicUsize>,
    gets: Arc<AtomicUsize>,
}

impl Proxy {
    fn start(upstream: u16, drop_first: usize) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let dropped = Arc::new(AtomicUsize::new(0));
        let gets = Arc::new(AtomicUsize::new(0));
        let (d, g) = (Arc::clone(&dropped), Arc::clone(&gets));
        std::thread::spawn(move || {
            // Bounded: a test makes a few dozen connections at most.
            for conn in listener.incoming().take(10_000) {
                let Ok(mut client) = conn else { continue };
                if d.load(Ordering::SeqCst) < drop_first {
                    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
                    let _ = client.read(&mut [0u8; 4096]);
                    let _ = client.shutdown(Shutdown::Both);
                    d.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let g = Arc::clone(&g);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 * 1024];
                    let mut server = server;
                    while let Ok(n) = client.read(&mut buf) {
                        if n == 0 || server.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        // Requests carry no body here: each GET line starts a request.
                        let starts = buf[..n].windows(5).filter(|w| w == b"GET /").count();
                        g.fetch_add(starts, Ordering::SeqCst);
                    }
                    let _ = server.shutdown(Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut s2, &mut c2);
                    let _ = c2.shutdown(Shutdown::Write);
                });
            }
        });
        Proxy {
            port,
            dropped,
            gets,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

#[test]
fn dropped_connections_are_retried_with_backoff() {
    let Some(moto) = Moto::shared() else { return };
    let data = bytes_of(6, 10_000);
    let (url, _dir) = setup(moto, "io-flaky", &[("x", data.clone())]);
    let proxy = Proxy::start(moto.port(), 2);
    let e = ObjectEngine::open(&url, &options_for(&proxy.endpoint()), quick(5)).unwrap();
    let got = e.read_all(vec![ReadRequest::new(
        0,
        Path::new("x"),
        ReadRange::new(10, 1000),
    )]);
    assert_eq!(got[0].as_ref().unwrap()[..], data[10..1010]);
    let m = e.metrics();
    assert_eq!(proxy.dropped.load(Ordering::SeqCst), 2);
    assert_eq!(m.gets, 1, "{m:?}");
    assert_eq!(m.http_failures, 2, "two attempts dropped: {m:?}");
    assert_eq!(m.http_gets, 3, "one GET, sent three times: {m:?}");
    assert_eq!(proxy.gets.load(Ordering::SeqCst), 1, "one GET got through");
}

#[test]
fn a_server_that_keeps_dropping_fails_after_the_retries_naming_url_and_range() {
    let Some(moto) = Moto::shared() else { return };
    let (url, _dir) = setup(moto, "io-down", &[("x", bytes_of(7, 100))]);
    let proxy = Proxy::start(moto.port(), usize::MAX);
    let e = ObjectEngine::open(&url, &options_for(&proxy.endpoint()), quick(2)).unwrap();
    let got = e.read_all(vec![ReadRequest::new(
        0,
        Path::new("x"),
        ReadRange::new(10, 20),
    )]);
    match &got[0] {
        Err(err @ IoError::Io { path, range, .. }) => {
            assert_eq!(path.to_str(), Some("s3://io-down/store/x"));
            assert_eq!(*range, ReadRange::new(10, 20));
            let msg = err.to_string();
            assert!(
                msg.contains("s3://io-down/store/x") && msg.contains("bytes 10..30"),
                "{msg}"
            );
        }
        other => panic!("expected an IO error, got {other:?}"),
    }
    let m = e.metrics();
    assert_eq!(m.gets, 1, "{m:?}");
    assert_eq!(m.http_gets, 3, "a try and two retries: {m:?}");
    assert_eq!(m.errors, 1, "{m:?}");
}

#[test]
fn gets_on_the_wire_equal_the_planned_ranges() {
    let Some(moto) = Moto::shared() else { return };
    let data = bytes_of(8, 40 << 20);
    let (url, _dir) = setup(moto, "io-wire", &[("shard", data.clone())]);
    let proxy = Proxy::start(moto.port(), 0);
    let e = ObjectEngine::open(
        &url,
        &options_for(&proxy.endpoint()),
        ObjectConfig::default(),
    )
    .unwrap();
    // 64 reads of 100 KiB every 512 KiB: holes under the 1 MiB gap, so they merge into reads
    // of at most 16 MiB; plus the shard index (a suffix) read twice.
    let mut reqs: Vec<ReadRequest> = (0..64u64)
        .map(|i| ReadRequest::new(i, Path::new("shard"), ReadRange::new(i << 19, 100 << 10)))
        .collect();
    reqs.push(ReadRequest::new(
        64,
        Path::new("shard"),
        ReadRange::Suffix(1040),
    ));
    reqs.push(ReadRequest::new(
        65,
        Path::new("shard"),
        ReadRange::Suffix(1040),
    ));
    let planned = planned_gets(&reqs, CoalesceLimits::OBJECT);
    assert_eq!(planned, 3, "two merged reads (16 MiB cap) and one suffix");
    let got = e.read_all(reqs.clone());
    for (r, g) in reqs.iter().zip(&got) {
        let g = g.as_ref().unwrap();
        match r.range {
            ReadRange::Bounded { offset, len } => {
                assert_eq!(g[..], data[offset as usize..(offset + len) as usize]);
            }
            _ => assert_eq!(g[..], data[data.len() - 1040..]),
        }
    }
    let m = e.metrics();
    assert_eq!((m.gets, m.http_gets), (planned, planned), "{m:?}");
    assert_eq!(proxy.gets.load(Ordering::SeqCst) as u64, planned);
}

#[test]
fn whole_objects_are_written_read_and_removed() {
    let Some(moto) = Moto::shared() else { return };
    let (url, _dir) = setup(moto, "io-write", &[("keep/x", bytes_of(1, 10))]);
    let e = ObjectEngine::open(&url, &moto.storage_options(), quick(2)).unwrap();
    let data = bytes::Bytes::from(bytes_of(5, 3000));
    assert_eq!(e.get(Path::new("work/job.json")).unwrap(), None);
    e.put(Path::new("work/job.json"), data.clone()).unwrap();
    assert_eq!(
        e.get(Path::new("work/job.json")).unwrap(),
        Some(data.clone())
    );
    // Ranges of a written object read as any other.
    let got = e.read_all(vec![ReadRequest::new(
        0,
        Path::new("work/job.json"),
        ReadRange::new(100, 50),
    )]);
    assert_eq!(got[0].as_ref().unwrap()[..], data[100..150]);
    // A conditional write creates once; the object then stays as first written.
    let marker = Path::new("work/done/rows/3");
    assert!(
        e.put_if_absent(marker, bytes::Bytes::from_static(b"a"))
            .unwrap()
    );
    assert!(
        !e.put_if_absent(marker, bytes::Bytes::from_static(b"b"))
            .unwrap()
    );
    assert_eq!(e.get(marker).unwrap().unwrap(), &b"a"[..]);
    // Overwrite replaces.
    e.put(Path::new("work/job.json"), bytes::Bytes::from_static(b"{}"))
        .unwrap();
    assert_eq!(
        e.get(Path::new("work/job.json")).unwrap().unwrap(),
        &b"{}"[..]
    );
    // Removing a prefix removes what lies under it (and an object of that name), only that.
    e.put(Path::new("work"), bytes::Bytes::from_static(b"w"))
        .unwrap();
    e.put(Path::new("workshop"), bytes::Bytes::from_static(b"s"))
        .unwrap();
    // Removing one object leaves its neighbours; removing it again is no error.
    e.delete(marker).unwrap();
    assert_eq!(e.get(marker).unwrap(), None);
    e.delete(marker).unwrap();
    e.put(marker, bytes::Bytes::from_static(b"a")).unwrap();
    assert_eq!(e.delete_prefix(Path::new("work")).unwrap(), 3);
    assert!(e.list(Path::new("work")).unwrap().is_empty());
    assert_eq!(e.get(Path::new("work")).unwrap(), None);
    assert!(e.get(Path::new("workshop")).unwrap().is_some());
    assert!(e.get(Path::new("keep/x")).unwrap().is_some());
    assert_eq!(e.delete_prefix(Path::new("nothing/here")).unwrap(), 0);
}

#[test]
fn background_writes_report_once_each() {
    let Some(moto) = Moto::shared() else { return };
    let (url, _dir) = setup(moto, "io-write-bg", &[]);
    let e = ObjectEngine::open(&url, &moto.storage_options(), quick(2)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for i in 0..20u8 {
        let tx = tx.clone();
        e.put_background(
            Path::new(&format!("bg/{i}")),
            bytes::Bytes::from(vec![i; 1000 + usize::from(i)]),
            move |outcome| tx.send((i, outcome.map_err(|e| e.to_string()))).unwrap(),
        );
    }
    drop(tx);
    let mut got: Vec<_> = rx.iter().collect();
    got.sort_by_key(|(i, _)| *i);
    assert_eq!(got.len(), 20, "each callback once");
    for (i, outcome) in got {
        outcome.unwrap();
        let back = e.get(Path::new(&format!("bg/{i}"))).unwrap().unwrap();
        assert_eq!(back.len(), 1000 + usize::from(i));
        assert!(back.iter().all(|&b| b == i));
    }
    // A failure reaches the callback, naming the URL.
    let missing = ObjectEngine::open(
        "s3://io-no-such-bucket/store",
        &moto.storage_options(),
        quick(1),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    missing.put_background(Path::new("a"), bytes::Bytes::from_static(b"x"), move |o| {
        tx.send(o.map_err(|e| e.to_string())).unwrap();
    });
    let err = rx.recv().unwrap().unwrap_err();
    assert!(
        err.contains("writing s3://io-no-such-bucket/store/a"),
        "{err}"
    );
}

#[test]
fn a_write_that_fails_names_its_url() {
    let Some(moto) = Moto::shared() else { return };
    let e = ObjectEngine::open(
        "s3://io-no-such-bucket/store",
        &moto.storage_options(),
        quick(1),
    )
    .unwrap();
    let err = e
        .put(Path::new("a/b"), bytes::Bytes::from_static(b"x"))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("writing s3://io-no-such-bucket/store/a/b"),
        "{msg}"
    );
    let err = e.delete_prefix(Path::new("a")).unwrap_err();
    assert!(
        err.to_string()
            .contains("removing s3://io-no-such-bucket/store/a"),
        "{err}"
    );
}
