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
//! decode buffers, the IO in flight (a private in-flight budget of the budget's sixteenth, and
//! as much again of chunk writes to an object store, which go out in the background), the
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
mod job;
mod options;
mod passes;
mod place;
mod plan;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use zcrop_zarr::{Array, OpenOptions};

use crate::spectral::FftNorm;
use crate::transform::InType;

pub use self::job::{FftJob, JobOptions, JobStart, StageInfo, TaskReport};
pub use self::options::{
    ChunkedFftOptions, ComplexType, FftError, FftReport, FftStrategy, StorageOptions,
};
pub use self::passes::Stage;
pub use self::plan::MIN_BUDGET;

use self::io::{Ctx, Layout, ToComplex, Writer, temp_array, write_err, write_in_flight};
use self::passes::{Passes, Temps, run_all};
use self::place::Place;
use self::plan::{Budgets, Plan, PlanKind, SLACK, WORK, make_plan};

/// FFT of the array at `input` along `options.axis`, written as a new Zarr v3 array at
/// `output` (which must not exist or be an empty directory, unless `options.overwrite` and it
/// is a Zarr array). Either may be a local path or an
/// object-store URL (`s3://bucket/a.zarr`; see [`ChunkedFftOptions::storage`]). See the
/// module documentation.
pub fn fft_along_axis(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &ChunkedFftOptions,
) -> Result<FftReport, FftError> {
    fft_along_axis_cancellable(input, output, options, None)
}

/// [`fft_along_axis`] that stops at its next block once `cancel` is set
/// ([`FftError::Cancelled`]; the output is then incomplete).
pub fn fft_along_axis_cancellable(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &ChunkedFftOptions,
    cancel: Option<&AtomicBool>,
) -> Result<FftReport, FftError> {
    let t0 = Instant::now();
    let output = Place::new(output.as_ref(), &options.storage.output)?;
    if !output.is_empty()? {
        if !options.overwrite {
            return Err(FftError::InvalidArgument(format!(
                "the output {} exists; pass overwrite to replace it",
                output.show()
            )));
        }
        output.remove_zarr()?;
    }
    let p = Prepared::new(input.as_ref(), options)?;
    let mut writer = p.create_output(&output)?;
    let ctx = p.ctx(&p.array);
    let (strategy, block_bytes, read_bytes, temp_bytes, passes) = match p.plan.kind {
        PlanKind::InMemory { .. } => {
            let mut passes = Passes::new(&ctx, &mut writer, None);
            passes.cancel = cancel;
            run_all(&mut passes)?;
            (FftStrategy::InMemory, passes.largest, passes.read, 0, 1)
        }
        PlanKind::FourStep(f) => {
            let temp_root = options.temp_dir.clone().unwrap_or_else(std::env::temp_dir);
            let temp = tempfile::Builder::new()
                .prefix("zcrop-fft-")
                .tempdir_in(&temp_root)
                .map_err(|e| write_err(&temp_root, e))?;
            let mut temps = p.create_temps(&Place::Local(temp.path().to_path_buf()))?;
            let mut passes = Passes::new(&ctx, &mut writer, Some(&mut temps));
            passes.cancel = cancel;
            run_all(&mut passes)?;
            let (largest, read) = (passes.largest, passes.read);
            let temp_bytes = temps.written();
            let transposed = f.z.is_some();
            (
                FftStrategy::FourStep {
                    n1: f.n1,
                    n2: f.n2,
                    transpose_pass: transposed,
                },
                largest,
                read,
                temp_bytes,
                if transposed { 3 } else { 2 },
            )
        }
    };
    writer.finish()?;
    Ok(FftReport {
        strategy,
        tile: p.plan.tile.clone(),
        output_chunks: p.out_chunks.clone(),
        block_bytes,
        chunk_bytes: p.budgets.chunk,
        passes,
        read_bytes,
        output_bytes: writer.written,
        temp_bytes,
        elapsed: t0.elapsed(),
    })
}

/// The engine options every reader of one transform uses: a private in-flight budget keeps IO
/// memory inside the caller's budget.
fn open_options(budget: usize) -> Result<OpenOptions, FftError> {
    let io_bytes = (budget / 16).max(64 << 10) as u64;
    OpenOptions {
        index_cache_bytes: budget / 32,
        // Each chunk is read once per pass: a cache would only take memory from the budget.
        chunk_cache_bytes: Some(0),
        verify_checksums: true,
        ..OpenOptions::default()
    }
    .with_private_io(io_bytes)
    .map_err(FftError::Engine)
}

fn open_input(place: &Place, open: &OpenOptions) -> Result<Array, FftError> {
    Array::open_with(place.location(), &place.open_options(open)).map_err(|error| FftError::Read {
        what: format!("input {}", place.show()),
        error,
    })
}

