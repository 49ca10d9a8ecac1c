//! Writing decoded chunks into the output from many threads at once: the unsafe module of
//! zarr-front (zcrop-codec holds the decoders' unsafe code).
//!
//! [`DisjointOut`] lets every decode task write its copies into one shared output buffer
//! without locks. Soundness rests on the planner's guarantee (see `crate::plan`): no two copies
//! of a plan write the same output byte, and each leaf chunk (hence each copy) is handled by one
//! task. Every write is also bounds-checked against the buffer, so a planner bug could give
//! wrong bytes but never write outside the buffer.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;

use crate::plan::{Copy, Piece, Plan};
use crate::transform::StitchTransform;
use zcrop_codec::dest::{Rows, RunGroup, WRITE_AHEAD, prefetch_for_write};

/// The output buffer of one planned read, shared by the decode tasks.
pub(crate) struct DisjointOut<'a> {
    ptr: *mut u8,
    len: usize,
    _buf: PhantomData<&'a mut [u8]>,
}

// SAFETY: tasks on other threads write disjoint byte ranges (the plan's guarantee), so sharing
// the pointer across threads creates no data race; the lifetime ties it to the borrowed buffer.
unsafe impl Send for DisjointOut<'_> {}
// SAFETY: as for `Send`: concurrent `&DisjointOut` users write disjoint ranges only.
unsafe impl Sync for DisjointOut<'_> {}

impl<'a> DisjointOut<'a> {
    /// Wraps the output buffer of `plan`, which must be exactly `plan.out_len` bytes, for the
    /// decode tasks to write their copies into at once.
    ///
    /// # Safety
    /// No two copies of `plan` may write the same byte of `buf`: the copies are then written
    /// from many threads through one pointer without a data race. A [`Plan`] built by
    /// [`Plan::with_output_element`] guarantees this (chunks tile the array and requests
    /// tile the output: see "Disjointness" in [`crate::plan`], checked by its exact-cover
    /// tests); a hand-made plan might not.
    pub(crate) unsafe fn new(buf: &'a mut [u8], plan: &Plan) -> Self {
        Self::wrap(buf, plan)
    }

    /// [`DisjointOut::new`] for a plan as this crate makes them: the one place that vouches
    /// for the planner's disjointness.
    pub(crate) fn for_plan(buf: &'a mut [u8], plan: &Plan) -> Self {
        // SAFETY: a `Plan`'s fields are private to this crate, its only constructors
        // (`Plan::new`, `Plan::with_output_element`) make copies that write disjoint bytes of
        // the output (see "Disjointness" in `crate::plan`), and nothing in this crate changes a
        // plan once it is built.
        unsafe { Self::new(buf, plan) }
    }

    fn wrap(buf: &'a mut [u8], plan: &Plan) -> Self {
        assert_eq!(
            buf.len(),
            plan.out_len,
            "output buffer does not match the plan"
        );
        DisjointOut {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            _buf: PhantomData,
        }
    }

