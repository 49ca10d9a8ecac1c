//! Planning: from the memory budget, the axis length and the chunking, which algorithm (whole
//! lines in memory, or the four-step passes through temporary arrays) and which block, tile
//! and chunk sizes, moving the fewest bytes while every buffer fits the budget.

use serde::{Deserialize, Serialize};

use super::options::FftError;

/// Bytes set aside for small allocations (plans, selections, metadata).
pub(crate) const SLACK: usize = 64 << 10;

/// Bytes of one complex128 working element.
pub(crate) const WORK: usize = 16;

/// The smallest budget accepted.
pub const MIN_BUDGET: usize = 256 << 10;

/// What one chunk file costs beyond its bytes (create/open, metadata, syscalls), in bytes of
/// bandwidth: the planner's cost model charges it to every chunk written or read back.
const CHUNK_OVERHEAD: f64 = 64.0 * 1024.0;

/// Sizes derived from the budget.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budgets {
    /// The largest working block, bytes.
    pub(crate) block: usize,
    /// The largest chunk written or read back, bytes.
    pub(crate) chunk: usize,
}

/// The chosen algorithm and its sizes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// The tile read from the input at once, per input dimension (the axis entry is N).
    pub(crate) tile: Vec<u64>,
    pub(crate) kind: PlanKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PlanKind {
    InMemory {
        /// Output chunk length along the axis.
        out_len: u64,
    },
    FourStep(FourStep),
}

/// A four-step configuration. Temporary arrays hold one line per leading index:
/// `X0[line, n2, n1]` (the input, rechunked), `Y[line, k2, n1]`, `Z[line, k1, k2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FourStep {
    pub(crate) n1: u64,
    pub(crate) n2: u64,
    /// Rows (n2) per pass-0 slab (the input read `rho * n1` elements along the axis at once).
    pub(crate) rho: u64,
    /// Rows per `X0` chunk, dividing `rho`.
    pub(crate) rho_c: u64,
    /// Columns (n1) per pass-1 block and per `X0` and `Y` chunk.
    pub(crate) w: u64,
    /// Rows (k2) per pass-2 block (and, without the transpose pass, per output chunk).
    pub(crate) h: u64,
    /// Rows (k2) per `Y` chunk, dividing `h`.
    pub(crate) y_rows: u64,
    /// The transpose pass: k1 rows per pass-3 block and output chunk (`m * n2` long), and
    /// per `Z` chunk (dividing `m`).
    pub(crate) z: Option<(u64, u64)>,
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
    // Pass 2 into a temporary array Z, then a transpose pass to the output: each output
    // chunk then holds m whole runs of n2 elements instead of at most n2, fewer and larger
    // chunks when n2 is short. The cost model picks the cheaper of the two ways.
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

pub(crate) fn make_plan(
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
                Err(FftError::NoFactorization {
                    n,
                    max_factor,
                    needed: ((n + fft_workspace(n)) * WORK as u64) as usize,
                })
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
