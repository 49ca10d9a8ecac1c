//! The kernels of the valid-window pass (`zcrop.valid_windows`): which elements of a block
//! are missing (NaN or a fill value), reduced over the axes a window takes whole, and which
//! windows of given lengths contain a missing element.
//!
//! Both work on C-order arrays and make one pass over their input each (the window test one
//! pass per window axis). The missing-element test also runs inside a read
//! ([`read_missing`]), on each decoded run while it is in cache, so the values of a pass over
//! a whole dataset are never written out.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;
use zcrop_zarr::StitchTransform;

use crate::SamplerError;
use crate::error::{Result, parallel, spec_err};
use crate::pinned::{PinOptions, PinnedBuffer};

/// Element types the kernels read, by their v3 names (native byte order).
fn element_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "bool" | "int8" | "uint8" => 1,
        "int16" | "uint16" | "float16" => 2,
        "int32" | "uint32" | "float32" => 4,
        "int64" | "uint64" | "float64" => 8,
        _ => return None,
    })
}

/// Calls `run` with the test "is this element missing" for `dtype`: NaN (floats) or equal to
/// one of `fills` (compared in the element's own type; a fill the type cannot hold matches
/// nothing). One or two fills, the common cases, compile to plain comparisons.
macro_rules! with_test {
    ($dtype:expr, $fills:expr, $run:ident($($arg:expr),*)) => {{
        macro_rules! ints {
            ($t:ty) => {{
                // Whole fills the type can hold (the float-to-int cast saturates).
                let f: Vec<$t> = $fills
                    .iter()
                    .filter(|f| f.fract() == 0.0)
                    .filter_map(|&f| <$t>::try_from(f as i128).ok())
                    .collect();
                let v = |b: &[u8]| <$t>::from_ne_bytes(b.try_into().expect("element size"));
                match f.as_slice() {
                    [] => $run($($arg,)* size_of::<$t>(), |_: &[u8]| false),
                    &[x] => $run($($arg,)* size_of::<$t>(), move |b: &[u8]| v(b) == x),
                    &[x, y] => $run($($arg,)* size_of::<$t>(), move |b: &[u8]| {
                        let e = v(b);
                        (e == x) | (e == y)
                    }),
                    many => $run($($arg,)* size_of::<$t>(), |b: &[u8]| many.contains(&v(b))),
                }
            }};
        }
        macro_rules! floats {
            ($t:ty, $conv:expr) => {{
                let v = |b: &[u8]| -> f64 {
                    $conv(<$t>::from_ne_bytes(b.try_into().expect("element size")))
                };
                match $fills {
                    [] => $run($($arg,)* size_of::<$t>(), move |b: &[u8]| v(b).is_nan()),
                    &[x] => $run($($arg,)* size_of::<$t>(), move |b: &[u8]| {
                        let e = v(b);
                        e.is_nan() | (e == x)
                    }),
                    many => $run($($arg,)* size_of::<$t>(), |b: &[u8]| {
                        let e = v(b);
                        e.is_nan() || many.contains(&e)
                    }),
                }
            }};
        }
        match $dtype {
            "bool" | "uint8" => ints!(u8),
            "int8" => ints!(i8),
            "int16" => ints!(i16),
            "uint16" => ints!(u16),
            "int32" => ints!(i32),
            "uint32" => ints!(u32),
            "int64" => ints!(i64),
            "uint64" => ints!(u64),
            "float16" => floats!(u16, |x: u16| f64::from(half::f16::from_bits(x))),
            "float32" => floats!(f32, f64::from),
            "float64" => floats!(f64, |x: f64| x),
            _ => unreachable!("checked by element_size"),
        }
    }};
}

