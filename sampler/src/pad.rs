//! Edge padding: crops that pass either end of a padded dimension.
//!
//! Such a crop is read at the nearest origin inside the array, shifted by a whole number of
//! its steps, so the elements it shares with the wanted crop are the same array elements. After
//! the batch read, the crop is rearranged in place: the shared elements move to where they
//! belong and the rest becomes the fill value. Padded crops therefore cost no extra read
//! submission, and crops that stay inside take the normal path untouched.

use crate::transform::InType;

/// How one dimension of a crop that passes an end of the array is read and placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clip {
    /// The origin the crop is read at (inside the array).
    pub(crate) read_origin: u64,
    /// Element `k` of the wanted crop is element `k - shift` of the crop that was read.
    shift: i64,
    /// The wanted crop's elements `k0..k1` lie inside the array; the others are filled.
    k0: u64,
    k1: u64,
}

impl Clip {
    /// A dimension of `n` elements that stays inside: placed as read.
    pub(crate) fn inside(n: u64) -> Clip {
        Clip {
            read_origin: 0,
            shift: 0,
            k0: 0,
            k1: n,
        }
    }

    /// The clip of a crop of `n` elements `every` apart from `origin` along a dimension of
    /// `size`; `None` if the crop stays inside. The caller guarantees
    /// `(n - 1) * every + every <= size`, so a shifted crop always fits.
    pub(crate) fn of(origin: i64, n: u64, every: u64, size: u64) -> Option<Clip> {
        let (o, n, e, size) = (
            i128::from(origin),
            i128::from(n),
            i128::from(every),
            i128::from(size),
        );
        let span = (n - 1) * e + 1;
        if o >= 0 && o + span <= size {
            return None;
        }
        // The first element at or after index 0, and the first past index size - 1.
        let first_in = -(o.div_euclid(e));
        let end_in = (size - 1 - o).div_euclid(e) + 1;
        let shift = if o < 0 { first_in } else { end_in - n };
        let read = o + shift * e;
        debug_assert!(
            read >= 0 && read + span <= size,
            "{origin} {n} {every} {size}"
        );
        Some(Clip {
            read_origin: read as u64,
            shift: shift as i64,
            k0: first_in.clamp(0, n) as u64,
            k1: end_in.clamp(0, n) as u64,
        })
    }
}

/// Rearranges `dest`, one crop of `crop` (`es`-byte elements) read at the clips' read origins,
/// into the wanted crop: elements inside the array move by the clips' shifts, the others
/// become `fill` (one element's bytes).
pub(crate) fn place_inside(dest: &mut [u8], crop: &[u64], es: usize, clips: &[Clip], fill: &[u8]) {
    let read = dest.to_vec();
    for e in dest.chunks_exact_mut(es) {
        e.copy_from_slice(fill);
    }
    if clips.iter().any(|c| c.k0 >= c.k1) {
        return;
    }
    let nd = crop.len();
    let mut strides = vec![es; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * crop[d + 1] as usize;
    }
    let inner: Vec<u64> = clips.iter().map(|c| c.k1 - c.k0).collect();
    let run = inner[nd - 1] as usize * es;
    let rows: u64 = inner[..nd - 1].iter().product();
    let mut idx = vec![0u64; nd - 1];
    for r in 0..rows {
        crate::space::unravel(r, &inner[..nd - 1], &mut idx);
        let (mut to, mut from) = (0usize, 0usize);
        for (d, c) in clips.iter().enumerate() {
            let k = c.k0 + idx.get(d).copied().unwrap_or(0);
            to += k as usize * strides[d];
            // k0..k1 lie inside the crop that was read (see `Clip::of`), so k - shift >= 0.
            from += (k as i64 - c.shift) as usize * strides[d];
        }
        dest[to..to + run].copy_from_slice(&read[from..from + run]);
    }
}

