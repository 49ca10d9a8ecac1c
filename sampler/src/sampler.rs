//! The sample spec (sources, how their origins follow a shared position, sampling mode) and the
//! [`Sampler`] that turns `(seed, step, rank, world_size)` into a batch plan and reads it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use zcrop_io::fork::PerProcess;
use zcrop_io::sync::Mutex;
use zcrop_zarr::{Array, ReadOptions, ReadStats, StitchTransform};

use crate::coords::{self, Coord, CoordLabel};
use crate::error::{Result, SamplerError, spec_err};
use crate::pad::Clip;
use crate::permutation::Permutation;
use crate::rng::SampleRng;
use crate::space::{Fields, Mask, PositionSpace, Weights};
use crate::transform::{Fused, Transform};

/// How one dimension of a source's crop origin follows from the shared sample position.
///
/// An aligned dimension has origin `offset + floor(position * num / den) + jitter`, where
/// `position` is the sample's coordinate along the named position dimension and `jitter` is
/// drawn uniformly from `[-j, j]` per sample. A looked-up dimension takes its origin from a
/// table with one entry per position along the named dimension (`offset + table[position] +
/// jitter`): the alignment of coordinate labels, computed once. A fixed dimension always starts
/// at the same index (for example all channels of a `(t, c, y, x)` array).
///
/// Any dimension can take every `k`-th element inside its crop ([`Dim::every`]): a crop of `n`
/// then spans `(n - 1) * k + 1` elements of the array. A picked dimension ([`Dim::pick`])
/// takes the listed indices, in their order (channels chosen by name). An aligned dimension
/// can be periodic ([`Dim::wrap`]): crops across the array's end continue at its start.
///
/// ```
/// use zcrop_sampler::Dim;
/// // A grid 4x coarser than the position grid, shifted by 2 cells, jittered by +-1 cell.
/// let d = Dim::along("y").scale(1, 4).offset(2).jitter(1);
/// // All of the channel axis.
/// let c = Dim::fixed(0);
/// // Hourly frames from 15-minute data: origin from a label table, every 4th frame.
/// let t = Dim::lookup("time", vec![0, 4, 8, -1, 16]).every(4);
/// # let _ = (d, c, t);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dim {
    position: Option<String>,
    offset: i64,
    num: u64,
    den: u64,
    jitter: u64,
    table: Option<Arc<[i64]>>,
    every: u64,
    picks: Option<Arc<[u64]>>,
    wrap: bool,
}

impl Dim {
    /// Follows position dimension `position` one to one.
    pub fn along(position: impl Into<String>) -> Dim {
        Dim {
            position: Some(position.into()),
            offset: 0,
            num: 1,
            den: 1,
            jitter: 0,
            table: None,
            every: 1,
            picks: None,
            wrap: false,
        }
    }

    /// Follows position dimension `position` through `table`: at position `p` the crop starts
    /// at `table[p]` (plus offset and jitter). A negative entry means the source has no
    /// alignment at `p`; such positions, and those past the table's end, are never drawn.
    pub fn lookup(position: impl Into<String>, table: impl Into<Arc<[i64]>>) -> Dim {
        Dim {
            table: Some(table.into()),
            ..Dim::along(position)
        }
    }

    /// Always starts at `origin`.
    pub fn fixed(origin: u64) -> Dim {
        Dim {
            position: None,
            offset: origin as i64,
            num: 1,
            den: 1,
            jitter: 0,
            table: None,
            every: 1,
            picks: None,
            wrap: false,
        }
    }

    /// Takes the elements at `indices` (in this order; the crop along the dimension is
    /// `indices.len()`), for every sample.
    pub fn pick(indices: impl Into<Arc<[u64]>>) -> Dim {
        Dim {
            picks: Some(indices.into()),
            ..Dim::fixed(0)
        }
    }

    /// Adds `offset` array elements to an aligned or looked-up origin.
    #[must_use]
    pub fn offset(mut self, offset: i64) -> Dim {
        self.offset = offset;
        self
    }

    /// Scales the position by `num / den` (rounded down): `scale(3, 1)` for an array three times
    /// finer than the position grid, `scale(1, 3)` for one three times coarser.
    #[must_use]
    pub fn scale(mut self, num: u64, den: u64) -> Dim {
        self.num = num;
        self.den = den;
        self
    }

    /// Jitters the origin by a uniform integer in `[-j, j]`, drawn per sample.
    #[must_use]
    pub fn jitter(mut self, j: u64) -> Dim {
        self.jitter = j;
        self
    }

    /// Makes the array periodic along this aligned dimension (longitude): origins wrap
    /// around its end, and a crop passing the end continues at index 0.
    #[must_use]
    pub fn wrap(mut self) -> Dim {
        self.wrap = true;
        self
    }

    /// Takes every `k`-th element inside the crop (`k >= 1`; 1 is contiguous).
    #[must_use]
    pub fn every(mut self, k: u64) -> Dim {
        self.every = k;
        self
    }
}

/// Which coordinate arrays label a source's samples.
#[derive(Debug, Clone, Default)]
enum Coordinates {
    /// 1-d sibling arrays named like the dimensions (see the `coords` module).
    #[default]
    Discover,
    /// None.
    Off,
    /// These arrays, by source dimension.
    Given(Vec<(usize, String, Array)>),
}

/// One dataset of a sample: an array, the shape of its crops, how their origins follow the
/// sample position, and the transform applied on the way into the batch buffer.
#[derive(Debug, Clone)]
pub struct Source {
    name: String,
    array: Array,
    crop: Vec<u64>,
    dims: Option<Vec<Dim>>,
    transform: Transform,
    coordinates: Coordinates,
    pad: Vec<usize>,
    fill: Option<f64>,
}

impl Source {
    /// A source named `name` reading crops of `crop` from `array`.
    ///
    /// Unless [`Source::dims`] says otherwise, a dimension whose name (v3 `dimension_names` or
    /// v2 `_ARRAY_DIMENSIONS`) is a position dimension follows it, the others are fixed at 0;
    /// an array without names and with as many dimensions as positions follows them in order.
    pub fn new(name: impl Into<String>, array: Array, crop: impl Into<Vec<u64>>) -> Source {
        Source {
            name: name.into(),
            array,
            crop: crop.into(),
            dims: None,
            transform: Transform::none(),
            coordinates: Coordinates::Discover,
            pad: Vec::new(),
            fill: None,
        }
    }

    /// Opens the array at `path` (see [`Source::new`]): a local directory or a URL
    /// (`s3://bucket/data.zarr/temperature`).
    pub fn open(
        name: impl Into<String>,
        path: impl AsRef<Path>,
        crop: impl Into<Vec<u64>>,
    ) -> Result<Source> {
        Self::open_with(name, path, crop, &zcrop_zarr::OpenOptions::default())
    }

    /// [`Source::open`] with options (for a URL: its storage options).
    pub fn open_with(
        name: impl Into<String>,
        path: impl AsRef<Path>,
        crop: impl Into<Vec<u64>>,
        options: &zcrop_zarr::OpenOptions,
    ) -> Result<Source> {
        let name = name.into();
        let array = Array::open_with(path, options).map_err(|error| SamplerError::Open {
            source_name: name.clone(),
            error,
        })?;
        Ok(Source::new(name, array, crop))
    }

    /// How each array dimension's origin follows the position (one entry per dimension).
    #[must_use]
    pub fn dims(mut self, dims: impl IntoIterator<Item = Dim>) -> Source {
        self.dims = Some(dims.into_iter().collect());
        self
    }

    /// The transform applied while stitching (dtype conversion, normalisation, FFT).
    #[must_use]
    pub fn transform(mut self, transform: Transform) -> Source {
        self.transform = transform;
        self
    }

