//! Bad input gives a typed error that names the array, the key and the byte range; never a
//! panic, never silently wrong data. Each test damages a copy of a fixture in a temp dir.

mod common;

use std::path::Path;

use common::{copy_store, engines};
use zcrop_io::ReadRange;
use zcrop_zarr::{Array, OpenOptions, ZarrError};

fn open(path: &Path) -> Array {
    let (_, engine) = engines().remove(0);
    Array::open_with(
        path,
        &OpenOptions {
            engine: Some(engine),
            ..OpenOptions::default()
        },
    )
    .unwrap()
}

fn read_all(a: &Array) -> Result<Vec<u8>, ZarrError> {
    let origin = vec![0; a.ndim()];
    a.read_region(&origin, a.shape())
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut bytes = std::fs::read(path).unwrap();
    f(&mut bytes);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn truncated_chunk_is_a_codec_error_naming_key_and_range() {
    let (_d, store) = copy_store("v2_zstd_be_u2");
    edit(&store.join("1.1"), |b| b.truncate(b.len() / 2));
    let err = read_all(&open(&store)).unwrap_err();
    let ZarrError::Codec { at, reason } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(at.node, "/");
    assert_eq!(at.key, "1.1");
    assert_eq!(at.range, Some(ReadRange::Whole));
    assert!(reason.contains("zstd"), "{reason}");
    let msg = err.to_string();
    assert!(
        msg.contains("\"1.1\"") && msg.contains("whole file"),
        "{msg}"
    );
}

#[test]
fn garbage_chunk_bytes_are_a_codec_error() {
    for (fixture, key) in [
        ("v2_zstd_be_u2", "0.1"),
        ("v2_blosc_lz4_shuffle", "1.2"),
        ("v2_gzip_be_f8", "0/2/0"),
        ("v3_transpose_blosc_f4", "c/0/2/0"),
    ] {
        let (_d, store) = copy_store(fixture);
        let path = store.join(key);
        assert!(path.exists(), "{fixture}: no chunk {key}");
        edit(&path, |b| {
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i * 31 + 7) as u8;
            }
        });
        match read_all(&open(&store)) {
            Err(ZarrError::Codec { at, .. }) => assert_eq!(at.key, key, "{fixture}"),
            other => panic!("{fixture}: {other:?}"),
        }
    }
}

/// The (offset, length) of inner chunk `inner` in the index at the end of shard `bytes`
/// (16 bytes an entry, then a crc32c).
fn inner_range(bytes: &[u8], inner: usize, count: usize) -> (u64, u64) {
    let index = &bytes[bytes.len() - 16 * count - 4..];
    let word = |k: usize| u64::from_le_bytes(index[8 * k..8 * k + 8].try_into().unwrap());
    (word(2 * inner), word(2 * inner + 1))
}

/// A read of more than 512 leaves from local files locates its first 256 alone and the rest
/// while those decode; a faulty chunk among the rest is named as well, whether its shard was
/// first seen among the first leaves or among the rest.
#[test]
fn faulty_chunks_among_the_later_located_leaves_are_named() {
    // 540 leaves of 1x1x16x16 in C order: leaf 300 is (3, 1, 0, 0), inner chunk 160 of shard
    // c/0/0/0/0 (whose first leaves come first); leaf 539 is (5, 2, 4, 5), inner chunk 81 of
    // shard c/1/0/1/1, whose leaves all come after the first 256.
    for (key, inner) in [("c/0/0/0/0", 160), ("c/1/0/1/1", 81)] {
        let (_d, store) = copy_store("v3_workload_4d_u2");
        let path = store.join(key);
        let (offset, len) = inner_range(&std::fs::read(&path).unwrap(), inner, 4 * 3 * 4 * 4);
        assert!(len > 0, "{key}: inner chunk {inner} not stored");
        edit(&path, |b| {
            for x in &mut b[offset as usize..(offset + len) as usize] {
                *x ^= 0x5a;
            }
        });
        let a = open(&store);
        match read_all(&a) {
            Err(ZarrError::Codec { at, .. }) => {
                assert_eq!(at.key, key);
                assert_eq!(at.range, Some(ReadRange::new(offset, len)), "{key}");
            }
            other => panic!("{key}: {other:?}"),
        }
    }
}

