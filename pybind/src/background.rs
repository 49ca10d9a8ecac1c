//! Work for the async API: run on a pool of up to `max(4, 2 x cores)` threads (`pool.rs`,
//! started on demand), completed by a callback.
//!
//! `submit` queues a job that owns everything it touches (the array handle, the request, the
//! output buffer it allocates), so the caller returns at once and no Python object is borrowed
//! while the GIL is released. A pool thread runs the job (IO waits there; decoding fans out to
//! the rayon pool), then attaches to Python and calls `notify(error, value)`. The Python side
//! passes a `notify` that hands the result to its asyncio loop with `call_soon_threadsafe`, so
//! this module knows nothing of asyncio. [`Pending::cancel`] sets the job's cancellation flag.
//!
//! Sync and async calls run the same job function; only the waiting differs (`blocking.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::blocking::{self, Failure};
use crate::pool::{Job, Pool};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use zcrop::io::fork::PerProcess;

/// Fewest threads running async work; more on machines with more cores.
const MIN_THREADS: usize = 4;

/// The threads that run async work (IO waits there; decoding fans out to the rayon pool); a
/// child of `fork` starts its own.
fn pool() -> &'static Pool {
    static POOL: PerProcess<Pool> = PerProcess::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Pool::new("zcrop-async", (2 * cores).max(MIN_THREADS))
    })
}

/// Pool threads attached to Python to deliver a result, or about to (in this process: a
/// child of `fork` has none of its parent's).
fn attached() -> &'static AtomicUsize {
    static ATTACHED: PerProcess<AtomicUsize> = PerProcess::new();
    ATTACHED.get_or_init(|| AtomicUsize::new(0))
}

/// Set at interpreter exit ([`quiesce`]): no thread attaches any more.
static CLOSING: AtomicBool = AtomicBool::new(false);

/// How long interpreter exit waits for results being delivered.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Runs `f` attached to Python, unless the interpreter is exiting. A thread that attached
/// while the interpreter exits would have its thread state torn down under it (Python aborts
/// when it then lets go of the GIL): [`quiesce`], run at exit, waits for these calls to end
/// and lets no new one in.
fn attach_unless_closing<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    attached().fetch_add(1, Ordering::AcqRel);
    let out = if CLOSING.load(Ordering::Acquire) {
        None
    } else {
        Python::try_attach(f)
    };
    attached().fetch_sub(1, Ordering::AcqRel);
    out
}

/// Registered with `atexit` when the module loads (exit handlers run while the interpreter is
/// still whole): stops pool threads from attaching to deliver results, and waits, with the GIL
/// released, up to [`EXIT_WAIT`] for those delivering one now (a callback that waits on a
/// socket, as asyncio's `call_soon_threadsafe` does, releases the GIL mid-call).
#[pyfunction]
pub(crate) fn quiesce(py: Python<'_>) {
    CLOSING.store(true, Ordering::Release);
    py.detach(|| {
        let start = Instant::now();
        while attached().load(Ordering::Acquire) > 0 && start.elapsed() < EXIT_WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
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
        let _ = attach_unless_closing(|py| {
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
    pool()
        .execute(job)
        .map_err(|_| PyRuntimeError::new_err("cannot start a thread for zcrop's async reads"))?;
    Ok(Pending { cancel })
}
