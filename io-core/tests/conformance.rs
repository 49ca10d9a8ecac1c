//! The conformance suite every backend must pass with identical results: each test runs once
//! per backend configuration and compares with a plain `pread` of each range.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use zcrop_io::{
    BackendChoice, BackendKind, Batch, Budget, CoalesceLimits, FastPath, IoConfig, IoEngine,
    IoError, MapFiles, ReadRange, ReadRequest, check_mapped,
};

/// The configurations under test.
fn configs() -> Vec<(&'static str, IoConfig)> {
    let base = IoConfig::default();
    vec![
        (
            "uring-ring-only",
            IoConfig {
                backend: BackendChoice::Uring,
                fast_path: FastPath::Never,
                ..base.clone()
            },
        ),
        (
            "uring-fast-path",
            IoConfig {
                backend: BackendChoice::Uring,
                fast_path: FastPath::Always,
                ..base.clone()
            },
        ),
        (
            "uring-direct",
            IoConfig {
                backend: BackendChoice::Uring,
                direct: true,
                ..base.clone()
            },
        ),
        (
            "portable",
            IoConfig {
                backend: BackendChoice::Portable,
                threads: 4,
                ..base.clone()
            },
        ),
        (
            // Many threads and no help from the consumer: workers race for the last items of
            // the queue.
            "portable-32-threads",
            IoConfig {
                backend: BackendChoice::Portable,
                threads: 32,
                fast_path: FastPath::Never,
                ..base.clone()
            },
        ),
        (
            "uring-unpooled-buffers",
            IoConfig {
                backend: BackendChoice::Uring,
                recycle_buffers: false,
                ..base.clone()
            },
        ),
        (
            "uring-mmap",
            IoConfig {
                backend: BackendChoice::Uring,
                map_files: MapFiles::Always,
                ..base.clone()
            },
        ),
        (
            "portable-mmap",
            IoConfig {
                backend: BackendChoice::Portable,
                threads: 2,
                map_files: MapFiles::Always,
                ..base.clone()
            },
        ),
        (
            "portable-direct",
            IoConfig {
                backend: BackendChoice::Portable,
                threads: 4,
                direct: true,
                ..base
            },
        ),
    ]
}

/// An engine under test. The configurations that map files submit with
/// [`IoEngine::submit_mapped`] (and check every result with [`check_mapped`]); the others
/// with [`IoEngine::submit`].
struct Engine {
    engine: IoEngine,
    mapped: bool,
}

impl Engine {
    fn plain(e: &IoEngine) -> Self {
        Engine {
            engine: e.clone(),
            mapped: false,
        }
    }

    fn submit(&self, reqs: impl IntoIterator<Item = ReadRequest>) -> Batch {
        if self.mapped {
            self.engine.submit_mapped(reqs)
        } else {
            self.engine.submit(reqs)
        }
    }

    /// Every result in the order of `reqs`.
    fn read_all(&self, reqs: Vec<ReadRequest>) -> Vec<Result<bytes::Bytes, IoError>> {
        if !self.mapped {
            return self.engine.read_all(reqs);
        }
        let described: Vec<_> = reqs
            .iter()
            .map(|r| (Arc::clone(&r.path), r.range))
            .collect();
        let mut out: Vec<Option<Result<bytes::Bytes, IoError>>> = vec![None; reqs.len()];
        let batch = self.engine.submit_mapped(
            reqs.into_iter()
                .enumerate()
                .map(|(i, r)| ReadRequest { id: i as u64, ..r }),
        );
        for c in batch {
            let (path, range) = &described[c.id as usize];
            let result = c
                .result
                .and_then(|b| check_mapped(&b, path, *range).map(|()| b));
            out[c.id as usize] = Some(result);
        }
        out.into_iter()
            .map(|r| r.expect("every request answered"))
            .collect()
    }
}

impl std::ops::Deref for Engine {
    type Target = IoEngine;
    fn deref(&self) -> &IoEngine {
        &self.engine
    }
}

fn engines() -> Vec<(&'static str, Engine)> {
    configs()
        .into_iter()
        .map(|(name, c)| {
            let want = c.backend;
            let mapped = c.map_files == MapFiles::Always;
            let e = IoEngine::new(c).unwrap_or_else(|e| panic!("{name}: {e}"));
            if want == BackendChoice::Uring {
                assert_eq!(e.backend(), BackendKind::Uring, "{name}");
            }
            (name, Engine { engine: e, mapped })
        })
        .collect()
}

/// Deterministic pseudo-random bytes.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    path: Arc<Path>,
    data: Vec<u8>,
}

