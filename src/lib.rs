//! # zcrop: fast random N-d crops from huge Zarr arrays
//!
//! The facade crate. It re-exports the public Rust API of the workspace and holds the `zcrop`
//! command-line interface, which the `zcrop` binary and the Python console script both run
//! (one implementation, two entry points).
//!
//! - [`io`]: batched byte-range reads (io_uring, portable fallback, coalescing, budget).
//! - [`zarr`]: Zarr arrays and groups, read a whole batch of crops at a time.
//! - [`sampler`]: deterministic, step-indexed crop batches for training.
//!
//! **Must not know about:** anything but wiring; all logic lives in the member crates.

pub use zcrop_io as io;
pub use zcrop_sampler as sampler;
pub use zcrop_zarr as zarr;

pub mod bench;
pub mod cli;