/// The missing-element map of a C-order block of `shape` and type `dtype`, reduced (any) over
/// the axes where `keep` is false. Returns the map and its shape (the kept axes).
///
/// For a block already in memory; [`read_missing`] builds the same map while a read decodes.
/// The block is split along its first axis and the parts are marked in parallel.
///
/// # Errors
/// [`SamplerError::Spec`] for an unsupported `dtype` or a block whose length does not match
/// `shape`; [`SamplerError::Threads`] if zcrop's threads cannot start.
pub fn missing_map(
    bytes: &[u8],
    dtype: &str,
    shape: &[usize],
    fills: &[f64],
    keep: &[bool],
) -> Result<(Vec<bool>, Vec<usize>)> {
    let es = element_size(dtype)
        .ok_or_else(|| spec_err(format!("valid windows of {dtype} data are not supported")))?;
    let n: usize = shape.iter().product();
    if bytes.len() != n * es {
        return Err(spec_err(format!(
            "a block of shape {shape:?} and {dtype} needs {} bytes, got {}",
            n * es,
            bytes.len()
        )));
    }
    let map = read_missing(shape, dtype, fills, keep, |sink, _| {
        // Parts of whole rows along the first axis, as a read's threads would pass them.
        let part = (n / shape.first().copied().unwrap_or(1).max(1)).max(1);
        parallel(|| {
            bytes
                .par_chunks(part * es)
                .enumerate()
                .for_each(|(i, b)| sink.convert(b, &mut [], 0, i * part));
        })
    })?;
    let cells = map.to_bools()?;
    Ok((cells, map.shape))
}

