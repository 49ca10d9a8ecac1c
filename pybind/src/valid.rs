//! The kernels of `zcrop.valid_windows` (`zcrop/_valid.py`), run without the GIL.

use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use zcrop::sampler::valid;

use crate::blocking;

/// `(any, shape)`: whether each window of `windows[d]` elements along every axis of a C-order
/// boolean `map` holds a true element.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn window_any<'py>(
    py: Python<'py>,
    map: PyReadonlyArray1<'py, bool>,
    shape: Vec<usize>,
    windows: Vec<usize>,
) -> PyResult<(Bound<'py, PyArray1<bool>>, Vec<usize>)> {
    let flags = map.as_slice()?;
    let n: usize = shape.iter().product();
    if flags.len() != n || windows.len() != shape.len() {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "a map of shape {shape:?} needs {n} values and {} windows",
            shape.len()
        )));
    }
    let (out, shape) = py
        .detach(|| valid::window_any(flags, &shape, &windows))
        .map_err(|e| blocking::sampler_err(py, &e))?;
    Ok((PyArray1::from_vec(py, out), shape))
}

/// The runs of true values of a flat boolean array, as an `(n, 2)` uint64 array of
/// `[start, end)` ranges.
#[pyfunction]
#[allow(clippy::needless_pass_by_value)]
pub(crate) fn bool_runs<'py>(
    py: Python<'py>,
    flags: PyReadonlyArray1<'py, bool>,
) -> PyResult<Bound<'py, PyArray2<u64>>> {
    let flags = flags.as_slice()?;
    let runs = py.detach(|| valid::runs(flags));
    let flat: Vec<u64> = runs.iter().flat_map(|&(a, b)| [a, b]).collect();
    PyArray1::from_vec(py, flat).reshape([runs.len(), 2])
}