    /// Labels samples with the values of `coordinate` (a 1-d array as long as dimension `axis`)
    /// instead of discovering coordinate arrays. Call once per labelled dimension.
    #[must_use]
    pub fn coordinate(mut self, axis: usize, name: impl Into<String>, coordinate: Array) -> Source {
        let entry = (axis, name.into(), coordinate);
        match &mut self.coordinates {
            Coordinates::Given(v) => v.push(entry),
            c => *c = Coordinates::Given(vec![entry]),
        }
        self
    }

    /// Pads along dimension `axis`, which must follow a position: positions range over the
    /// array's own indices along it (scaled, or every entry of a lookup table), and a crop
    /// may pass either end of the array; what lies outside is [`Source::fill`]. Call once per
    /// padded dimension.
    #[must_use]
    pub fn pad(mut self, axis: usize) -> Source {
        self.pad.push(axis);
        self
    }

    /// The value of padded elements, in the delivered type (after the transform). By default
    /// NaN where that type is a float type, and the array's fill value otherwise.
    #[must_use]
    pub fn fill(mut self, value: f64) -> Source {
        self.fill = Some(value);
        self
    }

    /// Turns coordinate labels off for this source.
    #[must_use]
    pub fn without_coordinates(mut self) -> Source {
        self.coordinates = Coordinates::Off;
        self
    }
}

/// How sample positions are chosen.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Mode {
    /// Independent uniform draws over every allowed position (with replacement).
    #[default]
    Uniform,
    /// Every allowed point of the lattice `box_start + k * stride` exactly once per epoch, in a
    /// pseudo-random order that changes every epoch. Epoch `e` is global samples
    /// `e * epoch_len .. (e + 1) * epoch_len`; a batch may straddle two epochs.
    Epoch {
        /// The lattice spacing per position dimension.
        stride: Vec<u64>,
    },
}

/// Which part of a global batch a process reads: rank `rank` of `world_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    /// This process's rank, `< world_size`.
    pub rank: u32,
    /// The number of processes sharing each global batch.
    pub world_size: u32,
}

impl Shard {
    /// One process reading everything.
    pub const SINGLE: Shard = Shard {
        rank: 0,
        world_size: 1,
    };

    /// Rank `rank` of `world_size`.
    pub fn new(rank: u32, world_size: u32) -> Shard {
        Shard { rank, world_size }
    }
}

impl Default for Shard {
    fn default() -> Self {
        Shard::SINGLE
    }
}

/// Everything a sampler needs: the position dimensions, the sources, the region, the mode, the
/// seed and the per-rank batch size. Build it with the chaining methods, then
/// [`Sampler::new`].
#[derive(Debug, Clone)]
pub struct SampleSpec {
    positions: Vec<String>,
    sources: Vec<Source>,
    region: Option<(Vec<u64>, Vec<u64>)>,
    masks: Vec<Mask>,
    weights: Option<Weights>,
    mode: Mode,
    seed: u64,
    batch_size: usize,
}

impl SampleSpec {
    /// A spec over the named position dimensions (e.g. `["time", "y", "x"]`), seed 0, batch
    /// size 1, uniform mode.
    pub fn new<S: Into<String>>(positions: impl IntoIterator<Item = S>) -> SampleSpec {
        SampleSpec {
            positions: positions.into_iter().map(Into::into).collect(),
            sources: Vec::new(),
            region: None,
            masks: Vec::new(),
            weights: None,
            mode: Mode::Uniform,
            seed: 0,
            batch_size: 1,
        }
    }

    /// Adds a source.
    #[must_use]
    pub fn source(mut self, source: Source) -> SampleSpec {
        self.sources.push(source);
        self
    }

    /// Restricts positions to the box `start..end` (end exclusive, per position dimension).
    #[must_use]
    pub fn region(mut self, start: Vec<u64>, end: Vec<u64>) -> SampleSpec {
        self.region = Some((start, end));
        self
    }

    /// Restricts positions to the cells `mask` allows (with several masks, to the cells all
    /// of them allow).
    #[must_use]
    pub fn mask(mut self, mask: Mask) -> SampleSpec {
        self.masks.push(mask);
        self
    }

    /// Draws positions with probability proportional to `weights` (uniform mode only; a zero
    /// weight excludes a position).
    #[must_use]
    pub fn weights(mut self, weights: Weights) -> SampleSpec {
        self.weights = Some(weights);
        self
    }

    /// Sets the sampling mode.
    #[must_use]
    pub fn mode(mut self, mode: Mode) -> SampleSpec {
        self.mode = mode;
        self
    }

    /// Sets the seed.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> SampleSpec {
        self.seed = seed;
        self
    }

    /// Sets the number of samples per batch on each rank.
    #[must_use]
    pub fn batch_size(mut self, batch_size: usize) -> SampleSpec {
        self.batch_size = batch_size;
        self
    }
}

#[derive(Debug, Clone)]
enum DimRt {
    Aligned {
        pos: usize,
        offset: i64,
        num: u64,
        den: u64,
        jitter: u64,
    },
    Lookup {
        pos: usize,
        table: Arc<[i64]>,
        offset: i64,
        jitter: u64,
    },
    Fixed(u64),
}

impl DimRt {
    /// The position dimension an aligned or looked-up dimension follows.
    fn position(&self) -> Option<usize> {
        match *self {
            DimRt::Aligned { pos, .. } | DimRt::Lookup { pos, .. } => Some(pos),
            DimRt::Fixed(_) => None,
        }
    }
}

/// What a sampler knows about one of its sources.
#[derive(Debug, Clone)]
pub struct SourceInfo {
    /// The source's name.
    pub name: Arc<str>,
    /// The array's directory.
    pub array: Arc<str>,
    /// The crop shape.
    pub crop: Vec<u64>,
    /// The v3 name of the delivered element type (`uint16`, `float32`, `complex64`, ...).
    pub dtype: String,
    /// Bytes per delivered element.
    pub element_size: usize,
    /// Bytes of one crop.
    pub crop_bytes: usize,
    /// Bytes of one batch of this source (`batch_size` crops).
    pub batch_bytes: usize,
    /// How each dimension's crop origin is placed, as resolved from the spec.
    pub origins: Vec<OriginRule>,
    /// Per dimension, the step between the elements a crop takes (1: contiguous).
    pub every: Vec<u64>,
    /// Per dimension, the indices a picked dimension takes.
    pub picks: Vec<Option<Arc<[u64]>>>,
    /// The dimension along which the array is periodic, if any.
    pub wrap: Option<usize>,
    /// Per dimension, whether crops may pass the array's ends (filled outside).
    pub pad: Vec<bool>,
}

/// How one dimension of a source's crop origin is placed, as the sampler resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginRule {
    /// `offset + floor(position[position] * num / den) + jitter`, jitter in `[-jitter, jitter]`.
    Aligned {
        /// The position dimension's index.
        position: usize,
        /// Added to the scaled position.
        offset: i64,
        /// Scale numerator.
        num: u64,
        /// Scale denominator.
        den: u64,
        /// Largest jitter either way.
        jitter: u64,
    },
    /// `offset + table[position[position]] + jitter`, jitter in `[-jitter, jitter]`.
    Lookup {
        /// The position dimension's index.
        position: usize,
        /// The origin at each position along it (negative: no alignment there).
        table: Arc<[i64]>,
        /// Added to the table's entry.
        offset: i64,
        /// Largest jitter either way.
        jitter: u64,
    },
    /// Always this index.
    Fixed(u64),
}

