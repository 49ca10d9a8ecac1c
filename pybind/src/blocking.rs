//! The one helper every blocking call goes through (polars' pattern): release the GIL, run the
//! work with a cancellation flag, honour Ctrl-C, catch panics, map errors to Python exceptions.
//! GIL handling lives here and in `background.rs` only, so a pyo3 upgrade touches two files.
//!
//! Python runs signal handlers only on its main thread, and only when that thread runs Python
//! code; a read holding it in Rust would make Ctrl-C wait for the read. So a read that may take
//! long runs on another thread while the calling thread waits for it with the GIL released,
//! waking every [`POLL`] to re-attach and run `check_signals()`. On `KeyboardInterrupt` it sets
//! the read's cancellation flag (the read stops at its next chunk or IO completion) and raises:
//!
//! - [`run_owned`]: work that owns everything it touches (a read into a buffer it allocates)
//!   runs on a pool thread (`pool.rs`: a hand-off, not a thread start). The caller raises at
//!   once, even if the read is stuck in the OS; the read winds down by itself and its result
//!   is dropped.
//! - [`run`]: work that borrows from the caller (a read into an `out=` array) runs on a scoped
//!   thread, so the caller waits for it to stop before raising: it must not return while its
//!   buffer is still being written.
//!
//! Reads whose decode work is at most [`INLINE_WORK_BYTES`] run inline with the GIL released:
//! handing them to another thread costs about a third of such a read's time, and they finish
//! well within a Ctrl-C's patience unless the OS itself hangs (a dead network mount).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::Duration;

use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;
use zcrop::io::fork::PerProcess;
use zcrop::sampler::{FftError, SamplerError};
use zcrop::zarr::ZarrError;

use crate::errors;
use crate::pool::{Job, Pool};

/// Reads that decode at most this many bytes run inline, on the calling thread.
pub(crate) const INLINE_WORK_BYTES: u64 = 1 << 20;

/// Most threads running sync reads at once (more callers wait for one to free up).
const MAX_SYNC_THREADS: usize = 256;

/// How often a thread waiting for a read checks for signals.
const POLL: Duration = Duration::from_millis(20);

/// Why work failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The read failed.
    Zarr(ZarrError),
    /// The result buffer (this many bytes) could not be allocated.
    NoMemory(usize),
    /// The sampler or its loader failed.
    Sampler(SamplerError),
    /// The out-of-core FFT failed.
    Fft(FftError),
}

impl From<SamplerError> for Failure {
    fn from(e: SamplerError) -> Self {
        Failure::Sampler(e)
    }
}

impl From<ZarrError> for Failure {
    fn from(e: ZarrError) -> Self {
        Failure::Zarr(e)
    }
}

/// The result of work that may have panicked: `Err` holds the panic's message.
pub(crate) type Guarded<T> = Result<Result<T, Failure>, String>;

