//! What callers ask for ([`ReadRequest`]) and what they get back ([`Completion`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::IoError;

/// The caller's tag for a request; completions carry it back so the consumer can act on each
/// result as soon as it arrives (for example decode that chunk).
pub type RequestId = u64;

/// Which bytes of a file to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadRange {
    /// `len` bytes starting at `offset`.
    Bounded {
        /// First byte.
        offset: u64,
        /// Number of bytes.
        len: u64,
    },
    /// The whole file, whatever its length.
    Whole,
    /// The last `n` bytes of the file (a Zarr shard index at the end of its shard).
    Suffix(u64),
}

impl ReadRange {
    /// `len` bytes at `offset`.
    pub const fn new(offset: u64, len: u64) -> Self {
        ReadRange::Bounded { offset, len }
    }

    /// Resolves the range against a file of `file_len` bytes: `(offset, len)`, or `None` when it
    /// does not fit in the file.
    pub fn resolve(self, file_len: u64) -> Option<(u64, u64)> {
        match self {
            ReadRange::Bounded { offset, len } => {
                let end = offset.checked_add(len)?;
                (end <= file_len).then_some((offset, len))
            }
            ReadRange::Whole => Some((0, file_len)),
            ReadRange::Suffix(n) => (n <= file_len).then(|| (file_len - n, n)),
        }
    }
}

impl fmt::Display for ReadRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReadRange::Bounded { offset, len } => {
                write!(f, "bytes {offset}..{}", offset.saturating_add(len))
            }
            ReadRange::Whole => f.write_str("the whole file"),
            ReadRange::Suffix(n) => write!(f, "the last {n} bytes"),
        }
    }
}

/// One read: a file, a range, and the caller's id for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    /// The caller's tag, returned with the result. Ids need not be unique; duplicates of the same
    /// range are read once and served to each.
    pub id: RequestId,
    /// The file to read.
    pub path: Arc<Path>,
    /// The bytes to read.
    pub range: ReadRange,
}

impl ReadRequest {
    /// A request for `range` of `path`, tagged `id`.
    pub fn new(id: RequestId, path: impl Into<Arc<Path>>, range: ReadRange) -> Self {
        ReadRequest {
            id,
            path: path.into(),
            range,
        }
    }
}

/// The outcome of one request: its id and its bytes or error. The bytes are a view of the
/// buffer the read landed in; no copy is made to hand them out.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The id the request carried.
    pub id: RequestId,
    /// The bytes, or why they could not be read.
    pub result: Result<Bytes, IoError>,
}