struct SourceRt {
    info: SourceInfo,
    array: Array,
    dims: Vec<DimRt>,
    fused: Option<Fused>,
    coords: Vec<Coord>,
    /// How a crop with steps or picks inside it is read as contiguous sub-crops.
    sub: Option<SubCrops>,
    /// Per dimension, the elements a stepped or picked dimension takes (see [`SubCrops`]).
    offsets: Vec<Option<Vec<u64>>>,
    /// The transform, to fuse into reads of crop pieces (periodic dimensions).
    transform: Transform,
    /// The dimension along which the array is periodic, if any.
    wrap: Option<usize>,
    /// Per dimension, whether crops may pass the array's ends.
    pad: Vec<bool>,
    /// One element of the delivered type: the value of padded elements.
    fill: Vec<u8>,
}

/// A crop that takes every `k`-th (or picked) elements along some dimensions, read as
/// contiguous sub-crops: one element along each such dimension, the whole crop along the others.
struct SubCrops {
    /// The shape of one sub-crop.
    shape: Vec<u64>,
    /// Per sub-crop (C order over the stepped dimensions), its origin's offset from the crop's
    /// origin (`ndim` numbers each) and its index along each dimension of the crop.
    deltas: Vec<u64>,
    index: Vec<u64>,
    /// Sub-crops are consecutive blocks of the crop (every dimension before a stepped one is
    /// cropped to 1 or stepped), so they are read straight into the batch buffer.
    contiguous: bool,
}

impl SubCrops {
    /// Sub-crops for a crop whose dimensions take the elements `offsets[d]` (relative to the
    /// origin) instead of a contiguous run, where given.
    fn new(crop: &[u64], offsets: &[Option<Vec<u64>>]) -> Option<SubCrops> {
        let last = offsets.iter().rposition(Option::is_some)?;
        let shape: Vec<u64> = crop
            .iter()
            .zip(offsets)
            .map(|(&c, o)| if o.is_some() { 1 } else { c })
            .collect();
        let contiguous = (0..last).all(|d| offsets[d].is_some() || crop[d] == 1);
        let counts: Vec<u64> = offsets
            .iter()
            .map(|o| o.as_ref().map_or(1, |o| o.len() as u64))
            .collect();
        let n: u64 = counts.iter().product();
        let mut idx = vec![0u64; crop.len()];
        let mut deltas = Vec::with_capacity(n as usize * crop.len());
        let mut index = Vec::with_capacity(n as usize * crop.len());
        for lin in 0..n {
            crate::space::unravel(lin, &counts, &mut idx);
            index.extend_from_slice(&idx);
            deltas.extend(
                idx.iter()
                    .zip(offsets)
                    .map(|(&i, o)| o.as_ref().map_or(0, |o| o[i as usize])),
            );
        }
        Some(SubCrops {
            shape,
            deltas,
            index,
            contiguous,
        })
    }

    fn count(&self) -> usize {
        self.deltas.len() / self.shape.len()
    }
}

/// An epoch and its permutation.
type EpochPermutation = (u64, Arc<Permutation>);

struct Inner {
    positions: Vec<String>,
    sources: Vec<SourceRt>,
    /// Positions per dimension of the grid masks and weights are fitted to.
    grid: Vec<u64>,
    space: PositionSpace,
    mode: Mode,
    seed: u64,
    batch_size: usize,
    /// The permutation of the most recent epoch (epoch mode), per process (a child of `fork`
    /// must not wait on a lock a parent thread held at the fork).
    perm: PerProcess<Mutex<Option<EpochPermutation>>>,
}

/// A compiled [`SampleSpec`]: opened sources, the valid position region, the transforms.
/// Cheap to clone and shareable between threads.
///
/// Batch `step` of rank `r` holds global samples `step * B + r * b .. + b` (`b` the per-rank
/// batch size, `B = b * world_size`), and global sample `g` depends only on `(seed, g)` and
/// the spec. So a batch is a pure function of `(seed, step, rank, world_size)`, ranks are
/// disjoint, and a job resumes at step `k` by asking for step `k`.
#[derive(Clone)]
pub struct Sampler {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("positions", &self.inner.positions)
            .field("sources", &self.sources())
            .field("mode", &self.inner.mode)
            .field("seed", &self.inner.seed)
            .field("batch_size", &self.inner.batch_size)
            .field("len", &self.inner.space.len())
            .finish()
    }
}

/// The interval of positions `[lo, hi]` for which an aligned dimension keeps its crop inside
/// `[0, size)` whatever the jitter; `None` if there is none.
fn aligned_interval(
    size: u64,
    crop: u64,
    offset: i64,
    num: u64,
    den: u64,
    jitter: u64,
) -> Option<(u64, u64)> {
    // Need A <= floor(x * num / den) <= B.
    let a = i128::from(jitter) - i128::from(offset);
    let b = i128::from(size) - i128::from(crop) - i128::from(jitter) - i128::from(offset);
    if b < a || b < 0 {
        return None;
    }
    let (num, den) = (i128::from(num), i128::from(den));
    let lo = if a <= 0 { 0 } else { (a * den + num - 1) / num };
    let hi = ((b + 1) * den - 1) / num;
    if hi < lo {
        return None;
    }
    Some((
        u64::try_from(lo).ok()?,
        u64::try_from(hi.min(i128::from(u64::MAX - 1))).ok()?,
    ))
}

/// Sorted, disjoint `[start, end)` ranges of positions.
type Runs = Vec<(u64, u64)>;

/// For a dimension that follows a position: that position's index, the runs `[start, end)`
/// of positions at which the crop (spanning `span` elements) stays inside `[0, size)` whatever
/// the jitter, and the grid extent masks are fitted to. A periodic or padded dimension
/// (`free`) admits every position whose scaled index lies in the array; a table admits only
/// its entries.
fn position_runs(dim: &DimRt, size: u64, span: u64, free: bool) -> Option<(usize, Runs, u64)> {
    Some(match *dim {
        DimRt::Aligned {
            pos,
            offset,
            num,
            den,
            jitter,
        } => {
            if free {
                let extent = grid_extent(size, 0, num, den);
                (pos, vec![(0, extent)], extent)
            } else {
                let runs = aligned_interval(size, span, offset, num, den, jitter)
                    .map(|(l, h)| (l, h + 1))
                    .into_iter()
                    .collect();
                (pos, runs, grid_extent(size, offset, num, den))
            }
        }
        DimRt::Lookup {
            pos,
            ref table,
            offset,
            jitter,
        } => {
            let (size, span, jitter) = (i128::from(size), i128::from(span), i128::from(jitter));
            let fits = |t: i64| {
                let o = i128::from(t) + i128::from(offset);
                t >= 0 && (free || (o - jitter >= 0 && o + jitter + span <= size))
            };
            (pos, table_runs(table, fits), table.len() as u64)
        }
        DimRt::Fixed(_) => return None,
    })
}

/// The runs `[start, end)` of indices of `table` whose entries `fits` admits.
fn table_runs(table: &[i64], fits: impl Fn(i64) -> bool) -> Runs {
    let mut runs = Runs::new();
    for (p, &t) in table.iter().enumerate() {
        if !fits(t) {
            continue;
        }
        let p = p as u64;
        match runs.last_mut() {
            Some(r) if r.1 == p => r.1 = p + 1,
            _ => runs.push((p, p + 1)),
        }
    }
    runs
}

/// Positions `p >= 0` at which an aligned dimension starts inside an array of `size`:
/// `floor(p * num / den) + offset < size`.
fn grid_extent(size: u64, offset: i64, num: u64, den: u64) -> u64 {
    let room = i128::from(size) - i128::from(offset);
    if room <= 0 || num == 0 {
        return 0;
    }
    let g = (room * i128::from(den) + i128::from(num) - 1) / i128::from(num);
    u64::try_from(g).unwrap_or(u64::MAX)
}

