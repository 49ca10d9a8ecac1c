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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use zarrs::array::{ArrayBuilder, ArrayBytes, CodecOptions, DataType, FillValue};
use zarrs::filesystem::FilesystemStore;
use zcrop_io::{Budget, IoConfig, IoEngine};
use zcrop_zarr::{Array, OpenOptions, ReadOptions, StitchTransform, ZarrError};

use crate::spectral::FftNorm;
use crate::transform::{InType, for_each_value};

/// Bytes set aside for small allocations (plans, selections, metadata).
const SLACK: usize = 64 << 10;
/// Bytes of one complex128 working element.
const WORK: usize = 16;
/// The smallest budget accepted.
pub const MIN_BUDGET: usize = 256 << 10;
/// What one chunk file costs beyond its bytes (create/open, metadata, syscalls), in bytes of
/// bandwidth: the planner's cost model charges it to every chunk written or read back.
const CHUNK_OVERHEAD: f64 = 64.0 * 1024.0;

/// The output's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComplexType {
    /// Two f32 per element.
    #[default]
    Complex64,
    /// Two f64 per element.
    Complex128,
}

impl ComplexType {
    fn name(self) -> &'static str {
        match self {
            ComplexType::Complex64 => "complex64",
            ComplexType::Complex128 => "complex128",
        }
    }

    fn size(self) -> usize {
        match self {
            ComplexType::Complex64 => 8,
            ComplexType::Complex128 => 16,
        }
    }
}

/// How to run [`fft_along_axis`].
#[derive(Debug, Clone)]
pub struct ChunkedFftOptions {
    /// The axis to transform.
    pub axis: usize,
    /// Bytes the transform may hold at once (blocks, chunk buffers, IO in flight), at least
    /// [`MIN_BUDGET`].
    pub memory_budget: usize,
    /// The output element type.
    pub output: ComplexType,
    /// Scaling, as numpy's `norm=`.
    pub norm: FftNorm,
    /// Where the temporary store goes (a directory removed at the end); `None`: the system's
    /// temporary directory.
    pub temp_dir: Option<PathBuf>,
}

impl ChunkedFftOptions {
    /// Transform `axis` within `memory_budget` bytes, complex64 output, numpy's default scaling.
    pub fn new(axis: usize, memory_budget: usize) -> Self {
        ChunkedFftOptions {
            axis,
            memory_budget,
            output: ComplexType::Complex64,
            norm: FftNorm::Backward,
            temp_dir: None,
        }
    }
}

/// Which algorithm ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FftStrategy {
    /// Whole lines in memory, one tile at a time.
    InMemory,
    /// Four-step through temporary arrays, `N = n1 * n2`.
    FourStep {
        /// Columns of the `(n2, n1)` view of the axis.
        n1: u64,
        /// Rows of the `(n2, n1)` view of the axis.
        n2: u64,
        /// Whether a third pass copied results into larger output chunks.
        transpose_pass: bool,
    },
}

/// What [`fft_along_axis`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct FftReport {
    /// The algorithm.
    pub strategy: FftStrategy,
    /// The tile over the input's dimensions (the axis entry is the axis length).
    pub tile: Vec<u64>,
    /// The output's chunk shape.
    pub output_chunks: Vec<u64>,
    /// The largest working block, in bytes.
    pub block_bytes: usize,
    /// The largest chunk written or read back from the temporary store, in bytes.
    pub chunk_bytes: usize,
    /// Passes over the data (1 in memory, 2 or 3 four-step).
    pub passes: u32,
    /// Bytes of output chunks written.
    pub output_bytes: u64,
    /// Bytes of temporary chunks written.
    pub temp_bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

