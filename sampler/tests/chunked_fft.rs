//! The out-of-core FFT against an O(n^2) f64 DFT, through every strategy (in memory, four-step
//! with and without the transpose pass), axes, dtypes, edge chunks and normalisations.

mod common;

use std::path::Path;

use common::write_v3;
use rustfft::num_complex::Complex;
use zcrop_sampler::fft::MIN_BUDGET;
use zcrop_sampler::{
    ChunkedFftOptions, ComplexType, FftError, FftNorm, FftStrategy, fft_along_axis,
};
use zcrop_zarr::Array;

fn values(n: usize, seed: u64) -> Vec<f64> {
    (0..n as u64)
        .map(|i| {
            let mut x = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x ^= x >> 32;
            (x % 2000) as f64 - 1000.0
        })
        .collect()
}

fn encode(dtype: &str, v: &[f64]) -> Vec<u8> {
    match dtype {
        "float32" => v.iter().flat_map(|&x| (x as f32).to_ne_bytes()).collect(),
        "float64" => v.iter().flat_map(|&x| x.to_ne_bytes()).collect(),
        "int16" => v.iter().flat_map(|&x| (x as i16).to_ne_bytes()).collect(),
        "uint16" => v
            .iter()
            .flat_map(|&x| ((x + 1000.0) as u16).to_ne_bytes())
            .collect(),
        other => panic!("{other}"),
    }
}

fn decoded(dtype: &str, v: &[f64]) -> Vec<f64> {
    match dtype {
        "float32" => v.iter().map(|&x| f64::from(x as f32)).collect(),
        "uint16" => v.iter().map(|&x| x + 1000.0).collect(),
        _ => v.to_vec(),
    }
}

/// The DFT of `data` (C order, `shape`) along `axis`, by definition.
fn naive(data: &[f64], shape: &[usize], axis: usize) -> Vec<Complex<f64>> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out = vec![Complex::new(0.0, 0.0); data.len()];
    let tw: Vec<Complex<f64>> = (0..n)
        .map(|k| {
            let a = -2.0 * std::f64::consts::PI * k as f64 / n as f64;
            Complex::new(a.cos(), a.sin())
        })
        .collect();
    for o in 0..outer {
        for q in 0..inner {
            let base = o * n * inner + q;
            for k in 0..n {
                let mut acc = Complex::new(0.0, 0.0);
                for j in 0..n {
                    acc += tw[(j * k) % n] * data[base + j * inner];
                }
                out[base + k * inner] = acc;
            }
        }
    }
    out
}

/// The same through rustfft over whole lines in memory (an independent path), for lengths the
/// O(n^2) definition would take too long on.
fn planned(data: &[f64], shape: &[usize], axis: usize) -> Vec<Complex<f64>> {
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let fft = rustfft::FftPlanner::<f64>::new().plan_fft_forward(n);
    let mut out = vec![Complex::new(0.0, 0.0); data.len()];
    let mut line = vec![Complex::new(0.0, 0.0); n];
    for o in 0..outer {
        for q in 0..inner {
            let base = o * n * inner + q;
            for (j, v) in line.iter_mut().enumerate() {
                *v = Complex::new(data[base + j * inner], 0.0);
            }
            fft.process(&mut line);
            for (k, v) in line.iter().enumerate() {
                out[base + k * inner] = *v;
            }
        }
    }
    out
}

fn read_complex(path: &Path) -> (Vec<Complex<f64>>, String, Vec<u64>) {
    let a = Array::open(path).unwrap();
    let shape = a.shape().to_vec();
    let bytes = a.read_region(&vec![0; shape.len()], &shape).unwrap();
    let v = match a.data_type().as_str() {
        "complex64" => bytes
            .chunks_exact(8)
            .map(|b| {
                Complex::new(
                    f64::from(f32::from_ne_bytes(b[..4].try_into().unwrap())),
                    f64::from(f32::from_ne_bytes(b[4..].try_into().unwrap())),
                )
            })
            .collect(),
        "complex128" => bytes
            .chunks_exact(16)
            .map(|b| {
                Complex::new(
                    f64::from_ne_bytes(b[..8].try_into().unwrap()),
                    f64::from_ne_bytes(b[8..].try_into().unwrap()),
                )
            })
            .collect(),
        other => panic!("{other}"),
    };
    (v, a.data_type(), shape)
}

struct Case {
    shape: Vec<u64>,
    chunks: Vec<u64>,
    dtype: &'static str,
    axis: usize,
    budget: usize,
    output: ComplexType,
    norm: FftNorm,
}

