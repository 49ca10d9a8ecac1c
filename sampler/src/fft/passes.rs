//! The transforms: whole lines in memory, tile by tile, or the four-step (Bailey) passes.

use std::path::Path;

use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use zcrop_zarr::OpenOptions;

use super::io::{Ctx, View, Writer, c_strides, get, put, temp_array};
use super::options::FftError;
use super::plan::{FourStep, WORK, tile_origins};

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

pub(crate) fn in_memory(ctx: &Ctx<'_>, out: &mut Writer, out_len: u64) -> Result<usize, FftError> {
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
pub(crate) fn four_step(
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
