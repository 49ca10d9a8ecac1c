//! `NativeLoader` and `NativeBatch`: the sampler's loader behind `zcrop.Loader`.
//!
//! The Python side (`zcrop/_loader.py`) builds a plain dict spec; this module turns it into a
//! `Sampler` and a `Loader` and hands out batches. Waiting for a batch goes through the
//! blocking helper, so it releases the GIL and honours Ctrl-C; a batch that arrives after the
//! caller was interrupted is kept and returned by the next call, so no step is lost.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use numpy::{PyArray1, PyReadonlyArray1, PyReadonlyArrayDyn};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use zcrop::io::fork::{PerProcess, ProcessBound};
use zcrop::sampler::{
    Batch, Cells, CoordValue, DepthGauge, Dim, FftNorm, Loader, LoaderConfig, Mask, Mode,
    OriginRule, OutputType, PinOptions, PinState, SampleMeta, SampleSpec, Sampler, SamplerError,
    Shard, Source, Spectrum, Transform, Weights,
};

use crate::array::NativeArray;
use crate::batch::NativeBatch;
use crate::blocking::{self, Failure, Reply};
use crate::buffer::SourceView;

/// The loader and what the Python side may be owed.
struct State {
    loader: Loader,
    /// A batch (or its error) produced for a caller that was interrupted meanwhile.
    stash: Option<Result<Batch, SamplerError>>,
}

/// A running loader (the Rust side of `zcrop.Loader`).
///
/// In a child of `fork`, a loader started by the parent (its threads gone there) starts anew
/// on first use, at the step its consumer has reached: batches are pure functions of their
/// step, so the child goes on with exactly the batches the parent would have delivered.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct NativeLoader {
    state: ProcessBound<Arc<Mutex<State>>>,
    /// The loader that replaces `state` in a child of `fork`, and its depth.
    successor: PerProcess<(Arc<Mutex<State>>, DepthGauge)>,
    /// The step the consumer asks for next: after the last batch handed out, or a seek.
    consumer_step: Arc<AtomicU64>,
    sampler: Sampler,
    config: LoaderConfig,
    pin_state: PinState,
    buffer_bytes: usize,
    /// The depth the loader of `state` reads ahead.
    depth: DepthGauge,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The step the consumer gets next: a batch kept for an interrupted caller, else the loader's.
fn next_step(st: &State) -> u64 {
    match &st.stash {
        Some(Ok(b)) => b.step(),
        _ => st.loader.next_step(),
    }
}

impl NativeLoader {
    /// The loader's state in this process: its own, or in a child of `fork` a loader started
    /// there at the step the consumer has reached.
    fn state(&self, py: Python<'_>) -> PyResult<Arc<Mutex<State>>> {
        if self.state.is_current() {
            return Ok(Arc::clone(&self.state));
        }
        let state = self.successor.get_or_try_init(|| {
            let config = LoaderConfig {
                start_step: self.consumer_step.load(Ordering::Acquire),
                ..self.config.clone()
            };
            let sampler = self.sampler.clone();
            let loader = blocking::run(py, 0, move |_| {
                Ok::<_, Failure>(Loader::new(sampler, config)?)
            })?;
            let gauge = loader.depth_gauge();
            Ok::<_, PyErr>((
                Arc::new(Mutex::new(State {
                    loader,
                    stash: None,
                })),
                gauge,
            ))
        })?;
        Ok(Arc::clone(&state.0))
    }
}

fn item<'py, T>(spec: &Bound<'py, PyDict>, key: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
    for<'a> <T as FromPyObject<'a, 'py>>::Error: Into<PyErr>,
{
    match spec.get_item(key)? {
        Some(v) => v.extract::<T>().map_err(|e| {
            let e: PyErr = e.into();
            PyTypeError::new_err(format!("loader spec field {key:?}: {e}"))
        }),
        None => Err(PyValueError::new_err(format!(
            "loader spec has no field {key:?}"
        ))),
    }
}

