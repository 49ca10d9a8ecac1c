//! Criterion benches of zcrop's own building blocks against the libraries they stand in for, on
//! the work zcrop gives them (issue 28: an own component stays only where its benchmark
//! justifies it; results in `benches/results/own-components-2026-11.md`).
//!
//! - `thread_pool`: pybind's elastic pool (`pybind/src/pool.rs`) against tokio's blocking pool
//!   and a thread per job: one job handed to an idle pool and its result taken, and bursts of
//!   jobs (a batch of async reads) on a pool smaller than the burst.
//! - `read_buffers`: io-core's buffer pool (`io-core/src/pool.rs`) against plain `Vec`
//!   allocation, alone (take, fill, free; one buffer or a queue's worth at once, freed by
//!   another thread; a queue's worth after a pause between batches, when fresh memory faults
//!   in) and inside warm reads through `IoEngine` (`IoConfig::recycle_buffers` on and off).
//! - `lru`: zarr-front's byte-budget cache (`zarr-front/src/cache.rs`: `quick_cache` in one
//!   shard, since the replaced own LRU lost to it) against `quick_cache`'s default shards,
//!   `lru` (with a byte budget around it) and `moka`, on shard-index lookups and on the
//!   decoded-chunk cache fed by random crops; the hit rates are printed (stderr) as well.
//!
//! The components are crate-private; their source files are compiled into this bench with
//! `#[path]` so that no crate widens its API for a benchmark. The bench runs with mimalloc as
//! its allocator, as the `zcrop` binary and the Python module do.
//!
//! `cargo bench --bench own_components`; `-- thread_pool` (or `read_buffers`, `lru`) for one
//! group.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use zcrop::bench::io::ensure_io_file;
use zcrop::bench::synth;
use zcrop::io::{CoalesceLimits, IoConfig, IoEngine, MapFiles, ReadRange, ReadRequest};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../pybind/src/pool.rs"]
#[allow(dead_code, unused_imports)]
mod own_pool;

#[path = "../io-core/src/pool.rs"]
#[allow(dead_code, unused_imports)]
mod own_buffers;

/// What `io-core/src/pool.rs` uses from its crate, under the names it uses.
mod fork {
    pub(crate) use zcrop::io::fork::PerProcess;
}
mod sync {
    pub(crate) use zcrop::io::sync::Mutex;
}

#[path = "../zarr-front/src/cache.rs"]
#[allow(dead_code, unused_imports)]
mod zcrop_cache;

// ---------------------------------------------------------------------------------------------
// Thread pool.

/// Threads of the async pool on this machine (`background.rs`: `max(4, 2 x cores)`).
fn async_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    (2 * cores).max(4)
}

/// A job's own work: about as long as a small decode step (a few microseconds), so bursts keep
/// the pool's threads busy while more jobs queue.
fn work(units: u64) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..units * 1000 {
        x = black_box(x.rotate_left(5) ^ i).wrapping_mul(0x2545_F491_4F6C_DD1D);
    }
    x
}

/// The ways of running a job off the calling thread.
enum Runner {
    Own(&'static own_pool::Pool),
    Tokio(tokio::runtime::Runtime),
    Spawn,
}

impl Runner {
    fn run(&self, job: impl FnOnce() + Send + 'static) {
        match self {
            Runner::Own(pool) => {
                assert!(pool.execute(Box::new(job)).is_ok(), "no pool thread");
            }
            Runner::Tokio(rt) => {
                drop(rt.spawn_blocking(job));
            }
            Runner::Spawn => drop(std::thread::spawn(job)),
        }
    }

