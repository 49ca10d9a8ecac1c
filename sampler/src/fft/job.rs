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
//!
//! The input, the output and the work directory may each be a local path or an object-store
//! URL (`s3://bucket/prefix`, `gs://...`, `az://...`); the job's description there holds no
//! credentials: every process gives its storage options itself ([`FftJob::from_json`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use zcrop_io::fork::PerProcess;
use zcrop_zarr::Array;

use crate::spectral::FftNorm;
use crate::transform::InType;

use super::io::{Writer, open_temp, write_in_flight};
use super::options::{ChunkedFftOptions, ComplexType, FftError, StorageOptions};
use super::passes::{Passes, Stage, Temps, item_bytes, items, stages};
use super::place::Place;
use super::plan::{Plan, PlanKind};
use super::{Prepared, ctx, open_input, open_options};

/// The version of `job.json`'s layout.
const FORMAT: u32 = 2;

/// How an [`FftJob`] is cut into tasks and where it keeps its state.
#[derive(Debug, Clone)]
pub struct JobOptions {
    /// Directory (a local path or an object-store URL) for the temporary arrays, the job
    /// description (`job.json`) and the task markers; every process that runs tasks must reach
    /// it at this path.
    pub work_dir: PathBuf,
    /// Work per task: consecutive items are grouped until their working blocks add up to
    /// about this many bytes.
    pub task_bytes: u64,
    /// Most tasks per stage; tasks hold more items where the stage would have more.
    pub max_tasks: u64,
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

/// A chunked FFT cut into tasks (see the module documentation). Its description serialises
/// to JSON ([`FftJob::to_json`]) to travel to the processes that run its tasks.
#[derive(Clone)]
pub struct FftJob {
    d: Description,
    storage: StorageOptions,
    input: Place,
    output: Place,
    work: Place,
}

/// What `job.json` holds: the plan and where everything is, no credentials.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Description {
    format: u32,
    /// Tells this job from an identical one created again in the same work directory.
    token: String,
    input: String,
    output: String,
    work_dir: String,
    axis: usize,
    norm: FftNorm,
    output_type: ComplexType,
    axis_name: Option<String>,
    memory_budget: usize,
    data_type: String,
    shape: Vec<u64>,
    input_chunks: Vec<u64>,
    plan: Plan,
    output_chunks: Vec<u64>,
    max_read: usize,
    stages: Vec<StageInfo>,
}

impl Description {
    /// Whether `self` and `other` describe the same transform (their tokens aside).
    fn same_job(&self, other: &Description) -> bool {
        Description {
            token: other.token.clone(),
            ..self.clone()
        } == *other
    }
}

impl std::fmt::Debug for FftJob {
    // The storage options may hold credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FftJob")
            .field("description", &self.d)
            .finish_non_exhaustive()
    }
}

impl PartialEq for FftJob {
    fn eq(&self, other: &FftJob) -> bool {
        self.d == other.d
    }
}

/// A token unlike any other job's: the time, the process and a counter.
fn new_token() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{n:x}", std::process::id())
}

