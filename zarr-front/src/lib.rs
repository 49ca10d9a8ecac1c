//! # zcrop-zarr: Zarr arrays, read a batch at a time
//!
//! **Job:** open Zarr v2 and v3 arrays and groups (metadata and codecs through the `zarrs`
//! crate), plan a whole batch of N-d crops into the set of chunks and inner chunks it needs,
//! fetch their bytes in one submission to `zcrop-io`, decode each chunk as its bytes arrive and
//! copy it into every crop that needs it while it is still in CPU cache.
//!
//! **Must not know about:** io_uring or any other IO mechanism (that is `zcrop-io`'s business),
//! samplers, batches as training data, Python.
