//! # zcrop-sampler: reproducible random crops for training
//!
//! **Job:** turn `(seed, epoch, step, rank, world_size)` into a batch of crop origins over one or
//! more sources, read them through `zcrop-zarr` into a ring of reusable page-locked host
//! buffers with background prefetch, apply fused transforms (dtype conversion, normalisation,
//! FFT), and say for every sample where it came from.
//!
//! **Must not know about:** codecs, chunk layouts, shard indexes or IO backends; it asks
//! `zcrop-zarr` for crops.
