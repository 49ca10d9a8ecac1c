//! # zcrop-python: the `zcrop` Python package's native module
//!
//! **Job:** convert between Python and the Rust API and call it: argument conversion, numpy
//! buffers, exceptions, GIL release. Nothing here decides how data is read.
//!
//! **Must not know about:** how IO, planning or decoding work; it only calls the `zcrop` crate.
//!
//! - `blocking`: the one helper every sync call goes through (GIL release, Ctrl-C, panics,
//!   errors); `background`: the same for async calls, on driver threads.
//! - `errors`: Rust errors -> the exception tree declared in `zcrop/errors.py`.
//! - `read`: one read (request, work estimate, output buffer), shared by sync and async.
//! - `array`, `group`: the `NativeArray` and `NativeGroup` classes the Python package wraps.

mod array;
mod background;
mod batch;
mod blocking;
mod buffer;
mod errors;
mod fft;
mod group;
mod icechunk;
mod loader;
mod pool;
mod read;
mod valid;

use pyo3::prelude::*;

/// The allocator of the Rust side of the module, as in the `zcrop` binary (see its `main.rs`
/// for why). Python's own objects are unaffected.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    m.add_function(wrap_pyfunction!(group::open_node, m)?)?;
    m.add_function(wrap_pyfunction!(icechunk::open_icechunk, m)?)?;
    m.add_function(wrap_pyfunction!(icechunk::icechunk_session_repository, m)?)?;
    m.add_class::<icechunk::NativeIcechunk>()?;
    m.add_function(wrap_pyfunction!(group::submit_open, m)?)?;
    m.add_function(wrap_pyfunction!(group::chunk_cache_usage, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::spare_outputs, m)?)?;
    m.add_function(wrap_pyfunction!(buffer::counter_add, m)?)?;
    m.add_function(wrap_pyfunction!(array::read_crops_many, m)?)?;
    m.add_function(wrap_pyfunction!(valid::window_any, m)?)?;
    m.add_function(wrap_pyfunction!(valid::bool_runs, m)?)?;
    m.add_function(wrap_pyfunction!(fft::fft_local, m)?)?;
    m.add_class::<fft::NativeFftJob>()?;
    m.add_class::<array::NativeArray>()?;
    m.add_class::<group::NativeGroup>()?;
    m.add_class::<background::Pending>()?;
    m.add_class::<loader::NativeLoader>()?;
    m.add_class::<loader::NativeSampler>()?;
    m.add_class::<batch::NativeBatch>()?;
    m.add_class::<buffer::SourceView>()?;
    m.add("INLINE_WORK_BYTES", blocking::INLINE_WORK_BYTES)?;
    let quiesce = wrap_pyfunction!(background::quiesce, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (quiesce,))?;
    Ok(())
}