    fn check(&self, range: &Range<usize>) {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "stitch write {range:?} outside an output of {} bytes",
            self.len
        );
    }

    /// Copies `copy` from the decoded chunk `chunk` (C order, the plan's leaf shape; only the
    /// bytes the copy reads need be valid), converting elements with `transform` if given.
    pub(crate) fn copy_from_chunk(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        chunk: &[u8],
        transform: Option<&dyn StitchTransform>,
    ) {
        let axis = transform.and_then(StitchTransform::axis);
        self.for_each_target(plan, copy, axis, |src, dst, to, axis_index| {
            let from = &chunk[src..src + to.len() / plan.out_elsize * plan.elsize];
            match transform {
                None => to.copy_from_slice(from),
                Some(t) => t.convert(from, to, axis_index, dst / plan.out_elsize),
            }
        });
    }

    /// Writes `copy` group by group (see [`RunGroup`]) with `fill(group, rows)`: `rows.row(i)`
    /// is the output of run `i` of the group, to be filled from the decoded chunk's bytes at
    /// `group.src + i * group.src_step` (C order, the plan's leaf shape). The group's first and
    /// last runs are bounds-checked once, for all of it. For a chunk that is not decoded whole
    /// into a buffer, e.g. a blosc chunk unshuffled straight into the crops; elements are copied
    /// as they are (`plan.out_elsize == plan.elsize`).
    pub(crate) fn copy_groups_with(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        mut fill: impl FnMut(&RunGroup, &mut Rows<'_>),
    ) {
        assert_eq!(
            plan.out_elsize, plan.elsize,
            "copy_groups_with converts no elements"
        );
        for_each_group(plan, copy, None, |g| {
            let Some(last) = g.rows.checked_sub(1) else {
                return;
            };
            let len = g.elems * plan.out_elsize;
            // Checked: with the first run, the bounds of every run between (see `Rows::row`).
            let last_dst = last
                .checked_mul(g.dst_step)
                .and_then(|x| x.checked_add(g.dst))
                .expect("stitch group past the address space");
            self.check(&(g.dst..g.dst + len));
            self.check(&(last_dst..last_dst + len));
            // SAFETY: the group's first and last runs lie inside the buffer (checked above),
            // and its runs belong to this copy alone (the plan's disjointness), written by
            // this task only while `rows` lives.
            let mut rows = unsafe { Rows::new(self.ptr, self.len, g.dst, g.dst_step, len, g.rows) };
            fill(&g, &mut rows);
            store_fence();
        });
    }

    /// Calls `write(src_byte, dst_byte, run, axis_index)` with the output bytes of each run of
    /// `copy` (see [`for_each_run`]).
    fn for_each_target(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        axis: Option<usize>,
        mut write: impl FnMut(usize, usize, &mut [u8], u64),
    ) {
        let mut last_dst = None::<usize>;
        for_each_run(plan, copy, axis, |src, dst, n, axis_index| {
            let len = n * plan.out_elsize;
            self.check(&(dst..dst + len));
            // Runs of a copy are evenly spaced rows, each usually a few cache lines the CPU
            // has not seen: ask for the lines of the run `WRITE_AHEAD` rows ahead now, so they
            // arrive while the rows before them are copied.
            if let Some(prev) = last_dst
                && dst > prev
            {
                self.prefetch_for_write(
                    dst.saturating_add((dst - prev).saturating_mul(WRITE_AHEAD)),
                    len,
                );
            }
            last_dst = Some(dst);
            // SAFETY: `dst..dst+len` lies inside the buffer (checked) and belongs to this copy
            // alone (the plan's disjointness); the slice lives only for this call, and what
            // `write` reads from (a decoded chunk, or another copy's region of this buffer read
            // through `written`) does not overlap it.
            let to = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(dst), len) };
            write(src, dst, to, axis_index);
        });
    }

    /// Hints the CPU to fetch the output's cache lines of `start..start + len` for writing;
    /// nothing if that range is not inside the buffer.
    fn prefetch_for_write(&self, start: usize, len: usize) {
        prefetch_for_write(self.ptr, self.len, start, len);
    }

    /// Writes the fill value (one element, `fill.len() == plan.elsize`) into `copy`'s region,
    /// converted with `transform` if given.
    pub(crate) fn fill(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        fill: &[u8],
        transform: Option<&dyn StitchTransform>,
    ) {
        let zero = transform.is_none() && fill.iter().all(|&b| b == 0);
        let axis = transform.and_then(StitchTransform::axis);
        let mut src = Vec::new();
        for_each_run(plan, copy, axis, |_, dst, n, axis_index| {
            let len = n * plan.out_elsize;
            self.check(&(dst..dst + len));
            // SAFETY: as in `for_each_target`: in bounds and owned by this copy alone.
            let out = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(dst), len) };
            match transform {
                None if zero => out.fill(0),
                None => {
                    for el in out.chunks_exact_mut(fill.len()) {
                        el.copy_from_slice(fill);
                    }
                }
                Some(t) => {
                    let at = dst / plan.out_elsize;
                    if t.convert_fill(fill, n, out, axis_index, at) {
                        return;
                    }
                    // Runs of the fill value, made once for the longest run so far.
                    let bytes = n * fill.len();
                    while src.len() < bytes {
                        src.extend_from_slice(fill);
                    }
                    t.convert(&src[..bytes], out, axis_index, at);
                }
            }
        });
    }

    /// Calls `f` with the whole block of request `request`. Only for a block all of whose
    /// copies are written (the caller counts them), so no other task touches it any more.
    pub(crate) fn with_block<R>(
        &self,
        plan: &Plan,
        request: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let req = &plan.requests[request];
        let len = req.shape.iter().product::<u64>() as usize * plan.out_elsize;
        let range = req.out_offset..req.out_offset + len;
        self.check(&range);
        // SAFETY: in bounds (checked); every copy of this block has finished (the caller's
        // count reached zero), so this task is the only one with access to the block.
        let block =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) };
        f(block)
    }

    /// Calls `f` with the output bytes of a copy that covers a whole chunk contiguously (see
    /// [`contiguous_target`]), for decoding straight into the output; `None` if it does not.
    pub(crate) fn with_whole_chunk_target<R>(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Option<R> {
        let range = contiguous_target(plan, copy)?;
        self.check(&range);
        // SAFETY: in bounds (checked); the range is exactly this copy's region, which no other
        // copy writes (the plan's guarantee), and the caller's task handles this copy alone; the
        // mutable slice does not outlive `f`.
        let target =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) };
        Some(f(target))
    }

    /// Reads back the output bytes of a copy written by [`Self::with_whole_chunk_target`], to copy
    /// them into the chunk's other copies.
    pub(crate) fn written(&self, range: Range<usize>) -> &[u8] {
        self.check(&range);
        // SAFETY: the caller's task wrote this range itself and no other task writes it.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }
}

