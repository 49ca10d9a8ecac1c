//! Typed errors. Each names the array and, where it applies, the store key and byte range.

use std::path::PathBuf;
use std::sync::Arc;

use zcrop_io::{IoError, ReadRange};

/// Where in a store something went wrong: the array (or group), the key, and the byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The array or group path inside its store (`/` for the root).
    pub node: String,
    /// The store key (relative to the store root), e.g. `temp/c/0/3/1/2`.
    pub key: String,
    /// The bytes concerned, when a read was involved.
    pub range: Option<ReadRange>,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "array {:?}, key {:?}", self.node, self.key)?;
        if let Some(r) = self.range {
            write!(f, ", {r}")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong opening or reading Zarr data.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ZarrError {
    /// No array or group at this path.
    #[error("no Zarr array or group at {path}", path = .path.display())]
    NodeNotFound {
        /// The path that was opened.
        path: PathBuf,
    },
    /// A group where an array was expected, or the reverse.
    #[error("{path} is a Zarr {found}, not an {expected}", path = .path.display())]
    WrongNodeType {
        /// The path that was opened.
        path: PathBuf,
        /// "array" or "group".
        expected: &'static str,
        /// What is there.
        found: &'static str,
    },
    /// Metadata that is not valid JSON or not valid Zarr metadata.
    #[error("invalid metadata in {path}: {reason}", path = .path.display())]
    InvalidMetadata {
        /// The metadata file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Metadata whose sizes zcrop cannot address: an array of more than 2^64 bytes, or a
    /// chunk or shard index larger than any allocation can be.
    #[error("array {array:?}: {reason}")]
    Oversized {
        /// The array.
        array: String,
        /// Which size, and its limit.
        reason: String,
    },
    /// Memory for a chunk, a read or an output could not be allocated.
    #[error("{what}: cannot allocate {bytes} bytes")]
    OutOfMemory {
        /// What needed the memory, with its array, key and range where they apply.
        what: String,
        /// How much.
        bytes: u64,
    },
    /// A codec zcrop cannot decode.
    #[error("array {array:?} uses codec {codec:?}, which zcrop does not support: {reason}")]
    UnsupportedCodec {
        /// The array.
        array: String,
        /// The codec's name.
        codec: String,
        /// Why.
        reason: String,
    },
    /// A data type zcrop cannot read (variable-length strings, structured types, ...).
    #[error(
        "array {array:?} has data type {data_type}, which zcrop does not read (it reads bool, the numeric types, fixed-length byte and unicode strings, datetime64 and timedelta64)"
    )]
    UnsupportedDataType {
        /// The array.
        array: String,
        /// The data type's name.
        data_type: String,
    },
    /// Other metadata zcrop does not support (chunk grids, storage transformers, ...).
    #[error("array {array:?}: {feature} is not supported")]
    Unsupported {
        /// The array.
        array: String,
        /// What is unsupported.
        feature: String,
    },
    /// A read outside the array, or of the wrong dimensionality.
    #[error("array {array:?} of shape {shape:?}: {reason}")]
    OutOfBounds {
        /// The array.
        array: String,
        /// Its shape.
        shape: Vec<u64>,
        /// What was asked.
        reason: String,
    },
    /// A bad argument (wrong buffer size, mismatched lengths).
    #[error("{0}")]
    InvalidArgument(String),
    /// Reading bytes failed.
    #[error("{at}: {source}")]
    Io {
        /// Where.
        at: Box<Location>,
        /// The IO error.
        #[source]
        source: Box<IoError>,
    },
    /// Bytes that do not decode (truncated, garbage, checksum mismatch).
    #[error("{at}: cannot decode chunk: {reason}")]
    Codec {
        /// Where.
        at: Box<Location>,
        /// What the decoder said.
        reason: String,
    },
    /// A shard index that is corrupt or points outside its shard.
    #[error("{at}: bad shard index: {reason}")]
    ShardIndex {
        /// Where.
        at: Box<Location>,
        /// What is wrong.
        reason: String,
    },
    /// A virtual chunk (an Icechunk reference to a range of another file or object) that
    /// cannot be read: its target is missing, changed since the reference was written, too
    /// short, or not under a container the caller allowed.
    #[error("{at}: virtual chunk {chunk:?}: {reason}")]
    VirtualChunk {
        /// The array, the target's URL and the referenced range.
        at: Box<Location>,
        /// The chunk's coordinates in the storage grid.
        chunk: Vec<u64>,
        /// What is wrong.
        reason: String,
    },
    /// A read was cancelled through its cancellation flag.
    #[error("the read was cancelled")]
    Cancelled,
    /// A transform's per-block step failed.
    #[error("transform failed on block {request}: {reason}")]
    Transform {
        /// The request (crop) index.
        request: usize,
        /// What it said.
        reason: String,
    },
    /// The IO engine could not start.
    #[error("{0}")]
    Engine(Arc<zcrop_io::EngineError>),
}

impl ZarrError {
    /// Whether this error means "nothing there" (a missing store or node).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ZarrError::NodeNotFound { .. })
    }
}

impl From<zcrop_io::EngineError> for ZarrError {
    fn from(e: zcrop_io::EngineError) -> Self {
        ZarrError::Engine(Arc::new(e))
    }
}

/// Shorthand.
pub type Result<T, E = ZarrError> = std::result::Result<T, E>;
