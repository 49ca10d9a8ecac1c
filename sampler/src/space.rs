//! The space of sample positions: a box, a lattice stride, masks of allowed cells and optional
//! weights, enumerated as a list of disjoint boxes ("blocks") of lattice points.
//!
//! Masks and weights live on grids of cells (uniform, rectilinear, or fitted to the position
//! grid) and are never expanded per position: a mask is stored as runs of allowed cells in C
//! order, and each run becomes a few boxes. Uniform sampling draws an index of the enumeration
//! (or, with weights, a point of the cumulative weight); epoch mode permutes the enumeration.
//! Either way a position costs one binary search over the blocks and a mixed-radix decode.

use std::sync::Arc;

use smallvec::SmallVec;
use zcrop_zarr::Array;

use crate::error::{Result, SamplerError, spec_err};
use crate::rng::SampleRng;

/// How the cells of a [`Mask`] or [`Weights`] lie over the sample positions, per dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cells {
    /// Cells of `size[d]` positions each along dimension `d`, the first starting at position 0.
    Size(Vec<u64>),
    /// Cell `i` of dimension `d` covers positions `edges[d][i] .. edges[d][i + 1]`: one more
    /// edge than cells, non-decreasing (an empty cell covers nothing).
    Edges(Vec<Vec<u64>>),
    /// Fitted to the position grid when the sampler is built: with `n` grid positions along a
    /// dimension and `s` cells, each cell covers `ceil(n / s)` positions, and the cells must
    /// cover the grid exactly (`s == ceil(n / ceil(n / s))`). See
    /// [`Sampler::position_grid`](crate::Sampler::position_grid).
    Fit,
}

/// A grid of cells resolved to edges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grid {
    edges: Vec<Vec<u64>>,
    /// Per dimension, the cell size when cell `i` starts at `i * size` (the last one may end
    /// early): cells are then found by division instead of a search of the edges.
    step: Vec<Option<u64>>,
    /// C-order strides of the cell grid.
    strides: Vec<u64>,
}

impl Grid {
    fn ndim(&self) -> usize {
        self.edges.len()
    }

    fn shape(&self) -> Vec<u64> {
        self.edges.iter().map(|e| e.len() as u64 - 1).collect()
    }

    /// The cell of position `p` along `d`, if the grid covers it.
    fn cell_of(&self, d: usize, p: u64) -> Option<u64> {
        let e = &self.edges[d];
        let i = e.partition_point(|&x| x <= p);
        (i > 0 && i < e.len()).then(|| i as u64 - 1)
    }

    /// The cells along `d` that intersect positions `[lo, hi)`: `c0..c1`.
    fn cells_between(&self, d: usize, lo: u64, hi: u64) -> (u64, u64) {
        let e = &self.edges[d];
        let n = e.len() as u64 - 1;
        if let Some(c) = self.step[d] {
            let end = e[e.len() - 1];
            let c0 = if lo >= end { n } else { lo / c };
            let c1 = hi.min(end).div_ceil(c).min(n);
            return (c0, c1.max(c0));
        }
        // First cell whose end is past `lo`; one past the last cell whose start is before `hi`.
        let c0 = e[1..].partition_point(|&x| x <= lo) as u64;
        let c1 = (e[..e.len() - 1].partition_point(|&x| x < hi) as u64).min(n);
        (c0, c1.max(c0))
    }

    fn linear(&self, cell: &[u64]) -> u64 {
        let mut lin = 0u64;
        for (d, &c) in cell.iter().enumerate() {
            lin = lin * (self.edges[d].len() as u64 - 1) + c;
        }
        lin
    }
}

/// Resolves `cells` for a field of `shape` cells over a position grid of `extent` positions.
fn resolve(shape: &[u64], cells: &Cells, extent: &[u64], what: &str) -> Result<Grid> {
    let nd = shape.len();
    let err = |reason: String| spec_err(format!("{what}: {reason}"));
    let edges = match cells {
        Cells::Size(size) => {
            if size.len() != nd {
                return Err(err(format!("cell size {size:?} for {nd} dimensions")));
            }
            if size.contains(&0) {
                return Err(err(format!("cell size {size:?} has a zero")));
            }
            shape
                .iter()
                .zip(size)
                .map(|(&s, &c)| {
                    s.checked_mul(c)
                        .ok_or_else(|| err("cells overflow 64-bit positions".into()))?;
                    Ok((0..=s).map(|i| i * c).collect())
                })
                .collect::<Result<Vec<Vec<u64>>>>()?
        }
        Cells::Edges(edges) => {
            if edges.len() != nd {
                return Err(err(format!(
                    "edges for {} dimensions, not {nd}",
                    edges.len()
                )));
            }
            for (d, e) in edges.iter().enumerate() {
                if e.len() as u64 != shape[d] + 1 {
                    return Err(err(format!(
                        "dimension {d} has {} cells and {} edges (one more than cells needed)",
                        shape[d],
                        e.len()
                    )));
                }
                if e.windows(2).any(|w| w[1] < w[0]) {
                    return Err(err(format!("the edges of dimension {d} decrease")));
                }
            }
            edges.clone()
        }
        Cells::Fit => {
            if extent.len() != nd {
                return Err(err(format!(
                    "{nd} dimensions for {} position dimensions",
                    extent.len()
                )));
            }
            let mut edges = Vec::with_capacity(nd);
            for d in 0..nd {
                let (n, s) = (extent[d], shape[d]);
                let c = n.div_ceil(s.max(1)).max(1);
                if s == 0 || n.div_ceil(c) != s {
                    let mut fits: Vec<String> = [1u64, 2, 4, 8, 16]
                        .iter()
                        .map(|&c| format!("{} ({c} per cell)", n.div_ceil(c)))
                        .collect();
                    fits.dedup();
                    return Err(err(format!(
                        "{s} cells along position dimension {d} do not fit its grid of {n} \
                         positions: give one value per position or per block of c positions, \
                         i.e. ceil({n} / c) values, e.g. {}",
                        fits.join(", ")
                    )));
                }
                edges.push((0..=s).map(|i| (i * c).min(n)).collect());
            }
            edges
        }
    };
    let step = edges
        .iter()
        .map(|e| {
            let c = *e.get(1)? - e[0];
            let last = e.len() - 1;
            let regular = c > 0
                && e[0] == 0
                && e[..last]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == i as u64 * c)
                && e[last] > e[last - 1]
                && e[last] <= last as u64 * c;
            regular.then_some(c)
        })
        .collect();
    let mut strides = vec![1u64; edges.len()];
    for d in (0..edges.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * (edges[d + 1].len() as u64 - 1);
    }
    Ok(Grid {
        edges,
        step,
        strides,
    })
}

