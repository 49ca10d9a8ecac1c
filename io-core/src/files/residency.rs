//! A mapped file ([`Mapping`]), which parts of it are in memory, and whether a read is served
//! from the mapping: the page-cache probes (`cachestat`, `mincore`), what they found for a
//! while, and how often to ask.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use crate::config::MapFiles;
use crate::range::ReadRange;
use crate::sys;

/// A whole file mapped, and what is known of which parts of it are in memory.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) bytes: Bytes,
    /// Shared by every thread's copy of the file (see [`OpenFile::reopen`]).
    pub(crate) resident: Arc<ResidentMemo>,
}

/// Whether asking the page cache about a thread's reads keeps paying off: while at least half
/// of the last [`CacheProbe::WINDOW`] answers were "cached", every read asks; otherwise (a
/// cold file) only one read in [`CacheProbe::PROBE_EVERY`] does, and the others go straight to
/// the backend, sparing a system call each. Used for the `RWF_NOWAIT` fast path and for the
/// residency check before serving a read from a mapping.
#[derive(Debug, Default)]
pub(crate) struct CacheProbe {
    cold: bool,
    tries: u32,
    hits: u32,
    skipped: u32,
}

impl CacheProbe {
    /// Answers per verdict.
    const WINDOW: u32 = 64;
    /// While cold, one read in this many asks.
    const PROBE_EVERY: u32 = 32;

    /// Whether this read should ask (and then [`CacheProbe::record`] the answer).
    pub(crate) fn should_ask(&mut self) -> bool {
        if !self.cold {
            return true;
        }
        self.skipped += 1;
        self.skipped.is_multiple_of(Self::PROBE_EVERY)
    }

    /// Records an answer.
    pub(crate) fn record(&mut self, hit: bool) {
        self.tries += 1;
        self.hits += u32::from(hit);
        if self.tries >= Self::WINDOW {
            self.cold = self.hits * 2 < self.tries;
            self.tries = 0;
            self.hits = 0;
        }
    }
}

/// Which parts of one mapped file were found all in memory, and when: one `cachestat(2)`
/// call over an aligned [`ResidentMemo::WINDOW`] of the file answers, for every thread, for
/// the reads that fall inside it during the next [`ResidentMemo::FRESH`]
/// ([`MapFiles::WhenCached`]). The kernel's answer costs time for every page of the window,
/// and a crop's chunks lie a few hundred KiB apart in their shard, so asking for each read, or
/// for each window and run of reads, spends a visible share of the CPU on the checks alone;
/// one answer per window shared by all threads does not (measurements: docs/performance.md,
/// "File mappings"). An answer kept for a while can be out of date: a page
/// evicted in between is faulted back in when it is read, slower, never wrong.
#[derive(Debug)]
pub(crate) struct ResidentMemo {
    /// Per window, the time ([`ResidentMemo::now`]) it was last found all in memory; 0: not
    /// since the file was mapped.
    found: Box<[AtomicU64]>,
    /// The mapping's length.
    len: usize,
}

impl ResidentMemo {
    /// Bytes per window, as a shift: 1 MiB.
    const WINDOW_SHIFT: u32 = 20;
    /// Bytes per window.
    pub(crate) const WINDOW: usize = 1 << Self::WINDOW_SHIFT;
    /// How long an answer is kept.
    pub(crate) const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

