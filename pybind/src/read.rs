//! One read, as both the sync and the async API run it: what is asked ([`Request`]), how much
//! work it is (to decide whether it may run inline), the output buffer, and the call into
//! `zcrop-zarr`.

use std::sync::atomic::AtomicBool;

use numpy::PyArray1;
use pyo3::prelude::*;
use zcrop::zarr::{Array, DimSelection, ReadOptions, ZarrError};

use crate::blocking::Failure;

/// What a read asks for.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    /// Orthogonal selections (a range or a list of points per dimension), each written as one
    /// block of the output, one after the other.
    Blocks(Vec<Vec<DimSelection>>),
    /// Crops of one `shape` at `origins` (flattened, `ndim` numbers per crop): an
    /// `(N, *shape)` output, planned and fetched as one batch.
    Crops {
        /// Flattened origins.
        origins: Vec<u64>,
        /// The crop shape.
        shape: Vec<u64>,
    },
}

impl Request {
    /// Bytes of output the read writes.
    pub(crate) fn out_len(&self, array: &Array) -> Result<usize, ZarrError> {
        match self {
            Request::Blocks(blocks) => array.output_len(blocks, array.element_size()),
            Request::Crops { origins, shape } => {
                let nd = array.ndim();
                if shape.len() != nd {
                    return Err(ZarrError::InvalidArgument(format!(
                        "the crop shape has {} dimensions, the array has {nd}",
                        shape.len()
                    )));
                }
                let crops = origins.len().checked_div(nd).unwrap_or(1);
                shape
                    .iter()
                    .try_fold(array.element_size() as u64, |a, &n| a.checked_mul(n))
                    .and_then(|b| b.checked_mul(crops as u64))
                    .and_then(|b| usize::try_from(b).ok())
                    .filter(|&b| isize::try_from(b).is_ok())
                    .ok_or_else(|| ZarrError::InvalidArgument("the batch is too large".into()))
            }
        }
    }

    /// An upper bound of the bytes the read decodes: every leaf chunk it touches, whole.
    pub(crate) fn work_bytes(&self, array: &Array) -> u64 {
        let chunk = array.chunk_shape();
        let extent = array.shape();
        let leaf_bytes = chunk
            .iter()
            .fold(array.element_size() as u64, |a, &c| a.saturating_mul(c));
        let chunks_along = |dim: usize, sel: &DimSelection| -> u64 {
            let c = chunk.get(dim).copied().unwrap_or(1).max(1);
            let grid = extent.get(dim).copied().unwrap_or(1).div_ceil(c);
            match *sel {
                DimSelection::Range { len: 0, .. } => 0,
                DimSelection::Range { start, len } => {
                    (start.saturating_add(len) - 1) / c - start / c + 1
                }
                DimSelection::Points(ref p) => (p.len() as u64).min(grid),
            }
        };
        let leaves: u64 = match self {
            Request::Blocks(blocks) => blocks
                .iter()
                .map(|b| {
                    b.iter()
                        .enumerate()
                        .fold(1u64, |a, (d, s)| a.saturating_mul(chunks_along(d, s)))
                })
                .fold(0u64, u64::saturating_add),
            Request::Crops { origins, shape } => {
                let nd = array.ndim().max(1);
                origins
                    .chunks(nd)
                    .map(|o| {
                        o.iter()
                            .zip(shape)
                            .enumerate()
                            .fold(1u64, |a, (d, (&s, &l))| {
                                a.saturating_mul(chunks_along(
                                    d,
                                    &DimSelection::Range { start: s, len: l },
                                ))
                            })
                    })
                    .fold(0u64, u64::saturating_add)
            }
        };
        leaves.saturating_mul(leaf_bytes)
    }

    /// Reads into `out` (exactly [`Request::out_len`] bytes), native-endian, C order.
    pub(crate) fn execute(
        &self,
        array: &Array,
        out: &mut [u8],
        cancel: &AtomicBool,
    ) -> Result<(), ZarrError> {
        let options = ReadOptions {
            transform: None,
            cancel: Some(cancel),
        };
        match self {
            Request::Blocks(blocks) => array.read_selections_into_with(blocks, out, options),
            Request::Crops { origins, shape } => {
                array.read_batch_into_with(origins, shape, out, options)
            }
        }
        .map(|_stats| ())
    }

    /// Allocates the output and reads into it.
    pub(crate) fn execute_owned(
        &self,
        array: &Array,
        cancel: &AtomicBool,
    ) -> Result<OwnedOut, Failure> {
        let mut out = OwnedOut::new(self.out_len(array)?)?;
        self.execute(array, out.bytes_mut(), cancel)?;
        Ok(out)
    }
}

/// An output buffer owned by Rust until it is handed to numpy without a copy. Its storage is
/// `u64` words, so it is 8-byte aligned, as numpy expects for every dtype zcrop reads.
#[derive(Debug)]
pub(crate) struct OwnedOut {
    words: Vec<u64>,
    len: usize,
}

impl OwnedOut {
    /// A zeroed buffer of `len` bytes: a spare one of an earlier output numpy is done with (see
    /// `buffer::take_spare`), or a new one; allocation failure is an error, never an abort.
    pub(crate) fn new(len: usize) -> Result<Self, Failure> {
        let n = len.div_ceil(8);
        let words = match crate::buffer::take_spare(n) {
            Some(words) => words,
            None => bytemuck::allocation::try_zeroed_vec::<u64>(n)
                .map_err(|()| Failure::NoMemory(len))?,
        };
        Ok(OwnedOut { words, len })
    }

    /// The buffer's bytes.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }

    /// Hands the buffer to numpy without copying: a 1-d `uint64` array owning the words (they
    /// are freed, or kept for the next output of this size, when the last view goes). The Python
    /// side views it as `uint8[:len]`, then as the array's dtype and shape.
    pub(crate) fn into_numpy(self, py: Python<'_>) -> PyResult<(Bound<'_, PyArray1<u64>>, usize)> {
        Ok((crate::buffer::words_to_numpy(py, self.words)?, self.len))
    }
}
