//! Codecs added to zarrs' registry ([`numcodecs`]). The decoders that know nothing of Zarr
//! (zcrop's own zstd, LZ4 and blosc decoders and the C libraries' ones) are in the
//! `zcrop-codec` crate.
//!
//! zarrs turns Zarr v2 `.zarray` metadata (filters and compressor) into a v3 codec chain by
//! looking each codec up in a registry that crates fill with `inventory::submit!`. The
//! [`numcodecs`] codecs are registered the same way, under their Zarr v2 ids and v3 names, so
//! arrays that use them open and decode through zarrs' `CodecChain` like any other.

pub(crate) mod numcodecs;
