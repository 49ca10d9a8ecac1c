//! Codecs zcrop adds to zarrs' codec registry.
//!
//! zarrs turns Zarr v2 `.zarray` metadata (filters and compressor) into a v3 codec chain by
//! looking each codec up in a registry that crates fill with `inventory::submit!`. The codecs
//! here are registered the same way, under their Zarr v2 ids and v3 names, so arrays that use
//! them open and decode through zarrs' `CodecChain` like any other: nothing else in zcrop
//! needs to know about them. See [`numcodecs`] for what they are.

pub(crate) mod numcodecs;
