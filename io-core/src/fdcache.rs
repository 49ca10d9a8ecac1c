//! A bounded least-recently-used cache of open files.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::engine::{MAP_MIN_FILE_BYTES, MapFiles};
use crate::op::ResidentMemo;
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
}

/// A whole file mapped, and what is known of which parts of it are in memory.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) bytes: Bytes,
    /// Shared by every thread's copy of the file (see [`OpenFile::reopen`]).
    pub(crate) resident: Arc<ResidentMemo>,
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
            }),
            Err(e) => {
                log::debug!("cannot reopen {link} for one thread: {e}");
                None
            }
        }
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

impl FdCache {
    pub(crate) fn new(capacity: usize) -> Self {
        FdCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Whether `path` is open in the cache.
    pub(crate) fn is_open(&self, path: &Arc<Path>, direct: bool) -> bool {
        self.inner
            .lock()
            .map
            .contains_key(&(Arc::clone(path), direct))
    }

    /// The open file for `path`, opening it (outside the lock) on a miss.
    pub(crate) fn get(&self, path: &Arc<Path>, direct: bool) -> io::Result<Opened> {
        {
            let mut inner = self.inner.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some((f, used)) = inner.map.get_mut(&(Arc::clone(path), direct)) {
                *used = tick;
                return Ok(Opened {
                    file: Arc::clone(f),
                    direct_fell_back: direct && f.direct_align.is_none(),
                });
            }
        }
        let (file, direct_align, fell_back) = if direct {
            match sys::open(path, true) {
                Ok(f) => {
                    let align = sys::dio_alignment(&f);
                    (f, Some(align), false)
                }
                // Filesystems without O_DIRECT (tmpfs, some FUSE) answer EINVAL.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (sys::open(path, false)?, None, true)
                }
                Err(e) => return Err(e),
            }
        } else {
            (sys::open(path, false)?, None, false)
        };
        if fell_back {
            log::warn!(
                "{}: the filesystem refuses O_DIRECT; reading it through the page cache",
                path.display()
            );
        }
        let opened = Arc::new(OpenFile {
            file,
            direct_align,
            mapped: OnceLock::new(),
            origin: None,
        });
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let entry = inner
            .map
            .entry((Arc::clone(path), direct))
            .or_insert_with(|| (Arc::clone(&opened), tick));
        entry.1 = tick;
        let file = Arc::clone(&entry.0);
        if inner.map.len() > self.capacity {
            // Evict the least recently used eighth at once: one O(n) pass per `capacity / 8`
            // misses, not per miss (a store of many small chunk files misses on nearly every
            // read, and a pass over a full cache of 1024 files costs about as much as an open).
            // Ticks are unique, so exactly `evict` entries go, never the one just added.
            let evict = (self.capacity / 8).max(1);
            let mut ticks: Vec<u64> = inner.map.values().map(|(_, used)| *used).collect();
            let (_, &mut cutoff, _) = ticks.select_nth_unstable(evict - 1);
            inner.map.retain(|_, (_, used)| *used > cutoff);
        }
        Ok(Opened {
            file,
            direct_fell_back: fell_back,
        })
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
        let a = cache.get(&paths[0], false).unwrap().file;
        cache.get(&paths[1], false).unwrap();
        cache.get(&paths[0], false).unwrap(); // 0 is now more recent than 1
        cache.get(&paths[2], false).unwrap(); // evicts 1
        assert_eq!(cache.len(), 2);
        let again = cache.get(&paths[0], false).unwrap().file;
        assert!(Arc::ptr_eq(&a, &again), "0 stayed cached");
        assert!(cache.get(&paths[1], false).is_ok());
        assert!(
            cache
                .get(&Arc::from(dir.path().join("missing").as_path()), false)
                .is_err()
        );
    }

    #[test]
    fn a_full_cache_evicts_its_least_recently_used_eighth() {
        let dir = tempfile::tempdir().unwrap();
        let paths = files(dir.path(), 17);
        let cache = FdCache::new(16);
        for p in &paths[..16] {
            cache.get(p, false).unwrap();
        }
        // Use 0 and 1 again: 2 and 3 are now the least recently used.
        cache.get(&paths[0], false).unwrap();
        cache.get(&paths[1], false).unwrap();
        cache.get(&paths[16], false).unwrap();
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
        let shared = cache.get(&path, false).unwrap().file;
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
