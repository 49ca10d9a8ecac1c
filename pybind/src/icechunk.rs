//! Icechunk repositories (`zcrop.open_icechunk`): one snapshot, read-only, its arrays read
//! through zcrop's planner.

use std::path::PathBuf;

use pyo3::prelude::*;
use zcrop::zarr::icechunk::{IcechunkSnapshot, Version, VirtualContainer};

use crate::array::NativeArray;
use crate::blocking::{self, Failure};
use crate::group::{cache_bytes, node_into_py, open_options};

/// Storage options as `(key, value)` pairs.
type Pairs = Vec<(String, String)>;

/// One snapshot of an Icechunk repository.
#[pyclass(module = "zcrop._zcrop", frozen)]
pub(crate) struct NativeIcechunk {
    inner: IcechunkSnapshot,
}

/// Opens the snapshot that `branch`, `tag` or `snapshot` (at most one; default: branch
/// `main`) names in the repository at `path` (a local path or a URL). Virtual chunks are read
/// from under the URL prefixes of `virtual_chunk_containers` (with their storage options).
#[pyfunction]
#[pyo3(signature = (path, branch=None, tag=None, snapshot=None, storage_options=None, chunk_cache=None, virtual_chunk_containers=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
#[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments by value
pub(crate) fn open_icechunk(
    py: Python<'_>,
    path: PathBuf,
    branch: Option<String>,
    tag: Option<String>,
    snapshot: Option<String>,
    storage_options: Option<Pairs>,
    chunk_cache: Option<Bound<'_, PyAny>>,
    virtual_chunk_containers: Option<Vec<(String, Pairs)>>,
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
    let containers = virtual_chunk_containers
        .unwrap_or_default()
        .into_iter()
        .map(|(url_prefix, storage_options)| VirtualContainer {
            url_prefix,
            storage_options,
        })
        .collect();
    let inner = blocking::run(py, 0, |_| {
        IcechunkSnapshot::open(&path, &version, &options, containers).map_err(Failure::from)
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

    /// Where the repository is: its directory, or its URL.
    #[getter]
    fn uri(&self) -> String {
        self.inner.uri()
    }

    /// The array at `path`.
    fn array(&self, py: Python<'_>, path: &str) -> PyResult<NativeArray> {
        let inner = blocking::run(py, 0, |_| self.inner.array(path).map_err(Failure::from))?;
        Ok(NativeArray { inner })
    }

    /// The node (a `NativeArray` or a `NativeGroup`) at `path` (`""` for the root group).
    fn get<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let node = blocking::run(py, 0, |_| self.inner.get(path).map_err(Failure::from))?;
        node_into_py(py, node)
    }
}

/// Where the repository of a serialized icechunk `Session` is: `(path or URL, storage
/// options)`.
#[pyfunction]
pub(crate) fn icechunk_session_repository(
    py: Python<'_>,
    session: &[u8],
) -> PyResult<(String, Pairs)> {
    let found = zcrop::zarr::icechunk::session_repository(session)
        .map_err(|e| crate::errors::to_pyerr(py, &e))?;
    Ok((found.location, found.storage_options))
}