/// Why [`fft_along_axis`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FftError {
    /// A bad argument (axis, data type, existing output).
    #[error("{0}")]
    InvalidArgument(String),
    /// The budget cannot hold even the smallest working set.
    #[error("a memory budget of {budget} bytes is too small: {what} needs about {needed} bytes")]
    BudgetTooSmall {
        /// The budget given.
        budget: usize,
        /// About how much is needed.
        needed: usize,
        /// For what.
        what: String,
    },
    /// The axis length has no factorisation `N1 * N2` whose parts fit the budget (a large prime
    /// length, for example), and whole lines do not fit either.
    #[error(
        "axis length {n} cannot be split into two factors of at most {max_factor} (the budget's limit), and whole lines do not fit"
    )]
    NoFactorization {
        /// The axis length.
        n: u64,
        /// The largest factor the budget allows.
        max_factor: u64,
    },
    /// Reading the input or a temporary array failed.
    #[error("reading {what}: {error}")]
    Read {
        /// The input or temporary array.
        what: String,
        /// What zarr-front said.
        #[source]
        error: ZarrError,
    },
    /// Creating or writing the output or a temporary array failed.
    #[error("writing {path}: {source}", path = .path.display())]
    Write {
        /// The array's directory.
        path: PathBuf,
        /// What zarrs or the filesystem said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The IO engine could not start.
    #[error("cannot start the IO engine: {0}")]
    Engine(#[from] zcrop_io::EngineError),
}

fn write_err(path: &Path, e: impl std::error::Error + Send + Sync + 'static) -> FftError {
    FftError::Write {
        path: path.to_path_buf(),
        source: Box::new(e),
    }
}

/// Converts any real or complex input to complex128 inside zarr-front's stitch.
struct ToComplex(InType);

impl StitchTransform for ToComplex {
    fn output_element_size(&self) -> usize {
        WORK
    }

    fn convert(&self, src: &[u8], dst: &mut [u8], _: u64) {
        let mut out = dst.chunks_exact_mut(WORK);
        for_each_value(self.0, src, |re, im| {
            let o = out.next().expect("output matches input");
            o[..8].copy_from_slice(&re.to_ne_bytes());
            o[8..].copy_from_slice(&im.to_ne_bytes());
        });
    }
}

fn c_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

fn get(block: &[u8], i: usize) -> Complex<f64> {
    let b = &block[i * WORK..(i + 1) * WORK];
    Complex::new(
        f64::from_ne_bytes(b[..8].try_into().expect("8 bytes")),
        f64::from_ne_bytes(b[8..].try_into().expect("8 bytes")),
    )
}

fn put(block: &mut [u8], i: usize, v: Complex<f64>) {
    let b = &mut block[i * WORK..(i + 1) * WORK];
    b[..8].copy_from_slice(&v.re.to_ne_bytes());
    b[8..].copy_from_slice(&v.im.to_ne_bytes());
}

/// Transforms every line along `axis` of `block` (complex128, C order over `dims`); `post(base,
/// line)` runs on each transformed line (`base`: the line's first element).
fn fft_lines(
    block: &mut [u8],
    dims: &[usize],
    axis: usize,
    fft: &dyn Fft<f64>,
    mut post: impl FnMut(usize, &mut [Complex<f64>]),
) {
    let n = dims[axis];
    let inner: usize = dims[axis + 1..].iter().product();
    let outer: usize = dims[..axis].iter().product();
    let mut line = vec![Complex::new(0.0, 0.0); n];
    let mut scratch = vec![Complex::new(0.0, 0.0); fft.get_inplace_scratch_len()];
    for o in 0..outer {
        for q in 0..inner {
            let base = o * n * inner + q;
            for (k, v) in line.iter_mut().enumerate() {
                *v = get(block, base + k * inner);
            }
            fft.process_with_scratch(&mut line, &mut scratch);
            post(base, &mut line);
            for (k, v) in line.iter().enumerate() {
                put(block, base + k * inner, *v);
            }
        }
    }
}

/// A strided view of a complex128 block: element `idx` is at `offset + sum(idx[d] * strides[d])`.
struct View<'a> {
    data: &'a [u8],
    offset: usize,
    strides: Vec<usize>,
}

/// A zarrs array being written, with a reusable staging buffer.
struct Writer {
    array: zarrs::array::Array<FilesystemStore>,
    path: PathBuf,
    es: usize,
    staging: Vec<u8>,
    written: u64,
    /// Chunks stored through the current store instance.
    since_reset: usize,
    options: CodecOptions,
}

/// zarrs' filesystem store keeps a lock entry for every key it ever wrote; a fresh store every
/// this many chunks keeps that map (and memory) small.
const STORE_RESET: usize = 256;

impl Writer {
    fn create(
        path: &Path,
        shape: Vec<u64>,
        chunks: Vec<u64>,
        ty: ComplexType,
        dimension_names: Option<Vec<Option<String>>>,
        attributes: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Writer, FftError> {
        std::fs::create_dir_all(path).map_err(|e| write_err(path, e))?;
        let store = Arc::new(FilesystemStore::new(path).map_err(|e| write_err(path, e))?);
        let dt = DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new(ty.name()))
            .map_err(|e| write_err(path, e))?;
        let mut b = ArrayBuilder::new(shape, chunks, dt, FillValue::new(vec![0u8; ty.size()]));
        b.attributes(attributes);
        if let Some(names) = dimension_names {
            b.dimension_names(Some(names));
        }
        let array = b.build(store, "/").map_err(|e| write_err(path, e))?;
        array.store_metadata().map_err(|e| write_err(path, e))?;
        Ok(Writer {
            array,
            path: path.to_path_buf(),
            es: ty.size(),
            staging: Vec::new(),
            written: 0,
            since_reset: 0,
            options: CodecOptions::default().with_concurrent_target(1),
        })
    }