impl Sampler {
    /// Validates `spec`, opens coordinate arrays, computes the valid position region and
    /// compiles the transforms.
    pub fn new(spec: SampleSpec) -> Result<Sampler> {
        let npos = spec.positions.len();
        if npos == 0 {
            return Err(spec_err("at least one position dimension is needed"));
        }
        if spec.positions.iter().collect::<HashSet<_>>().len() != npos {
            return Err(spec_err(format!(
                "position dimensions {:?} are not distinct",
                spec.positions
            )));
        }
        if spec.sources.is_empty() {
            return Err(spec_err("at least one source is needed"));
        }
        if spec.batch_size == 0 {
            return Err(spec_err("the batch size must be at least 1"));
        }
        let mut names = HashSet::new();
        let mut lo = vec![0u64; npos];
        let mut end = vec![u64::MAX; npos];
        let mut constrained = vec![false; npos];
        let mut grid: Vec<Option<u64>> = vec![None; npos];
        let mut masks = spec.masks.clone();
        let mut sources = Vec::with_capacity(spec.sources.len());
        for src in &spec.sources {
            if !names.insert(src.name.clone()) {
                return Err(spec_err(format!("two sources are named {:?}", src.name)));
            }
            let mut rt = compile_source(src, &spec.positions)?;
            rt.info.batch_bytes =
                rt.info
                    .crop_bytes
                    .checked_mul(spec.batch_size)
                    .ok_or_else(|| {
                        spec_err(format!("a batch of source {:?} is too large", src.name))
                    })?;
            let shape = src.array.shape();
            for (d, dim) in rt.dims.iter().enumerate() {
                let span = (src.crop[d] - 1) * rt.info.every[d] + 1;
                let Some((pos, runs, extent)) =
                    position_runs(dim, shape[d], span, rt.wrap == Some(d) || rt.pad[d])
                else {
                    continue;
                };
                let (Some(first), Some(last)) = (runs.first(), runs.last()) else {
                    let (size, crop) = (shape[d], src.crop[d]);
                    let reason = match *dim {
                        DimRt::Aligned {
                            offset,
                            num,
                            den,
                            jitter,
                            ..
                        } => format!(
                            "source {:?} dimension {d} (size {size}, crop {crop}, offset {offset}, scale {num}/{den}, jitter {jitter}) admits no position",
                            src.name
                        ),
                        _ => format!(
                            "source {:?} dimension {d} (size {size}, crop {crop}) aligns with no position of {:?}: every position's origin is missing or puts the crop outside the array",
                            src.name, spec.positions[pos]
                        ),
                    };
                    return Err(SamplerError::EmptyRegion { reason });
                };
                lo[pos] = lo[pos].max(first.0);
                end[pos] = end[pos].min(last.1);
                constrained[pos] = true;
                grid[pos].get_or_insert(extent);
                if runs.len() > 1 {
                    masks.push(Mask::along_one(npos, pos, &runs)?);
                }
                if let Some(pos) = rt.dims[d].position()
                    && lo[pos] >= end[pos]
                {
                    return Err(SamplerError::EmptyRegion {
                        reason: format!(
                            "source {:?} dimension {d} (size {}, crop {}) leaves no position along {:?}: with the sources before it, origins fit only at positions {}..{}",
                            src.name, shape[d], src.crop[d], spec.positions[pos], lo[pos], end[pos]
                        ),
                    });
                }
            }
            sources.push(rt);
        }
        if let Some((start, region_end)) = &spec.region {
            if start.len() != npos || region_end.len() != npos {
                return Err(spec_err(format!(
                    "the region has {} / {} numbers for {npos} position dimensions",
                    start.len(),
                    region_end.len()
                )));
            }
            for d in 0..npos {
                lo[d] = lo[d].max(start[d]);
                end[d] = end[d].min(region_end[d]);
                constrained[d] = true;
                grid[d].get_or_insert(region_end[d]);
            }
        }
        if let Some(d) = constrained.iter().position(|c| !c) {
            return Err(spec_err(format!(
                "position dimension {:?} is followed by no source and bounded by no region",
                spec.positions[d]
            )));
        }
        let stride = match &spec.mode {
            Mode::Uniform => vec![1; npos],
            Mode::Epoch { stride } => {
                if stride.len() != npos {
                    return Err(spec_err(format!(
                        "the epoch stride has {} numbers for {npos} position dimensions",
                        stride.len()
                    )));
                }
                stride.clone()
            }
        };
        if spec.weights.is_some() && matches!(spec.mode, Mode::Epoch { .. }) {
            return Err(spec_err(
                "weights apply to uniform sampling; epoch mode visits every allowed position \
                 once (use a mask to exclude positions)",
            ));
        }
        let grid: Vec<u64> = grid.into_iter().map(|g| g.unwrap_or(0)).collect();
        let fields = Fields::resolve(&masks, spec.weights.as_ref(), &grid)?;
        let space = PositionSpace::new(lo, end, stride, fields)?;
        Ok(Sampler {
            inner: Arc::new(Inner {
                positions: spec.positions,
                sources,
                grid,
                space,
                mode: spec.mode,
                seed: spec.seed,
                batch_size: spec.batch_size,
                perm: PerProcess::new(),
            }),
        })
    }

    /// The sources, in spec order.
    pub fn sources(&self) -> Vec<SourceInfo> {
        self.inner.sources.iter().map(|s| s.info.clone()).collect()
    }

