//! The read entry points: a region, a batch of crops of one shape, orthogonal selections.
//! Each is planned whole ([`crate::plan`]) and executed by [`super::fetch`] into one output.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use zcrop_io::ReadRequest;

use crate::error::{Result, ZarrError};
use crate::plan::{DimSelection, Plan, PlanError};
use crate::transform::StitchTransform;

use super::Array;
use super::fetch::{Part, Source, StitchCtx, Storages, fetch_and_stitch_parts};
use super::options::{ReadOptions, ReadStats};
use crate::stitch::DisjointOut;

impl Array {
    /// The encoded bytes of the chunks at `coords` (chunk-grid coordinates of
    /// [`Array::chunk_shape`] chunks; for a sharded array the innermost chunks), located through
    /// the shard indexes and read in one submission; `None` for a chunk that is not stored.
    pub fn read_encoded_chunks(&self, coords: &[Vec<u64>]) -> Result<Vec<Option<Bytes>>> {
        let l = &self.core.layout;
        let grid = l.leaf_grid();
        let sels: Vec<Vec<DimSelection>> = coords
            .iter()
            .map(|c| {
                if c.len() != grid.len() || c.iter().zip(&grid).any(|(x, g)| x >= g) {
                    return Err(ZarrError::OutOfBounds {
                        array: self.core.place.name.clone(),
                        shape: grid.clone(),
                        reason: format!("chunk {c:?} is outside the chunk grid {grid:?}"),
                    });
                }
                Ok(c.iter()
                    .zip(&l.leaf)
                    .map(|(x, s)| DimSelection::Range {
                        start: x * s,
                        len: 1,
                    })
                    .collect())
            })
            .collect::<Result<_>>()?;
        let plan = Plan::with_output_element(&l.shape, &l.leaf, l.elsize, l.elsize, &sels)
            .map_err(|e| self.plan_error(&e))?;
        let mut stats = ReadStats::default();
        let mut storages = Storages::default();
        let all = 0..plan.num_leaves();
        let sources = self.locate(
            &plan,
            all,
            vec![None; plan.num_leaves()],
            &mut storages,
            &mut stats,
        )?;
        let requests = sources.iter().enumerate().filter_map(|(i, s)| match s {
            Source::Read { storage, range } => Some(ReadRequest::new(
                i as u64,
                Arc::clone(&storages.list[*storage].path),
                *range,
            )),
            _ => None,
        });
        let mut by_leaf: Vec<Option<Bytes>> = sources
            .iter()
            .map(|s| match s {
                Source::Inline { bytes, .. } => Some(bytes.clone()),
                _ => None,
            })
            .collect();
        for done in self.core.reader.submit(requests) {
            let i = done.id as usize;
            let Source::Read { storage, .. } = &sources[i] else {
                continue;
            };
            match done.result {
                Ok(b) => by_leaf[i] = Some(b),
                Err(e) if e.is_not_found() => {}
                Err(e) => {
                    return Err(self.chunk_read_error(
                        &storages.list[*storage].key,
                        e,
                        !l.levels.is_empty(),
                    ));
                }
            }
        }
        // Plan leaves are sorted; map each requested chunk back to its leaf.
        let index: HashMap<&[u64], usize> = plan
            .leaves
            .iter()
            .enumerate()
            .map(|(i, leaf)| (leaf.coords.as_slice(), i))
            .collect();
        Ok(coords
            .iter()
            .map(|c| index.get(c.as_slice()).and_then(|&i| by_leaf[i].clone()))
            .collect())
    }

