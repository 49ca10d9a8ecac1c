//! Per-sample metadata: coordinate labels from 1-d coordinate arrays named like the source's
//! dimensions (v3 `dimension_names`, v2 `_ARRAY_DIMENSIONS`).

mod common;

use std::path::Path;

use common::{write_group, write_v3};
use serde_json::json;
use zcrop_sampler::{CoordValue, SampleSpec, Sampler, Shard, Source};
use zcrop_zarr::{Array, Node};

fn bytes<T: Copy, const N: usize>(v: &[T], f: fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

fn attrs(v: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().unwrap().clone()
}

fn open_member(store: &Path, name: &str) -> Array {
    match zcrop_zarr::open(store).unwrap() {
        Node::Group(g) => match g.get(name).unwrap() {
            Node::Array(a) => a,
            Node::Group(_) => panic!("group"),
        },
        Node::Array(_) => panic!("array"),
    }
}

#[test]
fn v3_coordinate_arrays_label_every_sample() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("weather.zarr");
    write_group(&store, "/");
    let times: Vec<i64> = (0..10).map(|i| 1000 + 6 * i).collect();
    write_v3(
        &store,
        "/time",
        &[10],
        &[4],
        "int64",
        &bytes(&times, i64::to_ne_bytes),
        Some(&["time"]),
        attrs(&json!({"units": "hours since 2000-01-01"})),
    );
    let lats: Vec<f64> = (0..8).map(|i| 50.0 - 0.25 * f64::from(i)).collect();
    write_v3(
        &store,
        "/lat",
        &[8],
        &[8],
        "float64",
        &bytes(&lats, f64::to_ne_bytes),
        Some(&["lat"]),
        attrs(&json!({})),
    );
    // Named like a dimension but of the wrong length: not a coordinate of `temp`.
    write_v3(
        &store,
        "/lon",
        &[5],
        &[5],
        "float32",
        &[0u8; 20],
        Some(&["lon"]),
        attrs(&json!({})),
    );
    let temp: Vec<f32> = (0..480).map(|i| i as f32).collect();
    write_v3(
        &store,
        "/temp",
        &[10, 8, 6],
        &[5, 4, 3],
        "float32",
        &bytes(&temp, f32::to_ne_bytes),
        Some(&["time", "lat", "lon"]),
        attrs(&json!({})),
    );

    let array = open_member(&store, "temp");
    let sampler = Sampler::new(
        SampleSpec::new(["time", "lat", "lon"])
            .source(Source::new("temp", array, [2, 3, 4]))
            .seed(2)
            .batch_size(6),
    )
    .unwrap();
    let plan = sampler.plan(4, Shard::SINGLE).unwrap();
    let data = sampler.read(&plan).unwrap();
    for i in 0..plan.len() {
        let meta = plan.sample(i);
        assert_eq!(
            (meta.step, meta.index, meta.global_index),
            (4, i, 24 + i as u64)
        );
        let s = &meta.sources[0];
        assert_eq!(&*s.source, "temp");
        assert!(s.array.ends_with("temp"), "{}", s.array);
        assert_eq!(s.shape, vec![2, 3, 4]);
        let o = &common::unsigned(&s.origin);
        assert_eq!(s.coords.len(), 2, "{:?}", s.coords);
        let t = &s.coords[0];
        assert_eq!((&*t.dim, t.axis), ("time", 0));
        assert_eq!(t.first, CoordValue::Int(times[o[0] as usize]));
        assert_eq!(t.last, CoordValue::Int(times[o[0] as usize + 1]));
        assert_eq!(t.units.as_deref(), Some("hours since 2000-01-01"));
        let l = &s.coords[1];
        assert_eq!((&*l.dim, l.axis), ("lat", 1));
        assert_eq!(l.first, CoordValue::Float(lats[o[1] as usize]));
        assert_eq!(l.last, CoordValue::Float(lats[o[1] as usize + 2]));
        assert_eq!(l.units, None);
        // The data at the labelled origin is the array's.
        let first = f32::from_ne_bytes(data[0][i * 96..i * 96 + 4].try_into().unwrap());
        assert_eq!(first as u64, o[0] * 48 + o[1] * 6 + o[2]);
    }

    // Turned off, or given explicitly.
    let array = open_member(&store, "temp");
    let lon = open_member(&store, "lat");
    let off = Sampler::new(
        SampleSpec::new(["time", "lat", "lon"])
            .source(Source::new("temp", array.clone(), [2, 3, 4]).without_coordinates()),
    )
    .unwrap();
    assert!(
        off.plan(0, Shard::SINGLE).unwrap().sample(0).sources[0]
            .coords
            .is_empty()
    );
    let given = Sampler::new(
        SampleSpec::new(["time", "lat", "lon"])
            .source(Source::new("temp", array.clone(), [2, 3, 4]).coordinate(1, "latitude", lon)),
    )
    .unwrap();
    let c = &given.plan(0, Shard::SINGLE).unwrap().sample(0).sources[0].coords;
    assert_eq!(c.len(), 1);
    assert_eq!(&*c[0].dim, "latitude");
    // A coordinate of the wrong length is refused when given explicitly.
    let wrong = open_member(&store, "lon");
    assert!(
        Sampler::new(
            SampleSpec::new(["time", "lat", "lon"])
                .source(Source::new("temp", array, [2, 3, 4]).coordinate(2, "lon", wrong)),
        )
        .is_err()
    );
}