    /// A memo of nothing found yet, for a mapping of `len` bytes.
    pub(crate) fn new(len: usize) -> Self {
        let windows = len.div_ceil(Self::WINDOW);
        ResidentMemo {
            found: (0..windows).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// Microseconds since the process's first call (never 0, so 0 can mean "never").
    pub(crate) fn now() -> u64 {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX) + 1
    }

    /// The windows `start..end` (non-empty, inside the mapping) touches.
    fn windows(start: usize, end: usize) -> std::ops::RangeInclusive<usize> {
        (start >> Self::WINDOW_SHIFT)..=((end - 1) >> Self::WINDOW_SHIFT)
    }

    /// Whether every window of `start..end` was found all in memory within
    /// [`ResidentMemo::FRESH`] before `now`.
    pub(crate) fn fresh(&self, start: usize, end: usize, now: u64) -> bool {
        let fresh = Self::FRESH.as_micros() as u64;
        Self::windows(start, end).all(|w| {
            let at = self.found[w].load(Ordering::Relaxed);
            at != 0 && now.saturating_sub(at) < fresh
        })
    }

    /// Asks the kernel whether the windows of `start..end` of `file` (mapped as this memo's
    /// mapping) are all in memory, and records a yes as of `now`. `false` on no, and where the
    /// kernel has no `cachestat` (asking `mincore` about more than the read costs more than
    /// it saves).
    pub(crate) fn ask(&self, file: &std::fs::File, start: usize, end: usize, now: u64) -> bool {
        let windows = Self::windows(start, end);
        let from = windows.start() << Self::WINDOW_SHIFT;
        let to = ((windows.end() + 1) << Self::WINDOW_SHIFT).min(self.len);
        if sys::cachestat_resident(file, from, to) != Some(true) {
            return false;
        }
        for w in windows {
            self.found[w].store(now, Ordering::Relaxed);
        }
        true
    }
}

/// A thread's record of how its window asks went: while a file is partly cold (a window of
/// it was not all in memory), reads ask about their own range alone, and only one in
/// [`WindowRetry::EVERY`] asks about its window first.
#[derive(Debug, Default)]
pub(crate) struct WindowRetry {
    /// Reads since a window that was not all in memory (0: the last one was).
    misses: u32,
}

impl WindowRetry {
    /// See [`WindowRetry`].
    const EVERY: u32 = 16;

    /// Whether this read should ask about its window (then [`WindowRetry::record`] the answer).
    fn should_ask(&mut self) -> bool {
        if self.misses == 0 {
            return true;
        }
        self.misses += 1;
        self.misses.is_multiple_of(Self::EVERY)
    }

    fn record(&mut self, all_in_memory: bool) {
        self.misses = if all_in_memory { 0 } else { self.misses.max(1) };
    }
}

/// A thread's reading of [`ResidentMemo::now`], taken again every [`CoarseClock::READS`]
/// reads and after every flush (before the thread waits): reading the clock for every read
/// shows in the profile of the thread serving a batch, and an answer's age need not be known
/// to the microsecond.
#[derive(Debug, Default)]
pub(crate) struct CoarseClock {
    now: u64,
    reads_left: u32,
}

impl CoarseClock {
    /// Reads per reading of the clock.
    const READS: u32 = 16;

    /// The time, at most [`CoarseClock::READS`] reads old.
    fn now(&mut self) -> u64 {
        if self.reads_left == 0 {
            self.now = ResidentMemo::now();
            self.reads_left = Self::READS;
        }
        self.reads_left -= 1;
        self.now
    }

