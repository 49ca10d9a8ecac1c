//! The portable backend: blocking `pread` on a pool of threads. Used where io_uring cannot be
//! (not Linux, seccomp, old kernels, ring setup failure) or when asked for.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, TryRecvError};

use super::Work;
use super::local::Local;
use super::op::{Ctx, Target};
use super::resolve::{Resolution, Resolved, resolve};
use crate::error::EngineError;

/// Results a worker buffers before sending them.
const FLUSH_AT: usize = 64;

/// Starts `threads` workers that serve `queue` until it closes.
pub(crate) fn spawn(
    threads: usize,
    queue: &Receiver<Work>,
    ctx: &Arc<Ctx>,
) -> Result<Vec<JoinHandle<()>>, EngineError> {
    (0..threads.max(1))
        .map(|i| {
            let queue = queue.clone();
            let ctx = Arc::clone(ctx);
            std::thread::Builder::new()
                .name(format!("zcrop-pread-{i}"))
                .spawn(move || {
                    let mut local = Local::default();
                    loop {
                        let work = match queue.try_recv() {
                            Ok(w) => w,
                            // Deliver everything before waiting for more work: another worker
                            // may have taken the last item, and consumers wait for these.
                            Err(TryRecvError::Empty) => {
                                local.flush(&ctx);
                                match queue.recv() {
                                    Ok(w) => w,
                                    Err(_) => break,
                                }
                            }
                            Err(TryRecvError::Disconnected) => break,
                        };
                        run(work, &ctx, &mut local);
                        if local.pending() >= FLUSH_AT {
                            local.flush(&ctx);
                        }
                    }
                    local.flush(&ctx);
                })
                .map_err(EngineError::Spawn)
        })
        .collect()
}

/// Reads one item of work to the end.
fn run(work: Work, ctx: &Ctx, local: &mut Local) {
    match work {
        Work::Fresh(run) => {
            for op in run.ops {
                let t = &run.targets[op.target];
                if ctx.shutting_down() {
                    op.fail_shutdown(t, local);
                } else if let Resolution::Read(r) = resolve(op, t, ctx, local) {
                    read(r, t, ctx, local);
                }
            }
        }
        Work::Resolved(r, t) => read(r, &t, ctx, local),
        Work::Missed(active, t) => match charge(active.charge(), ctx, local) {
            Some(p) => (*active).with_budget(p).run_blocking(&t, local),
            None => active.fail_shutdown(&t, local),
        },
    }
}

/// Charges and reads a resolved read to the end.
fn read(resolved: Resolved, t: &Target, ctx: &Ctx, local: &mut Local) {
    match charge(resolved.charge(), ctx, local) {
        Some(p) => {
            if let Some(active) = resolved.activate(p, t, local) {
                active.run_blocking(t, local);
            }
        }
        None => resolved.fail_shutdown(t, local),
    }
}

/// Takes `bytes` of budget, waiting if need be (`None`: the engine is shutting down).
fn charge(bytes: u64, ctx: &Ctx, local: &mut Local) -> Option<crate::budget::Permit> {
    if let Some(p) = ctx.budget.try_acquire(bytes) {
        return Some(p);
    }
    // Results held here keep budget; hand them over before waiting for more.
    local.flush(ctx);
    ctx.budget.acquire(bytes, || ctx.shutting_down())
}
