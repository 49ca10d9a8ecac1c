//! Writing decoded chunks into the output from many threads at once: the unsafe module of
//! zarr-front besides `ffi`.
//!
//! [`DisjointOut`] lets every decode task write its copies into one shared output buffer
//! without locks. Soundness rests on the planner's guarantee (see `crate::plan`): no two copies
//! of a plan write the same output byte, and each leaf chunk (hence each copy) is handled by one
//! task. Every write is also bounds-checked against the buffer, so a planner bug could give
//! wrong bytes but never write outside the buffer.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;

use crate::codec::shuffle::interleave;
use crate::plan::{Copy, Piece, Plan};
use crate::transform::StitchTransform;

/// Hints the CPU to fetch the cache lines of `bytes` for reading, so that a decoder that reads
/// them later (or sequentially, one miss at a time) finds them in cache: e.g. a blosc chunk's
/// raw split in the page cache, read only after its compressed split is decoded. Nothing on
/// other architectures.
pub(crate) fn prefetch_read(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }>(bytes.as_ptr(), bytes.len());
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// [`prefetch_read`] into the second-level cache (not the first): for bytes read a while later,
/// whose lines would take the first level's room and outstanding misses from what is read now.
pub(crate) fn prefetch_read_l2(bytes: &[u8]) {
    PrefetchAlong::second_level(bytes).finish();
}

/// Cache lines to ask for one at a time, spread over work that goes on meanwhile:
/// [`PrefetchAlong::step`] asks for the next line, [`PrefetchAlong::finish`] for all those left.
///
/// A blosc chunk's raw split (up to 16 KiB of a 16-bit chunk of 32 KiB, read from memory) is
/// read by the unshuffle only after the chunk's LZ4 split is decoded. Asked for in one burst
/// before that decode, its 256 lines would fill the core's outstanding misses and the burst
/// itself wait on them; the LZ4 decoder now asks for one line per sequence it decodes (about 490 in such a split), so
/// the lines arrive during the decode, which misses little itself. They are asked into the
/// first-level cache ([`PrefetchAlong::new`]), since the unshuffle reads them right after the
/// decode ([`PrefetchAlong::second_level`] is for bytes read later).
#[derive(Debug)]
pub(crate) struct PrefetchAlong<'a> {
    /// The first line not asked for yet, as an offset from `base`, and the end of the bytes.
    next: usize,
    end: usize,
    base: *const u8,
    /// Whether the lines go into the first-level cache (else the second).
    first_level: bool,
    _bytes: PhantomData<&'a [u8]>,
}

impl<'a> PrefetchAlong<'a> {
    /// The lines of `bytes`, into the second-level cache: for bytes read a while after the
    /// work they are spread over.
    pub(crate) fn second_level(bytes: &'a [u8]) -> Self {
        PrefetchAlong {
            first_level: false,
            ..Self::new(bytes)
        }
    }

    /// The lines of `bytes`, into the first-level cache: for bytes read right after the work
    /// they are spread over.
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        let skew = bytes.as_ptr().addr() & 63;
        PrefetchAlong {
            first_level: true,
            next: 0,
            // (No bytes, no lines, wherever the empty slice points.)
            end: if bytes.is_empty() {
                0
            } else {
                skew + bytes.len()
            },
            base: bytes.as_ptr().wrapping_sub(skew),
            _bytes: PhantomData,
        }
    }

    /// No lines.
    pub(crate) fn none() -> Self {
        Self::new(&[])
    }

    /// Asks for the next line, if any is left.
    #[inline]
    pub(crate) fn step(&mut self) {
        if self.next < self.end {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
                let line = self.base.wrapping_add(self.next).cast::<i8>();
                // SAFETY: a prefetch only hints the cache: it neither reads nor writes memory
                // and never faults, whatever the address.
                unsafe {
                    if self.first_level {
                        _mm_prefetch::<_MM_HINT_T0>(line);
                    } else {
                        _mm_prefetch::<_MM_HINT_T1>(line);
                    }
                }
            }
            self.next += 64;
        }
    }

    /// Asks for every line left.
    pub(crate) fn finish(mut self) {
        while self.next < self.end {
            self.step();
        }
    }

    /// Lines not asked for yet.
    #[cfg(test)]
    pub(crate) fn left(&self) -> usize {
        (self.end.saturating_sub(self.next)).div_ceil(64)
    }
}

/// Issues the prefetch `HINT` for every cache line of the `len` bytes at `start` (the
/// second-level hint goes through [`PrefetchAlong`]).
#[cfg(target_arch = "x86_64")]
fn prefetch_lines<const HINT: i32>(start: *const u8, len: usize) {
    let skew = start.addr() & 63;
    let first = start.wrapping_sub(skew);
    for off in (0..skew + len).step_by(64) {
        // SAFETY: a prefetch only hints the cache: it neither reads nor writes memory and
        // never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(first.wrapping_add(off).cast::<i8>()) };
    }
}

