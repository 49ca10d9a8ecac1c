//! Planned reads and where their results go, as every part of a read's life sees them: the
//! workers' context ([`Ctx`]), a batch's [`Sink`], the deliveries sent to it, and a planned
//! physical read ([`PhysOp`]) with the requests it serves. A leaf of the worker modules.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_channel::Sender;

use crate::budget::{Budget, Permit};
use crate::config::MapFiles;
use crate::files::cache::FdCache;
use crate::metrics::Metrics;
use crate::range::ReadRange;
use crate::request::{Completion, RequestId};

/// Everything a backend worker shares with the engine.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) fds: FdCache,
    pub(crate) metrics: Metrics,
    pub(crate) budget: Arc<Budget>,
    pub(crate) direct: bool,
    /// Read buffers come from (and return to) the process's buffer pool.
    pub(crate) recycle: bool,
    /// When reads of batches that allow it are served from a mapping of the file.
    pub(crate) map_files: MapFiles,
    pub(crate) shutdown: AtomicBool,
}

impl Ctx {
    pub(crate) fn shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

/// Results a delivery has room for before it grows: the workers send theirs in runs of 64.
pub(crate) const DELIVERY_CAPACITY: usize = 64;

/// Where one batch's results go.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) tx: Sender<Delivery>,
    /// The batch's reads may be served from file mappings (`IoEngine::submit_mapped`, with a
    /// policy other than never).
    pub(crate) map: bool,
    /// The batch was dropped: nobody wants its results, so its reads not yet started are
    /// skipped (one of them might block forever, like the open of a FIFO nobody writes, and
    /// must not hold up whoever takes it from the queue, e.g. a consumer of another batch).
    pub(crate) dropped: AtomicBool,
    /// The batch's place in the order of submissions: files it reads are checked against
    /// their paths unless a check since its submission found them there (see [`FdCache`]).
    pub(crate) generation: u64,
}

/// The generation of the next batch submitted (see [`Sink::generation`]).
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// A generation for a batch submitted now: greater than that of every batch before it.
pub(crate) fn next_generation() -> u64 {
    NEXT_GENERATION.fetch_add(1, Ordering::AcqRel)
}

/// Results sent to a batch in one message. The permits are released when the consumer takes
/// the delivery off the channel.
#[derive(Debug, Default)]
pub(crate) struct Delivery {
    pub(crate) completions: Vec<Completion>,
    pub(crate) permits: Vec<Permit>,
}

/// One requested range served by a physical read.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) id: RequestId,
    /// The range as the caller asked for it (for error messages).
    pub(crate) range: ReadRange,
    /// Where its bytes start in the physical read.
    pub(crate) offset_in_read: u64,
    /// Its length; `None` takes the whole physical read (whole-file and suffix requests).
    pub(crate) len: Option<u64>,
}

/// The requests one physical read serves: usually one, so that case needs no allocation.
#[derive(Debug, Clone)]
pub(crate) enum Parts {
    One(Part),
    Many(Vec<Part>),
}

impl Parts {
    pub(crate) fn as_slice(&self) -> &[Part] {
        match self {
            Parts::One(p) => std::slice::from_ref(p),
            Parts::Many(v) => v,
        }
    }

    pub(crate) fn from_vec(mut v: Vec<Part>) -> Parts {
        if v.len() == 1 {
            Parts::One(v.swap_remove(0))
        } else {
            Parts::Many(v)
        }
    }
}

/// A planned physical read.
#[derive(Debug)]
pub(crate) struct PhysOp {
    /// The file it reads and the batch its results go to: an index into its run's targets.
    pub(crate) target: usize,
    pub(crate) range: ReadRange,
    pub(crate) parts: Parts,
}

/// The file a read reads and the batch its results go to. The reads of a [`Run`] share their
/// run's targets (one per file), so a read served within its run touches no reference count of
/// its own (on cached 4 KiB reads, two threads updating the counts of one shared path and batch
/// for every read cost several percent of the reads per second); a read that leaves its run
/// (to the ring, or back to the queue) takes a copy of its target along.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) path: Arc<Path>,
    pub(crate) sink: Arc<Sink>,
}

/// Planned reads of one batch, queued together: one queue operation per run instead of one per
/// read.
#[derive(Debug)]
pub(crate) struct Run {
    /// One per file the run reads, in the order of its reads.
    pub(crate) targets: Vec<Target>,
    /// At most [`RUN_LEN`], never empty.
    pub(crate) ops: Vec<PhysOp>,
}

/// Planned reads per [`Work::Fresh`] run. Whoever takes a run reads all of it, so runs stay
/// short: a run is also the unit by which IO threads and helping consumers share work.
pub(crate) const RUN_LEN: usize = 16;
