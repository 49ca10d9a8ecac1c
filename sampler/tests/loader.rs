//! The pipeline: error propagation, back-pressure, shutdown, pinned-buffer reporting.

mod common;

use std::time::{Duration, Instant};

use common::{fixture, three_sources};
use zcrop_sampler::{
    Loader, LoaderConfig, PinOptions, SampleSpec, Sampler, SamplerError, Shard, Source,
};
use zcrop_zarr::{Array, ZarrError};

/// A batch whose crops touch a corrupt shard fails with its step and source; every other batch
/// arrives intact, before and after it.
#[test]
fn a_failed_batch_names_its_step_and_source_and_the_pipeline_goes_on() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("w.zarr");
    zcrop_fixtures::copy_tree(&f.store_path(), &store);
    // Shard (1, 0, 1, 1) holds t 4..6, y 64..70, x 64..90; garbage over its index (at the
    // end) fails its crc32c.
    let shard = store.join("c/1/0/1/1");
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n - 40..] {
        *b ^= 0x5a;
    }
    std::fs::write(&shard, bytes).unwrap();

    let crop = [2u64, 3, 16, 16];
    let spec = |array: Array| {
        SampleSpec::new(["t", "y", "x"])
            .source(
                Source::new("good", fixture("v3_hierarchy__images__labels").0, [4, 4]).dims([
                    zcrop_sampler::Dim::along("y").scale(1, 4),
                    zcrop_sampler::Dim::along("x").scale(1, 4),
                ]),
            )
            .source(Source::new("workload", array, crop))
            .seed(4)
            .batch_size(3)
    };
    let broken = Sampler::new(spec(Array::open(&store).unwrap())).unwrap();
    let intact = Sampler::new(spec(Array::open(f.store_path()).unwrap())).unwrap();
    let touches = |o: &[u64]| o[0] + crop[0] > 4 && o[2] + crop[2] > 64 && o[3] + crop[3] > 64;
    let steps = 40u64;
    let config = LoaderConfig {
        end_step: Some(steps),
        prefetch: 3,
        workers: 2,
        pin: PinOptions::pageable(),
        ..LoaderConfig::default()
    };
    let (mut failed, mut ok) = (0, 0);
    for (step, got) in (0..steps).zip(Loader::new(broken.clone(), config).unwrap()) {
        let plan = broken.plan(step, Shard::SINGLE).unwrap();
        let bad = (0..plan.len()).any(|i| touches(&common::unsigned(plan.origin(1, i))));
        match got {
            Ok(batch) => {
                assert!(!bad, "step {step} touches the corrupt shard but read fine");
                assert_eq!(batch.step(), step);
                let want = intact
                    .read(&intact.plan(step, Shard::SINGLE).unwrap())
                    .unwrap();
                assert_eq!(batch.source(0), want[0].as_slice());
                assert_eq!(batch.source(1), want[1].as_slice());
                ok += 1;
            }
            Err(e) => {
                assert!(
                    bad,
                    "step {step} failed without touching the corrupt shard: {e}"
                );
                match &e {
                    SamplerError::Read {
                        step: s,
                        source_index: 1,
                        source_name,
                        error: ZarrError::ShardIndex { at, .. },
                    } => {
                        assert_eq!(*s, step);
                        assert_eq!(source_name, "workload");
                        assert_eq!(at.key, "c/1/0/1/1");
                    }
                    other => panic!("step {step}: unexpected error {other:?}"),
                }
                let msg = e.to_string();
                assert!(
                    msg.contains(&format!("step {step}")) && msg.contains("workload"),
                    "{msg}"
                );
                failed += 1;
            }
        }
    }
    assert!(
        failed > 0 && ok > 0,
        "{failed} failed, {ok} ok: the test needs both"
    );
}