/// Which elements of a block of `shape` (C order, type `dtype`) are missing, reduced (any)
/// over the axes where `keep` is false (the map's shape is that of the kept axes), recorded
/// while `read` decodes them.
///
/// `read(transform, out)` reads the block into `out` with the given [`StitchTransform`]. The
/// transform's output elements are one byte each and it writes none of them: `out` is a fresh
/// mapping whose pages are never touched, so it costs no memory. It tests each decoded chunk
/// while the chunk is in cache, skips a chunk without a missing element, and otherwise marks the
/// map where the chunk's runs hold one, so the values themselves are never written out. A
/// `read` may pass runs from many threads at once.
///
/// # Errors
/// [`SamplerError::Spec`] (converted into `E`) for an unsupported `dtype` or a `keep` of the
/// wrong length, [`SamplerError::Alloc`] if the mapping fails; what `read` returns.
// Fill values match exactly, as xarray masks them.
#[allow(clippy::float_cmp)]
pub fn read_missing<E: From<SamplerError>>(
    shape: &[usize],
    dtype: &str,
    fills: &[f64],
    keep: &[bool],
    read: impl FnOnce(&dyn StitchTransform, &mut [u8]) -> std::result::Result<(), E>,
) -> std::result::Result<MissingMap, E> {
    if element_size(dtype).is_none() {
        return Err(spec_err(format!("valid windows of {dtype} data are not supported")).into());
    }
    if keep.len() != shape.len() {
        return Err(spec_err(format!(
            "a block of shape {shape:?} needs {} axis flags, got {}",
            shape.len(),
            keep.len()
        ))
        .into());
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .ok_or_else(|| spec_err(format!("a block of shape {shape:?} is too large")))?;
    let mut out =
        PinnedBuffer::new(n, &PinOptions::pageable()).map_err(|e| SamplerError::Alloc {
            bytes: n,
            reason: e.to_string(),
        })?;
    let marks = Marks::new(shape, keep);
    with_test!(
        dtype,
        fills,
        read_with(&marks, |t| read(t, out.as_mut_slice()))
    )?;
    Ok(marks.into_map())
}

/// The map [`read_missing`] fills: which elements of the read block are missing, over the
/// kept axes, one bit per cell in atomic words, so that a slab's map stays small enough for
/// the caches while the channels of an area mark the same cells one after the other. Runs on
/// many threads mark it at once. A word whose cells are all to be marked is stored whole,
/// without reading it (no other value can be more than all marks, so the store loses none);
/// any other is ORed, and only when it lacks a mark to be set.
struct Marks {
    /// The block's shape; a run never spans two rows along its last axis here.
    shape: Vec<usize>,
    /// Per block axis, the stride of its index in the map (0 on a reduced axis).
    stride: Vec<usize>,
    words: Vec<AtomicU64>,
    /// The map's shape.
    map_shape: Vec<usize>,
    /// The last axis is kept: a row's elements have consecutive cells (else they share one).
    kept_last: bool,
}

impl Marks {
    fn new(shape: &[usize], keep: &[bool]) -> Self {
        let mut stride = vec![0usize; shape.len()];
        let mut s = 1usize;
        for d in (0..shape.len()).rev() {
            if keep[d] {
                stride[d] = s;
                s *= shape[d];
            }
        }
        let map_shape: Vec<usize> = (0..shape.len())
            .filter(|&d| keep[d])
            .map(|d| shape[d])
            .collect();
        Marks {
            shape: shape.to_vec(),
            kept_last: stride.last() == Some(&1),
            stride,
            words: (0..s.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            map_shape,
        }
    }

    /// Splits elements `at .. at + n` of the block into the parts that lie in one row along
    /// its last axis: `f(i, len)` for the part of `len` elements from `at + i`.
    fn rows(&self, at: usize, n: usize, mut f: impl FnMut(usize, usize)) {
        let row = self.shape.last().copied().unwrap_or(1).max(1);
        let mut i = 0;
        while i < n {
            let len = (row - (at + i) % row).min(n - i);
            f(i, len);
            i += len;
        }
    }

    /// The map index of element `e` of the block (its C-order index).
    fn index(&self, mut e: usize) -> usize {
        let mut at = 0;
        for (&n, &stride) in self.shape.iter().zip(&self.stride).rev() {
            at += (e % n) * stride;
            e /= n;
        }
        at
    }

    /// ORs `mask` into word `w`, unless its marks are set already.
    fn or_word(&self, w: usize, mask: u64) {
        let word = &self.words[w];
        if word.load(Ordering::Relaxed) & mask != mask {
            word.fetch_or(mask, Ordering::Relaxed);
        }
    }

    /// Marks cells `start .. start + len`, with `flag(k)` saying whether cell `start + k` is
    /// missing, a word at a time.
    fn mark_cells(&self, start: usize, len: usize, flag: impl Fn(usize) -> bool) {
        let mut k = 0;
        while k < len {
            let (w, off) = ((start + k) / 64, (start + k) % 64);
            let take = (64 - off).min(len - k);
            let mut mask = 0u64;
            for j in 0..take {
                mask |= u64::from(flag(k + j)) << (off + j);
            }
            if mask != 0 {
                self.or_word(w, mask);
            }
            k += take;
        }
    }

    /// Marks every cell of `start .. start + len`.
    fn mark_all(&self, start: usize, len: usize) {
        let mut k = 0;
        while k < len {
            let (w, off) = ((start + k) / 64, (start + k) % 64);
            let take = (64 - off).min(len - k);
            if take == 64 {
                self.words[w].store(u64::MAX, Ordering::Relaxed);
            } else {
                self.or_word(w, (u64::MAX >> (64 - take)) << off);
            }
            k += take;
        }
    }

    fn into_map(self) -> MissingMap {
        MissingMap {
            bits: self.words.into_iter().map(AtomicU64::into_inner).collect(),
            shape: self.map_shape,
        }
    }
}

/// A missing-element map as [`read_missing`] returns it: over `shape` (C order), bit `i % 64`
/// of `bits[i / 64]` is set where element `i` is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingMap {
    /// The cells' bits (the last word may run past the last cell, with zeros).
    pub bits: Vec<u64>,
    /// The map's shape.
    pub shape: Vec<usize>,
}

impl MissingMap {
    /// The number of cells.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the map has no cell.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cells as booleans, unpacked in parallel parts on zcrop's threads (a word without a
    /// mark, the common case, costs a compare).
    ///
    /// # Errors
    /// [`SamplerError::Threads`] if zcrop's threads cannot start.
    pub fn to_bools(&self) -> Result<Vec<bool>> {
        let mut out = vec![false; self.len()];
        parallel(|| {
            out.par_chunks_mut(64 * 1024)
                .zip(self.bits.par_chunks(1024))
                .for_each(|(cells, bits)| {
                    for (part, &word) in cells.chunks_mut(64).zip(bits) {
                        if word != 0 {
                            for (k, c) in part.iter_mut().enumerate() {
                                *c = (word >> k) & 1 == 1;
                            }
                        }
                    }
                });
        })?;
        Ok(out)
    }
}

/// Runs `read` with a [`MissingSink`] of `test` over `marks`.
fn read_with<E, F: Fn(&[u8]) -> bool + Sync>(
    marks: &Marks,
    read: impl FnOnce(&dyn StitchTransform) -> std::result::Result<(), E>,
    es: usize,
    test: F,
) -> std::result::Result<(), E> {
    read(&MissingSink { marks, es, test })
}

/// The transform of [`read_missing`]: marks where decoded elements are missing.
struct MissingSink<'m, F> {
    marks: &'m Marks,
    es: usize,
    test: F,
}

