//! Planning a read: which leaf chunks a set of requests needs, and what each chunk contributes
//! to each request. A pure function of shapes and selections, with no IO.
//!
//! A *request* is one output block (a crop of a batch, or the whole result of a selection); it
//! selects, per dimension, a contiguous range or a list of points. The array is tiled by *leaf
//! chunks* (unsharded chunks, or the innermost chunks of shards), all of the same shape, so
//! each selected element of a request lies in exactly one leaf chunk. The planner emits, for
//! each leaf chunk that any request touches, one *copy* per request that touches it: the
//! intersection of the request with the chunk.
//!
//! **Disjointness.** Within one request, copies come from distinct chunks, and chunks tile the
//! array, so they write disjoint parts of the request's block. Requests write disjoint blocks
//! of the output. Hence no two copies write the same output byte, which is what lets the
//! stitcher write copies from many threads at once (`crate::stitch`). Each leaf chunk appears
//! once in the plan however many requests touch it, so it is read and decoded once.

use rustc_hash::FxHashMap;

/// What a read selects along one dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DimSelection {
    /// `len` consecutive indices from `start`.
    Range {
        /// First index.
        start: u64,
        /// Number of indices.
        len: u64,
    },
    /// These indices, in this order (repeats allowed); the output has one entry per index.
    Points(Vec<u64>),
}

impl DimSelection {
    /// Number of output positions along this dimension.
    pub fn len(&self) -> u64 {
        match self {
            DimSelection::Range { len, .. } => *len,
            DimSelection::Points(p) => p.len() as u64,
        }
    }

    /// Whether it selects nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The part of one dimension of a request that falls in one leaf chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// `len` consecutive indices from `src` in the chunk go to `dst..` in the output block.
    Run { src: u64, dst: u64, len: u64 },
    /// Index pairs `(in chunk, in output block)`.
    Gather(Vec<(u64, u64)>),
}

impl Piece {
    /// Smallest and largest chunk index this piece reads.
    fn src_bounds(&self) -> (u64, u64) {
        match self {
            Piece::Run { src, len, .. } => (*src, src + len - 1),
            Piece::Gather(pairs) => pairs
                .iter()
                .fold((u64::MAX, 0), |(lo, hi), &(s, _)| (lo.min(s), hi.max(s))),
        }
    }
}

/// One output block.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// Byte offset of the block in the output buffer.
    pub(crate) out_offset: usize,
    /// Shape of the block.
    pub(crate) shape: Vec<u64>,
    /// The block's C-order strides, in elements (kept: every copy into the block uses them).
    pub(crate) strides: smallvec::SmallVec<[u64; 8]>,
    /// For each dimension, the leaf-chunk coordinates it touches and the piece in each.
    pub(crate) dims: Vec<Vec<(u64, Piece)>>,
}

/// One leaf chunk the plan needs.
#[derive(Debug, Clone)]
pub(crate) struct Leaf {
    /// Coordinates in the leaf-chunk grid (held inline up to 4 dimensions: a batch of crops
    /// plans thousands of leaves, and an allocation each was a fifth of planning's time).
    pub(crate) coords: smallvec::SmallVec<[u64; 4]>,
    /// Its copies, as a range of [`Plan::copies`] records.
    pub(crate) copies: std::ops::Range<usize>,
    /// Bytes of the decoded chunk (C order) the copies read: decoding may stop at `end`.
    pub(crate) needed: std::ops::Range<usize>,
}

/// A planned read: the distinct chunks a set of requests needs and what each contributes to
/// each request. Built by [`Plan::with_output_element`]; [`crate::Array`] plans every read this
/// way, and it is public so callers can ask what a batch would cost before reading it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub(crate) ndim: usize,
    /// Bytes per element of the array (the decoded chunks).
    pub(crate) elsize: usize,
    /// Bytes per element of the output (differs when a transform converts types).
    pub(crate) out_elsize: usize,
    pub(crate) leaf_shape: Vec<u64>,
    /// The leaf chunks' C-order strides, in elements.
    pub(crate) leaf_strides: smallvec::SmallVec<[u64; 8]>,
    pub(crate) requests: Vec<Request>,
    pub(crate) leaves: Vec<Leaf>,
    /// Copy records, `1 + ndim` numbers each: the request, then the piece index per dimension.
    copies: Vec<u32>,
    /// Total output bytes.
    pub(crate) out_len: usize,
    /// Number of copies that write each request's block.
    pub(crate) copies_per_request: Vec<u32>,
}

