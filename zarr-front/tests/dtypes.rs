//! The fixed-size data types beyond the numeric ones, in metadata written as zarr-python
//! writes it: numpy dtype strings, fill values (v2 `null` included) and element bytes, with a
//! stored chunk and a missing one. (pybind/tests/test_dtypes_text.py checks them against
//! zarr-python itself.)

use std::path::Path;

use serde_json::{Value, json};
use zcrop_zarr::Array;

/// A 1-d array of 3 elements in chunks of 2: chunk 0 stored raw, chunk 1 missing.
fn write(dir: &Path, meta_name: &str, meta: &Value, chunk0_key: &str, chunk0: &[u8]) -> Array {
    std::fs::write(dir.join(meta_name), serde_json::to_vec(meta).unwrap()).unwrap();
    let key = dir.join(chunk0_key);
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::write(key, chunk0).unwrap();
    Array::open(dir).unwrap()
}

fn v2(dir: &Path, dtype: &str, fill: &Value, chunk0: &[u8]) -> Array {
    let meta = json!({
        "zarr_format": 2, "shape": [3], "chunks": [2], "dtype": dtype, "fill_value": fill,
        "order": "C", "compressor": null, "filters": null,
    });
    write(dir, ".zarray", &meta, "0", chunk0)
}

fn v3(dir: &Path, data_type: &Value, fill: &Value, endian: &str, chunk0: &[u8]) -> Array {
    let meta = json!({
        "zarr_format": 3, "node_type": "array", "shape": [3], "data_type": data_type,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": fill,
        "codecs": [{"name": "bytes", "configuration": {"endian": endian}}],
    });
    write(dir, "zarr.json", &meta, "c/0", chunk0)
}

fn utf32(s: &str, width: usize, big: bool) -> Vec<u8> {
    let mut units: Vec<u32> = s.chars().map(u32::from).collect();
    units.resize(width, 0);
    units
        .iter()
        .flat_map(|u| {
            if big {
                u.to_be_bytes()
            } else {
                u.to_ne_bytes()
            }
        })
        .collect()
}

fn read_all(a: &Array) -> Vec<u8> {
    a.read_region(&[0], a.shape()).unwrap()
}

#[test]
fn fixed_length_unicode() {
    let d = tempfile::tempdir().unwrap();
    // v2 big-endian, a `null` fill: read native-endian, missing elements empty.
    let stored = [utf32("aé", 2, true), utf32("😀", 2, true)].concat();
    let a = v2(d.path(), ">U2", &Value::Null, &stored);
    assert_eq!(a.numpy_dtype(), ">U2");
    assert_eq!(a.metadata_json()["fill_value"], Value::Null);
    assert_eq!(a.fill_value_bytes(), utf32("", 2, false));
    let want = [
        utf32("aé", 2, false),
        utf32("😀", 2, false),
        utf32("", 2, false),
    ]
    .concat();
    assert_eq!(read_all(&a), want);

    let d = tempfile::tempdir().unwrap();
    let stored = [utf32("ab", 2, true), utf32("c", 2, true)].concat();
    let cfg = json!({"name": "fixed_length_utf32", "configuration": {"length_bytes": 8}});
    let a = v3(d.path(), &cfg, &Value::from("zé"), "big", &stored);
    let native = if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    assert_eq!(a.numpy_dtype(), format!("{native}U2"));
    let want = [
        utf32("ab", 2, false),
        utf32("c", 2, false),
        utf32("zé", 2, false),
    ]
    .concat();
    assert_eq!(read_all(&a), want);
}

#[test]
fn fixed_length_bytes() {
    let d = tempfile::tempdir().unwrap();
    let a = v2(d.path(), "|S3", &Value::from("YWI="), b"xyzq\0\0");
    assert_eq!(a.numpy_dtype(), "|S3");
    assert_eq!(a.fill_value_bytes(), b"ab\0");
    assert_eq!(read_all(&a), b"xyzq\0\0ab\0");

    let d = tempfile::tempdir().unwrap();
    let a = v2(d.path(), "|S3", &Value::Null, b"xyzq\0\0");
    assert_eq!(read_all(&a), b"xyzq\0\0\0\0\0");

    let d = tempfile::tempdir().unwrap();
    let cfg = json!({"name": "null_terminated_bytes", "configuration": {"length_bytes": 3}});
    let a = v3(d.path(), &cfg, &Value::from(""), "little", b"xyzq\0\0");
    assert_eq!(a.numpy_dtype(), "|S3");
    assert_eq!(read_all(&a), b"xyzq\0\0\0\0\0");
}

#[test]
fn datetime_and_timedelta() {
    let ne = |v: &[i64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
    let le = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let d = tempfile::tempdir().unwrap();
    // A v2 `null` fill is NaT, as zarr-python reads it (not the epoch).
    let a = v2(d.path(), "<M8[ns]", &Value::Null, &le(&[5, i64::MIN]));
    assert_eq!(a.numpy_dtype(), "<M8[ns]");
    assert_eq!(a.metadata_json()["fill_value"], Value::Null);
    assert_eq!(read_all(&a), ne(&[5, i64::MIN, i64::MIN]));

    let d = tempfile::tempdir().unwrap();
    let a = v2(d.path(), "<m8[s]", &Value::from(7), &le(&[1, 2]));
    assert_eq!(a.numpy_dtype(), "<m8[s]");
    assert_eq!(read_all(&a), ne(&[1, 2, 7]));

    let native = if cfg!(target_endian = "little") {
        '<'
    } else {
        '>'
    };
    for (name, kind) in [("numpy.datetime64", 'M'), ("numpy.timedelta64", 'm')] {
        let d = tempfile::tempdir().unwrap();
        let cfg = json!({"name": name, "configuration": {"unit": "s", "scale_factor": 10}});
        let be: Vec<u8> = [3i64, -4].iter().flat_map(|x| x.to_be_bytes()).collect();
        let a = v3(d.path(), &cfg, &Value::from("NaT"), "big", &be);
        assert_eq!(a.numpy_dtype(), format!("{native}{kind}8[10s]"));
        assert_eq!(read_all(&a), ne(&[3, -4, i64::MIN]));
    }
}
