//! Helpers shared by the sampler's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::Arc;

use zcrop_sampler::{Dim, SampleSpec, Source, Transform};
use zcrop_zarr::{Array, Node};

/// Opens fixture `name` and returns it with its expected native-endian C-order bytes and shape.
pub fn fixture(name: &str) -> (Array, Vec<u8>, Vec<u64>) {
    let f = zcrop_fixtures::get(name);
    let array = match zcrop_zarr::open(f.store_path()).unwrap() {
        Node::Array(a) => a,
        Node::Group(g) => match g.get(&f.array_path).unwrap() {
            Node::Array(a) => a,
            Node::Group(_) => panic!("{name} is a group"),
        },
    };
    let npy = f.expected().unwrap();
    let data = npy.native_c_order().unwrap();
    (array, data, npy.shape.clone())
}

/// The region of `rshape` at `origin` of a C-order array of `shape` with `es`-byte elements.
pub fn region(data: &[u8], shape: &[u64], es: usize, origin: &[u64], rshape: &[u64]) -> Vec<u8> {
    strided(data, shape, es, origin, rshape, &vec![1; shape.len()])
}

/// `data[origin + i * every]` for `i` over `crop`, of a C-order array of `shape` with `es`-byte
/// elements.
pub fn strided(
    data: &[u8],
    shape: &[u64],
    es: usize,
    origin: &[u64],
    crop: &[u64],
    every: &[u64],
) -> Vec<u8> {
    let nd = shape.len();
    let mut strides = vec![1u64; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let n: u64 = crop.iter().product();
    let mut out = Vec::with_capacity(n as usize * es);
    let mut idx = vec![0u64; nd];
    for _ in 0..n {
        let lin: u64 = (0..nd)
            .map(|d| (origin[d] + idx[d] * every[d]) * strides[d])
            .sum();
        let lin = lin as usize;
        out.extend_from_slice(&data[lin * es..(lin + 1) * es]);
        for d in (0..nd).rev() {
            idx[d] += 1;
            if idx[d] < crop[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Three sources from two stores with different chunkings and dtypes, on a shared (t, y, x)
/// position grid: the (t, c, y, x) workload array, a 4x coarser image with jitter, and int32
/// labels on the coarse grid converted to float32.
pub fn three_sources() -> SampleSpec {
    let (sat, _, _) = fixture("v3_workload_4d_u2");
    let (coarse, _, _) = fixture("v3_hierarchy__images__raw");
    let (labels, _, _) = fixture("v3_hierarchy__images__labels");
    SampleSpec::new(["t", "y", "x"])
        .source(Source::new("sat", sat, [2, 3, 16, 16]))
        .source(Source::new("coarse", coarse, [2, 5, 5]).dims([
            Dim::fixed(1),
            Dim::along("y").scale(1, 4).offset(1).jitter(1),
            Dim::along("x").scale(1, 4).jitter(2),
        ]))
        .source(
            Source::new("labels", labels, [4, 4])
                .dims([Dim::along("y").scale(1, 4), Dim::along("x").scale(1, 4)])
                .transform(Transform::to_f32()),
        )
}

/// Writes a v3 array (uncompressed, `chunks`) at `path` inside the store at `store`, with
/// `data` (native-endian C order) of v3 type `dtype`.
#[allow(clippy::too_many_arguments)]
pub fn write_v3(
    store: &Path,
    path: &str,
    shape: &[u64],
    chunks: &[u64],
    dtype: &str,
    data: &[u8],
    dimension_names: Option<&[&str]>,
    attributes: serde_json::Map<String, serde_json::Value>,
) {
    use zarrs::array::{ArrayBuilder, DataType, FillValue};
    let fs = Arc::new(zarrs::filesystem::FilesystemStore::new(store).unwrap());
    let dt = DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new(dtype)).unwrap();
    let es = dt.fixed_size().unwrap();
    let mut b = ArrayBuilder::new(
        shape.to_vec(),
        chunks.to_vec(),
        dt,
        FillValue::new(vec![0u8; es]),
    );
    b.attributes(attributes);
    if let Some(names) = dimension_names {
        b.dimension_names(Some(names.iter().copied()));
    }
    let a = b.build(fs, path).unwrap();
    a.store_metadata().unwrap();
    let subset = zarrs::array::ArraySubset::new_with_shape(shape.to_vec());
    a.store_array_subset(&subset, zarrs::array::ArrayBytes::new_flen(data))
        .unwrap();
}

/// Writes a v3 group's metadata at `path` of the store at `store`.
pub fn write_group(store: &Path, path: &str) {
    let fs = Arc::new(zarrs::filesystem::FilesystemStore::new(store).unwrap());
    zarrs::group::GroupBuilder::new()
        .build(fs, path)
        .unwrap()
        .store_metadata()
        .unwrap();
}

/// A sample's origin in a source without padding (every number is `>= 0`), as `u64`s.
#[allow(dead_code)]
pub fn unsigned(origin: &[i64]) -> Vec<u64> {
    origin
        .iter()
        .map(|&o| u64::try_from(o).expect("an origin inside the array"))
        .collect()
}
