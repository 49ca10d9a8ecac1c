//! N-d FFTs of one crop held in memory, over chosen axes (rustfft), with numpy's
//! normalisation conventions. Used by the fused transform's per-crop step.

use std::sync::Arc;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftNum, FftPlanner};

/// How a forward transform is scaled, as in `numpy.fft` (`norm=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FftNorm {
    /// No scaling of the forward transform (numpy's default, `norm="backward"`).
    #[default]
    Backward,
    /// Scale by `1/sqrt(n)` (`norm="ortho"`).
    Ortho,
    /// Scale by `1/n` (`norm="forward"`).
    Forward,
}

impl FftNorm {
    /// The factor a forward transform of `n` points (product over the axes) is multiplied by.
    pub fn forward_scale(self, n: u64) -> f64 {
        match self {
            FftNorm::Backward => 1.0,
            FftNorm::Ortho => 1.0 / (n as f64).sqrt(),
            FftNorm::Forward => 1.0 / n as f64,
        }
    }
}

/// Forward FFT plans for the axes of one crop shape.
pub(crate) struct NdFft<T: FftNum> {
    shape: Vec<usize>,
    axes: Vec<(usize, Arc<dyn Fft<T>>)>,
    scale: T,
    scratch_len: usize,
}

impl<T: FftNum> NdFft<T> {
    /// Plans forward FFTs over `axes` (distinct, each `< shape.len()`) of arrays of `shape`.
    pub(crate) fn new(shape: &[u64], axes: &[usize], norm: FftNorm) -> Self {
        let shape: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
        let mut planner = FftPlanner::<T>::new();
        let axes: Vec<(usize, Arc<dyn Fft<T>>)> = axes
            .iter()
            .map(|&a| (a, planner.plan_fft_forward(shape[a])))
            .collect();
        let scratch_len = axes
            .iter()
            .map(|(_, f)| f.get_inplace_scratch_len())
            .max()
            .unwrap_or(0);
        let n: u64 = axes.iter().map(|&(a, _)| shape[a] as u64).product();
        let scale = T::from_f64(norm.forward_scale(n)).expect("a float scale");
        NdFft {
            shape,
            axes,
            scale,
            scratch_len,
        }
    }

    /// Transforms `data` (C order, the planned shape) in place.
    pub(crate) fn process(&self, data: &mut [Complex<T>]) {
        let total: usize = self.shape.iter().product();
        assert_eq!(data.len(), total, "buffer does not match the FFT shape");
        if total == 0 {
            return;
        }
        let mut scratch = vec![Complex::new(T::zero(), T::zero()); self.scratch_len];
        let mut tmp = Vec::new();
        for (axis, fft) in &self.axes {
            let n = self.shape[*axis];
            let inner: usize = self.shape[axis + 1..].iter().product();
            if inner == 1 {
                // Lines are contiguous: rustfft runs them back to back.
                fft.process_with_scratch(data, &mut scratch);
                continue;
            }
            // Transpose each (n, inner) slab to (inner, n), transform, transpose back.
            tmp.resize(n * inner, Complex::new(T::zero(), T::zero()));
            for slab in data.chunks_exact_mut(n * inner) {
                for k in 0..n {
                    for q in 0..inner {
                        tmp[q * n + k] = slab[k * inner + q];
                    }
                }
                fft.process_with_scratch(&mut tmp, &mut scratch);
                for k in 0..n {
                    for q in 0..inner {
                        slab[k * inner + q] = tmp[q * n + k];
                    }
                }
            }
        }
        if self.scale != T::one() {
            for v in data.iter_mut() {
                *v = *v * self.scale;
            }
        }
    }
}

/// The forward DFT of `data` (C order, `shape`) over `axes` by the O(n^2) definition, in f64:
/// the oracle of the tests.
#[cfg(test)]
pub(crate) fn naive_dft(
    data: &[Complex<f64>],
    shape: &[usize],
    axes: &[usize],
) -> Vec<Complex<f64>> {
    let mut cur = data.to_vec();
    for &a in axes {
        let n = shape[a];
        let inner: usize = shape[a + 1..].iter().product();
        let mut next = vec![Complex::new(0.0, 0.0); cur.len()];
        for (slab_in, slab_out) in cur
            .chunks_exact(n * inner)
            .zip(next.chunks_exact_mut(n * inner))
        {
            for q in 0..inner {
                for k in 0..n {
                    let mut acc = Complex::new(0.0, 0.0);
                    for j in 0..n {
                        let ang = -2.0 * std::f64::consts::PI * ((j * k) % n) as f64 / n as f64;
                        acc += slab_in[j * inner + q] * Complex::new(ang.cos(), ang.sin());
                    }
                    slab_out[k * inner + q] = acc;
                }
            }
        }
        cur = next;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_naive_dft_over_any_axes() {
        let shape = [3usize, 5, 4, 6];
        let n: usize = shape.iter().product();
        let data: Vec<Complex<f64>> = (0..n)
            .map(|i| Complex::new(((i * 37) % 101) as f64 - 50.0, ((i * 11) % 7) as f64))
            .collect();
        for axes in [
            vec![3],
            vec![0],
            vec![1, 2],
            vec![0, 3],
            vec![0, 1, 2, 3],
            vec![2, 1],
        ] {
            for norm in [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward] {
                let plan = NdFft::<f64>::new(&shape.map(|s| s as u64), &axes, norm);
                let mut got = data.clone();
                plan.process(&mut got);
                let scale = norm.forward_scale(axes.iter().map(|&a| shape[a] as u64).product());
                let want = naive_dft(&data, &shape, &axes);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (g - w * scale).norm() < 1e-9 * (1.0 + w.norm()),
                        "{axes:?} {norm:?}"
                    );
                }
            }
        }
    }
}
