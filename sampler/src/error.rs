//! Typed errors. A failed batch names its step and the source that failed.

use zcrop_zarr::ZarrError;

/// Everything that can go wrong building a sampler or producing a batch.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SamplerError {
    /// The sample specification is inconsistent (shapes, dimension maps, transforms, ...).
    #[error("invalid sample spec: {reason}")]
    Spec {
        /// What is wrong.
        reason: String,
    },
    /// Opening a source, a coordinate array or a mask failed.
    #[error("source {source_name:?}: {error}")]
    Open {
        /// The source's name (or the mask's / coordinate's description).
        source_name: String,
        /// What zarr-front said.
        #[source]
        error: ZarrError,
    },
    /// No sample position satisfies every constraint (crop sizes, offsets, jitter, box, mask).
    #[error("no valid sample position: {reason}")]
    EmptyRegion {
        /// Which constraint emptied the region.
        reason: String,
    },
    /// Reading the crops of one source for one batch failed. The pipeline stays usable: the
    /// next batch is read as usual.
    #[error("step {step}, source {source_name:?} (#{source_index}): {error}")]
    Read {
        /// The batch's step.
        step: u64,
        /// The source's index in the spec.
        source_index: usize,
        /// The source's name.
        source_name: String,
        /// What zarr-front said (it names the array, key and byte range).
        #[source]
        error: ZarrError,
    },
    /// zcrop's worker threads could not be started.
    #[error("cannot start zcrop's threads: {reason}")]
    Threads {
        /// What the OS said.
        reason: String,
    },
    /// A pinned host buffer could not be allocated (`mmap` failed).
    #[error("cannot allocate a {bytes}-byte host buffer: {reason}")]
    Alloc {
        /// The size asked for.
        bytes: usize,
        /// What the OS said.
        reason: String,
    },
    /// The consumer holds every buffer of the ring, so no batch can be produced until it
    /// drops one.
    #[error(
        "all {buffers} batch buffers are held by the consumer; drop a batch before asking for the next"
    )]
    AllBuffersHeld {
        /// The ring's size.
        buffers: usize,
    },
    /// A worker thread panicked while producing a batch.
    #[error("step {step}: the loader worker panicked: {message}")]
    WorkerPanic {
        /// The batch's step.
        step: u64,
        /// The panic message.
        message: String,
    },
    /// The loader reached its configured last step.
    #[error("the loader is exhausted (it stops before step {end})")]
    Exhausted {
        /// The configured end step.
        end: u64,
    },
}

/// Shorthand.
pub type Result<T, E = SamplerError> = std::result::Result<T, E>;

pub(crate) fn spec_err(reason: impl Into<String>) -> SamplerError {
    SamplerError::Spec {
        reason: reason.into(),
    }
}

/// Runs `op`, whose rayon parallel iterators then run on zcrop's decode pool (fork-safe).
pub(crate) fn parallel<R: Send>(op: impl FnOnce() -> R + Send) -> Result<R> {
    zcrop_zarr::on_decode_pool(op).map_err(|e| SamplerError::Threads {
        reason: e.to_string(),
    })
}
