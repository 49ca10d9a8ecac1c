//! The FFT cut into tasks (`FftJob`): tasks run in any order within a stage, from several
//! threads, give the one-process FFT's output bit for bit, on local directories and on an S3
//! server; a job resumes after a crash without rerunning finished tasks; tasks out of stage
//! order, an existing output or a foreign work directory are errors.

mod common;

use std::path::Path;

use common::write_v3;
use zcrop_sampler::fft::{FftJob, JobOptions, JobStart, MIN_BUDGET, Stage, StorageOptions};
use zcrop_sampler::{ChunkedFftOptions, ComplexType, FftError, FftNorm, fft_along_axis};
use zcrop_zarr::Array;

fn input(dir: &Path, shape: &[u64], chunks: &[u64]) -> std::path::PathBuf {
    let n: u64 = shape.iter().product();
    let data: Vec<u8> = (0..n)
        .flat_map(|i| {
            let x = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as f32 / 1e4 - 800.0;
            x.to_ne_bytes()
        })
        .collect();
    write_v3(
        dir,
        "/in",
        shape,
        chunks,
        "float32",
        &data,
        Some(&["a", "b", "c"][..shape.len()]),
        serde_json::Map::new(),
    );
    dir.join("in")
}

fn all_bytes(path: &Path) -> Vec<u8> {
    let a = Array::open(path).unwrap();
    let shape = a.shape().to_vec();
    a.read_region(&vec![0; shape.len()], &shape).unwrap()
}

fn job_options(dir: &Path) -> JobOptions {
    JobOptions {
        work_dir: dir.join("work"),
        task_bytes: 1,
        max_tasks: 7,
    }
}

