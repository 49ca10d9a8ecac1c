//! Codecs that know nothing of Zarr: zcrop's own decoders, which decode only the part of a
//! chunk a read needs ([`zstd`]: the literal streams of one-block frames; [`blosc`]: the
//! blocks and splits in range, LZ4 ones ([`lz4`]) only up to the last needed byte, unshuffled
//! straight into the output ([`shuffle`])), the C libraries' decoders they are checked
//! against ([`ffi`]), and codecs added to zarrs' registry ([`numcodecs`]).
//!
//! zarrs turns Zarr v2 `.zarray` metadata (filters and compressor) into a v3 codec chain by
//! looking each codec up in a registry that crates fill with `inventory::submit!`. The
//! [`numcodecs`] codecs are registered the same way, under their Zarr v2 ids and v3 names, so
//! arrays that use them open and decode through zarrs' `CodecChain` like any other.

pub(crate) mod blosc;
pub(crate) mod ffi;
pub(crate) mod lz4;
pub(crate) mod numcodecs;
pub(crate) mod shuffle;
pub(crate) mod zstd;
