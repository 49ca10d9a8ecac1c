//! # zcrop-sampler: reproducible random crops for training
//!
//! **Job:** turn `(seed, step, rank, world_size)` into a batch of crop origins over one or
//! more sources, read them through `zcrop-zarr` into a ring of reusable page-locked host
//! buffers with background prefetch, apply fused transforms (dtype conversion, normalisation,
//! FFT), and say for every sample where it came from.
//!
//! **Must not know about:** codecs, chunk layouts, shard indexes or IO backends; it asks
//! `zcrop-zarr` for crops.
//!
//! ## Use
//!
//! ```no_run
//! use zcrop_sampler::{Dim, Loader, LoaderConfig, Mode, SampleSpec, Sampler, Shard, Source, Transform};
//!
//! // Satellite imagery (time, channel, y, x) and weather-model output on a 4x coarser grid.
//! let sat = Source::open("satellite", "sat.zarr/radiance", [4, 12, 128, 128])?
//!     .dims([Dim::along("time"), Dim::fixed(0), Dim::along("y"), Dim::along("x")])
//!     .transform(Transform::to_f32());
//! let nwp = Source::open("nwp", "nwp.zarr/temperature", [2, 32, 32])?
//!     .dims([Dim::along("time").scale(1, 3), Dim::along("y").scale(1, 4), Dim::along("x").scale(1, 4)]);
//! let sampler = Sampler::new(
//!     SampleSpec::new(["time", "y", "x"])
//!         .source(sat)
//!         .source(nwp)
//!         .mode(Mode::Epoch { stride: vec![1, 64, 64] })
//!         .seed(42)
//!         .batch_size(32),
//! )?;
//! // Rank 3 of 8, resuming at step 1000: the same batches as an uninterrupted run.
//! let config = LoaderConfig { start_step: 1000, shard: Shard::new(3, 8), prefetch: 4, ..Default::default() };
//! let mut loader = Loader::new(sampler, config)?;
//! println!("pinned: {:?}", loader.pin_state());
//! for _ in 0..10 {
//!     let batch = loader.next_batch()?;
//!     let images: &[f32] = batch.typed(0).expect("f32, page-aligned");
//!     let meta = batch.sample(0); // source, origin, coordinate labels, step, index
//!     println!("step {} sample 0 from {:?} at {:?}", batch.step(), meta.sources[0].array, meta.sources[0].origin);
//!     # let _ = images;
//!     // Dropping the batch returns its buffer to the ring.
//! }
//! # Ok::<(), zcrop_sampler::SamplerError>(())
//! ```
//!
//! ## Determinism
//!
//! Global sample `g` of a run draws from its own counter-based random stream, keyed by the seed
//! and `g` (ChaCha8, stream `g`); epoch mode maps `g` through a per-epoch Feistel permutation
//! of the allowed positions. Batch `step` of rank `r` holds samples
//! `step * b * world_size + r * b + i`. Nothing depends on thread counts, prefetch depth or
//! what was read before, so restarts at any step see the same bytes.
//!
//! ## Unsafe code
//!
//! Only [`pinned`] (mmap, mlock, dlopen of the CUDA runtime) holds `unsafe`, each block with a
//! `// SAFETY:` comment.

mod coords;
pub mod error;
pub mod fft;
mod loader;
mod pad;
pub mod permutation;
pub mod pinned;
mod rng;
mod sampler;
mod space;
pub mod spectral;
pub mod transform;
pub mod valid;

pub use coords::{CoordLabel, CoordValue};
pub use error::{Result, SamplerError};
pub use fft::{
    ChunkedFftOptions, ComplexType, FftError, FftReport, FftStrategy, fft_along_axis,
    fft_along_axis_cancellable,
};
pub use loader::{
    ADAPT_WINDOW, AUTO_PREFETCH_BYTES, Batch, DepthGauge, Loader, LoaderConfig, LoaderStatus,
};
pub use permutation::Permutation;
pub use pinned::{PinOptions, PinState, PinnedBuffer};
pub use sampler::{
    BatchPlan, Dim, Mode, OriginRule, SampleMeta, SampleSpec, Sampler, Shard, Source, SourceInfo,
    SourceSample,
};
pub use space::{Cells, Mask, Weights};
pub use spectral::FftNorm;
pub use transform::{Decode, Fft, Normalize, OutputType, Spectrum, Transform};