    /// Reads the clock again at the next read.
    pub(crate) fn forget(&mut self) {
        self.reads_left = 0;
    }
}

/// The part of `map` (a mapped file) that serves a read of `range`, if the engine's policy
/// says to serve it from the mapping: bounded ranges inside an intact mapping, and for
/// [`MapFiles::WhenCached`] only ranges whose pages are all in memory (the file's size was
/// checked when it was mapped) or lie in windows recently found so ([`ResidentMemo`]), asked
/// only as often as `probe` and `retry` say; without them (`ask` is `None`), only the latter.
pub(crate) fn mapped_range(
    range: ReadRange,
    file: &std::fs::File,
    map: &Mapping,
    policy: MapFiles,
    ask: Option<(&mut CacheProbe, &mut WindowRetry)>,
    clock: &mut CoarseClock,
) -> Option<(usize, usize)> {
    let whole = &map.bytes;
    let ReadRange::Bounded { offset, len } = range else {
        return None;
    };
    let end = offset.checked_add(len)?;
    if len == 0
        || end > whole.len() as u64
        || !crate::files::mapguard::in_place()
        || !crate::files::mapguard::intact(whole.as_ptr())
    {
        return None;
    }
    let (start, end) = (offset as usize, end as usize);
    match policy {
        MapFiles::Never => None,
        MapFiles::Always => Some((start, end)),
        MapFiles::WhenCached => {
            let now = clock.now();
            if map.resident.fresh(start, end, now) {
                return Some((start, end));
            }
            let (probe, retry) = ask?;
            if !probe.should_ask() {
                return None;
            }
            if retry.should_ask() {
                let all = map.resident.ask(file, start, end, now);
                retry.record(all);
                if all {
                    probe.record(true);
                    return Some((start, end));
                }
            }
            let cached = sys::resident(file, whole, start, end);
            probe.record(cached);
            cached.then_some((start, end))
        }
    }
}

/// Whether `range` is a bounded range ending within `len` bytes: a mapping (made at the
/// file's length then) serves no more than the file's length as last checked, so that a file
/// found shrunk is read, not faulted on.
pub(crate) fn within(range: ReadRange, len: u64) -> bool {
    matches!(range, ReadRange::Bounded { offset, len: n }
        if offset.checked_add(n).is_some_and(|end| end <= len))
}

#[cfg(test)]
mod tests {
    use super::{
        CacheProbe, CoarseClock, MapFiles, Mapping, ResidentMemo, WindowRetry, mapped_range,
    };
    use crate::range::ReadRange;
    use crate::sys;
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    /// A temporary file of `len` bytes, its mapping, and an open descriptor.
    fn mapped_file(len: usize) -> (tempfile::NamedTempFile, std::fs::File, bytes::Bytes) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![9u8; len]).unwrap();
        f.as_file().sync_all().unwrap();
        let file = f.reopen().unwrap();
        let whole = sys::map_file(&file).unwrap();
        (f, file, whole)
    }

    fn range(start: usize, end: usize) -> ReadRange {
        ReadRange::Bounded {
            offset: start as u64,
            len: (end - start) as u64,
        }
    }

    /// The mapping of `whole` with nothing known of what is in memory.
    fn mapping(whole: bytes::Bytes) -> Mapping {
        Mapping {
            resident: Arc::new(ResidentMemo::new(whole.len())),
            bytes: whole,
        }
    }

    /// On a file all in memory, one ask answers for every thread's reads in its aligned
    /// window (a read across two windows asks about both) until the answer is
    /// [`ResidentMemo::FRESH`] old.
    #[test]
    fn one_ask_serves_every_threads_reads_in_its_window() {
        const W: usize = ResidentMemo::WINDOW;
        let (_f, file, whole) = mapped_file(4 * W + 1000);
        if sys::cachestat_resident(&file, 0, 4096).is_none() {
            return; // No cachestat: no windows (mincore's cost grows with the range).
        }
        let map = mapping(whole);
        let stamps = |m: &Mapping| -> Vec<u64> {
            m.resident
                .found
                .iter()
                .map(|a| a.load(Ordering::Relaxed))
                .collect()
        };
        assert_eq!(stamps(&map), [0; 5]);
        let serve = |start: usize, end: usize, local: &mut (CacheProbe, WindowRetry)| {
            mapped_range(
                range(start, end),
                &file,
                &map,
                MapFiles::WhenCached,
                Some((&mut local.0, &mut local.1)),
                &mut CoarseClock::default(),
            )
        };
        // Without asking (as a consumer serves reads while it plans them): only windows
        // already found all in memory.
        let unasked = |start: usize, end: usize| {
            let r = range(start, end);
            let clock = &mut CoarseClock::default();
            mapped_range(r, &file, &map, MapFiles::WhenCached, None, clock)
        };
        assert_eq!(
            unasked(1000, 20_000),
            None,
            "resident, but never asked about"
        );
        let (mut a, mut b) = Default::default();
        let before = ResidentMemo::now();
        assert_eq!(serve(1000, 20_000, &mut a), Some((1000, 20_000)));
        assert_eq!(
            unasked(30_000, 40_000),
            Some((30_000, 40_000)),
            "its window was found"
        );
        assert_eq!(unasked(W + 1, W + 2), None, "another window");
        let first = stamps(&map)[0];
        assert!(first >= before);
        assert_eq!(
            stamps(&map)[1..],
            [0; 4],
            "only the read's window was asked about"
        );
        // Other reads in window 0, by either thread: no new ask (the stamp stays).
        for k in 0..200 {
            let at = (k * 5_003) % (W - 100);
            let local = if k % 2 == 0 { &mut a } else { &mut b };
            assert_eq!(serve(at, at + 100, local), Some((at, at + 100)));
        }
        assert_eq!(stamps(&map)[0], first);
        // Across windows 1 and 2: both asked about at once.
        assert_eq!(
            serve(2 * W - 10, 2 * W + 10, &mut b),
            Some((2 * W - 10, 2 * W + 10))
        );
        let s = stamps(&map);
        assert!(s[1] > 0 && s[1] == s[2], "{s:?}");
        assert_eq!(s[3..], [0; 2]);
        // The last window, shorter than the others.
        assert_eq!(
            serve(4 * W, 4 * W + 1000, &mut a),
            Some((4 * W, 4 * W + 1000))
        );
        assert!(stamps(&map)[4] > 0);
        // Answers go stale.
        let fresh = ResidentMemo::FRESH.as_micros() as u64;
        assert!(map.resident.fresh(0, W, first + fresh - 1));
        assert!(!map.resident.fresh(0, W, first + fresh));
        assert!(
            !map.resident.fresh(W - 1, W + 1, s[1] + fresh),
            "one stale window of two"
        );
        assert!(
            !map.resident.fresh(3 * W, 3 * W + 1, first),
            "never asked about"
        );
    }

    /// Served from the mapping only where every page is in memory, whatever the windows said
    /// before: a file dropped from the page cache with three of every four 16 KiB read back in
    /// (so no window is all in memory, and most reads are), read in runs going forward through
    /// it (as the windows expect) and at random.
    #[test]
    fn only_resident_ranges_are_served_from_the_mapping() {
        const LEN: usize = 8 << 20;
        let (_f, file, whole) = mapped_file(LEN);
        sys::drop_from_page_cache(&file);
        for at in (0..LEN).step_by(16 << 10).filter(|at| at % (64 << 10) != 0) {
            let mut buf = sys::ReadBuf::new(16 << 10, None, false);
            sys::pread(&file, &mut buf, at as u64, 16 << 10, false).unwrap();
        }
        let map = mapping(whole);
        let (mut probe, mut retry) = (CacheProbe::default(), WindowRetry::default());
        let mut clock = CoarseClock::default();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |n: usize| {
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) as usize % n
        };
        let (mut served, mut asked) = (0, 0);
        for run in 0..400 {
            let mut at = next(LEN - (1 << 20));
            for _ in 0..16 {
                let end = at + 1 + next(4 << 10);
                let got = mapped_range(
                    range(at, end),
                    &file,
                    &map,
                    MapFiles::WhenCached,
                    Some((&mut probe, &mut retry)),
                    &mut clock,
                );
                if let Some(r) = got {
                    assert_eq!(r, (at, end));
                    assert!(
                        sys::resident(&file, &map.bytes, at, end),
                        "run {run}: {at}..{end} served but not in memory"
                    );
                    served += 1;
                }
                asked += 1;
                at = if run % 2 == 0 {
                    end + next(64 << 10)
                } else {
                    next(LEN - (4 << 10) - 1)
                };
            }
        }
        assert!(
            served * 2 > asked,
            "{served} of {asked} reads served from the mapping"
        );
    }

    /// The clock is read again after [`CoarseClock::READS`] reads, and at the first read
    /// after a flush.
    #[test]
    fn a_coarse_clock_reads_the_clock_every_16_reads_and_after_forgetting() {
        let pause = || std::thread::sleep(std::time::Duration::from_millis(1));
        let mut c = CoarseClock::default();
        let t0 = c.now();
        for _ in 1..CoarseClock::READS {
            pause();
            assert_eq!(c.now(), t0);
        }
        pause();
        let t1 = c.now();
        assert!(t1 > t0);
        pause();
        c.forget();
        assert!(c.now() > t1);
    }

    /// Asks of `n` reads, each answered `hit`.
    fn asks(p: &mut CacheProbe, n: u32, hit: bool) -> u32 {
        let mut asked = 0;
        for _ in 0..n {
            if p.should_ask() {
                p.record(hit);
                asked += 1;
            }
        }
        asked
    }

    #[test]
    fn a_cold_probe_asks_one_read_in_32_and_warms_up_again() {
        let mut p = CacheProbe::default();
        assert_eq!(asks(&mut p, 1024, true), 1024, "warm: every read asks");
        assert_eq!(asks(&mut p, 64, false), 64, "a window of misses");
        assert_eq!(asks(&mut p, 2048, false), 64, "cold: one read in 32");
        // Hits come back: a window of 64 answers (64 * 32 reads) turns it warm again.
        let n = 64 * CacheProbe::PROBE_EVERY;
        assert_eq!(asks(&mut p, n, true), 64);
        assert_eq!(asks(&mut p, 500, true), 500, "warm again");
        // Half hits keep it warm.
        for _ in 0..10 {
            assert_eq!(asks(&mut p, 32, true) + asks(&mut p, 32, false), 64);
        }
    }
}