    /// Source `i`.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn source(&self, i: usize) -> &SourceInfo {
        &self.inner.sources[i].info
    }

    /// Number of sources.
    pub fn num_sources(&self) -> usize {
        self.inner.sources.len()
    }

    /// The position dimensions' names.
    pub fn positions(&self) -> &[String] {
        &self.inner.positions
    }

    /// The valid position box: start (inclusive) and end (exclusive) per position dimension.
    pub fn position_box(&self) -> (Vec<u64>, Vec<u64>) {
        let (s, e) = self.inner.space.bounds();
        (s.to_vec(), e.to_vec())
    }

    /// The position grid that masks and weights with [`Cells::Fit`](crate::Cells::Fit) cells
    /// are fitted to: per position dimension, the positions at which the first source that
    /// follows it starts inside its array (`ceil((size - offset) * den / num)`: the array's
    /// size for one that follows one to one), or the region's end where no source follows it.
    pub fn position_grid(&self) -> &[u64] {
        &self.inner.grid
    }

    /// Whether `pos` is a position this sampler may draw: inside the valid box, on the
    /// lattice, allowed by every mask and of positive weight.
    pub fn allows(&self, pos: &[u64]) -> bool {
        self.inner.space.allows(pos)
    }

    /// Number of disjoint boxes the allowed positions are stored as (memory and lookup cost
    /// grow with it, not with the number of positions).
    pub fn position_blocks(&self) -> usize {
        self.inner.space.blocks()
    }

    /// Heap bytes the position space holds: its blocks and lookup tables, and the runs and
    /// weights of the masks and weights it was built from.
    pub fn position_bytes(&self) -> usize {
        self.inner.space.heap_bytes()
    }

    /// Number of allowed positions (of positive weight, with weights): the epoch length in
    /// epoch mode.
    pub fn epoch_len(&self) -> u64 {
        self.inner.space.drawable()
    }

    /// Samples per batch on each rank.
    pub fn batch_size(&self) -> usize {
        self.inner.batch_size
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.inner.seed
    }

    /// The sampling mode.
    pub fn mode(&self) -> &Mode {
        &self.inner.mode
    }

    fn permutation(&self, epoch: u64) -> Arc<Permutation> {
        let mut cache = self.inner.perm.get_or_init(|| Mutex::new(None)).lock();
        if let Some((e, p)) = &*cache
            && *e == epoch
        {
            return Arc::clone(p);
        }
        let p = Arc::new(Permutation::for_epoch(
            self.inner.space.len(),
            self.inner.seed,
            epoch,
        ));
        *cache = Some((epoch, Arc::clone(&p)));
        p
    }

    /// The batch of step `step` for `shard`: positions, origins and epochs of its samples. A
    /// pure function of the spec, the seed, `step` and `shard`.
    pub fn plan(&self, step: u64, shard: Shard) -> Result<BatchPlan> {
        if shard.world_size == 0 || shard.rank >= shard.world_size {
            return Err(spec_err(format!(
                "rank {} of world size {} is not a valid shard",
                shard.rank, shard.world_size
            )));
        }
        let inner = &*self.inner;
        let per_rank = inner.batch_size as u64;
        let overflow = || spec_err(format!("step {step} overflows the 64-bit sample index"));
        let first = step
            .checked_mul(per_rank * u64::from(shard.world_size))
            .and_then(|x| x.checked_add(per_rank * u64::from(shard.rank)))
            .and_then(|x| x.checked_add(per_rank))
            .ok_or_else(overflow)?
            - per_rank;
        let npos = inner.positions.len();
        let mut positions = vec![0u64; inner.batch_size * npos];
        let mut origins: Vec<Vec<i64>> = inner
            .sources
            .iter()
            .map(|s| Vec::with_capacity(inner.batch_size * s.dims.len()))
            .collect();
        let mut epochs = match inner.mode {
            Mode::Epoch { .. } => Some(Vec::with_capacity(inner.batch_size)),
            Mode::Uniform => None,
        };
        let mut perm: Option<(u64, Arc<Permutation>)> = None;
        for (i, pos) in positions.chunks_exact_mut(npos).enumerate() {
            let global = first + i as u64;
            let mut rng = SampleRng::new(inner.seed, global);
            let epoch = self.draw_position(global, &mut rng, &mut perm, pos);
            if let (Some(epochs), Some(e)) = (&mut epochs, epoch) {
                epochs.push(e);
            }
            for (s, out) in inner.sources.iter().zip(&mut origins) {
                for (d, dim) in s.dims.iter().enumerate() {
                    let o = match *dim {
                        DimRt::Fixed(o) => o as i64,
                        DimRt::Aligned {
                            pos: p,
                            offset,
                            num,
                            den,
                            jitter,
                        } => {
                            let scaled = u128::from(pos[p]) * u128::from(num) / u128::from(den);
                            let j = rng.jitter(jitter);
                            let o = scaled as i128 + i128::from(offset) + i128::from(j);
                            if s.wrap == Some(d) {
                                o.rem_euclid(i128::from(s.array.shape()[d])) as i64
                            } else {
                                // The valid region guarantees 0 <= o <= size - crop unless the
                                // dimension is padded.
                                o as i64
                            }
                        }
                        DimRt::Lookup {
                            pos: p,
                            ref table,
                            offset,
                            jitter,
                        } => {
                            let j = rng.jitter(jitter);
                            // Only positions whose entry fits are drawn (`position_runs`).
                            let o = i128::from(table[pos[p] as usize])
                                + i128::from(offset)
                                + i128::from(j);
                            if s.wrap == Some(d) {
                                o.rem_euclid(i128::from(s.array.shape()[d])) as i64
                            } else {
                                o as i64
                            }
                        }
                    };
                    out.push(o);
                }
            }
        }
        Ok(BatchPlan {
            sampler: self.clone(),
            step,
            shard,
            first,
            positions,
            origins,
            epochs,
        })
    }

    /// Writes the position of global sample `global` to `pos` (drawing from `rng`, the
    /// sample's stream); returns its epoch in epoch mode. `perm` caches the last permutation.
    fn draw_position(
        &self,
        global: u64,
        rng: &mut SampleRng,
        perm: &mut Option<EpochPermutation>,
        pos: &mut [u64],
    ) -> Option<u64> {
        let space = &self.inner.space;
        match self.inner.mode {
            Mode::Uniform => {
                space.draw(rng, pos);
                None
            }
            Mode::Epoch { .. } => {
                let len = space.len();
                let epoch = global / len;
                let p = match perm {
                    Some((e, p)) if *e == epoch => Arc::clone(p),
                    _ => {
                        let p = self.permutation(epoch);
                        *perm = Some((epoch, Arc::clone(&p)));
                        p
                    }
                };
                space.nth(p.apply(global % len), pos);
                Some(epoch)
            }
        }
    }

    /// The positions of global samples `first .. first + n`, `n * ndim` numbers in sample
    /// order: the sampler alone, without origins or reads (as [`Sampler::plan`] draws them),
    /// drawn in parallel parts.
    pub fn sample_positions(&self, first: u64, n: u64) -> Result<Vec<u64>> {
        use rayon::prelude::*;
        const PART: usize = 1 << 14;
        let npos = self.inner.positions.len();
        let total = usize::try_from(n)
            .ok()
            .and_then(|n| n.checked_mul(npos))
            .filter(|_| first.checked_add(n).is_some())
            .ok_or_else(|| spec_err(format!("{n} samples from {first} is too many")))?;
        let mut out = vec![0u64; total];
        // Draws are independent (each a function of the seed and its global index): parts of
        // the range run in parallel, each with its own permutation cache.
        crate::error::parallel(|| {
            out.par_chunks_mut(PART * npos)
                .enumerate()
                .for_each(|(part, block)| {
                    let mut perm = None;
                    for (i, pos) in block.chunks_exact_mut(npos).enumerate() {
                        let global = first + (part * PART + i) as u64;
                        let mut rng = SampleRng::new(self.inner.seed, global);
                        self.draw_position(global, &mut rng, &mut perm, pos);
                    }
                });
        })?;
        Ok(out)
    }

    /// Reads source `source` of `plan` into `out` (exactly [`SourceInfo::batch_bytes`]),
    /// through zarr-front with the source's transform fused into the stitch. `cancel` stops the
    /// read early when set.
    pub fn read_into(
        &self,
        plan: &BatchPlan,
        source: usize,
        out: &mut [u8],
        cancel: Option<&AtomicBool>,
    ) -> Result<ReadStats> {
        let s = &self.inner.sources[source];
        let options = ReadOptions {
            transform: s.fused.as_ref().map(|f| f as &dyn StitchTransform),
            cancel,
        };
        let nd = s.info.crop.len();
        let (origins, clipped) = read_origins(s, &plan.origins[source]);
        let size = s.array.shape();
        let wraps = |axis: usize| {
            origins
                .chunks_exact(nd)
                .any(|o| o[axis] + s.info.crop[axis] > size[axis])
        };
        let read_err = |error| SamplerError::Read {
            step: plan.step,
            source_index: source,
            source_name: s.info.name.to_string(),
            error,
        };
        let stats = if let Some(axis) = s.wrap.filter(|&a| wraps(a)) {
            read_wrapped(s, axis, &origins, out, cancel).map_err(|e| match e {
                SamplerError::Read { error, .. } => read_err(error),
                other => other,
            })?
        } else {
            let es = s.info.element_size;
            read_crops(
                &s.array,
                &s.info.crop,
                s.sub.as_ref(),
                es,
                &origins,
                out,
                options,
            )
            .map_err(read_err)?
        };
        let cb = s.info.crop_bytes;
        for (i, clips) in clipped {
            let dest = &mut out[i * cb..(i + 1) * cb];
            crate::pad::place_inside(dest, &s.info.crop, s.info.element_size, &clips, &s.fill);
        }
        Ok(stats)
    }

    /// Reads every source of `plan` into new (unpinned) buffers, one per source.
    pub fn read(&self, plan: &BatchPlan) -> Result<Vec<Vec<u8>>> {
        (0..self.num_sources())
            .map(|s| {
                let mut out = vec![0u8; self.inner.sources[s].info.batch_bytes];
                self.read_into(plan, s, &mut out, None)?;
                Ok(out)
            })
            .collect()
    }

    /// The zarr-front array of source `i`.
    ///
    /// # Panics
    /// If `i` is out of range.
    pub fn array(&self, i: usize) -> &Array {
        &self.inner.sources[i].array
    }
}

