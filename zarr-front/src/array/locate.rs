//! Where each leaf chunk's bytes are: its storage chunk (a file or object), and through the
//! shard indexes of every level the byte range inside it. Indexes are cached with the version
//! of their file ([`FileStamp`]); a large read of a sharded array from local files locates its
//! first [`FIRST_LOCATED`] leaves alone, so their reads go out while the rest is located.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use zcrop_io::{IoError, ReadRange, ReadRequest};

use crate::error::{Result, ZarrError};
use crate::plan::Plan;
use crate::shard::{IndexEntry, ShardLevel};
use crate::store::Reader;

use super::Array;
use super::decoded::DecodedChunks;
use super::fetch::{Source, Storage, Storages};
use super::options::ReadStats;

/// One version of a local file: its identity, length and change times. A file replaced (for
/// instance written to a temporary file and renamed over, as zarr-python writes), rewritten in
/// place or deleted has another (or none). Cached shard indexes and decoded chunks are kept
/// with the stamp of the file they came from, and used only while the file still has it:
/// one `stat` per file per read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of the file at `path`; `None` if there is none.
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Some(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        })
    }
}

/// Where the bytes of an inner shard sit inside its file, while walking the shard levels.
#[derive(Debug, Clone)]
enum Cursor {
    Missing,
    /// Encoded bytes at hand (an Icechunk chunk inline in manifest `storage`).
    Inline {
        storage: usize,
        bytes: bytes::Bytes,
    },
    /// `len` (unknown for a whole file) bytes at `base` of storage chunk `storage`.
    In {
        storage: usize,
        base: u64,
        len: Option<u64>,
    },
}

/// Leaves a read of more than twice as many leaves of a sharded array from local files locates
/// first, on its own: their reads go out and their decoding starts while the read locates the
/// rest (a batch of crops locates thousands of leaves through the shard indexes). Not for
/// unsharded arrays, whose chunks are read (not mapped) and slow to decode, so the serial
/// start weighs little and the split only costs.
pub(crate) const FIRST_LOCATED: usize = 256;

impl Array {
    /// The version of the local file at `path`, where the caches need it (a sharded array's
    /// index cache, a decoded-chunk cache that may keep the array's chunks); `None` elsewhere,
    /// and for object stores (whose caches last as long as the array: open it again to see a
    /// rewritten store).
    pub(crate) fn stamp(&self, path: &Path) -> Option<FileStamp> {
        let core = &*self.core;
        let cached = !core.layout.levels.is_empty()
            || core
                .caches()
                .chunk
                .as_ref()
                .is_some_and(DecodedChunks::may_keep);
        if cached && matches!(core.reader, Reader::Local(_)) {
            FileStamp::of(path)
        } else {
            None
        }
    }