/// Orders this thread's non-temporal stores before the stores that follow (they are weakly
/// ordered): a copy written with [`Rows::write_interleaved2`] is complete before it is counted.
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence only orders this thread's stores; SSE2 is part of every x86-64 CPU.
    unsafe {
        std::arch::x86_64::_mm_sfence();
    }
}

/// If `copy` takes the whole leaf chunk and its region in the output block is one contiguous
/// range, that byte range of the output. The chunk's decoded bytes can then land there directly.
pub(crate) fn contiguous_target(plan: &Plan, copy: Copy<'_>) -> Option<Range<usize>> {
    let req = copy.request;
    let mut contiguous_from_here = true;
    let mut offset: u64 = 0;
    let strides = &req.strides;
    // Walk from the last dimension: each must take the whole chunk; once a dimension is
    // narrower than the block, every dimension before it must have length 1.
    for d in (0..plan.ndim).rev() {
        let Piece::Run { src: 0, dst, len } = *copy.piece(d) else {
            return None;
        };
        if len != plan.leaf_shape[d] {
            return None;
        }
        if !contiguous_from_here && len != 1 {
            return None;
        }
        if len != req.shape[d] {
            contiguous_from_here = false;
        }
        offset += dst * strides[d];
    }
    if plan.out_elsize != plan.elsize {
        return None;
    }
    let start = req.out_offset + offset as usize * plan.elsize;
    let bytes = plan.leaf_shape.iter().product::<u64>() as usize * plan.elsize;
    Some(start..start + bytes)
}
/// Calls `emit(src_byte, dst_byte, n_elements, axis_index)` for each contiguous run of `copy`:
/// `src_byte` in the decoded chunk, `dst_byte` in the output buffer, `axis_index` the run's
/// index along `axis` in the output block. Trailing dimensions that are whole in both the chunk
/// and the block merge into one longer run, but a run never spans two indices of `axis`.
fn for_each_run(
    plan: &Plan,
    copy: Copy<'_>,
    axis: Option<usize>,
    mut emit: impl FnMut(usize, usize, usize, u64),
) {
    for_each_group(plan, copy, axis, |g| {
        let (mut src, mut dst) = (g.src, g.dst);
        for i in 0..g.rows as u64 {
            emit(src, dst, g.elems, g.axis_index + i * g.axis_step);
            src += g.src_step;
            dst += g.dst_step;
        }
    });
}

