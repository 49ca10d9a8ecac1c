//! Merging nearby byte ranges of one file into fewer, larger reads.
//!
//! [`coalesce`] is a pure function: given the requested `(offset, len)` ranges of one file, it
//! returns the physical reads to issue and, for each, which requested ranges it serves and
//! where they sit in its buffer. Ranges merge when the hole between them is at most
//! [`CoalesceLimits::max_gap`] bytes and the merged read stays within
//! [`CoalesceLimits::max_merged_len`]; identical and overlapping ranges are served by one read.

/// Largest hole (in bytes) a merged read may span on local files by default. A hole costs a copy
/// from the page cache (or device bandwidth when cold), a separate read costs a syscall or an
/// IOPS slot; 4 KiB is one page, the smallest unit the kernel reads anyway.
pub const LOCAL_MAX_GAP: u64 = 4 * 1024;

/// Largest merged read on local files by default: big enough to turn runs of small inner chunks
/// into a few large reads, small enough to keep many reads in flight.
pub const LOCAL_MAX_MERGED_LEN: u64 = 4 * 1024 * 1024;

/// Largest hole (in bytes) a merged read may span on object stores by default. A GET costs a
/// round trip of tens of milliseconds and a request charge; at the bandwidth one connection
/// gets from a cloud store, fetching 1 MiB of unwanted bytes costs less than a second request.
pub const OBJECT_MAX_GAP: u64 = 1024 * 1024;

/// Largest merged read on object stores by default: long enough that most planned runs merge,
/// short enough that one slow GET does not hold back a whole batch and that many GETs stay in
/// flight.
pub const OBJECT_MAX_MERGED_LEN: u64 = 16 * 1024 * 1024;

/// When to merge two ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceLimits {
    /// Largest number of unrequested bytes allowed between two ranges that are merged.
    pub max_gap: u64,
    /// Largest length of a merged read. A single requested range longer than this is read alone.
    pub max_merged_len: u64,
}

impl CoalesceLimits {
    /// Defaults for local files ([`LOCAL_MAX_GAP`], [`LOCAL_MAX_MERGED_LEN`]).
    pub const LOCAL: CoalesceLimits = CoalesceLimits {
        max_gap: LOCAL_MAX_GAP,
        max_merged_len: LOCAL_MAX_MERGED_LEN,
    };

    /// Defaults for object stores ([`OBJECT_MAX_GAP`], [`OBJECT_MAX_MERGED_LEN`]).
    pub const OBJECT: CoalesceLimits = CoalesceLimits {
        max_gap: OBJECT_MAX_GAP,
        max_merged_len: OBJECT_MAX_MERGED_LEN,
    };

    /// Merge only ranges that touch or overlap (gap 0) and serve duplicates once; never merge
    /// across a hole.
    pub const ADJACENT_ONLY: CoalesceLimits = CoalesceLimits {
        max_gap: 0,
        max_merged_len: u64::MAX,
    };
}

impl Default for CoalesceLimits {
    fn default() -> Self {
        Self::LOCAL
    }
}

/// One requested range served by a merged read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// Index of the range in the input slice.
    pub index: usize,
    /// Where the range starts inside the merged read's buffer.
    pub offset_in_read: u64,
}

/// A physical read; its members are in [`Coalesced::members`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergedRead {
    /// First byte of the read.
    pub offset: u64,
    /// Length of the read.
    pub len: u64,
    /// Its members' positions in [`Coalesced`]'s member list.
    members: std::ops::Range<usize>,
}

impl MergedRead {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The physical reads planned for a set of ranges, with the requested ranges each one serves
/// (kept in one list, so planning allocates twice however many reads there are).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coalesced {
    /// The reads, in ascending offset order.
    pub reads: Vec<MergedRead>,
    members: Vec<Member>,
}

impl Coalesced {
    /// The requested ranges `read` serves, in ascending offset order.
    pub fn members(&self, read: &MergedRead) -> &[Member] {
        &self.members[read.members.clone()]
    }

