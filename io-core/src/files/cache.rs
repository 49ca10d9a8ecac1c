//! A bounded least-recently-used cache of open files.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::sync::Mutex;
use rustc_hash::FxHashMap;

use crate::config::{MAP_MIN_FILE_BYTES, MapFiles};
use crate::files::residency::{Mapping, ResidentMemo};
use crate::sys;

/// An open file and what reading it needs to know.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub(crate) file: File,
    /// `Some((memory, offset))` alignment when opened with `O_DIRECT`.
    pub(crate) direct_align: Option<(usize, u64)>,
    /// The whole file mapped, made on first use when the engine maps files; `None` when
    /// mapping failed (the file is then read normally).
    mapped: OnceLock<Option<Mapping>>,
    /// For a thread's own copy ([`OpenFile::reopen`]): the engine's cached file it was opened
    /// from, whose mapping it shares (through a `Bytes` of its own).
    origin: Option<Arc<OpenFile>>,
    /// Which file this is, and what is known of it (the copies read their origin's).
    state: FileState,
}

/// A file's identity and what its last check found.
#[derive(Debug)]
struct FileState {
    /// Device and inode: a path that names another file has been replaced.
    id: (u64, u64),
    /// The file's length when last checked.
    len: AtomicU64,
    /// The newest batch generation that found this file still at its path.
    checked: AtomicU64,
}

impl FileState {
    fn of(file: &File, generation: u64) -> io::Result<Self> {
        let m = file.metadata()?;
        Ok(FileState {
            id: (m.dev(), m.ino()),
            len: AtomicU64::new(m.len()),
            checked: AtomicU64::new(generation),
        })
    }
}

impl OpenFile {
    /// The whole file mapped, mapping it on first use; `None` if it is not to be mapped under
    /// `policy` (too small for [`MapFiles::WhenCached`]) or cannot be (reads then go to the
    /// engine's backend).
    pub(crate) fn mapped(&self, path: &Path, policy: MapFiles) -> Option<&Mapping> {
        self.mapped
            .get_or_init(|| {
                if let Some(origin) = &self.origin {
                    // The thread's own `Bytes` over the same mapping: the views it cuts count
                    // references in an owner of its own, not in one all threads update.
                    return origin.mapped(path, policy).map(|m| Mapping {
                        bytes: Bytes::from_owner(m.bytes.clone()),
                        resident: Arc::clone(&m.resident),
                    });
                }
                if policy == MapFiles::WhenCached {
                    let len = self.file.metadata().map_or(0, |m| m.len());
                    if len < MAP_MIN_FILE_BYTES {
                        return None;
                    }
                }
                Self::map(&self.file, path)
            })
            .as_ref()
    }

    /// [`OpenFile::mapped`] where that takes no system call: the mapping if the file was
    /// already mapped (or found not to be mapped), or is a thread's copy of a file that was;
    /// else `None`.
    pub(crate) fn mapped_if_known(&self, path: &Path, policy: MapFiles) -> Option<&Mapping> {
        match self.mapped.get() {
            Some(known) => known.as_ref(),
            None => {
                let origin = self.origin.as_ref()?;
                origin.mapped.get()?.as_ref()?;
                self.mapped(path, policy)
            }
        }
    }

    /// A second open file description of the same file, for one thread to read through
    /// alone. Threads of one process that read one descriptor all update the kernel's
    /// reference count of its open file on every read (a single-threaded process skips that),
    /// and the same goes for the `Arc` of a shared `OpenFile`: on cached 4 KiB reads from two
    /// cores, that contention costs several percent of the reads per second. Linux only (the
    /// copy is opened through `/proc/self/fd`, so it is the same file even if its path has
    /// been replaced since); `None` where that fails or for `O_DIRECT` files (read through
    /// the ring, where the copy would not help).
    pub(crate) fn reopen(self: &Arc<Self>) -> Option<OpenFile> {
        use std::os::fd::AsRawFd;
        if !cfg!(target_os = "linux") || self.direct_align.is_some() || self.origin.is_some() {
            return None;
        }
        let link = format!("/proc/self/fd/{}", self.file.as_raw_fd());
        match sys::open(Path::new(&link), false) {
            Ok(file) => Some(OpenFile {
                file,
                direct_align: None,
                mapped: OnceLock::new(),
                origin: Some(Arc::clone(self)),
                state: FileState {
                    id: self.state.id,
                    len: AtomicU64::new(0),
                    checked: AtomicU64::new(0),
                },
            }),
            Err(e) => {
                log::debug!("cannot reopen {link} for one thread: {e}");
                None
            }
        }
    }

