//! A bounded least-recently-used cache of open files.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use parking_lot::Mutex;

use crate::engine::{MAP_MIN_FILE_BYTES, MapFiles};
use crate::sys;

/// An open file and what reading it needs to know.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub(crate) file: File,
    /// `Some((memory, offset))` alignment when opened with `O_DIRECT`.
    pub(crate) direct_align: Option<(usize, u64)>,
    /// The whole file mapped, made on first use when the engine maps files; `None` when
    /// mapping failed (the file is then read normally).
    mapped: OnceLock<Option<Bytes>>,
}

impl OpenFile {
    /// The whole file as mapped `Bytes`, mapping it on first use; `None` if it is not to be
    /// mapped under `policy` (too small for [`MapFiles::WhenCached`]) or cannot be (reads
    /// then go to the engine's backend).
    pub(crate) fn mapped(&self, path: &Path, policy: MapFiles) -> Option<&Bytes> {
        self.mapped
            .get_or_init(|| {
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

    fn map(file: &File, path: &Path) -> Option<Bytes> {
        match sys::map_file(file) {
            Ok(b) => Some(b),
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
    map: HashMap<(Arc<Path>, bool), (Arc<OpenFile>, u64)>,
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
            // O(n) eviction on a miss only; n is the (small) capacity.
            if let Some(oldest) = inner
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            {
                inner.map.remove(&oldest);
            }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let paths: Vec<Arc<Path>> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("f{i}"));
                std::fs::write(&p, b"x").unwrap();
                Arc::from(p.as_path())
            })
            .collect();
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
}