/// Runs every task, each stage's in reverse order, the tasks of a stage on three threads.
fn run_all(job: &FftJob) -> (u64, u64) {
    let (mut read, mut written) = (0, 0);
    for (s, info) in job.stages().iter().enumerate() {
        let reports: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..3u64)
                .map(|k| {
                    scope.spawn(move || {
                        (0..info.tasks)
                            .rev()
                            .filter(|t| t % 3 == k)
                            .map(|t| job.run_task(s, t, None).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(
            reports.iter().map(|r| r.items).sum::<u64>(),
            info.items,
            "{info:?}"
        );
        read += reports.iter().map(|r| r.read_bytes).sum::<u64>();
        written += reports.iter().map(|r| r.written_bytes).sum::<u64>();
    }
    (read, written)
}

#[test]
fn tasks_in_any_order_give_the_one_process_result() {
    for (shape, chunks, axis, budget) in [
        (vec![6u64, 300, 5], vec![4u64, 64, 3], 1usize, 8usize << 20),
        (vec![6000], vec![250], 0, MIN_BUDGET),
        (vec![3, 4096, 5], vec![2, 100, 3], 1, MIN_BUDGET),
        (vec![6006, 3], vec![64, 2], 0, MIN_BUDGET),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let inp = input(dir.path(), &shape, &chunks);
        let mut opts = ChunkedFftOptions::new(axis, budget);
        opts.output = ComplexType::Complex128;
        opts.norm = FftNorm::Ortho;
        opts.temp_dir = Some(dir.path().to_path_buf());
        let local = fft_along_axis(&inp, dir.path().join("local"), &opts).unwrap();
        let (job, start) = FftJob::create(
            &inp,
            dir.path().join("out"),
            &opts,
            &job_options(dir.path()),
        )
        .unwrap();
        assert_eq!(start, JobStart::Created);
        let stages: Vec<Stage> = job.stages().iter().map(|s| s.stage).collect();
        if budget == MIN_BUDGET {
            assert_eq!(&stages[..3], &[Stage::Rechunk, Stage::Columns, Stage::Rows]);
        } else {
            assert_eq!(stages, vec![Stage::Tiles]);
        }
        let (read, written) = run_all(&job);
        job.finish().unwrap();
        assert!(!dir.path().join("work").exists());
        assert_eq!(
            all_bytes(&dir.path().join("out")),
            all_bytes(&dir.path().join("local")),
            "{shape:?} along {axis}"
        );
        // The same plan moves the same bytes.
        assert_eq!(read, local.read_bytes, "{shape:?}");
        assert_eq!(written, local.output_bytes + local.temp_bytes, "{shape:?}");
        let attrs = Array::open(dir.path().join("out"))
            .unwrap()
            .attributes()
            .clone();
        assert_eq!(attrs["zcrop_fft"]["axis"], axis);
    }
}

#[test]
fn a_job_resumes_after_a_crash_and_skips_finished_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let inp = input(dir.path(), &[3, 4096, 5], &[2, 100, 3]);
    let opts = ChunkedFftOptions::new(1, MIN_BUDGET);
    let out = dir.path().join("out");
    let jo = job_options(dir.path());
    let (job, _) = FftJob::create(&inp, &out, &opts, &jo).unwrap();
    // The first stage, then half the second; then the "crash".
    for t in 0..job.stages()[0].tasks {
        job.run_task(0, t, None).unwrap();
    }
    let half = job.stages()[1].tasks / 2;
    for t in 0..half {
        job.run_task(1, t, None).unwrap();
    }
    // A task of the third stage cannot run yet.
    let e = job.run_task(2, 0, None).unwrap_err().to_string();
    assert!(e.contains("cannot start"), "{e}");
    drop(job);
    let (job, start) = FftJob::create(&inp, &out, &opts, &jo).unwrap();
    assert_eq!(
        start,
        JobStart::Resumed {
            done: job.stages()[0].tasks + half
        }
    );
    assert!(job.run_task(0, 0, None).unwrap().skipped);
    assert!(job.run_task(1, 0, None).unwrap().skipped);
    // A task whose marker is lost runs again and writes the same chunks.
    std::fs::remove_file(Path::new(job.work_dir()).join("done/1/0")).unwrap();
    assert!(!job.run_task(1, 0, None).unwrap().skipped);
    run_all(&job);
    job.finish().unwrap();
    let mut o = opts.clone();
    o.temp_dir = Some(dir.path().to_path_buf());
    fft_along_axis(&inp, dir.path().join("local"), &o).unwrap();
    assert_eq!(all_bytes(&out), all_bytes(&dir.path().join("local")));
}

#[test]
fn existing_outputs_and_foreign_work_directories_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let inp = input(dir.path(), &[64, 3], &[16, 3]);
    let opts = ChunkedFftOptions::new(0, 8 << 20);
    let out = dir.path().join("out");
    let jo = job_options(dir.path());
    let (job, _) = FftJob::create(&inp, &out, &opts, &jo).unwrap();
    run_all(&job);
    job.finish().unwrap();
    // A finished output is not overwritten unless asked.
    let e = FftJob::create(&inp, &out, &opts, &jo).unwrap_err();
    assert!(
        matches!(&e, FftError::InvalidArgument(m) if m.contains("exists")),
        "{e}"
    );
    let mut over = opts.clone();
    over.overwrite = true;
    let (job, start) = FftJob::create(&inp, &out, &over, &jo).unwrap();
    assert_eq!(start, JobStart::Created);
    // Another transform into the same work directory is refused while this one is unfinished.
    let e = FftJob::create(&inp, dir.path().join("other"), &opts, &jo).unwrap_err();
    assert!(e.to_string().contains("another transform"), "{e}");
    // overwrite never deletes a directory that is not a Zarr array.
    drop(job);
    let not_zarr = dir.path().join("precious");
    std::fs::create_dir_all(&not_zarr).unwrap();
    std::fs::write(not_zarr.join("notes.txt"), b"keep").unwrap();
    let mut jo2 = jo.clone();
    jo2.work_dir = dir.path().join("work2");
    let e = FftJob::create(&inp, &not_zarr, &over, &jo2).unwrap_err();
    assert!(e.to_string().contains("not a Zarr array"), "{e}");
    assert!(not_zarr.join("notes.txt").exists());
    // A work directory inside the output is refused.
    let mut jo3 = jo.clone();
    jo3.work_dir = dir.path().join("new-out/work");
    let e = FftJob::create(&inp, dir.path().join("new-out"), &opts, &jo3).unwrap_err();
    assert!(e.to_string().contains("contain each other"), "{e}");
    // Out-of-range tasks and a description that is not one are errors.
    let (job, _) = FftJob::create(&inp, dir.path().join("o4"), &over, &jo2).unwrap();
    assert!(job.run_task(9, 0, None).is_err());
    assert!(job.run_task(0, 1 << 40, None).is_err());
    assert!(FftJob::from_json("{}", &StorageOptions::default()).is_err());
    let back = FftJob::from_json(&job.to_json(), &StorageOptions::default()).unwrap();
    assert_eq!(back, job);
    job.check_access().unwrap();
    // finish() refuses while tasks are missing.
    assert!(job.finish().unwrap_err().to_string().contains("tasks done"));
}

/// The same job with its input, output and work directory on an S3 server (moto on loopback):
/// the same bytes as the one-process FFT on local files, nothing left of the work directory,
/// and a description that names no credentials.
#[test]
fn a_job_on_an_object_store_gives_the_local_result() {
    let Some(moto) = zcrop_fixtures::s3::Moto::shared() else {
        return;
    };
    let storage = StorageOptions::all(moto.storage_options());
    for (case, (shape, chunks, axis, budget)) in [
        (vec![6u64, 300, 5], vec![4u64, 64, 3], 1usize, 8usize << 20),
        (vec![2, 4096, 2], vec![2, 100, 2], 1, MIN_BUDGET),
        (vec![6006, 3], vec![64, 2], 0, MIN_BUDGET),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let inp = input(dir.path(), &shape, &chunks);
        let bucket = format!("fft-job-{case}");
        moto.create_bucket(&bucket);
        moto.upload_dir(&bucket, "data/in", &inp);
        let mut opts = ChunkedFftOptions::new(axis, budget);
        opts.temp_dir = Some(dir.path().to_path_buf());
        let local = fft_along_axis(&inp, dir.path().join("local"), &opts).unwrap();
        opts.storage = storage.clone();
        let jo = JobOptions {
            work_dir: format!("s3://{bucket}/work").into(),
            ..job_options(dir.path())
        };
        let out = format!("s3://{bucket}/out.zarr");
        let (job, start) =
            FftJob::create(format!("s3://{bucket}/data/in"), &out, &opts, &jo).unwrap();
        assert_eq!(start, JobStart::Created);
        let json = job.to_json();
        assert!(!json.contains("testing"), "credentials in {json}");
        // Another process gets the description and its own storage options.
        let job = FftJob::from_json(&json, &storage).unwrap();
        job.check_access().unwrap();
        let (read, written) = run_all(&job);
        job.finish().unwrap();
        assert_eq!(read, local.read_bytes, "{shape:?}");
        assert_eq!(written, local.output_bytes + local.temp_bytes, "{shape:?}");
        let listed = zcrop_io::ObjectEngine::open(
            &format!("s3://{bucket}"),
            &storage.output,
            zcrop_io::ObjectConfig::default(),
        )
        .unwrap()
        .list(Path::new("work"))
        .unwrap();
        assert!(listed.is_empty(), "left in the work directory: {listed:?}");
        let remote_options = zcrop_zarr::OpenOptions {
            storage_options: storage.output.clone(),
            ..zcrop_zarr::OpenOptions::default()
        };
        let remote = Array::open_with(&out, &remote_options).unwrap();
        assert_eq!(remote.shape(), shape.as_slice());
        assert_eq!(
            remote.read_region(&vec![0; shape.len()], &shape).unwrap(),
            all_bytes(&dir.path().join("local")),
            "{shape:?} along {axis}"
        );
        // The one-process FFT reads and writes URLs too (its temporaries stay local).
        let one = format!("s3://{bucket}/one.zarr");
        fft_along_axis(format!("s3://{bucket}/data/in"), &one, &opts).unwrap();
        let one = Array::open_with(&one, &remote_options).unwrap();
        assert_eq!(
            one.read_region(&vec![0; shape.len()], &shape).unwrap(),
            all_bytes(&dir.path().join("local"))
        );
        // A finished output is refused without overwrite, as on a filesystem.
        let e = FftJob::create(format!("s3://{bucket}/data/in"), &out, &opts, &jo).unwrap_err();
        assert!(e.to_string().contains("exists"), "{e}");
    }
}
