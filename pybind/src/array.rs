//! `NativeArray`: the Rust array handle behind `zcrop.Array` and `zcrop.AsyncArray`.
//!
//! Selections arrive already normalised by the Python side (`zcrop/_indexing.py`): per output
//! block, per dimension, either a `(start, len)` range or a 1-d `uint64` array of indices.
//! Results come back as a flat `uint64` word buffer plus a byte length, handed to numpy without
//! copying; the Python side gives them their dtype and shape. With `out`, the read writes
//! straight into the caller's `uint8` view of its array.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyReadwriteArray1};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use zcrop::zarr::{Array, DimSelection, ReadOptions, ReadPart, VariableKind, read_many};

use crate::background::{self, Pending};
use crate::blocking;
use crate::read::{OwnedOut, Request};
use zcrop::sampler::valid;

/// An opened Zarr array (the Rust side of `zcrop.Array`). Cheap to share between threads.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct NativeArray {
    pub(crate) inner: Array,
}

/// A read's result as Python gets it: the word buffer and the number of bytes in it.
type Words<'py> = (Bound<'py, PyArray1<u64>>, usize);

// pyo3 extracts arguments by value: `PyReadonlyArray2` cannot be taken by reference.
#[allow(clippy::needless_pass_by_value)]
#[pymethods]
impl NativeArray {
    /// The shape.
    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.inner.shape().to_vec()
    }

    /// The shape of the chunks that are read and decoded (zarr-python's `chunks`).
    #[getter]
    fn chunk_shape(&self) -> Vec<u64> {
        self.inner.chunk_shape().to_vec()
    }

    /// The shard shape of a sharded array (zarr-python's `shards`), else `None`.
    #[getter]
    fn shard_shape(&self) -> Option<Vec<u64>> {
        self.inner.shard_shape().map(<[u64]>::to_vec)
    }

    /// The numpy dtype string zarr-python reports (e.g. `>u2` for a big-endian v2 array).
    #[getter]
    fn numpy_dtype(&self) -> String {
        self.inner.numpy_dtype()
    }

    /// The Zarr v3 data type name (`uint16`, `float32`, ...).
    #[getter]
    fn data_type(&self) -> String {
        self.inner.data_type()
    }

    /// The fill value: one element, native-endian bytes.
    #[getter]
    fn fill_value_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.fill_value_bytes())
    }

    /// 2 or 3.
    #[getter]
    fn zarr_format(&self) -> u8 {
        self.inner.zarr_format()
    }

    /// The array's path in its store (`/` or `/group/name`).
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The array's path relative to the store root (`` or `group/name`).
    #[getter]
    fn path(&self) -> &str {
        self.inner.path()
    }

    /// The array's directory (for an object store: its key prefix in the bucket).
    #[getter]
    fn dir(&self) -> std::path::PathBuf {
        self.inner.dir().to_path_buf()
    }

    /// Where the array is: its directory, or its URL.
    #[getter]
    fn uri(&self) -> String {
        self.inner.uri()
    }

    /// The storage options the array was opened with (`(key, value)` pairs).
    #[getter]
    fn storage_options(&self) -> Vec<(String, String)> {
        self.inner.storage_options().to_vec()
    }

    /// The attributes, as a JSON text.
    #[getter]
    fn attributes_json(&self) -> String {
        serde_json::Value::Object(self.inner.attributes().clone()).to_string()
    }

    /// The metadata as stored, as a JSON text.
    #[getter]
    fn metadata_json(&self) -> String {
        self.inner.metadata_json().to_string()
    }

    /// The v3 dimension names, if set.
    #[getter]
    fn dimension_names(&self) -> Option<Vec<Option<String>>> {
        self.inner.dimension_names()
    }

    /// Number of sharding levels (0 when unsharded).
    #[getter]
    fn sharding_levels(&self) -> usize {
        self.inner.sharding_levels()
    }

    /// How chunks are decoded, in words.
    #[getter]
    fn decoder(&self) -> String {
        self.inner.decoder_description()
    }

    /// Reads orthogonal selections, one output block each. Returns `(words, nbytes)`, or
    /// `None` after writing into `out` (a writable, contiguous `uint8` array of the exact size).
    #[pyo3(signature = (blocks, out=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        blocks: &Bound<'py, PyAny>,
        out: Option<Bound<'py, PyArray1<u8>>>,
    ) -> PyResult<Option<Words<'py>>> {
        let request = Request::Blocks(parse_blocks(blocks)?);
        self.run(py, request, out)
    }

    /// What variable-length elements are (`"utf8"` or `"bytes"`); `None` for fixed-size ones.
    #[getter]
    fn variable_kind(&self) -> Option<&'static str> {
        self.inner.variable_kind().map(|k| match k {
            VariableKind::Utf8 => "utf8",
            VariableKind::Bytes => "bytes",
        })
    }

    /// Reads the variable-length elements of the box at `origin` of `shape`, in C order: a
    /// list of `str` (UTF-8 text) or `bytes`.
    fn read_variable<'py>(
        &self,
        py: Python<'py>,
        origin: Vec<u64>,
        shape: Vec<u64>,
    ) -> PyResult<Bound<'py, PyList>> {
        let array = self.inner.clone();
        let text = array.variable_kind() == Some(VariableKind::Utf8);
        let elements = blocking::run_owned(py, 0, move |_| {
            array.read_variable(&origin, &shape).map_err(Into::into)
        })?;
        let items = (0..elements.len()).map(|i| -> PyResult<Bound<'py, PyAny>> {
            let e = elements.get(i);
            Ok(if text {
                // Checked as UTF-8 by `read_variable`.
                let s =
                    std::str::from_utf8(e).map_err(|err| PyValueError::new_err(err.to_string()))?;
                PyString::new(py, s).into_any()
            } else {
                PyBytes::new(py, e).into_any()
            })
        });
        PyList::new(py, items.collect::<PyResult<Vec<_>>>()?)
    }

    /// Reads single elements at `coords` (an `(N, ndim)` `uint64` array), in order.
    #[pyo3(signature = (coords, out=None))]
    fn read_points<'py>(
        &self,
        py: Python<'py>,
        coords: PyReadonlyArray2<'py, u64>,
        out: Option<Bound<'py, PyArray1<u8>>>,
    ) -> PyResult<Option<Words<'py>>> {
        let request = points_request(&coords, self.inner.ndim())?;
        self.run(py, request, out)
    }

    /// Reads crops of `shape` at `origins` (an `(N, ndim)` `uint64` array) as one planned batch.
    #[pyo3(signature = (origins, shape, out=None))]
    fn read_crops<'py>(
        &self,
        py: Python<'py>,
        origins: PyReadonlyArray2<'py, u64>,
        shape: Vec<u64>,
        out: Option<Bound<'py, PyArray1<u8>>>,
    ) -> PyResult<Option<Words<'py>>> {
        let request = crops_request(&origins, shape, self.inner.ndim())?;
        self.run(py, request, out)
    }

    /// `(map, shape)`: which elements of `block` (one block as `read` takes it) are NaN or one
    /// of `fills`, reduced (any) over the axes where `keep` is false. The read tests the values
    /// as it decodes them and never writes them out (see
    /// `zcrop::sampler::valid::read_missing`); `dtype` is the array's numpy type name.
    fn missing_map<'py>(
        &self,
        py: Python<'py>,
        block: &Bound<'py, PyAny>,
        dtype: String,
        fills: Vec<f64>,
        keep: Vec<bool>,
    ) -> PyResult<(Bound<'py, PyArray1<bool>>, Vec<usize>)> {
        let block: Vec<DimSelection> = block
            .try_iter()?
            .map(|dim| parse_dim(&dim?))
            .collect::<PyResult<_>>()?;
        let shape = block
            .iter()
            .map(|d| usize::try_from(d.len()))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| PyValueError::new_err("the block is too large"))?;
        let blocks = vec![block];
        let work = Request::Blocks(blocks.clone()).work_bytes(&self.inner);
        let array = self.inner.clone();
        let (map, shape) = blocking::run_owned(py, work, move |cancel| {
            let map = valid::read_missing(&shape, &dtype, &fills, &keep, |sink, out| {
                let options = ReadOptions {
                    transform: Some(sink),
                    cancel: Some(cancel),
                };
                array.read_selections_into_with(&blocks, out, options)?;
                Ok::<(), blocking::Failure>(())
            })?;
            Ok((map.to_bools()?, map.shape))
        })?;
        Ok((PyArray1::from_vec(py, map), shape))
    }

    /// [`NativeArray::read`] in the background; `notify(error, (words, nbytes))` when done.
    fn submit_read(&self, blocks: &Bound<'_, PyAny>, notify: Py<PyAny>) -> PyResult<Pending> {
        self.submit(Request::Blocks(parse_blocks(blocks)?), notify)
    }

    /// [`NativeArray::read_points`] in the background.
    fn submit_points(
        &self,
        coords: PyReadonlyArray2<'_, u64>,
        notify: Py<PyAny>,
    ) -> PyResult<Pending> {
        self.submit(points_request(&coords, self.inner.ndim())?, notify)
    }

    /// [`NativeArray::read_crops`] in the background.
    fn submit_crops(
        &self,
        origins: PyReadonlyArray2<'_, u64>,
        shape: Vec<u64>,
        notify: Py<PyAny>,
    ) -> PyResult<Pending> {
        self.submit(crops_request(&origins, shape, self.inner.ndim())?, notify)
    }

    fn __repr__(&self) -> String {
        format!(
            "NativeArray(name={:?}, shape={:?}, dtype={:?})",
            self.inner.name(),
            self.inner.shape(),
            self.inner.numpy_dtype()
        )
    }
}

