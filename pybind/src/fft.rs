//! The out-of-core FFT along a chunked axis (`zcrop.fft`): in one process, or as a job of
//! independent tasks that Dask or Cubed run. Every call releases the GIL and stops at the next
//! block on Ctrl-C.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use zcrop::sampler::fft::{FftJob, JobOptions, JobStart, StorageOptions, TaskReport};
use zcrop::sampler::{
    ChunkedFftOptions, ComplexType, FftNorm, FftReport, FftStrategy, fft_along_axis_cancellable,
};

use crate::blocking::{self, Failure};

fn options(
    axis: usize,
    memory_budget: usize,
    norm: &str,
    dtype: &str,
    temp_dir: Option<PathBuf>,
    storage: StorageOptions,
    axis_name: Option<String>,
) -> PyResult<ChunkedFftOptions> {
    let mut o = ChunkedFftOptions::new(axis, memory_budget);
    o.norm = match norm {
        "backward" => FftNorm::Backward,
        "ortho" => FftNorm::Ortho,
        "forward" => FftNorm::Forward,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "norm must be 'backward', 'ortho' or 'forward', not {other:?}"
            )));
        }
    };
    o.output = match dtype {
        "complex64" => ComplexType::Complex64,
        "complex128" => ComplexType::Complex128,
        other => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "dtype must be 'complex64' or 'complex128', not {other:?}"
            )));
        }
    };
    o.temp_dir = temp_dir;
    o.storage = storage;
    o.axis_name = axis_name;
    Ok(o)
}

/// Options for the output's (and work directory's) URLs, and for the input's (by default the
/// same).
type Options = Option<Vec<(String, String)>>;

fn storage(output: Options, input: Options) -> StorageOptions {
    let output = output.unwrap_or_default();
    StorageOptions {
        input: input.unwrap_or_else(|| output.clone()),
        output,
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn report_dict<'py>(py: Python<'py>, r: &FftReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match r.strategy {
        FftStrategy::InMemory => d.set_item("strategy", "in_memory")?,
        FftStrategy::FourStep {
            n1,
            n2,
            transpose_pass,
        } => {
            d.set_item("strategy", "four_step")?;
            d.set_item("n1", n1)?;
            d.set_item("n2", n2)?;
            d.set_item("transpose_pass", transpose_pass)?;
        }
    }
    d.set_item("tile", r.tile.clone())?;
    d.set_item("output_chunks", r.output_chunks.clone())?;
    set_numbers(
        &d,
        &[
            ("block_bytes", r.block_bytes as u64),
            ("passes", u64::from(r.passes)),
            ("read_bytes", r.read_bytes),
            ("output_bytes", r.output_bytes),
            ("temp_bytes", r.temp_bytes),
        ],
    )?;
    d.set_item("seconds", secs(r.elapsed))?;
    Ok(d)
}

/// Sets each `(key, value)` in `d`.
fn set_numbers(d: &Bound<'_, PyDict>, items: &[(&str, u64)]) -> PyResult<()> {
    items.iter().try_for_each(|(k, v)| d.set_item(k, v))
}

/// The FFT of the array at `input` along `axis` into a new Zarr v3 array at `output` (paths or
/// object-store URLs, opened with `storage_options`, the input with `input_storage_options` if
/// given), in this process within `memory_budget` bytes, replacing an existing Zarr array there
/// with `overwrite`; returns its report.
#[pyfunction]
#[pyo3(signature = (input, output, axis, memory_budget, norm, dtype, temp_dir=None, overwrite=false, storage_options=None, input_storage_options=None, axis_name=None))]
// pyo3 extracts arguments by value; the arguments mirror the Python signature.
#[allow(clippy::needless_pass_by_value, clippy::too_many_arguments)]
pub(crate) fn fft_local<'py>(
    py: Python<'py>,
    input: PathBuf,
    output: PathBuf,
    axis: usize,
    memory_budget: usize,
    norm: &str,
    dtype: &str,
    temp_dir: Option<PathBuf>,
    overwrite: bool,
    storage_options: Options,
    input_storage_options: Options,
    axis_name: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let s = storage(storage_options, input_storage_options);
    let mut o = options(axis, memory_budget, norm, dtype, temp_dir, s, axis_name)?;
    o.overwrite = overwrite;
    let report = blocking::run(py, u64::MAX, |cancel| {
        fft_along_axis_cancellable(&input, &output, &o, Some(cancel)).map_err(Failure::Fft)
    })?;
    report_dict(py, &report)
}

/// A chunked FFT cut into tasks (`zcrop.fft`'s Dask and Cubed engines run them).
#[pyclass(module = "zcrop._zcrop", frozen)]
pub(crate) struct NativeFftJob {
    job: FftJob,
}