fn parse_dim(d: &Bound<'_, PyAny>) -> PyResult<Dim> {
    let kind: String = d.get_item(0)?.extract()?;
    let every = |i: usize| -> PyResult<u64> {
        if d.len()? > i {
            d.get_item(i)?.extract()
        } else {
            Ok(1)
        }
    };
    let flag = |i: usize| -> PyResult<bool> {
        if d.len()? > i {
            d.get_item(i)?.extract()
        } else {
            Ok(false)
        }
    };
    match kind.as_str() {
        "fixed" => Ok(Dim::fixed(d.get_item(1)?.extract()?).every(every(2)?)),
        "pick" => Ok(Dim::pick(d.get_item(1)?.extract::<Vec<u64>>()?)),
        "along" => {
            let name: String = d.get_item(1)?.extract()?;
            let (num, den): (u64, u64) = (d.get_item(2)?.extract()?, d.get_item(3)?.extract()?);
            let (offset, jitter): (i64, u64) =
                (d.get_item(4)?.extract()?, d.get_item(5)?.extract()?);
            let dim = Dim::along(name)
                .scale(num, den)
                .offset(offset)
                .jitter(jitter)
                .every(every(6)?);
            Ok(if flag(7)? { dim.wrap() } else { dim })
        }
        "lookup" => {
            let name: String = d.get_item(1)?.extract()?;
            let table: PyReadonlyArray1<'_, i64> = d.get_item(2)?.extract()?;
            let table: Vec<i64> = table.as_slice()?.to_vec();
            let (offset, jitter): (i64, u64) =
                (d.get_item(3)?.extract()?, d.get_item(4)?.extract()?);
            let dim = Dim::lookup(name, table)
                .offset(offset)
                .jitter(jitter)
                .every(every(5)?);
            Ok(if flag(6)? { dim.wrap() } else { dim })
        }
        other => Err(PyValueError::new_err(format!("unknown dim kind {other:?}"))),
    }
}

fn parse_transform(s: &Bound<'_, PyDict>) -> PyResult<Transform> {
    let dtype: String = item(s, "dtype")?;
    let mut t = match dtype.as_str() {
        "native" => Transform::none(),
        "float32" => Transform::to_f32(),
        "float64" => Transform::to_f64(),
        "float16" => Transform::to(OutputType::Float16),
        "bfloat16" => Transform::to(OutputType::BFloat16),
        other => {
            return Err(PyValueError::new_err(format!(
                "dtype must be None, 'float32', 'float64', 'float16' or 'bfloat16', got {other:?}"
            )));
        }
    };
    let decode: Option<(f64, f64, Vec<f64>)> = item(s, "decode")?;
    if let Some((scale_factor, add_offset, fills)) = decode {
        t = t.decode(scale_factor, add_offset, fills);
    }
    let normalize: Option<(usize, Vec<f64>, Vec<f64>)> = item(s, "normalize")?;
    if let Some((axis, mean, std)) = normalize {
        t = t.normalize(axis, mean, std);
    }
    let fft: Option<(Vec<usize>, String, String)> = item(s, "fft")?;
    if let Some((axes, output, norm)) = fft {
        let output = match output.as_str() {
            "complex" => Spectrum::Complex,
            "power" => Spectrum::Power,
            o => return Err(PyValueError::new_err(format!("fft output {o:?}"))),
        };
        let norm = match norm.as_str() {
            "backward" => FftNorm::Backward,
            "ortho" => FftNorm::Ortho,
            "forward" => FftNorm::Forward,
            n => return Err(PyValueError::new_err(format!("fft norm {n:?}"))),
        };
        t = t.fft(axes, output).fft_norm(norm);
    }
    Ok(t)
}

