//! The one place where Rust errors become Python exceptions.
//!
//! The exception classes are declared in one Python file, `zcrop/errors.py` (so they can derive
//! from two builtins, e.g. `MetadataError(ZcropError, ValueError)`); this module maps each
//! [`ZarrError`] variant onto one of them, and a caught panic onto `InternalError`.

use std::any::Any;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use zcrop::io::{EngineError, IoError, ReadRange};
use zcrop::sampler::{FftError, SamplerError};
use zcrop::zarr::{Location, ZarrError};

/// Declares a function returning the class `zcrop.errors.$name`, imported once.
macro_rules! exception_class {
    ($fn_name:ident, $name:literal) => {
        fn $fn_name(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
            static CLASS: PyOnceLock<Py<PyType>> = PyOnceLock::new();
            CLASS.import(py, "zcrop.errors", $name)
        }
    };
}

exception_class!(node_not_found, "NodeNotFoundError");
exception_class!(node_type, "NodeTypeError");
exception_class!(metadata, "MetadataError");
exception_class!(unsupported, "UnsupportedError");
exception_class!(bounds, "BoundsError");
exception_class!(invalid_argument, "InvalidArgumentError");
exception_class!(store, "StoreError");
exception_class!(codec, "CodecError");
exception_class!(shard_index, "ShardIndexError");
exception_class!(transform, "TransformError");
exception_class!(cancelled, "CancelledError");
exception_class!(internal, "InternalError");
exception_class!(loader, "LoaderError");
exception_class!(out_of_memory, "OutOfMemoryError");

/// The Python exception for `e`.
pub(crate) fn to_pyerr(py: Python<'_>, e: &ZarrError) -> PyErr {
    build(py, e).unwrap_or_else(|failed| failed)
}

fn build(py: Python<'_>, e: &ZarrError) -> PyResult<PyErr> {
    build_with(py, e, None)
}

/// [`build`] with another message (the same class and location attributes).
fn build_with(py: Python<'_>, e: &ZarrError, message: Option<String>) -> PyResult<PyErr> {
    let message = message.unwrap_or_else(|| e.to_string());
    let (class, at, filename) = match e {
        ZarrError::NodeNotFound { path } => (node_not_found(py)?, None, Some(path.clone())),
        ZarrError::WrongNodeType { path, .. } => (node_type(py)?, None, Some(path.clone())),
        ZarrError::InvalidMetadata { path, .. } => (metadata(py)?, None, Some(path.clone())),
        ZarrError::Oversized { .. } => (metadata(py)?, None, None),
        ZarrError::OutOfMemory { .. } => (out_of_memory(py)?, None, None),
        ZarrError::Io { at, source } if matches!(**source, IoError::OutOfMemory { .. }) => {
            (out_of_memory(py)?, Some(at.as_ref()), None)
        }
        ZarrError::UnsupportedCodec { .. }
        | ZarrError::UnsupportedDataType { .. }
        | ZarrError::Unsupported { .. } => (unsupported(py)?, None, None),
        ZarrError::OutOfBounds { .. } => (bounds(py)?, None, None),
        ZarrError::InvalidArgument(_) => (invalid_argument(py)?, None, None),
        ZarrError::Io { at, .. } | ZarrError::VirtualChunk { at, .. } => {
            (store(py)?, Some(at.as_ref()), None)
        }
        // A URL or storage option that cannot be used, or a bad engine setting: the
        // caller's argument.
        ZarrError::Engine(e)
            if matches!(**e, EngineError::Store { .. } | EngineError::Config(_)) =>
        {
            (invalid_argument(py)?, None, None)
        }
        ZarrError::Engine(_) => (store(py)?, None, None),
        ZarrError::Codec { at, .. } => (codec(py)?, Some(at.as_ref()), None),
        ZarrError::ShardIndex { at, .. } => (shard_index(py)?, Some(at.as_ref()), None),
        ZarrError::Cancelled => (cancelled(py)?, None, None),
        ZarrError::Transform { .. } => (transform(py)?, None, None),
        // `ZarrError` is non-exhaustive: a variant added later is still a zcrop error.
        _ => (internal(py)?, None, None),
    };
    // The OSError subclasses take (errno, strerror) and get `filename`, so that their text
    // reads like FileNotFoundError's: "[Errno 2] No Zarr array or group: 'path'".
    let value = match e {
        ZarrError::NodeNotFound { .. } => class.call1((enoent(py)?, "No Zarr array or group"))?,
        ZarrError::WrongNodeType { .. } => class.call1((enoent(py)?, message))?,
        _ => class.call1((message,))?,
    };
    if let Some(at) = at {
        set_location(&value, at)?;
    }
    if let Some(path) = filename {
        value.setattr("filename", path.to_string_lossy().into_owned())?;
    }
    Ok(PyErr::from_value(value))
}

