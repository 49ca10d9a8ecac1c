//! Helpers shared by zarr-front's integration tests.
#![allow(dead_code, unreachable_pub)]

use zcrop_io::{BackendChoice, IoConfig, IoEngine, MapFiles};
use zcrop_zarr::{Array, DimSelection, OpenOptions};

/// An engine per backend that only reads, and one that serves every chunk read from file
/// mappings, so every read path is tested through each. (The default policy maps only files of
/// 1 MiB or more, larger than any fixture.)
pub fn engines() -> Vec<(&'static str, IoEngine)> {
    [
        ("uring", BackendChoice::Uring, MapFiles::Never),
        ("portable", BackendChoice::Portable, MapFiles::Never),
        ("mmap", BackendChoice::Uring, MapFiles::Always),
    ]
    .into_iter()
    .map(|(name, backend, map_files)| {
        let e = IoEngine::new(IoConfig {
            backend,
            threads: 2,
            map_files,
            ..IoConfig::default()
        })
        .unwrap();
        (name, e)
    })
    .collect()
}

/// Opens fixture `f` with `engine`.
pub fn open(f: &zcrop_fixtures::Fixture, engine: &IoEngine) -> Array {
    let options = OpenOptions {
        engine: Some(engine.clone()),
        ..OpenOptions::default()
    };
    let node = zcrop_zarr::open_with(f.store_path(), &options)
        .unwrap_or_else(|e| panic!("{}: {e}", f.name));
    match node {
        zcrop_zarr::Node::Array(a) if f.array_path.is_empty() => a,
        zcrop_zarr::Node::Group(g) => match g
            .get(&f.array_path)
            .unwrap_or_else(|e| panic!("{}: {e}", f.name))
        {
            zcrop_zarr::Node::Array(a) => a,
            zcrop_zarr::Node::Group(_) => panic!("{}: a group", f.name),
        },
        zcrop_zarr::Node::Array(_) => panic!("{}: expected a group at the store root", f.name),
    }
}

/// The expected array of `f`: native-endian C-order bytes, shape, element size.
pub fn expected(f: &zcrop_fixtures::Fixture) -> (Vec<u8>, Vec<u64>, usize) {
    let npy = f.expected().unwrap();
    let es = npy.item_size().unwrap();
    (npy.native_c_order().unwrap(), npy.shape.clone(), es)
}

/// Elements of `data` (C order, `shape`) at the cartesian product of `index` lists.
pub fn gather(data: &[u8], shape: &[u64], es: usize, index: &[Vec<u64>]) -> Vec<u8> {
    let nd = shape.len();
    let mut strides = vec![1u64; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let n: usize = index.iter().map(Vec::len).product();
    let mut out = Vec::with_capacity(n * es);
    for i in 0..n {
        let mut rem = i;
        let mut lin = 0u64;
        for d in (0..nd).rev() {
            let len = index[d].len();
            lin += index[d][rem % len] * strides[d];
            rem /= len;
        }
        let lin = lin as usize;
        out.extend_from_slice(&data[lin * es..(lin + 1) * es]);
    }
    out
}

/// The region of `rshape` at `origin`.
pub fn region(data: &[u8], shape: &[u64], es: usize, origin: &[u64], rshape: &[u64]) -> Vec<u8> {
    let index: Vec<Vec<u64>> = origin
        .iter()
        .zip(rshape)
        .map(|(&o, &n)| (o..o + n).collect())
        .collect();
    gather(data, shape, es, &index)
}

/// Bitwise equality that names the first difference (NaN-safe: compares bytes).
pub fn assert_same(got: &[u8], want: &[u8], es: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        let el = i / es;
        panic!(
            "{what}: element {el} differs: got {:?}, want {:?}",
            &got[el * es..(el + 1) * es],
            &want[el * es..(el + 1) * es]
        );
    }
}

/// A batch of 10 crops of `(1, 3, 60, 80)` over `v3_workload_4d_u2` (shape `[6, 3, 70, 90]`,
/// inner chunks `[1, 1, 16, 16]`) that needs all 540 of its chunks: more than twice the 256 a
/// large local read locates and submits first, on their own. The first six cover one time
/// step each; the other four overlap them.
pub fn large_batch() -> ([u64; 4], Vec<u64>) {
    let mut origins = Vec::new();
    for t in 0..6u64 {
        origins.extend([t, 0, 5 + t % 2, 7 + t % 3]);
    }
    origins.extend([2, 0, 0, 0, 4, 0, 10, 10, 0, 0, 3, 1, 5, 0, 8, 2]);
    ([1, 3, 60, 80], origins)
}

/// Copies a fixture store into a temp dir.
pub fn copy_store(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let f = zcrop_fixtures::get(name);
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("store.zarr");
    zcrop_fixtures::copy_tree(&f.store_path(), &dst);
    (dir, dst)
}

/// Reads `selections[k]` of `arrays[k]` for every `k` with one `read_many`; the outputs.
#[allow(dead_code)] // not every test file reads several arrays
pub fn read_many_outputs(
    arrays: &[Array],
    selections: &[Vec<Vec<DimSelection>>],
) -> zcrop_zarr::Result<Vec<Vec<u8>>> {
    let mut outs: Vec<Vec<u8>> = arrays
        .iter()
        .zip(selections)
        .map(|(a, s)| vec![0xAB; a.output_len(s, a.element_size()).unwrap()])
        .collect();
    let parts = arrays
        .iter()
        .zip(selections)
        .zip(outs.iter_mut())
        .map(|((array, selections), out)| zcrop_zarr::ReadPart {
            array,
            selections,
            out,
            options: zcrop_zarr::ReadOptions::default(),
        })
        .collect();
    zcrop_zarr::read_many(parts)?;
    Ok(outs)
}
