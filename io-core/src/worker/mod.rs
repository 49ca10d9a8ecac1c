//! What IO threads (and consumers helping them) do with planned reads: the life of one
//! physical read, shared by every backend so they behave identically: [`PhysOp`] (planned) ->
//! [`resolve::resolve`] (file open, range known) -> [`active::Active`] (permit held, buffer
//! allocated, being read) -> one [`Completion`](crate::Completion) per request served,
//! buffered in the thread's [`deliver::Local`] state and delivered to the batch's
//! [`deliver::Sink`] in bulk. The backends run them: [`uring`] (io_uring rings) and
//! [`portable`] (blocking `pread` threads).

pub(crate) mod active;
pub(crate) mod local;
pub(crate) mod op;
pub(crate) mod portable;
pub(crate) mod resolve;
#[cfg(target_os = "linux")]
pub(crate) mod uring;

use self::active::Active;
use self::local::Local;
use self::op::{Run, Target};
use self::resolve::Resolved;

/// An item of an engine's work queue.
#[derive(Debug)]
pub(crate) enum Work {
    /// A run of planned reads nobody has touched.
    Fresh(Run),
    /// A read whose file is open, not yet charged to the budget.
    Resolved(Resolved, Target),
    /// A read whose data was not in the page cache (found by a non-blocking attempt): it needs
    /// the device, so only a backend worker may take it. It holds its buffer but no budget (a
    /// queued item must not hold budget that the workers wait for); the worker charges it again.
    Missed(Box<Active>, Target),
}

impl Work {
    /// Fails every request of the item because the engine is shutting down (or gone).
    pub(crate) fn fail_shutdown(self, local: &mut Local) {
        match self {
            Work::Fresh(run) => {
                for op in run.ops {
                    let t = &run.targets[op.target];
                    op.fail_shutdown(t, local);
                }
            }
            Work::Resolved(r, t) => r.fail_shutdown(&t, local),
            Work::Missed(a, t) => a.fail_shutdown(&t, local),
        }
    }
}