    /// Each read with its members.
    pub fn iter(&self) -> impl Iterator<Item = (&MergedRead, &[Member])> {
        self.reads.iter().map(|r| (r, self.members(r)))
    }
}

/// Plans the reads for `ranges` (`(offset, len)` pairs of one file). Every input index appears
/// in exactly one [`MergedRead`]; reads come out in ascending offset order.
///
/// Ranges whose end overflows `u64` are clamped to `u64::MAX` for planning; such a read fails
/// past the end of any file, which is the right answer.
pub fn coalesce(ranges: &[(u64, u64)], limits: CoalesceLimits) -> Coalesced {
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    // By offset, then longest first so a range is merged into the read that already covers it.
    order.sort_unstable_by(|&a, &b| {
        let (oa, la) = ranges[a];
        let (ob, lb) = ranges[b];
        oa.cmp(&ob).then(lb.cmp(&la))
    });

    let mut out = Coalesced {
        reads: Vec::new(),
        members: Vec::with_capacity(ranges.len()),
    };
    let mut first_member = 0usize; // where the open read's members start
    let mut cur: Option<(u64, u64)> = None; // (start, end) of the open read

    let close = |out: &mut Coalesced, first: usize, start: u64, end: u64| {
        for m in &mut out.members[first..] {
            m.offset_in_read -= start;
        }
        out.reads.push(MergedRead {
            offset: start,
            len: end - start,
            members: first..out.members.len(),
        });
    };

    for idx in order {
        let (off, len) = ranges[idx];
        let end = off.saturating_add(len);
        match cur {
            Some((start, cur_end)) => {
                let gap_ok = off <= cur_end.saturating_add(limits.max_gap);
                let new_end = cur_end.max(end);
                // A range inside the open read costs nothing; otherwise respect the size cap.
                let size_ok = end <= cur_end || new_end - start <= limits.max_merged_len;
                if gap_ok && size_ok {
                    cur = Some((start, new_end));
                } else {
                    close(&mut out, first_member, start, cur_end);
                    first_member = out.members.len();
                    cur = Some((off, end));
                }
            }
            None => cur = Some((off, end)),
        }
        // Absolute offset for now; made relative when the read closes.
        out.members.push(Member {
            index: idx,
            offset_in_read: off,
        });
    }
    if let Some((start, end)) = cur {
        close(&mut out, first_member, start, end);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lim(max_gap: u64, max_merged_len: u64) -> CoalesceLimits {
        CoalesceLimits {
            max_gap,
            max_merged_len,
        }
    }

    /// A planned read as `(offset, len, [(input index, offset in read)])`.
    type Flat = Vec<(u64, u64, Vec<(usize, u64)>)>;

    /// Each case: requested ranges, limits, expected physical reads as
    /// `(offset, len, [(input index, offset in read)])`.
    #[allow(clippy::type_complexity)]
    const TABLE: &[(&[(u64, u64)], (u64, u64), &[(u64, u64, &[(usize, u64)])])] = &[
        // Nothing requested, nothing read.
        (&[], (4096, 1 << 20), &[]),
        // One read (0,64) is served by system read (0,64).
        (&[(0, 64)], (4096, 1 << 20), &[(0, 64, &[(0, 0)])]),
        // Adjacent ranges merge even with gap 0.
        (
            &[(0, 10), (10, 10)],
            (0, 1 << 20),
            &[(0, 20, &[(0, 0), (1, 10)])],
        ),
        // A hole of 5 bytes: merged with max_gap 5, split with max_gap 4.
        (
            &[(0, 10), (15, 5)],
            (5, 1 << 20),
            &[(0, 20, &[(0, 0), (1, 15)])],
        ),
        (
            &[(0, 10), (15, 5)],
            (4, 1 << 20),
            &[(0, 10, &[(0, 0)]), (15, 5, &[(1, 0)])],
        ),
        // Input order does not matter; members come out by offset.
        (
            &[(100, 10), (0, 10)],
            (100, 1 << 20),
            &[(0, 110, &[(1, 0), (0, 100)])],
        ),
        // Duplicates are served by one read.
        (
            &[(8, 4), (8, 4), (8, 4)],
            (0, 1 << 20),
            &[(8, 4, &[(0, 0), (1, 0), (2, 0)])],
        ),
        // A range inside another costs nothing, even past the size cap.
        (
            &[(0, 100), (10, 5)],
            (0, 50),
            &[(0, 100, &[(0, 0), (1, 10)])],
        ),
        // Overlapping ranges merge into their union.
        (
            &[(0, 10), (5, 10)],
            (0, 1 << 20),
            &[(0, 15, &[(0, 0), (1, 5)])],
        ),
        // The size cap splits a run of adjacent ranges.
        (
            &[(0, 10), (10, 10), (20, 10)],
            (0, 20),
            &[(0, 20, &[(0, 0), (1, 10)]), (20, 10, &[(2, 0)])],
        ),
        // A range longer than the cap is read alone.
        (&[(0, 100)], (0, 10), &[(0, 100, &[(0, 0)])]),
        // Zero-length ranges ride along at their offset.
        (
            &[(0, 10), (4, 0)],
            (0, 1 << 20),
            &[(0, 10, &[(0, 0), (1, 4)])],
        ),
    ];

    #[test]
    fn table() {
        for (ranges, (gap, cap), expected) in TABLE {
            let got: Flat = coalesce(ranges, lim(*gap, *cap))
                .iter()
                .map(|(r, m)| {
                    (
                        r.offset,
                        r.len,
                        m.iter().map(|m| (m.index, m.offset_in_read)).collect(),
                    )
                })
                .collect();
            let want: Flat = expected
                .iter()
                .map(|(o, l, m)| (*o, *l, m.to_vec()))
                .collect();
            assert_eq!(got, want, "ranges {ranges:?} gap {gap} cap {cap}");
        }
    }

    /// A "file" whose byte at offset `o` is a hash of `o`, so misplaced slices are caught.
    fn byte_at(o: u64) -> u8 {
        (o.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8
    }

    fn read(offset: u64, len: u64) -> Vec<u8> {
        (offset..offset + len).map(byte_at).collect()
    }

    proptest! {
        /// Against the naive reference (one read per range): every slice cut from the merged
        /// reads equals the bytes of its own range; every range is served exactly once; merged
        /// reads respect the limits and come out in ascending offset order. (Two reads may
        /// overlap when the size cap splits overlapping ranges; that costs bytes, not
        /// correctness.)
        #[test]
        fn equals_naive_reads(
            ranges in proptest::collection::vec((0u64..5000, 0u64..300), 0..200),
            max_gap in 0u64..600,
            max_merged_len in 1u64..3000,
        ) {
            let limits = lim(max_gap, max_merged_len);
            let planned = coalesce(&ranges, limits);
            let mut served = vec![0usize; ranges.len()];
            let mut prev_offset = 0u64;
            for (r, members) in planned.iter() {
                prop_assert!(!members.is_empty());
                prop_assert!(r.offset >= prev_offset, "reads out of order");
                prev_offset = r.offset;
                let buf = read(r.offset, r.len);
                // The holes between the members' coverage never exceed max_gap.
                let mut covered_to = r.offset;
                for m in members {
                    let (off, len) = ranges[m.index];
                    prop_assert_eq!(off - r.offset, m.offset_in_read);
                    prop_assert!(off <= covered_to + max_gap);
                    covered_to = covered_to.max(off + len);
                    let s = m.offset_in_read as usize;
                    prop_assert_eq!(&buf[s..s + len as usize], &read(off, len)[..]);
                    served[m.index] += 1;
                }
                prop_assert_eq!(covered_to, r.end());
                // Within the cap, unless one member alone is longer than the cap.
                let longest = members.iter().map(|m| ranges[m.index].1).max().unwrap_or(0);
                prop_assert!(r.len <= max_merged_len.max(longest));
            }
            prop_assert!(served.iter().all(|&n| n == 1));
        }
    }
}