/// A checked and planned transform: the input opened, the budgets, the plan and the output's
/// layout.
struct Prepared {
    array: Array,
    open: OpenOptions,
    input: Place,
    shape: Vec<u64>,
    axis: usize,
    ty: InType,
    norm: FftNorm,
    output: ComplexType,
    axis_name: Option<String>,
    /// The whole budget; `budgets` are its parts.
    memory_budget: usize,
    budgets: Budgets,
    plan: Plan,
    out_chunks: Vec<u64>,
}

impl Prepared {
    fn new(input: &Path, options: &ChunkedFftOptions) -> Result<Prepared, FftError> {
        let budget = options.memory_budget;
        if budget < MIN_BUDGET {
            return Err(FftError::BudgetTooSmall {
                budget,
                needed: MIN_BUDGET,
                what: "the smallest configuration".into(),
            });
        }
        let open = open_options(budget)?;
        log::debug!("fft: engine started");
        let input = Place::new(input, &options.storage.input)?;
        let array = open_input(&input, &open)?;
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
        let plan = make_plan(
            &shape,
            axis,
            array.chunk_shape(),
            budgets,
            array.element_size(),
            options.output.size(),
        )
        .map_err(|e| match e {
            FftError::BudgetTooSmall { needed, what, .. } => FftError::BudgetTooSmall {
                budget,
                needed,
                what,
            },
            // From a working block to the whole budget that leaves it.
            FftError::NoFactorization {
                n,
                max_factor,
                needed,
            } => FftError::NoFactorization {
                n,
                max_factor,
                needed: 2 * (needed + decode + SLACK),
            },
            e => e,
        })?;
        log::debug!("fft: plan {plan:?} within {budgets:?}");
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
        Ok(Prepared {
            array,
            open,
            input,
            shape,
            axis,
            ty,
            norm: options.norm,
            output: options.output,
            axis_name: options.axis_name.clone(),
            memory_budget: budget,
            budgets,
            plan,
            out_chunks,
        })
    }

    /// Creates the output array (metadata only).
    fn create_output(&self, output: &Place) -> Result<Writer, FftError> {
        let mut attrs = serde_json::Map::new();
        attrs.insert(
            "zcrop_fft".into(),
            serde_json::json!({
                "axis": self.axis,
                "norm": norm_name(self.norm),
                "source": self.input.show(),
            }),
        );
        let mut names = self.array.dimension_names();
        if let Some(name) = &self.axis_name {
            let all = names.get_or_insert_with(|| vec![None; self.shape.len()]);
            all[self.axis] = Some(name.clone());
        }
        let layout = Layout {
            shape: self.shape.clone(),
            chunks: self.out_chunks.clone(),
            ty: self.output,
        };
        let in_flight = write_in_flight(self.memory_budget);
        Writer::create(output, layout, in_flight, names, attrs)
    }

    /// Creates the four-step's temporary arrays under `dir`.
    fn create_temps(&self, dir: &Place) -> Result<Temps, FftError> {
        let PlanKind::FourStep(f) = self.plan.kind else {
            unreachable!("temporaries of an in-memory plan")
        };
        let lines: u64 = (0..self.shape.len())
            .filter(|&d| d != self.axis)
            .map(|d| self.shape[d])
            .product();
        let open = &self.open;
        let in_flight = write_in_flight(self.memory_budget);
        Ok(Temps {
            x0: temp_array(
                &dir.join("x0"),
                [lines, f.n2, f.n1],
                [1, f.rho_c, f.w],
                open,
                in_flight,
            )?,
            y: temp_array(
                &dir.join("y"),
                [lines, f.n2, f.n1],
                [1, f.y_rows, f.w],
                open,
                in_flight,
            )?,
            z: match f.z {
                None => None,
                Some((_, z_rows)) => Some(temp_array(
                    &dir.join("z"),
                    [lines, f.n1, f.n2],
                    [1, z_rows, f.h],
                    open,
                    in_flight,
                )?),
            },
        })
    }

    fn ctx<'a>(&self, input: &'a Array) -> Ctx<'a> {
        ctx(
            input,
            self.ty,
            self.axis,
            &self.plan,
            self.norm,
            self.budgets.block / 4,
        )
    }
}

fn ctx<'a>(
    input: &'a Array,
    ty: InType,
    axis: usize,
    plan: &Plan,
    norm: FftNorm,
    max_read: usize,
) -> Ctx<'a> {
    let shape = input.shape().to_vec();
    let n = shape[axis];
    Ctx {
        input,
        to_complex: ToComplex(ty),
        axis,
        shape,
        plan: plan.clone(),
        scale: (norm != FftNorm::Backward).then(|| norm.forward_scale(n)),
        max_read,
    }
}

fn norm_name(norm: FftNorm) -> &'static str {
    match norm {
        FftNorm::Backward => "backward",
        FftNorm::Ortho => "ortho",
        FftNorm::Forward => "forward",
    }
}
