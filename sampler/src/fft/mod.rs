//! An FFT of a whole Zarr array along one axis that spans many chunks and need not fit in
//! memory, within a memory budget the caller sets, written as a Zarr v3 array.
//!
//! (`dask.array.fft` and Cubed refuse an FFT along a chunked axis.)
//!
//! ## How
//!
//! The planner picks, from the budget, whichever of two algorithms moves fewer bytes (counting
//! a fixed cost per chunk file, so it avoids tiny chunks):
//!
//! * **In memory** when whole lines fit: the array is processed in *tiles* over the other
//!   dimensions (aligned to the input's chunks where the budget allows); each tile is read with
//!   the full axis (converted to complex128 inside zarr-front's stitch), every line is
//!   transformed, and the output chunks are written.
//! * **Four-step (Bailey)** through temporary Zarr arrays, one line at a time. With
//!   `N = N1 * N2`, `n = n1 + N1 * n2` and `k = k2 + N2 * k1`:
//!   `X[k2 + N2 k1] = sum_n1 W_N1^(n1 k1) * W_N^(n1 k2) * sum_n2 x[n1 + N1 n2] W_N2^(n2 k2)`.
//!
//!   - Pass 0, rechunk: read the input in contiguous slabs along the axis (whole input chunks
//!     where the split allows, so each is read once) into `X0[line, n2, n1]`, chunked in
//!     column blocks.
//!   - Pass 1, columns: for a block of `n1`, read `X0[line, :, n1 block]`, FFT over `n2`,
//!     multiply by the twiddles `W_N^(n1 k2)`, write `Y[line, k2, n1]`.
//!   - Pass 2, rows: for a block of `k2`, read `Y[line, k2 block, :]`, FFT over `n1` (giving
//!     `k1`), and write either straight to the output (output chunks as long as the block
//!     along the axis) or, when those would be small, to `Z[line, k1, k2]`;
//!   - Pass 3 (only then): copy `Z` into output chunks of whole `N2` runs.
//!
//! Every buffer is sized from the budget: the working blocks, the FFT plans and line buffers
//! take at most half of it; chunks written or read back are capped so that the per-thread
//! decode buffers, the IO in flight (a private in-flight budget of the budget's sixteenth), the
//! staging and encode buffers fit in the other half; reads are split so that zarr-front never
//! holds more than a quarter block of encoded chunks. `tests/fft_memory.rs` measures the peak.
//! The process's baseline (code, thread stacks, allocator) comes on top.
//!
//! Lengths with no split `N1 * N2` whose parts fit the budget (a prime longer than what fits
//! in memory, for example) are refused with [`FftError::NoFactorization`]; a Bluestein
//! (chirp-z) reformulation would lift that limit but is not implemented.
//!
//! ## Output
//!
//! A Zarr v3 array of the input's shape and dimension names, data type complex64 or complex128
//! (`numpy.fft.fft(x, axis=axis, norm=norm)`), uncompressed, with an attribute `zcrop_fft`
//! recording the axis and the normalisation.

mod io;
mod options;
mod passes;
mod plan;

use std::path::Path;
use std::time::Instant;

use zcrop_zarr::{Array, OpenOptions};

use crate::spectral::FftNorm;
use crate::transform::InType;

pub use self::options::{ChunkedFftOptions, ComplexType, FftError, FftReport, FftStrategy};
pub use self::plan::MIN_BUDGET;

use self::io::{Ctx, ToComplex, Writer, write_err};
use self::passes::{four_step, in_memory};
use self::plan::{Budgets, PlanKind, SLACK, WORK, make_plan};