    /// Runs `jobs` jobs of `units` work each and waits for all their results.
    fn burst(&self, jobs: usize, units: u64) -> u64 {
        let (tx, rx) = mpsc::sync_channel(jobs);
        for _ in 0..jobs {
            let tx = tx.clone();
            self.run(move || {
                let _ = tx.send(work(units));
            });
        }
        (0..jobs).map(|_| rx.recv().expect("a job's result")).sum()
    }
}

fn runners(max: usize) -> Vec<(&'static str, Runner)> {
    let pool: &'static own_pool::Pool = Box::leak(Box::new(own_pool::Pool::new("bench-own", max)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(max)
        .thread_keep_alive(Duration::from_secs(30))
        .thread_name("bench-tokio")
        .build()
        .expect("tokio runtime");
    vec![
        ("own", Runner::Own(pool)),
        ("tokio_blocking", Runner::Tokio(rt)),
        ("thread_per_job", Runner::Spawn),
    ]
}

fn bench_thread_pool(c: &mut Criterion) {
    let max = async_threads();
    let runners = runners(max);
    let mut g = c.benchmark_group("thread_pool");
    g.measurement_time(Duration::from_secs(4));
    // One job at a time: the pool's threads are idle (waiting) when it comes; the caller waits
    // for the result on a channel, as `blocking::run_handoff` does.
    for (name, runner) in &runners {
        runner.burst(max, 1);
        g.bench_function(BenchmarkId::new("handoff_idle", name), |b| {
            b.iter(|| runner.burst(1, 0));
        });
    }
    // Bursts: a batch of async reads handed over at once, each job some work; with more jobs
    // than threads, jobs queue behind busy threads.
    for jobs in [max, 8 * max] {
        g.throughput(Throughput::Elements(jobs as u64));
        for (name, runner) in &runners {
            g.bench_function(BenchmarkId::new(format!("burst_{jobs}x5k"), name), |b| {
                b.iter(|| runner.burst(jobs, 5));
            });
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Read buffers.

/// Read sizes io-core sees: a page, a small inner chunk or shard index, a v2 chunk, the
/// largest merged local read (`LOCAL_MAX_MERGED_LEN`).
const READ_SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 4 << 20];

/// A pause between batches (a training step's compute).
const BATCH_PAUSE: Duration = Duration::from_millis(25);

/// A buffer for `len` bytes filled from `src` (a read's copy out of the page cache), handed
/// out as `Bytes` the way `sys::ReadBuf::into_bytes` does.
fn filled(len: usize, src: &[u8], pooled: bool) -> Bytes {
    if pooled {
        let mut v = own_buffers::try_take(len).expect("memory");
        v.extend_from_slice(&src[..len]);
        Bytes::from_owner(own_buffers::Pooled(v))
    } else {
        let mut v = Vec::new();
        v.try_reserve_exact(len).expect("memory");
        v.extend_from_slice(&src[..len]);
        Bytes::from(v)
    }
}

fn bench_read_buffers(c: &mut Criterion) {
    let src = vec![7u8; 4 << 20];
    // The consumer: drops the buffers it is sent and says so.
    let (to_consumer, from_bench) = mpsc::channel::<Vec<Bytes>>();
    let (done, freed) = mpsc::channel();
    let consumer = std::thread::spawn(move || {
        for bufs in from_bench {
            drop(bufs);
            let _ = done.send(());
        }
    });
    let mut g = c.benchmark_group("read_buffers");
    g.measurement_time(Duration::from_secs(3));
    for len in READ_SIZES {
        // One buffer taken, filled and freed at a time.
        g.throughput(Throughput::Bytes(len as u64));
        for (name, pooled) in [("pool", true), ("vec", false)] {
            g.bench_function(BenchmarkId::new(format!("one_{}k", len >> 10), name), |b| {
                b.iter(|| black_box(filled(len, &src, pooled)));
            });
        }
        // A queue's worth (64 reads in flight, the default queue depth) alive at once, then
        // freed by another thread than the one that took them (a consumer's), as in a batch.
        let depth = 64.min((64 << 20) / len);
        g.throughput(Throughput::Bytes((len * depth) as u64));
        for (name, pooled) in [("pool", true), ("vec", false)] {
            g.bench_function(
                BenchmarkId::new(format!("queue_{depth}x{}k", len >> 10), name),
                |b| {
                    b.iter(|| {
                        let bufs: Vec<Bytes> =
                            (0..depth).map(|_| filled(len, &src, pooled)).collect();
                        to_consumer.send(bufs).expect("consumer");
                        freed.recv().expect("consumer");
                    });
                },
            );
        }
    }
    g.finish();
    // The same queue's worth after a pause, as between a training loop's batches: an allocator
    // may return freed memory to the kernel meanwhile (mimalloc purges it after 10 ms), and
    // fresh pages fault in, zeroed, when filled. Only the take-fill-free is timed; each sample
    // is one batch.
    let mut g = c.benchmark_group("read_buffers_paused");
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(30)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_millis(1));
    for len in READ_SIZES {
        let depth = 64.min((64 << 20) / len);
        g.throughput(Throughput::Bytes((len * depth) as u64));
        for (name, pooled) in [("pool", true), ("vec", false)] {
            g.bench_function(
                BenchmarkId::new(format!("{depth}x{}k", len >> 10), name),
                |b| {
                    b.iter_custom(|iters| {
                        let mut busy = Duration::ZERO;
                        for _ in 0..iters {
                            std::thread::sleep(BATCH_PAUSE);
                            let start = Instant::now();
                            let bufs: Vec<Bytes> =
                                (0..depth).map(|_| filled(len, &src, pooled)).collect();
                            to_consumer.send(bufs).expect("consumer");
                            freed.recv().expect("consumer");
                            busy += start.elapsed();
                        }
                        busy
                    });
                },
            );
        }
    }
    drop(to_consumer);
    consumer.join().expect("consumer");
    g.finish();
    bench_engine_reads(c);
}

/// Warm random reads through `IoEngine`, buffers recycled or not; results are dropped by the
/// consumer as they arrive.
fn bench_engine_reads(c: &mut Criterion) {
    let file = ensure_io_file(&synth::default_data_dir(), 256 << 20).expect("io file");
    std::io::copy(
        &mut std::fs::File::open(&file).expect("open"),
        &mut std::io::sink(),
    )
    .expect("pre-read");
    let path: Arc<Path> = Arc::from(file.as_path());
    let mut g = c.benchmark_group("read_buffers_engine");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for len in READ_SIZES {
        let n = ((32usize << 20) / len).clamp(16, 4096) as u64;
        let mut rng = StdRng::seed_from_u64(len as u64);
        let slots = (256u64 << 20) / len as u64;
        let reqs: Vec<ReadRequest> = (0..n)
            .map(|i| {
                let at = rng.random_range(0..slots) * len as u64;
                ReadRequest::new(i, Arc::clone(&path), ReadRange::new(at, len as u64))
            })
            .collect();
        g.throughput(Throughput::Bytes(n * len as u64));
        for (name, recycle) in [("pool", true), ("vec", false)] {
            let engine = IoEngine::new(IoConfig {
                recycle_buffers: recycle,
                map_files: MapFiles::Never,
                coalesce: CoalesceLimits {
                    max_gap: 0,
                    max_merged_len: 1,
                },
                ..IoConfig::default()
            })
            .expect("engine");
            g.bench_function(BenchmarkId::new(format!("{}k", len >> 10), name), |b| {
                b.iter(|| {
                    engine
                        .submit(reqs.clone())
                        .filter(|c| c.result.is_ok())
                        .count()
                });
            });
        }
    }
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// LRU with a byte budget.

/// What a cache must do for zcrop: look up by key (or a borrowed form of it), insert with a
/// cost in bytes, and keep the total within the budget it was made with.
trait ByteCache<K, V> {
    fn get_by<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>;
    fn put(&self, key: K, value: V, cost: usize);
}

impl<K: std::hash::Hash + Eq + Clone + Send, V: Clone + Send> ByteCache<K, V>
    for zcrop_cache::LruCache<K, V>
{
    fn get_by<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.get(key)
    }
    fn put(&self, key: K, value: V, cost: usize) {
        self.insert(key, value, cost);
    }
}

/// Weighs a `quick_cache` entry by the cost stored beside its value.
#[derive(Clone)]
struct Cost;

impl<K, V> quick_cache::Weighter<K, (V, usize)> for Cost {
    fn weight(&self, _: &K, v: &(V, usize)) -> u64 {
        v.1 as u64
    }
}

type Quick<K, V> = quick_cache::sync::Cache<K, (V, usize), Cost>;

/// `quick_cache` with its default shards (4 per core), each holding its share of the budget.
fn quick_sharded<K: std::hash::Hash + Eq + Clone, V: Clone>(
    budget: usize,
    typical: usize,
) -> Quick<K, V> {
    let options = quick_cache::OptionsBuilder::new()
        .weight_capacity(budget as u64)
        .estimated_items_capacity((budget / typical).max(1))
        .build()
        .expect("options");
    quick_cache::sync::Cache::with_options(
        options,
        Cost,
        quick_cache::DefaultHashBuilder::default(),
        quick_cache::sync::DefaultLifecycle::default(),
    )
}

impl<K, V> ByteCache<K, V> for Quick<K, V>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync,
    V: Clone + Send + Sync,
{
    fn get_by<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.get(key).map(|(v, _)| v)
    }
    fn put(&self, key: K, value: V, cost: usize) {
        self.insert(key, (value, cost));
    }
}

/// The `lru` crate with the byte budget kept beside it.
struct LruBytes<K: std::hash::Hash + Eq, V> {
    budget: usize,
    inner: Mutex<LruState<K, V>>,
}

/// The entries with their costs, and the bytes they hold.
type LruState<K, V> = (lru::LruCache<K, (V, usize)>, usize);

impl<K: std::hash::Hash + Eq, V> LruBytes<K, V> {
    fn new(budget: usize) -> Self {
        LruBytes {
            budget,
            inner: Mutex::new((lru::LruCache::unbounded(), 0)),
        }
    }
}

impl<K, V> ByteCache<K, V> for LruBytes<K, V>
where
    K: std::hash::Hash + Eq + Send,
    V: Clone + Send,
{
    fn get_by<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        let mut inner = self.inner.lock().expect("lock");
        inner.0.get(key).map(|(v, _)| v.clone())
    }
    fn put(&self, key: K, value: V, cost: usize) {
        if cost > self.budget {
            return;
        }
        let mut guard = self.inner.lock().expect("lock");
        let (map, used) = &mut *guard;
        if let Some((_, (_, old))) = map.push(key, (value, cost)) {
            *used -= old;
        }
        *used += cost;
        while *used > self.budget {
            let Some((_, (_, c))) = map.pop_lru() else {
                break;
            };
            *used -= c;
        }
    }
}

