//! The chunked FFT as independent tasks for an external scheduler (Dask, Cubed, a batch
//! system): [`FftJob::create`] plans the transform and lays out its arrays on shared storage,
//! [`FftJob::run_task`] runs one task in any process that can reach that storage, and
//! [`FftJob::finish`] checks that every task ran and removes the temporaries.
//!
//! The plan is the one-process FFT's (same budget, same algorithm, same bytes moved); its items
//! (see [`Stage`]) are grouped into tasks of consecutive items. Tasks of one stage are
//! independent of each other and depend on every task of the stage before.
//!
//! A task writes whole chunks only, always the same ones, so running it again gives the same
//! result: a task killed halfway is simply rerun. When it finishes it leaves a marker file
//! (`work_dir/done/<stage>/<task>`); [`FftJob::run_task`] skips a task whose marker exists, so
//! creating the same job again after a crash resumes it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};
use zcrop_io::fork::PerProcess;
use zcrop_zarr::Array;

use crate::spectral::FftNorm;
use crate::transform::InType;

use super::io::{Writer, write_err};
use super::options::{ChunkedFftOptions, ComplexType, FftError};
use super::passes::{Passes, Stage, Temps, item_bytes, items, stages};
use super::plan::{Plan, PlanKind};
use super::{Prepared, ctx, open_input, open_options};

/// The version of `job.json`'s layout.
const FORMAT: u32 = 1;

/// How an [`FftJob`] is cut into tasks and where it keeps its state.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// Directory for the temporary arrays, the job description (`job.json`) and the task
    /// markers; every process that runs tasks must reach it at this path.
    pub work_dir: PathBuf,
    /// Work per task: consecutive items are grouped until their working blocks add up to
    /// about this many bytes.
    pub task_bytes: u64,
    /// Most tasks per stage; tasks hold more items where the stage would have more.
    pub max_tasks: u64,
    /// Replace an existing output array, and any other job's state in `work_dir`.
    pub overwrite: bool,
}

/// Whether [`FftJob::create`] started a new job or found the same one, unfinished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStart {
    /// A new job: the output and temporary arrays were created.
    Created,
    /// The same job was found in the work directory; tasks already done will be skipped.
    Resumed {
        /// Tasks already done.
        done: u64,
    },
}

/// One stage of a job: its items and how they are grouped into tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageInfo {
    /// What the stage does.
    pub stage: Stage,
    /// Items in the stage.
    pub items: u64,
    /// Consecutive items per task (the last task may hold fewer).
    pub items_per_task: u64,
    /// Tasks in the stage.
    pub tasks: u64,
    /// The largest working block of one item, bytes.
    pub item_bytes: u64,
}

/// What one task did.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskReport {
    /// The stage's index in [`FftJob::stages`].
    pub stage: usize,
    /// The task's index in its stage.
    pub task: u64,
    /// Items run.
    pub items: u64,
    /// The task had run before (its marker existed) and was skipped.
    pub skipped: bool,
    /// Bytes of array data read.
    pub read_bytes: u64,
    /// Bytes of chunks written (output and temporaries).
    pub written_bytes: u64,
    /// The largest working block, bytes.
    pub block_bytes: usize,
    /// Wall time.
    pub elapsed: Duration,
}

/// A chunked FFT cut into tasks (see the module documentation). It serialises to JSON
/// ([`FftJob::to_json`]) to travel to the processes that run its tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FftJob {
    format: u32,
    input: PathBuf,
    output: PathBuf,
    work_dir: PathBuf,
    axis: usize,
    norm: FftNorm,
    output_type: ComplexType,
    memory_budget: usize,
    data_type: String,
    shape: Vec<u64>,
    input_chunks: Vec<u64>,
    plan: Plan,
    output_chunks: Vec<u64>,
    max_read: usize,
    stages: Vec<StageInfo>,
}

