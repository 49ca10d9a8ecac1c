//! The space of sample positions: a box, a lattice stride, and an optional coarse mask, with a
//! dense enumeration `0..len` of the allowed lattice points.
//!
//! Uniform sampling draws an index of that enumeration; epoch mode permutes it. Either way a
//! sample position costs one binary search over the allowed mask cells (none without a mask)
//! and a mixed-radix decode: nothing is materialised per position.

use zcrop_zarr::Array;

use crate::error::{Result, SamplerError, spec_err};

/// A coarse boolean mask over sample positions: position `p` is allowed when the cell
/// `p / cell` (per dimension) is `true`. Positions beyond the mask's extent are not allowed.
///
/// Typical use: a precomputed "data is valid here" map (e.g. not NaN, over land, daytime) at a
/// resolution of one cell per few hundred positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    shape: Vec<u64>,
    cell: Vec<u64>,
    allowed: Vec<bool>,
}

impl Mask {
    /// A mask of `shape` cells (C order in `allowed`), each covering `cell` positions.
    pub fn new(shape: Vec<u64>, cell: Vec<u64>, allowed: Vec<bool>) -> Result<Mask> {
        if shape.len() != cell.len() {
            return Err(spec_err(format!(
                "mask shape {shape:?} and cell {cell:?} differ in dimensions"
            )));
        }
        if cell.contains(&0) {
            return Err(spec_err(format!("mask cell {cell:?} has a zero size")));
        }
        let n = shape
            .iter()
            .try_fold(1u64, |a, &s| a.checked_mul(s))
            .and_then(|n| usize::try_from(n).ok());
        if n != Some(allowed.len()) {
            return Err(spec_err(format!(
                "mask of shape {shape:?} needs {n:?} values, got {}",
                allowed.len()
            )));
        }
        Ok(Mask {
            shape,
            cell,
            allowed,
        })
    }

    /// A mask of `shape` cells of size `cell`, cell `c` allowed when `f(c)` is true.
    pub fn from_fn(
        shape: Vec<u64>,
        cell: Vec<u64>,
        mut f: impl FnMut(&[u64]) -> bool,
    ) -> Result<Mask> {
        let n: u64 = shape.iter().product();
        let mut idx = vec![0u64; shape.len()];
        let mut allowed = Vec::with_capacity(n as usize);
        for lin in 0..n {
            unravel(lin, &shape, &mut idx);
            allowed.push(f(&idx));
        }
        Mask::new(shape, cell, allowed)
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
        let allowed = bytes
            .chunks_exact(es)
            .map(|e| e.iter().any(|&b| b != 0))
            .collect();
        Mask::new(shape, cell, allowed)
    }

    /// Shape in cells.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Positions per cell along each dimension.
    pub fn cell(&self) -> &[u64] {
        &self.cell
    }

    /// Whether position `pos` is allowed.
    pub fn allows(&self, pos: &[u64]) -> bool {
        let mut lin = 0u64;
        for ((&p, &c), &s) in pos.iter().zip(&self.cell).zip(&self.shape) {
            let i = p / c;
            if i >= s {
                return false;
            }
            lin = lin * s + i;
        }
        self.allowed[lin as usize]
    }

    fn cell_allowed(&self, lin: u64) -> bool {
        self.allowed[lin as usize]
    }
}

/// Decodes the C-order linear index `lin` over `shape` into `out`.
pub(crate) fn unravel(mut lin: u64, shape: &[u64], out: &mut [u64]) {
    for d in (0..shape.len()).rev() {
        out[d] = lin % shape[d];
        lin /= shape[d];
    }
}

/// The allowed lattice points of a box, enumerated densely.
#[derive(Debug, Clone)]
pub(crate) struct PositionSpace {
    start: Vec<u64>,
    end: Vec<u64>,
    stride: Vec<u64>,
    mask: Option<Mask>,
    /// Allowed mask cells (C-order linear index) that hold at least one lattice point.
    cells: Vec<u64>,
    /// `prefix[i]`: lattice points in `cells[..i]`; `prefix.len() == cells.len() + 1`.
    prefix: Vec<u64>,
}