fn run(c: &Case) -> FftStrategy {
    let dir = tempfile::tempdir().unwrap();
    let n: u64 = c.shape.iter().product();
    let raw = values(n as usize, c.shape.iter().sum());
    let names = ["a", "b", "c", "d"];
    write_v3(
        dir.path(),
        "/in",
        &c.shape,
        &c.chunks,
        c.dtype,
        &encode(c.dtype, &raw),
        Some(&names[..c.shape.len()]),
        serde_json::Map::new(),
    );
    let out = dir.path().join("out.zarr");
    let mut opts = ChunkedFftOptions::new(c.axis, c.budget);
    opts.output = c.output;
    opts.norm = c.norm;
    opts.temp_dir = Some(dir.path().to_path_buf());
    let report = fft_along_axis(dir.path().join("in"), &out, &opts).unwrap();
    let (got, dtype, shape) = read_complex(&out);
    assert_eq!(shape, c.shape);
    assert_eq!(
        dtype,
        if c.output == ComplexType::Complex64 {
            "complex64"
        } else {
            "complex128"
        }
    );
    let dims: Vec<usize> = c.shape.iter().map(|&s| s as usize).collect();
    let scale = c.norm.forward_scale(c.shape[c.axis]);
    let reference = if c.shape[c.axis] > 10_000 {
        planned
    } else {
        naive
    };
    let want: Vec<Complex<f64>> = reference(&decoded(c.dtype, &raw), &dims, c.axis)
        .into_iter()
        .map(|v| v * scale)
        .collect();
    let max = want.iter().map(|v| v.norm()).fold(0.0, f64::max);
    let tol = if c.output == ComplexType::Complex64 {
        2e-6
    } else {
        1e-11
    } * max.max(1.0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).norm() <= tol,
            "{report:?}, element {i}: {g} vs {w} (tolerance {tol})"
        );
    }
    // The temporary store is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        left.iter().all(|n| !n.starts_with("zcrop-fft-")),
        "{left:?}"
    );
    // The output records what it is.
    let attrs = Array::open(&out).unwrap().attributes().clone();
    assert_eq!(attrs["zcrop_fft"]["axis"], c.axis);
    report.strategy
}

#[test]
fn in_memory_lines_match_the_dft() {
    for (shape, chunks, axis, dtype) in [
        (vec![37u64], vec![8u64], 0usize, "float32"),
        (vec![6, 50, 5], vec![4, 7, 3], 1, "uint16"),
        (vec![6, 50, 5], vec![4, 7, 3], 0, "int16"),
        (vec![3, 4, 60], vec![2, 3, 16], 2, "float64"),
    ] {
        for norm in [FftNorm::Backward, FftNorm::Ortho, FftNorm::Forward] {
            let s = run(&Case {
                shape: shape.clone(),
                chunks: chunks.clone(),
                dtype,
                axis,
                budget: 8 << 20,
                output: ComplexType::Complex128,
                norm,
            });
            assert_eq!(s, FftStrategy::InMemory);
        }
    }
}

/// Budgets too small for whole lines force the four-step algorithm, with output chunks written
/// straight from the row pass or through the transpose pass.
#[test]
fn four_step_matches_the_dft() {
    let mut seen = (false, false);
    let (c64, c128) = (ComplexType::Complex64, ComplexType::Complex128);
    for (shape, chunks, axis, output) in [
        // 1-d, N = 6000 = 2^4 * 3 * 5^3, chunks of 250.
        (vec![6000u64], vec![250u64], 0usize, c64),
        (vec![6000], vec![250], 0, c128),
        // Lines along a middle axis, tiles over the others, edge chunks everywhere.
        (vec![3, 4096, 5], vec![2, 100, 3], 1, c64),
        // A long line.
        (vec![16_384], vec![1024], 0, c128),
        // The first axis, N = 2 * 3 * 7 * 11 * 13 with unaligned chunks.
        (vec![6006, 3], vec![64, 2], 0, c64),
        (vec![6006, 3], vec![64, 2], 0, c128),
    ] {
        {
            let s = run(&Case {
                shape: shape.clone(),
                chunks: chunks.clone(),
                dtype: "float32",
                axis,
                budget: MIN_BUDGET,
                output,
                norm: FftNorm::Ortho,
            });
            match s {
                FftStrategy::FourStep {
                    n1,
                    n2,
                    transpose_pass,
                } => {
                    assert_eq!(n1 * n2, shape[axis]);
                    if transpose_pass {
                        seen.1 = true;
                    } else {
                        seen.0 = true;
                    }
                }
                FftStrategy::InMemory => {
                    panic!("{shape:?} along {axis} did not need the four-step")
                }
            }
        }
    }
    assert!(
        seen.0 && seen.1,
        "both four-step variants must be exercised: {seen:?}"
    );
}

#[test]
fn bad_arguments_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write_v3(
        dir.path(),
        "/in",
        &[10],
        &[5],
        "float32",
        &[0u8; 40],
        None,
        serde_json::Map::new(),
    );
    let input = dir.path().join("in");
    let out = dir.path().join("out");
    let small = ChunkedFftOptions::new(0, 1000);
    assert!(matches!(
        fft_along_axis(&input, &out, &small),
        Err(FftError::BudgetTooSmall { .. })
    ));
    let axis = ChunkedFftOptions::new(1, 1 << 20);
    assert!(matches!(
        fft_along_axis(&input, &out, &axis),
        Err(FftError::InvalidArgument(_))
    ));
    // An existing output is never overwritten.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep"), b"x").unwrap();
    let ok = ChunkedFftOptions::new(0, 1 << 20);
    assert!(matches!(
        fft_along_axis(&input, &out, &ok),
        Err(FftError::InvalidArgument(_))
    ));
    assert!(matches!(
        fft_along_axis(dir.path().join("missing"), dir.path().join("o2"), &ok),
        Err(FftError::Read { .. })
    ));
    // A prime length too long for whole lines has no four-step factorisation.
    let dir2 = tempfile::tempdir().unwrap();
    let n = 100_003u64;
    write_v3(
        dir2.path(),
        "/p",
        &[n],
        &[4096],
        "float32",
        &vec![0u8; n as usize * 4],
        None,
        serde_json::Map::new(),
    );
    let r = fft_along_axis(
        dir2.path().join("p"),
        dir2.path().join("o"),
        &ChunkedFftOptions::new(0, 1 << 20),
    );
    assert!(
        matches!(r, Err(FftError::NoFactorization { n: 100_003, .. })),
        "{r:?}"
    );
}
