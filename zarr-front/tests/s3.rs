//! Every fixture read from a real S3-compatible server (moto on loopback) equals what
//! zarr-python wrote and what the local read gives; groups, consolidated metadata and storage
//! summaries work the same; the GETs a read costs equal the physical reads the local engine
//! plans with the same coalescing limits.
//!
//! Skipped (saying so) where moto is not installed, unless `ZCROP_REQUIRE_S3=1`.

mod common;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use common::{assert_same, expected, read_many_outputs, region};
use zcrop_fixtures::s3::Moto;
use zcrop_io::{BackendChoice, CoalesceLimits, IoConfig, IoEngine, ObjectConfig, ObjectEngine};
use zcrop_zarr::{Array, BlockFetch, Node, OpenOptions, ReadOptions, ReadStats, ZarrError};

const BUCKET: &str = "zcrop-fixtures";

/// The shared server with every fixture store uploaded to [`BUCKET`] under its path relative
/// to `fixtures/` (`data/v3_....zarr`).
fn server() -> Option<&'static Moto> {
    static UPLOADED: OnceLock<()> = OnceLock::new();
    let moto = Moto::shared()?;
    UPLOADED.get_or_init(|| {
        moto.create_bucket(BUCKET);
        let stores: BTreeSet<String> = zcrop_fixtures::manifest()
            .into_iter()
            .map(|f| f.store)
            .collect();
        for store in stores {
            moto.upload_dir(BUCKET, &store, &zcrop_fixtures::root().join(&store));
        }
    });
    Some(moto)
}

fn url(f: &zcrop_fixtures::Fixture) -> String {
    format!("s3://{BUCKET}/{}", f.store)
}

fn s3_options(moto: &Moto) -> OpenOptions {
    OpenOptions {
        storage_options: moto.storage_options(),
        ..OpenOptions::default()
    }
}

/// The fixture's array, from the node opened at its store root.
fn array_of(f: &zcrop_fixtures::Fixture, node: Node) -> Array {
    match node {
        Node::Array(a) if f.array_path.is_empty() => a,
        Node::Group(g) => match g
            .get(&f.array_path)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name))
        {
            Node::Array(a) => a,
            Node::Group(_) => panic!("{}: a group", f.name),
        },
        Node::Array(_) => panic!("{}: expected a group at the store root", f.name),
    }
}

fn open(f: &zcrop_fixtures::Fixture, path: &str, options: &OpenOptions) -> Array {
    let node = zcrop_zarr::open_with(path, options).unwrap_or_else(|e| panic!("{}: {e}", f.name));
    array_of(f, node)
}

#[test]
fn every_fixture_reads_through_s3_like_zarr_python_and_the_local_read() {
    let Some(moto) = server() else { return };
    let options = s3_options(moto);
    for f in zcrop_fixtures::manifest() {
        let a = open(&f, &url(&f), &options);
        let local = open(
            &f,
            f.store_path().to_str().unwrap(),
            &OpenOptions::default(),
        );
        let (want, shape, es) = expected(&f);
        assert_eq!(a.shape(), &shape[..], "{}", f.name);
        assert_eq!(a.numpy_dtype(), f.dtype, "{}", f.name);
        assert!(a.object_engine().is_some() && a.engine().is_none());
        assert!(a.uri().starts_with(&url(&f)), "{}: {}", f.name, a.uri());
        let origin = vec![0; shape.len()];
        let got = a
            .read_region(&origin, &shape)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_same(&got, &want, es, &f.name);
        if shape.contains(&0) || shape.is_empty() {
            continue;
        }
        // A batch of crops: half the array's extent, at three origins.
        let crop: Vec<u64> = shape.iter().map(|&s| s.div_ceil(2)).collect();
        let origins: Vec<u64> = [0u64, 1, 2]
            .iter()
            .flat_map(|&k| shape.iter().zip(&crop).map(move |(s, c)| (s - c) * k / 2))
            .collect();
        let got = a.read_batch(&origins, &crop).unwrap();
        assert_eq!(
            got,
            local.read_batch(&origins, &crop).unwrap(),
            "{}",
            f.name
        );
        let first = region(&want, &shape, es, &origins[..shape.len()], &crop);
        assert_same(&got[..first.len()], &first, es, &f.name);
    }
}

/// Fixtures with every chunk stored (a missing file costs the local engine no read but the
/// object engine a GET that answers 404).
fn complete(f: &zcrop_fixtures::Fixture) -> bool {
    f.n_missing_chunks == 0 && f.n_missing_inner_chunks == 0 && !f.shape.contains(&0)
}