/// The runs of `copy` (see [`for_each_run`]) as groups of evenly spaced ones: `emit` gets each
/// group once.
fn for_each_group(
    plan: &Plan,
    copy: Copy<'_>,
    axis: Option<usize>,
    mut emit: impl FnMut(RunGroup),
) {
    let nd = plan.ndim;
    let (es, oes) = (plan.elsize, plan.out_elsize);
    let req = copy.request;
    if nd == 0 {
        emit(RunGroup {
            src: 0,
            src_step: 0,
            dst: req.out_offset,
            dst_step: 0,
            rows: 1,
            elems: 1,
            axis_index: 0,
            axis_step: 0,
        });
        return;
    }
    // Kept in the plan: this runs once per (chunk, crop) pair, thousands of times a batch.
    let (src_strides, dst_strides) = (&plan.leaf_strides, &req.strides);
    let piece_len = |d: usize| match copy.piece(d) {
        Piece::Run { len, .. } => *len,
        Piece::Gather(p) => p.len() as u64,
    };

    // The dimensions run_dim.. form one run of `run_elems` elements (run_dim == nd: single
    // elements).
    let (mut run_dim, mut run_elems) = match copy.piece(nd - 1) {
        Piece::Run { len, .. } => {
            let mut dim = nd - 1;
            let mut elems = *len;
            while dim > 0 {
                let whole = matches!(copy.piece(dim), Piece::Run { src: 0, dst: 0, len }
                    if *len == plan.leaf_shape[dim] && *len == req.shape[dim]);
                let Piece::Run { len: prev, .. } = copy.piece(dim - 1) else {
                    break;
                };
                if !whole {
                    break;
                }
                dim -= 1;
                elems = prev * src_strides[dim];
            }
            (dim, elems)
        }
        Piece::Gather(_) => (nd, 1),
    };
    // A run must not span two indices of the transform's axis.
    if let Some(a) = axis
        && run_dim <= a
    {
        run_dim = a + 1;
        run_elems = if run_dim == nd {
            1
        } else {
            piece_len(run_dim) * src_strides[run_dim]
        };
    }

    // Offsets contributed by the run dimension's own start.
    let (run_src, run_dst) = if run_dim < nd {
        match copy.piece(run_dim) {
            Piece::Run { src, dst, .. } => (src * src_strides[run_dim], dst * dst_strides[run_dim]),
            Piece::Gather(_) => (0, 0),
        }
    } else {
        (0, 0)
    };

    // Iterate the outer dimensions 0..run_dim. The innermost of them, when a run of the
    // chunk, is stepped by its strides alone: a crop's copy is mostly rows of one 2-D slab,
    // and recomputing every dimension's offset per row was most of the cost of a short row.
    let at = |d: usize, i: usize| -> (u64, u64) {
        match copy.piece(d) {
            Piece::Run { src, dst, .. } => (src + i as u64, dst + i as u64),
            Piece::Gather(p) => p[i],
        }
    };
    let stepped = match run_dim.checked_sub(1).map(|d| (d, copy.piece(d))) {
        Some((d, Piece::Run { len, .. })) => Some((d, *len)),
        _ => None,
    };
    let outer = stepped.map_or(run_dim, |(d, _)| d);
    let mut idx: smallvec::SmallVec<[usize; 8]> = smallvec::smallvec![0; outer];
    loop {
        let (mut src, mut dst) = (run_src, run_dst);
        let mut axis_index = 0;
        for (d, &i) in idx.iter().enumerate() {
            let (a, b) = at(d, i);
            src += a * src_strides[d];
            dst += b * dst_strides[d];
            if axis == Some(d) {
                axis_index = b;
            }
        }
        let (mut src, mut dst) = (src as usize * es, req.out_offset + dst as usize * oes);
        let elems = run_elems as usize;
        match stepped {
            Some((d, len)) => {
                let (a, b) = at(d, 0);
                src += a as usize * src_strides[d] as usize * es;
                dst += b as usize * dst_strides[d] as usize * oes;
                let along = axis == Some(d);
                emit(RunGroup {
                    src,
                    src_step: src_strides[d] as usize * es,
                    dst,
                    dst_step: dst_strides[d] as usize * oes,
                    rows: len as usize,
                    elems,
                    axis_index: if along { b } else { axis_index },
                    axis_step: u64::from(along),
                });
            }
            None => emit(RunGroup {
                src,
                src_step: 0,
                dst,
                dst_step: 0,
                rows: 1,
                elems,
                axis_index,
                axis_step: 0,
            }),
        }
        // Next index of the outer dimensions.
        let mut d = outer;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < piece_len(d) as usize {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{DimSelection, Plan, c_strides};
    use proptest::prelude::*;

    /// Stitches a plan from an array whose element i (C order) has value i, and checks the
    /// output equals direct indexing: through `copy_groups_with` (each run copied from the
    /// chunk at the group's offsets) if `groups`, else through `copy_from_chunk`. The output
    /// starts `skew` bytes past a cache line's start.
    fn stitch_and_check(
        shape: &[u64],
        leaf: &[u64],
        requests: &[Vec<DimSelection>],
        groups: bool,
        skew: usize,
    ) {
        let es = 4usize;
        let plan = Plan::new(shape, leaf, es, requests).unwrap();
        let mut bytes = vec![0u8; plan.out_len + 128];
        // The allocation's first whole cache line.
        let line = (64 - bytes.as_ptr().addr() % 64) % 64;
        let out = &mut bytes[line + skew..line + skew + plan.out_len];
        out.fill(0xAA);
        let arr_strides = c_strides(shape);
        let leaf_elems: u64 = leaf.iter().product();
        {
            let o = DisjointOut::for_plan(out, &plan);
            for l in &plan.leaves {
                // Build the decoded chunk: element j of the chunk has the array's linear index.
                let mut chunk = Vec::with_capacity(leaf_elems as usize * es);
                let ls = c_strides(leaf);
                for j in 0..leaf_elems {
                    let mut lin = 0u64;
                    for d in 0..leaf.len() {
                        let within = (j / ls[d]) % leaf[d];
                        lin += (l.coords[d] * leaf[d] + within) * arr_strides[d];
                    }
                    chunk.extend_from_slice(&(lin as u32).to_le_bytes());
                }
                for c in plan.copies(l) {
                    if groups {
                        o.copy_groups_with(&plan, c, |g, rows| {
                            for i in 0..g.rows {
                                let (at, n) = (g.src + i * g.src_step, rows.run_len());
                                // Both ways of writing a run, alternately; the second
                                // as the two byte streams of 16-bit samples.
                                let run = &chunk[at..at + n];
                                if i % 2 == 0 {
                                    rows.row(i).copy_from_slice(run);
                                } else {
                                    let lows: Vec<u8> = run.iter().step_by(2).copied().collect();
                                    let highs: Vec<u8> =
                                        run.iter().skip(1).step_by(2).copied().collect();
                                    rows.write_interleaved2(i, &lows, &highs);
                                }
                            }
                        });
                    } else {
                        o.copy_from_chunk(&plan, c, &chunk, None);
                    }
                }
            }
        }
        let mut pos = 0;
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
                let mut lin = 0u64;
                for d in (0..lists.len()).rev() {
                    lin += lists[d][rem % lists[d].len()] * arr_strides[d];
                    rem /= lists[d].len();
                }
                let at = line + skew + (pos + i) * es;
                let got = u32::from_le_bytes(bytes[at..at + es].try_into().unwrap());
                assert_eq!(u64::from(got), lin, "element {}", pos + i);
            }
            pos += n;
        }
    }

    fn r(start: u64, len: u64) -> DimSelection {
        DimSelection::Range { start, len }
    }

    /// Every line the bytes touch is asked for once, whatever their alignment.
    #[test]
    fn crops_points_and_merged_runs() {
        // (shape, leaf, requests, output skews); the last has rows of several cache lines, on
        // even and odd addresses.
        type Case = (
            &'static [u64],
            &'static [u64],
            Vec<Vec<DimSelection>>,
            &'static [usize],
        );
        let cases: [Case; 5] = [
            (
                &[9, 7, 5],
                &[4, 3, 5],
                vec![
                    vec![r(1, 7), r(2, 5), r(0, 5)],
                    vec![r(0, 9), r(0, 7), r(1, 3)],
                ],
                &[0],
            ),
            (
                &[10, 10],
                &[3, 4],
                vec![vec![DimSelection::Points(vec![9, 0, 4, 4]), r(3, 6)]],
                &[0],
            ),
            (
                &[10, 10],
                &[3, 4],
                vec![vec![r(2, 5), DimSelection::Points(vec![7, 1, 2])]],
                &[0],
            ),
            (&[], &[], vec![vec![]], &[0]),
            (
                &[3, 40, 100],
                &[1, 16, 48],
                vec![
                    vec![r(1, 2), r(5, 30), r(3, 90)],
                    vec![r(0, 1), r(0, 40), r(47, 50)],
                ],
                &[0, 2, 1],
            ),
        ];
        for groups in [false, true] {
            for (shape, leaf, requests, skews) in &cases {
                for &skew in *skews {
                    stitch_and_check(shape, leaf, requests, groups, skew);
                }
            }
        }
    }

    #[test]
    fn whole_aligned_chunks_are_contiguous_targets() {
        // Crop (2, 4, 8) of an array chunked (1, 4, 8): every chunk fills a contiguous part.
        let plan = Plan::new(
            &[4, 8, 8],
            &[1, 4, 8],
            1,
            &[vec![r(1, 2), r(4, 4), r(0, 8)]],
        )
        .unwrap();
        let targets: Vec<_> = plan
            .leaves
            .iter()
            .map(|l| contiguous_target(&plan, plan.copies(l).next().unwrap()))
            .collect();
        assert_eq!(targets, vec![Some(0..32), Some(32..64)]);
        // Misaligned crop: no whole chunk.
        let plan = Plan::new(
            &[4, 8, 8],
            &[1, 4, 8],
            1,
            &[vec![r(1, 2), r(3, 4), r(0, 8)]],
        )
        .unwrap();
        assert!(
            plan.leaves
                .iter()
                .all(|l| contiguous_target(&plan, plan.copies(l).next().unwrap()).is_none())
        );
        // Whole chunk, but its rows are not contiguous in a wider block.
        let plan = Plan::new(&[8, 8], &[4, 4], 1, &[vec![r(0, 4), r(0, 8)]]).unwrap();
        assert!(contiguous_target(&plan, plan.copies(&plan.leaves[0]).next().unwrap()).is_none());
    }

    proptest! {
        #[test]
        fn stitched_output_equals_indexing(
            (shape, leaf, sels) in (1usize..4, 1u64..12).prop_flat_map(|(nd, wide)| {
                // The last dimension up to 88 elements: rows of several cache lines.
                proptest::collection::vec(1u64..9, nd).prop_map(move |mut shape| {
                    shape[nd - 1] *= wide;
                    shape
                }).prop_flat_map(move |shape| {
                    let leaf = shape.iter().map(|&s| 1..=s).collect::<Vec<_>>();
                    let sel = shape.iter().map(|&s| prop_oneof![
                        (0..s).prop_flat_map(move |a| (Just(a), 0..=s - a)).prop_map(|(start, len)| DimSelection::Range { start, len }),
                        proptest::collection::vec(0..s, 0..5).prop_map(DimSelection::Points),
                    ]).collect::<Vec<_>>();
                    (Just(shape), leaf, proptest::collection::vec(sel, 1..3))
                })
            }),
            groups in any::<bool>(),
            skew in 0usize..4,
        ) {
            stitch_and_check(&shape, &leaf, &sels, groups, skew);
        }
    }
}