/// The Python exception for a sampler or loader error: a read error keeps the class of its
/// Zarr error (with the step and source in the message), a bad spec is a ValueError.
pub(crate) fn sampler_pyerr(py: Python<'_>, e: &SamplerError) -> PyErr {
    let built = match e {
        SamplerError::Read { error, .. } | SamplerError::Open { error, .. } => {
            build_with(py, error, Some(e.to_string()))
        }
        SamplerError::Spec { .. } | SamplerError::EmptyRegion { .. } => {
            invalid_argument(py).and_then(|c| c.call1((e.to_string(),)).map(PyErr::from_value))
        }
        SamplerError::Alloc { .. } => Ok(PyMemoryError::new_err(e.to_string())),
        SamplerError::WorkerPanic { .. } => Ok(panic_err(py, &e.to_string())),
        _ => loader(py).and_then(|c| c.call1((e.to_string(),)).map(PyErr::from_value)),
    };
    built.unwrap_or_else(|failed| failed)
}

/// The Python exception for an FFT error: a read error keeps the class of its zarr-front error
/// (with the FFT's message), a bad argument or budget is `InvalidArgumentError`, a write error
/// or a failed read of the job's state `StoreError`.
pub(crate) fn fft_pyerr(py: Python<'_>, e: &FftError) -> PyErr {
    let message = e.to_string();
    let built = match e {
        FftError::Read { error, .. } | FftError::Engine(error) => {
            build_with(py, error, Some(message))
        }
        FftError::Write { .. } | FftError::Storage(_) => {
            store(py).and_then(|c| c.call1((message,)).map(PyErr::from_value))
        }
        FftError::Cancelled => {
            cancelled(py).and_then(|c| c.call1((message,)).map(PyErr::from_value))
        }
        _ => invalid_argument(py).and_then(|c| c.call1((message,)).map(PyErr::from_value)),
    };
    built.unwrap_or_else(|failed| failed)
}

/// `errno.ENOENT`.
fn enoent(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("errno")?.getattr("ENOENT")
}

/// Sets `node`, `key` and `byte_range` on an exception instance.
fn set_location(value: &Bound<'_, PyAny>, at: &Location) -> PyResult<()> {
    value.setattr("node", &at.node)?;
    value.setattr("key", &at.key)?;
    let range = match at.range {
        Some(ReadRange::Bounded { offset, len }) => Some((offset, offset.saturating_add(len))),
        _ => None,
    };
    value.setattr("byte_range", range)
}

/// The text of a caught panic's payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_string()
    }
}

/// `zcrop.InternalError` for a panic caught before it reached Python.
pub(crate) fn panic_err(py: Python<'_>, message: &str) -> PyErr {
    let text = format!("internal error in zcrop (a Rust panic, please report it): {message}");
    match internal(py).and_then(|c| c.call1((text,))) {
        Ok(value) => PyErr::from_value(value),
        Err(e) => e,
    }
}
