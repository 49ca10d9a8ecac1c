//! # zcrop-zarr: Zarr arrays, read a batch at a time
//!
//! **Job:** open Zarr v2 and v3 arrays and groups (metadata and codecs through the `zarrs`
//! crate), plan a whole batch of N-d crops into the set of chunks and inner chunks it needs,
//! fetch their bytes in one submission to `zcrop-io` (a large read from local files submits
//! its first few hundred chunks alone, to start decoding sooner), decode each chunk as its
//! bytes arrive and copy it into every crop that needs it while it is still in CPU cache.
//!
//! Stores are local directories or object stores named by URL (`s3://bucket/data.zarr`,
//! `gs://`, `az://`, `https://`), read through `zcrop-io`'s object engine with the same
//! planning, batching and decoding ([`OpenOptions::storage_options`] configures them).
//!
//! **Must not know about:** io_uring or any other IO mechanism (that is `zcrop-io`'s business),
//! samplers, batches as training data, Python.
//!
//! ## Use
//!
//! ```no_run
//! use zcrop_zarr::Array;
//!
//! let array = Array::open("weather.zarr/temperature")?;
//! // Three crops of shape (4, 128, 128), read as one planned batch into one buffer.
//! let origins = [0, 0, 0, 10, 256, 512, 40, 1024, 77];
//! let bytes = array.read_batch(&origins, &[4, 128, 128])?;
//! assert_eq!(bytes.len(), 3 * 4 * 128 * 128 * array.element_size());
//! # Ok::<(), zcrop_zarr::ZarrError>(())
//! ```
//!
//! ## Unsafe code
//!
//! One module holds `unsafe`: `stitch` (many decode tasks writing disjoint parts of one output
//! buffer, as the planner guarantees). The decoders' unsafe code (C calls, SSE loads and
//! stores, raw output writes) is in the `zcrop-codec` crate.
//! Every block has a `// SAFETY:` comment.

mod array;
mod cache;
mod codec;
mod decode;
mod dtype;
pub mod error;
mod hierarchy;
pub mod icechunk;
mod layout;
mod place;
pub mod plan;
mod shard;
mod stitch;
mod store;
mod throttle;
pub mod transform;

pub use array::{
    Array, BlockFetch, DEFAULT_CHUNK_CACHE_BYTES, DEFAULT_INDEX_CACHE_BYTES, OpenOptions,
    ReadOptions, ReadPart, ReadStats, StorageSummary, VariableElements, VariableKind, WholeChunks,
    WholeReason, read_many, shared_chunk_cache_budget, shared_chunk_cache_usage,
};
pub use error::{Location, Result, ZarrError};
pub use hierarchy::{Group, Node, NodeKind, open, open_with};
pub use plan::{DimSelection, Plan, PlanError};
pub use throttle::{decode_threads, on_decode_pool};
pub use transform::StitchTransform;
