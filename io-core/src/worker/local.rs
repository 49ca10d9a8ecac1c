//! Each thread's [`Local`] state (results buffered for their batches, budget credit, the file
//! it last read, counters), and how a planned read delivers its results or its error.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::budget::{Budget, Permit};
use crate::error::IoError;
use crate::files::cache::OpenFile;
use crate::files::residency::{CacheProbe, CoarseClock, WindowRetry, mapped_range, within};
use crate::metrics::Counters;
use crate::request::{Completion, ReadRequest};

use super::op::{Ctx, DELIVERY_CAPACITY, Delivery, Part, Parts, PhysOp, Sink, Target};

/// Reads of one file in a row after which a thread reads it through its own open file
/// ([`OpenFile::reopen`]). Opening costs a few microseconds; this many reads make that cost
/// negligible, and a thread that hops between files never pays it.
const OWN_FILE_AFTER: u32 = 1024;

/// Reads whose budget a thread takes ahead at once ([`Local::charge`]): one update of the
/// shared counters per this many reads instead of per read.
const CREDIT_READS: usize = 16;

/// Reads larger than this are charged one by one (credit for many of them would hold a large
/// share of the byte budget idle).
const CREDIT_MAX_READ: u64 = 64 << 10;

/// Per-thread state of a worker (or a helping consumer): results not yet delivered, counters
/// not yet published, the last file used, and budget taken ahead.
#[derive(Debug, Default)]
pub(crate) struct Local {
    pending: Vec<(Arc<Sink>, Delivery)>,
    pending_count: usize,
    pub(crate) counters: Counters,
    last_file: Option<(Arc<Path>, Arc<OpenFile>)>,
    /// Uses of `last_file` in a row.
    streak: u32,
    /// Budget taken for this thread's next reads and not yet handed to one; given back at
    /// every flush, so a thread never sits on budget while it waits.
    credit: Option<Permit>,
    /// Whether ranges of mapped files keep being found in memory ([`MapFiles::WhenCached`]).
    pub(crate) map_probe: CacheProbe,
    /// How this thread's recent asks about whole windows of mapped files went.
    pub(crate) map_window: WindowRetry,
    /// The time for [`ResidentMemo`]'s answers.
    pub(crate) map_clock: CoarseClock,
}

impl Local {
    /// Buffers results for `sink`.
    fn deliver(
        &mut self,
        sink: &Arc<Sink>,
        completions: impl Iterator<Item = Completion>,
        permit: Option<Permit>,
    ) {
        let slot = match self.pending.iter().position(|(s, _)| Arc::ptr_eq(s, sink)) {
            Some(i) => i,
            None => {
                let d = Delivery {
                    completions: Vec::with_capacity(DELIVERY_CAPACITY),
                    permits: Vec::new(),
                };
                self.pending.push((Arc::clone(sink), d));
                self.pending.len() - 1
            }
        };
        let d = &mut self.pending[slot].1;
        let before = d.completions.len();
        d.completions.extend(completions);
        self.pending_count += d.completions.len() - before;
        if let Some(p) = permit {
            // One permit per delivery (and budget): one release when the consumer takes it.
            let unmerged = match d.permits.last_mut() {
                Some(last) => last.merge(p).err(),
                None => Some(p),
            };
            d.permits.extend(unmerged);
        }
    }

    /// Serves `request` from a mapping of its file right here, where [`resolve`] would serve
    /// it mapped and no system call is needed to know it (its file maps, its range is inside,
    /// and, by the policy, recently found in memory): its bytes, or `None` to plan and read it
    /// as usual (which also reports any error).
    ///
    /// It never opens a file the engine has not opened, nor maps one it has not mapped: those
    /// are left to the workers.
    pub(crate) fn try_mapped(
        &mut self,
        request: &ReadRequest,
        ctx: &Ctx,
        generation: u64,
    ) -> Option<Bytes> {
        let last = matches!(&self.last_file,
            Some((p, _)) if Arc::ptr_eq(p, &request.path) || **p == *request.path);
        if !last && !ctx.fds.is_open(&request.path, ctx.direct) {
            return None;
        }
        let file = self.file(&request.path, ctx, generation).ok()?;
        if !within(request.range, file.known_len()) {
            return None;
        }
        let map = file.mapped_if_known(&request.path, ctx.map_files)?;
        let (start, end) = mapped_range(
            request.range,
            &file.file,
            map,
            ctx.map_files,
            None,
            &mut self.map_clock,
        )?;
        self.counters.physical_reads += 1;
        self.counters.mapped_reads += 1;
        self.counters.bytes_read += (end - start) as u64;
        Some(map.bytes.slice(start..end))
    }

    /// Results buffered and not yet sent.
    pub(crate) fn pending(&self) -> usize {
        self.pending_count
    }

    /// Publishes the counters and sends every buffered delivery. Counters go first: whoever
    /// receives a delivery then also sees the counts of the reads that made it.
    pub(crate) fn flush(&mut self, ctx: &Ctx) {
        self.release_credit();
        self.map_clock.forget();
        ctx.metrics.publish(&mut self.counters);
        for (sink, d) in self.pending.drain(..) {
            // A dropped batch no longer listens; its permits are released right here.
            let _ = sink.tx.send(d);
        }
        self.pending_count = 0;
    }