/// A file in a directory on a real disk filesystem (not tmpfs, so O_DIRECT works).
fn fixture(len: usize, seed: u64) -> Fixture {
    let dir = tempfile::Builder::new()
        .prefix("zcrop-io-test")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    let p = dir.path().join("data.bin");
    let data = content(len, seed);
    std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
    Fixture {
        _dir: dir,
        path: Arc::from(p.as_path()),
        data,
    }
}

/// What reading `range` of `data` must give, as a comparable string.
fn expected(data: &[u8], path: &Path, range: ReadRange) -> Result<Vec<u8>, String> {
    let len = data.len() as u64;
    match range.resolve(len) {
        Some((o, l)) => Ok(data[o as usize..(o + l) as usize].to_vec()),
        None => Err(format!("RangePastEof({}, {range}, {len})", path.display())),
    }
}

fn describe(r: &Result<bytes::Bytes, IoError>) -> Result<Vec<u8>, String> {
    match r {
        Ok(b) => Ok(b.to_vec()),
        Err(IoError::RangePastEof {
            path,
            range,
            file_len,
        }) => Err(format!(
            "RangePastEof({}, {range}, {file_len})",
            path.display()
        )),
        Err(e) => Err(format!("{e:?}")),
    }
}

/// On a mapped engine, one read of `f` first: it opens and maps the file, and the consumer
/// then serves later reads of it from the mapping as it plans them.
fn open_and_map(engine: &Engine, name: &str, f: &Fixture) {
    if engine.mapped {
        check(engine, name, f, &[ReadRange::new(0, 1)]);
    }
}

fn check(engine: &Engine, name: &str, f: &Fixture, ranges: &[ReadRange]) {
    let reqs: Vec<ReadRequest> = ranges
        .iter()
        .map(|&r| ReadRequest::new(0, Arc::clone(&f.path), r))
        .collect();
    let got = engine.read_all(reqs);
    assert_eq!(got.len(), ranges.len());
    for (i, (g, r)) in got.iter().zip(ranges).enumerate() {
        assert_eq!(
            describe(g),
            expected(&f.data, &f.path, *r),
            "{name}: request {i} ({r})"
        );
    }
}

#[test]
fn empty_ranges() {
    let f = fixture(10_000, 1);
    for (name, e) in engines() {
        check(
            &e,
            name,
            &f,
            &[
                ReadRange::new(0, 0),
                ReadRange::new(5000, 0),
                ReadRange::new(10_000, 0),
                ReadRange::new(10_001, 0),
                ReadRange::Suffix(0),
            ],
        );
    }
}

#[test]
fn ranges_past_end_of_file() {
    let f = fixture(10_000, 2);
    for (name, e) in engines() {
        check(
            &e,
            name,
            &f,
            &[
                ReadRange::new(9_990, 11),
                ReadRange::new(20_000, 5),
                ReadRange::new(u64::MAX - 1, 5),
                ReadRange::Suffix(10_001),
                // Neighbours of a failing range, likely coalesced with it, still succeed.
                ReadRange::new(9_000, 100),
                ReadRange::new(9_990, 10),
            ],
        );
    }
}

#[test]
fn missing_file_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing: Arc<Path> = Arc::from(dir.path().join("nope.bin").as_path());
    for (name, e) in engines() {
        let got = e.read_all(vec![
            ReadRequest::new(0, Arc::clone(&missing), ReadRange::new(0, 10)),
            ReadRequest::new(0, Arc::clone(&missing), ReadRange::Whole),
        ]);
        for (g, range) in got.iter().zip([ReadRange::new(0, 10), ReadRange::Whole]) {
            match g {
                Err(err @ IoError::NotFound { path, range: r }) => {
                    assert_eq!(&**path, &*missing, "{name}");
                    assert_eq!(*r, range, "{name}");
                    assert!(err.to_string().contains("nope.bin"), "{name}: {err}");
                }
                other => panic!("{name}: expected NotFound, got {other:?}"),
            }
        }
    }
}

#[test]
fn permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture(100, 3);
    std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o000)).unwrap();
    if std::fs::File::open(&f.path).is_ok() {
        eprintln!("SKIPPED permission_denied: running as root, file permissions do not apply");
        return;
    }
    for (name, e) in engines() {
        let got = e.read_all(vec![ReadRequest::new(
            0,
            Arc::clone(&f.path),
            ReadRange::Whole,
        )]);
        assert!(
            matches!(got[0], Err(IoError::PermissionDenied { .. })),
            "{name}: {:?}",
            got[0]
        );
    }
}