impl FftJob {
    /// Plans the FFT of the array at `input` along `options.axis` into a new Zarr v3 array at
    /// `output` and creates its arrays; `options.memory_budget` is each task's budget (and
    /// `options.temp_dir` is not used: temporaries go under `job.work_dir`).
    ///
    /// An existing output is an error unless `job.overwrite` (and then it must be a Zarr
    /// array: nothing else is deleted), except where `job.work_dir` holds this same job,
    /// unfinished: then the job resumes.
    pub fn create(
        input: impl AsRef<Path>,
        output: impl AsRef<Path>,
        options: &ChunkedFftOptions,
        job: &JobOptions,
    ) -> Result<(FftJob, JobStart), FftError> {
        let abs = |p: &Path| std::path::absolute(p).map_err(|e| write_err(p, e));
        let (input, output, work_dir) = (
            abs(input.as_ref())?,
            abs(output.as_ref())?,
            abs(&job.work_dir)?,
        );
        if work_dir == output || work_dir.starts_with(&output) || output.starts_with(&work_dir) {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} and the output {} must not contain each other",
                work_dir.display(),
                output.display()
            )));
        }
        let p = Prepared::new(&input, options)?;
        let c = p.ctx(&p.array);
        let stages = stages(&p.plan.kind)
            .into_iter()
            .map(|stage| {
                let items = items(&c, stage);
                let bytes = item_bytes(&c, stage).max(1);
                let per_task = (job.task_bytes / bytes)
                    .max(items.div_ceil(job.max_tasks.max(1)))
                    .clamp(1, items.max(1));
                StageInfo {
                    stage,
                    items,
                    items_per_task: per_task,
                    tasks: items.div_ceil(per_task),
                    item_bytes: bytes,
                }
            })
            .collect();
        let this = FftJob {
            format: FORMAT,
            input,
            output,
            work_dir,
            axis: p.axis,
            norm: p.norm,
            output_type: p.output,
            memory_budget: options.memory_budget,
            data_type: p.array.data_type(),
            shape: p.shape.clone(),
            input_chunks: p.array.chunk_shape().to_vec(),
            plan: p.plan.clone(),
            output_chunks: p.out_chunks.clone(),
            max_read: p.budgets.block / 4,
            stages,
        };
        let found = this.read_description().ok();
        let same = found.as_ref() == Some(&this);
        if same && !job.overwrite && this.output.join("zarr.json").is_file() {
            // The same job, unfinished: the arrays' metadata is written again (identical) in
            // case the crash came before it was.
            this.create_arrays(&p)?;
            let done = (0..this.stages.len()).map(|s| this.done_in(s)).sum();
            return Ok((this, JobStart::Resumed { done }));
        }
        // The same job whose output was removed starts over.
        if found.is_some() && !same && !job.overwrite {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} holds another transform's state (from {} to {}); \
                 remove it, choose another work directory, or overwrite",
                this.work_dir.display(),
                found
                    .as_ref()
                    .map_or("?".into(), |f| f.input.display().to_string()),
                found
                    .as_ref()
                    .map_or("?".into(), |f| f.output.display().to_string()),
            )));
        }
        let output_exists = !same
            && this.output.exists()
            && std::fs::read_dir(&this.output).map_or(true, |mut d| d.next().is_some());
        if output_exists {
            if !job.overwrite {
                return Err(FftError::InvalidArgument(format!(
                    "the output {} exists; pass overwrite to replace it",
                    this.output.display()
                )));
            }
            remove_zarr(&this.output)?;
        }
        if this.work_dir.exists() {
            if found.is_none() && !is_empty_dir(&this.work_dir) {
                return Err(FftError::InvalidArgument(format!(
                    "the work directory {} exists and holds no zcrop FFT job; \
                     give an empty or new directory",
                    this.work_dir.display()
                )));
            }
            std::fs::remove_dir_all(&this.work_dir).map_err(|e| write_err(&this.work_dir, e))?;
        }
        std::fs::create_dir_all(&this.work_dir).map_err(|e| write_err(&this.work_dir, e))?;
        // The description first: whatever else exists is then recognised as this job's.
        let path = this.work_dir.join("job.json");
        let tmp = this.work_dir.join("job.json.tmp");
        std::fs::write(&tmp, this.to_json()).map_err(|e| write_err(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| write_err(&path, e))?;
        this.create_arrays(&p)?;
        Ok((this, JobStart::Created))
    }

    /// The output and temporary arrays' metadata and the marker directories.
    fn create_arrays(&self, p: &Prepared) -> Result<(), FftError> {
        p.create_output(&self.output)?;
        if matches!(self.plan.kind, PlanKind::FourStep(_)) {
            p.create_temps(&self.work_dir)?;
        }
        for s in 0..self.stages.len() {
            let d = self.marker_dir(s);
            std::fs::create_dir_all(&d).map_err(|e| write_err(&d, e))?;
        }
        Ok(())
    }

    /// The job as JSON, for [`FftJob::from_json`].
    ///
    /// # Panics
    ///
    /// Never: every field serialises (paths, numbers, names).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a job serialises")
    }

    /// A job from [`FftJob::to_json`].
    pub fn from_json(json: &str) -> Result<FftJob, FftError> {
        let job: FftJob = serde_json::from_str(json)
            .map_err(|e| FftError::InvalidArgument(format!("not an FFT job description: {e}")))?;
        if job.format != FORMAT {
            return Err(FftError::InvalidArgument(format!(
                "an FFT job description of format {} (this zcrop reads {FORMAT})",
                job.format
            )));
        }
        Ok(job)
    }

    fn read_description(&self) -> Result<FftJob, FftError> {
        let path = self.work_dir.join("job.json");
        let text = std::fs::read_to_string(&path).map_err(|e| write_err(&path, e))?;
        FftJob::from_json(&text)
    }

    /// The stages, in the order they must run.
    pub fn stages(&self) -> &[StageInfo] {
        &self.stages
    }

    /// The output array's path.
    pub fn output(&self) -> &Path {
        &self.output
    }

    /// The work directory's path.
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// The output's chunk shape.
    pub fn output_chunks(&self) -> &[u64] {
        &self.output_chunks
    }

    /// The one-process FFT's strategy name for this plan: `"in_memory"` or `"four_step"`.
    pub fn strategy(&self) -> &'static str {
        match self.plan.kind {
            PlanKind::InMemory { .. } => "in_memory",
            PlanKind::FourStep(_) => "four_step",
        }
    }

    fn marker_dir(&self, stage: usize) -> PathBuf {
        self.work_dir.join("done").join(stage.to_string())
    }

    fn marker(&self, stage: usize, task: u64) -> PathBuf {
        self.marker_dir(stage).join(task.to_string())
    }

    /// Tasks of stage `stage` already done.
    pub fn done_in(&self, stage: usize) -> u64 {
        std::fs::read_dir(self.marker_dir(stage)).map_or(0, |d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.parse::<u64>().ok())
                        .is_some_and(|t| t < self.stages[stage].tasks)
                })
                .count() as u64
        })
    }

    /// Checks, in the calling process, that this job's storage is reachable: its description
    /// in the work directory is this job's, the input opens, and the work directory and the
    /// output accept files. Run it on every worker before submitting tasks.
    pub fn check_access(&self) -> Result<(), FftError> {
        let found = self.read_description().map_err(|e| {
            FftError::InvalidArgument(format!(
                "cannot read the job description in the work directory {}: {e}",
                self.work_dir.display()
            ))
        })?;
        if found != *self {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} holds another job's description",
                self.work_dir.display()
            )));
        }
        open_input(&self.input, &open_options(self.memory_budget)?)?;
        for dir in [&self.work_dir, &self.output] {
            let probe = dir.join(format!(".zcrop-probe-{}", std::process::id()));
            std::fs::write(&probe, b"").map_err(|e| write_err(&probe, e))?;
            std::fs::remove_file(&probe).map_err(|e| write_err(&probe, e))?;
        }
        Ok(())
    }

    /// Runs task `task` of stage `stage` (an index into [`FftJob::stages`]) unless its marker
    /// says it ran; every task of the stage before must have run. Setting `cancel` stops it at
    /// its next item ([`FftError::Cancelled`]; it leaves no marker, so it runs again in full).
    pub fn run_task(
        &self,
        stage: usize,
        task: u64,
        cancel: Option<&AtomicBool>,
    ) -> Result<TaskReport, FftError> {
        let t0 = Instant::now();
        let info = *self.stages.get(stage).ok_or_else(|| {
            FftError::InvalidArgument(format!(
                "stage {stage} of a job with {} stages",
                self.stages.len()
            ))
        })?;
        if task >= info.tasks {
            return Err(FftError::InvalidArgument(format!(
                "task {task} of stage {stage} ({}), which has {} tasks",
                info.stage.name(),
                info.tasks
            )));
        }
        let marker = self.marker(stage, task);
        let first = task * info.items_per_task;
        let last = (first + info.items_per_task).min(info.items);
        if marker.exists() {
            return Ok(TaskReport {
                stage,
                task,
                items: last - first,
                skipped: true,
                read_bytes: 0,
                written_bytes: 0,
                block_bytes: 0,
                elapsed: t0.elapsed(),
            });
        }
        if stage > 0 && !self.seen_complete(stage - 1) {
            let (before, needed) = (self.done_in(stage - 1), self.stages[stage - 1].tasks);
            if before < needed {
                return Err(FftError::InvalidArgument(format!(
                    "stage {stage} ({}) cannot start: stage {} ({}) has {before} of {needed} \
                     tasks done",
                    info.stage.name(),
                    stage - 1,
                    self.stages[stage - 1].stage.name()
                )));
            }
            self.remember_complete(stage - 1);
        }
        let open = open_options(self.memory_budget)?;
        let input = open_input(&self.input, &open)?;
        if input.shape() != self.shape.as_slice() || input.data_type() != self.data_type {
            return Err(FftError::InvalidArgument(format!(
                "the input {} changed since the job was planned: now {:?} {}, planned {:?} {}",
                self.input.display(),
                input.shape(),
                input.data_type(),
                self.shape,
                self.data_type
            )));
        }
        let ty = InType::from_name(&self.data_type).ok_or_else(|| {
            FftError::InvalidArgument(format!("cannot transform data type {}", self.data_type))
        })?;
        let c = ctx(&input, ty, self.axis, &self.plan, self.norm, self.max_read);
        let mut out = Writer::open(&self.output, self.output_type)?;
        let mut temps = match self.plan.kind {
            PlanKind::InMemory { .. } => None,
            PlanKind::FourStep(f) => Some(self.open_temps(f.z.is_some(), &open)?),
        };
        let mut passes = Passes::new(&c, &mut out, temps.as_mut());
        passes.cancel = cancel;
        for i in first..last {
            passes.run(info.stage, i)?;
        }
        let (read_bytes, block_bytes) = (passes.read, passes.largest);
        let written_bytes = out.written + temps.as_ref().map_or(0, Temps::written);
        std::fs::write(&marker, b"").map_err(|e| write_err(&marker, e))?;
        Ok(TaskReport {
            stage,
            task,
            items: last - first,
            skipped: false,
            read_bytes,
            written_bytes,
            block_bytes,
            elapsed: t0.elapsed(),
        })
    }

    /// Whether this process has seen every task of `stage` done: listing a stage's markers
    /// once per process, not once per task, keeps a stage of many tasks cheap to check.
    fn seen_complete(&self, stage: usize) -> bool {
        complete_stages()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&self.stage_key(stage))
    }

    fn remember_complete(&self, stage: usize) {
        let mut seen = complete_stages()
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if seen.len() > 1024 {
            seen.clear();
        }
        seen.insert(self.stage_key(stage));
    }

    /// A stage of this job: the work directory, when its description was written (a job
    /// created again there is another job) and the stage.
    fn stage_key(&self, stage: usize) -> StageKey {
        let written = std::fs::metadata(self.work_dir.join("job.json"))
            .and_then(|m| m.modified())
            .ok();
        (self.work_dir.clone(), written, stage)
    }

    fn open_temps(&self, z: bool, open: &zcrop_zarr::OpenOptions) -> Result<Temps, FftError> {
        let one = |name: &str| -> Result<(Writer, Array), FftError> {
            let dir = self.work_dir.join(name);
            let w = Writer::open(&dir, ComplexType::Complex128)?;
            let r = Array::open_with(&dir, open).map_err(|error| FftError::Read {
                what: format!("temporary array {}", dir.display()),
                error,
            })?;
            Ok((w, r))
        };
        Ok(Temps {
            x0: one("x0")?,
            y: one("y")?,
            z: if z { Some(one("z")?) } else { None },
        })
    }

    /// Checks that every task ran, then removes the work directory (temporary arrays,
    /// markers, description).
    pub fn finish(&self) -> Result<(), FftError> {
        for (s, info) in self.stages.iter().enumerate() {
            let done = self.done_in(s);
            if done < info.tasks {
                return Err(FftError::InvalidArgument(format!(
                    "stage {s} ({}) has {done} of {} tasks done",
                    info.stage.name(),
                    info.tasks
                )));
            }
        }
        std::fs::remove_dir_all(&self.work_dir).map_err(|e| write_err(&self.work_dir, e))
    }
}

/// A stage of one job, see [`FftJob::stage_key`].
type StageKey = (PathBuf, Option<SystemTime>, usize);

/// Stages this process has seen complete (a child of `fork` starts with none).
fn complete_stages() -> &'static Mutex<HashSet<StageKey>> {
    static SEEN: PerProcess<Mutex<HashSet<StageKey>>> = PerProcess::new();
    SEEN.get_or_init(|| Mutex::new(HashSet::new()))
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// Removes the Zarr array at `dir`, refusing a directory that is not one (so a mistyped
/// output path cannot delete anything else).
fn remove_zarr(dir: &Path) -> Result<(), FftError> {
    let is_array = ["zarr.json", ".zarray"]
        .iter()
        .any(|m| dir.join(m).is_file());
    if !is_array {
        return Err(FftError::InvalidArgument(format!(
            "the output {} exists and is not a Zarr array; it is not removed even with overwrite",
            dir.display()
        )));
    }
    std::fs::remove_dir_all(dir).map_err(|e| write_err(dir, e))
}