impl NativeArray {
    /// Runs `request` through the blocking helper, into `out` or a new buffer.
    fn run<'py>(
        &self,
        py: Python<'py>,
        request: Request,
        out: Option<Bound<'py, PyArray1<u8>>>,
    ) -> PyResult<Option<Words<'py>>> {
        let work = request.work_bytes(&self.inner);
        match out {
            Some(out) => {
                let mut out: PyReadwriteArray1<'py, u8> = out
                    .try_readwrite()
                    .map_err(|e| PyValueError::new_err(format!("out= is not writable: {e}")))?;
                let bytes = out.as_slice_mut().map_err(|e| {
                    PyValueError::new_err(format!("out= must be C-contiguous: {e}"))
                })?;
                let array = &self.inner;
                blocking::run(py, work, |cancel| {
                    request.execute(array, bytes, cancel).map_err(Into::into)
                })?;
                Ok(None)
            }
            None => {
                let array = self.inner.clone();
                let owned = blocking::run_owned(py, work, move |cancel| {
                    request.execute_owned(&array, cancel)
                })?;
                Ok(Some(owned.into_numpy(py)?))
            }
        }
    }

    /// Queues `request` on the background threads.
    fn submit(&self, request: Request, notify: Py<PyAny>) -> PyResult<Pending> {
        let array = self.inner.clone();
        background::submit(
            notify,
            move |cancel| request.execute_owned(&array, cancel),
            |py, owned| {
                let (words, len) = owned.into_numpy(py)?;
                Ok(
                    PyTuple::new(py, [words.into_any(), len.into_pyobject(py)?.into_any()])?
                        .into_any(),
                )
            },
        )
    }
}

