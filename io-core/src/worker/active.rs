//! A physical read in progress: its buffer, its budget, the next syscall it needs, and how it
//! ends (served, cut short by the end of the file, failed).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use crate::budget::Permit;
use crate::error::IoError;
use crate::sys::{self, ReadBuf};

use super::local::Local;
use super::op::Target;
use super::resolve::Resolved;

/// A physical read in progress: its buffer fills as the kernel delivers bytes.
#[derive(Debug)]
pub(crate) struct Active {
    pub(super) res: Resolved,
    pub(super) buf: ReadBuf,
    /// Its share of the budget; `None` only while it waits in the queue as [`Work::Missed`].
    pub(super) permit: Option<Permit>,
}

/// What the next syscall of an [`Active`] read should do.
pub(crate) struct NextRead {
    pub(crate) fd: RawFd,
    pub(crate) ptr: *mut u8,
    pub(crate) len: u32,
    pub(crate) offset: u64,
}

/// Largest single read syscall we issue (the kernel caps reads near 2 GiB anyway).
const MAX_READ_PER_CALL: usize = 1 << 30;

/// The outcome of one non-blocking attempt at a read.
pub(crate) enum Attempt {
    /// Finished (served from the page cache, or failed) and delivered.
    Done,
    /// Not (all) in the page cache: the device must be asked.
    Missed(Active),
    /// This file (or filesystem) does not support non-blocking reads.
    Unsupported(Active),
}

impl Active {
    /// Gives the budget back (before queueing the read as [`Work::Missed`]).
    pub(crate) fn release_budget(mut self) -> Self {
        self.permit = None;
        self
    }

    /// Bytes the budget is charged for.
    pub(crate) fn charge(&self) -> u64 {
        self.res.read_len
    }

    /// Takes `permit` as its budget.
    pub(crate) fn with_budget(mut self, permit: Permit) -> Self {
        self.permit = Some(permit);
        self
    }

    /// Buffer bytes needed before the request is satisfied.
    fn need(&self) -> usize {
        (self.res.offset - self.res.read_start + self.res.len) as usize
    }

    /// Whether all requested bytes have arrived.
    pub(crate) fn is_complete(&self) -> bool {
        self.buf.filled() >= self.need()
    }

    /// Whether a short read means the end of the file: a read returned 0, or an `O_DIRECT`
    /// read stopped at an unaligned length (which only the end of the file produces).
    fn hit_eof(&self, last: usize) -> bool {
        last == 0
            || self
                .res
                .file
                .direct_align
                .is_some_and(|(_, a)| !(self.buf.filled() as u64).is_multiple_of(a))
    }

    /// The next read to issue for the missing bytes.
    pub(crate) fn next_read(&mut self) -> NextRead {
        let filled = self.buf.filled();
        let (ptr, spare) = self.buf.spare();
        NextRead {
            fd: self.res.file.file.as_raw_fd(),
            ptr,
            len: spare.min(MAX_READ_PER_CALL) as u32,
            offset: self.res.read_start + filled as u64,
        }
    }

    /// The buffer, for the io_uring backend to record what the kernel wrote into it.
    pub(crate) fn buf_mut(&mut self) -> &mut ReadBuf {
        &mut self.buf
    }

    /// One `pread` (or `preadv2(RWF_NOWAIT)`) for the missing bytes.
    pub(crate) fn pread_once(&mut self, nowait: bool) -> std::io::Result<usize> {
        let offset = self.res.read_start + self.buf.filled() as u64;
        sys::pread(
            &self.res.file.file,
            &mut self.buf,
            offset,
            MAX_READ_PER_CALL,
            nowait,
        )
    }

    /// After a syscall returned `n` bytes (already recorded): finishes and delivers the read if
    /// it is over and returns `None`, or returns the read if more must be read (a short read:
    /// the caller issues [`Self::next_read`] again).
    pub(crate) fn after_read(self, n: usize, t: &Target, local: &mut Local) -> Option<Self> {
        if self.is_complete() {
            self.finish_ok(t, local);
            None
        } else if self.hit_eof(n) {
            self.finish_eof(t, local);
            None
        } else {
            local.counters.short_read_resubmits += 1;
            Some(self)
        }
    }

