//! From a planned read to one ready to be read: the file opened (and checked for this batch),
//! the range checked against its length, or the read served from a mapping right away.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use crate::error::IoError;
use crate::files::cache::OpenFile;
use crate::files::residency::{mapped_range, within};
use crate::range::ReadRange;

use super::local::Local;
use super::op::{Ctx, PhysOp, Target};

/// A physical read whose file is open and whose byte range is known.
#[derive(Debug)]
pub(crate) struct Resolved {
    pub(crate) op: PhysOp,
    pub(crate) file: Arc<OpenFile>,
    /// Absolute offset of the requested bytes.
    pub(crate) offset: u64,
    /// Number of requested bytes.
    pub(crate) len: u64,
    /// Absolute offset where reading starts (`offset` rounded down under `O_DIRECT`).
    pub(crate) read_start: u64,
    /// Bytes to read from `read_start` (rounded up under `O_DIRECT`).
    pub(crate) read_len: u64,
    /// The buffer comes from the process's buffer pool.
    pub(crate) recycle: bool,
    /// The planned range ends past the end of the file and `len` was cut to what there is.
    pub(crate) past_eof: bool,
}

impl Resolved {
    /// Bytes the budget is charged for.
    pub(crate) fn charge(&self) -> u64 {
        self.read_len
    }

    /// Fails the read because the engine is shutting down.
    pub(crate) fn fail_shutdown(self, t: &Target, local: &mut Local) {
        self.op.fail_shutdown(t, local);
    }
}

/// What [`resolve`] made of a planned read.
pub(crate) enum Resolution {
    /// Ready to be charged to the budget and read.
    Read(Resolved),
    /// Finished without IO (an error, or an empty range) and already delivered.
    Finished,
}

/// Serves `op` from `data`, its bytes in a mapped file, without a copy (one "physical read",
/// as reading the range would have been).
fn serve_mapped(op: PhysOp, data: Bytes, t: &Target, local: &mut Local) {
    local.counters.physical_reads += 1;
    local.counters.mapped_reads += 1;
    local.counters.bytes_read += data.len() as u64;
    op.serve(data, None, t, local);
}

/// Opens the file and fixes the byte range. Errors and empty ranges are delivered here.
pub(crate) fn resolve(op: PhysOp, t: &Target, ctx: &Ctx, local: &mut Local) -> Resolution {
    if t.sink.dropped.load(Ordering::Acquire) {
        local.counters.skipped_reads += 1;
        return Resolution::Finished;
    }
    let file = match local.file(&t.path, ctx, t.sink.generation) {
        Ok(f) => f,
        Err(e) => {
            let err = IoError::from_os(e, &t.path, op.range);
            op.fail(&err, t, local);
            return Resolution::Finished;
        }
    };
    // (`sink.map` is never set on an `O_DIRECT` engine.)
    if t.sink.map
        && within(op.range, file.known_len())
        && let Some(map) = file.mapped(&t.path, ctx.map_files)
        && let Some((start, end)) = mapped_range(
            op.range,
            &file.file,
            map,
            ctx.map_files,
            Some((&mut local.map_probe, &mut local.map_window)),
            &mut local.map_clock,
        )
    {
        let data = map.bytes.slice(start..end);
        serve_mapped(op, data, t, local);
        return Resolution::Finished;
    }
    let (offset, len, past_eof) = match op.range {
        // A range is checked against the file's length before its buffer is allocated: the
        // range may come from a corrupt index (a length of 2^62 must not become an
        // allocation). Within the length known from the last check, that costs nothing.
        ReadRange::Bounded { offset, len } if len > 0 => {
            let end = offset.checked_add(len);
            if end.is_some_and(|end| end <= file.known_len()) {
                (offset, len, false)
            } else {
                let file_len = match file.current_len() {
                    Ok(n) => n,
                    Err(e) => {
                        let err = IoError::from_os(e, &t.path, op.range);
                        op.fail(&err, t, local);
                        return Resolution::Finished;
                    }
                };
                if end.is_some_and(|end| end <= file_len) {
                    (offset, len, false)
                } else if offset < file_len {
                    // Read what there is; the requests past the end fail once it is read.
                    (offset, file_len - offset, true)
                } else {
                    op.serve_within(Bytes::new(), 0, false, file_len, None, t, local);
                    return Resolution::Finished;
                }
            }
        }
        // Whole-file, suffix and empty reads need the length now.
        range => {
            let file_len = match file.file.metadata() {
                Ok(m) => m.len(),
                Err(e) => {
                    let err = IoError::from_os(e, &t.path, range);
                    op.fail(&err, t, local);
                    return Resolution::Finished;
                }
            };
            match range.resolve(file_len) {
                Some((offset, len)) => (offset, len, false),
                None => {
                    let err = IoError::RangePastEof {
                        path: Arc::clone(&t.path),
                        range,
                        file_len,
                    };
                    op.fail(&err, t, local);
                    return Resolution::Finished;
                }
            }
        }
    };
    if len == 0 {
        op.serve(Bytes::new(), None, t, local);
        return Resolution::Finished;
    }
    let (read_start, read_len) = match file.direct_align {
        Some((_, a)) => {
            let start = offset & !(a - 1);
            let end = (offset + len).div_ceil(a) * a;
            (start, end - start)
        }
        None => (offset, len),
    };
    Resolution::Read(Resolved {
        op,
        file,
        offset,
        len,
        read_start,
        read_len,
        recycle: ctx.recycle,
        past_eof,
    })
}