    /// Takes the buffered deliveries for `sink` (a consumer helping itself skips the channel).
    pub(crate) fn take_for(&mut self, sink: &Arc<Sink>) -> Option<Delivery> {
        let i = self
            .pending
            .iter()
            .position(|(s, _)| Arc::ptr_eq(s, sink))?;
        let (_, d) = self.pending.swap_remove(i);
        self.pending_count -= d.completions.len();
        Some(d)
    }

    /// Budget for one read of `bytes`: from this thread's credit, which is refilled for
    /// [`CREDIT_READS`] reads of this size when it runs short (small reads only); `None` when
    /// the budget cannot spare even this one read now.
    pub(crate) fn charge(&mut self, budget: &Arc<Budget>, bytes: u64) -> Option<Permit> {
        if let Some(p) = self.credit.as_mut().and_then(|c| c.split(bytes)) {
            return Some(p);
        }
        // What is left goes back before more is taken.
        self.credit = None;
        if bytes <= CREDIT_MAX_READ
            && let Some(mut credit) =
                budget.try_acquire_many(CREDIT_READS, bytes * CREDIT_READS as u64)
        {
            let p = credit.split(bytes);
            self.credit = Some(credit);
            return p;
        }
        budget.try_acquire(bytes)
    }

    /// Gives back the budget taken ahead and not used.
    pub(crate) fn release_credit(&mut self) {
        self.credit = None;
    }

    /// The open file for `path` as a read of a batch of `generation` may use it, from the
    /// last one used or the engine's cache. After [`OWN_FILE_AFTER`] uses in a row, this
    /// thread reads the file through its own copy.
    pub(crate) fn file(
        &mut self,
        path: &Arc<Path>,
        ctx: &Ctx,
        generation: u64,
    ) -> std::io::Result<Arc<OpenFile>> {
        if let Some((p, f)) = &mut self.last_file
            && (Arc::ptr_eq(p, path) || **p == **path)
            && f.checked_for(generation)
        {
            self.streak = self.streak.saturating_add(1);
            if self.streak == OWN_FILE_AFTER
                && let Some(own) = f.reopen()
            {
                *f = Arc::new(own);
                self.counters.own_files += 1;
            }
            return Ok(Arc::clone(f));
        }
        self.last_file = None;
        let opened = ctx.fds.get(path, ctx.direct, generation)?;
        if opened.direct_fell_back {
            self.counters.direct_fallbacks += 1;
        }
        self.last_file = Some((Arc::clone(path), Arc::clone(&opened.file)));
        self.streak = 1;
        Ok(opened.file)
    }
}

impl PhysOp {
    /// Fails every request this read serves with `err`.
    pub(crate) fn fail(self, err: &IoError, t: &Target, local: &mut Local) {
        local.counters.errors += self.parts.as_slice().len() as u64;
        let completions = self.parts.as_slice().iter().map(|p| Completion {
            id: p.id,
            result: Err(err.with_range(p.range)),
        });
        local.deliver(&t.sink, completions, None);
    }

    /// Fails every request because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        let err = IoError::Shutdown {
            path: Arc::clone(&t.path),
            range: self.range,
        };
        self.fail(&err, t, local);
    }

    /// Serves the requests wholly inside the first `got` bytes of `data` (the physical read,
    /// cut short by the end of the file) and fails the others with
    /// [`IoError::RangePastEof`]; whole-file and suffix requests count as inside only when
    /// `open_ended_fit`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn serve_within(
        self,
        data: Bytes,
        got: u64,
        open_ended_fit: bool,
        file_len: u64,
        permit: Option<Permit>,
        t: &Target,
        local: &mut Local,
    ) {
        let fits = |p: &Part| {
            p.len
                .map_or(open_ended_fit, |len| p.offset_in_read + len <= got)
        };
        if self.parts.as_slice().iter().all(fits) {
            self.serve(data, permit, t, local);
            return;
        }
        let mut errors = 0;
        let completions: Vec<Completion> = self
            .parts
            .as_slice()
            .iter()
            .map(|p| {
                let result = if fits(p) {
                    Ok(slice_part(&data, p))
                } else {
                    errors += 1;
                    Err(IoError::RangePastEof {
                        path: Arc::clone(&t.path),
                        range: p.range,
                        file_len,
                    })
                };
                Completion { id: p.id, result }
            })
            .collect();
        local.counters.errors += errors;
        local.deliver(&t.sink, completions.into_iter(), permit);
    }

    /// Serves every request from `data` (the bytes of the whole physical range).
    pub(crate) fn serve(self, data: Bytes, permit: Option<Permit>, t: &Target, local: &mut Local) {
        match self.parts {
            // The usual case: `data` itself is the result, no reference count to update.
            Parts::One(p)
                if p.offset_in_read == 0 && p.len.is_none_or(|l| l == data.len() as u64) =>
            {
                let completion = Completion {
                    id: p.id,
                    result: Ok(data),
                };
                local.deliver(&t.sink, std::iter::once(completion), permit);
            }
            parts => {
                let completions = parts.as_slice().iter().map(|p| Completion {
                    id: p.id,
                    result: Ok(slice_part(&data, p)),
                });
                local.deliver(&t.sink, completions, permit);
            }
        }
    }
}

fn slice_part(data: &Bytes, p: &Part) -> Bytes {
    let start = p.offset_in_read as usize;
    match p.len {
        Some(len) if start == 0 && len as usize == data.len() => data.clone(),
        Some(len) => data.slice(start..start + len as usize),
        None => data.clone(),
    }
}
