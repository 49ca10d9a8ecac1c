//! # zcrop-python: the `zcrop` Python package's native module
//!
//! **Job:** convert between Python and the Rust API and call it: argument conversion, numpy
//! buffers, exceptions, GIL release. Nothing here decides how data is read.
//!
//! **Must not know about:** how IO, planning or decoding work; it only calls the `zcrop` crate.

use pyo3::prelude::*;

/// Runs the `zcrop` command line with `argv` (program name first) and returns its exit code.
///
/// This is the same implementation as the Rust `zcrop` binary; the Python console script
/// `zcrop` calls it with `sys.argv`.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| zcrop::cli::main_code(argv))
}

/// The native part of the `zcrop` package.
#[pymodule]
fn _zcrop(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}
