//! Sampling semantics: reads equal numpy slicing, determinism across restarts, thread counts
//! and prefetch depths, epoch coverage, rank disjointness, masks and boxes.

mod common;

use std::collections::{BTreeMap, HashSet};

use common::{fixture, region, three_sources};
use zcrop_sampler::{
    Dim, Loader, LoaderConfig, Mask, Mode, PinOptions, SampleSpec, Sampler, SamplerError, Shard,
    Source,
};

/// Every source's bytes are the numpy slices at the plan's origins, and origins follow the
/// position through each source's offset, scale and jitter.
#[test]
fn batches_equal_numpy_slicing_for_every_source() {
    let (_, sat, sat_shape) = fixture("v3_workload_4d_u2");
    let (_, coarse, coarse_shape) = fixture("v3_hierarchy__images__raw");
    let (_, labels, labels_shape) = fixture("v3_hierarchy__images__labels");
    let sampler = Sampler::new(three_sources().seed(11).batch_size(5)).unwrap();
    assert_eq!(sampler.source(2).dtype, "float32");
    let mut jitters = HashSet::new();
    for step in 0..6 {
        let plan = sampler.plan(step, Shard::SINGLE).unwrap();
        let got = sampler.read(&plan).unwrap();
        for i in 0..plan.len() {
            let pos = plan.position(i);
            let a = &common::unsigned(plan.origin(0, i));
            assert_eq!(a, &[pos[0], 0, pos[1], pos[2]]);
            let b = &common::unsigned(plan.origin(1, i));
            assert_eq!(b[0], 1);
            let (jy, jx) = (
                b[1] as i64 - (pos[1] / 4 + 1) as i64,
                b[2] as i64 - (pos[2] / 4) as i64,
            );
            assert!(jy.abs() <= 1 && jx.abs() <= 2, "jitter {jy} {jx}");
            jitters.insert((jy, jx));
            let c = &common::unsigned(plan.origin(2, i));
            assert_eq!(c, &[pos[1] / 4, pos[2] / 4]);

            let want = region(&sat, &sat_shape, 2, a, &[2, 3, 16, 16]);
            let n = want.len();
            assert_eq!(
                &got[0][i * n..(i + 1) * n],
                &want[..],
                "sat, step {step} sample {i}"
            );
            let want = region(&coarse, &coarse_shape, 2, b, &[2, 5, 5]);
            let n = want.len();
            assert_eq!(
                &got[1][i * n..(i + 1) * n],
                &want[..],
                "coarse, step {step} sample {i}"
            );
            let want: Vec<u8> = region(&labels, &labels_shape, 4, c, &[4, 4])
                .chunks_exact(4)
                .flat_map(|b| (i32::from_ne_bytes(b.try_into().unwrap()) as f32).to_ne_bytes())
                .collect();
            let n = want.len();
            assert_eq!(
                &got[2][i * n..(i + 1) * n],
                &want[..],
                "labels, step {step} sample {i}"
            );
        }
    }
    // The jitter is really drawn (30 samples over 15 combinations).
    assert!(jitters.len() > 5, "{jitters:?}");
}

fn reference(seed: u64, steps: std::ops::Range<u64>, shard: Shard) -> BTreeMap<u64, Vec<Vec<u8>>> {
    // A fresh sampler, as a restarted job would build.
    let sampler = Sampler::new(three_sources().seed(seed).batch_size(4)).unwrap();
    steps
        .map(|s| (s, sampler.read(&sampler.plan(s, shard).unwrap()).unwrap()))
        .collect()
}

