//! `SourceView`: one source's bytes of a loader batch, exported through Python's buffer
//! protocol so numpy (and through it torch and jax) wraps them without a copy. And the output
//! buffers of reads, handed to numpy without a copy and kept for reuse once numpy is done.
//!
//! **Lifetime rule:** a view holds a reference to its `NativeBatch`, and every buffer exported
//! from the view holds a reference to the view (`Py_buffer.obj`); numpy arrays made from it
//! hold the buffer. So the batch, and the ring buffer it owns, live until the last array over
//! its data is gone; only then does the ring buffer go back to the loader for reuse. The bytes
//! are exported read-only: nothing may write into a batch the loader will reuse.
//!
//! **Recycled outputs:** a read that allocates its output (`read_crops`, `arr[...]`) hands
//! numpy a buffer owned by a [`SpareOnDrop`]. When the last array over it goes, the buffer is
//! kept (a few, bounded in bytes) and the next read of the same size takes it, zeroed, instead
//! of fresh pages from the OS. A training loop that reads a batch, uses it and drops it would
//! otherwise fault in and zero every page of every batch, a visible share of a read's CPU
//! (more on VMs, where fresh pages are also faulted in by the host).
//!
//! **Shared counters:** [`counter_add`] counts, atomically, in memory that DataLoader workers
//! share with the main process (see `zcrop.torch`'s batch slots).
//!
//! This is the package's only module with `unsafe` code: filling in a `Py_buffer` is a C API,
//! and so is giving a numpy array memory that another object owns, or counting atomically in
//! an array's memory.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use zcrop::io::fork::PerProcess;
use zcrop::io::sync::Mutex;

use numpy::PyArray1;
use numpy::ndarray::Array1;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use crate::batch::NativeBatch;

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

/// Outputs smaller than this come cheaply from the allocator and are not kept.
const SPARE_MIN_BYTES: usize = 1 << 20;
/// At most this many spare outputs are kept...
const SPARE_MAX_BUFFERS: usize = 4;
/// ...holding at most this many bytes together (the oldest go first).
const SPARE_MAX_BYTES: usize = 1 << 30;

/// Output buffers whose arrays are gone, newest last. A child of `fork` keeps its own: reusing
/// a parent's would copy it (copy-on-write) and its lock may be held by a parent thread.
fn spares() -> &'static Mutex<Vec<Vec<u64>>> {
    static SPARES: PerProcess<Mutex<Vec<Vec<u64>>>> = PerProcess::new();
    SPARES.get_or_init(|| Mutex::new(Vec::new()))
}

/// A spare output of exactly `words` words, zeroed, if one is kept.
pub(crate) fn take_spare(words: usize) -> Option<Vec<u64>> {
    let mut spare = {
        let mut spares = spares().lock();
        let i = spares.iter().rposition(|v| v.len() == words)?;
        spares.remove(i)
    };
    spare.fill(0);
    Some(spare)
}

/// `(buffers, bytes)` of the spare outputs kept now (for tests and diagnostics).
#[pyfunction]
pub(crate) fn spare_outputs() -> (usize, usize) {
    let spares = spares().lock();
    (spares.len(), spares.iter().map(|v| v.len() * 8).sum())
}

/// Adds `delta` to `counters[index]` as one atomic step (acquire and release) and returns
/// the new value; `delta = 0` reads it. The counters live in memory that several processes
/// map (a DataLoader worker's batch slots and the main process): the release orders this
/// process's reads of a slot before its "done" count, the acquire orders the worker's reuse
/// of a slot after the count it saw.
#[pyfunction]
pub(crate) fn counter_add(
    counters: &Bound<'_, PyArray1<i64>>,
    index: usize,
    delta: i64,
) -> PyResult<i64> {
    use numpy::PyArrayMethods;
    use pyo3::exceptions::{PyIndexError, PyValueError};
    use std::sync::atomic::{AtomicI64, Ordering};

    let mut counters = counters
        .try_readwrite()
        .map_err(|e| PyValueError::new_err(format!("counters must be writable: {e}")))?;
    let words = counters
        .as_slice_mut()
        .map_err(|_| PyValueError::new_err("counters must be a contiguous int64 array"))?;
    let len = words.len();
    let word = words
        .get_mut(index)
        .ok_or_else(|| PyIndexError::new_err(format!("counter {index} of {len}")))?;
    let ptr: *mut i64 = word;
    if !ptr.cast::<AtomicI64>().is_aligned() {
        return Err(PyValueError::new_err("counters must be 8-byte aligned"));
    }
    // SAFETY: `ptr` comes from a live `&mut i64` and is aligned for `AtomicI64`; every access to
    // these counters, in any process that maps them, goes through this atomic.
    let atomic = unsafe { AtomicI64::from_ptr(ptr) };
    Ok(atomic.fetch_add(delta, Ordering::AcqRel) + delta)
}

/// Keeps `words` for [`take_spare`], within the bounds.
fn keep_spare(words: Vec<u64>) {
    let bytes = |v: &Vec<u64>| v.len() * 8;
    if bytes(&words) < SPARE_MIN_BYTES || bytes(&words) > SPARE_MAX_BYTES {
        return;
    }
    let mut evicted = Vec::new();
    {
        let mut spares = spares().lock();
        spares.push(words);
        while spares.len() > SPARE_MAX_BUFFERS
            || spares.iter().map(bytes).sum::<usize>() > SPARE_MAX_BYTES
        {
            evicted.push(spares.remove(0));
        }
    }
    // Freed outside the lock: giving large buffers back to the OS takes a while.
    drop(evicted);
}

/// Owns the words of a read's output while numpy arrays view them; keeps them for reuse when
/// the last array is gone (it is their base object).
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct SpareOnDrop {
    words: Array1<u64>,
}

impl Drop for SpareOnDrop {
    fn drop(&mut self) {
        let (words, _) = std::mem::take(&mut self.words).into_raw_vec_and_offset();
        keep_spare(words);
    }
}

/// A 1-d `uint64` numpy array that owns `words` (no copy); large outputs go back to the spares
/// when numpy frees the array.
pub(crate) fn words_to_numpy(
    py: Python<'_>,
    words: Vec<u64>,
) -> PyResult<Bound<'_, PyArray1<u64>>> {
    if words.len() * 8 < SPARE_MIN_BYTES {
        return Ok(PyArray1::from_vec(py, words));
    }
    let owner = Bound::new(
        py,
        SpareOnDrop {
            words: Array1::from_vec(words),
        },
    )?;
    let words = &owner.get().words;
    // SAFETY: the array's memory is `owner`'s, which becomes the array's base object, so it
    // lives as long as the array and every view of it. `words` is never resized or reallocated:
    // the only other use of it is `SpareOnDrop::drop`, which runs when the last array is gone.
    // Rust holds no reference into the words while numpy writes through the array.
    Ok(unsafe { PyArray1::borrow_from_array(words, owner.clone().into_any()) })
}
