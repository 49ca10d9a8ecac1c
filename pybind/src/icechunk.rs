//! Icechunk repositories (`zcrop.open_icechunk`): one snapshot, read-only, its arrays read
//! through zcrop's planner.

use std::path::PathBuf;

use pyo3::prelude::*;
use zcrop::zarr::icechunk::{IcechunkSnapshot, Version};

use crate::array::NativeArray;
use crate::blocking::{self, Failure};
use crate::group::{cache_bytes, open_options};

/// One snapshot of an Icechunk repository.
#[pyclass(module = "zcrop._zcrop", frozen)]
pub(crate) struct NativeIcechunk {
    inner: IcechunkSnapshot,
}

/// Opens the snapshot that `branch`, `tag` or `snapshot` (at most one; default: branch
/// `main`) names in the repository at `path` (a local path or a URL).
#[pyfunction]
#[pyo3(signature = (path, branch=None, tag=None, snapshot=None, storage_options=None, chunk_cache=None))]
#[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments by value
pub(crate) fn open_icechunk(
    py: Python<'_>,
    path: PathBuf,
    branch: Option<String>,
    tag: Option<String>,
    snapshot: Option<String>,
    storage_options: Option<Vec<(String, String)>>,
    chunk_cache: Option<Bound<'_, PyAny>>,
) -> PyResult<NativeIcechunk> {
    let version = match (branch, tag, snapshot) {
        (b, None, None) => Version::Branch(b.unwrap_or_else(|| "main".into())),
        (None, Some(t), None) => Version::Tag(t),
        (None, None, Some(s)) => Version::Snapshot(s),
        _ => {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "give at most one of branch=, tag= and snapshot=",
            ));
        }
    };
    let options = open_options(storage_options, cache_bytes(chunk_cache.as_ref())?);
    let inner = blocking::run(py, 0, |_| {
        IcechunkSnapshot::open(&path, &version, &options).map_err(Failure::from)
    })?;
    Ok(NativeIcechunk { inner })
}

#[pymethods]
impl NativeIcechunk {
    /// The snapshot's id.
    #[getter]
    fn id(&self) -> &str {
        self.inner.id()
    }

    /// Every node's path and whether it is an array, in path order.
    fn nodes(&self) -> Vec<(String, bool)> {
        self.inner.nodes()
    }

    /// The array at `path`.
    fn array(&self, py: Python<'_>, path: &str) -> PyResult<NativeArray> {
        let inner = blocking::run(py, 0, |_| self.inner.array(path).map_err(Failure::from))?;
        Ok(NativeArray { inner })
    }
}