    /// Finds where each leaf chunk's bytes are: through the shard indexes of every level for a
    /// sharded array (fetched in one submission per level, cached), or the chunk's file.
    pub(crate) fn locate(
        &self,
        plan: &Plan,
        leaves: Range<usize>,
        known: Vec<Option<Source>>,
        storages: &mut Storages,
        stats: &mut ReadStats,
    ) -> Result<Vec<Source>> {
        let core = &*self.core;
        let layout = &core.layout;
        // Per leaf, its inner chunk's index in each level's shard: a row of `row` slots (at
        // least one, so that every leaf has a row when there are no levels).
        let levels = layout.levels.len();
        let row = levels.max(1);
        let mut inner_of: Vec<usize> = vec![0; leaves.len() * row];
        let mut cursors: Vec<Cursor> = Vec::with_capacity(leaves.len());
        let mut coords = Vec::new();
        let (mut last_coords, mut last_storage) = (Vec::new(), None::<usize>);
        let mut last_icechunk: Option<(Vec<u64>, Cursor)> = None;
        let mut virtual_checks: Vec<VirtualCheck> = Vec::new();
        if let Some(chunks) = &core.icechunk {
            // The manifests of all these leaves, fetched together before any is looked up.
            let mut storage_coords: Vec<Vec<u64>> = Vec::new();
            let mut scratch = vec![0; levels];
            for (leaf, known) in plan.leaves[leaves.clone()].iter().zip(&known) {
                if known.is_none() {
                    layout.locate(&leaf.coords, &mut coords, &mut scratch);
                    if storage_coords.last() != Some(&coords) {
                        storage_coords.push(coords.clone());
                    }
                }
            }
            chunks.prefetch(
                storage_coords.iter().map(Vec::as_slice),
                &mut storages.manifests,
            )?;
        }
        for ((leaf, known), inner) in plan.leaves[leaves]
            .iter()
            .zip(&known)
            .zip(inner_of.chunks_exact_mut(row))
        {
            if known.is_some() {
                cursors.push(Cursor::Missing);
                continue;
            }
            layout.locate(&leaf.coords, &mut coords, &mut inner[..levels]);
            if let Some(chunks) = &core.icechunk {
                // Leaves of one shard follow each other: one manifest lookup serves them all.
                let cursor = match &last_icechunk {
                    Some((at, c)) if *at == coords => c.clone(),
                    _ => self.icechunk_cursor(chunks, &coords, storages, &mut virtual_checks)?,
                };
                last_icechunk = Some((coords.clone(), cursor.clone()));
                cursors.push(cursor);
                continue;
            }
            // Leaves come in C order of their coordinates: most share the last one's file.
            let s = if let Some(s) = last_storage.filter(|_| coords == last_coords) {
                s
            } else if let Some(&s) = storages.index.get(coords.as_slice()) {
                s
            } else {
                let rel = core.meta.chunk_key(&coords).to_string();
                let path: Arc<Path> = Arc::from(core.place.dir.join(&rel).as_path());
                storages.list.push(Storage {
                    key: core.place.key(&rel),
                    stamp: self.stamp(&path),
                    path,
                    reader: None,
                });
                storages
                    .index
                    .insert(coords.clone(), storages.list.len() - 1);
                storages.list.len() - 1
            };
            if last_storage != Some(s) {
                last_storage = Some(s);
                last_coords.clone_from(&coords);
            }
            cursors.push(Cursor::In {
                storage: s,
                base: 0,
                len: None,
            });
        }

        self.check_virtual(&virtual_checks, storages)?;

        for (level_no, level) in layout.levels.iter().enumerate() {
            // The indexes this level needs: one per distinct (file, shard start).
            let mut wanted: FxHashMap<(usize, u64), Option<Arc<[u64]>>> = FxHashMap::default();
            let mut last = None;
            for c in &cursors {
                if let Cursor::In { storage, base, .. } = *c
                    && last != Some((storage, base))
                {
                    last = Some((storage, base));
                    wanted.entry((storage, base)).or_insert(None);
                }
            }
            let mut to_read: Vec<((usize, u64), ReadRange)> = Vec::new();
            for (&(storage, base), slot) in &mut wanted {
                let key = (Arc::clone(&storages.list[storage].path), level_no, base);
                let stamp = storages.list[storage].stamp;
                if let Some((_, idx)) = core.caches().index.get(&key).filter(|(s, _)| *s == stamp) {
                    *slot = Some(idx);
                    stats.index_cache_hits += 1;
                } else {
                    let len = cursors.iter().find_map(|c| match *c {
                        Cursor::In {
                            storage: s,
                            base: b,
                            len,
                        } if s == storage && b == base => Some(len),
                        _ => None,
                    });
                    let range = index_range(level, base, len.flatten()).map_err(|reason| {
                        ZarrError::ShardIndex {
                            at: self.location(&storages.list[storage].key, None),
                            reason,
                        }
                    })?;
                    to_read.push(((storage, base), range));
                }
            }
            if !to_read.is_empty() {
                stats.index_reads += to_read.len() as u64;
                let requests = to_read
                    .iter()
                    .enumerate()
                    .map(|(i, ((storage, _), range))| {
                        ReadRequest::new(
                            i as u64,
                            Arc::clone(&storages.list[*storage].path),
                            *range,
                        )
                    });
                for done in core.reader.submit(requests) {
                    let ((storage, base), range) = to_read[done.id as usize];
                    let key = &storages.list[storage].key;
                    match done.result {
                        Ok(bytes) => {
                            let idx = level.decode_index(&bytes, core.verify_checksums).map_err(
                                |reason| ZarrError::ShardIndex {
                                    at: self.location(key, Some(range)),
                                    reason,
                                },
                            )?;
                            core.caches().index.insert(
                                (Arc::clone(&storages.list[storage].path), level_no, base),
                                (storages.list[storage].stamp, Arc::clone(&idx)),
                                idx.len() * 8 + 64,
                            );
                            wanted.insert((storage, base), Some(idx));
                        }
                        // No shard file: every chunk in it is fill value.
                        Err(e) if e.is_not_found() && level_no == 0 => {}
                        Err(IoError::RangePastEof { file_len, .. }) => {
                            return Err(ZarrError::ShardIndex {
                                at: self.location(key, Some(range)),
                                reason: format!(
                                    "the shard ({file_len} bytes) is shorter than its index"
                                ),
                            });
                        }
                        Err(e) => {
                            return Err(ZarrError::Io {
                                at: self.location(key, Some(e.range())),
                                source: Box::new(e),
                            });
                        }
                    }
                }
            }
            // Step every leaf one level in (most in the same shard as the leaf before).
            let (mut last_key, mut last_index) = (None, None);
            for (c, inner) in cursors.iter_mut().zip(inner_of.chunks_exact(row)) {
                let Cursor::In { storage, base, len } = *c else {
                    continue;
                };
                if last_key != Some((storage, base)) {
                    last_key = Some((storage, base));
                    last_index = wanted.get(&(storage, base)).and_then(Option::as_ref);
                }
                let Some(idx) = last_index else {
                    *c = Cursor::Missing;
                    continue;
                };
                let entry = ShardLevel::entry(idx, inner[level_no], len).map_err(|reason| {
                    ZarrError::ShardIndex {
                        at: self.location(&storages.list[storage].key, None),
                        reason,
                    }
                })?;
                *c = match entry {
                    IndexEntry::Missing => Cursor::Missing,
                    IndexEntry::At { offset, len: n } => Cursor::In {
                        storage,
                        base: base + offset,
                        len: Some(n),
                    },
                };
            }
        }

        let sources = known
            .into_iter()
            .zip(cursors)
            .map(|(k, c)| match (k, c) {
                (Some(s), _) => s,
                (None, Cursor::Missing) => Source::Missing,
                (None, Cursor::Inline { storage, bytes }) => Source::Inline { storage, bytes },
                (None, Cursor::In { storage, base, len }) => Source::Read {
                    storage,
                    range: match len {
                        Some(n) => ReadRange::new(base, n),
                        None => ReadRange::Whole,
                    },
                },
            })
            .collect();
        Ok(sources)
    }
}