    /// Writes chunk `chunk`, whose C-order elements are indexed by `dims`, from `view`;
    /// elements with `idx[d] >= valid[d]` lie outside the array and are zero.
    fn store(
        &mut self,
        chunk: &[u64],
        dims: &[usize],
        valid: &[usize],
        view: &View<'_>,
    ) -> Result<(), FftError> {
        let n: usize = dims.iter().product();
        self.staging.clear();
        self.staging.reserve_exact(n * self.es);
        self.staging.resize(n * self.es, 0);
        let nd = dims.len();
        let last = nd - 1;
        let mut idx = vec![0usize; nd];
        let row = valid[last].min(dims[last]);
        let rows = n / dims[last];
        for r in 0..rows {
            let mut rem = r;
            for d in (0..last).rev() {
                idx[d] = rem % dims[d];
                rem /= dims[d];
            }
            if (0..last).any(|d| idx[d] >= valid[d]) {
                continue;
            }
            let base = view.offset + (0..last).map(|d| idx[d] * view.strides[d]).sum::<usize>();
            let out = &mut self.staging[r * dims[last] * self.es..];
            for k in 0..row {
                let v = get(view.data, base + k * view.strides[last]);
                let o = &mut out[k * self.es..(k + 1) * self.es];
                if self.es == 16 {
                    o[..8].copy_from_slice(&v.re.to_ne_bytes());
                    o[8..].copy_from_slice(&v.im.to_ne_bytes());
                } else {
                    o[..4].copy_from_slice(&(v.re as f32).to_ne_bytes());
                    o[4..].copy_from_slice(&(v.im as f32).to_ne_bytes());
                }
            }
        }
        if self.since_reset >= STORE_RESET {
            let store =
                Arc::new(FilesystemStore::new(&self.path).map_err(|e| write_err(&self.path, e))?);
            self.array =
                zarrs::array::Array::new_with_metadata(store, "/", self.array.metadata().clone())
                    .map_err(|e| write_err(&self.path, e))?;
            self.since_reset = 0;
        }
        self.since_reset += 1;
        self.array
            .store_chunk_opt(
                chunk,
                ArrayBytes::new_flen(&self.staging[..]),
                &self.options,
            )
            .map_err(|e| write_err(&self.path, e))?;
        self.written += self.staging.len() as u64;
        Ok(())
    }
}

/// Sizes derived from the budget.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    /// The largest working block, bytes.
    block: usize,
    /// The largest chunk written or read back, bytes.
    chunk: usize,
}

/// The chosen algorithm and its sizes.
#[derive(Debug, Clone)]
struct Plan {
    /// The tile read from the input at once, per input dimension (the axis entry is N).
    tile: Vec<u64>,
    kind: PlanKind,
}

#[derive(Debug, Clone, Copy)]
enum PlanKind {
    InMemory {
        /// Output chunk length along the axis.
        out_len: u64,
    },
    FourStep(FourStep),
}

/// A four-step configuration. Temporary arrays hold one line per leading index:
/// `X0[line, n2, n1]` (the input, rechunked), `Y[line, k2, n1]`, `Z[line, k1, k2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FourStep {
    n1: u64,
    n2: u64,
    /// Rows (n2) per pass-0 slab (the input read `rho * n1` elements along the axis at once).
    rho: u64,
    /// Rows per `X0` chunk, dividing `rho`.
    rho_c: u64,
    /// Columns (n1) per pass-1 block and per `X0` and `Y` chunk.
    w: u64,
    /// Rows (k2) per pass-2 block (and, without the transpose pass, per output chunk).
    h: u64,
    /// Rows (k2) per `Y` chunk, dividing `h`.
    y_rows: u64,
    /// The transpose pass: k1 rows per pass-3 block and output chunk (`m * n2` long), and
    /// per `Z` chunk (dividing `m`).
    z: Option<(u64, u64)>,
}

/// All divisor pairs `(n1, n2)` of `n` with both at least 2.
fn factor_pairs(n: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut d = 2u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            out.push((d, n / d));
            if d != n / d {
                out.push((n / d, d));
            }
        }
        d += 1;
    }
    out
}