type Moka<K, V> = moka::sync::Cache<K, (V, usize)>;

fn moka_cache<K, V>(budget: usize) -> Moka<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder()
        .max_capacity(budget as u64)
        .weigher(|_, v: &(V, usize)| u32::try_from(v.1).unwrap_or(u32::MAX))
        .build()
}

impl<K, V> ByteCache<K, V> for Moka<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    fn get_by<Q: std::hash::Hash + Eq + ?Sized>(&self, key: &Q) -> Option<V>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.get(key).map(|(v, _)| v)
    }
    fn put(&self, key: K, value: V, cost: usize) {
        self.insert(key, (value, cost));
    }
}

/// A file's version as the caches store it beside a value (zarr-front's `FileStamp`).
type Stamp = Option<(u64, u64, u64, i128, i128)>;

type IndexKey = (Arc<Path>, usize, u64);
type IndexVal = (Stamp, Arc<[u64]>);
type ChunkVal = (Stamp, Arc<[u8]>);

/// Shard-index lookups: every shard's index cached (the default 64 MiB holds thousands), one
/// lookup per shard a batch touches, hits all. Returns the indexes found.
fn index_lookups<C: ByteCache<IndexKey, IndexVal>>(cache: &C, keys: &[IndexKey]) -> usize {
    keys.iter()
        .filter(|k| cache.get_by(*k).is_some_and(|(s, _)| s.is_some()))
        .count()
}