/// `value` as one element of `dtype` (native-endian bytes), or why it cannot be one.
pub(crate) fn element_bytes(dtype: &str, value: f64) -> Result<Vec<u8>, String> {
    let ty = match dtype {
        "bfloat16" => return Ok(half::bf16::from_f64(value).to_ne_bytes().to_vec()),
        other => InType::from_name(other).ok_or_else(|| format!("no fill for {dtype} data"))?,
    };
    let int = |lo: f64, hi: f64| -> Result<i128, String> {
        if value.fract() == 0.0 && value >= lo && value <= hi {
            Ok(value as i128)
        } else {
            Err(format!("fill value {value} is not a {dtype} value"))
        }
    };
    Ok(match ty {
        InType::Bool => vec![u8::from(int(0.0, 1.0)? == 1)],
        InType::U8 => vec![int(0.0, 255.0)? as u8],
        InType::I8 => (int(-128.0, 127.0)? as i8).to_ne_bytes().to_vec(),
        InType::U16 => (int(0.0, 65535.0)? as u16).to_ne_bytes().to_vec(),
        InType::I16 => (int(-32768.0, 32767.0)? as i16).to_ne_bytes().to_vec(),
        InType::U32 => (int(0.0, f64::from(u32::MAX))? as u32)
            .to_ne_bytes()
            .to_vec(),
        InType::I32 => (int(f64::from(i32::MIN), f64::from(i32::MAX))? as i32)
            .to_ne_bytes()
            .to_vec(),
        // Integers up to 2^53 are exact in an f64; larger fills are not asked for by value.
        InType::U64 => (int(0.0, 9.007_199_254_740_992e15)? as u64)
            .to_ne_bytes()
            .to_vec(),
        InType::I64 => (int(-9.007_199_254_740_992e15, 9.007_199_254_740_992e15)? as i64)
            .to_ne_bytes()
            .to_vec(),
        InType::F16 => half::f16::from_f64(value).to_ne_bytes().to_vec(),
        InType::F32 => (value as f32).to_ne_bytes().to_vec(),
        InType::F64 => value.to_ne_bytes().to_vec(),
        InType::C64 => [(value as f32).to_ne_bytes(), 0f32.to_ne_bytes()].concat(),
        InType::C128 => [value.to_ne_bytes(), 0f64.to_ne_bytes()].concat(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wanted crop built element by element: index `o + k * e`, filled outside.
    fn naive(o: i64, n: u64, e: u64, size: u64) -> Vec<i64> {
        (0..n as i64)
            .map(|k| o + k * e as i64)
            .map(|i| if (0..size as i64).contains(&i) { i } else { -1 })
            .collect()
    }

    #[test]
    fn clips_match_an_element_by_element_crop() {
        for size in 1..12u64 {
            for e in 1..4u64 {
                for n in 1..=size {
                    if (n - 1) * e + e > size {
                        continue;
                    }
                    for o in -(3 * size as i64)..(3 * size as i64) {
                        let want = naive(o, n, e, size);
                        let Some(c) = Clip::of(o, n, e, size) else {
                            assert!(want.iter().all(|&i| i >= 0), "{o} {n} {e} {size}");
                            continue;
                        };
                        assert!(c.read_origin + (n - 1) * e < size);
                        // The crop that was read holds array indices read_origin + j * e.
                        let read: Vec<i64> =
                            (0..n).map(|j| (c.read_origin + j * e) as i64).collect();
                        let mut dest: Vec<u8> = read
                            .iter()
                            .flat_map(|&i| (i as i16).to_ne_bytes())
                            .collect();
                        place_inside(&mut dest, &[n], 2, &[c], &(-1i16).to_ne_bytes());
                        let got: Vec<i64> = dest
                            .chunks_exact(2)
                            .map(|b| i64::from(i16::from_ne_bytes([b[0], b[1]])))
                            .collect();
                        assert_eq!(got, want, "origin {o} n {n} every {e} size {size}");
                    }
                }
            }
        }
    }

    #[test]
    fn crops_padded_along_several_dimensions_fill_the_outside() {
        // A 3x4 array of its linear indices; a 2x3 crop at (-1, 2) passes the top and right.
        let (rows, cols) = (3u64, 4u64);
        let clips = [
            Clip::of(-1, 2, 1, rows).expect("passes the top"),
            Clip::of(2, 3, 1, cols).expect("passes the right end"),
        ];
        let read: Vec<u8> = (0..2u64)
            .flat_map(|r| (0..3u64).map(move |c| (r, c)))
            .map(|(r, c)| ((clips[0].read_origin + r) * cols + clips[1].read_origin + c) as u8)
            .collect();
        let mut dest = read;
        place_inside(&mut dest, &[2, 3], 1, &clips, &[99]);
        assert_eq!(dest, vec![99, 99, 99, 2, 3, 99]);
    }

    #[test]
    fn fill_values_must_fit_the_type() {
        assert_eq!(element_bytes("uint8", 7.0).unwrap(), vec![7]);
        assert!(element_bytes("uint8", 256.0).is_err());
        assert!(element_bytes("int16", f64::NAN).is_err());
        assert!(element_bytes("int16", 1.5).is_err());
        assert_eq!(
            element_bytes("float32", f64::NAN).unwrap().len(),
            4,
            "NaN is a float fill"
        );
        assert_eq!(
            element_bytes("bfloat16", 1.0).unwrap(),
            half::bf16::ONE.to_ne_bytes()
        );
        assert_eq!(element_bytes("complex64", 2.0).unwrap().len(), 8);
    }
}