#[test]
fn hundred_thousand_tiny_ranges() {
    let f = fixture(1 << 20, 4);
    let mut rng = StdRng::seed_from_u64(5);
    let ranges: Vec<ReadRange> = (0..100_000)
        .map(|_| ReadRange::new(rng.random_range(0..(1 << 20) - 16), rng.random_range(1..16)))
        .collect();
    for (name, e) in engines() {
        open_and_map(&e, name, &f);
        let before = e.metrics();
        check(&e, name, &f, &ranges);
        let m = e.metrics() - before;
        assert_eq!(m.requests, 100_000, "{name}");
        if e.mapped {
            // Each served from the mapping as it is planned: nothing to coalesce.
            assert_eq!(m.mapped_reads, 100_000, "{name}");
            continue;
        }
        assert!(
            m.physical_reads < 100_000,
            "{name}: dense tiny ranges must coalesce, got {} reads",
            m.physical_reads
        );
    }
}

/// A thread that keeps reading one file reads it through its own open file (one shared
/// descriptor makes every read of two threads update one reference count); results stay the
/// same, in every configuration. (40,000 reads over at most 33 threads: one of them reads the
/// file more than 1,024 times.)
#[test]
fn threads_that_keep_reading_one_file_read_their_own_copy_of_it() {
    let f = fixture(1 << 20, 6);
    let ranges: Vec<ReadRange> = (0..40_000u64)
        .map(|i| ReadRange::new((i * 7919 * 32) % ((1 << 20) - 32), 16 + i % 16))
        .collect();
    for (name, mut c) in configs() {
        // Every request its own read, so that one file gets tens of thousands of reads.
        c.coalesce = CoalesceLimits {
            max_gap: 0,
            max_merged_len: 1,
        };
        let direct = c.direct;
        let engine = Engine {
            mapped: c.map_files == MapFiles::Always,
            engine: IoEngine::new(c).unwrap(),
        };
        check(&engine, name, &f, &ranges);
        let m = engine.metrics();
        assert_eq!(m.physical_reads, 40_000, "{name}");
        if direct {
            assert_eq!(m.own_files, 0, "{name}: O_DIRECT files are not copied");
        } else {
            assert!(m.own_files >= 1, "{name}: {m:?}");
        }
    }
}

#[test]
fn duplicate_and_overlapping_ranges() {
    let f = fixture(200_000, 6);
    let ranges = [
        ReadRange::new(100, 50),
        ReadRange::new(100, 50),
        ReadRange::new(120, 50),
        ReadRange::new(0, 200_000),
        ReadRange::new(150_000, 10),
        ReadRange::new(150_000, 10),
        ReadRange::Whole,
        ReadRange::Whole,
        ReadRange::Suffix(1234),
        ReadRange::Suffix(1234),
    ];
    for (name, e) in engines() {
        open_and_map(&e, name, &f);
        let before = e.metrics();
        check(&e, name, &f, &ranges);
        let m = e.metrics() - before;
        // Bounded ranges: one read (all inside 0..200000); whole: one; suffix: one. Mapped,
        // the six bounded ranges are each served from the mapping as they are planned.
        let want = if e.mapped { 8 } else { 3 };
        assert_eq!(m.physical_reads, want, "{name}: duplicates are served once");
    }
}

#[test]
fn large_batches_are_planned_in_groups_with_bounded_splits() {
    // Adjacent 64-byte ranges, which coalesce into one read when planned together. The engine
    // may plan a large batch in groups (its first reads go out sooner, memory stays bounded),
    // each a read of its own; whatever the grouping, every range is served, a small batch is
    // one read, and a large one is split into few reads (at least 256 ranges a group).
    let f = fixture(1 << 20, 8);
    for n in [100u64, 256, 300, 1056, 1100, 4000] {
        let ranges: Vec<ReadRange> = (0..n).map(|i| ReadRange::new(i * 64, 64)).collect();
        for (name, e) in engines().into_iter().filter(|(_, e)| !e.mapped) {
            let before = e.metrics();
            check(&e, name, &f, &ranges);
            let m = e.metrics() - before;
            if n <= 100 {
                assert_eq!(m.physical_reads, 1, "{name}: a batch of {n}");
            }
            assert!(
                m.physical_reads >= 1 && m.physical_reads <= 1 + n.div_ceil(256),
                "{name}: a batch of {n} took {} reads",
                m.physical_reads
            );
        }
    }
}

#[test]
fn whole_file_and_suffix_reads() {
    let f = fixture(123_457, 7);
    for (name, e) in engines() {
        check(
            &e,
            name,
            &f,
            &[
                ReadRange::Whole,
                ReadRange::Suffix(1),
                ReadRange::Suffix(16 * 64 + 4),
                ReadRange::Suffix(123_457),
                ReadRange::Suffix(123_458),
            ],
        );
    }
}

