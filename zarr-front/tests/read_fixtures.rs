//! Every fixture, read through zcrop-zarr, equals what zarr-python wrote (its `.npy`), read
//! whole and by random regions, batches of crops and point selections, through both IO backends.

mod common;

use common::{assert_same, engines, expected, gather, open, read_many_outputs, region};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use zcrop_zarr::DimSelection;

#[test]
fn every_fixture_reads_whole() {
    for (backend, engine) in engines() {
        for f in zcrop_fixtures::manifest() {
            let a = open(&f, &engine);
            let (want, shape, es) = expected(&f);
            assert_eq!(a.shape(), &shape[..], "{}", f.name);
            assert_eq!(a.element_size(), es, "{}", f.name);
            assert_eq!(a.numpy_dtype(), f.dtype, "{}: numpy dtype", f.name);
            let origin = vec![0; shape.len()];
            let got = a
                .read_region(&origin, &shape)
                .unwrap_or_else(|e| panic!("{backend} {}: {e}", f.name));
            assert_same(&got, &want, es, &format!("{backend} {}", f.name));
        }
    }
}

/// A random region inside `shape`.
fn arb_region(shape: &[u64]) -> impl Strategy<Value = (Vec<u64>, Vec<u64>)> {
    let dims: Vec<_> = shape
        .iter()
        .map(|&s| (0..s).prop_flat_map(move |o| (Just(o), 1..=s - o)))
        .collect();
    dims.prop_map(|d| d.into_iter().unzip())
}

#[test]
fn random_regions_equal_numpy_slicing() {
    for (backend, engine) in engines() {
        for f in zcrop_fixtures::manifest() {
            if f.shape.contains(&0) {
                continue;
            }
            let a = open(&f, &engine);
            let (data, shape, es) = expected(&f);
            let mut runner = TestRunner::new(Config {
                cases: 24,
                failure_persistence: None,
                ..Config::default()
            });
            runner
                .run(&arb_region(&shape), |(origin, rshape)| {
                    let got = a
                        .read_region(&origin, &rshape)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let want = region(&data, &shape, es, &origin, &rshape);
                    prop_assert!(
                        got == want,
                        "{backend} {}: region {origin:?} + {rshape:?} differs",
                        f.name
                    );
                    Ok(())
                })
                .unwrap();
        }
    }
}

#[test]
fn random_crop_batches_equal_numpy_slicing() {
    for (backend, engine) in engines() {
        for f in zcrop_fixtures::manifest() {
            if f.shape.is_empty() {
                continue;
            }
            let a = open(&f, &engine);
            let (data, shape, es) = expected(&f);
            let crop_strategy = shape
                .iter()
                .map(|&s| 1..=s)
                .collect::<Vec<_>>()
                .prop_flat_map(move |crop: Vec<u64>| {
                    let origin = crop
                        .iter()
                        .zip(shape.clone())
                        .map(|(&c, s)| 0..=s - c)
                        .collect::<Vec<_>>();
                    (Just(crop), proptest::collection::vec(origin, 1..6))
                });
            let mut runner = TestRunner::new(Config {
                cases: 12,
                failure_persistence: None,
                ..Config::default()
            });
            let (shape, data) = (a.shape().to_vec(), data.clone());
            runner
                .run(&crop_strategy, |(crop, origins)| {
                    let flat: Vec<u64> = origins.iter().flatten().copied().collect();
                    let got = a
                        .read_batch(&flat, &crop)
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let want: Vec<u8> = origins
                        .iter()
                        .flat_map(|o| region(&data, &shape, es, o, &crop))
                        .collect();
                    prop_assert!(
                        got == want,
                        "{backend} {}: batch of {} crops {crop:?} differs",
                        f.name,
                        origins.len()
                    );
                    prop_assert_eq!(
                        got.len(),
                        origins.len() * crop.iter().product::<u64>() as usize * es
                    );
                    Ok(())
                })
                .unwrap();
        }
    }
}