fn parse_source(s: &Bound<'_, PyDict>) -> PyResult<Source> {
    let name: String = item(s, "name")?;
    let crop: Vec<u64> = item(s, "crop")?;
    let array = s
        .get_item("array")?
        .ok_or_else(|| PyValueError::new_err("a source needs an array"))?;
    let source = if let Ok(native) = array.cast::<NativeArray>() {
        Source::new(name, native.get().inner.clone(), crop)
    } else {
        let path: PathBuf = array.extract()?;
        let storage_options: Option<Vec<(String, String)>> = item(s, "storage_options")?;
        let options = crate::group::open_options(storage_options, None);
        // Opening reads metadata (GETs from an object store): without the GIL.
        let py = array.py();
        py.detach(|| Source::open_with(name, path, crop, &options))
            .map_err(|e| blocking::sampler_err(py, &e))?
    };
    let dims: Option<Vec<Bound<'_, PyAny>>> = item(s, "dims")?;
    let mut source = match dims {
        Some(dims) => source.dims(dims.iter().map(parse_dim).collect::<PyResult<Vec<_>>>()?),
        None => source,
    };
    source = source.transform(parse_transform(s)?);
    let coords: bool = item(s, "coords")?;
    if !coords {
        source = source.without_coordinates();
    }
    if s.contains("pad")? {
        for axis in item::<Vec<usize>>(s, "pad")? {
            source = source.pad(axis);
        }
    }
    if s.contains("fill")?
        && let Some(fill) = item::<Option<f64>>(s, "fill")?
    {
        source = source.fill(fill);
    }
    Ok(source)
}

/// A field's cells: `("fit",)`, `("size", [..])` or `("edges", [[..], ..])`.
fn parse_cells(c: &Bound<'_, PyAny>) -> PyResult<Cells> {
    let kind: String = c.get_item(0)?.extract()?;
    match kind.as_str() {
        "fit" => Ok(Cells::Fit),
        "size" => Ok(Cells::Size(c.get_item(1)?.extract()?)),
        "edges" => Ok(Cells::Edges(c.get_item(1)?.extract()?)),
        other => Err(PyValueError::new_err(format!(
            "unknown cells kind {other:?}"
        ))),
    }
}

/// A mask `{"shape", "cells", "values"}` (bool per cell, C order) or `{"shape", "cells",
/// "runs"}` (`(n, 2)` uint64 `[start, end)` linear cell ranges), built without the GIL.
fn parse_mask(py: Python<'_>, m: &Bound<'_, PyDict>) -> PyResult<Mask> {
    let shape: Vec<u64> = item(m, "shape")?;
    let cells = parse_cells(&item::<Bound<'_, PyAny>>(m, "cells")?)?;
    let built = if let Some(runs) = m.get_item("runs")? {
        let runs: PyReadonlyArrayDyn<'_, u64> = runs.extract()?;
        let flat = runs.as_slice()?;
        let runs: Vec<(u64, u64)> = flat.chunks_exact(2).map(|r| (r[0], r[1])).collect();
        Mask::from_runs(shape, cells, runs)
    } else {
        let values: PyReadonlyArrayDyn<'_, bool> = item(m, "values")?;
        let flat = values.as_slice()?;
        py.detach(|| Mask::from_bools(shape, cells, flat))
    };
    built.map_err(|e| blocking::sampler_err(py, &e))
}

fn parse_weights(py: Python<'_>, w: &Bound<'_, PyDict>) -> PyResult<Weights> {
    let shape: Vec<u64> = item(w, "shape")?;
    let cells = parse_cells(&item::<Bound<'_, PyAny>>(w, "cells")?)?;
    let values: PyReadonlyArray1<'_, f64> = item(w, "values")?;
    let values = values.as_slice()?.to_vec();
    Weights::new(shape, cells, values).map_err(|e| blocking::sampler_err(py, &e))
}

fn parse_spec(spec: &Bound<'_, PyDict>) -> PyResult<(SampleSpec, LoaderConfig)> {
    let positions: Vec<String> = item(spec, "positions")?;
    let mut sample = SampleSpec::new(positions);
    let sources: Vec<Bound<'_, PyDict>> = item(spec, "sources")?;
    for s in &sources {
        sample = sample.source(parse_source(s)?);
    }
    let mode: String = item(spec, "mode")?;
    sample = sample.mode(match mode.as_str() {
        "uniform" => Mode::Uniform,
        "epoch" => Mode::Epoch {
            stride: item(spec, "stride")?,
        },
        m => return Err(PyValueError::new_err(format!("unknown mode {m:?}"))),
    });
    let region: Option<(Vec<u64>, Vec<u64>)> = item(spec, "region")?;
    if let Some((start, end)) = region {
        sample = sample.region(start, end);
    }
    let py = spec.py();
    if let Some(masks) = spec.get_item("masks")? {
        for m in masks.try_iter()? {
            sample = sample.mask(parse_mask(py, m?.cast()?)?);
        }
    }
    if let Some(w) = spec.get_item("weights")?
        && !w.is_none()
    {
        sample = sample.weights(parse_weights(py, w.cast()?)?);
    }
    sample = sample
        .seed(item(spec, "seed")?)
        .batch_size(item(spec, "batch_size")?);
    let pin: bool = item(spec, "pin")?;
    let shared: bool = if spec.contains("shared_memory")? {
        item(spec, "shared_memory")?
    } else {
        false
    };
    let config = LoaderConfig {
        start_step: item(spec, "start_step")?,
        end_step: item(spec, "end_step")?,
        shard: Shard::new(item(spec, "rank")?, item(spec, "world_size")?),
        prefetch: item(spec, "prefetch")?,
        prefetch_max: if spec.contains("prefetch_max")? {
            item(spec, "prefetch_max")?
        } else {
            None
        },
        buffers: item(spec, "buffers")?,
        workers: item(spec, "workers")?,
        threads: item(spec, "threads")?,
        pin: PinOptions {
            shared,
            ..if pin {
                PinOptions::default()
            } else {
                PinOptions::pageable()
            }
        },
    };
    Ok((sample, config))
}

fn coord_value(py: Python<'_>, v: &CoordValue) -> PyResult<Py<PyAny>> {
    Ok(match *v {
        CoordValue::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        CoordValue::UInt(u) => u.into_pyobject(py)?.into_any().unbind(),
        CoordValue::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
        CoordValue::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
    })
}

/// One sample's metadata as a dict.
fn meta_dict<'py>(py: Python<'py>, m: &SampleMeta) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("step", m.step)?;
    d.set_item("index", m.index)?;
    d.set_item("global_index", m.global_index)?;
    d.set_item("epoch", m.epoch)?;
    d.set_item("position", m.position.clone())?;
    let sources = PyDict::new(py);
    for s in &m.sources {
        let sd = PyDict::new(py);
        sd.set_item("array", &*s.array)?;
        sd.set_item("origin", s.origin.clone())?;
        sd.set_item("shape", s.shape.clone())?;
        let coords = PyList::empty(py);
        for c in &s.coords {
            let cd = PyDict::new(py);
            cd.set_item("dim", &*c.dim)?;
            cd.set_item("axis", c.axis)?;
            cd.set_item("first", coord_value(py, &c.first)?)?;
            cd.set_item("last", coord_value(py, &c.last)?)?;
            cd.set_item("units", c.units.as_deref())?;
            coords.append(cd)?;
        }
        sd.set_item("coords", coords)?;
        sources.set_item(&*s.source, sd)?;
    }
    d.set_item("sources", sources)?;
    Ok(d)
}