fn write(path: &Path, content: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// xarray's v2 convention: `_ARRAY_DIMENSIONS` in `.zattrs`.
#[test]
fn v2_array_dimensions_attribute_finds_coordinates() {
    let dir = tempfile::tempdir().unwrap();
    let s = dir.path().join("v2.zarr");
    write(&s.join(".zgroup"), br#"{"zarr_format": 2}"#);
    let zarray = |shape: &str, chunks: &str, dtype: &str| {
        format!(
            r#"{{"zarr_format": 2, "shape": {shape}, "chunks": {chunks}, "dtype": "{dtype}", "compressor": null, "fill_value": 0, "order": "C", "filters": null}}"#
        )
    };
    write(
        &s.join("time/.zarray"),
        zarray("[10]", "[10]", "<u4").as_bytes(),
    );
    write(
        &s.join("time/.zattrs"),
        br#"{"_ARRAY_DIMENSIONS": ["time"], "units": "days since 1970-01-01"}"#,
    );
    let times: Vec<u32> = (0..10).map(|i| 19000 + i).collect();
    write(&s.join("time/0"), &bytes(&times, u32::to_le_bytes));
    write(
        &s.join("temp/.zarray"),
        zarray("[10, 4]", "[5, 4]", "<f4").as_bytes(),
    );
    write(
        &s.join("temp/.zattrs"),
        br#"{"_ARRAY_DIMENSIONS": ["time", "x"]}"#,
    );
    for c in 0..2 {
        let vals: Vec<f32> = (0..20).map(|i| (c * 20 + i) as f32).collect();
        write(
            &s.join(format!("temp/{c}.0")),
            &bytes(&vals, f32::to_le_bytes),
        );
    }
    let array = open_member(&s, "temp");
    let sampler = Sampler::new(
        SampleSpec::new(["time", "x"])
            .source(Source::new("temp", array, [3, 2]))
            .seed(1)
            .batch_size(4),
    )
    .unwrap();
    let plan = sampler.plan(0, Shard::SINGLE).unwrap();
    for i in 0..4 {
        let m = plan.sample(i);
        let o = &common::unsigned(&m.sources[0].origin);
        let c = &m.sources[0].coords;
        assert_eq!(c.len(), 1);
        assert_eq!(
            c[0].first,
            CoordValue::UInt(u64::from(times[o[0] as usize]))
        );
        assert_eq!(
            c[0].last,
            CoordValue::UInt(u64::from(times[o[0] as usize + 2]))
        );
        assert_eq!(c[0].units.as_deref(), Some("days since 1970-01-01"));
    }
}