/// The consumer holding every buffer gets an error instead of a deadlock; dropping a batch lets
/// the pipeline go on. Workers never run more than `prefetch` batches ahead.
#[test]
fn buffers_are_reused_only_after_release_with_back_pressure() {
    let sampler = Sampler::new(three_sources().batch_size(2)).unwrap();
    let config = LoaderConfig {
        prefetch: 1,
        buffers: 2,
        pin: PinOptions::pageable(),
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(sampler.clone(), config).unwrap();
    let a = loader.next_batch().unwrap();
    let b = loader.next_batch().unwrap();
    let a_bytes = a.source(0).to_vec();
    match loader.next_batch() {
        Err(SamplerError::AllBuffersHeld { buffers: 2 }) => {}
        other => panic!("{other:?}"),
    }
    // Held batches are not overwritten while held.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(a.source(0), a_bytes.as_slice());
    drop(a);
    let c = loader.next_batch().unwrap();
    assert_eq!((b.step(), c.step()), (1, 2));
    drop((b, c));
    // With nobody consuming, the workers stop at `prefetch` batches ahead.
    std::thread::sleep(Duration::from_millis(200));
    let s = loader.status();
    assert!(s.ready + s.in_flight <= 1, "{s:?}");
    assert_eq!(s.ready + s.in_flight + s.free_buffers, 2, "{s:?}");
}

/// Dropping the loader with reads in flight stops promptly; a batch still held stays valid.
#[test]
fn dropping_the_loader_shuts_down_cleanly() {
    let sampler = Sampler::new(three_sources().batch_size(64)).unwrap();
    let want = sampler
        .read(&sampler.plan(0, Shard::SINGLE).unwrap())
        .unwrap();
    let config = LoaderConfig {
        prefetch: 6,
        workers: 3,
        pin: PinOptions::pageable(),
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(sampler, config).unwrap();
    let held = loader.next_batch().unwrap();
    let t = Instant::now();
    drop(loader);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert_eq!(held.step(), 0);
    assert_eq!(held.source(0), want[0].as_slice());
    drop(held);
}

/// Batches say whether their memory is pinned, and why not.
#[test]
fn pin_state_is_reported() {
    let sampler = Sampler::new(three_sources().batch_size(2)).unwrap();
    let pageable = Loader::new(
        sampler.clone(),
        LoaderConfig {
            pin: PinOptions::pageable(),
            ..LoaderConfig::default()
        },
    )
    .unwrap();
    let s = pageable.pin_state().clone();
    assert!(!s.page_locked && !s.cuda_registered);
    assert!(s.reason.unwrap().contains("disabled"));

    let mut pinned = Loader::new(sampler, LoaderConfig::default()).unwrap();
    let s = pinned.pin_state().clone();
    let cuda = zcrop_sampler::pinned::CudaRuntime::system();
    assert_eq!(s.cuda_registered, cuda.is_ok(), "{s:?}");
    if let Err(why) = cuda {
        assert!(s.reason.as_deref().unwrap().contains(why.as_str()), "{s:?}");
    }
    if !s.page_locked {
        assert!(s.reason.as_deref().unwrap().contains("mlock"), "{s:?}");
    }
    let b = pinned.next_batch().unwrap();
    assert_eq!(b.pin_state().page_locked, s.page_locked);
    assert_eq!(b.as_ptr(0) as usize % zcrop_sampler::pinned::page_size(), 0);
    assert_eq!(b.as_ptr(1) as usize % zcrop_sampler::pinned::page_size(), 0);
    assert!(b.typed::<u16>(0).is_some());
    assert!(b.typed::<f32>(2).is_some());
    assert_eq!(b.shape(0), vec![2, 2, 3, 16, 16]);
    assert_eq!(b.dtype(2), "float32");
    assert_eq!(b.source_by_name("coarse"), Some(b.source(1)));
    assert!(b.read_time() > Duration::ZERO);
    assert!(b.stats().chunks > 0);
}

/// The Python bindings move loaders and batches between threads.
#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Loader>();
    check::<zcrop_sampler::Batch>();
    check::<Sampler>();
    check::<zcrop_sampler::BatchPlan>();
    check::<zcrop_sampler::PinnedBuffer>();
    check::<SamplerError>();
}
