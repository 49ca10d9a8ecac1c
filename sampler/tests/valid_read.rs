//! `valid::read_missing` (the missing-element test run inside a read, which never writes the
//! values out) against `valid::missing_map` over the values zarr-python wrote, on every numeric
//! fixture: chunks not stored (the fill value stands for them), shards, blosc and other codecs,
//! both byte orders, and maps kept over all axes or reduced over some.

mod common;

use zcrop_sampler::SamplerError;
use zcrop_sampler::valid::{MissingMap, missing_map, read_missing};
use zcrop_zarr::{Array, DimSelection, ReadOptions};

/// The numpy dtype string as the kernels name it (native byte order), for numeric types.
fn kernel_dtype(descr: &str) -> Option<&'static str> {
    Some(match &descr[1..] {
        "b1" => "bool",
        "u1" => "uint8",
        "i1" => "int8",
        "u2" => "uint16",
        "i2" => "int16",
        "f2" => "float16",
        "u4" => "uint32",
        "i4" => "int32",
        "f4" => "float32",
        "u8" => "uint64",
        "i8" => "int64",
        "f8" => "float64",
        _ => return None,
    })
}

/// The fill value as a number the kernels compare with (NaN is always missing for floats).
fn fill_number(v: &serde_json::Value) -> Option<f64> {
    match v {
        serde_json::Value::Bool(b) => Some(f64::from(u8::from(*b))),
        serde_json::Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

/// [`read_missing`] of `block` of `array` (of `shape`), through the array's read.
fn read_map(
    array: &Array,
    block: &[DimSelection],
    shape: &[usize],
    dtype: &str,
    fills: &[f64],
    keep: &[bool],
) -> MissingMap {
    read_missing(shape, dtype, fills, keep, |sink, out| {
        let options = ReadOptions {
            transform: Some(sink),
            cancel: None,
        };
        let blocks = [block.to_vec()];
        array
            .read_selections_into_with(&blocks, out, options)
            .map_err(|e| SamplerError::Spec {
                reason: e.to_string(),
            })?;
        Ok::<(), SamplerError>(())
    })
    .unwrap()
}

#[test]
fn read_missing_matches_the_map_of_the_values_on_every_numeric_fixture() {
    let mut checked = 0;
    let mut with_missing_chunks = 0;
    for f in zcrop_fixtures::manifest() {
        let Some(dtype) = kernel_dtype(&f.dtype) else {
            continue;
        };
        let (array, data, shape) = common::fixture(&f.name);
        if shape.is_empty() || shape.contains(&0) {
            continue;
        }
        let shape_us: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
        // The fill value (what chunks not stored hold), small values the data may hold.
        let fills: Vec<Vec<f64>> = vec![
            fill_number(&f.fill_value).into_iter().collect(),
            vec![0.0, 1.0],
            vec![],
        ];
        let nd = shape.len();
        let keeps: Vec<Vec<bool>> = vec![
            vec![true; nd],
            (0..nd).map(|d| d != 0).collect(),
            (0..nd).map(|d| d + 1 != nd).collect(),
        ];
        let block: Vec<DimSelection> = shape
            .iter()
            .map(|&len| DimSelection::Range { start: 0, len })
            .collect();
        for fills in &fills {
            for keep in &keeps {
                let want = missing_map(&data, dtype, &shape_us, fills, keep).unwrap();
                let got = read_map(&array, &block, &shape_us, dtype, fills, keep);
                assert_eq!(got.shape, want.1, "{} {fills:?} {keep:?}", f.name);
                assert_eq!(
                    got.to_bools().unwrap(),
                    want.0,
                    "{} {fills:?} {keep:?}",
                    f.name
                );
            }
        }
        checked += 1;
        with_missing_chunks += usize::from(f.n_missing_chunks + f.n_missing_inner_chunks > 0);
    }
    assert!(checked >= 20, "only {checked} numeric fixtures");
    assert!(
        with_missing_chunks >= 10,
        "only {with_missing_chunks} with chunks not stored"
    );
}

#[test]
fn read_missing_of_a_selection_with_picked_indices() {
    // A 3-d fixture read with a list of indices along the first axis and a range along the
    // others, the map reduced over the picked axis.
    let f = zcrop_fixtures::manifest()
        .into_iter()
        .find(|f| f.shape.len() == 3 && kernel_dtype(&f.dtype).is_some())
        .expect("a 3-d numeric fixture");
    let dtype = kernel_dtype(&f.dtype).unwrap();
    let (array, data, shape) = common::fixture(&f.name);
    let picks: Vec<u64> = (0..shape[0]).rev().step_by(2).collect();
    let es = data.len() / shape.iter().product::<u64>() as usize;
    let fills = vec![0.0, 1.0];
    let keep = [false, true, true];
    let mut picked = Vec::new();
    for &p in &picks {
        picked.extend(common::region(
            &data,
            &shape,
            es,
            &[p, 0, 0],
            &[1, shape[1], shape[2]],
        ));
    }
    let sub = [picks.len(), shape[1] as usize, shape[2] as usize];
    let want = missing_map(&picked, dtype, &sub, &fills, &keep).unwrap();
    let block = vec![
        DimSelection::Points(picks.clone()),
        DimSelection::Range {
            start: 0,
            len: shape[1],
        },
        DimSelection::Range {
            start: 0,
            len: shape[2],
        },
    ];
    let got = read_map(&array, &block, &sub, dtype, &fills, &keep);
    assert_eq!((got.to_bools().unwrap(), got.shape), want, "{}", f.name);
}
