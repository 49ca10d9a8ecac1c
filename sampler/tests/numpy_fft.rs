//! zcrop's FFTs against numpy.fft: the out-of-core FFT of a whole array along a chunked axis,
//! and the sampler's per-crop spectral stage. The expected arrays were written by
//! `fixtures/fft_expected.py` (numpy 2.3.5); see `fixtures/README.md`.

use rustfft::num_complex::Complex;
use zcrop_fixtures::Npy;
use zcrop_sampler::{
    ChunkedFftOptions, ComplexType, Dim, FftNorm, FftStrategy, SampleSpec, Sampler, Shard, Source,
    Spectrum, Transform, fft_along_axis,
};
use zcrop_zarr::Array;

fn c128(bytes: &[u8]) -> Vec<Complex<f64>> {
    bytes
        .chunks_exact(16)
        .map(|b| {
            Complex::new(
                f64::from_ne_bytes(b[..8].try_into().unwrap()),
                f64::from_ne_bytes(b[8..].try_into().unwrap()),
            )
        })
        .collect()
}

fn expected(name: &str) -> (Vec<Complex<f64>>, Vec<u64>) {
    let npy = Npy::load(&zcrop_fixtures::root().join("fft").join(name)).unwrap();
    assert_eq!(npy.item_size().unwrap(), 16, "{name} is complex128");
    (c128(&npy.native_c_order().unwrap()), npy.shape.clone())
}

fn assert_close(got: &[Complex<f64>], want: &[Complex<f64>], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().map(|v| v.norm()).fold(1.0, f64::max);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).norm() <= rel * scale,
            "{what}: element {i}: {g} vs numpy {w}"
        );
    }
}

#[test]
fn out_of_core_fft_matches_numpy() {
    let input = zcrop_fixtures::root().join("fft/signal.zarr");
    let (want, shape) = expected("fft_axis1.npy");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fft.zarr");
    let mut opts = ChunkedFftOptions::new(1, 1 << 20);
    opts.output = ComplexType::Complex128;
    let report = fft_along_axis(&input, &out, &opts).unwrap();
    assert_eq!(report.strategy, FftStrategy::InMemory);
    let a = Array::open(&out).unwrap();
    assert_eq!(a.shape(), shape.as_slice());
    assert_eq!(a.data_type(), "complex128");
    assert_eq!(
        a.dimension_names(),
        Some(vec![Some("t".into()), Some("x".into()), Some("c".into())])
    );
    let got = c128(&a.read_region(&[0, 0, 0], &shape).unwrap());
    assert_close(&got, &want, 1e-12, "complex128");

    // complex64 output: the same within single precision.
    let out = dir.path().join("fft64.zarr");
    let report = fft_along_axis(&input, &out, &ChunkedFftOptions::new(1, 1 << 20)).unwrap();
    assert_eq!(report.passes, 1);
    let bytes = Array::open(&out)
        .unwrap()
        .read_region(&[0, 0, 0], &shape)
        .unwrap();
    let got: Vec<Complex<f64>> = bytes
        .chunks_exact(8)
        .map(|b| {
            Complex::new(
                f64::from(f32::from_ne_bytes(b[..4].try_into().unwrap())),
                f64::from(f32::from_ne_bytes(b[4..].try_into().unwrap())),
            )
        })
        .collect();
    assert_close(&got, &want, 1e-6, "complex64");
}

#[test]
fn the_samplers_spectral_stage_matches_numpy() {
    let (want, shape) = expected("crop_fftn.npy");
    assert_eq!(shape, vec![2, 16, 2]);
    let array = Array::open(zcrop_fixtures::root().join("fft/signal.zarr")).unwrap();
    // The only position is x = 5, so every sample is the crop numpy transformed.
    let spec = |t: Transform| {
        SampleSpec::new(["x"])
            .source(
                Source::new("signal", array.clone(), [2, 16, 2])
                    .dims([Dim::fixed(0), Dim::along("x"), Dim::fixed(0)])
                    .transform(t),
            )
            .region(vec![5], vec![6])
            .batch_size(3)
    };
    let complex = Transform::to_f64()
        .fft(vec![1, 2], Spectrum::Complex)
        .fft_norm(FftNorm::Ortho);
    let sampler = Sampler::new(spec(complex)).unwrap();
    assert_eq!(sampler.source(0).dtype, "complex128");
    let plan = sampler.plan(7, Shard::SINGLE).unwrap();
    assert_eq!(plan.origin(0, 2), &[0, 5, 0]);
    let batch = sampler.read(&plan).unwrap();
    let got = c128(&batch[0]);
    for i in 0..3 {
        assert_close(&got[i * 64..(i + 1) * 64], &want, 1e-12, "complex128 crop");
    }

    let power = Transform::to_f32()
        .fft(vec![1, 2], Spectrum::Power)
        .fft_norm(FftNorm::Ortho);
    let sampler = Sampler::new(spec(power)).unwrap();
    assert_eq!(sampler.source(0).dtype, "float32");
    let batch = sampler
        .read(&sampler.plan(0, Shard::SINGLE).unwrap())
        .unwrap();
    let got: Vec<Complex<f64>> = batch[0][..64 * 4]
        .chunks_exact(4)
        .map(|b| Complex::new(f64::from(f32::from_ne_bytes(b.try_into().unwrap())), 0.0))
        .collect();
    let want_power: Vec<Complex<f64>> = want
        .iter()
        .map(|v| Complex::new(v.norm_sqr(), 0.0))
        .collect();
    assert_close(&got, &want_power, 1e-5, "float32 power spectrum");
}
