//! What callers ask for ([`ReadRequest`]) and what they get back ([`Completion`]).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::IoError;
pub use crate::range::ReadRange;

/// The caller's tag for a request; completions carry it back so the consumer can act on each
/// result as soon as it arrives (for example decode that chunk).
pub type RequestId = u64;

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