#[test]
fn gets_equal_the_reads_the_local_engine_plans() {
    let Some(moto) = server() else { return };
    let mut checked = 0;
    for limits in [CoalesceLimits::OBJECT, CoalesceLimits::ADJACENT_ONLY] {
        for f in zcrop_fixtures::manifest().into_iter().filter(complete) {
            let object = ObjectEngine::open(
                &format!("s3://{BUCKET}"),
                &moto.storage_options(),
                ObjectConfig {
                    coalesce: limits,
                    ..ObjectConfig::default()
                },
            )
            .unwrap();
            let local = IoEngine::new(IoConfig {
                backend: BackendChoice::Portable,
                coalesce: limits,
                ..IoConfig::default()
            })
            .unwrap();
            let a = open(
                &f,
                &url(&f),
                &OpenOptions {
                    object_engine: Some(object.clone()),
                    ..OpenOptions::default()
                },
            );
            let l = open(
                &f,
                f.store_path().to_str().unwrap(),
                &OpenOptions {
                    engine: Some(local.clone()),
                    ..OpenOptions::default()
                },
            );
            let shape = a.shape().to_vec();
            let crop: Vec<u64> = shape.iter().map(|&s| s.div_ceil(3)).collect();
            let origins: Vec<u64> = [0u64, 1, 2]
                .iter()
                .flat_map(|&k| shape.iter().zip(&crop).map(move |(s, c)| (s - c) * k / 2))
                .collect();
            let (o0, l0) = (object.metrics(), local.metrics());
            let got = a.read_batch(&origins, &crop).unwrap();
            let want = l.read_batch(&origins, &crop).unwrap();
            assert_eq!(got, want, "{}", f.name);
            let (m, lm) = (object.metrics() - o0, local.metrics() - l0);
            assert_eq!(
                m.gets, lm.physical_reads,
                "{} ({limits:?}): GETs vs local reads: {m:?} {lm:?}",
                f.name
            );
            assert_eq!(m.http_gets, m.gets, "{}: GETs on the wire: {m:?}", f.name);
            assert_eq!(m.http_other, 0, "{}: {m:?}", f.name);
            checked += 1;
        }
    }
    assert!(checked > 10, "only {checked} fixtures checked");
}

#[test]
fn groups_list_members_and_use_consolidated_metadata() {
    let Some(moto) = server() else { return };
    let options = s3_options(moto);
    for store in [
        "data/v2_hierarchy_consolidated.zarr",
        "data/v3_hierarchy.zarr",
    ] {
        let remote = match zcrop_zarr::open_with(format!("s3://{BUCKET}/{store}"), &options) {
            Ok(Node::Group(g)) => g,
            other => panic!("{store}: {other:?}"),
        };
        let local = match zcrop_zarr::open(zcrop_fixtures::root().join(store)) {
            Ok(Node::Group(g)) => g,
            other => panic!("{store}: {other:?}"),
        };
        assert_eq!(
            remote.members().unwrap(),
            local.members().unwrap(),
            "{store}"
        );
        assert_eq!(remote.is_consolidated(), local.is_consolidated());
        assert_eq!(remote.uri(), format!("s3://{BUCKET}/{store}"));
        for (name, _) in local.members().unwrap() {
            let (r, l) = (remote.get(&name).unwrap(), local.get(&name).unwrap());
            assert_eq!(r.kind(), l.kind(), "{store}/{name}");
        }
    }
}

#[test]
fn an_array_opened_by_url_finds_its_parent_group() {
    let Some(moto) = server() else { return };
    let f = zcrop_fixtures::manifest()
        .into_iter()
        .find(|f| f.store.contains("v3_hierarchy") && !f.array_path.is_empty())
        .unwrap();
    let array_url = format!("{}/{}", url(&f), f.array_path);
    let a = Array::open_with(&array_url, &s3_options(moto)).unwrap();
    assert_eq!(a.uri(), array_url);
    let parent = a.parent().unwrap().expect("a parent group");
    let parent_dir = std::path::Path::new(&f.array_path)
        .parent()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let expected_parent = if parent_dir.is_empty() {
        url(&f)
    } else {
        format!("{}/{parent_dir}", url(&f))
    };
    assert_eq!(parent.uri(), expected_parent);
}