/// Rows ahead of the one being copied whose output lines [`DisjointOut`] asks for. A 16-bit
/// blosc-lz4 crop row in a chunk (about 128 bytes) is copied in about 20 ns, and a line the
/// CPU has not seen takes longer than several of them to arrive; much further ahead, the lines
/// asked for crowd out those in use.
const WRITE_AHEAD: usize = 12;

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
        self.for_each_target(plan, copy, axis, |src, to, axis_index| {
            let from = &chunk[src..src + to.len() / plan.out_elsize * plan.elsize];
            match transform {
                None => to.copy_from_slice(from),
                Some(t) => t.convert(from, to, axis_index),
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
        mut fill: impl FnMut(&RunGroup, &mut Rows<'_, 'a>),
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
            let mut rows = Rows {
                out: self,
                dst: g.dst,
                step: g.dst_step,
                len,
                count: g.rows,
            };
            fill(&g, &mut rows);
            store_fence();
        });
    }

    /// Calls `write(src_byte, run, axis_index)` with the output bytes of each run of `copy`
    /// (see [`for_each_run`]).
    fn for_each_target(
        &self,
        plan: &Plan,
        copy: Copy<'_>,
        axis: Option<usize>,
        mut write: impl FnMut(usize, &mut [u8], u64),
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
            write(src, to, axis_index);
        });
    }

    /// Hints the CPU to fetch the output's cache lines of `start..start + len` for writing;
    /// nothing if that range is not inside the buffer (or not on x86-64).
    #[allow(clippy::unused_self)]
    fn prefetch_for_write(&self, start: usize, len: usize) {
        // Not `prefetch_lines`: a run's first and last cache lines can be shared with runs of
        // neighbouring chunks that other threads write. Stepping 64 bytes from `start` skips
        // the last line when the run ends early in it, which costs less than asking for
        // every line.
        #[cfg(target_arch = "x86_64")]
        if start.checked_add(len).is_some_and(|end| end <= self.len) {
            use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
            let mut at = start;
            while at < start + len {
                // SAFETY: `at` lies inside the buffer (checked above); a prefetch only hints
                // the cache and neither reads nor writes memory.
                unsafe { _mm_prefetch::<_MM_HINT_ET0>(self.ptr.add(at).cast::<i8>()) };
                at += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (start, len);
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
                    src.clear();
                    for _ in 0..n {
                        src.extend_from_slice(fill);
                    }
                    t.convert(&src, out, axis_index);
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

/// The output runs of one [`RunGroup`] of a copy, handed out one at a time.
pub(crate) struct Rows<'o, 'a> {
    out: &'o DisjointOut<'a>,
    dst: usize,
    step: usize,
    len: usize,
    count: usize,
}

impl Rows<'_, '_> {
    /// The bytes of each run.
    pub(crate) fn run_len(&self) -> usize {
        self.len
    }

    /// The output bytes of run `i` (`i` below the group's run count, asserted). Asks for the lines of the run
    /// [`WRITE_AHEAD`] runs on, as [`DisjointOut::copy_from_chunk`] does.
    #[inline]
    pub(crate) fn row(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.count, "run {i} of a group of {}", self.count);
        let dst = self.dst + i * self.step;
        if self.step > 0 {
            self.out.prefetch_for_write(
                dst.saturating_add(self.step.saturating_mul(WRITE_AHEAD)),
                self.len,
            );
        }
        // SAFETY: the group's first and last runs were checked to lie inside the buffer, and
        // run `i` lies between them (the step is not negative); the runs belong to this copy
        // alone (the plan's disjointness), and the slice borrows `self` mutably, so no two of
        // them live at once.
        unsafe { std::slice::from_raw_parts_mut(self.out.ptr.add(dst), self.len) }
    }

    /// Writes run `i` as the interleave of `lows` and `highs` (the low and high bytes of the
    /// run's 16-bit samples, half the run each, as blosc's byte shuffle stores them). The
    /// cache lines the run covers whole go from registers straight to memory with
    /// non-temporal stores: no read-for-ownership of the line, as an ordinary store would
    /// make, and no cache room. Only the partial lines at its ends are stored (and asked for,
    /// [`WRITE_AHEAD`] runs on) as usual. [`DisjointOut::copy_groups_with`] orders the stores
    /// before the copy counts as done. The samples are interleaved in registers, so no copy of
    /// the run is needed; the partial lines are not streamed (masked non-temporal stores,
    /// `maskmovdqu`, are much slower than ordinary ones).
    #[allow(
        clippy::cast_ptr_alignment,
        reason = "unaligned loads; the streaming stores' targets are 64-byte aligned (below)"
    )]
    pub(crate) fn write_interleaved2(&mut self, i: usize, lows: &[u8], highs: &[u8]) {
        assert!(i < self.count, "run {i} of a group of {}", self.count);
        let len = self.len;
        assert!(
            lows.len() * 2 == len && highs.len() * 2 == len,
            "a run's two byte streams"
        );
        let dst = self.dst + i * self.step;
        let addr = self.out.ptr.addr() + dst;
        // An odd address (a caller's buffer can be anywhere) takes ordinary stores throughout.
        let head = if addr % 2 == 1 {
            len
        } else {
            ((64 - addr % 64) % 64).min(len)
        };
        let body = if cfg!(target_arch = "x86_64") {
            (len - head) / 64 * 64
        } else {
            0
        };
        if self.step > 0 {
            // Only the partial lines are read before they are written.
            let ahead = dst.saturating_add(self.step.saturating_mul(WRITE_AHEAD));
            if head > 0 {
                self.out.prefetch_for_write(ahead, 1);
            }
            if head + body < len {
                self.out.prefetch_for_write(ahead + head + body, 1);
            }
        }
        // `head` is even unless it is all of the run (`len` is even: whole samples).
        let (h, b) = (head / 2, head / 2 + body / 2);
        // SAFETY: run `i` lies inside the buffer (as in `row`) and belongs to this copy alone;
        // its head and tail, the two slices here, do not overlap; `lows` and `highs` are other
        // memory.
        unsafe {
            let to = self.out.ptr.add(dst);
            let head_out = std::slice::from_raw_parts_mut(to, head);
            interleave::<2>([&lows[..h], &highs[..h]], head_out);
            let tail_out = std::slice::from_raw_parts_mut(to.add(head + body), len - head - body);
            interleave::<2>([&lows[b..], &highs[b..]], tail_out);
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{
                __m128i, _mm_loadu_si128, _mm_stream_si128, _mm_unpackhi_epi8, _mm_unpacklo_epi8,
            };
            let (lows, highs) = (&lows[h..b], &highs[h..b]);
            for e in (0..body / 2).step_by(32) {
                // SAFETY: `e + 32 <= body / 2`, the length of both streams' slices, so the
                // 16-byte loads at `e` and `e + 16` are inside them (unaligned loads need no
                // alignment); the 64 output bytes at `head + 2 * e` are a whole line of run
                // `i` (64-byte aligned, as `movntdq` needs), which belongs to this copy alone.
                // SSE2 is part of every x86-64 CPU.
                unsafe {
                    let l0 = _mm_loadu_si128(lows.as_ptr().add(e).cast::<__m128i>());
                    let l1 = _mm_loadu_si128(lows.as_ptr().add(e + 16).cast::<__m128i>());
                    let h0 = _mm_loadu_si128(highs.as_ptr().add(e).cast::<__m128i>());
                    let h1 = _mm_loadu_si128(highs.as_ptr().add(e + 16).cast::<__m128i>());
                    let line = self.out.ptr.add(dst + head + 2 * e).cast::<__m128i>();
                    _mm_stream_si128(line, _mm_unpacklo_epi8(l0, h0));
                    _mm_stream_si128(line.add(1), _mm_unpackhi_epi8(l0, h0));
                    _mm_stream_si128(line.add(2), _mm_unpacklo_epi8(l1, h1));
                    _mm_stream_si128(line.add(3), _mm_unpackhi_epi8(l1, h1));
                }
            }
        }
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

/// Evenly spaced runs of one copy, as [`for_each_group`] hands them out: run `i` (of `rows`)
/// starts at byte `src + i * src_step` of the decoded chunk and `dst + i * dst_step` of the
/// output, is `elems` elements long, and lies at index `axis_index + i * axis_step` along the
/// transform's axis. A crop's copy from a chunk is mostly the rows of one 2-D slab: one group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunGroup {
    pub(crate) src: usize,
    pub(crate) src_step: usize,
    dst: usize,
    dst_step: usize,
    pub(crate) rows: usize,
    pub(crate) elems: usize,
    axis_index: u64,
    axis_step: u64,
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
    fn prefetch_along_covers_each_line_of_its_bytes() {
        let buf = vec![0u8; 1024];
        let at = 64 - (buf.as_ptr().addr() & 63);
        for (skew, len, lines) in [
            (0, 0, 0),
            (0, 1, 1),
            (0, 64, 1),
            (0, 65, 2),
            (63, 2, 2),
            (10, 128, 3),
        ] {
            let bytes = &buf[at + skew..at + skew + len];
            for mut along in [
                PrefetchAlong::new(bytes),
                PrefetchAlong::second_level(bytes),
            ] {
                assert_eq!(along.left(), lines, "{skew}+{len}");
                for k in (0..lines).rev() {
                    along.step();
                    assert_eq!(along.left(), k);
                }
                along.step();
                assert_eq!(along.left(), 0);
            }
        }
        assert_eq!(PrefetchAlong::none().left(), 0);
    }

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