/// The largest divisor of `n` that is at most `max` (at least 1).
fn largest_divisor(n: u64, max: u64) -> u64 {
    (1..=max.min(n))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Complex elements an FFT of length `n` needs besides its data: the plan's tables, a line,
/// its scratch, and a twiddle row.
fn fft_workspace(n: u64) -> u64 {
    4 * n
}

/// Bytes moved per element through a temporary array of `chunk` elements per chunk (written
/// and read back once), with the per-chunk overhead.
fn temp_cost(chunk: u64) -> f64 {
    2.0 * (WORK as f64 + CHUNK_OVERHEAD / chunk as f64)
}

/// The four-step configuration for `n = n1 * n2` with pass-0 tiles of `t0` lines, and its cost
/// in bytes moved per element (the input read counted with its amplification).
fn configure(
    (n1, n2): (u64, u64),
    t0: u64,
    c_in: u64,
    b: Budgets,
    in_es: usize,
    out_es: usize,
) -> Option<(FourStep, f64)> {
    let work = WORK as u64;
    // The FFT plans of both lengths, and one line with its scratch and twiddles, come out of
    // the block budget.
    let block = (b.block as u64 / work).checked_sub(fft_workspace(n1) + fft_workspace(n2))?;
    let chunk = (b.chunk as u64 / work).max(1);
    let out_chunk = b.chunk as u64 / out_es as u64;
    if n1 > block || n2 > block || n1 * t0 > block {
        return None;
    }
    // Pass 0: slabs of rho rows; slabs that are whole input chunks read each chunk once.
    let mut rho = (block / (n1 * t0)).min(n2);
    let aligned = if n1.is_multiple_of(c_in) {
        true
    } else if c_in.is_multiple_of(n1) && rho >= c_in / n1 {
        rho -= rho % (c_in / n1);
        true
    } else {
        false
    };
    let amplification = if aligned {
        1
    } else {
        1 + c_in.div_ceil(rho * n1)
    };
    // Pass 1: columns.
    let w = (block / n2).min(n1).min(chunk).max(1);
    let rho_c = largest_divisor(rho, chunk / w);
    let y_rows = |h: u64| largest_divisor(h, (chunk / w).max(1));
    let base = (amplification * in_es as u64) as f64 + temp_cost(rho_c * w);
    let out_cost = |elems: u64| out_es as f64 + CHUNK_OVERHEAD / elems as f64;
    // Pass 2 straight to the output: chunks of h (dividing n2) along the axis.
    let h_direct = largest_divisor(n2, (block / n1).min(out_chunk).max(1));
    let direct = FourStep {
        n1,
        n2,
        rho,
        rho_c,
        w,
        h: h_direct,
        y_rows: y_rows(h_direct),
        z: None,
    };
    let direct_cost = base + temp_cost(direct.y_rows * w) + out_cost(h_direct);
    if n2 > out_chunk {
        return Some((direct, direct_cost));
    }
    // Or through Z and a transpose pass: output chunks of m whole n2 runs.
    let h = (block / n1).min(n2).min(chunk).max(1);
    let m = (block / n2).min(out_chunk / n2).min(n1).max(1);
    let z_rows = largest_divisor(m, (chunk / h).max(1));
    let transposed = FourStep {
        n1,
        n2,
        rho,
        rho_c,
        w,
        h,
        y_rows: y_rows(h),
        z: Some((m, z_rows)),
    };
    let transposed_cost =
        base + temp_cost(transposed.y_rows * w) + temp_cost(z_rows * h) + out_cost(m * n2);
    Some(if direct_cost <= transposed_cost {
        (direct, direct_cost)
    } else {
        (transposed, transposed_cost)
    })
}

/// The cheapest four-step configuration for pass-0 tiles of `t0` lines, with its cost.
fn plan_four_step(
    n: u64,
    t0: u64,
    c_in: u64,
    b: Budgets,
    in_es: usize,
    out_es: usize,
) -> Option<(FourStep, f64)> {
    factor_pairs(n)
        .into_iter()
        .filter_map(|pair| configure(pair, t0, c_in, b, in_es, out_es))
        .min_by(|a, b| {
            a.1.total_cmp(&b.1)
                .then(a.0.n1.max(a.0.n2).cmp(&b.0.n1.max(b.0.n2)))
        })
}

fn make_plan(
    shape: &[u64],
    axis: usize,
    in_chunk: &[u64],
    budgets: Budgets,
    in_es: usize,
    out_es: usize,
) -> Result<Plan, FftError> {
    let n = shape[axis];
    let c_in = in_chunk[axis];
    // Tiles from the input chunk's footprint down to single lines.
    let mut tile: Vec<u64> = (0..shape.len())
        .map(|d| {
            if d == axis {
                n
            } else {
                in_chunk[d].min(shape[d])
            }
        })
        .collect();
    let t_of = |tile: &[u64]| -> u64 {
        (0..shape.len())
            .filter(|&d| d != axis)
            .map(|d| tile[d])
            .product()
    };
    let t_base = t_of(&tile);
    let mut tiles = Vec::new();
    loop {
        tiles.push(tile.clone());
        let Some(d) = (0..shape.len())
            .filter(|&d| d != axis && tile[d] > 1)
            .max_by_key(|&d| tile[d])
        else {
            break;
        };
        tile[d] = tile[d].div_ceil(2);
    }
    // Input chunks are read once per tile that cuts them.
    let reread = |t: &[u64]| t_base.div_ceil(t_of(t));
    let in_memory = tiles.iter().find_map(|t| {
        let lines = t_of(t);
        let fits = (n * lines + fft_workspace(n)) * WORK as u64 <= budgets.block as u64
            && lines * out_es as u64 <= budgets.chunk as u64;
        fits.then(|| {
            let out_len = (budgets.chunk as u64 / (lines * out_es as u64)).clamp(1, n);
            let cost = (reread(t) * in_es as u64 + out_es as u64) as f64
                + CHUNK_OVERHEAD / (out_len * lines) as f64;
            (
                cost,
                Plan {
                    tile: t.clone(),
                    kind: PlanKind::InMemory { out_len },
                },
            )
        })
    });
    let four = tiles.iter().find_map(|t| {
        plan_four_step(n, t_of(t), c_in, budgets, in_es, out_es).map(|(f, cost)| {
            let cost = cost + ((reread(t) - 1) * in_es as u64) as f64;
            (
                cost,
                Plan {
                    tile: t.clone(),
                    kind: PlanKind::FourStep(f),
                },
            )
        })
    });
    match (in_memory, four) {
        (Some((mem_cost, mem)), Some((four_cost, four))) => {
            Ok(if mem_cost <= four_cost { mem } else { four })
        }
        (Some((_, p)), None) | (None, Some((_, p))) => Ok(p),
        (None, None) => {
            let max_factor = (budgets.block / WORK) as u64;
            if n > max_factor {
                Err(FftError::NoFactorization { n, max_factor })
            } else {
                Err(FftError::BudgetTooSmall {
                    budget: 0,
                    needed: n as usize * WORK * 2,
                    what: "one line".into(),
                })
            }
        }
    }
}

/// The tiles' origins over the non-axis dimensions (the axis entry is 0).
fn tile_origins(shape: &[u64], tile: &[u64], axis: usize) -> Vec<Vec<u64>> {
    let mut out = vec![Vec::new()];
    for d in 0..shape.len() {
        let starts: Vec<u64> = if d == axis {
            vec![0]
        } else {
            (0..shape[d]).step_by(tile[d] as usize).collect()
        };
        out = out
            .into_iter()
            .flat_map(|o| {
                starts.iter().map(move |&s| {
                    let mut o = o.clone();
                    o.push(s);
                    o
                })
            })
            .collect();
    }
    out
}

struct Ctx<'a> {
    input: &'a Array,
    to_complex: ToComplex,
    axis: usize,
    shape: Vec<u64>,
    plan: Plan,
    /// The normalisation factor, if not 1.
    scale: Option<f64>,
    /// The largest single read, in output bytes.
    max_read: usize,
}