#[test]
fn checksum_mismatch_is_detected() {
    let (_d, store) = copy_store("v3_crc32c_i1");
    let key = "c/0/0/0";
    edit(&store.join(key), |b| {
        let n = b.len();
        b[n / 2] ^= 0x55;
    });
    match read_all(&open(&store)) {
        Err(ZarrError::Codec { at, reason }) => {
            assert_eq!(at.key, key);
            assert!(reason.contains("checksum"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shard_index_pointing_past_the_end_of_its_file() {
    // Index at the end, without checksum: 2 little-endian u64 per inner chunk.
    let (_d, store) = copy_store("v3_sharded_partial_nocrc_u1");
    let shard = store.join("c/0");
    let len = std::fs::metadata(&shard).unwrap().len();
    edit(&shard, |b| {
        let n = b.len();
        let entry0 = n - 5 * 16; // first of the 5 inner chunks
        b[entry0..entry0 + 8].copy_from_slice(&(len - 4).to_le_bytes());
        b[entry0 + 8..entry0 + 16].copy_from_slice(&100u64.to_le_bytes());
    });
    match read_all(&open(&store)) {
        Err(ZarrError::ShardIndex { at, reason }) => {
            assert_eq!(at.key, "c/0");
            assert_eq!(at.range, Some(ReadRange::new(len - 4, 100)));
            assert!(reason.contains("past the end"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn corrupt_shard_index_checksum() {
    let (_d, store) = copy_store("v3_sharded_end");
    let shard = store.join("c/0/0");
    edit(&shard, |b| {
        let n = b.len();
        b[n - 10] ^= 0xff; // inside the index, covered by its crc32c
    });
    match read_all(&open(&store)) {
        Err(ZarrError::ShardIndex { at, reason }) => {
            assert_eq!(at.key, "c/0/0");
            assert!(matches!(at.range, Some(ReadRange::Suffix(_))), "{at:?}");
            assert!(reason.to_lowercase().contains("checksum"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn shard_shorter_than_its_index() {
    let (_d, store) = copy_store("v3_sharded_end");
    edit(&store.join("c/0/0"), |b| b.truncate(10));
    match read_all(&open(&store)) {
        Err(ZarrError::ShardIndex { at, reason }) => {
            assert_eq!(at.key, "c/0/0");
            assert!(reason.contains("shorter than its index"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// A shard truncated between two reads of a live array (its file mapped, its index cached):
/// the second read finds the file changed and reads its index again, which the shard is now
/// too short to hold. (Bytes lost from a mapping during a read are the IO engine's
/// `FileChanged`, tested in its conformance suite.)
#[test]
fn a_shard_truncated_between_reads_is_a_shard_index_error() {
    let (_d, store) = copy_store("v3_sharded_end");
    let (name, engine) = engines().remove(2);
    assert_eq!(name, "mmap");
    let a = Array::open_with(
        &store,
        &OpenOptions {
            engine: Some(engine.clone()),
            ..OpenOptions::default()
        },
    )
    .unwrap();
    read_all(&a).unwrap();
    assert!(engine.metrics().mapped_reads > 0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(store.join("c/0/0"))
        .unwrap()
        .set_len(0)
        .unwrap();
    match read_all(&a) {
        Err(ZarrError::ShardIndex { at, reason }) => {
            assert_eq!(at.key, "c/0/0");
            assert!(reason.contains("shorter than its index"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_metadata_json() {
    let (_d, store) = copy_store("v3_zstd_checksum_u8");
    std::fs::write(
        store.join("zarr.json"),
        b"{\"zarr_format\": 3, \"node_type\": \"array\", ",
    )
    .unwrap();
    match zcrop_zarr::open(&store) {
        Err(ZarrError::InvalidMetadata { path, reason }) => {
            assert!(path.ends_with("zarr.json"), "{path:?}");
            assert!(reason.contains("EOF"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let (_d2, store2) = copy_store("v2_zstd_be_u2");
    std::fs::write(store2.join(".zarray"), b"[1, 2").unwrap();
    assert!(matches!(
        zcrop_zarr::open(&store2),
        Err(ZarrError::InvalidMetadata { .. })
    ));
}

fn set_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn unknown_codec_is_named_at_open() {
    let (_d, store) = copy_store("v3_zstd_checksum_u8");
    set_json(&store.join("zarr.json"), |v| {
        v["codecs"][1]["name"] = "frobnicate".into();
    });
    match zcrop_zarr::open(&store) {
        Err(ZarrError::UnsupportedCodec { array, codec, .. }) => {
            assert_eq!(array, "/");
            assert_eq!(codec, "frobnicate");
        }
        other => panic!("{other:?}"),
    }
    let (_d2, store2) = copy_store("v2_zstd_be_u2");
    set_json(&store2.join(".zarray"), |v| {
        v["filters"] = serde_json::json!([{"id": "frobnicate", "dtype": ">u2"}]);
    });
    match zcrop_zarr::open(&store2) {
        Err(ZarrError::UnsupportedCodec { codec, .. }) => assert_eq!(codec, "frobnicate"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_data_types_are_named_at_open() {
    let (_d, store) = copy_store("v2_zstd_be_u2");
    let structured = serde_json::json!([["a", "<i4"], ["b", "<f4"]]);
    let set = |dtype: &serde_json::Value, filters: serde_json::Value| {
        set_json(&store.join(".zarray"), |v| {
            v["dtype"] = dtype.clone();
            v["fill_value"] = serde_json::Value::Null;
            v["compressor"] = serde_json::Value::Null;
            v["filters"] = filters;
        });
    };
    for dtype in ["|V4".into(), structured] {
        set(&dtype, serde_json::Value::Null);
        // Never a metadata error: the metadata is valid, zcrop does not read the type.
        match zcrop_zarr::open(&store) {
            Err(ZarrError::UnsupportedDataType { array, .. }) => assert_eq!(array, "/", "{dtype}"),
            other => panic!("{dtype}: {other:?}"),
        }
    }
    // Object arrays: strings through vlen-utf8 are read; without an object codec they
    // cannot be (zarr-python would need pickle or the like).
    set(&"|O".into(), serde_json::json!([{"id": "vlen-utf8"}]));
    let a = open(&store);
    assert_eq!(a.variable_kind(), Some(zcrop_zarr::VariableKind::Utf8));
    assert!(matches!(
        a.read_region(&[0, 0], &[1, 1]),
        Err(ZarrError::Unsupported { .. })
    ));
    set(&"|O".into(), serde_json::Value::Null);
    match zcrop_zarr::open(&store) {
        Err(ZarrError::UnsupportedCodec { array, codec, .. }) => {
            assert_eq!((array.as_str(), codec.as_str()), ("/", "bytes"));
        }
        other => panic!("|O: {other:?}"),
    }
}

#[test]
fn out_of_bounds_and_malformed_reads() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let a = open(&f.store_path());
    for (origin, shape) in [
        (vec![0, 0, 0, 80], vec![1, 1, 1, 11]),
        (vec![6, 0, 0, 0], vec![1, 1, 1, 1]),
        (vec![0, 0, 0], vec![1, 1, 1]),
        (vec![u64::MAX, 0, 0, 0], vec![2, 1, 1, 1]),
    ] {
        match a.read_region(&origin, &shape) {
            Err(ZarrError::OutOfBounds {
                array, shape: s, ..
            }) => {
                assert_eq!(array, "/");
                assert_eq!(s, vec![6, 3, 70, 90]);
            }
            other => panic!("{origin:?}+{shape:?}: {other:?}"),
        }
    }
    let mut small = vec![0u8; 3];
    assert!(matches!(
        a.read_region_into(&[0, 0, 0, 0], &[1, 1, 1, 2], &mut small),
        Err(ZarrError::InvalidArgument(_))
    ));
    assert!(matches!(
        a.read_batch(&[0, 0, 0], &[1, 1, 1, 1]),
        Err(ZarrError::InvalidArgument(_))
    ));
    // A region too large to exist.
    assert!(a.read_region(&[0, 0, 0, 0], &[u64::MAX, 1, 1, 1]).is_err());
}

#[test]
fn chunk_grids_too_large_to_number_or_count() {
    // 2^62 x 2^62 chunks of one element: reads work (each chunk is missing: fill value).
    let (_d, store) = copy_store("v3_bytes_le_raw");
    set_json(&store.join("zarr.json"), |v| {
        v["shape"] = serde_json::json!([1u64 << 62, 1u64 << 62]);
        v["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!([1, 1]);
    });
    let a = open(&store);
    let got = a.read_region(&[(1 << 62) - 2, 0], &[2, 2]).unwrap();
    assert_eq!(got.len(), 4 * a.element_size());
    match a.storage_summary() {
        Err(ZarrError::InvalidArgument(msg)) => assert!(msg.contains("2^64"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // 2^60 x 2^60 x 2^60 chunks: more than 128 bits number.
    let (_d3, store3) = copy_store("v3_crc32c_i1");
    set_json(&store3.join("zarr.json"), |v| {
        v["shape"] = serde_json::json!([1u64 << 60, 1u64 << 60, 1u64 << 60]);
        v["chunk_grid"]["configuration"]["chunk_shape"] = serde_json::json!([1, 1, 1]);
    });
    match open(&store3).read_region(&[0, 0, 0], &[1, 1, 1]) {
        Err(ZarrError::InvalidArgument(msg)) => assert!(msg.contains("2^128"), "{msg}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_store_and_wrong_node_type() {
    let dir = tempfile::tempdir().unwrap();
    let err = zcrop_zarr::open(dir.path().join("nope.zarr")).unwrap_err();
    assert!(err.is_not_found(), "{err:?}");
    let f = zcrop_fixtures::get("v3_hierarchy__images__raw");
    assert!(matches!(
        Array::open(f.store_path()),
        Err(ZarrError::WrongNodeType {
            expected: "array",
            found: "group",
            ..
        })
    ));
}

#[test]
fn empty_chunk_file() {
    let (_d, store) = copy_store("v2_zstd_be_u2");
    std::fs::write(store.join("0.0"), b"").unwrap();
    match read_all(&open(&store)) {
        Err(ZarrError::Codec { at, .. }) => assert_eq!(at.key, "0.0"),
        other => panic!("{other:?}"),
    }
}

/// A blosc header's block size is not trusted: one that reads as nearly `usize::MAX` (a
/// negative 32-bit field; fuzzing found it overflowed the partial-read arithmetic) is an
/// error, not a panic.
#[test]
fn blosc_header_with_a_huge_block_size_is_an_error() {
    let f = zcrop_fixtures::get("v3_blosc_zlib_bitshuffle_u2");
    let a = Array::open(f.store_path()).unwrap();
    let chunk = a
        .read_encoded_chunks(&[vec![0, 0]])
        .unwrap()
        .remove(0)
        .unwrap();
    let mut bad = chunk.to_vec();
    bad[8..12].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
    for range in [0..2, 0..200, 50..120] {
        assert!(
            a.decode_chunk_range(&bad, range.clone()).is_err(),
            "{range:?}"
        );
    }
    assert!(a.decode_chunk(&bad).is_err());
    // The chunk as stored decodes.
    assert_eq!(a.decode_chunk(&chunk).unwrap().len(), 200);
}

/// Sizes that only metadata states (a chunk's bytes, a shard index's entries) are checked at
/// open: a size no allocation can have is an error naming it, never a wrapped product or an
/// abort later.
#[test]
fn chunks_and_shard_indexes_too_large_to_allocate_are_refused_at_open() {
    let cases: [(&str, serde_json::Value, serde_json::Value, &str); 3] = [
        (
            "v3_bytes_le_raw",
            serde_json::json!([1u64 << 40, 1u64 << 40]),
            serde_json::json!([1u64 << 40, 1u64 << 40]),
            "a chunk",
        ),
        (
            "v3_bytes_le_raw",
            serde_json::json!([1u64 << 62, 4]),
            serde_json::json!([1u64 << 62, 4]),
            "a chunk",
        ),
        (
            "v3_sharded_start",
            serde_json::json!([1u64 << 31, 1u64 << 31]),
            serde_json::json!([1u64 << 31, 1u64 << 31]),
            "a shard index",
        ),
    ];
    for (fixture, shape, chunks, what) in cases {
        let (_d, store) = copy_store(fixture);
        set_json(&store.join("zarr.json"), |v| {
            v["shape"] = shape.clone();
            v["chunk_grid"]["configuration"]["chunk_shape"] = chunks.clone();
            if let Some(cfg) = v["codecs"][0]["configuration"].as_object_mut()
                && cfg.contains_key("chunk_shape")
            {
                cfg["chunk_shape"] = serde_json::json!([1, 1]);
            }
        });
        match zcrop_zarr::open(&store) {
            Err(ZarrError::Oversized { array, reason }) => {
                assert_eq!(array, "/");
                assert!(reason.starts_with(what), "{fixture}: {reason}");
            }
            other => panic!("{fixture} {shape}: {other:?}"),
        }
    }
}