fn pin_dict<'py>(py: Python<'py>, p: &PinState) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("page_locked", p.page_locked)?;
    d.set_item("cuda_registered", p.cuda_registered)?;
    d.set_item("reason", p.reason.as_deref())?;
    Ok(d)
}

// pyo3 extracts arguments by value.
#[allow(clippy::needless_pass_by_value)]
#[pymethods]
impl NativeLoader {
    /// Builds the sampler and starts the loader from a spec dict (see `zcrop/_loader.py`).
    #[new]
    fn new(py: Python<'_>, spec: Bound<'_, PyDict>) -> PyResult<Self> {
        let (sample, config) = parse_spec(&spec)?;
        let cfg = config.clone();
        let (sampler, loader) = blocking::run(py, 0, move |_| {
            let sampler = Sampler::new(sample)?;
            let loader = Loader::new(sampler.clone(), cfg)?;
            Ok::<_, Failure>((sampler, loader))
        })?;
        let pin_state = loader.pin_state().clone();
        let buffer_bytes = loader.buffer_bytes();
        let depth = loader.depth_gauge();
        let config = loader.config().clone();
        Ok(NativeLoader {
            state: ProcessBound::new(Arc::new(Mutex::new(State {
                loader,
                stash: None,
            }))),
            successor: PerProcess::new(),
            consumer_step: Arc::new(AtomicU64::new(config.start_step)),
            sampler,
            config,
            pin_state,
            buffer_bytes,
            depth,
        })
    }

