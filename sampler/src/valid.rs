//! The kernels of the valid-window pass (`zcrop.valid_windows`): which elements of a block
//! are missing (NaN or a fill value), reduced over the axes a window takes whole, and which
//! windows of given lengths contain a missing element.
//!
//! Both work on C-order arrays and make one pass over their input each (the window test one
//! pass per window axis, with a running count), so the pass costs little beside decoding.

use crate::error::{Result, spec_err};

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

/// Whether each element is missing: NaN (floats) or equal to one of `fills` (compared in the
/// element's own type; a fill the type cannot hold matches nothing).
fn missing(bytes: &[u8], dtype: &str, fills: &[f64], out: &mut Vec<bool>) {
    macro_rules! ints {
        ($t:ty) => {{
            // Whole fills the type can hold (the float-to-int cast saturates).
            let fills: Vec<$t> = fills
                .iter()
                .filter(|f| f.fract() == 0.0)
                .filter_map(|&f| <$t>::try_from(f as i128).ok())
                .collect();
            out.extend(bytes.chunks_exact(size_of::<$t>()).map(|b| {
                let v = <$t>::from_ne_bytes(b.try_into().expect("element size"));
                fills.contains(&v)
            }));
        }};
    }
    macro_rules! floats {
        ($t:ty, $conv:expr) => {{
            let fills: Vec<f64> = fills.to_vec();
            out.extend(bytes.chunks_exact(size_of::<$t>()).map(|b| {
                let v: f64 = $conv(<$t>::from_ne_bytes(b.try_into().expect("element size")));
                v.is_nan() || fills.contains(&v)
            }));
        }};
    }
    match dtype {
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
}

/// The missing-element map of a C-order block of `shape` and type `dtype`, reduced (any) over
/// the axes where `keep` is false. Returns the map and its shape (the kept axes).
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
    if keep.iter().all(|&k| k) {
        let mut flags = Vec::with_capacity(n);
        missing(bytes, dtype, fills, &mut flags);
        return Ok((flags, out_shape));
    }
    // Output index of each input element, advanced like an odometer (no divisions).
    let mut out = vec![false; out_shape.iter().product()];
    let mut out_stride = vec![0usize; shape.len()];
    let mut s = 1usize;
    for d in (0..shape.len()).rev() {
        if keep[d] {
            out_stride[d] = s;
            s *= shape[d];
        }
    }
    let last = shape.len() - 1;
    let mut idx = vec![0usize; shape.len()];
    let mut at = 0usize;
    // Row by row (the last axis), so the per-element flags never exist for the whole block.
    let mut chunk = Vec::with_capacity(shape[last]);
    for row in bytes.chunks(shape[last].max(1) * es) {
        chunk.clear();
        missing(row, dtype, fills, &mut chunk);
        if keep[last] {
            for (o, &f) in out[at..at + chunk.len()].iter_mut().zip(&chunk) {
                *o |= f;
            }
        } else if chunk.iter().any(|&f| f) {
            out[at] = true;
        }
        // The next row.
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
    Ok((out, out_shape))
}

/// Whether each window of `windows[d]` elements along every axis `d` (starting at each index
/// where it fits) holds a true element of `map` (C order, `shape`). Returns the result and its
/// shape, `shape[d] - windows[d] + 1` per axis (zero where the window does not fit).
pub fn window_any(map: &[bool], shape: &[usize], windows: &[usize]) -> (Vec<bool>, Vec<usize>) {
    let mut cur = map.to_vec();
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
            // Along contiguous lines: a running count of true elements in the window.
            for (src, dst) in cur.chunks_exact(n).zip(next.chunks_exact_mut(m)) {
                let mut count = 0u32;
                for k in 0..n {
                    count += u32::from(src[k]);
                    if k >= w {
                        count -= u32::from(src[k - w]);
                    }
                    if k + 1 >= w {
                        dst[k + 1 - w] = count > 0;
                    }
                }
            }
        } else if m > 0 {
            let mut count = vec![0u32; inner];
            for o in 0..outer {
                let src = &cur[o * n * inner..(o + 1) * n * inner];
                let dst = &mut next[o * m * inner..(o + 1) * m * inner];
                count.fill(0);
                for k in 0..n {
                    let row = &src[k * inner..(k + 1) * inner];
                    for (c, &v) in count.iter_mut().zip(row) {
                        *c += u32::from(v);
                    }
                    if k >= w {
                        let gone = &src[(k - w) * inner..(k - w + 1) * inner];
                        for (c, &v) in count.iter_mut().zip(gone) {
                            *c -= u32::from(v);
                        }
                    }
                    if k + 1 >= w {
                        let out = &mut dst[(k + 1 - w) * inner..(k + 2 - w) * inner];
                        for (o, &c) in out.iter_mut().zip(&count) {
                            *o = c > 0;
                        }
                    }
                }
            }
        }
        cur = next;
        cur_shape[d] = m;
    }
    (cur, cur_shape)
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

    proptest::proptest! {
        #[test]
        fn window_any_matches_brute_force(
            shape in proptest::collection::vec(1usize..7, 1..4),
            seed in 0u64..1000,
            w in proptest::collection::vec(1usize..5, 3),
        ) {
            let n: usize = shape.iter().product();
            let map: Vec<bool> = (0..n).map(|i| ((i as u64 * 2_654_435_761) ^ seed).is_multiple_of(7)).collect();
            let w = &w[..shape.len()];
            let (got, got_shape) = window_any(&map, &shape, w);
            let want_shape: Vec<usize> = shape.iter().zip(w).map(|(&n, &w)| (n + 1).saturating_sub(w)).collect();
            proptest::prop_assert_eq!(&got_shape, &want_shape);
            proptest::prop_assert_eq!(got, brute(&map, &shape, w));
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
