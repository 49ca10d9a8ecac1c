//! Planning: a batch's requests become physical reads (nearby ranges of one file merged,
//! identical ones read once), grouped in runs the workers take whole.

use std::path::Path;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::coalesce::{CoalesceLimits, coalesce};
use crate::range::ReadRange;
use crate::request::ReadRequest;
use crate::worker::op::{Part, Parts, PhysOp, Run, Sink, Target};

/// Requests planned (coalesced) together by [`IoEngine::submit`](crate::IoEngine::submit):
/// large enough to merge a crop batch's neighbouring reads, small enough that planning the
/// next group does not hold the consumer (and the decode threads waiting on it) for long.
pub(crate) const PLAN_GROUP: usize = 1024;

/// Requests of a batch of more than [`WHOLE_PLAN_UP_TO`] planned first, on their own: their
/// reads go out (and the consumer starts on their results) before the next [`PLAN_GROUP`]
/// requests are planned, at the cost of not coalescing reads across this one boundary.
pub(crate) const FIRST_PLAN_GROUP: usize = 32;

/// Batches of at most this many requests are planned whole, their reads coalesced as one (see
/// [`FIRST_PLAN_GROUP`]): planning them takes little longer than planning their first group.
pub(crate) const WHOLE_PLAN_UP_TO: usize = 256;

/// The address an `Arc<Path>` points to.
fn arc_addr(p: &Arc<Path>) -> usize {
    Arc::as_ptr(p).cast::<u8>().addr()
}