#[test]
fn storage_summaries_match_the_local_ones() {
    let Some(moto) = server() else { return };
    let options = s3_options(moto);
    for f in zcrop_fixtures::manifest() {
        let a = open(&f, &url(&f), &options);
        let l = open(
            &f,
            f.store_path().to_str().unwrap(),
            &OpenOptions::default(),
        );
        assert_eq!(
            a.storage_summary().unwrap(),
            l.storage_summary().unwrap(),
            "{}",
            f.name
        );
    }
}

#[test]
fn missing_stores_and_keys_give_typed_errors() {
    let Some(moto) = server() else { return };
    let options = s3_options(moto);
    match zcrop_zarr::open_with(format!("s3://{BUCKET}/no/such.zarr"), &options) {
        Err(ZarrError::NodeNotFound { path }) => {
            assert_eq!(path.to_str(), Some("s3://zcrop-fixtures/no/such.zarr"));
        }
        other => panic!("{other:?}"),
    }
    match zcrop_zarr::open_with(
        format!("s3://no-such-bucket-{}/x.zarr", moto.port()),
        &options,
    ) {
        Err(e) => assert!(e.is_not_found() || matches!(e, ZarrError::Io { .. }), "{e}"),
        Ok(n) => panic!("opened {n:?}"),
    }
    // Unsigned requests to the private bucket are denied: a typed IO error naming the key.
    let anon = OpenOptions {
        storage_options: vec![
            ("endpoint".into(), moto.endpoint()),
            ("anon".into(), "true".into()),
        ],
        ..OpenOptions::default()
    };
    match zcrop_zarr::open_with(format!("s3://{BUCKET}/data/v3_4d_i1.zarr"), &anon) {
        Err(ZarrError::Io { at, source }) => {
            assert_eq!(at.key, "data/v3_4d_i1.zarr/zarr.json");
            assert!(
                matches!(*source, zcrop_io::IoError::PermissionDenied { .. }),
                "{source}"
            );
            let msg = source.to_string();
            assert!(
                msg.contains("s3://zcrop-fixtures/data/v3_4d_i1.zarr/zarr.json"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Storage options on a local path, an unknown option and a bad URL.
    let f = zcrop_fixtures::manifest().remove(0);
    let err = zcrop_zarr::open_with(f.store_path(), &options).unwrap_err();
    assert!(matches!(err, ZarrError::InvalidArgument(_)), "{err}");
    let bad = OpenOptions {
        storage_options: vec![("colour".into(), "blue".into())],
        ..OpenOptions::default()
    };
    let err = zcrop_zarr::open_with(url(&f), &bad).unwrap_err();
    assert!(
        matches!(err, ZarrError::Engine(_)) && err.to_string().contains("colour"),
        "{err}"
    );
}

/// Copies the files under `from` to `to`, leaving out those `skip` says.
fn copy_tree(
    from: &std::path::Path,
    to: &std::path::Path,
    skip: &dyn Fn(&std::path::Path) -> bool,
) {
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let dest = to.join(path.file_name().unwrap());
        if path.is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_tree(&path, &dest, skip);
        } else if !skip(&path) {
            std::fs::copy(&path, &dest).unwrap();
        }
    }
}

#[test]
fn a_missing_shard_reads_as_fill_value() {
    let Some(moto) = server() else { return };
    let f = zcrop_fixtures::manifest()
        .into_iter()
        .find(|f| f.name == "v3_sharded_end")
        .unwrap();
    let local = Array::open(f.store_path()).unwrap();
    let key = local.storage_key(&vec![0; local.ndim()]);
    // The store without its first shard, in a bucket of its own.
    let dir = tempfile::tempdir().unwrap();
    let shard = f.store_path().join(&key);
    copy_tree(&f.store_path(), dir.path(), &|p| p == shard);
    moto.create_bucket("zcrop-missing-shard");
    moto.upload_dir("zcrop-missing-shard", "s", dir.path());
    let a = Array::open_with("s3://zcrop-missing-shard/s", &s3_options(moto)).unwrap();
    let region = a.storage_chunk_shape().to_vec();
    let got = a.read_region(&vec![0; a.ndim()], &region).unwrap();
    let fill = a.fill_value_bytes().to_vec();
    assert!(
        got.chunks(fill.len()).all(|e| e == fill),
        "a missing shard is fill value"
    );
    let summary = a.storage_summary().unwrap();
    assert_eq!(
        summary.storage_chunks_present + 1,
        local.storage_summary().unwrap().storage_chunks_present
    );
}

#[test]
fn read_many_over_s3_equals_the_local_reads() {
    let Some(moto) = server() else { return };
    let options = s3_options(moto);
    let fixtures: Vec<_> = zcrop_fixtures::manifest()
        .into_iter()
        .filter(|f| complete(f) && !f.shape.is_empty() && !f.shape.contains(&0))
        .take(6)
        .collect();
    let remote: Vec<Array> = fixtures
        .iter()
        .map(|f| open(f, &url(f), &options))
        .collect();
    let local: Vec<Array> = fixtures
        .iter()
        .map(|f| open(f, f.store_path().to_str().unwrap(), &OpenOptions::default()))
        .collect();
    let selections: Vec<Vec<Vec<zcrop_zarr::DimSelection>>> = remote
        .iter()
        .map(|a| {
            vec![
                a.shape()
                    .iter()
                    .map(|&s| zcrop_zarr::DimSelection::Range {
                        start: s / 3,
                        len: s - s / 3,
                    })
                    .collect(),
            ]
        })
        .collect();
    assert_eq!(
        read_many_outputs(&remote, &selections).unwrap(),
        read_many_outputs(&local, &selections).unwrap()
    );
}

/// A Zarr v2 array of float32 (4, 512, 640) in (1, 512, 640) chunks of 1.25 MiB, blosc lz4
/// with byte shuffle and a block size of 64 KiB asked for, uploaded under `prefix`; the values.
/// Rows and columns of the arrays [`upload_blosc_v2`] makes: one time step is a 1.3 MB chunk.
const BLOSC_YX: (u64, u64) = (512, 640);

/// Uploads a v2 array of `t` time steps of [`BLOSC_YX`] float32 values, one blosc-lz4 chunk of
/// 256 KiB blocks per step; returns its values.
fn upload_blosc_v2(moto: &Moto, bucket: &str, prefix: &str, t: usize) -> Vec<f32> {
    let values = blosc_values(t);
    let blocks = vec![65536; t];
    put_blosc_v2(moto, bucket, prefix, &values, &blocks);
    values
}

/// `t` time steps of [`BLOSC_YX`] values: smooth along rows, with a little noise.
fn blosc_values(t: usize) -> Vec<f32> {
    let (y, x) = (BLOSC_YX.0 as usize, BLOSC_YX.1 as usize);
    (0..t * y * x)
        .map(|i| ((i % x) as f32 * 0.01).sin() * 100.0 + (i * 7919 % 61) as f32 * 0.125)
        .collect()
}

/// Uploads a v2 array of `blocks.len()` time steps of [`BLOSC_YX`] float32 values under
/// `prefix`, one blosc-lz4 chunk per step compressed with the block size of `blocks[step]`
/// asked for, holding the step's `values` (where `blocks[step]` is 0 or `values` ends before
/// the step, its chunk is not stored).
fn put_blosc_v2(moto: &Moto, bucket: &str, prefix: &str, values: &[f32], blocks: &[usize]) {
    let (y, x) = (BLOSC_YX.0 as usize, BLOSC_YX.1 as usize);
    let t = blocks.len();
    moto.create_bucket(bucket);
    let zarray = serde_json::json!({
        "zarr_format": 2, "shape": [t, y, x], "chunks": [1, y, x], "dtype": "<f4",
        "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1,
                       "blocksize": 65536},
        "fill_value": 0.0, "order": "C", "filters": null
    });
    moto.put(
        bucket,
        &format!("{prefix}/.zarray"),
        zarray.to_string().as_bytes(),
    );
    for step in 0..t {
        if blocks[step] == 0 || values.len() < (step + 1) * y * x {
            continue;
        }
        let plain: Vec<u8> = values[step * y * x..(step + 1) * y * x]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let chunk = zcrop_codec::ffi::compress::blosc_compress(&plain, 4, 1, "lz4", blocks[step]);
        moto.put(bucket, &format!("{prefix}/{step}.0.0"), &chunk);
    }
}

/// The windows of `shape` at `origins` of an array [`upload_blosc_v2`] made of `values`.
fn blosc_windows(values: &[f32], origins: &[u64], shape: &[u64; 3]) -> Vec<u8> {
    let (y, x) = BLOSC_YX;
    origins
        .chunks(3)
        .flat_map(|o| {
            let mut crop = Vec::new();
            for t in o[0]..o[0] + shape[0] {
                for r in o[1]..o[1] + shape[1] {
                    let at = ((t * y + r) * x + o[2]) as usize;
                    crop.extend(
                        values[at..at + shape[2] as usize]
                            .iter()
                            .flat_map(|v| v.to_le_bytes()),
                    );
                }
            }
            crop
        })
        .collect()
}

/// Asserts that `part` times `k` read fewer chunk bytes than `whole` times `m`.
fn assert_read_less(part: &ReadStats, k: u64, whole: &ReadStats, m: u64) {
    assert!(
        part.chunk_bytes_read * k < whole.chunk_bytes_read * m,
        "{} bytes read (x{k}) against {} (x{m})",
        part.chunk_bytes_read,
        whole.chunk_bytes_read
    );
}

/// Opens the array [`upload_blosc_v2`] put in `bucket` with `options`.
fn open_blosc_v2(bucket: &str, options: &OpenOptions) -> Array {
    Array::open_with(format!("s3://{bucket}/era5.zarr"), options).unwrap()
}

/// Reads the windows of `shape` at `origins` of `a`, an array [`upload_blosc_v2`] made of
/// `values`, checks them and returns the read's stats.
fn read_blosc_windows(a: &Array, values: &[f32], origins: &[u64], shape: &[u64; 3]) -> ReadStats {
    let expected = blosc_windows(values, origins, shape);
    let mut out = vec![0u8; expected.len()];
    let stats = a
        .read_batch_into_with(origins, shape, &mut out, ReadOptions::default())
        .unwrap();
    assert!(out == expected, "windows at {origins:?}: values differ");
    stats
}

/// Windows of a large blosc chunk fetch only the blocks they need (after one header read per
/// chunk, then none: the header is cached) and give the values the whole chunks hold; with
/// `BlockFetch::Never` the chunks are fetched whole.
#[test]
fn windows_of_large_blosc_chunks_fetch_only_their_blocks() {
    let Some(moto) = server() else { return };
    let values = upload_blosc_v2(moto, "zcrop-blosc-blocks", "era5.zarr", 4);
    let url = "s3://zcrop-blosc-blocks/era5.zarr";
    let shape = [2u64, 64, 64];
    let origins = [0u64, 10, 20, 2, 300, 500];
    let expected = blosc_windows(&values, &origins, &shape);
    // Two reads of one array: the second finds the headers cached.
    let read = |options: &OpenOptions| {
        let a = Array::open_with(url, options).unwrap();
        let [first, second] = [1, 2].map(|n| {
            let mut out = vec![0u8; expected.len()];
            let stats = a
                .read_batch_into_with(&origins, &shape, &mut out, ReadOptions::default())
                .unwrap();
            assert!(
                out == expected,
                "read {n}: values differ from the whole chunks'"
            );
            stats
        });
        (first, second)
    };
    let with = |blosc_blocks| OpenOptions {
        blosc_blocks,
        // A cache would keep (so fetch whole) the chunks it has room for.
        chunk_cache_bytes: Some(0),
        ..s3_options(moto)
    };
    let (all, _) = read(&with(BlockFetch::Never));
    let (first, second) = read(&with(BlockFetch::Always));
    // Two windows of two time steps: four chunks.
    assert_eq!((all.chunks_decoded, first.chunks_decoded), (4, 4));
    assert_eq!(all.index_reads, 0);
    assert_eq!((first.index_reads, first.index_cache_hits), (4, 0));
    assert_eq!((second.index_reads, second.index_cache_hits), (0, 4));
    // c-blosc makes the blocks 256 KiB (64 KiB times the item size, as it does for split
    // blocks): a 64-row window needs one or two of a chunk's five.
    assert_read_less(&first, 2, &all, 1);
    assert_eq!(first.chunk_bytes_read, second.chunk_bytes_read);
}

/// Opens the array [`upload_blosc_v2`] put in `bucket` with the defaults of reading by block
/// (`BlockFetch::Auto`) and no chunk cache (which would fetch whole the chunks it keeps).
fn open_blosc_v2_uncached(moto: &Moto, bucket: &str) -> Array {
    let options = OpenOptions {
        blosc_blocks: BlockFetch::Auto,
        chunk_cache_bytes: Some(0),
        ..s3_options(moto)
    };
    open_blosc_v2(bucket, &options)
}

/// A read alone on the link fetches large blosc chunks whole (`BlockFetch::Auto`), and keeps
/// the headers it got with them: a later read of those chunks fetches only its blocks, with
/// no round trip for the headers. Chunks not read before are then fetched by block where the
/// array's other chunks keep those blocks: the header and a range around them, in one round
/// trip; their headers stay for later reads too.
#[test]
fn headers_of_chunks_read_whole_serve_later_reads_and_guesses() {
    let Some(moto) = server() else { return };
    let values = upload_blosc_v2(moto, "zcrop-blosc-headers", "era5.zarr", 6);
    let a = open_blosc_v2_uncached(moto, "zcrop-blosc-headers");
    let read = |origins: &[u64]| read_blosc_windows(&a, &values, origins, &[2, 64, 64]);
    let whole = read(&[0, 10, 20]);
    assert_eq!((whole.index_reads, whole.index_cache_hits), (0, 0));
    assert_eq!((whole.chunks_decoded, whole.block_guesses), (2, 0));
    // The same chunks, other rows: their blocks only, headers from the cache.
    let blocks = read(&[0, 300, 500]);
    assert_eq!((blocks.index_reads, blocks.index_cache_hits), (0, 2));
    assert_read_less(&blocks, 2, &whole, 1);
    // Four chunks never read, at rows in the first and last blocks.
    let guessed = read(&[2, 0, 10, 4, 440, 570]);
    assert_eq!(guessed.chunks_decoded, 4);
    assert_eq!(
        (guessed.block_guesses, guessed.block_guess_misses),
        (4, 0),
        "{guessed:?}"
    );
    assert_eq!((guessed.index_reads, guessed.index_cache_hits), (4, 0));
    // Four chunks' blocks, fewer bytes than two whole chunks.
    assert_read_less(&guessed, 1, &whole, 1);
    // Their headers are kept: other rows of them read only their blocks.
    let again = read(&[2, 300, 0, 4, 0, 0]);
    assert_eq!(
        (
            again.index_reads,
            again.index_cache_hits,
            again.block_guesses
        ),
        (0, 4, 0)
    );
}

/// Chunks unlike those seen before: blocks outside the guessed range (fetched again by
/// block), a chunk shorter than the range (asked past its end: fetched again, not an error),
/// a chunk whose header is damaged (fetched whole: a typed error naming it) and a chunk not
/// stored (fill value). Every read gives the stored values.
#[test]
fn chunks_unlike_the_others_are_fetched_again_never_misread() {
    let Some(moto) = server() else { return };
    let (y, x) = (BLOSC_YX.0 as usize, BLOSC_YX.1 as usize);
    let step = y * x;
    // Step 0 is as `upload_blosc_v2` makes them; step 1 is noise in the low bits (blocks
    // about half as long as their data, against a quarter); step 2 is constant (a few bytes a
    // block); step 3 is step 0's chunk with a damaged header; step 4 is not stored.
    let mut values: Vec<f32> = (0..5 * step)
        .map(|i| {
            let h = (i as u64 ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) >> 32;
            match i / step {
                1 => f32::from_bits((h as u32 & 0x007F_FFFF) | 0x3F80_0000),
                2 => 7.5,
                _ => ((i % x) as f32 * 0.01).sin() * 100.0 + (i * 7919 % 61) as f32 * 0.125,
            }
        })
        .collect();
    let bucket = "zcrop-blosc-unlike";
    put_blosc_v2(
        moto,
        bucket,
        "era5.zarr",
        &values,
        &[65536, 65536, 65536, 0, 0],
    );
    let plain: Vec<u8> = values[..step]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut damaged = zcrop_codec::ffi::compress::blosc_compress(&plain, 4, 1, "lz4", 65536);
    damaged[0] = 9;
    moto.put(bucket, "era5.zarr/3.0.0", &damaged);
    values[4 * step..].fill(0.0);
    let a = open_blosc_v2_uncached(moto, bucket);
    let read = |origins: &[u64]| read_blosc_windows(&a, &values, origins, &[1, 64, 64]);
    // Each case reads step 0 first, alone (whole), to learn where its blocks are from it.
    let after_step_0 = |origins: &[u64]| {
        a.clear_caches();
        read(&[0, 300, 500]);
        read(origins)
    };
    // Step 2 ends before the range guessed for its rows.
    let short = after_step_0(&[2, 300, 100]);
    assert_eq!(
        (short.block_guesses, short.block_guess_misses),
        (1, 1),
        "{short:?}"
    );
    // Step 1's blocks lie far past where step 0's do.
    let far = after_step_0(&[1, 400, 100]);
    assert_eq!(
        (far.block_guesses, far.block_guess_misses),
        (1, 1),
        "{far:?}"
    );
    // Step 3's header does not parse: the chunk is fetched whole, and its decoder names it.
    a.clear_caches();
    read(&[0, 300, 500]);
    let mut out = vec![0u8; 64 * 64 * 4];
    match a.read_batch_into_with(
        &[3, 200, 100],
        &[1, 64, 64],
        &mut out,
        ReadOptions::default(),
    ) {
        Err(ZarrError::Codec { at, .. }) => assert_eq!(at.key, "3.0.0"),
        other => panic!("a damaged chunk read as {other:?}"),
    }
    let missing = after_step_0(&[4, 200, 100]);
    assert_eq!(
        (missing.block_guesses, missing.chunks_missing),
        (1, 1),
        "{missing:?}"
    );
}

/// The process-wide cache keeps large blosc chunks (read by block otherwise) of an array too
/// large for it only once the reads show it would serve enough of them: two chunks read again
/// and again are fetched by block for the first few hundred reads, then whole once, then
/// served from the cache.
#[test]
fn the_shared_cache_takes_large_blosc_chunks_once_it_would_serve_them() {
    let Some(moto) = server() else { return };
    // 4096 steps of about a megabyte stored: more than the cache holds (4 of them stored).
    let values = blosc_values(4);
    let mut blocks = vec![0; 4096];
    blocks[..4].fill(65536);
    put_blosc_v2(moto, "zcrop-blosc-shared", "era5.zarr", &values, &blocks);
    let a = open_blosc_v2(
        "zcrop-blosc-shared",
        &OpenOptions {
            blosc_blocks: BlockFetch::Always,
            ..s3_options(moto)
        },
    );
    let (budget, shared) = a.chunk_cache().unwrap();
    assert!(shared);
    let (mut fetched_whole, mut kept_at) = (None, None);
    for i in 1..400 {
        let stats = read_blosc_windows(&a, &values, &[1, 100, 200], &[2, 64, 64]);
        if stats.chunks_cached == 2 {
            kept_at = Some(i);
            break;
        }
        assert_eq!(stats.chunks_cached, 0, "read {i}: {stats:?}");
        // Until the cache takes them, reads fetch their blocks; the read that keeps them
        // fetches them whole, and keeps them as fetched (no chunk decoded whole).
        let by_block = stats.index_reads + stats.index_cache_hits;
        assert_eq!(stats.whole_chunks.total(), 0, "read {i}: {stats:?}");
        if by_block == 0 && fetched_whole.is_none() {
            fetched_whole = Some(i);
        } else {
            assert_eq!(by_block, 2, "read {i}: {stats:?}");
        }
    }
    let kept_at = kept_at.expect("kept within 400 reads");
    assert_eq!(fetched_whole, Some(kept_at - 1));
    // Served from the cache: nothing fetched, the needed blocks decoded from what it keeps.
    let served = read_blosc_windows(&a, &values, &[1, 300, 100], &[2, 64, 64]);
    assert_eq!(
        (
            served.chunks_cached,
            served.chunks_decoded,
            served.chunk_bytes_read
        ),
        (2, 2, 0),
        "{served:?}"
    );
    assert_eq!(served.index_reads + served.index_cache_hits, 0);
    // Each read counts two chunk reads; the hit share is judged after twice as many as the
    // cache holds chunks (within 128..=512), and the next read fetches them whole.
    let chunk = (BLOSC_YX.0 * BLOSC_YX.1 * 4) as usize;
    let judged = (2 * budget / chunk).clamp(128, 512) / 2;
    assert!(
        (judged + 2..=judged + 8).contains(&kept_at),
        "kept at read {kept_at}, judged after {judged}"
    );
}

/// The process-wide cache keeps the large blosc chunks of an array it holds whole (its chunk
/// count times the stored size of those seen) from the first read: that read fetches them
/// whole, the next ones fetch nothing.
#[test]
fn the_shared_cache_keeps_an_array_that_fits_from_its_first_read() {
    let Some(moto) = server() else { return };
    let values = upload_blosc_v2(moto, "zcrop-blosc-fits", "era5.zarr", 4);
    let a = open_blosc_v2("zcrop-blosc-fits", &s3_options(moto));
    assert!(a.chunk_cache().unwrap().1, "the process-wide cache");
    let first = read_blosc_windows(&a, &values, &[1, 100, 200], &[2, 64, 64]);
    assert_eq!(first.chunks_cached, 0, "{first:?}");
    assert_eq!(first.index_reads + first.index_cache_hits, 0, "{first:?}");
    for origin in [[1, 300, 100], [1, 0, 500]] {
        let served = read_blosc_windows(&a, &values, &origin, &[2, 64, 64]);
        assert_eq!(
            (served.chunks_cached, served.chunk_bytes_read),
            (2, 0),
            "{served:?}"
        );
    }
    // Steps 0 and 3, not read yet, are fetched whole and kept too (no block guess); steps 1
    // and 2 come from the cache.
    let rest = read_blosc_windows(&a, &values, &[0, 10, 10, 2, 10, 10], &[2, 64, 64]);
    assert_eq!((rest.chunks_cached, rest.block_guesses), (2, 0), "{rest:?}");
    assert!(rest.chunk_bytes_read > 2 * 200_000, "{rest:?}");
    let served = read_blosc_windows(&a, &values, &[0, 400, 0], &[4, 64, 64]);
    assert_eq!(served.chunks_cached, 4, "{served:?}");
}

/// A chunk cache keeps large blosc chunks from an object store as they were fetched: the
/// chunks it keeps are fetched whole (the others by block), none is decoded whole, and reads
/// of kept chunks fetch nothing and decode the blocks they need from the cache.
#[test]
fn a_chunk_cache_keeps_large_blosc_chunks_as_fetched() {
    let Some(moto) = server() else { return };
    let values = upload_blosc_v2(moto, "zcrop-blosc-cache", "era5.zarr", 8);
    let chunk = (BLOSC_YX.0 * BLOSC_YX.1 * 4) as usize;
    let a = open_blosc_v2(
        "zcrop-blosc-cache",
        &OpenOptions {
            blosc_blocks: BlockFetch::Always,
            // Room for four decoded chunks, the fewest a cache takes.
            chunk_cache_bytes: Some(4 * chunk),
            ..s3_options(moto)
        },
    );
    let read = |t0: u64, y: u64| read_blosc_windows(&a, &values, &[t0, y, 200], &[4, 64, 64]);
    // Steps 0-3 fill the cache: fetched whole, kept as fetched.
    let fill = read(0, 100);
    assert_eq!((fill.chunks_cached, fill.index_reads), (0, 0), "{fill:?}");
    assert_eq!(fill.whole_chunks.total(), 0, "{fill:?}");
    // Other rows of them: from the cache, nothing fetched.
    let kept = read(0, 400);
    assert_eq!(
        (
            kept.chunks_cached,
            kept.chunks_decoded,
            kept.chunk_bytes_read
        ),
        (4, 4, 0),
        "{kept:?}"
    );
    // The encoded chunks took less of the budget than decoded ones would have: steps 4-7
    // still find room.
    let more = read(4, 100);
    assert_eq!((more.chunks_cached, more.index_reads), (0, 0), "{more:?}");
    let all = read(4, 0);
    assert_eq!(all.chunks_cached, 4, "{all:?}");
}

/// A chunk the cache keeps as fetched is decoded anew on every read: a damaged block that the
/// reads before did not need is an error naming the chunk once a read needs it, never other
/// bytes.
#[test]
fn a_kept_chunk_with_a_damaged_block_fails_when_that_block_is_read() {
    let Some(moto) = server() else { return };
    let bucket = "zcrop-blosc-kept-damaged";
    let values = blosc_values(1);
    // The metadata only; then the chunk, its last block's first split claiming more bytes
    // than the chunk holds.
    put_blosc_v2(moto, bucket, "era5.zarr", &values, &[0]);
    let plain: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut chunk = zcrop_codec::ffi::compress::blosc_compress(&plain, 4, 1, "lz4", 65536);
    let prefix = &chunk[..zcrop_codec::blosc::BlockIndex::prefix_len(plain.len())];
    let index = zcrop_codec::blosc::BlockIndex::parse(prefix, plain.len()).unwrap();
    let last = index.extents().last().unwrap().start;
    chunk[last..last + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    moto.put(bucket, "era5.zarr/0.0.0", &chunk);
    let a = open_blosc_v2(
        bucket,
        &OpenOptions {
            blosc_blocks: BlockFetch::Always,
            chunk_cache_bytes: Some(4 * plain.len()),
            ..s3_options(moto)
        },
    );
    let shape = [1, 64, 64];
    read_blosc_windows(&a, &values, &[0, 0, 0], &shape);
    let kept = read_blosc_windows(&a, &values, &[0, 10, 300], &shape);
    assert_eq!(
        (kept.chunks_cached, kept.chunk_bytes_read),
        (1, 0),
        "{kept:?}"
    );
    let mut out = vec![0u8; 64 * 64 * 4];
    match a.read_batch_into_with(&[0, 440, 0], &shape, &mut out, ReadOptions::default()) {
        Err(ZarrError::Codec { at, .. }) => assert_eq!(at.key, "0.0.0"),
        other => panic!("a damaged block read as {other:?}"),
    }
}
