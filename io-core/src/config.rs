//! How an engine reads: [`IoConfig`] and the policies it names. A leaf module: every other
//! part of io-core reads its settings from here.

use std::sync::Arc;

use crate::budget::Budget;
use crate::coalesce::CoalesceLimits;
use crate::error::EngineError;

/// When the io_uring backend tries `preadv2(RWF_NOWAIT)` before the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FastPath {
    /// While it keeps hitting the page cache (the default).
    #[default]
    Auto,
    /// For every read.
    Always,
    /// Never: every read goes through the ring.
    Never,
}

/// When reads of a batch submitted with [`IoEngine::submit_mapped`](crate::IoEngine::submit_mapped) are served from a
/// read-only mapping of their file (no copy out of the page cache, no IO thread) instead of
/// being read. Batches submitted with [`IoEngine::submit`](crate::IoEngine::submit) are always read.
///
/// A mapping serves only bounded ranges that lie inside it; anything else (whole-file and
/// suffix reads, ranges past the mapped length, `O_DIRECT` engines, files that cannot be
/// mapped) is read as usual. A file truncated by another process while mapped does not kill
/// the process: the lost pages read as zeros and [`check_mapped`](crate::check_mapped) reports the result as
/// [`IoError::FileChanged`](crate::IoError::FileChanged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MapFiles {
    /// Never: every read is a read.
    Never,
    /// Files of at least [`MAP_MIN_FILE_BYTES`], for ranges whose pages are all in memory
    /// (asked with `cachestat` on Linux 6.5 and later about the aligned 1 MiB of the file
    /// around the read, an answer every thread then uses for the reads in that 1 MiB for one
    /// second, and per read where that stretch was not all in memory; else one `mincore` per
    /// read; while a thread's recent ranges were mostly not in memory, only one read in 32
    /// asks; the default). A page evicted after its stretch was found in memory is faulted
    /// back in when read: slower, never wrong. Cold ranges are read through the backend, so
    /// they keep its queue depth instead of faulting in one page at a time. For a file this
    /// process neither owns nor may write, Linux reports only the pages already mapped into
    /// the process, so cached pages not yet touched through the mapping are read.
    #[default]
    WhenCached,
    /// Every mappable read of every file, cached or not (cold bytes are then read by page
    /// faults, one at a time, as the consumer touches them).
    Always,
}

/// The smallest file [`MapFiles::WhenCached`] maps: a mapping costs two system calls and an
/// address-space entry, more than reading a small file (one file per chunk, Zarr v2).
pub const MAP_MIN_FILE_BYTES: u64 = 1 << 20;

impl MapFiles {
    /// The policy's name: `never`, `cached` or `always`.
    pub fn name(self) -> &'static str {
        match self {
            MapFiles::Never => "never",
            MapFiles::WhenCached => "cached",
            MapFiles::Always => "always",
        }
    }
}

impl std::str::FromStr for MapFiles {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "never" | "0" | "false" | "no" | "off" => Ok(MapFiles::Never),
            "cached" | "auto" | "resident" => Ok(MapFiles::WhenCached),
            "always" | "1" | "true" | "yes" | "on" => Ok(MapFiles::Always),
            other => Err(format!(
                "unknown mapping policy {other:?} (expected never, cached or always)"
            )),
        }
    }
}

/// Which backend to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// io_uring where it works, else the portable backend (and say why).
    #[default]
    Auto,
    /// io_uring or an error.
    Uring,
    /// Blocking `pread` on a thread pool.
    Portable,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(BackendChoice::Uring),
            "portable" | "pread" => Ok(BackendChoice::Portable),
            other => Err(format!(
                "unknown IO backend {other:?} (expected auto, uring or portable)"
            )),
        }
    }
}

/// The backend an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Linux io_uring.
    Uring,
    /// Blocking `pread` on a thread pool.
    Portable,
}

