//! Reading blocks (as complex numbers, converted inside zarr-front's stitch) in reads split to
//! stay within the budget, and writing output and temporary chunks with zarrs.

use std::path::Path;
use std::sync::Arc;

use rustfft::num_complex::Complex;
use zarrs::array::{ArrayBuilder, ArrayBytes, CodecOptions, DataType, FillValue};
use zarrs::storage::ReadableWritableStorageTraits;
use zcrop_zarr::{Array, OpenOptions, ReadOptions, StitchTransform, ZarrError};

use crate::transform::{InType, for_each_value};

use super::options::{ComplexType, FftError};
use super::place::{Place, Writes};
use super::plan::{Plan, WORK};

pub(crate) fn write_err(
    path: &Path,
    e: impl std::error::Error + Send + Sync + 'static,
) -> FftError {
    FftError::Write {
        path: path.to_path_buf(),
        source: Box::new(e),
    }
}

/// Converts any real or complex input to complex128 inside zarr-front's stitch.
pub(crate) struct ToComplex(pub(crate) InType);

impl StitchTransform for ToComplex {
    fn output_element_size(&self) -> usize {
        WORK
    }

    fn convert(&self, src: &[u8], dst: &mut [u8], _: u64, _: usize) {
        let mut out = dst.chunks_exact_mut(WORK);
        for_each_value(self.0, src, |re, im| {
            let o = out.next().expect("output matches input");
            o[..8].copy_from_slice(&re.to_ne_bytes());
            o[8..].copy_from_slice(&im.to_ne_bytes());
        });
    }
}

pub(crate) fn c_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

pub(crate) fn get(block: &[u8], i: usize) -> Complex<f64> {
    let b = &block[i * WORK..(i + 1) * WORK];
    Complex::new(
        f64::from_ne_bytes(b[..8].try_into().expect("8 bytes")),
        f64::from_ne_bytes(b[8..].try_into().expect("8 bytes")),
    )
}

pub(crate) fn put(block: &mut [u8], i: usize, v: Complex<f64>) {
    let b = &mut block[i * WORK..(i + 1) * WORK];
    b[..8].copy_from_slice(&v.re.to_ne_bytes());
    b[8..].copy_from_slice(&v.im.to_ne_bytes());
}

/// A strided view of a complex128 block: element `idx` is at `offset + sum(idx[d] * strides[d])`.
pub(crate) struct View<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) offset: usize,
    pub(crate) strides: Vec<usize>,
}

type Store = dyn ReadableWritableStorageTraits;

/// A zarrs array being written (to a local directory or an object store), with a reusable
/// staging buffer.
pub(crate) struct Writer {
    array: zarrs::array::Array<Store>,
    place: Place,
    writes: Arc<Writes>,
    es: usize,
    staging: Vec<u8>,
    pub(crate) written: u64,
    /// Chunks stored through the current store instance.
    since_reset: usize,
    options: CodecOptions,
}

/// zarrs' filesystem store keeps a lock entry for every key it ever wrote; a fresh store every
/// this many chunks keeps that map (and memory) small.
const STORE_RESET: usize = 256;

impl Writer {
    pub(crate) fn create(
        place: &Place,
        layout: Layout,
        in_flight: usize,
        dimension_names: Option<Vec<Option<String>>>,
        attributes: serde_json::Map<String, serde_json::Value>,
    ) -> Result<Writer, FftError> {
        let Layout { shape, chunks, ty } = layout;
        let path = &place.location();
        place.make_dir()?;
        let writes = Writes::new(in_flight);
        let store = place.store(&writes)?;
        let dt = DataType::from_metadata(&zarrs::metadata::v3::MetadataV3::new(ty.name()))
            .map_err(|e| write_err(path, e))?;
        let mut b = ArrayBuilder::new(shape, chunks, dt, FillValue::new(vec![0u8; ty.size()]));
        b.attributes(attributes);
        if let Some(names) = dimension_names {
            b.dimension_names(Some(names));
        }
        let array = b.build(store, "/").map_err(|e| write_err(path, e))?;
        array.store_metadata().map_err(|e| write_err(path, e))?;
        let w = Writer::with(array, place, writes, ty);
        // Others open the array next: its metadata must be there.
        w.finish()?;
        Ok(w)
    }