    /// The file whose identity and checks this one shares: itself, or its origin.
    fn root(&self) -> &OpenFile {
        self.origin.as_deref().unwrap_or(self)
    }

    /// Whether a read of a batch of `generation` may use this file without looking at its
    /// path again: a batch submitted after the last check must see a file written (replaced,
    /// deleted) before it started.
    pub(crate) fn checked_for(&self, generation: u64) -> bool {
        self.root().state.checked.load(Ordering::Acquire) >= generation
    }

    /// The file's length as last checked.
    pub(crate) fn known_len(&self) -> u64 {
        self.root().state.len.load(Ordering::Acquire)
    }

    /// The file's length now (it may have grown since it was checked), also kept as known.
    pub(crate) fn current_len(&self) -> io::Result<u64> {
        let len = self.file.metadata()?.len();
        self.root().state.len.store(len, Ordering::Release);
        Ok(len)
    }

    fn map(file: &File, path: &Path) -> Option<Mapping> {
        match sys::map_file(file) {
            Ok(bytes) => Some(Mapping {
                resident: Arc::new(ResidentMemo::new(bytes.len())),
                bytes,
            }),
            Err(e) => {
                log::debug!("{}: not mapped ({e}); reading it instead", path.display());
                None
            }
        }
    }
}

/// Open files keyed by `(path, direct)`. A file evicted while reads still use it stays open
/// until the last of them finishes (entries are `Arc`s).
///
/// Entries are checked against their path once per batch that uses them (one `stat`): a path
/// that now names another file (rewritten through a temporary file and a rename, as
/// zarr-python writes) is opened again, one that names nothing any more is not found.
#[derive(Debug)]
pub(crate) struct FdCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: FxHashMap<(Arc<Path>, bool), (Arc<OpenFile>, u64)>,
    tick: u64,
}

/// What opening a file produced.
pub(crate) struct Opened {
    pub(crate) file: Arc<OpenFile>,
    /// The file refused `O_DIRECT` and was opened buffered instead.
    pub(crate) direct_fell_back: bool,
}

/// A file just opened: the file, its `O_DIRECT` alignment, whether `O_DIRECT` was refused.
type Raw = (File, Option<(usize, u64)>, bool);

/// The share of the process's free descriptors (its `RLIMIT_NOFILE` soft limit less those
/// open) the cache may hold: the application needs the rest for itself.
const SHARE_OF_FREE_DESCRIPTORS: usize = 4;

/// The fewest files the cache holds whatever the limit says (a crop reads a handful of
/// shards at once).
const MIN_CAPACITY: usize = 8;

impl FdCache {
    /// A cache of at most `capacity` files, and no more than a quarter of the descriptors this
    /// process may still open.
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = match sys::free_descriptors() {
            Some(free) => capacity.min((free / SHARE_OF_FREE_DESCRIPTORS).max(MIN_CAPACITY)),
            None => capacity,
        };
        FdCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// How many files the cache holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `path` is open in the cache.
    pub(crate) fn is_open(&self, path: &Arc<Path>, direct: bool) -> bool {
        self.inner
            .lock()
            .map
            .contains_key(&(Arc::clone(path), direct))
    }