#[test]
fn offsets_beyond_4_gib() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let p: PathBuf = dir.path().join("sparse.bin");
    let file = std::fs::File::create(&p).unwrap();
    let len: u64 = 5 << 30;
    file.set_len(len).unwrap();
    let marker = content(10_000, 8);
    let at: u64 = (4 << 30) + 12_345;
    file.write_all_at(&marker, at).unwrap();
    file.sync_all().unwrap();
    let path: Arc<Path> = Arc::from(p.as_path());
    for (name, e) in engines() {
        let got = e.read_all(vec![
            ReadRequest::new(0, Arc::clone(&path), ReadRange::new(at, 10_000)),
            ReadRequest::new(0, Arc::clone(&path), ReadRange::new(at - 10, 20)),
            ReadRequest::new(0, Arc::clone(&path), ReadRange::Suffix(100)),
            ReadRequest::new(0, Arc::clone(&path), ReadRange::new(len - 1, 2)),
        ]);
        assert_eq!(&got[0].as_ref().unwrap()[..], &marker[..], "{name}");
        let mut edge = vec![0u8; 10];
        edge.extend_from_slice(&marker[..10]);
        assert_eq!(&got[1].as_ref().unwrap()[..], &edge[..], "{name}");
        assert_eq!(&got[2].as_ref().unwrap()[..], &[0u8; 100][..], "{name}");
        assert!(
            matches!(&got[3], Err(IoError::RangePastEof { file_len, .. }) if *file_len == len),
            "{name}: {:?}",
            got[3]
        );
    }
}

#[test]
fn random_batches_match_reference_and_each_other() {
    let files: Vec<Fixture> = (0..3)
        .map(|i| fixture(300_000 + i * 7919, 10 + i as u64))
        .collect();
    let mut rng = StdRng::seed_from_u64(11);
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for _ in 0..5_000 {
        let f = &files[rng.random_range(0..files.len())];
        let range = match rng.random_range(0..20) {
            0 => ReadRange::Whole,
            1 => ReadRange::Suffix(rng.random_range(0..400_000)),
            _ => ReadRange::new(rng.random_range(0..320_000), rng.random_range(0..70_000)),
        };
        want.push(expected(&f.data, &f.path, range));
        reqs.push(ReadRequest::new(0, Arc::clone(&f.path), range));
    }
    for (name, e) in engines() {
        let got = e.read_all(reqs.clone());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(&describe(g), w, "{name}: request {i}");
        }
    }
}

#[test]
fn streams_each_id_once_in_completion_order() {
    let f = fixture(1 << 20, 12);
    for (name, e) in engines() {
        let reqs = (0..1000u64)
            .map(|i| ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(i * 1000, 100)));
        let mut seen = vec![false; 1000];
        let mut batch = e.submit(reqs);
        assert_eq!(batch.remaining(), 1000);
        for c in batch.by_ref() {
            assert!(!seen[c.id as usize], "{name}: id {} twice", c.id);
            seen[c.id as usize] = true;
            let i = c.id as usize;
            assert_eq!(
                &c.result.unwrap()[..],
                &f.data[i * 1000..i * 1000 + 100],
                "{name}"
            );
        }
        assert!(seen.iter().all(|&s| s), "{name}");
        assert_eq!(batch.remaining(), 0);
    }
}

#[test]
fn budget_bounds_what_is_in_flight() {
    let f = fixture(4 << 20, 13);
    for (name, mut c) in configs() {
        let budget = Budget::new(3, 64 * 1024);
        c.budget = Some(Arc::clone(&budget));
        c.coalesce = CoalesceLimits::ADJACENT_ONLY;
        let e = IoEngine::new(c).unwrap();
        let reqs = (0..500u64)
            .map(|i| ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(i * 8000, 4000)));
        let mut n = 0;
        for c in e.submit(reqs) {
            let (reqs, bytes) = budget.in_flight();
            assert!(reqs <= 3, "{name}: {reqs} requests in flight");
            // O_DIRECT rounds 4000 bytes out to up to two 4 KiB blocks.
            assert!(bytes <= 64 * 1024, "{name}: {bytes} bytes in flight");
            c.result.unwrap();
            n += 1;
        }
        assert_eq!(n, 500, "{name}");
        assert_eq!(budget.in_flight(), (0, 0), "{name}: everything released");
    }
}