/// The decoded-chunk cache as `fetch_and_stitch` drives it: look up each leaf of a batch by
/// its coordinates (a slice), decode and insert the misses. Returns the hits.
fn chunk_batch<C: ByteCache<Vec<u64>, ChunkVal>>(
    cache: &C,
    leaves: &[Vec<u64>],
    chunk: &Arc<[u8]>,
) -> usize {
    let mut hits = 0;
    for leaf in leaves {
        if cache.get_by(leaf.as_slice()).is_some() {
            hits += 1;
        } else {
            cache.put(
                leaf.clone(),
                (Some((1, 2, 3, 4, 5)), Arc::clone(chunk)),
                chunk.len(),
            );
        }
    }
    hits
}

/// The leaves of `crops` random (4, 12, 128, 128) crops of a (96, 12, 1024, 1024) array with
/// (1, 1, 128, 128) chunks (the benchmark's sharded dataset), batch after batch.
fn crop_leaves(batches: usize, crops: usize, seed: u64) -> Vec<Vec<Vec<u64>>> {
    // Crops and chunks are 128 wide along y and x.
    const CROP: u64 = 128;
    const CHUNK: u64 = 128;
    let mut rng = StdRng::seed_from_u64(seed);
    (0..batches)
        .map(|_| {
            let mut leaves = Vec::new();
            for _ in 0..crops {
                let t = rng.random_range(0..=92u64);
                let y = rng.random_range(0..=896u64);
                let x = rng.random_range(0..=896u64);
                for ti in t..t + 4 {
                    for ci in 0..12 {
                        for yi in y / CHUNK..=(y + CROP - 1) / CHUNK {
                            for xi in x / CHUNK..=(x + CROP - 1) / CHUNK {
                                leaves.push(vec![ti, ci, yi, xi]);
                            }
                        }
                    }
                }
            }
            leaves
        })
        .collect()
}