impl<F: Fn(&[u8]) -> bool + Sync> MissingSink<'_, F> {
    /// Whether `src` holds a missing element.
    fn any<const ES: usize>(&self, src: &[u8]) -> bool {
        src.chunks_exact(ES).fold(false, |a, b| a | (self.test)(b))
    }

    /// Whether every element of `src` is missing.
    fn all<const ES: usize>(&self, src: &[u8]) -> bool {
        src.chunks_exact(ES).fold(true, |a, b| a & (self.test)(b))
    }

    /// Marks the missing elements among `src`, whose first element is element `at` of the
    /// block, one row (along the block's last axis) at a time: a row without a missing element
    /// costs one pass of the test, a row of them one more; only a row of both is marked
    /// element by element.
    fn mark<const ES: usize>(&self, src: &[u8], at: usize) {
        self.marks.rows(at, src.len() / ES, |i, len| {
            let part = &src[i * ES..(i + len) * ES];
            if !self.any::<ES>(part) {
                return;
            }
            let base = self.marks.index(at + i);
            if !self.marks.kept_last {
                self.marks.mark_all(base, 1);
            } else if self.all::<ES>(part) {
                self.marks.mark_all(base, len);
            } else {
                let el = |k: usize| &part[k * ES..(k + 1) * ES];
                self.marks.mark_cells(base, len, |k| (self.test)(el(k)));
            }
        });
    }
}

impl<F: Fn(&[u8]) -> bool + Sync> StitchTransform for MissingSink<'_, F> {
    fn output_element_size(&self) -> usize {
        1
    }

    fn convert(&self, src: &[u8], _: &mut [u8], _: u64, at: usize) {
        // The element size as a constant, so that the test of a row vectorizes.
        match self.es {
            1 => self.mark::<1>(src, at),
            2 => self.mark::<2>(src, at),
            4 => self.mark::<4>(src, at),
            _ => self.mark::<8>(src, at),
        }
    }

    fn convert_fill(&self, fill: &[u8], n: usize, _: &mut [u8], _: u64, at: usize) -> bool {
        if (self.test)(fill) {
            let m = self.marks;
            m.rows(at, n, |i, len| {
                m.mark_all(m.index(at + i), if m.kept_last { len } else { 1 });
            });
        }
        true
    }

    fn skips_chunk(&self, chunk: &[u8]) -> bool {
        match self.es {
            1 => !self.any::<1>(chunk),
            2 => !self.any::<2>(chunk),
            4 => !self.any::<4>(chunk),
            _ => !self.any::<8>(chunk),
        }
    }
}

/// Whether each window of `windows[d]` elements along every axis `d` (starting at each index
/// where it fits) holds a true element of `map` (C order, `shape`). Returns the result and its
/// shape, `shape[d] - windows[d] + 1` per axis (zero where the window does not fit).
///
/// # Errors
/// [`SamplerError::Threads`] if zcrop's threads cannot start.
pub fn window_any(
    map: &[bool],
    shape: &[usize],
    windows: &[usize],
) -> Result<(Vec<bool>, Vec<usize>)> {
    parallel(|| window_any_here(map, shape, windows))
}

/// [`window_any`] on the current rayon pool. Blocks of lines, or groups of output rows, whose
/// input holds no true element are skipped (their output stays false): missing values are
/// usually rare or clustered, so most of a map is skipped at the cost of reading it once.
fn window_any_here(map: &[bool], shape: &[usize], windows: &[usize]) -> (Vec<bool>, Vec<usize>) {
    let mut cur = std::borrow::Cow::Borrowed(map);
    let mut cur_shape = shape.to_vec();
    for (d, &w) in windows.iter().enumerate() {
        if w <= 1 {
            continue;
        }
        let n = cur_shape[d];
        let m = (n + 1).saturating_sub(w);
        let outer: usize = cur_shape[..d].iter().product();
        let inner: usize = cur_shape[d + 1..].iter().product();
        let mut next = vec![false; outer * m * inner];
        if m > 0 && inner == 1 {
            // Along contiguous lines, each by doubling.
            cur.par_chunks_exact(n)
                .zip(next.par_chunks_exact_mut(m))
                .with_min_len(64)
                .for_each_init(
                    || (Vec::new(), Vec::new()),
                    |scratch, (src, dst)| {
                        if any_true(src) {
                            window_line(src, w, dst, scratch);
                        }
                    },
                );
        } else if m > 0 {
            for (src, dst) in cur
                .chunks_exact(n * inner)
                .zip(next.chunks_exact_mut(m * inner))
            {
                window_rows(src, inner, w, dst);
            }
        }
        cur = std::borrow::Cow::Owned(next);
        cur_shape[d] = m;
    }
    (cur.into_owned(), cur_shape)
}