/// Parses `[[dim, ...], ...]`: per block, per dimension, `(start, len)` or a 1-d `uint64` array.
fn parse_blocks(blocks: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<DimSelection>>> {
    blocks
        .try_iter()?
        .map(|block| block?.try_iter()?.map(|dim| parse_dim(&dim?)).collect())
        .collect()
}

fn parse_dim(dim: &Bound<'_, PyAny>) -> PyResult<DimSelection> {
    if let Ok((start, len)) = dim.extract::<(u64, u64)>() {
        return Ok(DimSelection::Range { start, len });
    }
    if let Ok(points) = dim.extract::<PyReadonlyArray1<'_, u64>>() {
        return Ok(DimSelection::Points(
            points.as_array().iter().copied().collect(),
        ));
    }
    Err(PyTypeError::new_err(format!(
        "a dimension selection must be (start, len) or a 1-d uint64 array, got {}",
        dim.get_type().name()?
    )))
}

/// One single-element block per row of `coords`.
fn points_request(coords: &PyReadonlyArray2<'_, u64>, ndim: usize) -> PyResult<Request> {
    let coords = coords.as_array();
    if coords.ncols() != ndim {
        return Err(PyValueError::new_err(format!(
            "coordinates have {} columns, the array has {ndim} dimensions",
            coords.ncols()
        )));
    }
    Ok(Request::Blocks(
        coords
            .rows()
            .into_iter()
            .map(|row| {
                row.iter()
                    .map(|&start| DimSelection::Range { start, len: 1 })
                    .collect()
            })
            .collect(),
    ))
}