/// The origins at which `s` reads the crops at `origins`, and the crops that pass the ends of
/// padded dimensions (by index, with how each dimension is placed afterwards).
fn read_origins(s: &SourceRt, origins: &[i64]) -> (Vec<u64>, Vec<(usize, Vec<Clip>)>) {
    let nd = s.info.crop.len();
    let size = s.array.shape();
    let mut read = Vec::with_capacity(origins.len());
    let mut clipped = Vec::new();
    for (i, o) in origins.chunks_exact(nd).enumerate() {
        let mut clips: Option<Vec<Clip>> = None;
        for d in 0..nd {
            let (n, k) = (s.info.crop[d], s.info.every[d]);
            let clip = s.pad[d].then(|| Clip::of(o[d], n, k, size[d])).flatten();
            if let Some(c) = clip {
                let all = clips
                    .get_or_insert_with(|| (0..nd).map(|a| Clip::inside(s.info.crop[a])).collect());
                all[d] = c;
            }
            // Every origin of an unpadded dimension, or of a crop that stays inside, is >= 0.
            read.push(clip.map_or(o[d] as u64, |c| c.read_origin));
        }
        if let Some(c) = clips {
            clipped.push((i, c));
        }
    }
    (read, clipped)
}

/// Reads crops of `crop` at `origins` into `out` (one crop after another), through `sub`
/// where the crops take every `k`-th or picked elements along some dimensions: those are read
/// as contiguous sub-crops, then placed (straight into `out` when they are consecutive blocks
/// of each crop).
fn read_crops(
    array: &Array,
    crop: &[u64],
    sub: Option<&SubCrops>,
    es: usize,
    origins: &[u64],
    out: &mut [u8],
    options: ReadOptions<'_>,
) -> zcrop_zarr::Result<ReadStats> {
    let Some(sub) = sub else {
        return array.read_batch_into_with(origins, crop, out, options);
    };
    let nd = sub.shape.len();
    let mut expanded = Vec::with_capacity(origins.len() * sub.count());
    for o in origins.chunks_exact(nd) {
        for delta in sub.deltas.chunks_exact(nd) {
            expanded.extend(o.iter().zip(delta).map(|(a, b)| a + b));
        }
    }
    if sub.contiguous {
        return array.read_batch_into_with(&expanded, &sub.shape, out, options);
    }
    let mut scratch = vec![0u8; out.len()];
    let stats = array.read_batch_into_with(&expanded, &sub.shape, &mut scratch, options)?;
    let crop_bytes = crop.iter().product::<u64>() as usize * es;
    let sub_bytes = sub.shape.iter().product::<u64>() as usize * es;
    for (i, block) in scratch.chunks_exact(sub_bytes).enumerate() {
        let (sample, j) = (i / sub.count(), i % sub.count());
        let at = &sub.index[j * nd..(j + 1) * nd];
        let dest = &mut out[sample * crop_bytes..(sample + 1) * crop_bytes];
        place(block, &sub.shape, at, crop, es, dest);
    }
    Ok(stats)
}

/// Copies `block` (a C-order block of `shape`) into `dest` (one crop of `crop`) at the
/// multi-index `at`.
fn place(block: &[u8], shape: &[u64], at: &[u64], crop: &[u64], es: usize, dest: &mut [u8]) {
    let nd = shape.len();
    let mut strides = vec![es; nd];
    for d in (0..nd - 1).rev() {
        strides[d] = strides[d + 1] * crop[d + 1] as usize;
    }
    let offset = |idx: &[u64]| -> usize {
        idx.iter()
            .zip(&strides)
            .map(|(&x, &st)| x as usize * st)
            .sum()
    };
    let base = offset(at);
    let run = shape[nd - 1] as usize * es;
    let mut idx = vec![0u64; nd - 1];
    for (r, src) in block.chunks_exact(run).enumerate() {
        crate::space::unravel(r as u64, &shape[..nd - 1], &mut idx);
        let to = base + offset(&idx);
        dest[to..to + run].copy_from_slice(src);
    }
}

/// Reads the crops of a source that is periodic along `axis` (longitude): a crop passing the
/// array's end continues at 0. Crops that wrap are grouped by where they split, and each
/// group reads its two pieces as batches of their own, which are then placed.
fn read_wrapped(
    s: &SourceRt,
    axis: usize,
    origins: &[u64],
    out: &mut [u8],
    cancel: Option<&AtomicBool>,
) -> Result<ReadStats> {
    let crop = &s.info.crop;
    let nd = crop.len();
    let size = s.array.shape()[axis];
    let es = s.info.element_size;
    let mut groups = std::collections::BTreeMap::<u64, Vec<usize>>::new();
    for (i, o) in origins.chunks_exact(nd).enumerate() {
        groups
            .entry(crop[axis].min(size - o[axis]))
            .or_default()
            .push(i);
    }
    let mut stats = ReadStats::default();
    for (&width, samples) in &groups {
        for (start_at, len, at) in [(None, width, 0), (Some(0), crop[axis] - width, width)] {
            if len == 0 {
                continue;
            }
            let mut piece = crop.clone();
            piece[axis] = len;
            let mut piece_origins = Vec::with_capacity(samples.len() * nd);
            for &i in samples {
                let mut o = origins[i * nd..(i + 1) * nd].to_vec();
                if let Some(z) = start_at {
                    o[axis] = z;
                }
                piece_origins.extend_from_slice(&o);
            }
            let sub = SubCrops::new(&piece, &s.offsets);
            let shape = sub.as_ref().map_or(&piece, |x| &x.shape);
            let fused = Fused::new(&s.transform, &s.array.data_type(), shape)?;
            let options = ReadOptions {
                transform: fused.as_ref().map(|f| f as &dyn StitchTransform),
                cancel,
            };
            let piece_bytes = piece.iter().product::<u64>() as usize * es;
            let mut scratch = vec![0u8; samples.len() * piece_bytes];
            stats += read_crops(
                &s.array,
                &piece,
                sub.as_ref(),
                es,
                &piece_origins,
                &mut scratch,
                options,
            )
            .map_err(|error| SamplerError::Read {
                step: 0,
                source_index: 0,
                source_name: s.info.name.to_string(),
                error,
            })?;
            let mut from = vec![0u64; nd];
            from[axis] = at;
            for (block, &i) in scratch.chunks_exact(piece_bytes).zip(samples) {
                let dest = &mut out[i * s.info.crop_bytes..(i + 1) * s.info.crop_bytes];
                place(block, &piece, &from, crop, es, dest);
            }
        }
    }
    Ok(stats)
}