    /// One non-blocking read from the page cache (`preadv2(RWF_NOWAIT)`).
    pub(crate) fn try_cached(mut self, t: &Target, local: &mut Local) -> Attempt {
        match self.pread_once(true) {
            Ok(n) => {
                local.counters.fast_path_hits += 1;
                match self.after_read(n, t, local) {
                    None => Attempt::Done,
                    // Partly cached: the device reads the rest.
                    Some(rest) => Attempt::Missed(rest),
                }
            }
            Err(e) => match e.raw_os_error() {
                Some(libc::EAGAIN) => {
                    local.counters.fast_path_misses += 1;
                    Attempt::Missed(self)
                }
                Some(libc::EOPNOTSUPP) => Attempt::Unsupported(self),
                Some(libc::EINTR) => Attempt::Missed(self),
                _ => {
                    self.finish_err(e, t, local);
                    Attempt::Done
                }
            },
        }
    }

    /// Completes every request from the buffer.
    fn finish_ok(self, t: &Target, local: &mut Local) {
        if self.res.past_eof {
            return self.finish_eof(t, local);
        }
        local.counters.physical_reads += 1;
        local.counters.bytes_read += self.buf.filled() as u64;
        let lead = (self.res.offset - self.res.read_start) as usize;
        let len = self.res.len as usize;
        let all = self.buf.into_bytes();
        let data = if lead == 0 && len == all.len() {
            all
        } else {
            all.slice(lead..lead + len)
        };
        self.res.op.serve(data, self.permit, t, local);
    }

    /// The file ended before the read did: requests wholly inside the bytes obtained succeed,
    /// the others fail with [`IoError::RangePastEof`].
    fn finish_eof(self, t: &Target, local: &mut Local) {
        local.counters.physical_reads += 1;
        local.counters.bytes_read += self.buf.filled() as u64;
        let lead = (self.res.offset - self.res.read_start) as usize;
        let got = self.buf.filled().saturating_sub(lead);
        let file_len = self
            .res
            .file
            .file
            .metadata()
            .map_or(self.res.read_start + self.buf.filled() as u64, |m| m.len());
        let data = self.buf.into_bytes();
        let data = data.slice(lead.min(data.len())..);
        // A whole-file or suffix read that ended early lost bytes it was sized for.
        self.res
            .op
            .serve_within(data, got as u64, false, file_len, self.permit, t, local);
    }

    /// Fails every request with the OS error `e`.
    pub(crate) fn finish_err(self, e: std::io::Error, t: &Target, local: &mut Local) {
        let err = IoError::from_os(e, &t.path, self.res.op.range);
        let Active { res, permit, .. } = self;
        res.op.fail(&err, t, local);
        drop(permit);
    }

    /// Fails every request because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        let Active { res, permit, .. } = self;
        res.op.fail_shutdown(t, local);
        drop(permit);
    }

    /// Fails every request with `e` and leaks the buffer instead of freeing it: for reads the
    /// kernel may still be writing into (an io_uring ring that broke mid-flight).
    pub(crate) fn abandon(self, e: &std::io::Error, t: &Target, local: &mut Local) {
        let err = IoError::from_os(
            std::io::Error::new(e.kind(), e.to_string()),
            &t.path,
            self.res.op.range,
        );
        let Active { res, buf, permit } = self;
        std::mem::forget(buf);
        res.op.fail(&err, t, local);
        drop(permit);
    }

    /// Reads to the end with blocking `pread`s.
    pub(crate) fn run_blocking(mut self, t: &Target, local: &mut Local) {
        loop {
            match self.pread_once(false) {
                Ok(n) => match self.after_read(n, t, local) {
                    None => return,
                    Some(again) => self = again,
                },
                Err(e) if is_retryable(&e) => local.counters.retries += 1,
                Err(e) => return self.finish_err(e, t, local),
            }
        }
    }
}

/// `EINTR` and `EAGAIN`: try the same read again.
pub(crate) fn is_retryable(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN))
}

impl Resolved {
    /// Allocates the buffer under `permit`; `None` when the memory cannot be had (the read
    /// then fails with [`IoError::OutOfMemory`], delivered here).
    pub(crate) fn activate(self, permit: Permit, t: &Target, local: &mut Local) -> Option<Active> {
        let align = self.file.direct_align.map(|(mem, _)| mem);
        let Some(buf) = usize::try_from(self.read_len)
            .ok()
            .and_then(|len| ReadBuf::try_new(len, align, self.recycle))
        else {
            let err = IoError::OutOfMemory {
                path: Arc::clone(&t.path),
                range: self.op.range,
                bytes: self.read_len,
            };
            self.op.fail(&err, t, local);
            return None;
        };
        Some(Active {
            res: self,
            buf,
            permit: Some(permit),
        })
    }
}
