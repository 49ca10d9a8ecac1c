//! Transforms fused into the stitch, per-block finishing, and cancellation.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{engines, expected, open, region};
use zcrop_io::sync::Mutex;
use zcrop_zarr::{ReadOptions, StitchTransform, ZarrError};

/// uint16 -> float32 with a per-channel (axis 1) affine map; records each finished block's sum.
struct Normalize {
    axis: usize,
    mean: Vec<f32>,
    std: Vec<f32>,
    sums: Mutex<Vec<(usize, f64)>>,
}

impl StitchTransform for Normalize {
    fn output_element_size(&self) -> usize {
        4
    }
    fn axis(&self) -> Option<usize> {
        Some(self.axis)
    }
    fn convert(&self, src: &[u8], dst: &mut [u8], c: u64, _: usize) {
        let (m, s) = (self.mean[c as usize], self.std[c as usize]);
        for (i, o) in src.chunks_exact(2).zip(dst.chunks_exact_mut(4)) {
            let v = f32::from(u16::from_ne_bytes([i[0], i[1]]));
            o.copy_from_slice(&((v - m) / s).to_ne_bytes());
        }
    }
    fn finish_block(&self, request: usize, block: &mut [u8]) -> Result<(), String> {
        let sum: f64 = block
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
            .sum();
        self.sums.lock().push((request, sum));
        Ok(())
    }
}

fn normalized(raw: &[u8], crop: &[u64], axis: usize, t: &Normalize) -> Vec<f32> {
    let inner: u64 = crop[axis + 1..].iter().product();
    raw.chunks_exact(2)
        .enumerate()
        .map(|(i, b)| {
            let c = (i as u64 / inner) % crop[axis];
            (f32::from(u16::from_ne_bytes([b[0], b[1]])) - t.mean[c as usize]) / t.std[c as usize]
        })
        .collect()
}

#[test]
fn per_channel_normalisation_matches_the_oracle() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (large_crop, large_origins) = common::large_batch();
    for (backend, engine) in engines() {
        let a = open(&f, &engine);
        for axis in [1usize, 3] {
            let origins = [0u64, 0, 10, 20, 3, 0, 30, 39, 4, 0, 0, 0];
            check_normalised(&f, &a, axis, &[2, 3, 40, 50], &origins, backend);
            // Located and submitted in two steps (see `common::large_batch`).
            check_normalised(&f, &a, axis, &large_crop, &large_origins, backend);
        }
    }
}

/// Reads crops of `crop` at `origins` through [`Normalize`] and checks them, and each block's
/// sum, against the oracle.
fn check_normalised(
    f: &zcrop_fixtures::Fixture,
    a: &zcrop_zarr::Array,
    axis: usize,
    crop: &[u64],
    origins: &[u64],
    backend: &str,
) {
    let (data, shape, es) = expected(f);
    let n_ch = shape[axis] as usize;
    let t = Normalize {
        axis,
        mean: (0..n_ch).map(|c| 100.0 * c as f32).collect(),
        std: (0..n_ch).map(|c| 1.0 + c as f32).collect(),
        sums: Mutex::new(Vec::new()),
    };
    let crops = origins.len() / 4;
    let mut out = vec![0u8; crops * crop.iter().product::<u64>() as usize * 4];
    let opts = ReadOptions {
        transform: Some(&t),
        cancel: None,
    };
    a.read_batch_into_with(origins, crop, &mut out, opts)
        .unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut want = Vec::new();
    for o in origins.chunks_exact(4) {
        want.extend(normalized(
            &region(&data, &shape, es, o, crop),
            crop,
            axis,
            &t,
        ));
    }
    assert_eq!(got, want, "{backend}, channel axis {axis}, {crops} crops");
    // Every block finished exactly once, after all its elements were written.
    let mut sums = t.sums.into_inner();
    sums.sort_by_key(|s| s.0);
    assert_eq!(
        sums.iter().map(|s| s.0).collect::<Vec<_>>(),
        (0..crops).collect::<Vec<_>>()
    );
    let per_block = want.len() / crops;
    for (r, sum) in sums {
        let expect: f64 = want[r * per_block..(r + 1) * per_block]
            .iter()
            .map(|&v| f64::from(v))
            .sum();
        assert!(
            (sum - expect).abs() <= 1e-6 * expect.abs().max(1.0),
            "{backend}, {crops} crops, block {r}: {sum} vs {expect}"
        );
    }
}

/// A transform that cancels the read from inside its first conversion.
struct CancelOnFirst<'a> {
    flag: &'a AtomicBool,
    calls: AtomicUsize,
}

impl StitchTransform for CancelOnFirst<'_> {
    fn output_element_size(&self) -> usize {
        2
    }
    fn convert(&self, src: &[u8], dst: &mut [u8], _: u64, _: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.flag.store(true, Ordering::Release);
        dst.copy_from_slice(src);
    }
}

#[test]
fn cancellation_stops_a_read() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (_, engine) = engines().remove(0);
    let a = open(&f, &engine);
    let flag = AtomicBool::new(true);
    let mut out = vec![0u8; 6 * 3 * 70 * 90 * 2];
    let before = ReadOptions {
        transform: None,
        cancel: Some(&flag),
    };
    assert!(matches!(
        a.read_region_into_with(&[0, 0, 0, 0], &[6, 3, 70, 90], &mut out, before),
        Err(ZarrError::Cancelled)
    ));
    flag.store(false, Ordering::Release);
    let t = CancelOnFirst {
        flag: &flag,
        calls: AtomicUsize::new(0),
    };
    let during = ReadOptions {
        transform: Some(&t),
        cancel: Some(&flag),
    };
    let r = a.read_region_into_with(&[0, 0, 0, 0], &[6, 3, 70, 90], &mut out, during);
    assert!(matches!(r, Err(ZarrError::Cancelled)), "{r:?}");
    // The array still reads fine afterwards.
    flag.store(false, Ordering::Release);
    a.read_region_into(&[0, 0, 0, 0], &[6, 3, 70, 90], &mut out)
        .unwrap();
}

/// A failing per-block step fails the read with the block's index.
struct FailBlock;

impl StitchTransform for FailBlock {
    fn output_element_size(&self) -> usize {
        2
    }
    fn convert(&self, src: &[u8], dst: &mut [u8], _: u64, _: usize) {
        dst.copy_from_slice(src);
    }
    fn finish_block(&self, request: usize, _: &mut [u8]) -> Result<(), String> {
        if request == 1 {
            Err("bad block".into())
        } else {
            Ok(())
        }
    }
}

#[test]
fn a_failing_block_step_is_reported() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let (_, engine) = engines().remove(0);
    let a = open(&f, &engine);
    let mut out = vec![0u8; 2 * 8 * 2];
    let opts = ReadOptions {
        transform: Some(&FailBlock),
        cancel: None,
    };
    let r = a.read_batch_into_with(&[0, 0, 0, 0, 1, 1, 1, 1], &[1, 1, 2, 4], &mut out, opts);
    match r {
        Err(ZarrError::Transform { request: 1, reason }) => assert_eq!(reason, "bad block"),
        other => panic!("{other:?}"),
    }
}
