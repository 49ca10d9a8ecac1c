//! The transforms, one *item* at a time: a tile of whole lines in memory, or one block of a
//! four-step (Bailey) pass. The one-process FFT runs every item in order; an [`FftJob`]
//! (`job.rs`) runs ranges of them as independent tasks.
//!
//! [`FftJob`]: super::FftJob

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use serde::{Deserialize, Serialize};
use zcrop_zarr::Array;

use super::io::{Ctx, View, Writer, c_strides, get, put};
use super::options::FftError;
use super::plan::{FourStep, PlanKind, WORK};

/// A set of items that depend only on the previous stage's results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Whole lines in memory, one tile per item, straight to the output.
    Tiles,
    /// Four-step pass 0: one slab of one tile per item, into `X0[line, n2, n1]`.
    Rechunk,
    /// Pass 1: one block of columns of one line, FFT over `n2` and twiddles, into `Y`.
    Columns,
    /// Pass 2: one block of rows of one line, FFT over `n1`, to the output or into `Z`.
    Rows,
    /// Pass 3: one block of `k1` rows of one line, copied into output chunks of whole runs.
    Runs,
}

impl Stage {
    /// The stage's name, as in reports.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Tiles => "tiles",
            Stage::Rechunk => "rechunk",
            Stage::Columns => "columns",
            Stage::Rows => "rows",
            Stage::Runs => "runs",
        }
    }
}

/// The stages of a plan, in the order they must run.
pub(crate) fn stages(kind: &PlanKind) -> Vec<Stage> {
    match kind {
        PlanKind::InMemory { .. } => vec![Stage::Tiles],
        PlanKind::FourStep(f) => {
            let mut s = vec![Stage::Rechunk, Stage::Columns, Stage::Rows];
            if f.z.is_some() {
                s.push(Stage::Runs);
            }
            s
        }
    }
}

/// A temporary `(lines, rows, cols)` complex128 array: its writer and its reader.
pub(crate) type Temp = (Writer, Array);

/// The temporary arrays of the four-step passes.
pub(crate) struct Temps {
    pub(crate) x0: Temp,
    pub(crate) y: Temp,
    pub(crate) z: Option<Temp>,
}

impl Temps {
    /// Bytes of chunks written to them through these writers.
    pub(crate) fn written(&self) -> u64 {
        self.x0.0.written + self.y.0.written + self.z.as_ref().map_or(0, |z| z.0.written)
    }

    /// Waits until every chunk written to them has reached the store.
    pub(crate) fn finish(&self) -> Result<(), FftError> {
        self.x0.0.finish()?;
        self.y.0.finish()?;
        self.z.as_ref().map_or(Ok(()), |z| z.0.finish())
    }
}

/// Runs items: holds the arrays, the FFT plans and one reusable working block.
pub(crate) struct Passes<'a> {
    ctx: &'a Ctx<'a>,
    out: &'a mut Writer,
    temps: Option<&'a mut Temps>,
    block: Vec<u8>,
    /// The largest working block so far, bytes.
    pub(crate) largest: usize,
    /// Bytes of array data read (input at its stored element size, temporaries as complex128).
    pub(crate) read: u64,
    ffts: Vec<(usize, Arc<dyn Fft<f64>>)>,
    twiddles: Vec<Complex<f64>>,
    /// Checked before every item.
    pub(crate) cancel: Option<&'a AtomicBool>,
}

impl<'a> Passes<'a> {
    pub(crate) fn new(ctx: &'a Ctx<'a>, out: &'a mut Writer, temps: Option<&'a mut Temps>) -> Self {
        Passes {
            ctx,
            out,
            temps,
            block: Vec::new(),
            largest: 0,
            read: 0,
            ffts: Vec::new(),
            twiddles: Vec::new(),
            cancel: None,
        }
    }