/// Groups requests by file and plans the physical reads: coalesced bounded ranges, one read per
/// distinct suffix length, one read for all whole-file requests; in runs of at most `run_len`
/// reads, each with the number of requests it serves.
pub(crate) fn plan(
    requests: impl IntoIterator<Item = ReadRequest>,
    limits: CoalesceLimits,
    sink: &Arc<Sink>,
    run_len: usize,
) -> Vec<(Run, usize)> {
    #[derive(Default)]
    struct FileReqs {
        bounded: Vec<(u64, u64)>,
        bounded_ids: Vec<u64>,
        whole: Vec<u64>,
        suffix: Vec<(u64, u64)>, // (n, id)
    }
    let mut files: Vec<(Arc<Path>, FileReqs)> = Vec::new();
    let mut index: FxHashMap<Arc<Path>, usize> = FxHashMap::default();
    // Callers usually name a file by one `Arc` in all its requests, which come interleaved
    // with other files' (a batch of crops reads from several shards by turns): the `Arc`'s
    // address finds the file without hashing the path. Every `Arc` seen stays alive in
    // `by_arc`, so an address is never reused by another path meanwhile.
    let mut by_arc: FxHashMap<usize, (Arc<Path>, usize)> = FxHashMap::default();
    for r in requests {
        let i = match files.last() {
            Some((p, _)) if Arc::ptr_eq(p, &r.path) => files.len() - 1,
            _ => match by_arc.get(&arc_addr(&r.path)) {
                Some(&(_, i)) => i,
                None => {
                    let i = *index.entry(Arc::clone(&r.path)).or_insert_with(|| {
                        files.push((Arc::clone(&r.path), FileReqs::default()));
                        files.len() - 1
                    });
                    by_arc.insert(arc_addr(&r.path), (Arc::clone(&r.path), i));
                    i
                }
            },
        };
        let f = &mut files[i].1;
        match r.range {
            ReadRange::Bounded { offset, len } => {
                f.bounded.push((offset, len));
                f.bounded_ids.push(r.id);
            }
            ReadRange::Whole => f.whole.push(r.id),
            ReadRange::Suffix(n) => f.suffix.push((n, r.id)),
        }
    }
    // Reads grouped by file; `target` is the file's index in `files` until the runs are cut.
    let mut ops = Vec::new();
    let mut paths = Vec::with_capacity(files.len());
    for (target, (path, f)) in files.into_iter().enumerate() {
        paths.push(path);
        let planned = coalesce(&f.bounded, limits);
        for (m, members) in planned.iter() {
            let part = |mem: &crate::coalesce::Member| {
                let (offset, len) = f.bounded[mem.index];
                Part {
                    id: f.bounded_ids[mem.index],
                    range: ReadRange::Bounded { offset, len },
                    offset_in_read: mem.offset_in_read,
                    len: Some(len),
                }
            };
            let parts = match members {
                [one] => Parts::One(part(one)),
                many => Parts::Many(many.iter().map(part).collect()),
            };
            ops.push(PhysOp {
                target,
                range: ReadRange::Bounded {
                    offset: m.offset,
                    len: m.len,
                },
                parts,
            });
        }
        let whole_parts = |ids: &mut dyn Iterator<Item = u64>, range: ReadRange| -> Parts {
            Parts::from_vec(
                ids.map(|id| Part {
                    id,
                    range,
                    offset_in_read: 0,
                    len: None,
                })
                .collect(),
            )
        };
        if !f.whole.is_empty() {
            ops.push(PhysOp {
                target,
                range: ReadRange::Whole,
                parts: whole_parts(&mut f.whole.into_iter(), ReadRange::Whole),
            });
        }
        let mut suffix = f.suffix;
        suffix.sort_unstable_by_key(|&(n, _)| n);
        for group in suffix.chunk_by(|a, b| a.0 == b.0) {
            let range = ReadRange::Suffix(group[0].0);
            ops.push(PhysOp {
                target,
                range,
                parts: whole_parts(&mut group.iter().map(|&(_, id)| id), range),
            });
        }
    }
    // Cut into runs; each run gets one target per file it reads (its reads of a file are
    // consecutive) and its reads index those.
    let mut runs = Vec::with_capacity(ops.len().div_ceil(run_len));
    let mut ops = ops.into_iter().peekable();
    while ops.peek().is_some() {
        let mut targets: Vec<Target> = Vec::new();
        let mut file = usize::MAX;
        let mut requests = 0;
        let run: Vec<PhysOp> = ops
            .by_ref()
            .take(run_len)
            .map(|mut op| {
                if op.target != file {
                    file = op.target;
                    targets.push(Target {
                        path: Arc::clone(&paths[file]),
                        sink: Arc::clone(sink),
                    });
                }
                op.target = targets.len() - 1;
                requests += op.parts.as_slice().len();
                op
            })
            .collect();
        runs.push((Run { targets, ops: run }, requests));
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::AtomicBool;

    /// Runs hold reads of several files; each read names its own file's target, and a run has
    /// one target per file it reads.
    #[test]
    fn runs_index_one_target_per_file_they_read() {
        let (tx, _rx) = crossbeam_channel::unbounded();
        let sink = Arc::new(Sink {
            tx,
            map: false,
            dropped: AtomicBool::new(false),
            generation: 1,
        });
        let paths: Vec<Arc<Path>> = ["a", "b", "c"]
            .iter()
            .map(|p| Arc::from(Path::new(p)))
            .collect();
        // File a again through an `Arc` of its own: the same file.
        let a_again: Arc<Path> = Arc::from(Path::new("a"));
        let mut requests = Vec::new();
        let mut named = HashMap::new();
        for (group, (file, reads)) in [(0, 2), (1, 1), (2, 6), (0, 1), (0, 2)]
            .into_iter()
            .enumerate()
        {
            for _ in 0..reads {
                let id = requests.len() as u64;
                let path = if group == 4 { &a_again } else { &paths[file] };
                requests.push(ReadRequest::new(
                    id,
                    Arc::clone(path),
                    ReadRange::new(id * 100, 10),
                ));
                named.insert(id, Arc::clone(&paths[file]));
            }
        }
        let no_merging = CoalesceLimits {
            max_gap: 0,
            max_merged_len: 1,
        };
        let runs = plan(requests, no_merging, &sink, 4);
        let shape: Vec<(usize, usize, usize)> = runs
            .iter()
            .map(|(r, n)| (r.ops.len(), *n, r.targets.len()))
            .collect();
        // a: 5 reads, b: 1, c: 6, cut in fours: [a a a a] [a b c c] [c c c c].
        assert_eq!(shape, vec![(4, 4, 1), (4, 4, 3), (4, 4, 1)]);
        for (run, _) in &runs {
            for op in &run.ops {
                let t = &run.targets[op.target];
                assert!(Arc::ptr_eq(&t.sink, &sink));
                for part in op.parts.as_slice() {
                    assert_eq!(t.path, named[&part.id], "request {}", part.id);
                }
            }
        }
    }
}