fn compile_source(src: &Source, positions: &[String]) -> Result<SourceRt> {
    let err = |reason: String| spec_err(format!("source {:?}: {reason}", src.name));
    let a = &src.array;
    let shape = a.shape();
    let nd = shape.len();
    if src.crop.len() != nd {
        return Err(err(format!(
            "the crop {:?} has {} dimensions, the array {nd}",
            src.crop,
            src.crop.len()
        )));
    }
    if let Some(d) = (0..nd).find(|&d| src.crop[d] == 0 || src.crop[d] > shape[d]) {
        return Err(err(format!(
            "crop {:?} does not fit array shape {shape:?} along dimension {d}",
            src.crop
        )));
    }
    let dims: Vec<Dim> = match &src.dims {
        Some(d) => d.clone(),
        None => default_dims(a, positions).ok_or_else(|| {
            err(format!(
                "the array has {nd} dimensions and no names matching positions {positions:?}; give Source::dims"
            ))
        })?,
    };
    if dims.len() != nd {
        return Err(err(format!("{} dims given for a {nd}-d array", dims.len())));
    }
    let every: Vec<u64> = dims.iter().map(|d| d.every).collect();
    if let Some(d) = every.iter().position(|&k| k == 0) {
        return Err(err(format!("dimension {d} takes every 0th element")));
    }
    let spans: Vec<u64> = (0..nd)
        .map(|d| {
            (src.crop[d] - 1)
                .checked_mul(every[d])
                .and_then(|x| x.checked_add(1))
                .filter(|&x| x <= shape[d])
                .ok_or_else(|| {
                    err(format!(
                        "a crop of {} taking every {}th element spans more than dimension {d} (size {})",
                        src.crop[d], every[d], shape[d]
                    ))
                })
        })
        .collect::<Result<_>>()?;
    let mut rt = Vec::with_capacity(nd);
    for (d, dim) in dims.iter().enumerate() {
        match &dim.position {
            None => {
                if dim.num != 1 || dim.den != 1 || dim.jitter != 0 || dim.offset < 0 {
                    return Err(err(format!(
                        "fixed dimension {d} cannot have a scale, jitter or negative origin"
                    )));
                }
                let o = dim.offset as u64;
                if o + spans[d] > shape[d] {
                    return Err(err(format!(
                        "fixed origin {o} + crop {} passes the end of dimension {d} (size {})",
                        src.crop[d], shape[d]
                    )));
                }
                rt.push(DimRt::Fixed(o));
            }
            Some(p) => {
                let pos = positions.iter().position(|q| q == p).ok_or_else(|| {
                    err(format!(
                        "dimension {d} follows unknown position {p:?} (the positions: {})",
                        positions.join(", ")
                    ))
                })?;
                if dim.num == 0 || dim.den == 0 {
                    return Err(err(format!(
                        "dimension {d} has a zero scale {}/{}",
                        dim.num, dim.den
                    )));
                }
                rt.push(match &dim.table {
                    Some(table) => {
                        if (dim.num, dim.den) != (1, 1) {
                            return Err(err(format!(
                                "dimension {d} follows a table; it takes no scale"
                            )));
                        }
                        DimRt::Lookup {
                            pos,
                            table: Arc::clone(table),
                            offset: dim.offset,
                            jitter: dim.jitter,
                        }
                    }
                    None => DimRt::Aligned {
                        pos,
                        offset: dim.offset,
                        num: dim.num,
                        den: dim.den,
                        jitter: dim.jitter,
                    },
                });
            }
        }
    }
    let mut offsets: Vec<Option<Vec<u64>>> = (0..nd)
        .map(|d| {
            (every[d] > 1 && src.crop[d] > 1)
                .then(|| (0..src.crop[d]).map(|j| j * every[d]).collect())
        })
        .collect();
    for (d, dim) in dims.iter().enumerate() {
        let Some(picks) = &dim.picks else { continue };
        if dim.position.is_some() || dim.offset != 0 || dim.every != 1 {
            return Err(err(format!(
                "dimension {d} picks indices; it cannot also follow a position, start elsewhere or step"
            )));
        }
        if picks.len() as u64 != src.crop[d] {
            return Err(err(format!(
                "dimension {d} picks {} indices for a crop of {}",
                picks.len(),
                src.crop[d]
            )));
        }
        if let Some(&i) = picks.iter().find(|&&i| i >= shape[d]) {
            return Err(err(format!(
                "dimension {d} picks index {i}, past its size {}",
                shape[d]
            )));
        }
        offsets[d] = Some(picks.to_vec());
    }
    let wrapped: Vec<usize> = (0..nd).filter(|&d| dims[d].wrap).collect();
    if wrapped.len() > 1 {
        return Err(err(format!(
            "dimensions {wrapped:?} are periodic; one periodic dimension per source is supported"
        )));
    }
    let wrap = wrapped.first().copied();
    if let Some(d) = wrap {
        if dims[d].position.is_none() || offsets[d].is_some() {
            return Err(err(format!(
                "dimension {d} is periodic; it must follow a position and take a contiguous crop"
            )));
        }
        if src.transform.axes().contains(&d) {
            return Err(err(format!(
                "dimension {d} is periodic, and the transform's normalize or fft runs along it"
            )));
        }
    }
    let mut pad = vec![false; nd];
    for &d in &src.pad {
        let why = if d >= nd {
            Some(format!("the array has {nd} dimensions"))
        } else if dims[d].position.is_none() {
            Some("it follows no position".to_string())
        } else if wrap == Some(d) {
            Some("it is periodic".to_string())
        } else if spans[d] + every[d] - 1 > shape[d] {
            Some(format!(
                "a crop of {} taking every {}th element needs {} elements of it to be placed, \
                 and it has {}",
                src.crop[d],
                every[d],
                spans[d] + every[d] - 1,
                shape[d]
            ))
        } else if src.transform.fft.is_some() {
            Some("the transform has an FFT, which padded values would enter".to_string())
        } else if src.transform.axes().contains(&d) {
            Some("the transform's normalize runs along it".to_string())
        } else {
            None
        };
        if let Some(why) = why {
            return Err(err(format!("dimension {d} cannot be padded: {why}")));
        }
        pad[d] = true;
    }
    let sub = SubCrops::new(&src.crop, &offsets);
    if let Some(sub) = &sub {
        let stepped = |axis: usize| sub.shape[axis] != src.crop[axis];
        if let Some(axis) = src
            .transform
            .axes()
            .into_iter()
            .find(|&a| a < nd && stepped(a))
        {
            return Err(err(format!(
                "dimension {axis} takes every {}th element or picked indices, and the \
                 transform's normalize or fft runs along it: apply it to a contiguous dimension",
                every[axis]
            )));
        }
    }
    let read_shape = sub.as_ref().map_or(&src.crop, |s| &s.shape);
    let fused = Fused::new(&src.transform, &a.data_type(), read_shape).map_err(|e| match e {
        SamplerError::Spec { reason } => err(reason),
        other => other,
    })?;
    let (dtype, element_size) = match &fused {
        Some(f) => (f.output_dtype().to_string(), f.output_element_size()),
        None => (a.data_type(), a.element_size()),
    };
    let float = matches!(
        dtype.as_str(),
        "float16" | "bfloat16" | "float32" | "float64" | "complex64" | "complex128"
    );
    let fill = match src.fill {
        Some(v) => crate::pad::element_bytes(&dtype, v).map_err(err)?,
        None if float => crate::pad::element_bytes(&dtype, f64::NAN).map_err(err)?,
        None => a.fill_value_bytes().to_vec(),
    };
    if fill.len() != element_size {
        return Err(err(format!(
            "the fill value has {} bytes, an element {element_size}",
            fill.len()
        )));
    }
    let crop_bytes = src
        .crop
        .iter()
        .try_fold(element_size as u64, |acc, &c| acc.checked_mul(c))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| err("the crop is too large".into()))?;
    let coords = match &src.coordinates {
        Coordinates::Off => Vec::new(),
        Coordinates::Discover => coords::discover(a)?,
        Coordinates::Given(list) => list
            .iter()
            .map(|(axis, name, c)| {
                if *axis >= nd {
                    return Err(err(format!(
                        "coordinate {name:?} for axis {axis} of a {nd}-d array"
                    )));
                }
                Coord::load(a, *axis, name, c)
            })
            .collect::<Result<_>>()?,
    };
    Ok(SourceRt {
        info: SourceInfo {
            name: Arc::from(src.name.as_str()),
            array: Arc::from(a.uri()),
            crop: src.crop.clone(),
            dtype,
            element_size,
            crop_bytes,
            batch_bytes: 0,
            origins: rt
                .iter()
                .map(|d| match *d {
                    DimRt::Aligned {
                        pos,
                        offset,
                        num,
                        den,
                        jitter,
                    } => OriginRule::Aligned {
                        position: pos,
                        offset,
                        num,
                        den,
                        jitter,
                    },
                    DimRt::Lookup {
                        pos,
                        ref table,
                        offset,
                        jitter,
                    } => OriginRule::Lookup {
                        position: pos,
                        table: Arc::clone(table),
                        offset,
                        jitter,
                    },
                    DimRt::Fixed(o) => OriginRule::Fixed(o),
                })
                .collect(),
            every,
            picks: dims.iter().map(|d| d.picks.clone()).collect(),
            wrap,
            pad: pad.clone(),
        },
        array: a.clone(),
        dims: rt,
        fused,
        coords,
        sub,
        offsets,
        transform: src.transform.clone(),
        wrap,
        pad,
        fill,
    })
}