/// One copy: which request, and which piece of each dimension.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copy<'p> {
    /// Index of the request in the plan.
    pub(crate) index: usize,
    pub(crate) request: &'p Request,
    pieces: &'p [u32],
}

impl<'p> Copy<'p> {
    /// The piece of dimension `d`.
    pub(crate) fn piece(&self, d: usize) -> &'p Piece {
        &self.request.dims[d][self.pieces[d] as usize].1
    }
}

/// Why a selection cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// Wrong number of dimensions.
    Dimensionality {
        /// The array's.
        expected: usize,
        /// The selection's.
        got: usize,
    },
    /// An index outside the array.
    OutOfBounds {
        /// The dimension.
        dim: usize,
        /// The index.
        index: u64,
        /// The dimension's extent.
        extent: u64,
    },
    /// The output would not fit in memory's address space.
    TooLarge,
    /// The array has more chunks than a 128-bit number counts (the planner numbers them).
    TooManyChunks,
}

impl std::error::Error for PlanError {}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlanError::Dimensionality { expected, got } => {
                write!(
                    f,
                    "selection has {got} dimensions, the array has {expected}"
                )
            }
            PlanError::OutOfBounds { dim, index, extent } => {
                write!(
                    f,
                    "index {index} is out of bounds for dimension {dim} of extent {extent}"
                )
            }
            PlanError::TooLarge => f.write_str("the selection is too large to hold in memory"),
            PlanError::TooManyChunks => {
                f.write_str("the array has more than 2^128 chunks, more than zcrop can number")
            }
        }
    }
}

/// Splits one dimension's selection into per-chunk pieces.
fn split_dim(
    sel: &DimSelection,
    chunk: u64,
    extent: u64,
    dim: usize,
) -> Result<Vec<(u64, Piece)>, PlanError> {
    match sel {
        DimSelection::Range { len: 0, .. } => Ok(Vec::new()),
        &DimSelection::Range { start, len } => {
            let end =
                start
                    .checked_add(len)
                    .filter(|&e| e <= extent)
                    .ok_or(PlanError::OutOfBounds {
                        dim,
                        index: start.saturating_add(len).saturating_sub(1),
                        extent,
                    })?;
            Ok((start / chunk..=(end - 1) / chunk)
                .map(|c| {
                    let lo = start.max(c * chunk);
                    let hi = end.min(c.saturating_add(1).saturating_mul(chunk));
                    (
                        c,
                        Piece::Run {
                            src: lo - c * chunk,
                            dst: lo - start,
                            len: hi - lo,
                        },
                    )
                })
                .collect())
        }
        DimSelection::Points(points) => {
            let mut by_chunk: Vec<(u64, Vec<(u64, u64)>)> = Vec::new();
            let mut index: FxHashMap<u64, usize> = FxHashMap::default();
            for (out, &p) in points.iter().enumerate() {
                if p >= extent {
                    return Err(PlanError::OutOfBounds {
                        dim,
                        index: p,
                        extent,
                    });
                }
                let c = p / chunk;
                let slot = *index.entry(c).or_insert_with(|| {
                    by_chunk.push((c, Vec::new()));
                    by_chunk.len() - 1
                });
                by_chunk[slot].1.push((p - c * chunk, out as u64));
            }
            by_chunk.sort_unstable_by_key(|(c, _)| *c);
            Ok(by_chunk
                .into_iter()
                .map(|(c, pairs)| {
                    // Consecutive points that land consecutively are a plain run.
                    let run = pairs
                        .windows(2)
                        .all(|w| w[1].0 == w[0].0 + 1 && w[1].1 == w[0].1 + 1);
                    let piece = if run {
                        Piece::Run {
                            src: pairs[0].0,
                            dst: pairs[0].1,
                            len: pairs.len() as u64,
                        }
                    } else {
                        Piece::Gather(pairs)
                    };
                    (c, piece)
                })
                .collect())
        }
    }
}

impl Plan {
    /// Plans `requests` (each a selection per dimension) over an array of `shape` tiled by leaf
    /// chunks of `leaf_shape`, with elements of `elsize` bytes. Output blocks are laid out one
    /// after the other in request order, each in C order.
    #[cfg(test)]
    pub(crate) fn new(
        shape: &[u64],
        leaf_shape: &[u64],
        elsize: usize,
        requests: &[Vec<DimSelection>],
    ) -> Result<Plan, PlanError> {
        Self::with_output_element(shape, leaf_shape, elsize, elsize, requests)
    }