/// Whether `s` holds a true element (64 at a time, which vectorizes).
fn any_true(s: &[bool]) -> bool {
    s.chunks(64).any(|c| c.iter().fold(false, |a, &b| a | b))
}

/// `dst[i]`: whether `src[i .. i + w]` holds a true element. By doubling: after step `j`,
/// `a[i]` covers `src[i .. i + 2^j]`; two overlapping spans then cover the window. Every step
/// is an elementwise OR of two buffers, which vectorizes (a running count would not).
/// `scratch` holds the two buffers between lines.
fn window_line(src: &[bool], w: usize, dst: &mut [bool], scratch: &mut (Vec<bool>, Vec<bool>)) {
    let (a, b) = scratch;
    a.clear();
    a.extend_from_slice(src);
    let mut span = 1;
    while span * 2 <= w {
        let len = a.len() - span;
        b.clear();
        b.extend(a[..len].iter().zip(&a[span..]).map(|(&x, &y)| x | y));
        std::mem::swap(a, b);
        span *= 2;
    }
    let shift = w - span;
    for ((o, &x), &y) in dst.iter_mut().zip(a.iter()).zip(&a[shift..]) {
        *o = x | y;
    }
}

/// The runs of true elements of `flags` as sorted `[start, end)` ranges. Eight flags at a
/// time where they do not change, so long stretches cost a load and a compare per eight.
pub fn runs(flags: &[bool]) -> Vec<(u64, u64)> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let mut out = Vec::new();
    let mut start: Option<usize> = None;
    let mut i = 0;
    while i < flags.len() {
        if i + 8 <= flags.len() {
            let word = u64::from_ne_bytes(std::array::from_fn(|k| u8::from(flags[i + k])));
            if word == if start.is_some() { ONES } else { 0 } {
                i += 8;
                continue;
            }
        }
        match (flags[i], start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s as u64, i as u64));
                start = None;
            }
            _ => {}
        }
        i += 1;
    }
    if let Some(s) = start {
        out.push((s as u64, flags.len() as u64));
    }
    out
}

