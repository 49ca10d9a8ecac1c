//! `NativeGroup`: the Rust group handle behind `zcrop.Group`, and opening nodes.

use std::path::PathBuf;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use zcrop::zarr::{Group, Node, NodeKind, OpenOptions};

use crate::array::NativeArray;
use crate::background::{self, Pending};
use crate::blocking::{self, Failure};

/// An opened Zarr group (the Rust side of `zcrop.Group`).
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct NativeGroup {
    inner: Group,
}

/// A node as Python gets it: a `NativeArray` or a `NativeGroup`.
pub(crate) fn node_into_py(py: Python<'_>, node: Node) -> PyResult<Bound<'_, PyAny>> {
    Ok(match node {
        Node::Array(inner) => Bound::new(py, NativeArray { inner })?.into_any(),
        Node::Group(inner) => Bound::new(py, NativeGroup { inner })?.into_any(),
    })
}

fn kind_name(kind: NodeKind) -> &'static str {
    match kind {
        NodeKind::Array => "array",
        NodeKind::Group => "group",
    }
}

#[pymethods]
impl NativeGroup {
    /// The group's path in its store (`/` for the root).
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The group's path relative to the store root.
    #[getter]
    fn path(&self) -> &str {
        self.inner.path()
    }

    /// 2 or 3.
    #[getter]
    fn zarr_format(&self) -> u8 {
        self.inner.zarr_format()
    }

    /// The attributes, as a JSON text.
    #[getter]
    fn attributes_json(&self) -> String {
        serde_json::Value::Object(self.inner.attributes().clone()).to_string()
    }

    /// Where the group is: its directory, or its URL.
    #[getter]
    fn uri(&self) -> String {
        self.inner.uri()
    }

    /// Whether the group's metadata is consolidated.
    #[getter]
    fn is_consolidated(&self) -> bool {
        self.inner.is_consolidated()
    }

    /// Keys of the consolidated metadata left out because no member can have them.
    #[getter]
    fn skipped_consolidated_keys(&self) -> Vec<String> {
        self.inner.skipped_consolidated_keys().to_vec()
    }

    /// Opens the member at `path` (a name or a `/`-separated path).
    fn get<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyAny>> {
        let node = blocking::run(py, 0, |_| self.inner.get(path).map_err(Failure::from))?;
        node_into_py(py, node)
    }

    /// The direct members: `(name, "array" | "group")`, sorted by name.
    fn members(&self, py: Python<'_>) -> PyResult<Vec<(String, &'static str)>> {
        let members = blocking::run(py, 0, |_| self.inner.members().map_err(Failure::from))?;
        Ok(members
            .into_iter()
            .map(|(name, kind)| (name, kind_name(kind)))
            .collect())
    }

    /// [`NativeGroup::get`] in the background; `notify(error, node)` when done.
    fn submit_get(&self, path: String, notify: Py<PyAny>) -> PyResult<Pending> {
        let group = self.inner.clone();
        background::submit(
            notify,
            move |_| group.get(&path).map_err(Failure::from),
            node_into_py,
        )
    }

    /// [`NativeGroup::members`] in the background; `notify(error, [(name, kind), ...])`.
    fn submit_members(&self, notify: Py<PyAny>) -> PyResult<Pending> {
        let group = self.inner.clone();
        background::submit(
            notify,
            move |_| group.members().map_err(Failure::from),
            |py, members| {
                let list: Vec<(String, &'static str)> = members
                    .into_iter()
                    .map(|(name, kind)| (name, kind_name(kind)))
                    .collect();
                list.into_pyobject(py).map(Bound::into_any)
            },
        )
    }

    fn __repr__(&self) -> String {
        format!("NativeGroup(name={:?})", self.inner.name())
    }
}

/// Open options with `storage_options` (`(key, value)` pairs, for a URL) and a decoded-chunk
/// cache of the array's own of `chunk_cache` bytes (`0`: none; `None`: the process-wide one).
pub(crate) fn open_options(
    storage_options: Option<Vec<(String, String)>>,
    chunk_cache: Option<usize>,
) -> OpenOptions {
    OpenOptions {
        storage_options: storage_options.unwrap_or_default(),
        chunk_cache_bytes: chunk_cache,
        ..OpenOptions::default()
    }
}

/// The process-wide decoded-chunk cache: `(bytes held, budget)`; `None` where it is off.
/// A `ZCROP_CHUNK_CACHE` that does not parse is an error.
#[pyfunction]
pub(crate) fn chunk_cache_usage(py: Python<'_>) -> PyResult<Option<(usize, usize)>> {
    zcrop::zarr::shared_chunk_cache_budget().map_err(|e| crate::errors::to_pyerr(py, &e))?;
    Ok(zcrop::zarr::shared_chunk_cache_usage())
}

/// A cache budget given as bytes (an int) or a size (`"512M"`, `"2G"`); `None` is the
/// process-wide cache.
pub(crate) fn cache_bytes(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<usize>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    if let Ok(text) = value.extract::<String>() {
        let bytes = zcrop::io::parse_size(&text)
            .map_err(|e| PyValueError::new_err(format!("chunk_cache: {e}")))?;
        return usize::try_from(bytes)
            .map(Some)
            .map_err(|_| PyValueError::new_err(format!("chunk_cache {text:?} is too large")));
    }
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(
            "chunk_cache is a byte budget (an int, or a size like \"512M\"), not a bool",
        ));
    }
    match value.extract::<i128>() {
        Ok(n) => usize::try_from(n).map(Some).map_err(|_| {
            PyValueError::new_err(format!("chunk_cache must be a size in bytes >= 0, not {n}"))
        }),
        Err(_) => Err(PyTypeError::new_err(format!(
            "chunk_cache is a byte budget (an int, or a size like \"512M\"), not {}",
            value.get_type().name()?
        ))),
    }
}

/// Opens the array or group at `path` (a local path or a URL, with `storage_options` for a
/// URL): a `NativeArray` or a `NativeGroup`. Arrays opened (directly or through the group)
/// keep decoded chunks in a cache of `chunk_cache` bytes.
#[pyfunction]
#[pyo3(signature = (path, storage_options=None, chunk_cache=None))]
#[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments by value
pub(crate) fn open_node<'py>(
    py: Python<'py>,
    path: PathBuf,
    storage_options: Option<Vec<(String, String)>>,
    chunk_cache: Option<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let options = open_options(storage_options, cache_bytes(chunk_cache.as_ref())?);
    let node = blocking::run(py, 0, |_| {
        zcrop::zarr::open_with(&path, &options).map_err(Failure::from)
    })?;
    node_into_py(py, node)
}

/// [`open_node`] in the background; `notify(error, node)` when done.
#[pyfunction]
#[pyo3(signature = (path, notify, storage_options=None, chunk_cache=None))]
#[allow(clippy::needless_pass_by_value)] // pyo3 extracts arguments by value
pub(crate) fn submit_open(
    path: PathBuf,
    notify: Py<PyAny>,
    storage_options: Option<Vec<(String, String)>>,
    chunk_cache: Option<Bound<'_, PyAny>>,
) -> PyResult<Pending> {
    let options = open_options(storage_options, cache_bytes(chunk_cache.as_ref())?);
    background::submit(
        notify,
        move |_| zcrop::zarr::open_with(&path, &options).map_err(Failure::from),
        node_into_py,
    )
}