impl Array {
    /// Where the storage chunk at `coords` of an Icechunk array is: a range of a chunk object,
    /// bytes inline in a manifest, or nowhere (never written: fill value).
    fn icechunk_cursor(
        &self,
        chunks: &crate::icechunk::ArrayChunks,
        coords: &[u64],
        storages: &mut Storages,
        virtual_checks: &mut Vec<VirtualCheck>,
    ) -> Result<Cursor> {
        use crate::icechunk::Payload;
        let mut storage = |key: String, reader: Option<(Reader, PathBuf)>| -> usize {
            if let Some(&s) = storages.by_key.get(&key) {
                return s;
            }
            let (reader, path) = match reader {
                Some((r, p)) => (Some(r), p),
                None => (None, chunks.path(&key)),
            };
            storages.list.push(Storage {
                key: if reader.is_some() {
                    key.clone()
                } else {
                    chunks.show(&key)
                },
                path: Arc::from(path.as_path()),
                stamp: None,
                reader,
            });
            storages.by_key.insert(key, storages.list.len() - 1);
            storages.list.len() - 1
        };
        let unsupported = |feature: String| ZarrError::Unsupported {
            array: self.core.place.name.clone(),
            feature,
        };
        let sharded = !self.core.layout.levels.is_empty();
        match chunks.payload(coords, &mut storages.manifests)? {
            None => Ok(Cursor::Missing),
            Some(Payload::Stored {
                key,
                offset,
                length,
            }) => Ok(Cursor::In {
                storage: storage(key, None),
                base: offset,
                len: Some(length),
            }),
            Some(Payload::Inline(bytes)) if !sharded => {
                // Named in messages as the chunk's entry in the array's manifests.
                Ok(Cursor::Inline {
                    storage: storage(format!("manifests/(inline chunk {coords:?})"), None),
                    bytes,
                })
            }
            Some(Payload::Inline(_)) => Err(unsupported(format!(
                "an inline shard in an Icechunk manifest (chunk {coords:?})"
            ))),
            Some(Payload::Virtual { url, .. }) if sharded => Err(unsupported(format!(
                "a virtual Icechunk shard (chunk {coords:?} at {url})"
            ))),
            Some(Payload::Virtual {
                url,
                offset,
                length,
                checksum,
            }) => {
                let at = |reason: String| ZarrError::VirtualChunk {
                    at: self.location(&url, Some(ReadRange::new(offset, length))),
                    chunk: coords.to_vec(),
                    reason,
                };
                let target = chunks.virtual_targets().resolve(&url).map_err(at)?;
                let s = storage(url.clone(), Some(target));
                virtual_checks.push(VirtualCheck {
                    storage: s,
                    chunk: coords.to_vec(),
                    end: offset.saturating_add(length),
                    range: ReadRange::new(offset, length),
                    checksum,
                });
                Ok(Cursor::In {
                    storage: s,
                    base: offset,
                    len: Some(length),
                })
            }
        }
    }