    /// The next batch in step order, or `None` after the last step.
    fn next(&self, py: Python<'_>) -> PyResult<Option<NativeBatch>> {
        let state = self.state(py)?;
        let consumer_step = Arc::clone(&self.consumer_step);
        let batch = blocking::run_handoff(py, move |_cancel, reply: Reply<Option<Batch>>| {
            let mut st = lock(&state);
            let got = st.stash.take().unwrap_or_else(|| st.loader.next_batch());
            // The consumer's next step once it has this result: recorded before the reply,
            // which the caller may act on at once.
            let after = match &got {
                Ok(batch) => batch.step() + 1,
                Err(_) => st.loader.next_step(),
            };
            consumer_step.store(after, Ordering::Release);
            let result = match got {
                Ok(batch) => Ok(Ok(Some(batch))),
                Err(SamplerError::Exhausted { .. }) => Ok(Ok(None)),
                Err(e) => Ok(Err(Failure::Sampler(e))),
            };
            // The caller was interrupted: keep the batch for the next call (under the same
            // lock, so no later call can overtake it). Errors are re-created as they were.
            if let Err(Ok(Ok(Some(batch)))) = reply.send(result) {
                st.stash = Some(Ok(batch));
                consumer_step.store(next_step(&st), Ordering::Release);
            }
        })?;
        Ok(batch.map(|batch| NativeBatch { batch }))
    }

    /// Restarts the stream at `step` (reads in flight are cancelled).
    fn seek(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        let state = self.state(py)?;
        py.detach(|| {
            let mut st = lock(&state);
            st.stash = None;
            st.loader.seek(step);
            self.consumer_step.store(step, Ordering::Release);
        });
        Ok(())
    }

    /// The step the next call to `next` returns.
    #[getter]
    fn next_step(&self) -> u64 {
        self.consumer_step.load(Ordering::Acquire)
    }

    /// The sources: `name`, `array` (its directory), `crop`, `dtype`, `element_size`.
    #[getter]
    fn sources<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        source_dicts(py, &self.sampler)
    }

    /// Samples per batch (on this rank).
    #[getter]
    fn batch_size(&self) -> usize {
        self.sampler.batch_size()
    }

    /// Allowed sample positions: the epoch length in epoch mode.
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.sampler.epoch_len()
    }

    /// The position grid fitted masks and weights refer to (positions per dimension).
    #[getter]
    fn position_grid(&self) -> Vec<u64> {
        self.sampler.position_grid().to_vec()
    }

    /// The valid position box: `(start, end)`.
    #[getter]
    fn position_box(&self) -> (Vec<u64>, Vec<u64>) {
        self.sampler.position_box()
    }

    /// The first step and the end step (`None`: endless).
    #[getter]
    fn steps(&self) -> (u64, Option<u64>) {
        (self.config.start_step, self.config.end_step)
    }

    /// Whether the batch buffers are page-locked and CUDA-registered, and why not.
    #[getter]
    fn pin_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        pin_dict(py, &self.pin_state)
    }

    /// Bytes of one ring buffer.
    #[getter]
    fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Batches read ahead now (`prefetch`, or where the adaptive depth stands; in a child of
    /// `fork` that has not read yet, `prefetch`).
    #[getter]
    fn prefetch_depth(&self) -> usize {
        if self.state.is_current() {
            self.depth.get()
        } else {
            self.successor
                .get()
                .map_or(self.config.prefetch, |(_, gauge)| gauge.get())
        }
    }

    /// The metadata of every sample of batch `step` of this rank (no IO: a pure function of
    /// the spec, the seed, the step and the rank).
    fn plan<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Vec<Bound<'py, PyDict>>> {
        plan_dicts(py, &self.sampler, step, self.config.shard)
    }
}

