//! What the fuzz targets share: the fixtures' arrays, opened once.

use std::sync::OnceLock;

use zcrop_zarr::Array;

/// Every fixture array at the root of its store (those that open).
pub fn root_arrays() -> &'static Vec<Array> {
    static A: OnceLock<Vec<Array>> = OnceLock::new();
    A.get_or_init(|| {
        zcrop_fixtures::manifest()
            .iter()
            .filter(|f| f.array_path.is_empty())
            .filter_map(|f| Array::open(f.store_path()).ok())
            .collect()
    })
}