impl Ctx<'_> {
    /// Valid tile extents at `origin` (per dimension; the axis entry is N).
    fn valid(&self, origin: &[u64]) -> Vec<u64> {
        (0..self.shape.len())
            .map(|d| {
                if d == self.axis {
                    self.shape[d]
                } else {
                    self.plan.tile[d].min(self.shape[d] - origin[d])
                }
            })
            .collect()
    }

    /// Reads the input region `origin`/`shape` as complex128 into `out`.
    fn read_input(&self, origin: &[u64], shape: &[u64], out: &mut [u8]) -> Result<(), FftError> {
        read_split(
            self.input,
            origin,
            shape,
            out,
            Some(&self.to_complex),
            self.max_read,
        )
        .map_err(|error| FftError::Read {
            what: format!("input {}", self.input.dir().display()),
            error,
        })
    }

    /// Reads the temporary array region `origin`/`shape` into `out`.
    fn read_temp(
        &self,
        array: &Array,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<(), FftError> {
        read_split(array, origin, shape, out, None, self.max_read).map_err(|error| FftError::Read {
            what: format!("temporary array {}", array.dir().display()),
            error,
        })
    }
}

/// Reads a region in parts of at most `max_bytes` of output (split along its outermost
/// dimension longer than 1, so each part is a contiguous piece of `out`): zarr-front may hold a
/// read's encoded chunks until they are decoded, so smaller reads bound that memory.
fn read_split(
    array: &Array,
    origin: &[u64],
    shape: &[u64],
    out: &mut [u8],
    transform: Option<&dyn StitchTransform>,
    max_bytes: usize,
) -> Result<(), ZarrError> {
    let options = ReadOptions {
        transform,
        cancel: None,
    };
    let Some(d) = shape.iter().position(|&s| s > 1) else {
        return array
            .read_region_into_with(origin, shape, out, options)
            .map(|_| ());
    };
    let per_index = out.len() / shape[d] as usize;
    let step = (max_bytes / per_index.max(1)).max(1) as u64;
    let (mut o, mut sh) = (origin.to_vec(), shape.to_vec());
    for start in (0..shape[d]).step_by(step as usize) {
        let len = step.min(shape[d] - start);
        o[d] = origin[d] + start;
        sh[d] = len;
        let part = &mut out[start as usize * per_index..(start + len) as usize * per_index];
        array.read_region_into_with(&o, &sh, part, options)?;
    }
    Ok(())
}