#[test]
fn the_same_seed_and_step_give_identical_bytes_across_restarts_threads_and_prefetch() {
    let want = reference(5, 0..10, Shard::SINGLE);
    let configs = [
        (Some(1), 1, 1, 0),
        (Some(3), 4, 2, 0),
        (None, 2, 3, 7),
        (Some(2), 8, 1, 9),
    ];
    for (threads, prefetch, workers, buffers) in configs {
        for start in [0u64, 3, 7] {
            // A new sampler and loader per run: a restart at `start`.
            let sampler = Sampler::new(three_sources().seed(5).batch_size(4)).unwrap();
            let config = LoaderConfig {
                start_step: start,
                end_step: Some(10),
                prefetch,
                workers,
                buffers,
                threads,
                pin: PinOptions::pageable(),
                ..LoaderConfig::default()
            };
            let loader = Loader::new(sampler, config).unwrap();
            let mut step = start;
            for batch in loader {
                let batch = batch.unwrap();
                assert_eq!(batch.step(), step);
                for (s, bytes) in want[&step].iter().enumerate() {
                    assert!(
                        batch.source(s) == bytes.as_slice(),
                        "threads {threads:?} prefetch {prefetch} workers {workers} start {start}: step {step} source {s} differs"
                    );
                }
                step += 1;
            }
            assert_eq!(step, 10);
        }
    }
    // Seeking back replays the same bytes.
    let sampler = Sampler::new(three_sources().seed(5).batch_size(4)).unwrap();
    let mut loader = Loader::new(sampler, LoaderConfig::default()).unwrap();
    for _ in 0..3 {
        drop(loader.next_batch().unwrap());
    }
    loader.seek(1);
    assert_eq!(loader.next_step(), 1);
    let b = loader.next_batch().unwrap();
    assert_eq!(b.step(), 1);
    assert_eq!(b.source(0), want[&1][0].as_slice());
}

#[test]
fn seeds_and_steps_change_the_samples() {
    let sampler = |seed| Sampler::new(three_sources().seed(seed).batch_size(8)).unwrap();
    let (a, b) = (sampler(1), sampler(2));
    let pa = a.plan(0, Shard::SINGLE).unwrap();
    assert_ne!(
        pa.positions(),
        b.plan(0, Shard::SINGLE).unwrap().positions()
    );
    assert_ne!(
        pa.positions(),
        a.plan(1, Shard::SINGLE).unwrap().positions()
    );
    assert_eq!(
        pa.positions(),
        sampler(1).plan(0, Shard::SINGLE).unwrap().positions()
    );
}

/// Ranks get disjoint global samples that together form the global batch, and a sample is the
/// same whatever the world size it is read under.
#[test]
fn ranks_are_disjoint_and_cover_the_global_batch() {
    for mode in [
        Mode::Uniform,
        Mode::Epoch {
            stride: vec![1, 8, 8],
        },
    ] {
        let per_rank =
            Sampler::new(three_sources().mode(mode.clone()).seed(3).batch_size(3)).unwrap();
        let whole =
            Sampler::new(three_sources().mode(mode.clone()).seed(3).batch_size(12)).unwrap();
        for step in [0u64, 1, 17] {
            let global = whole.plan(step, Shard::SINGLE).unwrap();
            let mut seen = HashSet::new();
            for rank in 0..4 {
                let plan = per_rank.plan(step, Shard::new(rank, 4)).unwrap();
                for i in 0..3 {
                    let g = plan.global_index(i);
                    assert!(seen.insert(g), "{mode:?}: global sample {g} on two ranks");
                    let j = rank as usize * 3 + i;
                    assert_eq!(g, global.global_index(j));
                    assert_eq!(plan.position(i), global.position(j));
                    for s in 0..3 {
                        assert_eq!(plan.origin(s, i), global.origin(s, j));
                    }
                }
            }
            assert_eq!(seen, (step * 12..step * 12 + 12).collect());
        }
    }
    let s = Sampler::new(three_sources()).unwrap();
    assert!(matches!(
        s.plan(0, Shard::new(2, 2)),
        Err(SamplerError::Spec { .. })
    ));
}

/// The lattice of allowed positions of a sampler, by brute force.
fn lattice(start: &[u64], end: &[u64], stride: &[u64], mask: Option<&Mask>) -> Vec<Vec<u64>> {
    let mut out = vec![vec![]];
    for d in 0..start.len() {
        out = out
            .into_iter()
            .flat_map(|p| {
                (start[d]..end[d])
                    .step_by(stride[d] as usize)
                    .map(move |v| {
                        let mut q = p.clone();
                        q.push(v);
                        q
                    })
            })
            .collect();
    }
    out.retain(|p| mask.is_none_or(|m| m.allows(p) == Some(true)));
    out
}

