//! Codecs that know nothing of Zarr: zcrop's own decoders, which decode only the part of a
//! chunk a read needs ([`zstd`]: the literal streams of one-block frames; [`blosc`]: the
//! blocks and splits in range, LZ4 ones ([`lz4`]) only up to the last needed byte, unshuffled
//! straight into the output ([`shuffle`], [`dest`])), and the C libraries' decoders they are
//! checked against ([`ffi`]).
//!
//! Five modules hold `unsafe`, each block with its `// SAFETY:` reasoning: [`ffi`] (C calls),
//! [`lz4`] and [`shuffle`] (vector loads and stores), [`dest`] (raw output writes and
//! prefetches).

pub mod blosc;
pub mod dest;
pub mod ffi;
pub mod lz4;
pub mod shuffle;
pub mod zstd;
