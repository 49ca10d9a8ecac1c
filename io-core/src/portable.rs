//! The portable backend: blocking `pread` on a pool of threads. Used where io_uring cannot be
//! (not Linux, seccomp, old kernels, ring setup failure) or when asked for.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::Receiver;

use crate::error::EngineError;
use crate::op::{Ctx, PhysOp, Resolution, resolve};

/// Starts `threads` workers that serve `queue` until it closes.
pub(crate) fn spawn(
    threads: usize,
    queue: &Receiver<PhysOp>,
    ctx: &Arc<Ctx>,
) -> Result<Vec<JoinHandle<()>>, EngineError> {
    (0..threads.max(1))
        .map(|i| {
            let queue = queue.clone();
            let ctx = Arc::clone(ctx);
            std::thread::Builder::new()
                .name(format!("zcrop-pread-{i}"))
                .spawn(move || {
                    for op in &queue {
                        run(op, &ctx);
                    }
                })
                .map_err(EngineError::Spawn)
        })
        .collect()
}

/// Reads one planned read to the end and delivers its results.
pub(crate) fn run(op: PhysOp, ctx: &Ctx) {
    if ctx.shutting_down() {
        return op.fail_shutdown(ctx);
    }
    if let Resolution::Read(r) = resolve(op, ctx) {
        match ctx.budget.acquire(r.charge(), || ctx.shutting_down()) {
            Some(permit) => r.activate(permit).run_blocking(ctx),
            None => r.fail_shutdown(ctx),
        }
    }
}