#[test]
fn epoch_mode_visits_each_grid_origin_exactly_once_per_epoch() {
    let mask = Mask::from_fn(vec![6, 5, 5], vec![1, 16, 20], |c| {
        (c[0] + c[1] * 2 + c[2]) % 3 != 0
    })
    .unwrap();
    for (stride, mask) in [
        (vec![1, 3, 5], None),
        (vec![2, 1, 1], None),
        (vec![1, 2, 3], Some(mask)),
    ] {
        let mut spec = three_sources()
            .mode(Mode::Epoch {
                stride: stride.clone(),
            })
            .seed(9)
            .batch_size(7);
        if let Some(m) = &mask {
            spec = spec.mask(m.clone());
        }
        let sampler = Sampler::new(spec).unwrap();
        let (start, end) = sampler.position_box();
        let mut want = lattice(&start, &end, &stride, mask.as_ref());
        want.sort();
        let n = sampler.epoch_len();
        assert_eq!(n, want.len() as u64);
        // Two ranks; enough steps for two whole epochs (batches straddle epoch ends).
        let global = 14u64;
        let steps = (2 * n).div_ceil(global) + 1;
        let mut by_epoch: BTreeMap<u64, Vec<Vec<u64>>> = BTreeMap::new();
        let mut first_order: BTreeMap<u64, Vec<Vec<u64>>> = BTreeMap::new();
        for step in 0..steps {
            for rank in 0..2 {
                let plan = sampler.plan(step, Shard::new(rank, 2)).unwrap();
                for i in 0..plan.len() {
                    let e = plan.epoch(i).unwrap();
                    assert_eq!(e, plan.global_index(i) / n);
                    by_epoch
                        .entry(e)
                        .or_default()
                        .push(plan.position(i).to_vec());
                    if plan.global_index(i) % n < 20 {
                        first_order
                            .entry(e)
                            .or_default()
                            .push(plan.position(i).to_vec());
                    }
                }
            }
        }
        for e in [0, 1] {
            let mut got = by_epoch.remove(&e).unwrap();
            got.sort();
            assert_eq!(
                got, want,
                "stride {stride:?}: epoch {e} is not every lattice point once"
            );
        }
        assert_ne!(
            first_order[&0], first_order[&1],
            "epochs 0 and 1 share an order"
        );
    }
}

#[test]
fn uniform_mode_respects_the_mask_and_the_box_and_is_uniform() {
    // Cells of 10 x 10 positions over (y, x); time unrestricted.
    let mask = Mask::from_fn(vec![1, 6, 9], vec![6, 10, 10], |c| c[1] == 2 || c[2] == 5).unwrap();
    let sampler = Sampler::new(
        three_sources()
            .mask(mask.clone())
            .region(vec![0, 5, 0], vec![6, 60, 75])
            .seed(1)
            .batch_size(1000),
    )
    .unwrap();
    let (start, end) = sampler.position_box();
    let allowed = lattice(&start, &end, &[1, 1, 1], Some(&mask));
    assert_eq!(sampler.epoch_len(), allowed.len() as u64);
    let mut counts: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for step in 0..40 {
        let plan = sampler.plan(step, Shard::SINGLE).unwrap();
        for i in 0..plan.len() {
            let p = plan.position(i);
            assert_eq!(mask.allows(p), Some(true), "{p:?} is masked out");
            assert!((0..3).all(|d| p[d] >= start[d] && p[d] < end[d]));
            assert!(p[1] >= 5 && p[1] < 60);
            *counts.entry((p[1] / 10, p[2] / 10)).or_default() += 1;
        }
    }
    // Each allowed cell gets samples in proportion to its allowed positions.
    let total: u64 = counts.values().sum();
    for ((cy, cx), n) in &counts {
        let cell_positions = allowed
            .iter()
            .filter(|p| p[1] / 10 == *cy && p[2] / 10 == *cx)
            .count();
        let expect = total as f64 * cell_positions as f64 / allowed.len() as f64;
        assert!(
            (*n as f64 - expect).abs() < 5.0 * expect.sqrt() + 5.0,
            "cell ({cy}, {cx}): {n} samples, expected about {expect}"
        );
    }
}