/// A consumer that stops taking results stops the reading too, soon: results do not pile up
/// (with their buffers) beyond a few queue depths, however large the batch and the budget.
#[test]
fn reading_stays_a_bounded_distance_ahead_of_the_consumer() {
    let f = fixture(4 << 20, 15);
    for (name, mut c) in configs() {
        c.queue_depth = 8;
        c.coalesce = CoalesceLimits::ADJACENT_ONLY;
        let e = IoEngine::new(c).unwrap();
        let reqs = (0..1000u64)
            .map(|i| ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(i * 4000, 1000)));
        let mut batch = e.submit(reqs);
        for _ in 0..10 {
            batch.next().unwrap().result.unwrap();
        }
        std::thread::sleep(Duration::from_millis(200));
        // Read ahead: 64 requests (4 depths of 8, at least 64), plus at most one run of 16
        // handed out past it; counted when the reading threads publish their counters.
        let reads = e.metrics().physical_reads;
        assert!(
            reads <= 10 + 64 + 16,
            "{name}: {reads} reads done while the consumer took 10"
        );
        assert_eq!(batch.count(), 990, "{name}");
    }
}

#[test]
fn dropping_a_batch_early_releases_everything() {
    let f = fixture(4 << 20, 14);
    for (name, mut c) in configs() {
        let budget = Budget::new(16, 1 << 20);
        c.budget = Some(Arc::clone(&budget));
        let e = IoEngine::new(c).unwrap();
        let reqs = (0..2000u64)
            .map(|i| ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(i * 2000, 1000)));
        let mut batch = e.submit(reqs);
        let _first = batch.next().unwrap();
        drop(batch);
        // The engine still works, and the abandoned reads give their budget back.
        check(&Engine::plain(&e), name, &f, &[ReadRange::new(0, 10)]);
        drop(e);
        assert_eq!(budget.in_flight(), (0, 0), "{name}");
    }
}

#[test]
fn uring_backend_is_really_used_here() {
    // io_uring works on this project's machines; if it stops working this test says so loudly
    // instead of letting the portable fallback hide it.
    let e = IoEngine::new(IoConfig {
        backend: BackendChoice::Auto,
        fast_path: FastPath::Never,
        ..IoConfig::default()
    })
    .unwrap();
    assert_eq!(
        e.backend(),
        BackendKind::Uring,
        "auto picked {} because: {:?}",
        e.backend(),
        e.fallback_reason()
    );
    let f = fixture(100_000, 15);
    check(
        &Engine::plain(&e),
        "auto",
        &f,
        &[ReadRange::new(0, 100), ReadRange::new(50_000, 5000)],
    );
    let m = e.metrics();
    assert!(m.ring_enters > 0, "reads went through the ring: {m:?}");
    assert_eq!(m.fast_path_hits, 0);
}

#[test]
fn fast_path_serves_cached_data() {
    let f = fixture(1 << 20, 16);
    let e = IoEngine::new(IoConfig {
        backend: BackendChoice::Uring,
        fast_path: FastPath::Auto,
        ..IoConfig::default()
    })
    .unwrap();
    // Freshly written data is in the page cache.
    let ranges: Vec<ReadRange> = (0..200).map(|i| ReadRange::new(i * 5000, 100)).collect();
    check(&Engine::plain(&e), "fast", &f, &ranges);
    let m = e.metrics();
    assert!(m.fast_path_hits > 0, "{m:?}");
}

#[test]
fn explicit_portable_choice_is_reported() {
    let e = IoEngine::new(IoConfig {
        backend: BackendChoice::Portable,
        ..IoConfig::default()
    })
    .unwrap();
    assert_eq!(e.backend(), BackendKind::Portable);
    assert_eq!(e.backend().name(), "portable");
    assert!(e.fallback_reason().is_none());
}

#[test]
fn bad_config_is_an_error() {
    assert!(
        IoEngine::new(IoConfig {
            queue_depth: 0,
            ..IoConfig::default()
        })
        .is_err()
    );
    assert!("bogus".parse::<BackendChoice>().is_err());
    assert_eq!("uring".parse::<BackendChoice>(), Ok(BackendChoice::Uring));
}

#[test]
fn concurrent_batches_share_one_small_budget_without_deadlock() {
    // Several consumers, each helping while it waits, on one engine with a budget of 4 reads:
    // everything completes, and the budget is never exceeded.
    let f = Arc::new(fixture(8 << 20, 17));
    for (name, mut c) in configs() {
        let budget = Budget::new(4, 256 * 1024);
        c.budget = Some(Arc::clone(&budget));
        let e = IoEngine::new(c).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (e, f, budget, tx) =
                    (e.clone(), Arc::clone(&f), Arc::clone(&budget), tx.clone());
                std::thread::spawn(move || {
                    let reqs = (0..400u64).map(|i| {
                        let off = (t * 400 + i) * 4999 % ((8 << 20) - 5000);
                        ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(off, 1000 + i))
                    });
                    let mut n = 0;
                    for c in e.submit(reqs) {
                        let (reqs, _) = budget.in_flight();
                        assert!(reqs <= 4);
                        c.result.unwrap();
                        n += 1;
                    }
                    tx.send(n).unwrap();
                })
            })
            .collect();
        for _ in 0..4 {
            let n = rx
                .recv_timeout(Duration::from_mins(1))
                .unwrap_or_else(|_| panic!("{name}: a batch did not finish (deadlock?)"));
            assert_eq!(n, 400, "{name}");
        }
        for t in threads {
            t.join().unwrap();
        }
        drop(e);
        assert_eq!(budget.in_flight(), (0, 0), "{name}");
    }
}