/// [`window_line`] along the first axis of an `(n, inner)` block, for all `inner` columns, into
/// `dst` (`(n - w + 1, inner)`, all false). Groups of output rows run in parallel, each over
/// strips of columns that stay in cache: a short window ORs its rows, a long one keeps a
/// running count per column.
fn window_rows(src: &[bool], inner: usize, w: usize, dst: &mut [bool]) {
    const STRIP: usize = 4096;
    let m = dst.len() / inner;
    let threads = rayon::current_num_threads().max(1);
    // Each group re-reads w - 1 rows of its neighbour: groups of at least w rows bound that.
    let group = m.div_ceil(4 * threads).max(w.min(m)).max(1);
    dst.par_chunks_mut(group * inner)
        .enumerate()
        .for_each(|(g, out)| {
            let k0 = g * group;
            let rows = out.len() / inner;
            let block = &src[k0 * inner..(k0 + rows + w - 1) * inner];
            if !any_true(block) {
                return;
            }
            let mut count = vec![0u32; STRIP.min(inner)];
            for c0 in (0..inner).step_by(STRIP) {
                let c1 = (c0 + STRIP).min(inner);
                let row = |k: usize| &block[k * inner + c0..k * inner + c1];
                if w <= 8 {
                    for r in 0..rows {
                        let o = &mut out[r * inner + c0..r * inner + c1];
                        o.copy_from_slice(row(r));
                        for j in 1..w {
                            for (x, &y) in o.iter_mut().zip(row(r + j)) {
                                *x |= y;
                            }
                        }
                    }
                    continue;
                }
                let count = &mut count[..c1 - c0];
                count.fill(0);
                for k in 0..rows + w - 1 {
                    for (c, &v) in count.iter_mut().zip(row(k)) {
                        *c += u32::from(v);
                    }
                    if k >= w {
                        for (c, &v) in count.iter_mut().zip(row(k - w)) {
                            *c -= u32::from(v);
                        }
                    }
                    if k + 1 >= w {
                        let r = k + 1 - w;
                        let o = &mut out[r * inner + c0..r * inner + c1];
                        for (x, &c) in o.iter_mut().zip(count.iter()) {
                            *x = c > 0;
                        }
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The brute-force window test.
    fn brute(map: &[bool], shape: &[usize], windows: &[usize]) -> Vec<bool> {
        let out_shape: Vec<usize> = shape
            .iter()
            .zip(windows)
            .map(|(&n, &w)| (n + 1).saturating_sub(w))
            .collect();
        let total: usize = out_shape.iter().product();
        let mut res = Vec::with_capacity(total);
        for i in 0..total {
            let mut origin = vec![0usize; shape.len()];
            let mut rest = i;
            for d in (0..shape.len()).rev() {
                origin[d] = rest % out_shape[d];
                rest /= out_shape[d];
            }
            let mut any = false;
            let mut step = vec![0usize; shape.len()];
            'all: loop {
                let mut lin = 0;
                for d in 0..shape.len() {
                    lin = lin * shape[d] + origin[d] + step[d];
                }
                any |= map[lin];
                let mut d = shape.len();
                loop {
                    if d == 0 {
                        break 'all;
                    }
                    d -= 1;
                    step[d] += 1;
                    if step[d] < windows[d] {
                        break;
                    }
                    step[d] = 0;
                }
            }
            res.push(any);
        }
        res
    }

    #[test]
    fn window_any_over_long_lines_and_windows() {
        // Lines of many words, windows along them shorter and longer than a word, windows of
        // powers of two and not, and of a whole line.
        for (shape, w) in [
            (vec![40, 5000], vec![10, 1]),
            (vec![40, 5000], vec![3, 1]),
            (vec![6, 2, 4200], vec![2, 2, 9]),
            (vec![3, 700], vec![2, 130]),
            (vec![5, 300], vec![1, 64]),
            (vec![5, 300], vec![4, 65]),
            (vec![2, 3, 257], vec![2, 1, 128]),
            (vec![4, 129], vec![3, 129]),
            (vec![7, 64], vec![7, 63]),
        ] {
            let n: usize = shape.iter().product();
            let map: Vec<bool> = (0..n).map(|i| (i * 7919) % 1009 == 3).collect();
            let (got, _) = window_any(&map, &shape, &w).unwrap();
            assert_eq!(got, brute(&map, &shape, &w), "{shape:?} {w:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn window_any_matches_brute_force(
            shape in proptest::collection::vec(1usize..20, 1..4),
            seed in 0u64..1000,
            w in proptest::collection::vec(1usize..13, 3),
            sparse in proptest::sample::select(vec![7u64, 97, 1_000_003]),
        ) {
            // Dense maps, and sparse ones whose blocks and row groups are mostly skipped.
            let n: usize = shape.iter().product();
            let map: Vec<bool> = (0..n).map(|i| ((i as u64 * 2_654_435_761) ^ seed).is_multiple_of(sparse)).collect();
            let w = &w[..shape.len()];
            let (got, got_shape) = window_any(&map, &shape, w).unwrap();
            let want_shape: Vec<usize> = shape.iter().zip(w).map(|(&n, &w)| (n + 1).saturating_sub(w)).collect();
            proptest::prop_assert_eq!(&got_shape, &want_shape);
            proptest::prop_assert_eq!(got, brute(&map, &shape, w));
        }

        #[test]
        fn window_any_matches_brute_force_along_long_lines(
            rows in 1usize..5,
            n in 1usize..300,
            seed in 0u64..1000,
            w in (1usize..5, 1usize..300),
            sparse in proptest::sample::select(vec![2u64, 5, 61]),
        ) {
            // Lines of several words; windows across word boundaries.
            let shape = [rows, n];
            let map: Vec<bool> = (0..rows * n).map(|i| ((i as u64 * 2_654_435_761) ^ seed).is_multiple_of(sparse)).collect();
            let w = [w.0, w.1];
            let (got, _) = window_any(&map, &shape, &w).unwrap();
            proptest::prop_assert_eq!(got, brute(&map, &shape, &w));
        }

        #[test]
        fn runs_are_the_stretches_of_true(
            flags in proptest::collection::vec(proptest::bool::weighted(0.8), 0..200),
            long in 0usize..40,
        ) {
            // Long stretches exercise the eight-at-a-time skip.
            let mut flags = flags;
            flags.splice(0..0, std::iter::repeat_n(true, long));
            let got = runs(&flags);
            let mut rebuilt = vec![false; flags.len()];
            for &(a, b) in &got {
                proptest::prop_assert!(a < b);
                rebuilt[a as usize..b as usize].fill(true);
            }
            proptest::prop_assert_eq!(rebuilt, flags);
            proptest::prop_assert!(got.windows(2).all(|w| w[0].1 < w[1].0));
        }

        #[test]
        fn integer_fills_match_by_value(
            n in 1usize..300,
            seed in 0u64..1000,
            nfills in 0usize..4,
        ) {
            let vals: Vec<u16> = (0..n).map(|i| (((i as u64 * 40_503) ^ seed) % 6) as u16).collect();
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let fills: Vec<f64> = [0.0, 3.0, 5.0, 70_000.0][..nfills].to_vec();
            let (got, _) = missing_map(&bytes, "uint16", &[n], &fills, &[true]).unwrap();
            let want: Vec<bool> = vals.iter().map(|&v| fills.contains(&f64::from(v))).collect();
            proptest::prop_assert_eq!(got, want);
        }

        #[test]
        fn missing_map_reduces_dropped_axes(
            shape in proptest::collection::vec(1usize..6, 1..4),
            last in 1usize..40,
            seed in 0u64..1000,
            keep_bits in 0u8..16,
            whole_rows in proptest::bool::ANY,
        ) {
            // Rows of mixed values, and (with `whole_rows`) rows all missing beside them.
            let shape: Vec<usize> = shape.into_iter().chain([last]).collect();
            let n: usize = shape.iter().product();
            let vals: Vec<f32> = (0..n)
                .map(|i| {
                    let row = (i / last) as u64 ^ seed;
                    if whole_rows && row.is_multiple_of(3) {
                        return f32::NAN;
                    }
                    match ((i as u64 * 40_503) ^ seed) % 9 { 0 => f32::NAN, 1 => -1.0, v => v as f32 }
                })
                .collect();
            let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
            let keep: Vec<bool> = (0..shape.len()).map(|d| (keep_bits >> d) & 1 == 1).collect();
            let (got, got_shape) = missing_map(&bytes, "float32", &shape, &[-1.0], &keep).unwrap();
            let kept: Vec<usize> = (0..shape.len()).filter(|&d| keep[d]).map(|d| shape[d]).collect();
            proptest::prop_assert_eq!(&got_shape, &kept);
            let mut want = vec![false; kept.iter().product()];
            let mut idx = vec![0usize; shape.len()];
            for v in &vals {
                let mut lin = 0;
                for d in 0..shape.len() {
                    if keep[d] {
                        lin = lin * shape[d] + idx[d];
                    }
                }
                want[lin] |= v.is_nan() || v.to_bits() == (-1.0f32).to_bits();
                let mut d = shape.len();
                while d > 0 {
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < shape[d] { break; }
                    idx[d] = 0;
                }
            }
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn integer_fills_and_bad_blocks() {
        let vals: Vec<u16> = vec![0, 5, 7, 0, 65535, 3];
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let (m, s) = missing_map(
            &bytes,
            "uint16",
            &[2, 3],
            &[0.0, 65535.0, 2.5, -1.0],
            &[true, true],
        )
        .unwrap();
        assert_eq!(s, vec![2, 3]);
        assert_eq!(m, vec![true, false, false, true, true, false]);
        assert!(missing_map(&bytes, "uint16", &[4, 3], &[], &[true, true]).is_err());
        assert!(missing_map(&bytes, "complex64", &[2, 3], &[], &[true, true]).is_err());
    }
}
