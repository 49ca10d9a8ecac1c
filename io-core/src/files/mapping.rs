//! What consumers of mapped results check: whether their bytes survived (a file truncated
//! while mapped loses pages; `mapguard` turns the fault into zeros and a mark).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::IoError;
use crate::range::ReadRange;

/// Checks a result of a batch submitted with [`IoEngine::submit_mapped`](crate::IoEngine::submit_mapped) once the consumer is
/// done reading its bytes: an error if they came from a mapping of a file that lost pages
/// while mapped (another process truncated it), whose bytes then read as zeros. `path` and
/// `range` are the request's, for the error. One atomic load unless some mapping was damaged.
pub fn check_mapped(bytes: &Bytes, path: &Arc<Path>, range: ReadRange) -> Result<(), IoError> {
    if mapped_intact(bytes) {
        Ok(())
    } else {
        Err(IoError::FileChanged {
            path: Arc::clone(path),
            range,
        })
    }
}

/// [`check_mapped`] as a yes or no: whether `bytes` are free of pages lost from a mapping.
pub fn mapped_intact(bytes: &Bytes) -> bool {
    crate::files::mapguard::intact(bytes.as_ptr())
}