    /// Plans `requests` (each a selection per dimension) over an array of `shape` tiled by
    /// chunks of `leaf_shape` with elements of `elsize` bytes, into output elements of
    /// `out_elsize` bytes: blocks one after the other in request order, each in C order.
    pub fn with_output_element(
        shape: &[u64],
        leaf_shape: &[u64],
        elsize: usize,
        out_elsize: usize,
        requests: &[Vec<DimSelection>],
    ) -> Result<Plan, PlanError> {
        let ndim = shape.len();
        let mut planned = Vec::with_capacity(requests.len());
        let mut out_len: usize = 0;
        for sel in requests {
            if sel.len() != ndim {
                return Err(PlanError::Dimensionality {
                    expected: ndim,
                    got: sel.len(),
                });
            }
            // Size first: an absurd selection fails before any work proportional to it.
            let block_shape: Vec<u64> = sel.iter().map(DimSelection::len).collect();
            let block_bytes = block_shape
                .iter()
                .try_fold(out_elsize as u64, |acc, &n| acc.checked_mul(n))
                .and_then(|b| usize::try_from(b).ok())
                .ok_or(PlanError::TooLarge)?;
            let dims = sel
                .iter()
                .enumerate()
                .map(|(d, s)| split_dim(s, leaf_shape[d], shape[d], d))
                .collect::<Result<Vec<_>, _>>()?;
            planned.push(Request {
                out_offset: out_len,
                strides: c_strides(&block_shape),
                shape: block_shape,
                dims,
            });
            out_len = out_len
                .checked_add(block_bytes)
                .ok_or(PlanError::TooLarge)?;
        }

        // Group the (request, chunk) intersections by leaf chunk.
        let grid: Vec<u64> = shape
            .iter()
            .zip(leaf_shape)
            .map(|(s, c)| s.div_ceil(*c))
            .collect();
        // Leaves are found and sorted by their C-order index in the grid.
        if grid
            .iter()
            .try_fold(1u128, |n, &g| n.checked_mul(u128::from(g)))
            .is_none()
        {
            return Err(PlanError::TooManyChunks);
        }
        // Every (request, chunk) intersection as a record (request, piece index per
        // dimension), keyed by the chunk's linear index and the record's number: one sort then
        // groups them by chunk, in storage order, each chunk's copies in request order. (A hash
        // map of chunks with a vector of records each cost an allocation or two per chunk, and
        // planning is serial: it ran while the decoders waited.)
        let rec_len = 1 + ndim;
        // Intersections in all: the vectors below are sized once (growing them by doubling
        // copied most of what they held, a few percent of the thread that plans a batch).
        // (Capped: an absurd selection grows them as it goes, as before, instead of asking
        // for it all at once.)
        let pieces: usize = planned
            .iter()
            .map(|req| req.dims.iter().map(Vec::len).fold(1, usize::saturating_mul))
            .fold(0, usize::saturating_add)
            .min(1 << 22);
        let mut recs: Vec<u32> = Vec::with_capacity(pieces.saturating_mul(rec_len));
        // Each key packed in one u64 (linear index above the record number) where every
        // linear index fits in 32 bits, as on any array of fewer than 4 billion chunks: 8
        // bytes a key to sort and compare instead of the 32 of a (u128, u32) pair.
        let narrow = grid
            .iter()
            .try_fold(1u64, |n, &g| n.checked_mul(g))
            .is_some_and(|n| n <= 1 << 32);
        let mut packed: Vec<u64> = Vec::with_capacity(if narrow { pieces } else { 0 });
        let mut keys: Vec<(u128, u32)> = Vec::with_capacity(if narrow { 0 } else { pieces });
        let mut idx = vec![0usize; ndim];
        // The next record's number.
        let mut k = 0u32;
        for (r, req) in planned.iter().enumerate() {
            if req.dims.iter().any(Vec::is_empty) {
                continue; // selects nothing
            }
            idx.fill(0);
            'odometer: loop {
                if narrow {
                    // Every linear index fits in 32 bits: no 128-bit arithmetic.
                    let mut linear = 0u64;
                    for d in 0..ndim {
                        linear = linear * grid[d] + req.dims[d][idx[d]].0;
                    }
                    packed.push((linear << 32) | u64::from(k));
                } else {
                    let mut linear = 0u128;
                    for d in 0..ndim {
                        linear = linear * u128::from(grid[d]) + u128::from(req.dims[d][idx[d]].0);
                    }
                    keys.push((linear, k));
                }
                k = k.checked_add(1).ok_or(PlanError::TooLarge)?;
                recs.push(r as u32);
                recs.extend(idx.iter().map(|&i| i as u32));
                // Next combination of pieces (a 0-d request has exactly one).
                let mut d = ndim;
                loop {
                    if d == 0 {
                        break 'odometer;
                    }
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < req.dims[d].len() {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        packed.sort_unstable();
        keys.sort_unstable();
        let sorted = packed
            .iter()
            .map(|&p| (u128::from(p >> 32), p as u32))
            .chain(keys.iter().copied());

        let mut copies = Vec::with_capacity(recs.len());
        let mut copies_per_request = vec![0u32; planned.len()];
        let mut leaves = Vec::with_capacity(pieces);
        let strides = c_strides(leaf_shape);
        let close = |copies: &mut Vec<u32>, start: usize, leaves: &mut Vec<Leaf>| {
            let first = &copies[start..start + rec_len];
            let req = &planned[first[0] as usize];
            let coord = |d: usize| req.dims[d][first[1 + d] as usize].0;
            // Filled in place up to 4 dimensions: collecting into the small vector is
            // measurably slower in planning (criterion `plan/crops_4x12x128x128/32`).
            let coords = if ndim <= 4 {
                let mut buf = [0u64; 4];
                for (d, c) in buf.iter_mut().enumerate().take(ndim) {
                    *c = coord(d);
                }
                smallvec::SmallVec::from_buf_and_len(buf, ndim)
            } else {
                (0..ndim).map(coord).collect()
            };
            let needed = needed_range(&planned, &copies[start..], ndim, &strides, elsize);
            leaves.push(Leaf {
                coords,
                copies: start..copies.len(),
                needed,
            });
        };
        // Records of one chunk are adjacent once sorted: each run of one linear index is a leaf.
        let (mut at, mut start) = (None, 0);
        for (linear, k) in sorted {
            if at.is_some_and(|a| a != linear) {
                close(&mut copies, start, &mut leaves);
                start = copies.len();
            }
            at = Some(linear);
            let rec = &recs[k as usize * rec_len..(k as usize + 1) * rec_len];
            copies.extend_from_slice(rec);
            copies_per_request[rec[0] as usize] += 1;
        }
        if at.is_some() {
            close(&mut copies, start, &mut leaves);
        }
        Ok(Plan {
            ndim,
            elsize,
            out_elsize,
            leaf_shape: leaf_shape.to_vec(),
            leaf_strides: c_strides(leaf_shape),
            requests: planned,
            leaves,
            copies,
            out_len,
            copies_per_request,
        })
    }

    /// The copies of `leaf`.
    pub(crate) fn copies<'p>(&'p self, leaf: &Leaf) -> impl Iterator<Item = Copy<'p>> + 'p {
        let rec = 1 + self.ndim;
        self.copies[leaf.copies.clone()]
            .chunks_exact(rec)
            .map(move |c| Copy {
                index: c[0] as usize,
                request: &self.requests[c[0] as usize],
                pieces: &c[1..],
            })
    }

    /// Number of distinct chunks the requests touch (each read and decoded once).
    pub fn num_leaves(&self) -> usize {
        self.leaves.len()
    }

    /// Bytes of output the requests produce.
    pub fn output_len(&self) -> usize {
        self.out_len
    }
}

/// Element strides of a C-order array of `shape` (on the stack up to 8 dimensions: the stitch
/// works them out for every (chunk, crop) pair of a batch).
pub(crate) fn c_strides(shape: &[u64]) -> smallvec::SmallVec<[u64; 8]> {
    let mut s: smallvec::SmallVec<[u64; 8]> = smallvec::smallvec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// The byte range of the decoded chunk that the copies `recs` read.
fn needed_range(
    requests: &[Request],
    recs: &[u32],
    ndim: usize,
    strides: &[u64],
    elsize: usize,
) -> std::ops::Range<usize> {
    let mut lo = u64::MAX;
    let mut hi = 0u64;
    for rec in recs.chunks_exact(1 + ndim) {
        let req = &requests[rec[0] as usize];
        let (mut first, mut last) = (0u64, 0u64);
        for d in 0..ndim {
            let (a, b) = req.dims[d][rec[1 + d] as usize].1.src_bounds();
            first += a * strides[d];
            last += b * strides[d];
        }
        lo = lo.min(first);
        hi = hi.max(last + 1);
    }
    if lo == u64::MAX {
        return 0..0;
    }
    (lo as usize * elsize)..(hi as usize * elsize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn range(start: u64, len: u64) -> DimSelection {
        DimSelection::Range { start, len }
    }

    #[test]
    fn crop_across_four_chunks() {
        let plan = Plan::new(&[10, 10], &[4, 4], 1, &[vec![range(3, 3), range(2, 4)]]).unwrap();
        let coords: Vec<_> = plan.leaves.iter().map(|l| l.coords.to_vec()).collect();
        assert_eq!(coords, vec![vec![0, 0], vec![0, 1], vec![1, 0], vec![1, 1]]);
        assert_eq!(plan.out_len, 12);
        // Chunk (0, 0) gives row 3, cols 2..4 -> block row 0, cols 0..2.
        let c: Vec<_> = plan.copies(&plan.leaves[0]).collect();
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0].piece(0),
            &Piece::Run {
                src: 3,
                dst: 0,
                len: 1
            }
        );
        assert_eq!(
            c[0].piece(1),
            &Piece::Run {
                src: 2,
                dst: 0,
                len: 2
            }
        );
        // Needed bytes of chunk (0, 0): element (3, 2) to (3, 3).
        assert_eq!(plan.leaves[0].needed, 14..16);
    }

    #[test]
    fn shared_chunks_appear_once() {
        let plan = Plan::new(
            &[8],
            &[4],
            2,
            &[vec![range(1, 2)], vec![range(2, 3)], vec![range(0, 8)]],
        )
        .unwrap();
        assert_eq!(plan.num_leaves(), 2);
        let first: Vec<_> = plan.copies(&plan.leaves[0]).collect();
        assert_eq!(first.len(), 3, "all three requests use chunk 0, read once");
        assert_eq!(plan.out_len, (2 + 3 + 8) * 2);
    }

    #[test]
    fn points_group_by_chunk_and_keep_order() {
        let plan = Plan::new(
            &[10],
            &[4],
            1,
            &[vec![DimSelection::Points(vec![9, 1, 2, 8, 1])]],
        )
        .unwrap();
        let pieces: Vec<_> = plan
            .leaves
            .iter()
            .map(|l| (l.coords[0], plan.copies(l).next().unwrap().piece(0).clone()))
            .collect();
        assert_eq!(
            pieces,
            vec![
                (0, Piece::Gather(vec![(1, 1), (2, 2), (1, 4)])),
                (2, Piece::Gather(vec![(1, 0), (0, 3)])),
            ]
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            Plan::new(&[10], &[4], 1, &[vec![range(8, 3)]]).unwrap_err(),
            PlanError::OutOfBounds {
                dim: 0,
                index: 10,
                extent: 10
            }
        );
        assert!(matches!(
            Plan::new(&[10, 2], &[4, 2], 1, &[vec![range(0, 1)]]),
            Err(PlanError::Dimensionality {
                expected: 2,
                got: 1
            })
        ));
        assert!(Plan::new(&[10], &[4], 1, &[vec![DimSelection::Points(vec![10])]]).is_err());
        assert!(Plan::new(&[u64::MAX], &[1 << 40], 8, &[vec![range(0, u64::MAX)]]).is_err());
    }

    #[test]
    fn chunk_grids_past_64_bits_number_their_chunks_apart() {
        // 2^63 x 2^63 chunks: a 64-bit C-order number of chunk (2, 0) wraps to that of (0, 0).
        let n = 1u64 << 63;
        let plan = Plan::new(
            &[n, n],
            &[1, 1],
            1,
            &[vec![DimSelection::Points(vec![0, 2]), range(0, 1)]],
        )
        .unwrap();
        let coords: Vec<_> = plan.leaves.iter().map(|l| l.coords.to_vec()).collect();
        assert_eq!(coords, [vec![0, 0], vec![2, 0]]);
        // More chunks than 128 bits number is a clear error, not wrong data.
        assert_eq!(
            Plan::new(&[n, n, n], &[1, 1, 1], 1, &[vec![range(0, 1); 3]]).unwrap_err(),
            PlanError::TooManyChunks
        );
    }

    #[test]
    fn chunk_numbers_either_side_of_32_bits_stay_apart() {
        // Keys are packed into 64 bits while every chunk number fits in 32: at 2^32 + 1 chunks,
        // chunk 2^32 packed so would land on chunk 0.
        for n in [1u64 << 32, (1 << 32) + 1] {
            let plan =
                Plan::new(&[n], &[1], 1, &[vec![DimSelection::Points(vec![0, n - 1])]]).unwrap();
            let coords: Vec<_> = plan.leaves.iter().map(|l| l.coords.to_vec()).collect();
            assert_eq!(coords, [vec![0], vec![n - 1]], "{n} chunks");
        }
    }

    #[test]
    fn empty_and_zero_d() {
        let plan = Plan::new(&[10], &[4], 1, &[vec![range(5, 0)]]).unwrap();
        assert_eq!((plan.num_leaves(), plan.out_len), (0, 0));
        let plan = Plan::new(&[], &[], 4, &[vec![]]).unwrap();
        assert_eq!((plan.num_leaves(), plan.out_len), (1, 4));
    }

    /// Every output element of every request is written by exactly one copy, and it comes from
    /// the right array element: the disjointness the stitcher relies on, checked by brute force.
    fn check_exact_cover(shape: &[u64], leaf: &[u64], requests: &[Vec<DimSelection>]) {
        let plan = Plan::new(shape, leaf, 1, requests).unwrap();
        let mut written: Vec<Option<Vec<u64>>> = vec![None; plan.out_len];
        for l in &plan.leaves {
            for c in plan.copies(l) {
                let req = c.request;
                let out_strides = c_strides(&req.shape);
                // Enumerate the copy's elements.
                let lists: Vec<Vec<(u64, u64)>> = (0..plan.ndim)
                    .map(|d| match c.piece(d) {
                        Piece::Run { src, dst, len } => {
                            (0..*len).map(|i| (src + i, dst + i)).collect()
                        }
                        Piece::Gather(p) => p.clone(),
                    })
                    .collect();
                let mut idx = vec![0usize; plan.ndim];
                'e: loop {
                    let mut out = req.out_offset as u64;
                    let mut arr = Vec::new();
                    for d in 0..plan.ndim {
                        let (s, o) = lists[d][idx[d]];
                        out += o * out_strides[d];
                        arr.push(l.coords[d] * leaf[d] + s);
                    }
                    assert!(written[out as usize].is_none(), "byte {out} written twice");
                    written[out as usize] = Some(arr);
                    let mut d = plan.ndim;
                    loop {
                        if d == 0 {
                            break 'e;
                        }
                        d -= 1;
                        idx[d] += 1;
                        if idx[d] < lists[d].len() {
                            break;
                        }
                        idx[d] = 0;
                    }
                }
            }
        }
        // Compare with the selection itself.
        let mut pos = 0usize;
        for sel in requests {
            let lists: Vec<Vec<u64>> = sel
                .iter()
                .map(|s| match s {
                    DimSelection::Range { start, len } => (*start..start + len).collect(),
                    DimSelection::Points(p) => p.clone(),
                })
                .collect();
            let n: usize = lists.iter().map(Vec::len).product();
            for i in 0..n {
                let mut rem = i;
                let mut want = vec![0u64; lists.len()];
                for d in (0..lists.len()).rev() {
                    want[d] = lists[d][rem % lists[d].len()];
                    rem /= lists[d].len();
                }
                assert_eq!(
                    written[pos + i].as_ref(),
                    Some(&want),
                    "output element {}",
                    pos + i
                );
            }
            pos += n;
        }
        assert_eq!(pos, plan.out_len);
    }

    fn arb_selection(extent: u64) -> impl Strategy<Value = DimSelection> {
        prop_oneof![
            (0..extent)
                .prop_flat_map(move |s| (Just(s), 0..=extent - s))
                .prop_map(|(start, len)| DimSelection::Range { start, len }),
            proptest::collection::vec(0..extent, 0..6).prop_map(DimSelection::Points),
        ]
    }

    proptest! {
        #[test]
        fn plans_cover_each_output_element_exactly_once(
            (shape, leaf, requests) in (1usize..4).prop_flat_map(|nd| {
                proptest::collection::vec(1u64..12, nd).prop_flat_map(move |shape| {
                    let leaf = shape.iter().map(|&s| 1..=s).collect::<Vec<_>>();
                    let sel = shape.iter().map(|&s| arb_selection(s)).collect::<Vec<_>>();
                    (Just(shape), leaf, proptest::collection::vec(sel, 1..4))
                })
            })
        ) {
            check_exact_cover(&shape, &leaf, &requests);
        }
    }
}