/// The sources of `sampler` as dicts: `name`, `array` (its directory), `crop`, `dtype`,
/// `element_size`.
fn source_dicts<'py>(py: Python<'py>, sampler: &Sampler) -> PyResult<Vec<Bound<'py, PyDict>>> {
    sampler
        .sources()
        .iter()
        .map(|s| {
            let d = PyDict::new(py);
            d.set_item("name", &*s.name)?;
            d.set_item("array", &*s.array)?;
            d.set_item("crop", s.crop.clone())?;
            d.set_item("dtype", &s.dtype)?;
            d.set_item("element_size", s.element_size)?;
            let origins = PyList::empty(py);
            for (rule, &every) in s.origins.iter().zip(&s.every) {
                match rule {
                    &OriginRule::Aligned {
                        position,
                        offset,
                        num,
                        den,
                        jitter,
                    } => origins.append(("along", position, num, den, offset, jitter, every))?,
                    OriginRule::Lookup {
                        position,
                        table,
                        offset,
                        jitter,
                    } => origins.append((
                        "lookup",
                        *position,
                        PyArray1::from_slice(py, table),
                        *offset,
                        *jitter,
                        every,
                    ))?,
                    &OriginRule::Fixed(o) => origins.append(("fixed", o, every))?,
                }
            }
            d.set_item("origins", origins)?;
            d.set_item("every", s.every.clone())?;
            let picks: Vec<Option<Vec<u64>>> = s
                .picks
                .iter()
                .map(|p| p.as_deref().map(<[u64]>::to_vec))
                .collect();
            d.set_item("picks", picks)?;
            d.set_item("wrap", s.wrap)?;
            d.set_item("pad", s.pad.clone())?;
            Ok(d)
        })
        .collect()
}

/// The metadata of every sample of batch `step` of `shard`.
fn plan_dicts<'py>(
    py: Python<'py>,
    sampler: &Sampler,
    step: u64,
    shard: Shard,
) -> PyResult<Vec<Bound<'py, PyDict>>> {
    let plan = sampler
        .plan(step, shard)
        .map_err(|e| blocking::sampler_err(py, &e))?;
    plan.samples().iter().map(|m| meta_dict(py, m)).collect()
}

/// A sampler without a loader's threads or ring (the Rust side of `zcrop.Samples`): reads the
/// batch of any step on demand, from any thread, into new arrays.
#[pyclass(frozen, module = "zcrop._zcrop")]
pub(crate) struct NativeSampler {
    sampler: Sampler,
    shard: Shard,
}

// pyo3 extracts arguments by value.
#[allow(clippy::needless_pass_by_value)]
#[pymethods]
impl NativeSampler {
    /// Builds the sampler from a loader spec dict (its loader fields are ignored but `rank`
    /// and `world_size`).
    #[new]
    fn new(py: Python<'_>, spec: Bound<'_, PyDict>) -> PyResult<Self> {
        let (sample, config) = parse_spec(&spec)?;
        let sampler = blocking::run(py, 0, move |_| Ok::<_, Failure>(Sampler::new(sample)?))?;
        Ok(NativeSampler {
            sampler,
            shard: config.shard,
        })
    }

    /// Reads batch `step`: one array of 64-bit words per source, holding the source's bytes
    /// (`batch_size x crop` elements) at its start.
    fn read<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Vec<Bound<'py, PyArray1<u64>>>> {
        let sampler = self.sampler.clone();
        let shard = self.shard;
        let sizes: Vec<usize> = self
            .sampler
            .sources()
            .iter()
            .map(|s| s.batch_bytes)
            .collect();
        let total: usize = sizes.iter().sum();
        let outputs = blocking::run(py, total as u64, move |cancel| {
            let plan = sampler.plan(step, shard)?;
            sizes
                .iter()
                .enumerate()
                .map(|(s, &bytes)| {
                    let mut words = vec![0u64; bytes.div_ceil(8)];
                    let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes];
                    sampler.read_into(&plan, s, out, Some(cancel))?;
                    Ok::<_, Failure>(words)
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        Ok(outputs
            .into_iter()
            .map(|words| PyArray1::from_vec(py, words))
            .collect())
    }

    /// The metadata of every sample of batch `step` (no IO).
    fn plan<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Vec<Bound<'py, PyDict>>> {
        plan_dicts(py, &self.sampler, step, self.shard)
    }

    /// The sources (as `NativeLoader.sources`).
    #[getter]
    fn sources<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        source_dicts(py, &self.sampler)
    }

    /// Allowed sample positions: the epoch length in epoch mode.
    #[getter]
    fn epoch_len(&self) -> u64 {
        self.sampler.epoch_len()
    }

    /// The position grid fitted masks and weights refer to (positions per dimension).
    #[getter]
    fn position_grid(&self) -> Vec<u64> {
        self.sampler.position_grid().to_vec()
    }