    /// The open file for `path`, as a read of a batch of `generation` may use it: the cached
    /// one, checked against its path once per batch, or (on a miss, or when the path now
    /// names another file) one opened now, outside the lock.
    pub(crate) fn get(
        &self,
        path: &Arc<Path>,
        direct: bool,
        generation: u64,
    ) -> io::Result<Opened> {
        let key = (Arc::clone(path), direct);
        let cached = {
            let mut inner = self.inner.lock();
            inner.tick += 1;
            let tick = inner.tick;
            inner.map.get_mut(&key).map(|(f, used)| {
                *used = tick;
                Arc::clone(f)
            })
        };
        if let Some(f) = cached {
            if f.checked_for(generation) || self.still_there(&f, path, generation)? {
                return Ok(Opened {
                    direct_fell_back: direct && f.direct_align.is_none(),
                    file: f,
                });
            }
            // The path names another file now: forget this one (unless another thread
            // already put the new one in its place).
            let mut inner = self.inner.lock();
            if inner.map.get(&key).is_some_and(|(g, _)| Arc::ptr_eq(g, &f)) {
                inner.map.remove(&key);
            }
        }
        let (file, direct_align, fell_back) = self.open(path, direct)?;
        if fell_back {
            log::warn!(
                "{}: the filesystem refuses O_DIRECT; reading it through the page cache",
                path.display()
            );
        }
        let opened = Arc::new(OpenFile {
            state: FileState::of(&file, generation)?,
            file,
            direct_align,
            mapped: OnceLock::new(),
            origin: None,
        });
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        // A racing thread may have opened the same file meanwhile: one entry is kept, the
        // newer (the other one may already be out of date).
        inner.map.insert(key, (Arc::clone(&opened), tick));
        if inner.map.len() > self.capacity {
            // Evict the least recently used eighth at once: one O(n) pass per `capacity / 8`
            // misses, not per miss (a store of many small chunk files misses on nearly every
            // read, and a pass over a full cache of 1024 files costs about as much as an open).
            // Ticks are unique, so exactly `evict` entries go, never the one just added.
            Self::evict(&mut inner, (self.capacity / 8).max(1));
        }
        Ok(Opened {
            file: opened,
            direct_fell_back: fell_back,
        })
    }