    /// Bytes of one output element block of `shape`.
    fn block_bytes(&self, shape: &[u64]) -> Result<usize> {
        shape
            .iter()
            .try_fold(self.core.layout.elsize as u64, |a, &n| a.checked_mul(n))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| {
                ZarrError::InvalidArgument(format!("a region of shape {shape:?} is too large"))
            })
    }

    /// Reads the region of `shape` at `origin` into a new buffer (C order, native endian).
    pub fn read_region(&self, origin: &[u64], shape: &[u64]) -> Result<Vec<u8>> {
        let mut out = output_buffer(self.block_bytes(shape)?)?;
        self.read_region_into(origin, shape, &mut out)?;
        Ok(out)
    }

    /// Reads the region of `shape` at `origin` into `out` (exactly its size).
    pub fn read_region_into(
        &self,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_region_into_with(origin, shape, out, ReadOptions::default())
    }

    /// [`Array::read_region_into`] with a transform and/or a cancellation flag.
    pub fn read_region_into_with(
        &self,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        self.check_dims(origin.len(), "origin")?;
        self.check_dims(shape.len(), "shape")?;
        let sel: Vec<DimSelection> = origin
            .iter()
            .zip(shape)
            .map(|(&start, &len)| DimSelection::Range { start, len })
            .collect();
        self.read_selections_into_with(&[sel], out, options)
    }

    /// Reads `origins.len() / ndim` crops of one `shape` (origins flattened, `ndim` numbers per
    /// crop) into one new `(N, *shape)` buffer, planned and fetched as one batch.
    pub fn read_batch(&self, origins: &[u64], shape: &[u64]) -> Result<Vec<u8>> {
        let n = self.crop_count(origins)?;
        let bytes = self
            .block_bytes(shape)?
            .checked_mul(n)
            .ok_or_else(|| ZarrError::InvalidArgument("the batch is too large".into()))?;
        let mut out = output_buffer(bytes)?;
        self.read_batch_into(origins, shape, &mut out)?;
        Ok(out)
    }

    /// [`Array::read_batch`] into `out` (exactly `N * prod(shape) * element_size` bytes).
    pub fn read_batch_into(
        &self,
        origins: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_batch_into_with(origins, shape, out, ReadOptions::default())
    }

    /// [`Array::read_batch_into`] with a transform fused into the stitch (then `out` holds
    /// `N * prod(shape)` output elements of the transform's size) and/or a cancellation flag.
    pub fn read_batch_into_with(
        &self,
        origins: &[u64],
        shape: &[u64],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        self.check_dims(shape.len(), "crop shape")?;
        self.crop_count(origins)?;
        let sels = self.crop_selections(origins, shape);
        self.read_selections_into_with(&sels, out, options)
    }

    /// The selections of crops of `shape` at `origins` (flattened, `ndim` numbers each).
    fn crop_selections(&self, origins: &[u64], shape: &[u64]) -> Vec<Vec<DimSelection>> {
        let nd = self.ndim();
        if nd == 0 {
            return vec![Vec::new()];
        }
        origins
            .chunks_exact(nd)
            .map(|o| {
                o.iter()
                    .zip(shape)
                    .map(|(&start, &len)| DimSelection::Range { start, len })
                    .collect()
            })
            .collect()
    }

    /// Reads an orthogonal selection (a range or a list of indices per dimension) into `out`,
    /// in C order of the selection's shape.
    pub fn read_selection_into(
        &self,
        selection: &[DimSelection],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_selections_into(&[selection.to_vec()], out)
    }

    /// Reads several selections, each into its block of `out`, one after the other: the most
    /// general read, planned and fetched as one batch.
    pub fn read_selections_into(
        &self,
        selections: &[Vec<DimSelection>],
        out: &mut [u8],
    ) -> Result<ReadStats> {
        self.read_selections_into_with(selections, out, ReadOptions::default())
    }

    /// [`Array::read_selections_into`] with a transform and/or a cancellation flag.
    pub fn read_selections_into_with(
        &self,
        selections: &[Vec<DimSelection>],
        out: &mut [u8],
        options: ReadOptions<'_>,
    ) -> Result<ReadStats> {
        let l = &self.core.layout;
        let out_elsize = options
            .transform
            .map_or(l.elsize, StitchTransform::output_element_size);
        if out_elsize == 0 {
            return Err(ZarrError::InvalidArgument(
                "a transform with 0-byte output elements".into(),
            ));
        }
        let plan = Plan::with_output_element(&l.shape, &l.leaf, l.elsize, out_elsize, selections)
            .map_err(|e| self.plan_error(&e))?;
        if out.len() != plan.out_len {
            return Err(ZarrError::InvalidArgument(format!(
                "output buffer has {} bytes, the read produces {}",
                out.len(),
                plan.out_len
            )));
        }
        self.execute(&plan, out, options)
    }

    /// Bytes [`Array::read_selections_into`] writes for `selections` with output elements of
    /// `out_elsize` bytes.
    pub fn output_len(&self, selections: &[Vec<DimSelection>], out_elsize: usize) -> Result<usize> {
        let l = &self.core.layout;
        Plan::with_output_element(&l.shape, &l.leaf, l.elsize, out_elsize, selections)
            .map(|p| p.out_len)
            .map_err(|e| self.plan_error(&e))
    }

    fn crop_count(&self, origins: &[u64]) -> Result<usize> {
        let nd = self.ndim();
        if nd == 0 {
            return Ok(1);
        }
        if !origins.len().is_multiple_of(nd) {
            return Err(ZarrError::InvalidArgument(format!(
                "{} origin numbers is not a whole number of {nd}-d origins",
                origins.len()
            )));
        }
        Ok(origins.len() / nd)
    }

    pub(super) fn check_dims(&self, got: usize, what: &str) -> Result<()> {
        if got == self.ndim() {
            return Ok(());
        }
        Err(ZarrError::OutOfBounds {
            array: self.core.place.name.clone(),
            shape: self.shape().to_vec(),
            reason: format!("{what} has {got} dimensions, the array has {}", self.ndim()),
        })
    }

    pub(crate) fn plan_error(&self, e: &PlanError) -> ZarrError {
        match e {
            PlanError::TooLarge | PlanError::TooManyChunks => {
                ZarrError::InvalidArgument(format!("array {:?}: {e}", self.core.place.name))
            }
            _ => ZarrError::OutOfBounds {
                array: self.core.place.name.clone(),
                shape: self.shape().to_vec(),
                reason: e.to_string(),
            },
        }
    }
}