#[test]
fn a_million_origins_take_well_under_a_second() {
    for mode in [
        Mode::Uniform,
        Mode::Epoch {
            stride: vec![1, 1, 1],
        },
    ] {
        let sampler =
            Sampler::new(three_sources().mode(mode.clone()).batch_size(1_000_000)).unwrap();
        let t = std::time::Instant::now();
        let plan = sampler.plan(3, Shard::SINGLE).unwrap();
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(plan.len(), 1_000_000);
        eprintln!("{mode:?}: 1,000,000 samples (3 sources) planned in {secs:.3} s");
        // Unoptimised test builds are several times slower than release builds.
        let limit = if cfg!(debug_assertions) { 6.0 } else { 0.5 };
        assert!(secs < limit, "{mode:?}: {secs} s");
    }
}

#[test]
fn invalid_specs_are_rejected_with_reasons() {
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    let too_big =
        SampleSpec::new(["t", "y", "x"]).source(Source::new("a", sat.clone(), [2, 3, 80, 16]));
    assert!(matches!(
        Sampler::new(too_big),
        Err(SamplerError::Spec { .. })
    ));
    let unknown = SampleSpec::new(["t", "y", "x"]).source(
        Source::new("a", sat.clone(), [1, 1, 1, 1]).dims([
            Dim::along("q"),
            Dim::fixed(0),
            Dim::fixed(0),
            Dim::fixed(0),
        ]),
    );
    assert!(Sampler::new(unknown).is_err());
    let unconstrained =
        SampleSpec::new(["t", "y", "x", "z"]).source(Source::new("a", sat.clone(), [1, 1, 1, 1]));
    assert!(Sampler::new(unconstrained).is_err());
    let empty = SampleSpec::new(["t", "y", "x"])
        .source(Source::new("a", sat.clone(), [1, 1, 1, 1]))
        .region(vec![0, 0, 0], vec![6, 0, 90]);
    assert!(matches!(
        Sampler::new(empty),
        Err(SamplerError::EmptyRegion { .. })
    ));
    let jitter_too_big =
        SampleSpec::new(["t", "y", "x"]).source(Source::new("a", sat, [1, 1, 1, 1]).dims([
            Dim::along("t").jitter(3),
            Dim::fixed(0),
            Dim::along("y"),
            Dim::along("x"),
        ]));
    assert!(matches!(
        Sampler::new(jitter_too_big),
        Err(SamplerError::EmptyRegion { .. })
    ));
}

/// The bulk draw (in parallel parts) gives each global sample the position its batch plan
/// gives, across part boundaries, in uniform and epoch mode, with a mask.
#[test]
fn bulk_positions_equal_the_plans_positions() {
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    let mask = Mask::from_fn(vec![6, 14, 18], vec![1, 5, 5], |c| {
        (c[0] + c[1] * 3 + c[2]) % 4 != 0
    })
    .unwrap();
    for mode in [
        Mode::Uniform,
        Mode::Epoch {
            stride: vec![1, 3, 2],
        },
    ] {
        let spec = SampleSpec::new(["t", "y", "x"])
            .source(Source::new("s", sat.clone(), [1, 3, 8, 8]))
            .mask(mask.clone())
            .mode(mode)
            .seed(17);
        let sampler = Sampler::new(spec).unwrap();
        let (first, n) = (1000u64, 40_000u64);
        let bulk = sampler.sample_positions(first, n).unwrap();
        for i in (0..n).step_by(997).chain([16_383, 16_384, 32_768, n - 1]) {
            let plan = sampler.plan(first + i, Shard::SINGLE).unwrap();
            assert_eq!(
                &bulk[i as usize * 3..][..3],
                plan.position(0),
                "sample {}",
                first + i
            );
        }
    }
}
