//! `NativeBatch`: one batch of a loader, as the Python side holds it (its methods are in
//! `loader.rs`; the views of its bytes in `buffer.rs`).

use pyo3::prelude::*;
use zcrop::sampler::Batch;

/// One batch of a loader: a ring buffer of pinned memory and the metadata of its samples. The
/// buffer goes back to the loader when this object (and every view of it) is gone.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct NativeBatch {
    pub(crate) batch: Batch,
}

impl NativeBatch {
    /// The bytes of source `s`.
    pub(crate) fn source_bytes(&self, s: usize) -> &[u8] {
        self.batch.source(s)
    }
}
