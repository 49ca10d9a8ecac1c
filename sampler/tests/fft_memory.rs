//! Peak memory of the out-of-core FFT on an array several times larger than its budget.
//!
//! A child process (this binary, re-run) does only the FFT, under a counting global allocator,
//! and reports its peak live heap during the call and the growth of its peak resident set
//! (`VmHWM`); the parent checks them against the budget. Run with `--nocapture` to see them.
//!
//! Unsafe code: the counting allocator (a `GlobalAlloc` must be an `unsafe impl`) forwards
//! every call to the system allocator unchanged; each block has a `// SAFETY:` comment.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use zcrop_sampler::{ChunkedFftOptions, FftStrategy, fft_along_axis};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments, so `System`'s
// guarantees hold; the counters are plain atomics and never affect the returned memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's arguments.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                    - layout.size();
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const CHILD_ENV: &str = "ZCROP_FFT_MEMORY_CHILD";
/// The budget: 4 MiB, for a 32 MiB float32 input (64 MiB complex64 output).
const BUDGET: usize = 4 << 20;
/// What the anonymous memory may grow by beyond the budget: see the parent test.
const THREADS_SLACK: usize = 2 << 20;
const SHAPE: [u64; 2] = [524_288, 16];
const CHUNKS: [u64; 2] = [2048, 16];

fn status_kib(field: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Writes the input chunk by chunk (so the parent never holds it whole).
fn write_input(path: &Path) {
    use zarrs::array::{ArrayBuilder, ArrayBytes, DataType, FillValue};
    let store = Arc::new(zarrs::filesystem::FilesystemStore::new(path).unwrap());
    let dt = DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new("float32")).unwrap();
    let a = ArrayBuilder::new(
        SHAPE.to_vec(),
        CHUNKS.to_vec(),
        dt,
        FillValue::new(vec![0; 4]),
    )
    .build(store, "/")
    .unwrap();
    a.store_metadata().unwrap();
    for c in 0..SHAPE[0] / CHUNKS[0] {
        let vals: Vec<u8> = (0..CHUNKS[0] * CHUNKS[1])
            .flat_map(|i| {
                let t = (c * CHUNKS[0] * 16 + i) as f32;
                ((t * 0.001).sin() + (t * 0.37).cos()).to_ne_bytes()
            })
            .collect();
        a.store_chunk(&[c, 0], ArrayBytes::new_flen(vals)).unwrap();
    }
}

#[test]
fn peak_memory_stays_within_the_budget_on_an_array_larger_than_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.zarr");
    write_input(&input);
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "child_runs_the_fft", "--ignored", "--nocapture"])
        .env(CHILD_ENV, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("FFT-MEMORY"))
        .expect("the child's report");
    eprintln!("{line}");
    let field = |name: &str| -> usize {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    let (input_bytes, heap, anon) = (
        field("input_bytes="),
        field("heap_peak_bytes="),
        field("anon_growth_bytes="),
    );
    assert!(
        input_bytes >= 8 * BUDGET,
        "the array must be much larger than the budget"
    );
    assert!(
        heap <= BUDGET,
        "peak heap {heap} exceeds the budget {BUDGET}"
    );
    // Anonymous memory also holds what the call's IO and decode threads cost whatever the
    // budget (their stacks, per-thread allocator arenas), which varies with how many threads
    // the machine's load lets start. Memory the FFT kept outside the counted heap would be a
    // multiple of the budget.
    assert!(
        anon <= BUDGET + THREADS_SLACK,
        "anonymous memory grew by {anon} bytes, more than the budget {BUDGET} and \
         {THREADS_SLACK} for threads"
    );
}

/// Run only as the child of the test above.
#[test]
#[ignore = "run by peak_memory_stays_within_the_budget_on_an_array_larger_than_it in a child process"]
fn child_runs_the_fft() {
    let dir = std::env::var(CHILD_ENV).expect("run only as the child");
    let dir = Path::new(&dir);
    let opts = ChunkedFftOptions::new(0, BUDGET);
    let rss_before = status_kib("VmRSS:") * 1024;
    let anon_before = status_kib("RssAnon:") * 1024;
    let live_before = LIVE.load(Ordering::Relaxed);
    PEAK.store(live_before, Ordering::Relaxed);
    let report = fft_along_axis(dir.join("in.zarr"), dir.join("out.zarr"), &opts).unwrap();
    let heap = PEAK.load(Ordering::Relaxed) - live_before;
    let rss = (status_kib("VmHWM:") * 1024).saturating_sub(rss_before);
    let anon = (status_kib("RssAnon:") * 1024).saturating_sub(anon_before);
    assert!(
        matches!(report.strategy, FftStrategy::FourStep { .. }),
        "{report:?}"
    );
    println!(
        "FFT-MEMORY budget_bytes={BUDGET} input_bytes={} output_bytes={} temp_bytes={} heap_peak_bytes={heap} anon_growth_bytes={anon} hwm_growth_bytes={rss} seconds={:.2} strategy={:?} tile={:?} block_bytes={}",
        SHAPE[0] * SHAPE[1] * 4,
        report.output_bytes,
        report.temp_bytes,
        report.elapsed.as_secs_f64(),
        report.strategy,
        report.tile,
        report.block_bytes,
    );
}