    /// Whether `path` still names `file` (it then counts as checked for `generation`, with
    /// its length brought up to date); `Err` if the path names nothing now.
    fn still_there(&self, file: &OpenFile, path: &Path, generation: u64) -> io::Result<bool> {
        let m = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    let mut inner = self.inner.lock();
                    inner.map.retain(|(p, _), _| **p != *path);
                }
                return Err(e);
            }
        };
        if (m.dev(), m.ino()) != file.state.id {
            return Ok(false);
        }
        file.state.len.store(m.len(), Ordering::Release);
        file.state.checked.fetch_max(generation, Ordering::AcqRel);
        Ok(true)
    }

    /// Opens `path`; when the process is out of descriptors, closes the least recently used
    /// half of the cache and tries once more. Returns the file, its `O_DIRECT` alignment, and
    /// whether `O_DIRECT` was refused.
    fn open(&self, path: &Path, direct: bool) -> io::Result<Raw> {
        match Self::open_once(path, direct) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                {
                    let mut inner = self.inner.lock();
                    let half = inner.map.len().div_ceil(2);
                    Self::evict(&mut inner, half);
                }
                log::warn!(
                    "{}: out of file descriptors; closed half of zcrop's open files and retried",
                    path.display()
                );
                Self::open_once(path, direct)
            }
            r => r,
        }
    }

    fn open_once(path: &Path, direct: bool) -> io::Result<Raw> {
        if direct {
            match sys::open(path, true) {
                Ok(f) => {
                    let align = sys::dio_alignment(&f);
                    Ok((f, Some(align), false))
                }
                // Filesystems without O_DIRECT (tmpfs, some FUSE) answer EINVAL.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    Ok((sys::open(path, false)?, None, true))
                }
                Err(e) => Err(e),
            }
        } else {
            Ok((sys::open(path, false)?, None, false))
        }
    }

    /// Drops the `n` least recently used entries.
    fn evict(inner: &mut Inner, n: usize) {
        if n == 0 || inner.map.is_empty() {
            return;
        }
        let n = n.min(inner.map.len());
        let mut ticks: Vec<u64> = inner.map.values().map(|(_, used)| *used).collect();
        let (_, &mut cutoff, _) = ticks.select_nth_unstable(n - 1);
        inner.map.retain(|_, (_, used)| *used > cutoff);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    #[cfg(test)]
    fn contains(&self, path: &Arc<Path>) -> bool {
        self.inner
            .lock()
            .map
            .contains_key(&(Arc::clone(path), false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` one-byte files in `dir`.
    fn files(dir: &Path, n: usize) -> Vec<Arc<Path>> {
        (0..n)
            .map(|i| {
                let p = dir.join(format!("f{i}"));
                std::fs::write(&p, b"x").unwrap();
                Arc::from(p.as_path())
            })
            .collect()
    }

    #[test]
    fn evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), 3);
        let cache = FdCache::new(2);
        let a = cache.get(&paths[0], false, 1).unwrap().file;
        cache.get(&paths[1], false, 1).unwrap();
        cache.get(&paths[0], false, 1).unwrap(); // 0 is now more recent than 1
        cache.get(&paths[2], false, 1).unwrap(); // evicts 1
        assert_eq!(cache.len(), 2);
        let again = cache.get(&paths[0], false, 1).unwrap().file;
        assert!(Arc::ptr_eq(&a, &again), "0 stayed cached");
        assert!(cache.get(&paths[1], false, 1).is_ok());
        assert!(
            cache
                .get(&Arc::from(dir.path().join("missing").as_path()), false, 1)
                .is_err()
        );
    }

    #[test]
    fn the_cache_holds_at_most_a_quarter_of_the_free_descriptors() {
        let free = sys::free_descriptors().expect("RLIMIT_NOFILE is readable here");
        let cache = FdCache::new(usize::MAX);
        assert_eq!(
            cache.capacity(),
            (free / SHARE_OF_FREE_DESCRIPTORS).max(MIN_CAPACITY)
        );
        assert_eq!(FdCache::new(16).capacity(), 16.min(cache.capacity()));
    }

    #[test]
    fn a_file_is_checked_against_its_path_once_per_generation() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), 1);
        let cache = FdCache::new(4);
        let first = cache.get(&paths[0], false, 1).unwrap().file;
        // Replaced through a rename: the same generation keeps the file it checked...
        let tmp = dir.path().join("tmp");
        std::fs::write(&tmp, b"new contents").unwrap();
        std::fs::rename(&tmp, &*paths[0]).unwrap();
        let same = cache.get(&paths[0], false, 1).unwrap().file;
        assert!(Arc::ptr_eq(&first, &same));
        // ...a later one opens the new file.
        let newer = cache.get(&paths[0], false, 2).unwrap().file;
        assert!(!Arc::ptr_eq(&first, &newer));
        assert_eq!(newer.known_len(), 12);
        assert!(newer.checked_for(2) && !first.checked_for(2));
        // Unchanged: checked again, kept.
        let again = cache.get(&paths[0], false, 3).unwrap().file;
        assert!(Arc::ptr_eq(&newer, &again) && again.checked_for(3));
        // Deleted: not found, and gone from the cache.
        std::fs::remove_file(&*paths[0]).unwrap();
        let err = cache.get(&paths[0], false, 4).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_full_cache_evicts_its_least_recently_used_eighth() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), 17);
        let cache = FdCache::new(16);
        for p in &paths[..16] {
            cache.get(p, false, 1).unwrap();
        }
        // Use 0 and 1 again: 2 and 3 are now the least recently used.
        cache.get(&paths[0], false, 1).unwrap();
        cache.get(&paths[1], false, 1).unwrap();
        cache.get(&paths[16], false, 1).unwrap();
        assert_eq!(cache.len(), 15, "16 + 1 - 2 evicted at once");
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(cache.contains(p), i != 2 && i != 3, "file {i}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_reopened_copy_reads_the_same_file_and_shares_its_mapping() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 2 * MAP_MIN_FILE_BYTES as usize]).unwrap();
        let path: Arc<Path> = Arc::from(p.as_path());
        let cache = FdCache::new(2);
        let shared = cache.get(&path, false, 1).unwrap().file;
        // Replace the path: the copy must still be the file that was opened.
        let moved = dir.path().join("g");
        std::fs::rename(&p, &moved).unwrap();
        std::fs::write(&p, b"another file").unwrap();
        let own = shared.reopen().expect("reopened through /proc/self/fd");
        assert_ne!(own.file.as_raw_fd(), shared.file.as_raw_fd());
        let mut buf = [0u8; 4];
        assert_eq!(own.file.read_at(&mut buf, 100).unwrap(), 4);
        assert_eq!(buf, [7; 4]);
        let own = Arc::new(own);
        assert!(own.reopen().is_none(), "copies are not copied again");
        let mapped = own.mapped(&path, MapFiles::Always).expect("mapped");
        let again = shared.mapped(&path, MapFiles::Always).expect("mapped");
        assert_eq!(
            mapped.bytes.as_ptr(),
            again.bytes.as_ptr(),
            "one mapping for both"
        );
        assert!(
            Arc::ptr_eq(&mapped.resident, &again.resident),
            "one record of what is in memory for both"
        );
    }
}
