//! `zcrop-cloudsim`: a loopback object store that behaves like a bucket far away, for zcrop's
//! benchmarks and tests.
//!
//! It serves a directory S3-style (`GET /bucket/key` with `Range`, `HEAD`; bucket `b` is the
//! directory `root/b`, so a Zarr store on disk is served by linking it there) and shapes every
//! response: a first-byte latency (fixed plus uniform jitter, with a heavy tail of requests some
//! times slower), a bandwidth cap per connection and one for the whole server. It counts
//! requests, bytes and the connections and requests open at once, and injects faults on request
//! (`503 SlowDown`, resets, stalls, short and truncated bodies, `403`s). S3 clients (zcrop,
//! object_store/obstore, TensorStore's s3 driver, s3fs) read from it with an endpoint URL and any
//! credentials: requests are not authenticated.
//!
//! Run it with `zcrop-cloudsim serve --root DIR --latency-ms 20`; change the shaping, read the
//! counters or arm faults at run time through `/_cloudsim/{shaping,stats,reset,faults}`, or use
//! [`Server`] in-process from Rust tests.

mod faults;
pub mod load;
mod server;
mod shaping;
mod stats;

pub use faults::{Fault, FaultKind};
pub use server::Server;
pub use shaping::{Pacer, Shaping};
pub use stats::Stats;