fn cell_count(shape: &[u64]) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |a, &s| a.checked_mul(s))
        .ok_or_else(|| spec_err(format!("a grid of {shape:?} cells overflows 64 bits")))
}

/// A boolean mask over sample positions: position `p` is allowed when the cell holding it is.
/// Positions outside the mask's cells are not allowed.
///
/// Stored as runs of allowed cells in C order, so a mask of a billion fine cells with long
/// valid stretches costs memory per run, not per cell. Typical uses: "the data is valid here"
/// (no NaN, land, daylight), from a precomputed map at any resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    shape: Vec<u64>,
    cells: Cells,
    /// Allowed cells: disjoint, sorted `[start, end)` ranges of C-order linear cell indices.
    /// Shared, so that the sampler's copies of a mask of millions of runs cost nothing.
    runs: Arc<Vec<(u64, u64)>>,
    /// The cells' edges, unless they are fitted to a sampler's position grid.
    grid: Option<Grid>,
}

impl Mask {
    /// A mask of `shape` cells (C order in `allowed`), each covering `cell` positions.
    pub fn new(shape: Vec<u64>, cell: Vec<u64>, allowed: &[bool]) -> Result<Mask> {
        Mask::from_bools(shape, Cells::Size(cell), allowed)
    }

    /// A mask of `shape` cells laid out by `cells`, one value per cell in C order.
    pub fn from_bools(shape: Vec<u64>, cells: Cells, allowed: &[bool]) -> Result<Mask> {
        let n = cell_count(&shape)?;
        if usize::try_from(n).ok() != Some(allowed.len()) {
            return Err(spec_err(format!(
                "mask of shape {shape:?} needs {n} values, got {}",
                allowed.len()
            )));
        }
        Mask::from_runs(shape, cells, crate::valid::runs(allowed))
    }

    /// A mask of `shape` cells laid out by `cells` whose allowed cells are the C-order linear
    /// index ranges `runs` (`[start, end)`, sorted and disjoint).
    pub fn from_runs(shape: Vec<u64>, cells: Cells, runs: Vec<(u64, u64)>) -> Result<Mask> {
        let n = cell_count(&shape)?;
        let mut prev = 0u64;
        for (i, &(s, e)) in runs.iter().enumerate() {
            if s >= e || e > n || (i > 0 && s < prev) {
                return Err(spec_err(format!(
                    "mask run {i} ({s}..{e}) is empty, out of order or beyond the {n} cells"
                )));
            }
            prev = e;
        }
        let grid = match cells {
            Cells::Fit => None,
            _ => Some(resolve(&shape, &cells, &[], "mask")?),
        };
        Ok(Mask {
            shape,
            cells,
            runs: Arc::new(runs),
            grid,
        })
    }

    /// A mask over `ndim` position dimensions that allows positions `runs` (sorted, disjoint
    /// `[start, end)`) along dimension `dim`, whatever the other coordinates.
    pub fn along_one(ndim: usize, dim: usize, runs: &[(u64, u64)]) -> Result<Mask> {
        if dim >= ndim {
            return Err(spec_err(format!("dimension {dim} of {ndim}")));
        }
        let mut edges = vec![vec![0, u64::MAX]; ndim];
        edges[dim] = std::iter::once(0)
            .chain(runs.iter().flat_map(|&(s, e)| [s, e]))
            .collect();
        let mut shape = vec![1u64; ndim];
        shape[dim] = 2 * runs.len() as u64;
        let allowed = (0..runs.len() as u64)
            .map(|i| (2 * i + 1, 2 * i + 2))
            .collect();
        Mask::from_runs(shape, Cells::Edges(edges), allowed)
    }

    /// A mask of `shape` cells of size `cell`, cell `c` allowed when `f(c)` is true.
    pub fn from_fn(
        shape: Vec<u64>,
        cell: Vec<u64>,
        mut f: impl FnMut(&[u64]) -> bool,
    ) -> Result<Mask> {
        let n = cell_count(&shape)?;
        let mut idx = vec![0u64; shape.len()];
        let mut allowed = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
        for lin in 0..n {
            unravel(lin, &shape, &mut idx);
            allowed.push(f(&idx));
        }
        Mask::new(shape, cell, &allowed)
    }

    /// A mask read from a Zarr array (bool or any integer type; non-zero means allowed), one
    /// array element per cell of size `cell`.
    pub fn from_array(array: &Array, cell: Vec<u64>) -> Result<Mask> {
        let open_err = |error| SamplerError::Open {
            source_name: format!("mask {}", array.name()),
            error,
        };
        let dt = array.data_type();
        if dt.starts_with("float") || dt.starts_with("complex") {
            return Err(spec_err(format!(
                "mask array {} has data type {dt}; use bool or an integer type",
                array.name()
            )));
        }
        let shape = array.shape().to_vec();
        let origin = vec![0u64; shape.len()];
        let bytes = array.read_region(&origin, &shape).map_err(open_err)?;
        let es = array.element_size();
        let allowed: Vec<bool> = bytes
            .chunks_exact(es)
            .map(|e| e.iter().any(|&b| b != 0))
            .collect();
        Mask::new(shape, cell, &allowed)
    }

    /// Shape in cells.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// How the cells lie over the positions.
    pub fn cells(&self) -> &Cells {
        &self.cells
    }

    /// The runs of allowed cells (C-order linear `[start, end)`).
    pub fn runs(&self) -> &[(u64, u64)] {
        &self.runs
    }

    /// Whether the cell with C-order linear index `lin` is allowed.
    fn cell_allowed(&self, lin: u64) -> bool {
        let i = self.runs.partition_point(|&(s, _)| s <= lin);
        i > 0 && lin < self.runs[i - 1].1
    }

    /// Whether position `pos` is allowed; `None` for a mask whose cells are fitted to the
    /// position grid (ask the sampler: [`Sampler::allows`](crate::Sampler::allows)).
    pub fn allows(&self, pos: &[u64]) -> Option<bool> {
        self.grid.as_ref().map(|grid| mask_allows(self, grid, pos))
    }
}

fn mask_allows(mask: &Mask, grid: &Grid, pos: &[u64]) -> bool {
    let mut cell = Vec::with_capacity(pos.len());
    for (d, &p) in pos.iter().enumerate() {
        match grid.cell_of(d, p) {
            Some(c) => cell.push(c),
            None => return false,
        }
    }
    mask.cell_allowed(grid.linear(&cell))
}

