//! Planning GETs: a batch's requests for one object merged into ranges
//! ([`CoalesceLimits::OBJECT`]), one suffix GET per distinct suffix length, one GET for all
//! whole-object requests.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::coalesce::{CoalesceLimits, coalesce};
use crate::request::{ReadRange, ReadRequest};

/// One requested range served by a GET.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part {
    /// The request's index in its batch.
    pub(crate) index: usize,
    /// The range as the caller asked for it (for error messages).
    pub(crate) range: ReadRange,
    /// Where its bytes start in the GET's bytes.
    pub(crate) offset_in_read: u64,
    /// Its length; `None` takes all the GET's bytes (whole-object and suffix requests).
    pub(crate) len: Option<u64>,
}

/// A planned GET.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) key: Arc<Path>,
    pub(crate) range: ReadRange,
    pub(crate) parts: Vec<Part>,
}

impl Op {
    /// Bytes charged to the budget when the GET is issued.
    pub(crate) fn charge(&self, whole: u64) -> u64 {
        match self.range {
            ReadRange::Bounded { len, .. } => len,
            ReadRange::Suffix(n) => n,
            ReadRange::Whole => whole,
        }
    }
}

/// Groups requests by object and plans the GETs: coalesced bounded ranges, one GET per distinct
/// suffix length, one GET for all whole-object requests.
pub(crate) fn plan(requests: &[ReadRequest], limits: CoalesceLimits) -> Vec<Op> {
    #[derive(Default)]
    struct ObjectReqs {
        bounded: Vec<(u64, u64)>,
        bounded_index: Vec<usize>,
        whole: Vec<usize>,
        suffix: Vec<(u64, usize)>,
    }
    let mut objects: Vec<(Arc<Path>, ObjectReqs)> = Vec::new();
    let mut by_key: HashMap<&Path, usize> = HashMap::new();
    for (index, r) in requests.iter().enumerate() {
        let i = *by_key.entry(&*r.path).or_insert_with(|| {
            objects.push((Arc::clone(&r.path), ObjectReqs::default()));
            objects.len() - 1
        });
        let o = &mut objects[i].1;
        match r.range {
            ReadRange::Bounded { offset, len } => {
                o.bounded.push((offset, len));
                o.bounded_index.push(index);
            }
            ReadRange::Whole => o.whole.push(index),
            ReadRange::Suffix(n) => o.suffix.push((n, index)),
        }
    }
    let mut ops = Vec::new();
    for (key, o) in objects {
        for (m, members) in coalesce(&o.bounded, limits).iter() {
            ops.push(Op {
                key: Arc::clone(&key),
                range: ReadRange::new(m.offset, m.len),
                parts: members
                    .iter()
                    .map(|mem| {
                        let (offset, len) = o.bounded[mem.index];
                        Part {
                            index: o.bounded_index[mem.index],
                            range: ReadRange::new(offset, len),
                            offset_in_read: mem.offset_in_read,
                            len: Some(len),
                        }
                    })
                    .collect(),
            });
        }
        let whole_part = |index, range| Part {
            index,
            range,
            offset_in_read: 0,
            len: None,
        };
        if !o.whole.is_empty() {
            ops.push(Op {
                key: Arc::clone(&key),
                range: ReadRange::Whole,
                parts: o
                    .whole
                    .into_iter()
                    .map(|i| whole_part(i, ReadRange::Whole))
                    .collect(),
            });
        }
        let mut suffix = o.suffix;
        suffix.sort_unstable_by_key(|&(n, _)| n);
        for group in suffix.chunk_by(|a, b| a.0 == b.0) {
            let range = ReadRange::Suffix(group[0].0);
            ops.push(Op {
                key: Arc::clone(&key),
                range,
                parts: group.iter().map(|&(_, i)| whole_part(i, range)).collect(),
            });
        }
    }
    ops
}