    /// Checks the targets of the virtual chunks a read located, before any is read: each
    /// exists, holds the referenced range, and is the version the reference recorded. One
    /// `stat` per local file and one HEAD per object (sent together).
    fn check_virtual(&self, checks: &[VirtualCheck], storages: &Storages) -> Result<()> {
        if checks.is_empty() {
            return Ok(());
        }
        let mut distinct: Vec<usize> = checks.iter().map(|c| c.storage).collect();
        distinct.sort_unstable();
        distinct.dedup();
        let targets: Vec<(&Reader, &Path)> = distinct
            .iter()
            .map(|&s| {
                let st = &storages.list[s];
                let reader = st.reader.as_ref().expect("a virtual chunk has its reader");
                (reader, &*st.path)
            })
            .collect();
        let versions = crate::icechunk::versions(&targets);
        for c in checks {
            let i = distinct.binary_search(&c.storage).expect("listed above");
            let fail = |reason: String| ZarrError::VirtualChunk {
                at: self.location(&storages.list[c.storage].key, Some(c.range)),
                chunk: c.chunk.clone(),
                reason,
            };
            let now = match &versions[i] {
                Ok(Some(v)) => v,
                Ok(None) => return Err(fail("its target does not exist".into())),
                Err(e) => return Err(fail(e.clone())),
            };
            if now.size < c.end {
                return Err(fail(format!(
                    "its target has {} bytes, fewer than the reference's range needs",
                    now.size
                )));
            }
            if let Some(why) = c.checksum.as_ref().and_then(|k| k.mismatch(now)) {
                return Err(fail(why));
            }
        }
        Ok(())
    }
}

/// A virtual chunk a read located, to check before its target is read.
pub(crate) struct VirtualCheck {
    storage: usize,
    chunk: Vec<u64>,
    range: ReadRange,
    end: u64,
    checksum: Option<crate::icechunk::VirtualChecksum>,
}

/// Where the index of a shard of `level` is: `len` bytes at `base` of its file (`len` unknown
/// for an outermost shard, which is a whole file).
fn index_range(level: &ShardLevel, base: u64, len: Option<u64>) -> Result<ReadRange, String> {
    let n = level.index_bytes;
    match (level.index_at_start, len) {
        (true, _) => Ok(ReadRange::new(base, n)),
        (false, None) => Ok(ReadRange::Suffix(n)),
        (false, Some(len)) if len >= n => Ok(ReadRange::new(base + len - n, n)),
        (false, Some(len)) => Err(format!(
            "an inner shard of {len} bytes is shorter than its {n}-byte index"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every leaf of every sharded fixture (nested sharding, shapes that are not whole numbers
    /// of shards) is located the same through the layout's tables as computed.
    #[test]
    fn locate_tables_agree_with_the_computation() {
        let mut sharded = 0;
        for f in zcrop_fixtures::manifest() {
            let Ok(a) = Array::open(f.array_dir()) else {
                continue;
            };
            let layout = &a.core.layout;
            if layout.levels.is_empty() {
                continue;
            }
            sharded += 1;
            assert!(layout.has_locate_tables(), "{}", f.name);
            let grid = layout.leaf_grid();
            let levels = layout.levels.len();
            let (mut s1, mut s2) = (Vec::new(), Vec::new());
            let (mut i1, mut i2) = (vec![0; levels], vec![0; levels]);
            let mut leaf = vec![0u64; grid.len()];
            'leaves: loop {
                layout.locate(&leaf, &mut s1, &mut i1);
                layout.locate_computed(&leaf, &mut s2, &mut i2);
                assert_eq!((&s1, &i1), (&s2, &i2), "{} leaf {leaf:?}", f.name);
                for d in (0..grid.len()).rev() {
                    leaf[d] += 1;
                    if leaf[d] < grid[d] {
                        continue 'leaves;
                    }
                    leaf[d] = 0;
                }
                break;
            }
            // A leaf past the grid is computed, not looked up out of bounds.
            let past: Vec<u64> = grid.clone();
            layout.locate(&past, &mut s1, &mut i1);
            layout.locate_computed(&past, &mut s2, &mut i2);
            assert_eq!((&s1, &i1), (&s2, &i2), "{}", f.name);
        }
        assert!(sharded >= 3, "{sharded} sharded fixtures");
    }
}