fn in_memory(ctx: &Ctx<'_>, out: &mut Writer, out_len: u64) -> Result<usize, FftError> {
    let (axis, n) = (ctx.axis, ctx.shape[ctx.axis]);
    let fft = FftPlanner::<f64>::new().plan_fft_forward(n as usize);
    let mut block = Vec::new();
    let mut largest = 0;
    for origin in tile_origins(&ctx.shape, &ctx.plan.tile, axis) {
        let valid = ctx.valid(&origin);
        let dims: Vec<usize> = valid.iter().map(|&v| v as usize).collect();
        sized(&mut block, dims.iter().product(), &mut largest);
        ctx.read_input(&origin, &valid, &mut block)?;
        let scale = ctx.scale;
        fft_lines(&mut block, &dims, axis, fft.as_ref(), |_, line| {
            if let Some(scale) = scale {
                for v in line.iter_mut() {
                    *v *= scale;
                }
            }
        });
        let strides = c_strides(&dims);
        let mut chunk_dims: Vec<usize> = ctx.plan.tile.iter().map(|&t| t as usize).collect();
        chunk_dims[axis] = out_len as usize;
        for j in 0..n.div_ceil(out_len) {
            let mut valid_c = dims.clone();
            valid_c[axis] = (n - j * out_len).min(out_len) as usize;
            let view = View {
                data: &block,
                offset: (j * out_len) as usize * strides[axis],
                strides: strides.clone(),
            };
            let chunk: Vec<u64> = (0..ctx.shape.len())
                .map(|d| {
                    if d == axis {
                        j
                    } else {
                        origin[d] / ctx.plan.tile[d]
                    }
                })
                .collect();
            out.store(&chunk, &chunk_dims, &valid_c, &view)?;
        }
    }
    Ok(largest)
}

/// A temporary `(lines, rows, cols)` complex128 array: its writer and its reader.
fn temp_array(
    dir: &Path,
    shape: [u64; 3],
    chunks: [u64; 3],
    open: &OpenOptions,
) -> Result<(Writer, Array), FftError> {
    let w = Writer::create(
        dir,
        shape.to_vec(),
        chunks.to_vec(),
        ComplexType::Complex128,
        None,
        serde_json::Map::new(),
    )?;
    let r = Array::open_with(dir, open).map_err(|error| FftError::Read {
        what: format!("temporary array {}", dir.display()),
        error,
    })?;
    Ok((w, r))
}

/// Resizes `block` to `elems` complex128 elements and records the largest size.
fn sized(block: &mut Vec<u8>, elems: usize, largest: &mut usize) {
    block.clear();
    // Exactly: `resize` alone may double the capacity.
    block.reserve_exact(elems * WORK);
    block.resize(elems * WORK, 0);
    *largest = (*largest).max(block.len());
}