impl FftJob {
    /// Plans the FFT of the array at `input` along `options.axis` into a new Zarr v3 array at
    /// `output` and creates its arrays; `options.memory_budget` is each task's budget (and
    /// `options.temp_dir` is not used: temporaries go under `job.work_dir`). `input`, `output`
    /// and `job.work_dir` are local paths or object-store URLs (opened with
    /// `options.storage`).
    ///
    /// An existing output is an error unless `options.overwrite` (and then it must be a Zarr
    /// array: nothing else is deleted), except where `job.work_dir` holds this same job,
    /// unfinished: then the job resumes. `options.overwrite` also replaces another job's state
    /// in `job.work_dir`.
    pub fn create(
        input: impl AsRef<Path>,
        output: impl AsRef<Path>,
        options: &ChunkedFftOptions,
        job: &JobOptions,
    ) -> Result<(FftJob, JobStart), FftError> {
        let storage = &options.storage;
        let output = Place::new(output.as_ref(), &storage.output)?;
        let work = Place::new(&job.work_dir, &storage.output)?;
        if work.overlaps(&output) {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} and the output {} must not contain each other",
                work.show(),
                output.show()
            )));
        }
        let p = Prepared::new(input.as_ref(), options)?;
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
        let mut this = FftJob {
            d: Description {
                format: FORMAT,
                token: new_token(),
                input: p.input.show(),
                output: output.show(),
                work_dir: work.show(),
                axis: p.axis,
                norm: p.norm,
                output_type: p.output,
                axis_name: p.axis_name.clone(),
                memory_budget: options.memory_budget,
                data_type: p.array.data_type(),
                shape: p.shape.clone(),
                input_chunks: p.array.chunk_shape().to_vec(),
                plan: p.plan.clone(),
                output_chunks: p.out_chunks.clone(),
                max_read: p.budgets.block / 4,
                stages,
            },
            storage: storage.clone(),
            input: p.input.clone(),
            output,
            work,
        };
        let found = this.read_description().ok();
        let same = found.as_ref().is_some_and(|f| f.same_job(&this.d));
        if same && !options.overwrite && this.output.join("zarr.json").exists()? {
            // The same job, unfinished: the arrays' metadata is written again (identical) in
            // case the crash came before it was.
            if let Some(f) = found {
                this.d.token = f.token;
            }
            this.create_arrays(&p)?;
            let done = (0..this.d.stages.len())
                .map(|s| this.done_in(s))
                .sum::<Result<u64, FftError>>()?;
            return Ok((this, JobStart::Resumed { done }));
        }
        // The same job whose output was removed starts over.
        if found.is_some() && !same && !options.overwrite {
            let (from, to) = found
                .as_ref()
                .map_or(("?", "?"), |f| (f.input.as_str(), f.output.as_str()));
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} holds another transform's state (from {from} to {to}); \
                 remove it, choose another work directory, or overwrite",
                this.d.work_dir,
            )));
        }
        if !same && !this.output.is_empty()? {
            if !options.overwrite {
                return Err(FftError::InvalidArgument(format!(
                    "the output {} exists; pass overwrite to replace it",
                    this.d.output
                )));
            }
            this.output.remove_zarr()?;
        }
        if found.is_none() && !this.work.is_empty()? {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} exists and holds no zcrop FFT job; \
                 give an empty or new directory",
                this.d.work_dir
            )));
        }
        this.work.remove_all()?;
        this.work.make_dir()?;
        // The description first: whatever else exists is then recognised as this job's.
        this.work
            .join("job.json")
            .write(this.to_json().as_bytes())?;
        this.create_arrays(&p)?;
        Ok((this, JobStart::Created))
    }

    /// The output and temporary arrays' metadata and the marker directories.
    fn create_arrays(&self, p: &Prepared) -> Result<(), FftError> {
        p.create_output(&self.output)?;
        if matches!(self.d.plan.kind, PlanKind::FourStep(_)) {
            p.create_temps(&self.work)?;
        }
        (0..self.d.stages.len()).try_for_each(|s| self.marker_dir(s).make_dir())
    }

    /// The job's description as JSON, for [`FftJob::from_json`]: no storage options.
    ///
    /// # Panics
    ///
    /// Never: every field serialises (paths, numbers, names).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.d).expect("a job serialises")
    }

    /// A job from [`FftJob::to_json`], whose object-store URLs this process opens with
    /// `storage`.
    pub fn from_json(json: &str, storage: &StorageOptions) -> Result<FftJob, FftError> {
        let d = parse_description(json)?;
        let place = |s: &str, o: &[(String, String)]| Place::new(Path::new(s), o);
        Ok(FftJob {
            input: place(&d.input, &storage.input)?,
            output: place(&d.output, &storage.output)?,
            work: place(&d.work_dir, &storage.output)?,
            storage: storage.clone(),
            d,
        })
    }

    /// The storage options this process opens the job's URLs with.
    pub fn storage(&self) -> &StorageOptions {
        &self.storage
    }

    fn read_description(&self) -> Result<Description, FftError> {
        let place = self.work.join("job.json");
        let bytes = place
            .read()?
            .ok_or_else(|| FftError::InvalidArgument(format!("there is no {}", place.show())))?;
        let text = String::from_utf8_lossy(&bytes);
        parse_description(&text)
    }

    /// The stages, in the order they must run.
    pub fn stages(&self) -> &[StageInfo] {
        &self.d.stages
    }

    /// The output array's path or URL.
    pub fn output(&self) -> &str {
        &self.d.output
    }

    /// The work directory's path or URL.
    pub fn work_dir(&self) -> &str {
        &self.d.work_dir
    }

    /// The output's chunk shape.
    pub fn output_chunks(&self) -> &[u64] {
        &self.d.output_chunks
    }

    /// The one-process FFT's strategy name for this plan: `"in_memory"` or `"four_step"`.
    pub fn strategy(&self) -> &'static str {
        match self.d.plan.kind {
            PlanKind::InMemory { .. } => "in_memory",
            PlanKind::FourStep(_) => "four_step",
        }
    }

    fn marker_dir(&self, stage: usize) -> Place {
        self.work.join(&format!("done/{stage}"))
    }

    fn marker(&self, stage: usize, task: u64) -> Place {
        self.marker_dir(stage).join(&task.to_string())
    }

    /// Tasks of stage `stage` already done (one listing of its markers).
    pub fn done_in(&self, stage: usize) -> Result<u64, FftError> {
        let tasks = self.d.stages.get(stage).map_or(0, |s| s.tasks);
        let names = self.marker_dir(stage).names()?;
        Ok(names
            .iter()
            .filter(|n| n.parse::<u64>().is_ok_and(|t| t < tasks))
            .count() as u64)
    }

    /// Checks, in the calling process, that this job's storage is reachable: its description
    /// in the work directory is this job's, the input opens, and the work directory and the
    /// output accept files. Run it on every worker before submitting tasks.
    pub fn check_access(&self) -> Result<(), FftError> {
        let found = self.read_description().map_err(|e| {
            FftError::InvalidArgument(format!(
                "cannot read the job description in the work directory {}: {e}",
                self.d.work_dir
            ))
        })?;
        if found != self.d {
            return Err(FftError::InvalidArgument(format!(
                "the work directory {} holds another job's description",
                self.d.work_dir
            )));
        }
        open_input(&self.input, &open_options(self.d.memory_budget)?)?;
        for place in [&self.work, &self.output] {
            let probe = place.join(&format!(".zcrop-probe-{}", std::process::id()));
            probe.write(b"")?;
            probe.remove()?;
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
        let stages = &self.d.stages;
        let info = *stages.get(stage).ok_or_else(|| {
            FftError::InvalidArgument(format!(
                "stage {stage} of a job with {} stages",
                stages.len()
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
        if marker.exists()? {
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
            let (before, needed) = (self.done_in(stage - 1)?, stages[stage - 1].tasks);
            if before < needed {
                return Err(FftError::InvalidArgument(format!(
                    "stage {stage} ({}) cannot start: stage {} ({}) has {before} of {needed} \
                     tasks done",
                    info.stage.name(),
                    stage - 1,
                    stages[stage - 1].stage.name()
                )));
            }
            self.remember_complete(stage - 1);
        }
        let open = open_options(self.d.memory_budget)?;
        let input = open_input(&self.input, &open)?;
        if input.shape() != self.d.shape.as_slice() || input.data_type() != self.d.data_type {
            return Err(FftError::InvalidArgument(format!(
                "the input {} changed since the job was planned: now {:?} {}, planned {:?} {}",
                self.d.input,
                input.shape(),
                input.data_type(),
                self.d.shape,
                self.d.data_type
            )));
        }
        let ty = InType::from_name(&self.d.data_type).ok_or_else(|| {
            FftError::InvalidArgument(format!("cannot transform data type {}", self.d.data_type))
        })?;
        let c = ctx(
            &input,
            ty,
            self.d.axis,
            &self.d.plan,
            self.d.norm,
            self.d.max_read,
        );
        let in_flight = write_in_flight(self.d.memory_budget);
        let mut out = Writer::open(&self.output, self.d.output_type, in_flight)?;
        let mut temps = match self.d.plan.kind {
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
        // The marker says the chunks are stored: every write has reached the store first.
        out.finish()?;
        temps.as_ref().map_or(Ok(()), Temps::finish)?;
        marker.write(b"")?;
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

    /// A stage of this job: the work directory, the job's token (a job created again there is
    /// another job) and the stage.
    fn stage_key(&self, stage: usize) -> StageKey {
        (self.d.work_dir.clone(), self.d.token.clone(), stage)
    }

    fn open_temps(&self, z: bool, open: &zcrop_zarr::OpenOptions) -> Result<Temps, FftError> {
        let one = |name: &str| -> Result<(Writer, Array), FftError> {
            let place = self.work.join(name);
            let in_flight = write_in_flight(self.d.memory_budget);
            let w = Writer::open(&place, ComplexType::Complex128, in_flight)?;
            Ok((w, open_temp(&place, open)?))
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
        for (s, info) in self.d.stages.iter().enumerate() {
            let done = self.done_in(s)?;
            if done < info.tasks {
                return Err(FftError::InvalidArgument(format!(
                    "stage {s} ({}) has {done} of {} tasks done",
                    info.stage.name(),
                    info.tasks
                )));
            }
        }
        self.work.remove_all()
    }
}

fn parse_description(json: &str) -> Result<Description, FftError> {
    let d: Description = serde_json::from_str(json)
        .map_err(|e| FftError::InvalidArgument(format!("not an FFT job description: {e}")))?;
    if d.format != FORMAT {
        return Err(FftError::InvalidArgument(format!(
            "an FFT job description of format {} (this zcrop reads {FORMAT})",
            d.format
        )));
    }
    Ok(d)
}

/// A stage of one job, see [`FftJob::stage_key`].
type StageKey = (String, String, usize);

/// Stages this process has seen complete (a child of `fork` starts with none).
fn complete_stages() -> &'static Mutex<HashSet<StageKey>> {
    static SEEN: PerProcess<Mutex<HashSet<StageKey>>> = PerProcess::new();
    SEEN.get_or_init(|| Mutex::new(HashSet::new()))
}