#[test]
fn point_selections_equal_numpy_indexing() {
    let (_, engine) = engines().remove(0);
    for f in zcrop_fixtures::manifest() {
        if f.shape.is_empty() || f.shape.contains(&0) {
            continue;
        }
        let a = open(&f, &engine);
        let (data, shape, es) = expected(&f);
        let sel_strategy = shape
            .iter()
            .map(|&s| {
                prop_oneof![
                    (0..s)
                        .prop_flat_map(move |o| (Just(o), 0..=s - o))
                        .prop_map(|(start, len)| DimSelection::Range { start, len }),
                    proptest::collection::vec(0..s, 0..5).prop_map(DimSelection::Points),
                ]
            })
            .collect::<Vec<_>>();
        let mut runner = TestRunner::new(Config {
            cases: 16,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&sel_strategy, |sel| {
                let index: Vec<Vec<u64>> = sel
                    .iter()
                    .map(|s| match s {
                        DimSelection::Range { start, len } => (*start..start + len).collect(),
                        DimSelection::Points(p) => p.clone(),
                    })
                    .collect();
                let want = gather(&data, &shape, es, &index);
                let mut got = vec![0u8; want.len()];
                a.read_selection_into(&sel, &mut got)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(got == want, "{}: selection {sel:?} differs", f.name);
                Ok(())
            })
            .unwrap();
    }
}

/// For fixture `k` of shape `shape`: two deterministic regions (selections) inside it.
fn two_regions(shape: &[u64], k: usize) -> Vec<(Vec<u64>, Vec<u64>)> {
    (0..2u64)
        .map(|j| {
            let rshape: Vec<u64> = shape.iter().map(|&s| s.div_ceil(2 + j)).collect();
            let origin = shape
                .iter()
                .zip(&rshape)
                .enumerate()
                .map(|(d, (s, r))| (s - r) * ((k as u64 + d as u64 + j) % 3) / 2)
                .collect();
            (origin, rshape)
        })
        .collect()
}

#[test]
fn read_many_equals_each_array_read_alone() {
    for (backend, engine) in engines() {
        let fixtures: Vec<_> = zcrop_fixtures::manifest()
            .into_iter()
            .filter(|f| !f.shape.contains(&0) && !f.shape.is_empty())
            .collect();
        let arrays: Vec<_> = fixtures.iter().map(|f| open(f, &engine)).collect();
        let selections: Vec<Vec<Vec<DimSelection>>> = arrays
            .iter()
            .enumerate()
            .map(|(k, a)| {
                two_regions(a.shape(), k)
                    .into_iter()
                    .map(|(o, r)| {
                        o.iter()
                            .zip(&r)
                            .map(|(&start, &len)| DimSelection::Range { start, len })
                            .collect()
                    })
                    .collect()
            })
            .collect();
        let outs =
            read_many_outputs(&arrays, &selections).unwrap_or_else(|e| panic!("{backend}: {e}"));
        for (k, (f, out)) in fixtures.iter().zip(&outs).enumerate() {
            let (data, shape, es) = expected(f);
            let want: Vec<u8> = two_regions(&shape, k)
                .iter()
                .flat_map(|(o, r)| region(&data, &shape, es, o, r))
                .collect();
            assert_same(
                out,
                &want,
                es,
                &format!("{backend} {} in read_many", f.name),
            );
        }
    }
}

#[test]
fn read_many_fails_as_a_whole_and_checks_each_output() {
    let (_, engine) = engines().remove(0);
    let fixtures = zcrop_fixtures::manifest();
    let f = fixtures
        .iter()
        .find(|f| f.shape.len() == 2 && !f.shape.contains(&0))
        .unwrap();
    let a = open(f, &engine);
    let sel = vec![vec![
        DimSelection::Range { start: 0, len: 1 },
        DimSelection::Range { start: 0, len: 1 },
    ]];
    let mut wrong = vec![0u8; a.output_len(&sel, a.element_size()).unwrap() + 1];
    let err = zcrop_zarr::read_many(vec![zcrop_zarr::ReadPart {
        array: &a,
        selections: &sel,
        out: &mut wrong,
        options: zcrop_zarr::ReadOptions::default(),
    }]);
    assert!(
        matches!(err, Err(zcrop_zarr::ZarrError::InvalidArgument(_))),
        "{err:?}"
    );
    assert!(zcrop_zarr::read_many(Vec::new()).unwrap().is_empty());
}