    /// Opens an array [`Writer::create`] made, to write more of its chunks, with at most
    /// `in_flight` bytes of writes to an object store in flight.
    pub(crate) fn open(
        place: &Place,
        ty: ComplexType,
        in_flight: usize,
    ) -> Result<Writer, FftError> {
        let writes = Writes::new(in_flight);
        let array = zarrs::array::Array::open(place.store(&writes)?, "/")
            .map_err(|e| write_err(&place.location(), e))?;
        Ok(Writer::with(array, place, writes, ty))
    }

    fn with(
        array: zarrs::array::Array<Store>,
        place: &Place,
        writes: Arc<Writes>,
        ty: ComplexType,
    ) -> Writer {
        Writer {
            array,
            place: place.clone(),
            writes,
            es: ty.size(),
            staging: Vec::new(),
            written: 0,
            since_reset: 0,
            options: CodecOptions::default().with_concurrent_target(1),
        }
    }

    /// Writes chunk `chunk`, whose C-order elements are indexed by `dims`, from `view`;
    /// elements with `idx[d] >= valid[d]` lie outside the array and are zero.
    pub(crate) fn store(
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
            self.array = zarrs::array::Array::new_with_metadata(
                self.place.store(&self.writes)?,
                "/",
                self.array.metadata().clone(),
            )
            .map_err(|e| write_err(&self.place.location(), e))?;
            self.since_reset = 0;
        }
        self.since_reset += 1;
        self.array
            .store_chunk_opt(
                chunk,
                ArrayBytes::new_flen(&self.staging[..]),
                &self.options,
            )
            .map_err(|e| write_err(&self.place.location(), e))?;
        self.written += self.staging.len() as u64;
        Ok(())
    }
}

impl Writer {
    /// Waits until every chunk written has reached the store (object stores write in the
    /// background); the first write that failed, if one did.
    pub(crate) fn finish(&self) -> Result<(), FftError> {
        self.writes
            .wait()
            .map_err(|e| write_err(&self.place.location(), e))
    }
}

/// An array's shape, chunk shape and element type.
pub(crate) struct Layout {
    pub(crate) shape: Vec<u64>,
    pub(crate) chunks: Vec<u64>,
    pub(crate) ty: ComplexType,
}

/// Bytes of chunk writes an FFT with `budget` bytes keeps in flight to an object store: as
/// much as its reads may have in flight, a share the budget's other half leaves room for
/// (`fft_memory.rs` checks the peak against the budget).
pub(crate) fn write_in_flight(budget: usize) -> usize {
    budget / 16
}

pub(crate) struct Ctx<'a> {
    pub(crate) input: &'a Array,
    pub(crate) to_complex: ToComplex,
    pub(crate) axis: usize,
    pub(crate) shape: Vec<u64>,
    pub(crate) plan: Plan,
    /// The normalisation factor, if not 1.
    pub(crate) scale: Option<f64>,
    /// The largest single read, in output bytes.
    pub(crate) max_read: usize,
}

impl Ctx<'_> {
    /// Valid tile extents at `origin` (per dimension; the axis entry is N).
    pub(crate) fn valid(&self, origin: &[u64]) -> Vec<u64> {
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

    /// Reads the input region `origin`/`shape` as complex128 into `out`; returns the bytes of
    /// input elements read.
    pub(crate) fn read_input(
        &self,
        origin: &[u64],
        shape: &[u64],
        out: &mut [u8],
    ) -> Result<u64, FftError> {
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
        })?;
        Ok(shape.iter().product::<u64>() * self.input.element_size() as u64)
    }

    /// Reads the temporary array region `origin`/`shape` into `out`.
    pub(crate) fn read_temp(
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

/// A temporary `(lines, rows, cols)` complex128 array: its writer and its reader.
pub(crate) fn temp_array(
    place: &Place,
    shape: [u64; 3],
    chunks: [u64; 3],
    open: &OpenOptions,
    in_flight: usize,
) -> Result<(Writer, Array), FftError> {
    let layout = Layout {
        shape: shape.to_vec(),
        chunks: chunks.to_vec(),
        ty: ComplexType::Complex128,
    };
    let w = Writer::create(place, layout, in_flight, None, serde_json::Map::new())?;
    Ok((w, open_temp(place, open)?))
}

/// Opens the temporary array at `place` for reading.
pub(crate) fn open_temp(place: &Place, open: &OpenOptions) -> Result<Array, FftError> {
    Array::open_with(place.location(), &place.open_options(open)).map_err(|error| FftError::Read {
        what: format!("temporary array {}", place.show()),
        error,
    })
}