fn default_dims(a: &Array, positions: &[String]) -> Option<Vec<Dim>> {
    if let Some(names) = coords::dimension_names(a) {
        let dims: Vec<Dim> = names
            .iter()
            .map(|n| match n {
                Some(n) if positions.contains(n) => Dim::along(n.clone()),
                _ => Dim::fixed(0),
            })
            .collect();
        if dims.iter().any(|d| d.position.is_some()) {
            return Some(dims);
        }
    }
    (a.ndim() == positions.len()).then(|| positions.iter().map(Dim::along).collect())
}

/// The metadata of one sample: where every crop came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleMeta {
    /// The batch's step.
    pub step: u64,
    /// The sample's index in this rank's batch.
    pub index: usize,
    /// The sample's global index (`step * global_batch + rank * batch + index`).
    pub global_index: u64,
    /// The epoch it belongs to (epoch mode only).
    pub epoch: Option<u64>,
    /// The shared sample position.
    pub position: Vec<u64>,
    /// One entry per source, in spec order.
    pub sources: Vec<SourceSample>,
}

/// Where one source's crop of a sample came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSample {
    /// The source's name.
    pub source: Arc<str>,
    /// The array's directory.
    pub array: Arc<str>,
    /// The crop's origin in the array (negative, or past its end, where a padded crop passes
    /// an end).
    pub origin: Vec<i64>,
    /// The crop's shape.
    pub shape: Vec<u64>,
    /// Coordinate labels along the dimensions that have coordinate arrays.
    pub coords: Vec<CoordLabel>,
}

/// The samples of one batch for one rank: flat arrays of positions and origins (what the read
/// needs), with the full metadata of each sample on demand.
#[derive(Clone)]
pub struct BatchPlan {
    sampler: Sampler,
    step: u64,
    shard: Shard,
    first: u64,
    positions: Vec<u64>,
    origins: Vec<Vec<i64>>,
    epochs: Option<Vec<u64>>,
}

impl std::fmt::Debug for BatchPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchPlan")
            .field("step", &self.step)
            .field("shard", &self.shard)
            .field("first", &self.first)
            .field("positions", &self.positions)
            .field("origins", &self.origins)
            .field("epochs", &self.epochs)
            .finish_non_exhaustive()
    }
}

impl PartialEq for BatchPlan {
    fn eq(&self, o: &Self) -> bool {
        Arc::ptr_eq(&self.sampler.inner, &o.sampler.inner)
            && (self.step, self.shard, self.first) == (o.step, o.shard, o.first)
            && self.positions == o.positions
            && self.origins == o.origins
            && self.epochs == o.epochs
    }
}

impl BatchPlan {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The shard.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.sampler.batch_size()
    }

    /// Whether the batch is empty (never: batch sizes are at least 1).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The global index of sample `i`.
    pub fn global_index(&self, i: usize) -> u64 {
        self.first + i as u64
    }

    /// The position of sample `i`.
    pub fn position(&self, i: usize) -> &[u64] {
        let n = self.sampler.positions().len();
        &self.positions[i * n..(i + 1) * n]
    }

    /// All positions, flattened (`len * num_positions`).
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// The crop origins of `source`, flattened (`len * ndim`): what `read_batch` takes, except
    /// along padded dimensions, where a crop may start before 0 or end past the array.
    pub fn origins(&self, source: usize) -> &[i64] {
        &self.origins[source]
    }

    /// The origin of sample `i` in `source`.
    pub fn origin(&self, source: usize, i: usize) -> &[i64] {
        let nd = self.sampler.inner.sources[source].dims.len();
        &self.origins[source][i * nd..(i + 1) * nd]
    }

    /// The epoch of sample `i` (epoch mode only).
    pub fn epoch(&self, i: usize) -> Option<u64> {
        self.epochs.as_ref().map(|e| e[i])
    }

    /// The full metadata of sample `i`, coordinate labels included.
    pub fn sample(&self, i: usize) -> SampleMeta {
        let sources = self
            .sampler
            .inner
            .sources
            .iter()
            .enumerate()
            .map(|(s, src)| {
                let origin = self.origin(s, i).to_vec();
                let coords = src
                    .coords
                    .iter()
                    .map(|c| {
                        let axis = c.axis();
                        if let Some(p) = &src.info.picks[axis] {
                            return c.label_of(p[0] as i64, p[p.len() - 1] as i64);
                        }
                        let span = (src.info.crop[axis] - 1) * src.info.every[axis] + 1;
                        let (first, span) = (origin[axis], span as i64);
                        if src.wrap == Some(axis) {
                            let size = src.array.shape()[axis] as i64;
                            return c.label_of(first, (first + span - 1) % size);
                        }
                        c.label_of(first, first + span - 1)
                    })
                    .collect();
                SourceSample {
                    source: Arc::clone(&src.info.name),
                    array: Arc::clone(&src.info.array),
                    origin,
                    shape: src.info.crop.clone(),
                    coords,
                }
            })
            .collect();
        SampleMeta {
            step: self.step,
            index: i,
            global_index: self.global_index(i),
            epoch: self.epoch(i),
            position: self.position(i).to_vec(),
            sources,
        }
    }

    /// The metadata of every sample.
    pub fn samples(&self) -> Vec<SampleMeta> {
        (0..self.len()).map(|i| self.sample(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::aligned_interval;

    /// The interval is exactly the set of positions whose crop stays inside the array for every
    /// jitter, checked by brute force.
    #[test]
    fn aligned_interval_matches_brute_force() {
        for size in [1u64, 5, 17] {
            for crop in 1..=size.min(6) {
                for offset in [-7i64, -1, 0, 2, 9] {
                    for (num, den) in [(1u64, 1u64), (3, 1), (1, 3), (2, 3)] {
                        for jitter in [0u64, 1, 3] {
                            let ok = |x: u64| {
                                let o = i128::from(offset) + i128::from(x * num / den);
                                o - i128::from(jitter) >= 0
                                    && o + i128::from(jitter) + i128::from(crop) <= i128::from(size)
                            };
                            let want: Vec<u64> = (0..200).filter(|&x| ok(x)).collect();
                            let got: Vec<u64> =
                                match aligned_interval(size, crop, offset, num, den, jitter) {
                                    None => vec![],
                                    Some((l, h)) => (l..=h.min(199)).collect(),
                                };
                            assert_eq!(
                                got, want,
                                "size {size} crop {crop} offset {offset} {num}/{den} jitter {jitter}"
                            );
                        }
                    }
                }
            }
        }
    }
}