fn bench_lru(c: &mut Criterion) {
    let mut g = c.benchmark_group("lru");
    g.measurement_time(Duration::from_secs(3));

    // Shard indexes: (96, 12, 1024, 1024) in (16, 12, 512, 512) shards is 24 shards of 3072
    // inner chunks; an index costs 3072 x 16 + 64 bytes. A batch of 32 crops touches ~40.
    let index_budget = 64 << 20;
    let index: Arc<[u64]> = vec![0u64; 2 * 3072].into();
    let cost = index.len() * 8 + 64;
    let paths: Vec<Arc<Path>> = (0..24)
        .map(|i| Arc::from(PathBuf::from(format!("/data/a.zarr/c/{i}/0/0/0"))))
        .collect();
    let mut rng = StdRng::seed_from_u64(5);
    let lookups: Vec<IndexKey> = (0..40)
        .map(|_| (Arc::clone(&paths[rng.random_range(0..24)]), 0, 0))
        .collect();
    let fill = |cache: &dyn Fn(IndexKey, IndexVal, usize)| {
        for p in &paths {
            cache(
                (Arc::clone(p), 0, 0),
                (Some((1, 2, 3, 4, 5)), Arc::clone(&index)),
                cost,
            );
        }
    };
    g.throughput(Throughput::Elements(lookups.len() as u64));
    {
        let ours = zcrop_cache::LruCache::new(index_budget);
        fill(&|key, val, cost| ours.put(key, val, cost));
        g.bench_function("index_hits_40/zcrop", |b| {
            b.iter(|| index_lookups(&ours, &lookups));
        });
        let lru_bytes = LruBytes::new(index_budget);
        fill(&|key, val, cost| lru_bytes.put(key, val, cost));
        g.bench_function("index_hits_40/lru", |b| {
            b.iter(|| index_lookups(&lru_bytes, &lookups));
        });
        let moka = moka_cache(index_budget);
        fill(&|key, val, cost| moka.put(key, val, cost));
        g.bench_function("index_hits_40/moka", |b| {
            b.iter(|| index_lookups(&moka, &lookups));
        });
    }

    // Decoded chunks: 32 KiB each (128 x 128 uint16); batches of 32 random crops (~6,000
    // leaves) against budgets of 64 MiB and 1 GiB (3% and 44% of the array's 2.25 GiB).
    let chunk: Arc<[u8]> = vec![0u8; 32 << 10].into();
    let batches = crop_leaves(8, 32, 6);
    let leaves_per_run: usize = batches.iter().map(Vec::len).sum();
    g.throughput(Throughput::Elements(leaves_per_run as u64));
    for budget_mib in [64usize, 1024] {
        let budget = budget_mib << 20;
        let run = |cache: &dyn Fn(&[Vec<u64>]) -> usize| -> usize {
            batches.iter().map(|b| cache(b)).sum()
        };
        let report = |name: &str, hits: usize| {
            eprintln!(
                "lru chunk cache {budget_mib} MiB {name}: hit rate {:.3} (second pass)",
                hits as f64 / leaves_per_run as f64
            );
        };
        let ours = zcrop_cache::LruCache::new(budget);
        run(&|b| chunk_batch(&ours, b, &chunk));
        report("zcrop", run(&|b| chunk_batch(&ours, b, &chunk)));
        g.bench_function(format!("chunks_{budget_mib}MiB/zcrop"), |b| {
            b.iter(|| run(&|l| chunk_batch(&ours, l, &chunk)));
        });
        ours.clear();
        let sharded = quick_sharded(budget, chunk.len());
        run(&|b| chunk_batch(&sharded, b, &chunk));
        report(
            "quick_cache_sharded",
            run(&|b| chunk_batch(&sharded, b, &chunk)),
        );
        g.bench_function(format!("chunks_{budget_mib}MiB/quick_cache_sharded"), |b| {
            b.iter(|| run(&|l| chunk_batch(&sharded, l, &chunk)));
        });
        let lru_bytes = LruBytes::new(budget);
        run(&|b| chunk_batch(&lru_bytes, b, &chunk));
        report("lru", run(&|b| chunk_batch(&lru_bytes, b, &chunk)));
        g.bench_function(format!("chunks_{budget_mib}MiB/lru"), |b| {
            b.iter(|| run(&|l2| chunk_batch(&lru_bytes, l2, &chunk)));
        });
        let moka = moka_cache(budget);
        run(&|b| chunk_batch(&moka, b, &chunk));
        moka.run_pending_tasks();
        report("moka", run(&|b| chunk_batch(&moka, b, &chunk)));
        g.bench_function(format!("chunks_{budget_mib}MiB/moka"), |b| {
            b.iter(|| run(&|l| chunk_batch(&moka, l, &chunk)));
        });
    }
    g.finish();
}

criterion_group!(benches, bench_thread_pool, bench_read_buffers, bench_lru);
criterion_main!(benches);
