//! Every fixture's expected array loads, and its metadata (wherever the store keeps it: zarr.json,
//! .zarray + .zattrs, or consolidated .zmetadata) parses into an array that zarrs accepts, with
//! the shape, data type and attributes the manifest gives.

use std::sync::Arc;

use zarrs::array::Array;
use zarrs::metadata::ArrayMetadata;
use zarrs::metadata::v2::ArrayMetadataV2;
use zarrs::metadata::v3::ArrayMetadataV3;
// Links zcrop-zarr, whose numcodecs codecs (lz4, lzma, bz2, delta) join zarrs' registry.
use zcrop_zarr as _;

/// v3 name of the data type for a numpy dtype string.
fn v3_name(descr: &str) -> &'static str {
    match &descr[1..] {
        "b1" => "bool",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "c8" => "complex64",
        "c16" => "complex128",
        other => panic!("unexpected dtype {other}"),
    }
}

fn read_metadata(f: &zcrop_fixtures::Fixture) -> (ArrayMetadata, Option<ArrayMetadata>) {
    let dir = f.array_dir();
    if f.zarr_format == 3 {
        let md: ArrayMetadataV3 =
            serde_json::from_slice(&std::fs::read(dir.join("zarr.json")).unwrap()).unwrap();
        return (ArrayMetadata::V3(md), None);
    }
    let mut md: ArrayMetadataV2 =
        serde_json::from_slice(&std::fs::read(dir.join(".zarray")).unwrap()).unwrap();
    if let Ok(attrs) = std::fs::read(dir.join(".zattrs")) {
        md.attributes = serde_json::from_slice(&attrs).unwrap();
    }
    // The consolidated copy, if the store has one, must say the same.
    let consolidated = std::fs::read(f.store_path().join(".zmetadata"))
        .ok()
        .map(|z| {
            let z: serde_json::Value = serde_json::from_slice(&z).unwrap();
            let prefix = if f.array_path.is_empty() {
                String::new()
            } else {
                format!("{}/", f.array_path)
            };
            let entry = &z["metadata"][format!("{prefix}.zarray")];
            let mut m: ArrayMetadataV2 = serde_json::from_value(entry.clone()).unwrap();
            if let Some(a) = z["metadata"].get(format!("{prefix}.zattrs")) {
                m.attributes = serde_json::from_value(a.clone()).unwrap();
            }
            ArrayMetadata::V2(m)
        });
    (ArrayMetadata::V2(md), consolidated)
}

#[test]
fn every_fixture_loads() {
    let fixtures = zcrop_fixtures::manifest();
    assert!(
        fixtures.len() >= 40,
        "manifest lists {} arrays",
        fixtures.len()
    );
    for f in &fixtures {
        let npy = f.expected().unwrap();
        assert_eq!(npy.shape, f.shape, "{}: .npy shape", f.name);
        assert_eq!(npy.descr, f.dtype, "{}: .npy dtype", f.name);
        let native = npy.native_c_order().unwrap();
        assert_eq!(native.len(), npy.data.len());

        let (md, consolidated) = read_metadata(f);
        if let Some(c) = &consolidated {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                serde_json::to_value(&md).unwrap(),
                "{}: .zmetadata disagrees with .zarray",
                f.name
            );
        }
        let array = Array::new_with_metadata(Arc::new(()), "/", md)
            .unwrap_or_else(|e| panic!("{}: zarrs rejects the metadata: {e}", f.name));
        assert_eq!(array.shape(), &f.shape[..], "{}", f.name);
        assert_eq!(
            array.data_type().name_v3().as_deref(),
            Some(v3_name(&f.dtype)),
            "{}",
            f.name
        );
        assert_eq!(array.attributes(), &f.attributes, "{}: attributes", f.name);
    }
}

#[test]
fn fixtures_cover_what_the_readers_must_handle() {
    let fixtures = zcrop_fixtures::manifest();
    let has = |tag: &str| fixtures.iter().any(|f| f.has(tag));
    for tag in [
        "v2",
        "v3",
        "zmetadata",
        "dimsep-dot",
        "dimsep-slash",
        "order-F",
        "big-endian",
        "bytes-be",
        "transpose",
        "crc32c",
        "gzip",
        "zlib",
        "zstd",
        "zstd-checksum",
        "no-compressor",
        "sharding-index-start",
        "sharding-index-end",
        "nested-sharding",
        "chunk-key-v2-dot",
        "edge-chunks",
        "missing-chunks",
        "missing-inner-chunks",
        "fill-nan",
        "group-hierarchy",
        "0d",
        "5d",
    ] {
        assert!(has(tag), "no fixture covers {tag}");
    }
    for dt in [
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    ] {
        assert!(
            fixtures.iter().any(|f| f.has(dt) && f.has("v3")),
            "no v3 fixture of {dt}"
        );
    }
}
