//! What an engine's clones and its batches share: the work queue, the worker threads and how
//! to wake them, the workers' context. The workers stop when the last holder drops it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use crate::coalesce::CoalesceLimits;
use crate::config::{BackendKind, IoConfig};
use crate::fork::{self, PerProcess};
use crate::worker::Work;
use crate::worker::local::Local;
use crate::worker::op::Ctx;

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) queue: Option<Sender<Work>>,
    /// The queue's receiving end, for consumers that help while they wait.
    pub(crate) helper: Receiver<Work>,
    /// Whether consumers try page-cache reads while they wait (not with `O_DIRECT`, nor with
    /// [`FastPath::Never`]).
    pub(crate) consumers_help: bool,
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) backend: BackendKind,
    pub(crate) fallback_reason: Option<String>,
    pub(crate) coalesce: CoalesceLimits,
    pub(crate) queue_depth: usize,
    /// Planned reads per queued run: [`RUN_LEN`] for io_uring; 1 for the portable backend,
    /// whose threads each block on one read at a time (longer runs would leave threads idle).
    pub(crate) run_len: usize,
    pub(crate) threads: Vec<JoinHandle<()>>,
    #[cfg(target_os = "linux")]
    pub(crate) wakers: Vec<Arc<crate::sys::EventFd>>,
    /// What the engine was started with, to start it again in a child of `fork`.
    pub(crate) config: IoConfig,
    /// Whether this is a process's [`IoEngine::shared`](super::IoEngine::shared) engine.
    pub(crate) shared: bool,
    /// The engine that replaces this one in a child of `fork`.
    pub(crate) successor: PerProcess<super::IoEngine>,
    /// The process generation that started the engine ([`fork::generation`]).
    pub(crate) generation: u64,
}

impl Inner {
    /// Wakes the io_uring workers (the portable workers wake on their own).
    pub(crate) fn wake(&self) {
        #[cfg(target_os = "linux")]
        for w in &self.wakers {
            w.notify();
        }
    }

    /// Hands an item back to the backend workers.
    pub(crate) fn requeue(&self, work: Work, local: &mut Local) {
        match &self.queue {
            Some(q) => match q.send(work) {
                Ok(()) => self.wake(),
                Err(crossbeam_channel::SendError(w)) => w.fail_shutdown(local),
            },
            None => work.fail_shutdown(local),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.generation != fork::generation() {
            // A parent's engine in a child of `fork`: its threads do not exist here.
            std::mem::forget(std::mem::take(&mut self.threads));
            std::mem::forget(self.queue.take());
            return;
        }
        self.ctx.shutdown.store(true, Ordering::Release);
        // Closing the queue ends the portable workers' loops.
        self.queue.take();
        #[cfg(target_os = "linux")]
        for w in &self.wakers {
            w.notify();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
