//! `SourceView`: one source's bytes of a loader batch, exported through Python's buffer
//! protocol so numpy (and through it torch and jax) wraps them without a copy.
//!
//! **Lifetime rule:** a view holds a reference to its `NativeBatch`, and every buffer exported
//! from the view holds a reference to the view (`Py_buffer.obj`); numpy arrays made from it
//! hold the buffer. So the batch, and the ring buffer it owns, live until the last array over
//! its data is gone; only then does the ring buffer go back to the loader for reuse. The bytes
//! are exported read-only: nothing may write into a batch the loader will reuse.
//!
//! This is the package's only module with `unsafe` code: filling in a `Py_buffer` is a C API.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use crate::loader::NativeBatch;

/// The bytes of one source of a batch, as a read-only buffer.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct SourceView {
    pub(crate) batch: Py<NativeBatch>,
    pub(crate) source: usize,
}

#[pymethods]
impl SourceView {
    /// Number of bytes.
    fn __len__(&self) -> usize {
        self.batch.get().source_bytes(self.source).len()
    }

    /// Exports the bytes, read-only, one-dimensional, format `B`.
    ///
    /// Nothing needs releasing: Python drops the reference in `obj`.
    ///
    /// # Safety
    /// Called by Python's buffer protocol with a valid `view` to fill in.
    #[allow(clippy::needless_pass_by_value)] // pyo3 passes `slf` by value
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a null Py_buffer"));
        }
        if flags & pyo3::ffi::PyBUF_WRITABLE == pyo3::ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "a loader batch is read-only (copy it to modify it)",
            ));
        }
        let this = slf.get();
        let bytes = this.batch.get().source_bytes(this.source);
        let len = isize::try_from(bytes.len())
            .map_err(|_| PyBufferError::new_err("a batch too large to export"))?;
        // SAFETY: `view` is non-null and points to a `Py_buffer` Python gave us to fill in.
        // `bytes` lives as long as the batch, which `obj` (a new reference to this view, which
        // holds the batch) keeps alive until Python releases the buffer; the batch never hands
        // its ring buffer back while it lives. The buffer is exported read-only, so nobody
        // writes through `buf`. `shape` and `strides` point into the `Py_buffer` itself, which
        // outlives every use of them, as CPython's own `PyBuffer_FillInfo` does.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = bytes.as_ptr().cast::<c_void>().cast_mut();
            (*view).len = len;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & pyo3::ffi::PyBUF_FORMAT == pyo3::ffi::PyBUF_FORMAT {
                c"B".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & pyo3::ffi::PyBUF_ND == pyo3::ffi::PyBUF_ND {
                &raw mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & pyo3::ffi::PyBUF_STRIDES == pyo3::ffi::PyBUF_STRIDES {
                &raw mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }
}