/// Reads crops of several arrays as one batch (`zcrop_zarr::read_many`: the chunk reads of
/// arrays in one store go out in one submission): for array `k`, crops of `shapes[k]` at
/// `origins[k]` (an `(N_k, ndim_k)` `uint64` array). Returns one `(words, nbytes)` per array,
/// as `NativeArray.read_crops` does. The GIL is released while reading.
#[pyfunction]
// pyo3 extracts arguments by value.
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn read_crops_many<'py>(
    py: Python<'py>,
    arrays: Vec<PyRef<'py, NativeArray>>,
    origins: Vec<PyReadonlyArray2<'py, u64>>,
    shapes: Vec<Vec<u64>>,
) -> PyResult<Vec<Words<'py>>> {
    if arrays.len() != origins.len() || arrays.len() != shapes.len() {
        return Err(PyValueError::new_err(format!(
            "{} arrays, {} origin arrays and {} crop shapes: one of each per array",
            arrays.len(),
            origins.len(),
            shapes.len()
        )));
    }
    let mut jobs: Vec<(Array, Vec<Vec<DimSelection>>, usize)> = Vec::with_capacity(arrays.len());
    let mut work = 0u64;
    for ((a, o), shape) in arrays.iter().zip(&origins).zip(shapes) {
        let array = &a.inner;
        let request = crops_request(o, shape, array.ndim())?;
        let len = request
            .out_len(array)
            .map_err(|e| crate::errors::to_pyerr(py, &e))?;
        work = work.saturating_add(request.work_bytes(array));
        let Request::Crops { origins, shape } = request else {
            unreachable!("crops_request makes crops")
        };
        let selections: Vec<Vec<DimSelection>> = if shape.is_empty() {
            vec![Vec::new()]
        } else {
            origins
                .chunks_exact(shape.len())
                .map(|o| {
                    o.iter()
                        .zip(&shape)
                        .map(|(&start, &len)| DimSelection::Range { start, len })
                        .collect()
                })
                .collect()
        };
        jobs.push((array.clone(), selections, len));
    }
    let outs = blocking::run_owned(py, work, move |cancel| {
        let mut outs = jobs
            .iter()
            .map(|(_, _, len)| OwnedOut::new(*len))
            .collect::<Result<Vec<_>, _>>()?;
        let parts = jobs
            .iter()
            .zip(outs.iter_mut())
            .map(|((array, selections, _), out)| ReadPart {
                array,
                selections,
                out: out.bytes_mut(),
                options: ReadOptions {
                    transform: None,
                    cancel: Some(cancel),
                },
            })
            .collect();
        read_many(parts)?;
        Ok(outs)
    })?;
    outs.into_iter().map(|o| o.into_numpy(py)).collect()
}

/// Crops of `shape` at the rows of `origins`.
fn crops_request(
    origins: &PyReadonlyArray2<'_, u64>,
    shape: Vec<u64>,
    ndim: usize,
) -> PyResult<Request> {
    let origins = origins.as_array();
    if origins.ncols() != ndim || shape.len() != ndim {
        return Err(PyValueError::new_err(format!(
            "origins have {} columns and the crop shape {} dimensions; the array has {ndim}",
            origins.ncols(),
            shape.len()
        )));
    }
    if ndim == 0 && origins.nrows() != 1 {
        return Err(PyValueError::new_err(
            "a 0-d array has exactly one crop: pass one empty origin",
        ));
    }
    Ok(Request::Crops {
        origins: origins.iter().copied().collect(),
        shape,
    })
}