fn task_dict<'py>(py: Python<'py>, r: &TaskReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("skipped", r.skipped)?;
    set_numbers(
        &d,
        &[
            ("stage", r.stage as u64),
            ("task", r.task),
            ("items", r.items),
            ("read_bytes", r.read_bytes),
            ("written_bytes", r.written_bytes),
            ("block_bytes", r.block_bytes as u64),
        ],
    )?;
    d.set_item("seconds", secs(r.elapsed))?;
    Ok(d)
}

#[pymethods]
impl NativeFftJob {
    /// Plans the job and creates its arrays (paths or object-store URLs, opened with
    /// `storage_options`, the input with `input_storage_options` if given); returns
    /// `(job, done)`, `done` being `None` for a new job and the number of tasks already done
    /// for a resumed one.
    #[staticmethod]
    #[pyo3(signature = (input, output, axis, memory_budget, norm, dtype, work_dir, task_bytes, max_tasks, overwrite, storage_options=None, input_storage_options=None, axis_name=None))]
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    fn create(
        py: Python<'_>,
        input: PathBuf,
        output: PathBuf,
        axis: usize,
        memory_budget: usize,
        norm: &str,
        dtype: &str,
        work_dir: PathBuf,
        task_bytes: u64,
        max_tasks: u64,
        overwrite: bool,
        storage_options: Options,
        input_storage_options: Options,
        axis_name: Option<String>,
    ) -> PyResult<(NativeFftJob, Option<u64>)> {
        let s = storage(storage_options, input_storage_options);
        let mut o = options(axis, memory_budget, norm, dtype, None, s, axis_name)?;
        o.overwrite = overwrite;
        let jo = JobOptions {
            work_dir,
            task_bytes,
            max_tasks,
        };
        let (job, start) = blocking::run(py, 0, |_| {
            FftJob::create(&input, &output, &o, &jo).map_err(Failure::Fft)
        })?;
        let done = match start {
            JobStart::Created => None,
            JobStart::Resumed { done } => Some(done),
        };
        Ok((NativeFftJob { job }, done))
    }

    /// A job from its JSON description, its URLs opened with `storage_options` (the input's
    /// with `input_storage_options` if given).
    #[staticmethod]
    #[pyo3(signature = (json, storage_options=None, input_storage_options=None))]
    fn from_json(
        py: Python<'_>,
        json: &str,
        storage_options: Options,
        input_storage_options: Options,
    ) -> PyResult<NativeFftJob> {
        let s = storage(storage_options, input_storage_options);
        let job = blocking::run(py, 0, |_| FftJob::from_json(json, &s).map_err(Failure::Fft))?;
        Ok(NativeFftJob { job })
    }

    /// The JSON description (no storage options).
    fn to_json(&self) -> String {
        self.job.to_json()
    }

    /// The stages: `[{"name", "items", "items_per_task", "tasks", "item_bytes"}]`.
    fn stages<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        self.job
            .stages()
            .iter()
            .map(|s| {
                let d = PyDict::new(py);
                d.set_item("name", s.stage.name())?;
                d.set_item("items", s.items)?;
                d.set_item("items_per_task", s.items_per_task)?;
                d.set_item("tasks", s.tasks)?;
                d.set_item("item_bytes", s.item_bytes)?;
                Ok(d)
            })
            .collect()
    }

    /// `"in_memory"` or `"four_step"`.
    #[getter]
    fn strategy(&self) -> &'static str {
        self.job.strategy()
    }

    /// The output array's path or URL.
    #[getter]
    fn output(&self) -> &str {
        self.job.output()
    }

    /// The work directory's path or URL.
    #[getter]
    fn work_dir(&self) -> &str {
        self.job.work_dir()
    }

    /// The output's chunk shape.
    #[getter]
    fn output_chunks(&self) -> Vec<u64> {
        self.job.output_chunks().to_vec()
    }

    /// Tasks of stage `stage` already done.
    fn done_in(&self, py: Python<'_>, stage: usize) -> PyResult<u64> {
        blocking::run(py, 0, |_| self.job.done_in(stage).map_err(Failure::Fft))
    }

    /// Checks, in this process, that the job's storage is reachable.
    fn check_access(&self, py: Python<'_>) -> PyResult<()> {
        blocking::run(py, 0, |_| self.job.check_access().map_err(Failure::Fft))
    }

    /// Runs task `task` of stage `stage`; returns its report.
    fn run_task<'py>(
        &self,
        py: Python<'py>,
        stage: usize,
        task: u64,
    ) -> PyResult<Bound<'py, PyDict>> {
        let report = blocking::run(py, u64::MAX, |cancel| {
            self.job
                .run_task(stage, task, Some(cancel))
                .map_err(Failure::Fft)
        })?;
        task_dict(py, &report)
    }

    /// Checks that every task ran and removes the work directory.
    fn finish(&self, py: Python<'_>) -> PyResult<()> {
        blocking::run(py, 0, |_| self.job.finish().map_err(Failure::Fft))
    }
}