/// The four-step algorithm; returns the largest block, the temporary bytes written, and
/// whether the transpose pass ran.
fn four_step(
    ctx: &Ctx<'_>,
    out: &mut Writer,
    config: FourStep,
    temp: &Path,
    open: &OpenOptions,
) -> Result<(usize, u64, bool), FftError> {
    let (axis, total, shape) = (ctx.axis, ctx.shape[ctx.axis], &ctx.shape);
    let nd = shape.len();
    let FourStep {
        n1,
        n2,
        rho,
        rho_c,
        w,
        h,
        y_rows,
        z: zplan,
    } = config;
    let other: Vec<usize> = (0..nd).filter(|&d| d != axis).collect();
    let other_shape: Vec<u64> = other.iter().map(|&d| shape[d]).collect();
    let lines: u64 = other_shape.iter().product();
    let (mut x0, x0_read) = temp_array(&temp.join("x0"), [lines, n2, n1], [1, rho_c, w], open)?;
    let (mut y, y_read) = temp_array(&temp.join("y"), [lines, n2, n1], [1, y_rows, w], open)?;
    let mut z = match zplan {
        None => None,
        Some((_, z_rows)) => Some(temp_array(
            &temp.join("z"),
            [lines, n1, n2],
            [1, z_rows, h],
            open,
        )?),
    };
    let mut block = Vec::new();
    let mut largest = 0usize;

    // Pass 0: the input, in slabs of rho rows of the (n2, n1) view of each line, into X0.
    let tile = &ctx.plan.tile;
    for origin in tile_origins(shape, tile, axis) {
        let valid = ctx.valid(&origin);
        let qt: usize = (axis + 1..nd).map(|d| valid[d] as usize).product();
        for r0 in (0..n2).step_by(rho as usize) {
            let rr = rho.min(n2 - r0);
            let len = rr * n1;
            let mut slab_origin = origin.clone();
            slab_origin[axis] = r0 * n1;
            let mut slab_shape = valid.clone();
            slab_shape[axis] = len;
            let elems = slab_shape.iter().product::<u64>() as usize;
            sized(&mut block, elems, &mut largest);
            log::trace!("fft: pass 0 slab at row {r0} allocated");
            ctx.read_input(&slab_origin, &slab_shape, &mut block)?;
            // Every line of the tile: (p, q) over the dimensions before / after the axis.
            let tile_lines: u64 = other.iter().map(|&d| valid[d]).product();
            let mut idx = vec![0u64; nd];
            for t in 0..tile_lines {
                let mut rem = t;
                for &d in other.iter().rev() {
                    idx[d] = rem % valid[d];
                    rem /= valid[d];
                }
                let p: usize =
                    (0..axis).fold(0, |acc, d| acc * valid[d] as usize + idx[d] as usize);
                let q: usize =
                    (axis + 1..nd).fold(0, |acc, d| acc * valid[d] as usize + idx[d] as usize);
                let line = other
                    .iter()
                    .fold(0u64, |acc, &d| acc * shape[d] + origin[d] + idx[d]);
                let base = p * len as usize * qt + q;
                for rc in (0..rr).step_by(rho_c as usize) {
                    for c0 in (0..n1).step_by(w as usize) {
                        let view = View {
                            data: &block,
                            offset: base + (rc * n1 + c0) as usize * qt,
                            strides: vec![0, n1 as usize * qt, qt],
                        };
                        let valid_c = [1, (rr - rc).min(rho_c) as usize, (n1 - c0).min(w) as usize];
                        x0.store(
                            &[line, (r0 + rc) / rho_c, c0 / w],
                            &[1, rho_c as usize, w as usize],
                            &valid_c,
                            &view,
                        )?;
                    }
                }
            }
        }
    }

    log::trace!("fft: pass 0 done");
    let mut planner = FftPlanner::<f64>::new();
    let (fft_n2, fft_n1) = (
        planner.plan_fft_forward(n2 as usize),
        planner.plan_fft_forward(n1 as usize),
    );
    let mut tw = vec![Complex::new(0.0, 0.0); n2 as usize];
    log::trace!("fft: plans ready");
    let scale = ctx.scale;
    let mut line_idx = vec![0u64; other.len()];
    for line in 0..lines {
        let mut rem = line;
        for (i, s) in other_shape.iter().enumerate().rev() {
            line_idx[i] = rem % s;
            rem /= s;
        }
        // The output chunk index of this line with `axis_chunk` along the axis (the output's
        // chunks are one line wide).
        let out_chunk = |axis_chunk: u64| -> Vec<u64> {
            let mut c = line_idx.clone();
            c.insert(axis, axis_chunk);
            c
        };
        let ones = |len: usize| -> Vec<usize> {
            let mut v = vec![1usize; nd];
            v[axis] = len;
            v
        };
        let strided = |s: usize| -> Vec<usize> {
            let mut v = vec![0usize; nd];
            v[axis] = s;
            v
        };

        // Pass 1: columns [c0, c0 + w) of X0, FFT over n2, twiddles W_N^(n1 k2), into Y.
        for c0 in (0..n1).step_by(w as usize) {
            let wc = w.min(n1 - c0);
            sized(&mut block, (n2 * wc) as usize, &mut largest);
            log::trace!("fft: pass 1 line {line} column {c0} allocated");
            ctx.read_temp(&x0_read, &[line, 0, c0], &[1, n2, wc], &mut block)?;
            fft_lines(
                &mut block,
                &[1, n2 as usize, wc as usize],
                1,
                fft_n2.as_ref(),
                |base, values| {
                    let col = c0 + base as u64;
                    for (k2, t) in tw.iter_mut().enumerate() {
                        let e = (u128::from(col) * k2 as u128 % u128::from(total)) as f64;
                        let ang = -2.0 * std::f64::consts::PI * e / total as f64;
                        *t = Complex::new(ang.cos(), ang.sin());
                    }
                    for (v, t) in values.iter_mut().zip(&tw) {
                        *v *= t;
                    }
                },
            );
            for r in (0..n2).step_by(y_rows as usize) {
                let view = View {
                    data: &block,
                    offset: (r * wc) as usize,
                    strides: vec![0, wc as usize, 1],
                };
                let valid_c = [1, (n2 - r).min(y_rows) as usize, wc as usize];
                y.store(
                    &[line, r / y_rows, c0 / w],
                    &[1, y_rows as usize, w as usize],
                    &valid_c,
                    &view,
                )?;
            }
        }

        // Pass 2: rows [r0, r0 + h) of Y, FFT over n1 (giving k1), to the output or to Z.
        for r0 in (0..n2).step_by(h as usize) {
            let hr = h.min(n2 - r0);
            sized(&mut block, (hr * n1) as usize, &mut largest);
            log::trace!("fft: pass 2 line {line} row {r0} allocated");
            ctx.read_temp(&y_read, &[line, r0, 0], &[1, hr, n1], &mut block)?;
            fft_lines(
                &mut block,
                &[hr as usize, n1 as usize],
                1,
                fft_n1.as_ref(),
                |_, values| {
                    if let Some(scale) = scale {
                        for v in values.iter_mut() {
                            *v *= scale;
                        }
                    }
                },
            );
            match &mut z {
                // X[k1 * n2 + k2] for the block's k2: one output chunk of h per k1.
                None => {
                    for k1 in 0..n1 {
                        let view = View {
                            data: &block,
                            offset: k1 as usize,
                            strides: strided(n1 as usize),
                        };
                        out.store(
                            &out_chunk((k1 * n2 + r0) / h),
                            &ones(h as usize),
                            &ones(hr as usize),
                            &view,
                        )?;
                    }
                }
                Some((zw, _)) => {
                    let (_, z_rows) = zplan.expect("z is set");
                    for k1 in (0..n1).step_by(z_rows as usize) {
                        let view = View {
                            data: &block,
                            offset: k1 as usize,
                            strides: vec![0, 1, n1 as usize],
                        };
                        let valid_c = [1, (n1 - k1).min(z_rows) as usize, hr as usize];
                        zw.store(
                            &[line, k1 / z_rows, r0 / h],
                            &[1, z_rows as usize, h as usize],
                            &valid_c,
                            &view,
                        )?;
                    }
                }
            }
        }

        // Pass 3: rows of Z are whole runs X[k1 * n2 ..][..n2]: output chunks of m runs.
        if let (Some((_, zr)), Some((m, _))) = (&z, zplan) {
            for k1 in (0..n1).step_by(m as usize) {
                let mr = m.min(n1 - k1);
                sized(&mut block, (mr * n2) as usize, &mut largest);
                log::trace!("fft: pass 3 line {line} row {k1} allocated");
                ctx.read_temp(zr, &[line, k1, 0], &[1, mr, n2], &mut block)?;
                let view = View {
                    data: &block,
                    offset: 0,
                    strides: strided(1),
                };
                out.store(
                    &out_chunk(k1 / m),
                    &ones((m * n2) as usize),
                    &ones((mr * n2) as usize),
                    &view,
                )?;
            }
        }
    }
    let temp_bytes = x0.written + y.written + z.as_ref().map_or(0, |(w, _)| w.written);
    Ok((largest, temp_bytes, z.is_some()))
}

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
    let engine = IoEngine::new(IoConfig {
        budget: Some(Budget::new(256, io_bytes)),
        threads: 2,
        queue_depth: 32,
        // Pooled buffers outlive their reads; the budget counts only what is in use.
        recycle_buffers: false,
        ..IoConfig::default()
    })?;
    let open = OpenOptions {
        engine: Some(engine),
        index_cache_bytes: budget / 32,
        chunk_cache_bytes: 0,
        verify_checksums: true,
        ..OpenOptions::default()
    };
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
    let threads = rayon::current_num_threads();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factor_pairs_are_complete() {
        let mut p = factor_pairs(36);
        p.sort_unstable();
        assert_eq!(
            p,
            vec![(2, 18), (3, 12), (4, 9), (6, 6), (9, 4), (12, 3), (18, 2)]
        );
        assert!(factor_pairs(97).is_empty());
    }

    #[test]
    fn four_step_plans_fit_their_budgets() {
        let b = Budgets {
            block: 1 << 20,
            chunk: 1 << 16,
        };
        for (n, t, c) in [
            (1u64 << 20, 1u64, 4096u64),
            (65_536, 16, 256),
            (1000, 3, 64),
            (4096 * 3, 7, 100),
        ] {
            let (f, _) = plan_four_step(n, t, c, b, 4, 8).unwrap();
            assert_eq!(f.n1 * f.n2, n);
            let (block, chunk) = (b.block as u64 / 16, b.chunk as u64 / 16);
            assert!(
                f.rho * f.n1 * t <= block && f.rho.is_multiple_of(f.rho_c),
                "{f:?}"
            );
            assert!(f.rho_c * f.w <= chunk, "{f:?}");
            assert!(f.n2 * f.w <= block, "{f:?}");
            assert!(f.h * f.n1 <= block, "{f:?}");
            assert!(
                f.y_rows * f.w <= chunk && f.h.is_multiple_of(f.y_rows),
                "{f:?}"
            );
            match f.z {
                None => assert!(
                    f.n2.is_multiple_of(f.h) && f.h * 8 <= b.chunk as u64,
                    "{f:?}"
                ),
                Some((m, z_rows)) => {
                    assert!(m * f.n2 <= block, "{f:?}");
                    assert!(m * f.n2 * 8 <= b.chunk as u64, "{f:?}");
                    assert!(z_rows * f.h <= chunk && m.is_multiple_of(z_rows), "{f:?}");
                }
            }
        }
        assert!(plan_four_step(1_000_003, 1, 1, b, 4, 8).is_none());
    }
}