    /// The forward FFT of length `n`, planned once.
    fn fft(&mut self, n: u64) -> Arc<dyn Fft<f64>> {
        let n = n as usize;
        if let Some((_, f)) = self.ffts.iter().find(|(len, _)| *len == n) {
            return Arc::clone(f);
        }
        let f = FftPlanner::<f64>::new().plan_fft_forward(n);
        self.ffts.push((n, Arc::clone(&f)));
        f
    }

    /// Resizes the working block to `elems` complex128 elements and records the largest size.
    fn sized(&mut self, elems: usize) {
        self.block.clear();
        // Exactly: `resize` alone may double the capacity.
        self.block.reserve_exact(elems * WORK);
        self.block.resize(elems * WORK, 0);
        self.largest = self.largest.max(self.block.len());
    }

    fn four_step(&self) -> FourStep {
        match self.ctx.plan.kind {
            PlanKind::FourStep(f) => f,
            PlanKind::InMemory { .. } => unreachable!("a four-step stage of an in-memory plan"),
        }
    }

    /// Items in `stage`.
    pub(crate) fn items(&self, stage: Stage) -> u64 {
        items(self.ctx, stage)
    }

    /// Runs item `i` of `stage`.
    pub(crate) fn run(&mut self, stage: Stage, i: u64) -> Result<(), FftError> {
        if self.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(FftError::Cancelled);
        }
        match stage {
            Stage::Tiles => {
                let origin = tile_origin(self.ctx, i);
                self.tile(&origin)
            }
            Stage::Rechunk => {
                let slabs = self.four_step().n2.div_ceil(self.four_step().rho);
                let origin = tile_origin(self.ctx, i / slabs);
                self.rechunk(&origin, (i % slabs) * self.four_step().rho)
            }
            Stage::Columns => {
                let f = self.four_step();
                let blocks = f.n1.div_ceil(f.w);
                self.columns(i / blocks, (i % blocks) * f.w)
            }
            Stage::Rows => {
                let f = self.four_step();
                let blocks = f.n2.div_ceil(f.h);
                self.rows(i / blocks, (i % blocks) * f.h)
            }
            Stage::Runs => {
                let f = self.four_step();
                let m = f.z.expect("the transpose pass").0;
                let blocks = f.n1.div_ceil(m);
                self.runs(i / blocks, (i % blocks) * m)
            }
        }
    }

    /// Whole lines of the tile at `origin`: read with the full axis, transform, write.
    fn tile(&mut self, origin: &[u64]) -> Result<(), FftError> {
        let ctx = self.ctx;
        let (axis, n) = (ctx.axis, ctx.shape[ctx.axis]);
        let PlanKind::InMemory { out_len } = ctx.plan.kind else {
            unreachable!("tiles of a four-step plan")
        };
        let fft = self.fft(n);
        let valid = ctx.valid(origin);
        let dims: Vec<usize> = valid.iter().map(|&v| v as usize).collect();
        self.sized(dims.iter().product());
        self.read += ctx.read_input(origin, &valid, &mut self.block)?;
        let scale = ctx.scale;
        fft_lines(&mut self.block, &dims, axis, fft.as_ref(), |_, line| {
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
                data: &self.block,
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
            self.out.store(&chunk, &chunk_dims, &valid_c, &view)?;
        }
        Ok(())
    }

    /// Pass 0: rows `[r0, r0 + rho)` of the `(n2, n1)` view of every line of the tile at
    /// `origin`, read as one slab of the input, into `X0`.
    fn rechunk(&mut self, origin: &[u64], r0: u64) -> Result<(), FftError> {
        let ctx = self.ctx;
        let FourStep {
            n1,
            n2,
            rho,
            rho_c,
            w,
            ..
        } = self.four_step();
        let (axis, shape) = (ctx.axis, &ctx.shape);
        let nd = shape.len();
        let other: Vec<usize> = (0..nd).filter(|&d| d != axis).collect();
        let valid = ctx.valid(origin);
        let qt: usize = (axis + 1..nd).map(|d| valid[d] as usize).product();
        let rr = rho.min(n2 - r0);
        let len = rr * n1;
        let mut slab_origin = origin.to_vec();
        slab_origin[axis] = r0 * n1;
        let mut slab_shape = valid.clone();
        slab_shape[axis] = len;
        self.sized(slab_shape.iter().product::<u64>() as usize);
        log::trace!("fft: pass 0 slab at row {r0} allocated");
        self.read += ctx.read_input(&slab_origin, &slab_shape, &mut self.block)?;
        let x0 = &mut temps(&mut self.temps).x0.0;
        // Every line of the tile: (p, q) over the dimensions before / after the axis.
        let tile_lines: u64 = other.iter().map(|&d| valid[d]).product();
        let mut idx = vec![0u64; nd];
        for t in 0..tile_lines {
            let mut rem = t;
            for &d in other.iter().rev() {
                idx[d] = rem % valid[d];
                rem /= valid[d];
            }
            let p: usize = (0..axis).fold(0, |acc, d| acc * valid[d] as usize + idx[d] as usize);
            let q: usize =
                (axis + 1..nd).fold(0, |acc, d| acc * valid[d] as usize + idx[d] as usize);
            let line = other
                .iter()
                .fold(0u64, |acc, &d| acc * shape[d] + origin[d] + idx[d]);
            let base = p * len as usize * qt + q;
            for rc in (0..rr).step_by(rho_c as usize) {
                for c0 in (0..n1).step_by(w as usize) {
                    let view = View {
                        data: &self.block,
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
        Ok(())
    }

    /// Pass 1: columns `[c0, c0 + w)` of `X0[line]`, FFT over `n2`, twiddles `W_N^(n1 k2)`,
    /// into `Y`.
    fn columns(&mut self, line: u64, c0: u64) -> Result<(), FftError> {
        let FourStep {
            n1, n2, w, y_rows, ..
        } = self.four_step();
        let total = self.ctx.shape[self.ctx.axis];
        let fft = self.fft(n2);
        let wc = w.min(n1 - c0);
        self.sized((n2 * wc) as usize);
        log::trace!("fft: pass 1 line {line} column {c0} allocated");
        let t = temps(&mut self.temps);
        self.ctx
            .read_temp(&t.x0.1, &[line, 0, c0], &[1, n2, wc], &mut self.block)?;
        self.read += (n2 * wc) * WORK as u64;
        let tw = &mut self.twiddles;
        tw.resize(n2 as usize, Complex::new(0.0, 0.0));
        fft_lines(
            &mut self.block,
            &[1, n2 as usize, wc as usize],
            1,
            fft.as_ref(),
            |base, values| {
                let col = c0 + base as u64;
                for (k2, t) in tw.iter_mut().enumerate() {
                    let e = (u128::from(col) * k2 as u128 % u128::from(total)) as f64;
                    let ang = -2.0 * std::f64::consts::PI * e / total as f64;
                    *t = Complex::new(ang.cos(), ang.sin());
                }
                for (v, t) in values.iter_mut().zip(tw.iter()) {
                    *v *= t;
                }
            },
        );
        for r in (0..n2).step_by(y_rows as usize) {
            let view = View {
                data: &self.block,
                offset: (r * wc) as usize,
                strides: vec![0, wc as usize, 1],
            };
            let valid_c = [1, (n2 - r).min(y_rows) as usize, wc as usize];
            t.y.0.store(
                &[line, r / y_rows, c0 / w],
                &[1, y_rows as usize, w as usize],
                &valid_c,
                &view,
            )?;
        }
        Ok(())
    }

    /// Pass 2: rows `[r0, r0 + h)` of `Y[line]`, FFT over `n1` (giving `k1`), to the output or
    /// into `Z`.
    fn rows(&mut self, line: u64, r0: u64) -> Result<(), FftError> {
        let FourStep { n1, n2, h, z, .. } = self.four_step();
        let ctx = self.ctx;
        let fft = self.fft(n1);
        let hr = h.min(n2 - r0);
        self.sized((hr * n1) as usize);
        log::trace!("fft: pass 2 line {line} row {r0} allocated");
        let t = temps(&mut self.temps);
        ctx.read_temp(&t.y.1, &[line, r0, 0], &[1, hr, n1], &mut self.block)?;
        self.read += (hr * n1) * WORK as u64;
        let scale = ctx.scale;
        fft_lines(
            &mut self.block,
            &[hr as usize, n1 as usize],
            1,
            fft.as_ref(),
            |_, values| {
                if let Some(scale) = scale {
                    for v in values.iter_mut() {
                        *v *= scale;
                    }
                }
            },
        );
        match (z, &mut t.z) {
            // X[k1 * n2 + k2] for the block's k2: one output chunk of h per k1.
            (None, _) => {
                for k1 in 0..n1 {
                    let view = View {
                        data: &self.block,
                        offset: k1 as usize,
                        strides: along_axis(ctx, n1 as usize),
                    };
                    self.out.store(
                        &out_chunk(ctx, line, (k1 * n2 + r0) / h),
                        &ones(ctx, h as usize),
                        &ones(ctx, hr as usize),
                        &view,
                    )?;
                }
            }
            (Some((_, z_rows)), Some((zw, _))) => {
                for k1 in (0..n1).step_by(z_rows as usize) {
                    let view = View {
                        data: &self.block,
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
            (Some(_), None) => unreachable!("the transpose pass has its temporary array"),
        }
        Ok(())
    }

    /// Pass 3: rows `[k1, k1 + m)` of `Z[line]` are whole runs `X[k1 * n2 ..][..n2]`, copied
    /// into one output chunk of `m` runs.
    fn runs(&mut self, line: u64, k1: u64) -> Result<(), FftError> {
        let FourStep { n1, n2, z, .. } = self.four_step();
        let ctx = self.ctx;
        let (m, _) = z.expect("the transpose pass");
        let mr = m.min(n1 - k1);
        self.sized((mr * n2) as usize);
        log::trace!("fft: pass 3 line {line} row {k1} allocated");
        let t = temps(&mut self.temps);
        let zr = &t.z.as_ref().expect("the transpose pass").1;
        ctx.read_temp(zr, &[line, k1, 0], &[1, mr, n2], &mut self.block)?;
        self.read += (mr * n2) * WORK as u64;
        let view = View {
            data: &self.block,
            offset: 0,
            strides: along_axis(ctx, 1),
        };
        self.out.store(
            &out_chunk(ctx, line, k1 / m),
            &ones(ctx, (m * n2) as usize),
            &ones(ctx, (mr * n2) as usize),
            &view,
        )
    }
}

fn temps<'t>(t: &'t mut Option<&mut Temps>) -> &'t mut Temps {
    t.as_deref_mut()
        .expect("four-step stages have temporary arrays")
}

/// The output chunk of `line` (the four-step's output chunks are one line wide) with
/// `axis_chunk` along the axis.
fn out_chunk(ctx: &Ctx<'_>, line: u64, axis_chunk: u64) -> Vec<u64> {
    let (axis, shape) = (ctx.axis, &ctx.shape);
    let mut c = vec![0u64; shape.len()];
    let mut rem = line;
    for d in (0..shape.len()).rev().filter(|&d| d != axis) {
        c[d] = rem % shape[d];
        rem /= shape[d];
    }
    c[axis] = axis_chunk;
    c
}

/// Chunk dimensions of one line, `len` along the axis.
fn ones(ctx: &Ctx<'_>, len: usize) -> Vec<usize> {
    let mut v = vec![1usize; ctx.shape.len()];
    v[ctx.axis] = len;
    v
}

/// Strides of a view that moves only along the axis, by `s`.
fn along_axis(ctx: &Ctx<'_>, s: usize) -> Vec<usize> {
    let mut v = vec![0usize; ctx.shape.len()];
    v[ctx.axis] = s;
    v
}

/// Items in `stage` of the plan in `ctx`.
pub(crate) fn items(ctx: &Ctx<'_>, stage: Stage) -> u64 {
    let tiles = tiles(ctx);
    let lines: u64 = (0..ctx.shape.len())
        .filter(|&d| d != ctx.axis)
        .map(|d| ctx.shape[d])
        .product();
    let f = match ctx.plan.kind {
        PlanKind::FourStep(f) => f,
        PlanKind::InMemory { .. } => return tiles,
    };
    match stage {
        Stage::Tiles => tiles,
        Stage::Rechunk => tiles * f.n2.div_ceil(f.rho),
        Stage::Columns => lines * f.n1.div_ceil(f.w),
        Stage::Rows => lines * f.n2.div_ceil(f.h),
        Stage::Runs => lines * f.z.map_or(0, |(m, _)| f.n1.div_ceil(m)),
    }
}

/// The largest working block of one item of `stage`, bytes.
pub(crate) fn item_bytes(ctx: &Ctx<'_>, stage: Stage) -> u64 {
    let tile_lines: u64 = (0..ctx.shape.len())
        .filter(|&d| d != ctx.axis)
        .map(|d| ctx.plan.tile[d])
        .product();
    let n = ctx.shape[ctx.axis];
    let elems = match (ctx.plan.kind, stage) {
        (PlanKind::FourStep(f), Stage::Rechunk) => tile_lines * f.rho * f.n1,
        (PlanKind::FourStep(f), Stage::Columns) => f.n2 * f.w,
        (PlanKind::FourStep(f), Stage::Rows) => f.h * f.n1,
        (PlanKind::FourStep(f), Stage::Runs) => f.z.map_or(0, |(m, _)| m) * f.n2,
        _ => tile_lines * n,
    };
    elems * WORK as u64
}

/// Tiles over the non-axis dimensions.
fn tiles(ctx: &Ctx<'_>) -> u64 {
    (0..ctx.shape.len())
        .filter(|&d| d != ctx.axis)
        .map(|d| ctx.shape[d].div_ceil(ctx.plan.tile[d]))
        .product()
}

/// The origin of tile `i` (C order over the non-axis dimensions; the axis entry is 0).
fn tile_origin(ctx: &Ctx<'_>, i: u64) -> Vec<u64> {
    let mut origin = vec![0u64; ctx.shape.len()];
    let mut rem = i;
    for d in (0..ctx.shape.len()).rev().filter(|&d| d != ctx.axis) {
        let count = ctx.shape[d].div_ceil(ctx.plan.tile[d]);
        origin[d] = (rem % count) * ctx.plan.tile[d];
        rem /= count;
    }
    origin
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

/// Runs every item of the plan in one process: the tiles, or pass 0 over the whole input and
/// then passes 1 to 3 line by line (so each line's temporaries are read back while they are
/// likely still in the page cache).
pub(crate) fn run_all(p: &mut Passes<'_>) -> Result<(), FftError> {
    match p.ctx.plan.kind {
        PlanKind::InMemory { .. } => {
            for i in 0..p.items(Stage::Tiles) {
                p.run(Stage::Tiles, i)?;
            }
        }
        PlanKind::FourStep(f) => {
            for i in 0..p.items(Stage::Rechunk) {
                p.run(Stage::Rechunk, i)?;
            }
            log::trace!("fft: pass 0 done");
            let (columns, rows) = (f.n1.div_ceil(f.w), f.n2.div_ceil(f.h));
            let runs = f.z.map_or(0, |(m, _)| f.n1.div_ceil(m));
            for line in 0..p.items(Stage::Columns) / columns {
                for b in 0..columns {
                    p.run(Stage::Columns, line * columns + b)?;
                }
                for b in 0..rows {
                    p.run(Stage::Rows, line * rows + b)?;
                }
                for b in 0..runs {
                    p.run(Stage::Runs, line * runs + b)?;
                }
            }
        }
    }
    Ok(())
}