#[test]
fn every_result_arrives_when_many_workers_race_for_the_last_items() {
    // Stress for the rule that a worker delivers what it holds before it waits for work (a
    // worker that kept results and blocked on an emptied queue once hung a cold benchmark; the
    // race window is narrow, so this exercises the path rather than reproducing it reliably).
    // O_DIRECT reads take device time, so workers finish together, as in a cold run.
    let f = Arc::new(fixture(1 << 20, 18));
    let e = IoEngine::new(IoConfig {
        backend: BackendChoice::Portable,
        threads: 48,
        direct: true,
        ..IoConfig::default()
    })
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (e2, f2) = (e.clone(), Arc::clone(&f));
    std::thread::spawn(move || {
        // Each round's end is a chance for the race; small rounds give many chances.
        for round in 0..2000u64 {
            let want = round % 7 + 2;
            let reqs = (0..want)
                .map(|i| ReadRequest::new(i, Arc::clone(&f2.path), ReadRange::new(i * 4096, 100)));
            assert_eq!(e2.submit(reqs).count() as u64, want);
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_mins(1))
        .expect("a batch never completed");
}

/// A configuration that maps files under `policy`.
fn mapping_engine(policy: MapFiles) -> IoEngine {
    IoEngine::new(IoConfig {
        backend: BackendChoice::Uring,
        map_files: policy,
        ..IoConfig::default()
    })
    .unwrap()
}

/// Drops `f`'s pages from the page cache: clean pages mapped nowhere go without root, and GNU
/// dd's `iflag=nocache count=0` asks exactly that (`POSIX_FADV_DONTNEED` on the whole file).
fn evict(f: &Fixture) {
    std::fs::File::open(&f.path).unwrap().sync_all().unwrap();
    let status = std::process::Command::new("dd")
        .arg(format!("if={}", f.path.display()))
        .args(["iflag=nocache", "count=0", "status=none"])
        .status()
        .expect("dd runs");
    assert!(status.success(), "dd could not drop {}", f.path.display());
}

#[test]
fn mapped_reads_follow_the_policy() {
    let big = fixture(4 << 20, 21);
    let small = fixture(64 << 10, 22);
    let ranges = |f: &Fixture| -> Vec<ReadRequest> {
        (0..8u64)
            .map(|i| ReadRequest::new(i, Arc::clone(&f.path), ReadRange::new(i * 8000 + 17, 3000)))
            .collect()
    };
    let read = |e: &IoEngine, f: &Fixture, mapped: bool| -> u64 {
        let before = e.metrics().mapped_reads;
        let batch = if mapped {
            e.submit_mapped(ranges(f))
        } else {
            e.submit(ranges(f))
        };
        for c in batch {
            let i = c.id as usize;
            let b = c.result.unwrap();
            assert_eq!(&b[..], &f.data[i * 8000 + 17..i * 8000 + 3017]);
            check_mapped(&b, &f.path, ReadRange::new(0, 1)).unwrap();
        }
        e.metrics().mapped_reads - before
    };
    // The default policy: cached ranges of large files only, and only for submit_mapped.
    let e = mapping_engine(MapFiles::default());
    evict(&big);
    assert_eq!(
        read(&e, &big, true),
        0,
        "cold ranges are read, not faulted in"
    );
    assert_eq!(
        read(&e, &big, true),
        8,
        "now cached: served from the mapping"
    );
    assert_eq!(read(&e, &big, false), 0, "submit never maps");
    assert_eq!(read(&e, &small, true), 0, "files under 1 MiB are read");
    // Always: every bounded range, cached or not; never: none.
    let always = mapping_engine(MapFiles::Always);
    evict(&small);
    assert_eq!(read(&always, &small, true), 8);
    assert_eq!(read(&mapping_engine(MapFiles::Never), &big, true), 0);
    // Whole-file and suffix reads, and ranges past the end, are read (and fail) as usual.
    let got = always.read_all(vec![
        ReadRequest::new(0, Arc::clone(&small.path), ReadRange::Suffix(10)),
        ReadRequest::new(
            0,
            Arc::clone(&small.path),
            ReadRange::new((64 << 10) - 5, 10),
        ),
    ]);
    assert_eq!(
        &got[0].as_ref().unwrap()[..],
        &small.data[(64 << 10) - 10..]
    );
    assert!(matches!(got[1], Err(IoError::RangePastEof { .. })));
    assert!("cached".parse::<MapFiles>() == Ok(MapFiles::WhenCached));
    assert!("sometimes".parse::<MapFiles>().is_err());
}

/// Another process truncating a mapped file must not kill this one: the bytes it lost read
/// as zeros, `check_mapped` reports them, and the engine stops using the mapping.
#[test]
fn a_file_truncated_under_its_mapping_is_an_error_not_a_crash() {
    let f = fixture(2 << 20, 23);
    let e = mapping_engine(MapFiles::Always);
    let range = ReadRange::new(3 << 19, 10_000);
    let mut batch = e.submit_mapped([ReadRequest::new(7, Arc::clone(&f.path), range)]);
    let bytes = batch.next().unwrap().result.unwrap();
    assert!(batch.next().is_none());
    drop(batch);
    assert_eq!(e.metrics().mapped_reads, 1);
    check_mapped(&bytes, &f.path, range).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f.path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    // Touching the lost pages raises SIGBUS, which the engine's handler absorbs.
    assert!(bytes.iter().all(|&b| b == 0), "lost pages read as zeros");
    match check_mapped(&bytes, &f.path, range) {
        Err(err @ IoError::FileChanged { .. }) => {
            assert_eq!(err.range(), range);
            assert!(err.to_string().contains("shrank"), "{err}");
        }
        other => panic!("expected FileChanged, got {other:?}"),
    }
    // The damaged mapping serves nothing more: a read sees the new end of the file.
    let got = e.submit_mapped([ReadRequest::new(0, Arc::clone(&f.path), range)]);
    let results: Vec<_> = got.map(|c| c.result).collect();
    assert!(
        matches!(
            results[..],
            [Err(IoError::RangePastEof { file_len: 4096, .. })]
        ),
        "{results:?}"
    );
    assert_eq!(e.metrics().mapped_reads, 1);
    // The start of the file is still there and still readable.
    let head = e.read_all(vec![ReadRequest::new(
        0,
        Arc::clone(&f.path),
        ReadRange::new(0, 100),
    )]);
    assert_eq!(&head[0].as_ref().unwrap()[..], &f.data[..100]);
}

/// Reads queued for a batch that was dropped are skipped: nobody wants their results, and
/// whoever takes them from the queue (an IO thread, or the consumer of another batch helping)
/// must not spend time on them. Here the only IO thread waits for budget (held by a batch
/// nobody iterates) while the dropped batch's reads queue up behind it.
#[test]
fn queued_reads_of_a_dropped_batch_are_skipped() {
    let f = fixture(10_000, 24);
    let e = IoEngine::new(IoConfig {
        backend: BackendChoice::Portable,
        threads: 1,
        budget: Some(Budget::new(1, 4096)),
        ..IoConfig::default()
    })
    .unwrap();
    // Its result holds the whole budget until the batch is iterated or dropped.
    let held = e.submit([ReadRequest::new(
        0,
        Arc::clone(&f.path),
        ReadRange::new(0, 4096),
    )]);
    std::thread::sleep(Duration::from_millis(200));
    // Reads of eight files (nothing to coalesce): the thread takes the first and waits for
    // budget; the others wait in the queue.
    let others: Vec<Fixture> = (0..8).map(|i| fixture(100, 100 + i)).collect();
    let dropped = e.submit(
        others
            .iter()
            .zip(0u64..)
            .map(|(o, i)| ReadRequest::new(i, Arc::clone(&o.path), ReadRange::new(0, 10))),
    );
    std::thread::sleep(Duration::from_millis(200));
    drop(dropped);
    drop(held);
    let got = e.read_all(vec![ReadRequest::new(
        0,
        Arc::clone(&f.path),
        ReadRange::new(10, 100),
    )]);
    assert_eq!(got[0].as_ref().unwrap()[..], f.data[10..110]);
    assert!(e.metrics().skipped_reads >= 1, "{:?}", e.metrics());
}

/// A FIFO (or any file that is not a regular one) where a chunk should be is refused at once,
/// without blocking the thread that opens it (an open of a FIFO nobody writes would wait
/// forever): the read fails with `NotRegularFile`, and other batches are not held up.
#[test]
fn a_fifo_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap();
    assert!(status.success());
    let fifo: Arc<Path> = Arc::from(p.as_path());
    let f = fixture(10_000, 25);
    for (name, e) in engines() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (e2, fifo2, path) = (e.engine.clone(), Arc::clone(&fifo), Arc::clone(&f.path));
        std::thread::spawn(move || {
            let got = e2.read_all(vec![
                ReadRequest::new(0, fifo2, ReadRange::new(0, 1)),
                ReadRequest::new(1, path, ReadRange::new(10, 100)),
            ]);
            tx.send(got).unwrap();
        });
        let got = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{name}: a read of a FIFO blocked"));
        assert!(
            matches!(&got[0], Err(IoError::NotRegularFile { kind: "a FIFO", .. })),
            "{name}: {:?}",
            got[0]
        );
        assert_eq!(got[1].as_ref().unwrap()[..], f.data[10..110], "{name}");
    }
}