impl BackendKind {
    /// A short stable name: `"io_uring"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Uring => "io_uring",
            BackendKind::Portable => "portable",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How an engine reads.
#[derive(Debug, Clone)]
pub struct IoConfig {
    /// Backend choice.
    pub backend: BackendChoice,
    /// Worker threads: rings for io_uring, pool threads for the portable backend. `0` picks:
    /// one ring per core but one (at least 1, at most 4) when the threads waiting for results
    /// read cached data themselves (the fast path, see [`Batch`](crate::Batch)), else one per core (at most
    /// 4); or `queue_depth` pool threads (at most 64).
    pub threads: usize,
    /// Reads in flight per engine at most (split across rings).
    pub queue_depth: usize,
    /// Open files with `O_DIRECT` (bypassing the page cache), with ranges rounded out to the
    /// device's alignment and sliced back. Files whose filesystem refuses it are read buffered
    /// (counted in [`MetricsSnapshot::direct_fallbacks`](crate::MetricsSnapshot::direct_fallbacks)).
    pub direct: bool,
    /// When nearby ranges of one file merge into one read.
    pub coalesce: CoalesceLimits,
    /// When the io_uring backend tries a `preadv2(RWF_NOWAIT)` page-cache read first.
    pub fast_path: FastPath,
    /// Open files kept in the LRU cache at most (fewer where the process may open few: see
    /// [`IoEngine::open_files_limit`](crate::IoEngine::open_files_limit)).
    pub fd_cache_capacity: usize,
    /// The in-flight budget; `None` uses the process-wide [`Budget::global`].
    pub budget: Option<Arc<Budget>>,
    /// Take read buffers from the process's buffer pool, and return them to it when the last
    /// view of a result drops (the default). Recycling saves an allocation and page faults
    /// per read, but the pool keeps up to 16 MiB per size class (4 KiB to 4 MiB) alive; turn
    /// it off where memory is budgeted tightly.
    pub recycle_buffers: bool,
    /// When batches submitted with [`IoEngine::submit_mapped`](crate::IoEngine::submit_mapped) are served from read-only
    /// mappings of their files instead of read: no copy out of the page cache and no IO thread
    /// involved, the fastest way to read data that is already cached. See [`MapFiles`]; the
    /// default maps large files for ranges already in memory. Ignored with `direct`.
    pub map_files: MapFiles,
}

/// Default reads in flight per engine.
pub const DEFAULT_QUEUE_DEPTH: usize = 64;

/// Default number of open files cached.
pub const DEFAULT_FD_CACHE: usize = 1024;

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            backend: BackendChoice::Auto,
            threads: 0,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            direct: false,
            coalesce: CoalesceLimits::LOCAL,
            fast_path: FastPath::Auto,
            fd_cache_capacity: DEFAULT_FD_CACHE,
            budget: None,
            recycle_buffers: true,
            map_files: MapFiles::WhenCached,
        }
    }
}

impl IoConfig {
    /// The defaults, overridden by `ZCROP_IO_BACKEND` (`auto`, `uring`, `portable`),
    /// `ZCROP_IO_DIRECT` (`1`), `ZCROP_IO_MMAP` (`never`, `cached`, `always`; `0` and `1` for
    /// never and always), `ZCROP_IO_THREADS` and `ZCROP_IO_QUEUE_DEPTH`. Unparsable values
    /// are reported as errors, not ignored.
    pub fn from_env() -> Result<Self, EngineError> {
        let mut c = IoConfig::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if let Some(v) = var("ZCROP_IO_BACKEND") {
            c.backend = v
                .parse()
                .map_err(|e| EngineError::Config(format!("ZCROP_IO_BACKEND: {e}")))?;
        }
        if let Some(v) = var("ZCROP_IO_DIRECT") {
            c.direct = matches!(v.as_str(), "1" | "true" | "yes");
        }
        if let Some(v) = var("ZCROP_IO_MMAP") {
            c.map_files = v
                .parse()
                .map_err(|e| EngineError::Config(format!("ZCROP_IO_MMAP: {e}")))?;
        }
        let num = |name: &str| -> Result<Option<usize>, EngineError> {
            var(name)
                .map(|v| {
                    v.parse::<usize>()
                        .map_err(|_| EngineError::Config(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        };
        if let Some(n) = num("ZCROP_IO_THREADS")? {
            c.threads = n;
        }
        if let Some(n) = num("ZCROP_IO_QUEUE_DEPTH")? {
            c.queue_depth = n;
        }
        Ok(c)
    }
}

/// Parses sizes like `2G`, `500M`, `64K`, `4096` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, ch)| ch.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_lowercase();
            let mult = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1u64 << 40,
                _ => return Err(format!("unknown size unit in {s:?} (use K, M, G, T)")),
            };
            (&s[..i], mult)
        }
        None => (s, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    if !(n.is_finite() && n >= 0.0) {
        return Err(format!("not a size: {s:?}"));
    }
    Ok((n * mult as f64) as u64)
}
