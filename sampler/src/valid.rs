//! The kernels of the valid-window pass (`zcrop.valid_windows`): which elements of a block
//! are missing (NaN or a fill value), reduced over the axes a window takes whole, and which
//! windows of given lengths contain a missing element.
//!
//! Both work on C-order arrays and make one pass over their input each (the window test one
//! pass per window axis), so the pass costs little beside decoding.

use rayon::prelude::*;

use crate::error::{Result, parallel, spec_err};

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
/// Blocks whose first axis is kept are split along it and marked in parallel (each part
/// writes its own part of the map).
// Fill values match exactly, as xarray masks them.
#[allow(clippy::float_cmp)]
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
    if bytes.len() != n * es || keep.len() != shape.len() {
        return Err(spec_err(format!(
            "a block of shape {shape:?} and {dtype} needs {} bytes and {} axis flags, got {} \
             and {}",
            n * es,
            shape.len(),
            bytes.len(),
            keep.len()
        )));
    }
    let out_shape: Vec<usize> = (0..shape.len())
        .filter(|&d| keep[d])
        .map(|d| shape[d])
        .collect();
    let mut out = vec![false; out_shape.iter().product()];
    if n == 0 {
        return Ok((out, out_shape));
    }
    with_test!(dtype, fills, mark_block(bytes, shape, keep, &mut out))?;
    Ok((out, out_shape))
}

/// [`mark`] over a whole block, in parallel parts along its first axis when that is kept.
fn mark_block<F: Fn(&[u8]) -> bool + Sync>(
    bytes: &[u8],
    shape: &[usize],
    keep: &[bool],
    out: &mut [bool],
    es: usize,
    test: F,
) -> Result<()> {
    if shape.len() > 1 && keep[0] && shape[0] > 1 {
        let n: usize = shape.iter().product();
        let (inner, kept) = (n / shape[0] * es, out.len() / shape[0]);
        let split = || {
            out.par_chunks_mut(kept.max(1))
                .zip(bytes.par_chunks(inner.max(1)))
                .for_each(|(o, b)| mark(b, es, &shape[1..], &keep[1..], o, &test));
        };
        parallel(split)
    } else {
        mark(bytes, es, shape, keep, out, &test);
        Ok(())
    }
}

/// ORs into `out` (the map over the kept axes) whether each element of the C-order block
/// `bytes` of `shape` is missing, row by row along the last axis.
fn mark<F: Fn(&[u8]) -> bool>(
    bytes: &[u8],
    es: usize,
    shape: &[usize],
    keep: &[bool],
    out: &mut [bool],
    test: &F,
) {
    let last = shape.len() - 1;
    let mut out_stride = vec![0usize; shape.len()];
    let mut s = 1usize;
    for d in (0..shape.len()).rev() {
        if keep[d] {
            out_stride[d] = s;
            s *= shape[d];
        }
    }
    let mut idx = vec![0usize; shape.len()];
    let mut at = 0usize;
    for row in bytes.chunks(shape[last].max(1) * es) {
        let flags = row.chunks_exact(es).map(test);
        if keep[last] {
            for (o, f) in out[at..at + shape[last]].iter_mut().zip(flags) {
                *o |= f;
            }
        } else if flags.fold(false, |a, f| a | f) {
            out[at] = true;
        }
        // The next row, advanced like an odometer (no divisions).
        let mut d = last;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            at += out_stride[d];
            if idx[d] < shape[d] {
                break;
            }
            at -= out_stride[d] * shape[d];
            idx[d] = 0;
        }
    }
}

/// Whether each window of `windows[d]` elements along every axis `d` (starting at each index
/// where it fits) holds a true element of `map` (C order, `shape`). Returns the result and its
/// shape, `shape[d] - windows[d] + 1` per axis (zero where the window does not fit).
///
/// # Errors
/// [`SamplerError::Threads`](crate::SamplerError::Threads) if zcrop's threads cannot start.
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
    fn window_any_over_wide_rows_and_many_row_groups() {
        // Rows wider than a strip of columns, windows short and long, several row groups.
        for (shape, w) in [
            (vec![40, 5000], vec![10, 1]),
            (vec![40, 5000], vec![3, 1]),
            (vec![6, 2, 4200], vec![2, 2, 9]),
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
            shape in proptest::collection::vec(1usize..6, 1..5),
            seed in 0u64..1000,
            keep_bits in 0u8..16,
        ) {
            let n: usize = shape.iter().product();
            let vals: Vec<f32> = (0..n)
                .map(|i| match ((i as u64 * 40_503) ^ seed) % 9 { 0 => f32::NAN, 1 => -1.0, v => v as f32 })
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