impl PositionSpace {
    /// The lattice `start + k * stride` inside `[start, end)`, restricted to `mask`.
    pub(crate) fn new(
        start: Vec<u64>,
        end: Vec<u64>,
        stride: Vec<u64>,
        mask: Option<Mask>,
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
        if let Some(m) = &mask
            && m.shape.len() != nd
        {
            return Err(spec_err(format!(
                "the mask has {} dimensions, positions have {nd}",
                m.shape.len()
            )));
        }
        let mut space = PositionSpace {
            start,
            end,
            stride,
            mask,
            cells: Vec::new(),
            prefix: vec![0],
        };
        let overflow = || spec_err("the number of sample positions overflows 64 bits");
        match &space.mask {
            None => {
                let n = space
                    .lattice_counts(&space.start, &space.end)
                    .iter()
                    .try_fold(1u64, |a, &c| a.checked_mul(c))
                    .ok_or_else(overflow)?;
                space.cells.push(0);
                space.prefix.push(n);
            }
            Some(m) => {
                // Mask cells that intersect the box.
                let first: Vec<u64> = space
                    .start
                    .iter()
                    .zip(&m.cell)
                    .map(|(s, c)| s / c)
                    .collect();
                let last: Vec<u64> = (0..nd)
                    .map(|d| ((space.end[d] - 1) / m.cell[d]).min(m.shape[d].saturating_sub(1)))
                    .collect();
                if (0..nd).all(|d| first[d] <= last[d] && first[d] < m.shape[d]) {
                    let span: Vec<u64> = (0..nd).map(|d| last[d] - first[d] + 1).collect();
                    let n: u64 = span.iter().product();
                    let mut local = vec![0u64; nd];
                    let mut cell = vec![0u64; nd];
                    let mut total = 0u64;
                    for i in 0..n {
                        unravel(i, &span, &mut local);
                        let mut lin = 0u64;
                        for d in 0..nd {
                            cell[d] = first[d] + local[d];
                            lin = lin * m.shape[d] + cell[d];
                        }
                        if !m.cell_allowed(lin) {
                            continue;
                        }
                        let (lo, hi) = space.cell_bounds(&cell);
                        let count = space
                            .lattice_counts(&lo, &hi)
                            .iter()
                            .try_fold(1u64, |a, &c| a.checked_mul(c))
                            .ok_or_else(overflow)?;
                        if count > 0 {
                            total = total.checked_add(count).ok_or_else(overflow)?;
                            space.cells.push(lin);
                            space.prefix.push(total);
                        }
                    }
                }
            }
        }
        if space.len() == 0 {
            return Err(SamplerError::EmptyRegion {
                reason: "the mask allows no lattice point inside the valid box".into(),
            });
        }
        Ok(space)
    }

    /// Number of allowed positions.
    pub(crate) fn len(&self) -> u64 {
        *self.prefix.last().unwrap_or(&0)
    }

    /// The box start (inclusive) and end (exclusive).
    pub(crate) fn bounds(&self) -> (&[u64], &[u64]) {
        (&self.start, &self.end)
    }

    /// The part of mask cell `cell` inside the box: `[lo, hi)`.
    fn cell_bounds(&self, cell: &[u64]) -> (Vec<u64>, Vec<u64>) {
        let m = self.mask.as_ref().expect("cell bounds need a mask");
        let lo = (0..cell.len())
            .map(|d| (cell[d] * m.cell[d]).max(self.start[d]))
            .collect();
        let hi = (0..cell.len())
            .map(|d| ((cell[d] + 1) * m.cell[d]).min(self.end[d]))
            .collect();
        (lo, hi)
    }

    /// Lattice points along each dimension inside `[lo, hi)`.
    fn lattice_counts(&self, lo: &[u64], hi: &[u64]) -> Vec<u64> {
        (0..lo.len())
            .map(|d| {
                let (k0, k1) = self.lattice_range(d, lo[d], hi[d]);
                k1.saturating_sub(k0)
            })
            .collect()
    }

    /// The lattice steps `k0..k1` of dimension `d` whose points lie in `[lo, hi)`.
    fn lattice_range(&self, d: usize, lo: u64, hi: u64) -> (u64, u64) {
        let (s, st) = (self.start[d], self.stride[d]);
        if hi <= lo {
            return (0, 0);
        }
        let k0 = (lo.max(s) - s).div_ceil(st);
        let k1 = (hi - s).div_ceil(st);
        (k0, k1.max(k0))
    }

    /// The `j`-th allowed position (`j < len`), written to `out`.
    pub(crate) fn nth(&self, j: u64, out: &mut [u64]) {
        debug_assert!(j < self.len());
        let nd = self.start.len();
        let c = self.prefix.partition_point(|&x| x <= j) - 1;
        let mut local = j - self.prefix[c];
        let (lo, hi) = match &self.mask {
            None => (self.start.clone(), self.end.clone()),
            Some(m) => {
                let mut cell = vec![0u64; nd];
                unravel(self.cells[c], &m.shape, &mut cell);
                self.cell_bounds(&cell)
            }
        };
        for d in (0..nd).rev() {
            let (k0, k1) = self.lattice_range(d, lo[d], hi[d]);
            let n = k1 - k0;
            let k = k0 + local % n;
            local /= n;
            out[d] = self.start[d] + k * self.stride[d];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = PositionSpace::new(vec![2, 1], vec![9, 4], vec![3, 1], None).unwrap();
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
            let s =
                PositionSpace::new(vec![1, 3], vec![19, 17], stride.clone(), Some(mask.clone()))
                    .unwrap();
            let mut want = Vec::new();
            let mut a = 1;
            while a < 19 {
                let mut b = 3;
                while b < 17 {
                    if mask.allows(&[a, b]) {
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
    fn empty_masks_and_boxes_are_errors() {
        let none = Mask::from_fn(vec![2, 2], vec![10, 10], |_| false).unwrap();
        assert!(matches!(
            PositionSpace::new(vec![0, 0], vec![20, 20], vec![1, 1], Some(none)),
            Err(SamplerError::EmptyRegion { .. })
        ));
        assert!(matches!(
            PositionSpace::new(vec![5], vec![5], vec![1], None),
            Err(SamplerError::EmptyRegion { .. })
        ));
        assert!(Mask::new(vec![2], vec![1], vec![true]).is_err());
    }
}