/// A range far past the end of a small file (a corrupt shard index says 2^62 bytes) is
/// refused before a buffer is sized for it, on every backend.
#[test]
fn a_huge_range_past_the_end_allocates_nothing() {
    let f = fixture(1000, 26);
    for (name, e) in engines() {
        let got = e.read_all(vec![
            ReadRequest::new(0, Arc::clone(&f.path), ReadRange::new(0, 1 << 62)),
            ReadRequest::new(1, Arc::clone(&f.path), ReadRange::new(10, (1 << 62) - 10)),
            ReadRequest::new(2, Arc::clone(&f.path), ReadRange::new(5, 10)),
        ]);
        for g in &got[..2] {
            assert!(
                matches!(g, Err(IoError::RangePastEof { file_len: 1000, .. })),
                "{name}: {g:?}"
            );
        }
        assert_eq!(got[2].as_ref().unwrap()[..], f.data[5..15], "{name}");
    }
}

/// A file replaced at its path (written to a temporary file and renamed over, as zarr-python
/// writes) or deleted is seen by the next batch: the engine's open files are checked against
/// their paths once per batch.
#[test]
fn a_file_replaced_or_deleted_between_batches_is_seen() {
    let f = fixture(10_000, 27);
    for (name, e) in engines() {
        let read = |range| {
            e.read_all(vec![ReadRequest::new(0, Arc::clone(&f.path), range)])
                .pop()
                .unwrap()
        };
        std::fs::write(&*f.path, &f.data).unwrap();
        assert_eq!(
            read(ReadRange::new(0, 100)).unwrap()[..],
            f.data[..100],
            "{name}"
        );
        let tmp = f.path.with_extension("tmp");
        std::fs::write(&tmp, vec![7u8; 20_000]).unwrap();
        std::fs::rename(&tmp, &*f.path).unwrap();
        assert_eq!(
            read(ReadRange::new(0, 100)).unwrap()[..],
            [7u8; 100],
            "{name}"
        );
        // Longer than the old file: known only from the new one.
        assert_eq!(
            read(ReadRange::new(15_000, 10)).unwrap()[..],
            [7u8; 10],
            "{name}"
        );
        std::fs::remove_file(&*f.path).unwrap();
        assert!(
            read(ReadRange::new(0, 100)).unwrap_err().is_not_found(),
            "{name}"
        );
    }
}

