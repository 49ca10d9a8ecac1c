//! Typed IO errors. Every error names the file and the byte range it concerns.

use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::range::ReadRange;

/// Why a read failed. Each variant carries the file and the requested range, so callers can
/// name them in their own errors (and map them to e.g. Python exceptions) without parsing text.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The file does not exist.
    #[error("{path}: file not found (reading {range})", path = .path.display())]
    NotFound {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
    },
    /// The process may not open or read the file.
    #[error("{path}: permission denied (reading {range}){}", reason_suffix(.reason.as_deref()), path = .path.display())]
    PermissionDenied {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// Why, where more is known than the denial (an object store's error code, missing
        /// credentials).
        reason: Option<Arc<str>>,
    },
    /// The requested range ends after the end of the file.
    #[error("{path}: {range} is past the end of the file ({file_len} bytes)", path = .path.display())]
    RangePastEof {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// The file's length when the read found the end.
        file_len: u64,
    },
    /// The read stopped early and could not be completed (for example an unaligned short
    /// read under `O_DIRECT`).
    #[error("{path}: short read of {range}: got {got} of {wanted} bytes", path = .path.display())]
    ShortRead {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// Bytes obtained.
        got: u64,
        /// Bytes needed.
        wanted: u64,
    },
    /// Any other operating-system error, with its `errno` kind and message.
    #[error("{path}: IO error reading {range}: {source}", path = .path.display())]
    Io {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// The operating-system error.
        #[source]
        source: Arc<io::Error>,
    },
    /// The file lost the range's pages while they were being read from its mapping (another
    /// process truncated it): the bytes read as zeros and must not be used.
    #[error("{path}: the file shrank while {range} was being read from its mapping; those bytes are lost", path = .path.display())]
    FileChanged {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
    },
    /// The path names something other than a regular file (a FIFO, a device, a socket, a
    /// directory): it is not read, since reading it could block forever or never end.
    #[error("{path}: not a regular file but {kind} (reading {range})", path = .path.display())]
    NotRegularFile {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// What it is instead, e.g. "a FIFO".
        kind: &'static str,
    },
    /// The memory for the read's buffer could not be had.
    #[error("{path}: cannot allocate {bytes} bytes to read {range}", path = .path.display())]
    OutOfMemory {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
        /// The buffer's size.
        bytes: u64,
    },
    /// The IO engine shut down before the read could be issued.
    #[error("{path}: IO engine shut down before {range} was read", path = .path.display())]
    Shutdown {
        /// The file.
        path: Arc<Path>,
        /// The requested range.
        range: ReadRange,
    },
}

impl IoError {
    /// Classifies an OS error from opening or reading `path`.
    pub fn from_os(err: io::Error, path: &Arc<Path>, range: ReadRange) -> Self {
        let path = Arc::clone(path);
        if let Some(not) = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<NotRegularFile>())
        {
            return IoError::NotRegularFile {
                path,
                range,
                kind: not.0,
            };
        }
        match err.kind() {
            io::ErrorKind::NotFound => IoError::NotFound { path, range },
            io::ErrorKind::PermissionDenied => IoError::PermissionDenied {
                path,
                range,
                reason: None,
            },
            _ => IoError::Io {
                path,
                range,
                source: Arc::new(err),
            },
        }
    }

    /// The file this error concerns.
    pub fn path(&self) -> &Path {
        match self {
            IoError::NotFound { path, .. }
            | IoError::PermissionDenied { path, .. }
            | IoError::RangePastEof { path, .. }
            | IoError::ShortRead { path, .. }
            | IoError::Io { path, .. }
            | IoError::FileChanged { path, .. }
            | IoError::NotRegularFile { path, .. }
            | IoError::OutOfMemory { path, .. }
            | IoError::Shutdown { path, .. } => path,
        }
    }

    /// The range this error concerns.
    pub fn range(&self) -> ReadRange {
        match self {
            IoError::NotFound { range, .. }
            | IoError::PermissionDenied { range, .. }
            | IoError::RangePastEof { range, .. }
            | IoError::ShortRead { range, .. }
            | IoError::Io { range, .. }
            | IoError::FileChanged { range, .. }
            | IoError::NotRegularFile { range, .. }
            | IoError::OutOfMemory { range, .. }
            | IoError::Shutdown { range, .. } => *range,
        }
    }

    /// Whether this error means the file is absent (callers often treat that as "no data").
    pub fn is_not_found(&self) -> bool {
        matches!(self, IoError::NotFound { .. })
    }

    /// The same error, reported against another range of the same file (used when one
    /// physical read serves several requested ranges).
    #[must_use]
    pub(crate) fn with_range(&self, range: ReadRange) -> Self {
        let mut e = self.clone();
        match &mut e {
            IoError::NotFound { range: r, .. }
            | IoError::PermissionDenied { range: r, .. }
            | IoError::RangePastEof { range: r, .. }
            | IoError::ShortRead { range: r, .. }
            | IoError::Io { range: r, .. }
            | IoError::FileChanged { range: r, .. }
            | IoError::NotRegularFile { range: r, .. }
            | IoError::OutOfMemory { range: r, .. }
            | IoError::Shutdown { range: r, .. } => *r = range,
        }
        e
    }
}

/// `": reason"`, or nothing.
fn reason_suffix(reason: Option<&str>) -> String {
    reason.map(|r| format!(": {r}")).unwrap_or_default()
}

impl From<IoError> for io::Error {
    fn from(err: IoError) -> Self {
        let kind = match &err {
            IoError::NotFound { .. } => io::ErrorKind::NotFound,
            IoError::PermissionDenied { .. } => io::ErrorKind::PermissionDenied,
            IoError::RangePastEof { .. }
            | IoError::ShortRead { .. }
            | IoError::FileChanged { .. } => io::ErrorKind::UnexpectedEof,
            IoError::Io { source, .. } => source.kind(),
            IoError::Shutdown { .. } => io::ErrorKind::Interrupted,
            IoError::NotRegularFile { .. } => io::ErrorKind::InvalidInput,
            IoError::OutOfMemory { .. } => io::ErrorKind::OutOfMemory,
        };
        io::Error::new(kind, err)
    }
}

/// What an open found at a path that is not a regular file (carried inside an `io::Error`
/// until [`IoError::from_os`] names the read).
#[derive(Debug)]
pub(crate) struct NotRegularFile(pub(crate) &'static str);

impl NotRegularFile {
    pub(crate) fn of(kind: std::fs::FileType) -> Self {
        use std::os::unix::fs::FileTypeExt;
        NotRegularFile(if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_socket() {
            "a socket"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else {
            "not a file"
        })
    }
}

impl std::fmt::Display for NotRegularFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a regular file but {}", self.0)
    }
}

impl std::error::Error for NotRegularFile {}

/// Failure to start an IO engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// io_uring was asked for explicitly and cannot be used here.
    #[error("io_uring is unavailable: {reason}")]
    UringUnavailable {
        /// Why (kernel, seccomp, resource limits, not Linux).
        reason: String,
    },
    /// A worker thread could not be spawned.
    #[error("cannot start IO worker thread: {0}")]
    Spawn(#[source] io::Error),
    /// A configuration value is out of range.
    #[error("invalid IO configuration: {0}")]
    Config(String),
    /// An object store that cannot be opened: a URL that is not valid or of an unsupported
    /// kind, an unknown or invalid storage option.
    #[error("cannot open {url}: {reason}")]
    Store {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
}
