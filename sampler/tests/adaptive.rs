//! The loader's adaptive depth against a store 25 ms away (zcrop-cloudsim, in-process): a
//! consumer that waits gets more batches read ahead, and the batches are those of a loader
//! with a fixed depth.

use std::net::SocketAddr;

use zcrop_cloudsim::{Server, Shaping};
use zcrop_fixtures::s3::options_for;
use zcrop_sampler::{Loader, LoaderConfig, PinOptions, SampleSpec, Sampler, Source};

#[test]
fn a_waiting_consumer_gets_more_batches_in_flight() {
    let f = zcrop_fixtures::get("v3_workload_4d_u2");
    let dir = tempfile::tempdir().unwrap();
    zcrop_fixtures::copy_tree(&f.store_path(), &dir.path().join("bucket").join("store"));
    let shaping = Shaping {
        latency_ms: 25.0,
        ..Shaping::default()
    };
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::start(dir.path(), addr, shaping, 2).unwrap();
    let url = format!("s3://bucket/store/{}", f.array_path)
        .trim_end_matches('/')
        .to_string();
    let options = zcrop_zarr::OpenOptions {
        storage_options: options_for(&server.endpoint()),
        ..zcrop_zarr::OpenOptions::default()
    };
    let spec = || {
        SampleSpec::new(["t", "y", "x"])
            .source(Source::open_with("s", &url, [1, 3, 16, 16], &options).unwrap())
            .seed(9)
            .batch_size(2)
    };
    let steps = 64;
    let config = |max: Option<usize>| LoaderConfig {
        end_step: Some(steps),
        prefetch: 2,
        prefetch_max: max,
        pin: PinOptions::pageable(),
        ..LoaderConfig::default()
    };
    // One loader after the other: a consumer's own time is what it does between batches,
    // and waiting on a second loader would cap the first at that one's rate.
    let read = |loader: &mut Loader| -> Vec<Vec<u8>> {
        (0..steps)
            .map(|step| {
                let batch = loader.next_batch().unwrap();
                assert_eq!(batch.step(), step);
                batch.source(0).to_vec()
            })
            .collect()
    };
    let mut adaptive = Loader::new(Sampler::new(spec()).unwrap(), config(Some(12))).unwrap();
    let mut fixed = Loader::new(Sampler::new(spec()).unwrap(), config(None)).unwrap();
    let (a, b) = (read(&mut adaptive), read(&mut fixed));
    for (step, (a, b)) in a.iter().zip(&b).enumerate() {
        assert_eq!(a, b, "step {step}");
    }
    assert!(
        adaptive.depth() > 2,
        "the depth stayed at {}",
        adaptive.depth()
    );
    assert!(adaptive.status().buffers > 3);
    assert_eq!(fixed.depth(), 2);
}