/// A batch iterated only by polling (`try_next`, never waiting) gets every result, cached or
/// cold, mapped or read: runs its consumer handed out without waking the IO threads (while it
/// served them itself) are woken for before `try_next` comes back empty.
#[test]
fn a_batch_polled_with_try_next_finishes() {
    let f = fixture(4 << 20, 27);
    let ranges: Vec<ReadRange> = (0..3000u64)
        .map(|i| ReadRange::new(i * 1397 % ((4 << 20) - 700), 1 + i % 700))
        .collect();
    for (policy, cold) in [
        (MapFiles::Never, false),
        (MapFiles::WhenCached, false),
        (MapFiles::WhenCached, true),
        (MapFiles::Never, true),
    ] {
        if cold {
            evict(&f);
        }
        let e = IoEngine::new(IoConfig {
            backend: BackendChoice::Uring,
            threads: 1,
            map_files: policy,
            ..IoConfig::default()
        })
        .unwrap();
        let requests = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| ReadRequest::new(i as u64, Arc::clone(&f.path), *r));
        let mut batch = e.submit_mapped(requests);
        let mut got = vec![None; ranges.len()];
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while batch.remaining() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{policy:?}, cold {cold}: {} results never came",
                batch.remaining()
            );
            match batch.try_next() {
                Some(c) => got[c.id as usize] = Some(describe(&c.result)),
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
        for (i, r) in ranges.iter().enumerate() {
            assert_eq!(
                got[i].as_ref(),
                Some(&expected(&f.data, &f.path, *r)),
                "{policy:?}, cold {cold}: {r:?}"
            );
        }
    }
}
