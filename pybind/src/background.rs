//! Work for the async API: run on a small pool of driver threads, completed by a callback.
//!
//! `submit` queues a job that owns everything it touches (the array handle, the request, the
//! output buffer it allocates), so the caller returns at once and no Python object is borrowed
//! while the GIL is released. A driver thread runs the job (IO waits there; decoding fans out to
//! the rayon pool), then attaches to Python and calls `notify(error, value)`. The Python side
//! passes a `notify` that hands the result to its asyncio loop with `call_soon_threadsafe`, so
//! this module knows nothing of asyncio. [`Pending::cancel`] sets the job's cancellation flag.
//!
//! Sync and async calls run the same job function; only the waiting differs (`blocking.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::blocking::{self, Failure};
use crossbeam_channel::{Receiver, Sender};
use pyo3::prelude::*;

/// A queued job.
type Job = Box<dyn FnOnce() + Send>;

/// Fewest driver threads; more on machines with more cores.
const MIN_DRIVERS: usize = 4;

/// The job queue, with its driver threads started on first use.
fn queue() -> PyResult<&'static Sender<Job>> {
    static QUEUE: OnceLock<Option<Sender<Job>>> = OnceLock::new();
    QUEUE
        .get_or_init(start_drivers)
        .as_ref()
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("cannot start zcrop's threads"))
}

fn start_drivers() -> Option<Sender<Job>> {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let drivers = (2 * cores).max(MIN_DRIVERS);
    let (tx, rx) = crossbeam_channel::unbounded::<Job>();
    let started = (0..drivers)
        .filter(|i| {
            let rx: Receiver<Job> = rx.clone();
            std::thread::Builder::new()
                .name(format!("zcrop-async-{i}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .is_ok()
        })
        .count();
    (started > 0).then_some(tx)
}

/// A job in flight, as Python sees it: it can be cancelled.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct Pending {
    cancel: Arc<AtomicBool>,
}

#[pymethods]
impl Pending {
    /// Asks the job to stop; it then completes with `zcrop.CancelledError` unless it was done.
    fn cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Whether cancellation was asked for.
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
}

/// Queues `work` and returns at once. When it is done, `convert` turns its output into a Python
/// value (with the GIL) and `notify(None, value)` is called; on failure `notify(exc, None)`.
pub(crate) fn submit<T, W, C>(notify: Py<PyAny>, work: W, convert: C) -> PyResult<Pending>
where
    T: Send + 'static,
    W: FnOnce(&AtomicBool) -> Result<T, Failure> + Send + 'static,
    C: for<'py> FnOnce(Python<'py>, T) -> PyResult<Bound<'py, PyAny>> + Send + 'static,
{
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    let job: Job = Box::new(move || {
        let result = blocking::guarded(|| work(&flag));
        // Nothing to notify once the interpreter is gone.
        let _ = Python::try_attach(|py| {
            let outcome = blocking::finish(py, result).and_then(|v| convert(py, v));
            let args = match outcome {
                Ok(value) => (py.None(), value.unbind()),
                Err(e) => (e.into_value(py).into_any(), py.None()),
            };
            if let Err(e) = notify.call1(py, args) {
                // The callback itself failed (for example its loop was closed): report it the
                // way Python reports errors nobody can catch.
                e.write_unraisable(py, Some(notify.bind(py)));
            }
        });
    });
    queue()?
        .send(job)
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("zcrop's threads have stopped"))?;
    Ok(Pending { cancel })
}