    /// The valid position box: `(start, end)` per position dimension.
    #[getter]
    fn position_box(&self) -> (Vec<u64>, Vec<u64>) {
        self.sampler.position_box()
    }

    /// Number of disjoint boxes holding the allowed positions.
    #[getter]
    fn position_blocks(&self) -> usize {
        self.sampler.position_blocks()
    }

    /// Heap bytes of the position space (blocks, lookup tables, masks' runs, weights).
    #[getter]
    fn position_bytes(&self) -> usize {
        self.sampler.position_bytes()
    }

    /// Whether the sampler may draw position `pos`.
    fn allows(&self, pos: Vec<u64>) -> bool {
        self.sampler.allows(&pos)
    }

    /// The positions of global samples `first .. first + n` (an `(n, ndim)` uint64 array): the
    /// sampler alone, no reads.
    fn positions<'py>(
        &self,
        py: Python<'py>,
        first: u64,
        n: u64,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let sampler = self.sampler.clone();
        let out = blocking::run(py, 0, move |_| {
            Ok::<_, Failure>(sampler.sample_positions(first, n)?)
        })?;
        Ok(PyArray1::from_vec(py, out))
    }
}

#[pymethods]
impl NativeBatch {
    /// The step.
    #[getter]
    fn step(&self) -> u64 {
        self.batch.step()
    }

    /// Number of samples.
    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// Number of sources.
    #[getter]
    fn num_sources(&self) -> usize {
        self.batch.num_sources()
    }

    /// The v3 name of source `s`'s delivered element type.
    fn dtype(&self, s: usize) -> PyResult<String> {
        self.check(s)?;
        Ok(self.batch.dtype(s).to_string())
    }

    /// The shape of source `s`: `(batch_size, *crop)`.
    fn shape(&self, s: usize) -> PyResult<Vec<u64>> {
        self.check(s)?;
        Ok(self.batch.shape(s))
    }

    /// A read-only buffer over source `s`'s bytes (keeps this batch alive).
    fn view(slf: Bound<'_, Self>, s: usize) -> PyResult<SourceView> {
        slf.get().check(s)?;
        Ok(SourceView {
            batch: slf.unbind(),
            source: s,
        })
    }

    /// With a ring mapped shared (the spec's `shared_memory`): the memory file of this batch's
    /// buffer, as `(fd, file size, offset of each source's bytes in the file)`. The descriptor
    /// stays the loader's (open while the loader lives); `None` for a private ring.
    fn shared_memory(&self) -> Option<(i32, usize, Vec<usize>)> {
        let (fd, size, at) = self.batch.shared_memory()?;
        let offsets = (0..self.batch.num_sources())
            .map(|s| at + self.batch.source_offset(s))
            .collect();
        Some((std::os::fd::AsRawFd::as_raw_fd(&fd), size, offsets))
    }

    /// The metadata of every sample.
    fn samples<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.batch
            .samples()
            .iter()
            .map(|m| meta_dict(py, m))
            .collect()
    }

    /// Seconds a worker took to plan and read this batch.
    #[getter]
    fn read_time(&self) -> f64 {
        self.batch.read_time().as_secs_f64()
    }

    /// Chunks read and decoded, bytes decoded, for this batch.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.batch.stats();
        let d = PyDict::new(py);
        d.set_item("chunks", s.chunks)?;
        d.set_item("chunks_missing", s.chunks_missing)?;
        d.set_item("chunks_decoded", s.chunks_decoded)?;
        d.set_item("bytes_decoded", s.bytes_decoded)?;
        d.set_item("chunk_bytes_read", s.chunk_bytes_read)?;
        d.set_item("output_bytes", s.output_bytes)?;
        Ok(d)
    }

    /// Whether this batch's buffer is page-locked and CUDA-registered.
    #[getter]
    fn pin_state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        pin_dict(py, self.batch.pin_state())
    }
}

impl NativeBatch {
    fn check(&self, s: usize) -> PyResult<()> {
        if s < self.batch.num_sources() {
            Ok(())
        } else {
            Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "source {s} of a batch with {} sources",
                self.batch.num_sources()
            )))
        }
    }
}