/// Runs `work`, which borrows from the caller, with the GIL released; returns its result as a
/// Python result.
///
/// `work_bytes` estimates how much the work decodes (see [`INLINE_WORK_BYTES`]); `work` gets a
/// cancellation flag that is set on Ctrl-C. Panics become `zcrop.InternalError`, errors go
/// through [`errors::to_pyerr`], and a Ctrl-C raises `KeyboardInterrupt` once the work stopped.
pub(crate) fn run<T, F>(py: Python<'_>, work_bytes: u64, work: F) -> PyResult<T>
where
    T: Send,
    F: FnOnce(&AtomicBool) -> Result<T, Failure> + Send,
{
    let cancel = AtomicBool::new(false);
    if work_bytes <= INLINE_WORK_BYTES {
        let result = py.detach(|| guarded(|| work(&cancel)));
        return finish(py, result);
    }
    let (result, interrupt) = py.detach(|| scoped(&cancel, work));
    match interrupt {
        Some(interrupt) => Err(interrupt),
        None => finish(py, result),
    }
}

/// Runs `work`, which owns what it touches, with the GIL released; on Ctrl-C raises at once and
/// leaves the work to stop by itself (its result is dropped). Otherwise as [`run`].
pub(crate) fn run_owned<T, F>(py: Python<'_>, work_bytes: u64, work: F) -> PyResult<T>
where
    T: Send + 'static,
    F: FnOnce(&AtomicBool) -> Result<T, Failure> + Send + 'static,
{
    if work_bytes <= INLINE_WORK_BYTES {
        let cancel = AtomicBool::new(false);
        let result = py.detach(|| guarded(|| work(&cancel)));
        return finish(py, result);
    }
    run_handoff(py, move |cancel, reply| {
        // Nobody listens any more after a Ctrl-C: the result is dropped here.
        let _ = reply.send(guarded(|| work(cancel)));
    })
}

/// Where a job run by [`run_handoff`] sends its result.
pub(crate) struct Reply<T>(mpsc::SyncSender<Guarded<T>>);

impl<T> Reply<T> {
    /// Hands the result to the waiting caller; gives it back if the caller is gone (it raised
    /// `KeyboardInterrupt`).
    pub(crate) fn send(self, result: Guarded<T>) -> Result<(), Guarded<T>> {
        self.0.send(result).map_err(|e| e.0)
    }
}

/// Runs `job` on a pool thread while the caller waits with the GIL released, checking for
/// signals; on Ctrl-C sets the cancellation flag and raises at once. The job sends its result
/// through its [`Reply`] and decides what to do with it when nobody waits any more.
pub(crate) fn run_handoff<T, J>(py: Python<'_>, job: J) -> PyResult<T>
where
    T: Send + 'static,
    J: FnOnce(&AtomicBool, Reply<T>) + Send + 'static,
{
    let cancel = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::sync_channel::<Guarded<T>>(1);
    let boxed: Job = {
        let cancel = Arc::clone(&cancel);
        Box::new(move || job(&cancel, Reply(done_tx)))
    };
    if let Err(boxed) = sync_pool().execute(boxed) {
        // Without a thread the job still runs, inline (without Ctrl-C, which beats failing).
        py.detach(boxed);
    }
    let outcome = py.detach(move || {
        loop {
            match done_rx.recv_timeout(POLL) {
                Ok(result) => return Ok(result),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Ok(Err("the job ended without a result".to_string()));
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = Python::attach(check_signals) {
                        cancel.store(true, Ordering::Release);
                        return Err(interrupt);
                    }
                }
            }
        }
    });
    match outcome {
        Ok(result) => finish(py, result),
        Err(interrupt) => Err(interrupt),
    }
}

/// The threads that run sync reads while their callers wait; a child of `fork` starts its own.
fn sync_pool() -> &'static Pool {
    static POOL: PerProcess<Pool> = PerProcess::new();
    POOL.get_or_init(|| Pool::new("zcrop-read", MAX_SYNC_THREADS))
}

fn take<F>(slot: &Mutex<Option<F>>) -> Option<F> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// Converts a guarded result into a Python result.
pub(crate) fn finish<T>(py: Python<'_>, result: Guarded<T>) -> PyResult<T> {
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(Failure::Zarr(e))) => Err(errors::to_pyerr(py, &e)),
        Ok(Err(Failure::NoMemory(bytes))) => Err(PyMemoryError::new_err(format!(
            "cannot allocate {bytes} bytes for the result"
        ))),
        Ok(Err(Failure::Sampler(e))) => Err(errors::sampler_pyerr(py, &e)),
        Ok(Err(Failure::Fft(e))) => Err(errors::fft_pyerr(py, &e)),
        Err(panic) => Err(errors::panic_err(py, &panic)),
    }
}

/// The Python exception for a sampler error (see `errors::sampler_pyerr`).
pub(crate) fn sampler_err(py: Python<'_>, e: &SamplerError) -> PyErr {
    errors::sampler_pyerr(py, e)
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
fn scoped<T, F>(cancel: &AtomicBool, work: F) -> (Guarded<T>, Option<PyErr>)
where
    T: Send,
    F: FnOnce(&AtomicBool) -> Result<T, Failure> + Send,
{
    // The worker takes the work from here; if the thread cannot start, the work is still here
    // and runs inline (without Ctrl-C, which beats failing the read).
    let slot = Mutex::new(Some(work));
    std::thread::scope(|scope| {
        let (done_tx, done_rx) = mpsc::sync_channel::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("zcrop-read".into())
            .spawn_scoped(scope, || {
                let result = match take(&slot) {
                    Some(w) => guarded(|| w(cancel)),
                    None => Err("the read was taken by another thread".to_string()),
                };
                drop(done_tx);
                result
            });
        let worker = match spawned {
            Ok(worker) => worker,
            Err(e) => {
                let result = match take(&slot) {
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