/// FFT of the array at `input` along `options.axis`, written as a new Zarr v3 array at
/// `output` (which must not exist or be an empty directory). See the module documentation.
pub fn fft_along_axis(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &ChunkedFftOptions,
) -> Result<FftReport, FftError> {
    let t0 = Instant::now();
    let budget = options.memory_budget;
    if budget < MIN_BUDGET {
        return Err(FftError::BudgetTooSmall {
            budget,
            needed: MIN_BUDGET,
            what: "the smallest configuration".into(),
        });
    }
    let output = output.as_ref();
    if output.exists() && std::fs::read_dir(output).map_or(true, |mut d| d.next().is_some()) {
        return Err(FftError::InvalidArgument(format!(
            "the output {} exists and is not an empty directory",
            output.display()
        )));
    }
    // A private in-flight budget keeps IO memory inside the caller's budget.
    let io_bytes = (budget / 16).max(64 << 10) as u64;
    let open = OpenOptions {
        index_cache_bytes: budget / 32,
        chunk_cache_bytes: 0,
        verify_checksums: true,
        ..OpenOptions::default()
    }
    .with_private_io(io_bytes)
    .map_err(FftError::Engine)?;
    let input_path = input.as_ref();
    log::debug!("fft: engine started");
    let array = Array::open_with(input_path, &open).map_err(|error| FftError::Read {
        what: format!("input {}", input_path.display()),
        error,
    })?;
    let shape = array.shape().to_vec();
    let axis = options.axis;
    if axis >= shape.len() {
        return Err(FftError::InvalidArgument(format!(
            "axis {axis} of a {}-d array",
            shape.len()
        )));
    }
    let ty = InType::from_name(&array.data_type()).ok_or_else(|| {
        FftError::InvalidArgument(format!("cannot transform data type {}", array.data_type()))
    })?;
    if shape.contains(&0) {
        return Err(FftError::InvalidArgument(format!(
            "the array {shape:?} is empty"
        )));
    }
    let threads = zcrop_zarr::decode_threads();
    let chunk_in = array.chunk_shape().iter().product::<u64>() as usize * array.element_size();
    let decode = (threads + 1) * 2 * chunk_in;
    let budgets = Budgets {
        block: (budget / 2).saturating_sub(decode + SLACK),
        chunk: budget / (8 * (threads + 2)),
    };
    if budgets.block < 64 * WORK {
        return Err(FftError::BudgetTooSmall {
            budget,
            needed: 2 * (decode + SLACK + 64 * WORK),
            what: format!("decoding {chunk_in}-byte input chunks on {threads} threads"),
        });
    }
    let out_es = options.output.size();
    let plan = make_plan(
        &shape,
        axis,
        array.chunk_shape(),
        budgets,
        array.element_size(),
        out_es,
    )
    .map_err(|e| match e {
        FftError::BudgetTooSmall { needed, what, .. } => FftError::BudgetTooSmall {
            budget,
            needed,
            what,
        },
        e => e,
    })?;
    log::debug!("fft: plan {plan:?} within {budgets:?}");
    let n = shape[axis];
    let out_chunks: Vec<u64> = match plan.kind {
        PlanKind::InMemory { out_len } => {
            let mut c = plan.tile.clone();
            c[axis] = out_len;
            c
        }
        // The four-step writes one line at a time.
        PlanKind::FourStep(f) => (0..shape.len())
            .map(|d| match (d == axis, f.z) {
                (false, _) => 1,
                (true, None) => f.h,
                (true, Some((m, _))) => m * f.n2,
            })
            .collect(),
    };
    let mut attrs = serde_json::Map::new();
    attrs.insert(
        "zcrop_fft".into(),
        serde_json::json!({
            "axis": axis,
            "norm": match options.norm { FftNorm::Backward => "backward", FftNorm::Ortho => "ortho", FftNorm::Forward => "forward" },
            "source": input_path.display().to_string(),
        }),
    );
    let names = array.dimension_names();
    let mut writer = Writer::create(
        output,
        shape.clone(),
        out_chunks.clone(),
        options.output,
        names,
        attrs,
    )?;
    let ctx = Ctx {
        input: &array,
        to_complex: ToComplex(ty),
        axis,
        shape: shape.clone(),
        plan: plan.clone(),
        scale: (options.norm != FftNorm::Backward).then(|| options.norm.forward_scale(n)),
        max_read: budgets.block / 4,
    };
    let (strategy, block_bytes, temp_bytes, passes) = match plan.kind {
        PlanKind::InMemory { out_len } => {
            let b = in_memory(&ctx, &mut writer, out_len)?;
            (FftStrategy::InMemory, b, 0, 1)
        }
        PlanKind::FourStep(f) => {
            let temp_root = options.temp_dir.clone().unwrap_or_else(std::env::temp_dir);
            let temp = tempfile::Builder::new()
                .prefix("zcrop-fft-")
                .tempdir_in(&temp_root)
                .map_err(|e| write_err(&temp_root, e))?;
            let (b, temp_bytes, transposed) = four_step(&ctx, &mut writer, f, temp.path(), &open)?;
            (
                FftStrategy::FourStep {
                    n1: f.n1,
                    n2: f.n2,
                    transpose_pass: transposed,
                },
                b,
                temp_bytes,
                if transposed { 3 } else { 2 },
            )
        }
    };
    Ok(FftReport {
        strategy,
        tile: plan.tile,
        output_chunks: out_chunks,
        block_bytes,
        chunk_bytes: budgets.chunk,
        passes,
        output_bytes: writer.written,
        temp_bytes,
        elapsed: t0.elapsed(),
    })
}
