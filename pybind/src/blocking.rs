//! The one helper every blocking call goes through (polars' pattern): release the GIL, run the
//! work with a cancellation flag, honour Ctrl-C, catch panics, map errors to Python exceptions.
//! GIL handling lives here and in `background.rs` only, so a pyo3 upgrade touches two files.
//!
//! Python runs signal handlers only on its main thread, and only when that thread runs Python
//! code; a read holding it in Rust would make Ctrl-C wait for the read. So a read that may take
//! long runs on a scoped worker thread while the calling thread waits for it, waking every
//! [`POLL`] to re-attach and run `check_signals()`. On `KeyboardInterrupt` it sets the read's
//! cancellation flag (the read stops at its next chunk or IO completion), waits for the worker
//! to let go of the output buffer, and raises. Small reads, whose decode work is at most
//! [`INLINE_WORK_BYTES`], run inline with the GIL released: a thread would cost more than the
//! read, and they finish well within a Ctrl-C's patience.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use zcrop::zarr::ZarrError;

use crate::errors;

/// Reads that decode at most this many bytes run inline, on the calling thread.
pub(crate) const INLINE_WORK_BYTES: u64 = 1 << 20;

/// How often a thread waiting for a read checks for signals.
const POLL: Duration = Duration::from_millis(20);

/// Why work failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The read failed.
    Zarr(ZarrError),
    /// The result buffer (this many bytes) could not be allocated.
    NoMemory(usize),
}

impl From<ZarrError> for Failure {
    fn from(e: ZarrError) -> Self {
        Failure::Zarr(e)
    }
}

/// The result of work that may have panicked: `Err` holds the panic's message.
pub(crate) type Guarded<T> = Result<Result<T, Failure>, String>;

/// Runs `work` with the GIL released and returns its result as a Python result.
///
/// `work_bytes` estimates how much the work decodes (see [`INLINE_WORK_BYTES`]); `work` gets a
/// cancellation flag that is set on Ctrl-C. Panics become `zcrop.InternalError`, errors go
/// through [`errors::to_pyerr`], and a Ctrl-C raises `KeyboardInterrupt` whatever the work did.
pub(crate) fn run<T, F>(py: Python<'_>, work_bytes: u64, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce(&AtomicBool) -> Result<T, Failure> + Send,
{
    let cancel = AtomicBool::new(false);
    let (result, interrupt) = if work_bytes <= INLINE_WORK_BYTES {
        (py.detach(|| guarded(|| work(&cancel))), None)
    } else {
        py.detach(|| watched(&cancel, work))
    };
    if let Some(interrupt) = interrupt {
        return Err(interrupt);
    }
    finish(py, result)
}

/// Converts a guarded result into a Python result.
pub(crate) fn finish<T>(py: Python<'_>, result: Guarded<T>) -> PyResult<T> {
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(Failure::Zarr(e))) => Err(errors::to_pyerr(py, &e)),
        Ok(Err(Failure::NoMemory(bytes))) => Err(PyMemoryError::new_err(format!(
            "cannot allocate {bytes} bytes for the result"
        ))),
        Err(panic) => Err(errors::panic_err(py, &panic)),
    }
}

/// Runs Python's signal handlers (a `KeyboardInterrupt` comes back as an error).
fn check_signals(py: Python<'_>) -> PyResult<()> {
    py.check_signals()
}

/// Runs `f`, catching a panic.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T, Failure>) -> Guarded<T> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| errors::panic_message(&*p))
}

/// Runs `work` on a scoped worker thread, checking for signals while it runs. Returns the
/// work's result and the `KeyboardInterrupt` (or other signal-handler error) if one came.
fn watched<T, F>(cancel: &AtomicBool, work: F) -> (Guarded<T>, Option<PyErr>)
where
    T: Send,
    F: FnOnce(&AtomicBool) -> Result<T, Failure> + Send,
{
    // The worker takes the work from here; if the thread cannot start, the work is still here
    // and runs inline (without Ctrl-C, which beats failing the read).
    let slot = Mutex::new(Some(work));
    let take = || slot.lock().unwrap_or_else(PoisonError::into_inner).take();
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("zcrop-read".into())
            .spawn_scoped(scope, move || {
                let result = match take() {
                    Some(w) => guarded(|| w(cancel)),
                    None => Err("the read was taken by another thread".to_string()),
                };
                drop(done_tx);
                result
            });
        let worker = match spawned {
            Ok(worker) => worker,
            Err(e) => {
                let result = match take() {
                    Some(w) => guarded(|| w(cancel)),
                    None => Err(format!("cannot start a read thread: {e}")),
                };
                return (result, None);
            }
        };
        let mut interrupt = None;
        // Until the worker drops its sender (it has finished), wake every POLL for signals.
        while let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(POLL) {
            if interrupt.is_none()
                && let Err(e) = Python::attach(check_signals)
            {
                cancel.store(true, Ordering::Release);
                interrupt = Some(e);
            }
        }
        let result = worker
            .join()
            .unwrap_or_else(|p| Err(errors::panic_message(&*p)));
        (result, interrupt)
    })
}