/// A zeroed output buffer of `len` bytes, or an error if the memory cannot be had.
fn output_buffer(len: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    crate::decode::zeroed(&mut out, len).map_err(|_| ZarrError::OutOfMemory {
        what: "the output of a read".into(),
        bytes: len as u64,
    })?;
    Ok(out)
}

/// One array's share of [`read_many`]: its selections (as [`Array::read_selections_into`]
/// takes them), its output buffer and its options.
#[derive(Debug)]
pub struct ReadPart<'a> {
    /// The array.
    pub array: &'a Array,
    /// Its selections, read one after the other into `out`.
    pub selections: &'a [Vec<DimSelection>],
    /// Its output, exactly [`Array::output_len`] bytes.
    pub out: &'a mut [u8],
    /// Its transform and cancellation flag.
    pub options: ReadOptions<'a>,
}

/// Reads selections of several arrays as one batch: every part is planned and located first,
/// then the chunk reads of all parts that share an IO engine (arrays of one store) go out in
/// one submission, and each chunk is decoded and stitched into its part's output as its bytes
/// arrive. The same result as [`Array::read_selections_into_with`] for each part in turn, with
/// the round trips of an object store paid once for all parts. Returns each part's costs; the
/// first failure of any part fails the read (outputs are then partly written).
pub fn read_many(parts: Vec<ReadPart<'_>>) -> Result<Vec<ReadStats>> {
    let mut plans = Vec::with_capacity(parts.len());
    let mut arrays = Vec::with_capacity(parts.len());
    let mut options = Vec::with_capacity(parts.len());
    let mut outs = Vec::with_capacity(parts.len());
    for p in parts {
        p.array.fixed_size_elements()?;
        let l = &p.array.core.layout;
        let out_elsize = p
            .options
            .transform
            .map_or(l.elsize, StitchTransform::output_element_size);
        if out_elsize == 0 {
            return Err(ZarrError::InvalidArgument(
                "a transform with 0-byte output elements".into(),
            ));
        }
        let plan = Plan::with_output_element(&l.shape, &l.leaf, l.elsize, out_elsize, p.selections)
            .map_err(|e| p.array.plan_error(&e))?;
        if p.out.len() != plan.out_len {
            return Err(ZarrError::InvalidArgument(format!(
                "{}: output buffer has {} bytes, the read produces {}",
                p.array.name(),
                p.out.len(),
                plan.out_len
            )));
        }
        if p.options.cancel.is_some_and(|c| c.load(Ordering::Acquire)) {
            return Err(ZarrError::Cancelled);
        }
        plans.push(plan);
        arrays.push(p.array);
        options.push(p.options);
        outs.push(p.out);
    }
    let mut stats: Vec<ReadStats> = plans.iter().map(ReadStats::for_plan).collect();
    let outs: Vec<DisjointOut<'_>> = outs
        .into_iter()
        .zip(&plans)
        .map(|(out, plan)| DisjointOut::for_plan(out, plan))
        .collect();
    let ctxs: Vec<StitchCtx<'_, '_>> = plans
        .iter()
        .zip(&outs)
        .zip(options)
        .map(|((plan, out), o)| StitchCtx::new(plan, out, o))
        .collect();
    let run: Vec<Part<'_, '_, '_>> = arrays
        .iter()
        .zip(&ctxs)
        .map(|(&array, ctx)| Part { array, ctx })
        .collect();
    if plans.iter().any(|p| p.num_leaves() > 0) {
        fetch_and_stitch_parts(&run, &mut stats)?;
    }
    for (s, ctx) in stats.iter_mut().zip(ctxs) {
        *s += ctx.stats.into_inner();
    }
    Ok(stats)
}