/// Non-negative sampling weights over positions, constant within each cell: a position is
/// drawn with probability proportional to its cell's weight. Zero excludes a position.
#[derive(Debug, Clone, PartialEq)]
pub struct Weights {
    shape: Vec<u64>,
    cells: Cells,
    values: Vec<f64>,
}

impl Weights {
    /// Weights of `shape` cells laid out by `cells`, one value per cell in C order: finite,
    /// non-negative, not all zero.
    pub fn new(shape: Vec<u64>, cells: Cells, values: Vec<f64>) -> Result<Weights> {
        let n = cell_count(&shape)?;
        if usize::try_from(n).ok() != Some(values.len()) {
            return Err(spec_err(format!(
                "weights of shape {shape:?} need {n} values, got {}",
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|w| !w.is_finite() || *w < 0.0) {
            let mut cell = vec![0u64; shape.len()];
            unravel(i as u64, &shape, &mut cell);
            return Err(spec_err(format!(
                "weights must be finite and non-negative; cell {cell:?} has {}",
                values[i]
            )));
        }
        if values.iter().all(|&w| w == 0.0) {
            return Err(SamplerError::EmptyRegion {
                reason: "every weight is zero".into(),
            });
        }
        Ok(Weights {
            shape,
            cells,
            values,
        })
    }

    /// Shape in cells.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
}

/// Decodes the C-order linear index `lin` over `shape` into `out`.
pub(crate) fn unravel(mut lin: u64, shape: &[u64], out: &mut [u64]) {
    for d in (0..shape.len()).rev() {
        out[d] = lin % shape[d];
        lin /= shape[d];
    }
}

/// The boxes (in cell coordinates, `[lo, hi)` per dimension) that make up the C-order linear
/// cell range `[a, b)` over `shape`: at most two per dimension.
fn range_boxes(mut a: u64, b: u64, shape: &[u64], mut emit: impl FnMut(&[u64], &[u64])) {
    let nd = shape.len();
    // suffix[k]: cells in one index step of dimension k - 1 (product of shape[k..]).
    let mut suffix = vec![1u64; nd + 1];
    for k in (0..nd).rev() {
        suffix[k] = suffix[k + 1] * shape[k];
    }
    let mut idx = vec![0u64; nd];
    let (mut lo, mut hi) = (vec![0u64; nd], vec![0u64; nd]);
    while a < b {
        // The largest aligned block at `a` that fits: whole sub-grids of dims k.. .
        let k = (1..=nd)
            .find(|&k| a.is_multiple_of(suffix[k]) && a + suffix[k] <= b)
            .unwrap_or(nd);
        unravel(a, shape, &mut idx);
        let step = suffix[k];
        let room = shape[k - 1] - idx[k - 1];
        let m = ((b - a) / step).min(room).max(1);
        for d in 0..nd {
            (lo[d], hi[d]) = match d.cmp(&(k - 1)) {
                std::cmp::Ordering::Less => (idx[d], idx[d] + 1),
                std::cmp::Ordering::Equal => (idx[d], idx[d] + m),
                std::cmp::Ordering::Greater => (0, shape[d]),
            };
        }
        emit(&lo, &hi);
        a += m * step;
    }
}

/// Per-dimension numbers kept on the stack in the draw loop.
type Small = SmallVec<[u64; 8]>;

/// A guide table of `n + 1` entries over the cumulative sums `cum` (`cum[0] == 0`, one more
/// than blocks): entry `g` is the block holding the point `g / n` of the way through.
/// `at` is non-decreasing, so one pass over `cum` serves every entry.
fn guide<T: Copy + PartialOrd>(cum: &[T], n: usize, at: impl Fn(usize) -> T) -> Vec<u32> {
    let last = cum.len() - 2;
    let mut i = 0;
    (0..=n)
        .map(|g| {
            let x = at(g);
            // `i` becomes `cum.partition_point(|&p| p <= x)`.
            while i < cum.len() && cum[i] <= x {
                i += 1;
            }
            (i.max(1) - 1).min(last) as u32
        })
        .collect()
}

/// The block `b` with `cum[b] <= x < cum[b + 1]`, searched between guide entries `g` and
/// `g + 1` (widened by one block for rounding), else over all blocks.
fn guided<T: Copy + PartialOrd>(cum: &[T], guide: &[u32], g: usize, x: T) -> usize {
    let last = cum.len() - 2;
    let lo = (guide[g] as usize).saturating_sub(1);
    let hi = (guide[g + 1] as usize + 1).min(last);
    let b = lo + cum[lo + 1..=hi + 1].partition_point(|&p| p <= x);
    if b <= last && cum[b] <= x && x < cum[b + 1] {
        return b;
    }
    (cum.partition_point(|&p| p <= x).max(1) - 1).min(last)
}

/// The most weight cells a draw walks within one block; blocks crossing more are split.
const WALK_LIMIT: u64 = 64;

/// Masks, weights and their grids, as the sampler resolved them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields {
    pub(crate) masks: Vec<(Mask, Grid)>,
    pub(crate) weights: Option<(Weights, Grid)>,
}

impl Fields {
    /// Resolves `masks` and `weights` over a position grid of `extent` positions.
    pub(crate) fn resolve(
        masks: &[Mask],
        weights: Option<&Weights>,
        extent: &[u64],
    ) -> Result<Fields> {
        let nd = extent.len();
        let check = |shape: &[u64], what: &str| {
            if shape.len() == nd {
                Ok(())
            } else {
                Err(spec_err(format!(
                    "{what} has {} dimensions, the positions have {nd}",
                    shape.len()
                )))
            }
        };
        let mut out = Fields::default();
        for (i, m) in masks.iter().enumerate() {
            let what = format!("mask {i}");
            check(&m.shape, &what)?;
            let grid = match &m.grid {
                Some(grid) => grid.clone(),
                None => resolve(&m.shape, &m.cells, extent, &what)?,
            };
            out.masks.push((m.clone(), grid));
        }
        if let Some(w) = weights {
            check(&w.shape, "the weights")?;
            out.weights = Some((w.clone(), resolve(&w.shape, &w.cells, extent, "weights")?));
        }
        Ok(out)
    }

    /// Whether position `pos` is allowed by every mask and has a positive weight.
    pub(crate) fn allows(&self, pos: &[u64]) -> bool {
        self.masks.iter().all(|(m, g)| mask_allows(m, g, pos)) && self.weight(pos) > 0.0
    }

    fn weight(&self, pos: &[u64]) -> f64 {
        let Some((w, g)) = &self.weights else {
            return 1.0;
        };
        let mut cell = Vec::with_capacity(pos.len());
        for (d, &p) in pos.iter().enumerate() {
            match g.cell_of(d, p) {
                Some(c) => cell.push(c),
                None => return 0.0,
            }
        }
        w.values[g.linear(&cell) as usize]
    }
}

/// The allowed lattice points of a box, as disjoint blocks enumerated densely.
#[derive(Debug, Clone)]
pub(crate) struct PositionSpace {
    start: Vec<u64>,
    end: Vec<u64>,
    stride: Vec<u64>,
    /// Block `i` is the box `lo[i*nd..][..nd] .. hi[i*nd..][..nd]`.
    lo: Vec<u64>,
    hi: Vec<u64>,
    /// `prefix[i]`: lattice points in blocks `..i`; one more entry than blocks.
    prefix: Vec<u64>,
    /// With weights: `mass[i]`, the total weight of blocks `..i`.
    mass: Option<Vec<f64>>,
    /// Positions a draw can return (of positive weight, with weights).
    drawable: u64,
    /// Guide tables over `prefix` and `mass`, so a lookup searches a few blocks, not all.
    guide: Vec<u32>,
    mass_guide: Vec<u32>,
    fields: Fields,
}

impl PositionSpace {
    /// The lattice `start + k * stride` inside `[start, end)`, restricted to `fields`.
    pub(crate) fn new(
        start: Vec<u64>,
        end: Vec<u64>,
        stride: Vec<u64>,
        fields: Fields,
    ) -> Result<Self> {
        let nd = start.len();
        if end.len() != nd || stride.len() != nd {
            return Err(spec_err("box and stride differ in dimensions"));
        }
        if stride.contains(&0) {
            return Err(spec_err(format!("stride {stride:?} has a zero")));
        }
        if let Some((d, _)) = start
            .iter()
            .zip(&end)
            .enumerate()
            .find(|(_, (s, e))| s >= e)
        {
            return Err(SamplerError::EmptyRegion {
                reason: format!(
                    "position dimension {d} has no valid position (range {}..{})",
                    start[d], end[d]
                ),
            });
        }
        let mut space = PositionSpace {
            start,
            end,
            stride,
            lo: Vec::new(),
            hi: Vec::new(),
            prefix: vec![0],
            mass: None,
            drawable: 0,
            guide: Vec::new(),
            mass_guide: Vec::new(),
            fields: Fields::default(),
        };
        // Blocks from the first mask's runs (or the whole box), then split by the other masks
        // and the weights. A fine mask makes tens of millions of them: they stay flat.
        let mut blocks = Blocks::new(nd);
        match fields.masks.first() {
            None => blocks.push(&space.start, &space.end),
            Some((m, g)) => {
                let shape = g.shape();
                let span: Vec<(u64, u64)> = (0..nd)
                    .map(|d| g.cells_between(d, space.start[d], space.end[d]))
                    .collect();
                blocks.reserve(m.runs.len());
                let (mut lo, mut hi) = (vec![0u64; nd], vec![0u64; nd]);
                for &(a, b) in m.runs.iter() {
                    range_boxes(a, b, &shape, |clo, chi| {
                        for d in 0..nd {
                            let c0 = clo[d].max(span[d].0);
                            let c1 = chi[d].min(span[d].1);
                            if c1 <= c0 {
                                return;
                            }
                            lo[d] = g.edges[d][c0 as usize].max(space.start[d]);
                            hi[d] = g.edges[d][c1 as usize].min(space.end[d]);
                        }
                        blocks.push(&lo, &hi);
                    });
                }
            }
        }
        for (m, g) in fields.masks.iter().skip(1) {
            blocks = split(&blocks, g, |lin| m.cell_allowed(lin));
        }
        // A draw walks the weight cells its block crosses: a block that crosses many (a box
        // without a mask crosses them all) is split into one block per cell of positive weight.
        if let Some((w, g)) = &fields.weights {
            let mut out = Blocks::new(nd);
            out.reserve(blocks.len());
            for (lo, hi) in blocks.iter() {
                let crossed: u64 = (0..nd)
                    .map(|d| {
                        let (c0, c1) = g.cells_between(d, lo[d], hi[d]);
                        c1 - c0
                    })
                    .product();
                if crossed > WALK_LIMIT {
                    split_into(&mut out, lo, hi, g, |lin| w.values[lin as usize] > 0.0);
                } else {
                    out.push(lo, hi);
                }
            }
            blocks = out;
        }
        // Blocks without a lattice point are dropped in place; the lists become the space's.
        let overflow = || spec_err("the number of sample positions overflows 64 bits");
        let mut total = 0u64;
        let mut kept = 0;
        space.prefix.reserve(blocks.len());
        for b in 0..blocks.len() {
            let (lo, hi) = blocks.get(b);
            let count = space.count(lo, hi).ok_or_else(overflow)?;
            if count == 0 {
                continue;
            }
            total = total.checked_add(count).ok_or_else(overflow)?;
            blocks.lo.copy_within(b * nd..(b + 1) * nd, kept * nd);
            blocks.hi.copy_within(b * nd..(b + 1) * nd, kept * nd);
            kept += 1;
            space.prefix.push(total);
        }
        blocks.lo.truncate(kept * nd);
        blocks.hi.truncate(kept * nd);
        (space.lo, space.hi) = (blocks.lo, blocks.hi);
        space.drawable = total;
        if space.blocks() >= u32::MAX as usize {
            return Err(spec_err(
                "the masks split the positions into too many blocks",
            ));
        }
        if total == 0 {
            return Err(SamplerError::EmptyRegion {
                reason: "the masks allow no lattice point inside the valid box".into(),
            });
        }
        // Weights are not split into blocks (a fine mask crossing many weight cells would
        // multiply them): each block gets its total weight, and a draw picks the cell within
        // the block by walking the few weight cells it crosses.
        if let Some((w, g)) = &fields.weights {
            let mut mass = Vec::with_capacity(space.blocks() + 1);
            mass.push(0.0);
            let (mut acc, mut positive) = (0.0f64, 0u64);
            for b in 0..space.blocks() {
                space.walk_cells(b, g, |lin, count| {
                    let v = w.values[lin as usize];
                    if v > 0.0 {
                        acc += v * count as f64;
                        positive += count;
                    }
                    false
                });
                mass.push(acc);
            }
            if positive == 0 {
                return Err(SamplerError::EmptyRegion {
                    reason: "the weights are zero wherever the masks allow a position".into(),
                });
            }
            space.drawable = positive;
            let n = space.blocks();
            space.mass_guide = guide(&mass, n, |g| acc * (g as f64 / n as f64));
            space.mass = Some(mass);
        }
        let n = space.blocks();
        let len = space.len();
        space.guide = guide(&space.prefix, n, |g| {
            (g as u128 * u128::from(len) / n as u128) as u64
        });
        space.fields = fields;
        Ok(space)
    }

    /// Lattice points in the box `[lo, hi)`, `None` on overflow.
    fn count(&self, lo: &[u64], hi: &[u64]) -> Option<u64> {
        (0..lo.len()).try_fold(1u64, |a, d| {
            let (k0, k1) = self.lattice_range(d, lo[d], hi[d]);
            a.checked_mul(k1.saturating_sub(k0))
        })
    }

    /// Calls `f(cell, points)` for each cell of `grid` that block `b` crosses, in C order,
    /// with the block's lattice points in it, until `f` returns true; returns the part of the
    /// block in the cell it stopped at.
    fn walk_cells(
        &self,
        b: usize,
        grid: &Grid,
        mut f: impl FnMut(u64, u64) -> bool,
    ) -> Option<(Small, Small)> {
        let nd = self.start.len();
        let (lo, hi) = (&self.lo[b * nd..][..nd], &self.hi[b * nd..][..nd]);
        // Per dimension: the first cell crossed, how many, and the block's lattice points in
        // each (`counts[offset[d] + k]`), so the walk itself only multiplies and adds.
        let (mut first, mut span, mut offset) = (Small::new(), Small::new(), Small::new());
        let mut counts: SmallVec<[u64; 64]> = SmallVec::new();
        for d in 0..nd {
            let (c0, c1) = grid.cells_between(d, lo[d], hi[d]);
            if c1 == c0 {
                return None;
            }
            first.push(c0);
            span.push(c1 - c0);
            offset.push(counts.len() as u64);
            let e = &grid.edges[d];
            for c in c0 as usize..c1 as usize {
                let (k0, k1) = self.lattice_range(d, lo[d].max(e[c]), hi[d].min(e[c + 1]));
                counts.push(k1.saturating_sub(k0));
            }
        }
        let mut local = Small::from_elem(0, nd);
        loop {
            let (mut count, mut lin) = (1u64, 0u64);
            for d in 0..nd {
                count *= counts[(offset[d] + local[d]) as usize];
                lin += (first[d] + local[d]) * grid.strides[d];
            }
            if count > 0 && f(lin, count) {
                let e = &grid.edges;
                let sub_lo = (0..nd)
                    .map(|d| lo[d].max(e[d][(first[d] + local[d]) as usize]))
                    .collect();
                let sub_hi = (0..nd)
                    .map(|d| hi[d].min(e[d][(first[d] + local[d]) as usize + 1]))
                    .collect();
                return Some((sub_lo, sub_hi));
            }
            // The next cell in C order.
            let mut d = nd;
            loop {
                if d == 0 {
                    return None;
                }
                d -= 1;
                local[d] += 1;
                if local[d] < span[d] {
                    break;
                }
                local[d] = 0;
            }
        }
    }

    /// Number of lattice points in the blocks (the enumeration `nth` indexes).
    pub(crate) fn len(&self) -> u64 {
        *self.prefix.last().unwrap_or(&0)
    }

    /// Number of positions a draw can return: allowed by the masks, of positive weight.
    pub(crate) fn drawable(&self) -> u64 {
        self.drawable
    }

    /// Number of blocks the allowed positions are stored as.
    pub(crate) fn blocks(&self) -> usize {
        self.prefix.len() - 1
    }

    /// Heap bytes held: the blocks, their sums and guide tables, and the masks' runs and
    /// weights' values they were built from (a mask shared with the caller counts in full).
    pub(crate) fn heap_bytes(&self) -> usize {
        fn bytes<T>(v: &[T]) -> usize {
            size_of_val(v)
        }
        let fields = self
            .fields
            .masks
            .iter()
            .map(|(m, _)| bytes(m.runs()))
            .sum::<usize>()
            + self
                .fields
                .weights
                .as_ref()
                .map_or(0, |(w, _)| bytes(&w.values));
        bytes(&self.lo)
            + bytes(&self.hi)
            + bytes(&self.prefix)
            + self.mass.as_deref().map_or(0, bytes)
            + bytes(&self.guide)
            + bytes(&self.mass_guide)
            + fields
    }

    /// The box start (inclusive) and end (exclusive).
    pub(crate) fn bounds(&self) -> (&[u64], &[u64]) {
        (&self.start, &self.end)
    }

    /// Whether `pos` is an allowed lattice point.
    pub(crate) fn allows(&self, pos: &[u64]) -> bool {
        pos.len() == self.start.len()
            && (0..pos.len()).all(|d| {
                pos[d] >= self.start[d]
                    && pos[d] < self.end[d]
                    && (pos[d] - self.start[d]).is_multiple_of(self.stride[d])
            })
            && self.fields.allows(pos)
    }

    /// The lattice steps `k0..k1` of dimension `d` whose points lie in `[lo, hi)`.
    fn lattice_range(&self, d: usize, lo: u64, hi: u64) -> (u64, u64) {
        let (s, st) = (self.start[d], self.stride[d]);
        if hi <= lo {
            return (0, 0);
        }
        if st == 1 {
            let k0 = lo.max(s) - s;
            return (k0, (hi - s).max(k0));
        }
        let k0 = (lo.max(s) - s).div_ceil(st);
        let k1 = (hi - s).div_ceil(st);
        (k0, k1.max(k0))
    }

    /// Writes the `local`-th lattice point of block `b` (C order) to `out`.
    fn point_in_block(&self, b: usize, local: u64, out: &mut [u64]) {
        let nd = self.start.len();
        self.point_in_box(
            &self.lo[b * nd..][..nd],
            &self.hi[b * nd..][..nd],
            local,
            out,
        );
    }

    /// Writes the `local`-th lattice point of the box `[lo, hi)` (C order) to `out`.
    fn point_in_box(&self, lo: &[u64], hi: &[u64], mut local: u64, out: &mut [u64]) {
        let nd = self.start.len();
        for d in (0..nd).rev() {
            let (k0, k1) = self.lattice_range(d, lo[d], hi[d]);
            let n = k1 - k0;
            let k = k0 + local % n;
            local /= n;
            out[d] = self.start[d] + k * self.stride[d];
        }
    }

    /// The `j`-th allowed position (`j < len`), written to `out`.
    pub(crate) fn nth(&self, j: u64, out: &mut [u64]) {
        debug_assert!(j < self.len());
        let n = self.blocks();
        let g = (u128::from(j) * n as u128 / u128::from(self.len())) as usize;
        let b = guided(&self.prefix, &self.guide, g.min(n - 1), j);
        self.point_in_block(b, j - self.prefix[b], out);
    }

    /// A position drawn from `rng`: uniform over the allowed positions, or with weights, each
    /// with probability proportional to its weight.
    pub(crate) fn draw(&self, rng: &mut SampleRng, out: &mut [u64]) {
        match &self.mass {
            None => self.nth(rng.below(self.len()), out),
            Some(mass) => {
                let (weights, grid) = self.fields.weights.as_ref().expect("weights");
                let total = *mass.last().unwrap_or(&0.0);
                let point = rng.unit() * total;
                // The block holding `point` (blocks of zero weight have no width), then the
                // weight cell within it, by the rest of `point`; rounding may leave it past the
                // last cell, which then takes it.
                let blocks = self.blocks();
                let guide_at = ((point / total * blocks as f64) as usize).min(blocks - 1);
                let block = guided(mass, &self.mass_guide, guide_at, point);
                let mut rest = point - mass[block];
                let mut last = None;
                let found = self.walk_cells(block, grid, |lin, count| {
                    let cell_mass = weights.values[lin as usize] * count as f64;
                    if cell_mass <= 0.0 {
                        return false;
                    }
                    last = Some(lin);
                    if rest < cell_mass {
                        return true;
                    }
                    rest -= cell_mass;
                    false
                });
                let (lo, hi) = found.unwrap_or_else(|| {
                    let stop = last.expect("a block of positive weight");
                    self.walk_cells(block, grid, |lin, _| lin == stop)
                        .expect("the cell just walked")
                });
                let count = self.count(&lo, &hi).unwrap_or(1);
                self.point_in_box(&lo, &hi, rng.below(count), out);
            }
        }
    }
}

/// Boxes of positions, `[lo, hi)` per dimension, kept flat: box `i` is
/// `lo[i * nd..][..nd] .. hi[i * nd..][..nd]`.
struct Blocks {
    nd: usize,
    n: usize,
    lo: Vec<u64>,
    hi: Vec<u64>,
}

impl Blocks {
    fn new(nd: usize) -> Self {
        Blocks {
            nd,
            n: 0,
            lo: Vec::new(),
            hi: Vec::new(),
        }
    }

    fn reserve(&mut self, boxes: usize) {
        self.lo.reserve(boxes.saturating_mul(self.nd));
        self.hi.reserve(boxes.saturating_mul(self.nd));
    }

    fn push(&mut self, lo: &[u64], hi: &[u64]) {
        self.lo.extend_from_slice(lo);
        self.hi.extend_from_slice(hi);
        self.n += 1;
    }

    fn len(&self) -> usize {
        self.n
    }

    /// Box `i`.
    fn get(&self, i: usize) -> (&[u64], &[u64]) {
        let nd = self.nd;
        (&self.lo[i * nd..][..nd], &self.hi[i * nd..][..nd])
    }

    fn iter(&self) -> impl Iterator<Item = (&[u64], &[u64])> {
        (0..self.n).map(|i| self.get(i))
    }
}

/// Splits each block by the cells of `grid`, keeping the parts in cells where `keep(cell)`
/// (C-order linear index) holds and dropping those outside the grid.
fn split(blocks: &Blocks, grid: &Grid, keep: impl Fn(u64) -> bool) -> Blocks {
    let mut out = Blocks::new(blocks.nd);
    out.reserve(blocks.len());
    for (lo, hi) in blocks.iter() {
        split_into(&mut out, lo, hi, grid, &keep);
    }
    out
}

/// Pushes onto `out` the parts of the block `lo .. hi` in the cells of `grid` where
/// `keep(cell)` holds.
fn split_into(out: &mut Blocks, lo: &[u64], hi: &[u64], grid: &Grid, keep: impl Fn(u64) -> bool) {
    let nd = grid.ndim();
    let ranges: SmallVec<[(u64, u64); 8]> = (0..nd)
        .map(|d| grid.cells_between(d, lo[d], hi[d]))
        .collect();
    let span: Small = ranges.iter().map(|(a, b)| b - a).collect();
    let n: u64 = span.iter().product();
    let (mut local, mut cell) = (Small::from_elem(0, nd), Small::from_elem(0, nd));
    let (mut sub_lo, mut sub_hi) = (Small::from_elem(0, nd), Small::from_elem(0, nd));
    for i in 0..n {
        unravel(i, &span, &mut local);
        for d in 0..nd {
            cell[d] = ranges[d].0 + local[d];
        }
        if !keep(grid.linear(&cell)) {
            continue;
        }
        for d in 0..nd {
            let c = cell[d] as usize;
            sub_lo[d] = lo[d].max(grid.edges[d][c]);
            sub_hi[d] = hi[d].min(grid.edges[d][c + 1]);
        }
        if (0..nd).all(|d| sub_lo[d] < sub_hi[d]) {
            out.push(&sub_lo, &sub_hi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(
        start: Vec<u64>,
        end: Vec<u64>,
        stride: Vec<u64>,
        masks: &[Mask],
        weights: Option<&Weights>,
    ) -> Result<PositionSpace> {
        let extent = end.clone();
        PositionSpace::new(
            start,
            end,
            stride,
            Fields::resolve(masks, weights, &extent)?,
        )
    }

    fn all(space: &PositionSpace) -> Vec<Vec<u64>> {
        let nd = space.start.len();
        (0..space.len())
            .map(|j| {
                let mut p = vec![0; nd];
                space.nth(j, &mut p);
                p
            })
            .collect()
    }

    #[test]
    fn enumerates_the_box_lattice_in_c_order() {
        let s = space(vec![2, 1], vec![9, 4], vec![3, 1], &[], None).unwrap();
        assert_eq!(s.len(), 3 * 3);
        let want: Vec<Vec<u64>> = [2u64, 5, 8]
            .iter()
            .flat_map(|&a| (1..4).map(move |b| vec![a, b]))
            .collect();
        assert_eq!(all(&s), want);
    }

    #[test]
    fn the_mask_restricts_to_allowed_cells_exactly() {
        // Cells of 4x5 positions; a checkerboard mask.
        let mask = Mask::from_fn(vec![5, 4], vec![4, 5], |c| (c[0] + c[1]) % 2 == 0).unwrap();
        for stride in [vec![1, 1], vec![3, 2], vec![5, 7]] {
            let s = space(
                vec![1, 3],
                vec![19, 17],
                stride.clone(),
                std::slice::from_ref(&mask),
                None,
            )
            .unwrap();
            let mut want = Vec::new();
            let mut a = 1;
            while a < 19 {
                let mut b = 3;
                while b < 17 {
                    if mask.allows(&[a, b]) == Some(true) {
                        want.push(vec![a, b]);
                    }
                    b += stride[1];
                }
                a += stride[0];
            }
            let mut got = all(&s);
            got.sort();
            want.sort();
            assert_eq!(got, want, "stride {stride:?}");
        }
    }

    #[test]
    fn runs_become_few_boxes_that_cover_them_exactly() {
        let shape = [3u64, 4, 5];
        let total: u64 = shape.iter().product();
        for (a, b) in [(0, total), (7, 53), (5, 6), (0, 20), (13, 14), (19, 41)] {
            let mut cells = Vec::new();
            let mut boxes = 0;
            range_boxes(a, b, &shape, |lo, hi| {
                boxes += 1;
                for x in lo[0]..hi[0] {
                    for y in lo[1]..hi[1] {
                        for z in lo[2]..hi[2] {
                            cells.push(x * 20 + y * 5 + z);
                        }
                    }
                }
            });
            cells.sort_unstable();
            assert_eq!(cells, (a..b).collect::<Vec<_>>(), "{a}..{b}");
            assert!(boxes <= 2 * shape.len(), "{a}..{b}: {boxes} boxes");
        }
    }

    #[test]
    fn heap_bytes_count_blocks_tables_and_the_masks_runs() {
        // Runs along rows of a 4x10 mask of single positions: one block per run.
        let runs = vec![(1, 3), (12, 18), (25, 26), (31, 40)];
        let mask = Mask::from_runs(vec![4, 10], Cells::Size(vec![1, 1]), runs).unwrap();
        let s = space(vec![0, 0], vec![4, 10], vec![1, 1], &[mask], None).unwrap();
        let (blocks, nd, runs) = (4, 2, 4);
        assert_eq!(s.blocks(), blocks);
        let bounds = 2 * blocks * nd * size_of::<u64>();
        let (prefix, guide) = (
            (blocks + 1) * size_of::<u64>(),
            (blocks + 1) * size_of::<u32>(),
        );
        let mask = runs * size_of::<(u64, u64)>();
        assert_eq!(s.heap_bytes(), bounds + prefix + guide + mask);
    }

    #[test]
    fn fitted_and_edged_grids_and_several_masks_combine() {
        // A fitted 3x3 mask over a 10x7 grid: cells of 4x3 positions (the last ones short).
        let fitted = Mask::from_bools(
            vec![3, 3],
            Cells::Fit,
            &[true, false, true, true, true, false, false, true, true],
        )
        .unwrap();
        // A rectilinear mask: rows 0..2 and 5..10 allowed, all columns.
        let edged = Mask::from_bools(
            vec![3, 1],
            Cells::Edges(vec![vec![0, 2, 5, 10], vec![0, 7]]),
            &[true, false, true],
        )
        .unwrap();
        let s = space(vec![0, 0], vec![10, 7], vec![1, 1], &[fitted, edged], None).unwrap();
        let fit_ok = |p: &[u64]| {
            let allowed = [
                [true, false, true],
                [true, true, false],
                [false, true, true],
            ];
            allowed[(p[0] / 4) as usize][(p[1] / 3) as usize]
        };
        let mut want = Vec::new();
        for a in 0..10u64 {
            for b in 0..7u64 {
                if fit_ok(&[a, b]) && !(2..5).contains(&a) {
                    want.push(vec![a, b]);
                }
            }
        }
        let mut got = all(&s);
        got.sort();
        assert_eq!(got, want);
        for p in &want {
            assert!(s.allows(p));
        }
        assert!(!s.allows(&[3, 0]));
        // A fitted mask that does not cover the grid is an error saying what would.
        let bad = Mask::from_bools(vec![6, 1], Cells::Fit, &[true; 6]).unwrap();
        let e = space(vec![0, 0], vec![10, 7], vec![1, 1], &[bad], None).unwrap_err();
        assert!(e.to_string().contains("ceil(10 / c)"), "{e}");
    }

    #[test]
    fn weighted_draws_follow_the_weights() {
        // Weights over 2x2 cells of 5x5 positions: 1, 0, 2, 5 (per position).
        let weights = Weights::new(
            vec![2, 2],
            Cells::Size(vec![5, 5]),
            vec![1.0, 0.0, 2.0, 5.0],
        )
        .unwrap();
        let sp = space(vec![0, 0], vec![10, 10], vec![1, 1], &[], Some(&weights)).unwrap();
        assert_eq!(sp.drawable(), 75);
        let mut counts = [0u64; 4];
        let draws = 80_000;
        let mut pos = [0u64; 2];
        for i in 0..draws {
            sp.draw(&mut SampleRng::new(4, i), &mut pos);
            counts[(pos[0] / 5 * 2 + pos[1] / 5) as usize] += 1;
        }
        assert_eq!(counts[1], 0);
        let share = [1.0 / 8.0, 0.0, 2.0 / 8.0, 5.0 / 8.0];
        let chi2: f64 = [0, 2, 3]
            .iter()
            .map(|&c| {
                let expect = share[c] * draws as f64;
                (counts[c] as f64 - expect).powi(2) / expect
            })
            .sum();
        // 2 degrees of freedom: p = 0.001 at 13.8.
        assert!(chi2 < 13.8, "chi2 {chi2}, counts {counts:?}");
    }

    #[test]
    fn a_block_crossing_many_weight_cells_is_split_and_drawn_exactly() {
        // 12 x 12 weight cells of one position each: the plain box crosses 144 > WALK_LIMIT.
        let values: Vec<f64> = (0..144u32).map(|i| f64::from(i % 5)).collect();
        let weights = Weights::new(vec![12, 12], Cells::Size(vec![1, 1]), values.clone()).unwrap();
        let sp = space(vec![0, 0], vec![12, 12], vec![1, 1], &[], Some(&weights)).unwrap();
        assert_eq!(
            sp.blocks() as u64,
            values.iter().filter(|&&v| v > 0.0).count() as u64
        );
        assert_eq!(sp.drawable(), sp.blocks() as u64);
        let mut counts = vec![0u64; 144];
        let mut pos = [0u64; 2];
        let draws = 100_000u64;
        for i in 0..draws {
            sp.draw(&mut SampleRng::new(8, i), &mut pos);
            counts[(pos[0] * 12 + pos[1]) as usize] += 1;
        }
        let total: f64 = values.iter().sum();
        let chi2: f64 = values
            .iter()
            .zip(&counts)
            .filter(|(v, _)| **v > 0.0)
            .map(|(v, &c)| {
                let expect = v / total * draws as f64;
                (c as f64 - expect).powi(2) / expect
            })
            .sum();
        assert!(values.iter().zip(&counts).all(|(v, &c)| *v > 0.0 || c == 0));
        // 114 degrees of freedom: p = 0.001 at about 165.
        assert!(chi2 < 165.0, "chi2 {chi2}");
    }

    #[test]
    fn bad_fields_and_empty_spaces_are_errors() {
        let none = Mask::from_fn(vec![2, 2], vec![10, 10], |_| false).unwrap();
        assert!(matches!(
            space(vec![0, 0], vec![20, 20], vec![1, 1], &[none], None),
            Err(SamplerError::EmptyRegion { .. })
        ));
        assert!(matches!(
            space(vec![5], vec![5], vec![1], &[], None),
            Err(SamplerError::EmptyRegion { .. })
        ));
        assert!(Mask::new(vec![2], vec![1], &[true]).is_err());
        assert!(Weights::new(vec![2], Cells::Size(vec![1]), vec![1.0, -1.0]).is_err());
        assert!(Weights::new(vec![2], Cells::Size(vec![1]), vec![1.0, f64::NAN]).is_err());
        assert!(matches!(
            Weights::new(vec![2], Cells::Size(vec![1]), vec![0.0, 0.0]),
            Err(SamplerError::EmptyRegion { .. })
        ));
        let m3 = Mask::from_fn(vec![1, 1, 1], vec![1, 1, 1], |_| true).unwrap();
        let e = space(vec![0, 0], vec![2, 2], vec![1, 1], &[m3], None).unwrap_err();
        assert!(e.to_string().contains("3 dimensions"), "{e}");
    }

    proptest::proptest! {
        /// The one-pass guide table equals a binary search per entry, and `guided` finds the
        /// block holding any point.
        #[test]
        fn the_guide_table_matches_a_search_per_entry(
            counts in proptest::collection::vec(0u64..5, 1..60),
            n in 1usize..80,
            probes in proptest::collection::vec(0u64..1000, 20),
        ) {
            let mut cum = vec![0u64];
            for c in &counts {
                cum.push(cum.last().unwrap() + c);
            }
            let total = *cum.last().unwrap();
            let at = |g: usize| (g as u64 * total) / n as u64;
            let last = cum.len() - 2;
            let want: Vec<u32> = (0..=n)
                .map(|g| (cum.partition_point(|&p| p <= at(g)).max(1) - 1).min(last) as u32)
                .collect();
            let table = guide(&cum, n, at);
            proptest::prop_assert_eq!(&table, &want);
            if total > 0 {
                for x in probes.iter().map(|p| p % total) {
                    let g = (u128::from(x) * n as u128 / u128::from(total)) as usize;
                    let g = g.min(n - 1);
                    let b = guided(&cum, &table, g, x);
                    proptest::prop_assert!(cum[b] <= x && x < cum[b + 1], "{x} in block {b}");
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Any two masks (uniform and rectilinear cells), weights, box and stride: the blocks
        /// enumerate exactly the allowed lattice points, once each.
        #[test]
        fn blocks_enumerate_exactly_the_allowed_points(
            a in proptest::collection::vec(proptest::bool::ANY, 12),
            b in proptest::collection::vec(proptest::bool::ANY, 6),
            w in proptest::collection::vec(0u8..3, 4),
            start in (0u64..6, 0u64..5),
            len in (1u64..12, 1u64..10),
            stride in (1u64..4, 1u64..4),
            cut in (1u64..8, 1u64..6),
        ) {
            let end = (start.0 + len.0, start.1 + len.1);
            // Mask 1: 4x3 cells of 3x4 positions; mask 2: cells split at `cut`.
            let m1 = Mask::new(vec![4, 3], vec![3, 4], &a).unwrap();
            let m2 = Mask::from_bools(
                vec![2, 3],
                Cells::Edges(vec![vec![0, cut.0, 20], vec![0, cut.1, cut.1 + 2, 20]]),
                &b,
            )
            .unwrap();
            let wv: Vec<f64> = w.iter().map(|&x| f64::from(x)).collect();
            let weights = (wv.iter().any(|&x| x > 0.0))
                .then(|| Weights::new(vec![2, 2], Cells::Size(vec![7, 5]), wv.clone()).unwrap());
            let masks = [m1.clone(), m2.clone()];
            let stride = vec![stride.0, stride.1];
            let built = space(
                vec![start.0, start.1],
                vec![end.0, end.1],
                stride.clone(),
                &masks,
                weights.as_ref(),
            );
            let mut want = Vec::new();
            for x in (start.0..end.0).step_by(stride[0] as usize) {
                for y in (start.1..end.1).step_by(stride[1] as usize) {
                    let p = [x, y];
                    let wt = weights
                        .as_ref()
                        .map_or(1.0, |_| if x < 14 && y < 10 { wv[(x / 7 * 2 + y / 5) as usize] } else { 0.0 });
                    if m1.allows(&p) == Some(true) && m2.allows(&p) == Some(true) && wt > 0.0 {
                        want.push(p.to_vec());
                    }
                }
            }
            match built {
                Err(SamplerError::EmptyRegion { .. }) => proptest::prop_assert!(want.is_empty()),
                Err(e) => proptest::prop_assert!(false, "{e}"),
                Ok(s) => {
                    // With weights the blocks also hold zero-weight points, never drawn.
                    let mut got: Vec<Vec<u64>> =
                        all(&s).into_iter().filter(|p| s.allows(p)).collect();
                    got.sort();
                    proptest::prop_assert_eq!(&got, &want);
                    proptest::prop_assert_eq!(s.drawable(), want.len() as u64);
                    for p in &want {
                        proptest::prop_assert!(s.allows(p));
                    }
                    let mut q = [0u64; 2];
                    for i in 0..50 {
                        s.draw(&mut SampleRng::new(1, i), &mut q);
                        proptest::prop_assert!(s.allows(&q), "{:?}", q);
                    }
                }
            }
        }
    }
}
