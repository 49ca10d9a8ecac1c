//! [`ReadRange`]: which bytes of a file a request reads. A leaf module (errors name ranges).

use std::fmt;

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
