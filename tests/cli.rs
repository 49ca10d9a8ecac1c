//! The `zcrop` binary: help, version, exit codes, and no panic on a closed pipe.

use std::process::{Command, Stdio};

fn zcrop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_zcrop"))
}

#[test]
fn version_and_help_succeed() {
    let out = zcrop().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("zcrop {}", env!("CARGO_PKG_VERSION"))
    );
    let out = zcrop().arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: zcrop"));
}

#[test]
fn bad_usage_exits_2_with_a_clear_message() {
    let out = zcrop().arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unexpected argument '--no-such-flag'"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn closed_stdout_is_not_a_panic() {
    let mut child = zcrop()
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away, like `zcrop --help | head -0`
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
}

/// A fixture store of this checkout (the run-time `CARGO_MANIFEST_DIR`, not the one baked in
/// when a shared target directory last built this binary).
fn fixture(name: &str) -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(
            || std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
            std::path::PathBuf::from,
        )
        .join("fixtures/data")
        .join(name)
}

fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn info_describes_arrays_and_groups() {
    let out = zcrop()
        .args(["info"])
        .arg(fixture("v3_workload_4d_u2.zarr"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for want in [
        "shape        [6, 3, 70, 90]",
        "shards       [4, 3, 64, 64]",
        "8 of 8 shards",
        "compression ratio",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let v = json_of(
        &zcrop()
            .args(["info", "--json"])
            .arg(fixture("v2_hierarchy_consolidated.zarr"))
            .output()
            .unwrap(),
    );
    assert_eq!(v["name"], "/");
    assert!(v["groups"].as_array().is_some_and(|g| !g.is_empty()), "{v}");
}

/// A Zarr v2 group as xarray writes one: `_ARRAY_DIMENSIONS`, a time coordinate with CF units,
/// a packed variable, and a variable-length string variable zcrop cannot read.
fn xarray_like_store(dir: &std::path::Path) {
    let write = |rel: &str, body: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    write(".zgroup", br#"{"zarr_format": 2}"#);
    let zarray = |dtype: &str, n: u64| {
        format!(
            r#"{{"zarr_format": 2, "shape": [{n}], "chunks": [{n}], "dtype": "{dtype}",
               "compressor": null, "filters": null, "fill_value": null, "order": "C"}}"#
        )
    };
    write("time/.zarray", zarray("<i8", 4).as_bytes());
    write(
        "time/.zattrs",
        br#"{"_ARRAY_DIMENSIONS": ["time"], "units": "hours since 2020-01-01", "calendar": "standard"}"#,
    );
    let hours: Vec<u8> = [0i64, 6, 12, 18]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect();
    write("time/0", &hours);
    write("q/.zarray", zarray("<i2", 4).as_bytes());
    write(
        "q/.zattrs",
        br#"{"_ARRAY_DIMENSIONS": ["time"], "scale_factor": 0.001, "add_offset": 1.5}"#,
    );
    write(
        "name/.zarray",
        br#"{"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": "|O", "compressor": null,
            "filters": [{"id": "vlen-utf8"}], "fill_value": null, "order": "C"}"#,
    );
    write("name/.zattrs", br#"{"_ARRAY_DIMENSIONS": ["time"]}"#);
    write(
        "rec/.zarray",
        br#"{"zarr_format": 2, "shape": [4], "chunks": [4], "dtype": [["a", "<i4"], ["b", "<f4"]],
            "compressor": null, "filters": null, "fill_value": null, "order": "C"}"#,
    );
    write("rec/.zattrs", br#"{"_ARRAY_DIMENSIONS": ["time"]}"#);
}

#[test]
fn info_shows_dimensions_coordinates_cf_and_unreadable_members() {
    let dir = tempfile::tempdir().unwrap();
    xarray_like_store(dir.path());
    let out = zcrop().args(["info"]).arg(dir.path()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "shape        [4] (time)",
        "values       0 .. 18 hours since 2020-01-01 (4 values)",
        r#"cf           units="hours since 2020-01-01" calendar="standard""#,
        "cf           scale_factor=0.001 add_offset=1.5",
        "rec (cannot be read: ",
        "dtype        string (|O)",
        "size         0 B on disk (variable-length elements)",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    let out = zcrop()
        .args(["info"])
        .arg(dir.path().join("time"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or_default();
    assert!(first.ends_with("time (array, Zarr v2)"), "{text}");
}

/// Runs `zcrop` with `args`, checks that it fails with exit code 1 (an error, not bad usage),
/// and returns what it printed on stderr.
fn fails<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let out = zcrop().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}

/// [`fails`] with the 4-d workload fixture appended to `args`.
fn fails_on_workload(args: &[&str]) -> String {
    let fixture = fixture("v3_workload_4d_u2.zarr");
    fails(
        args.iter()
            .map(std::ffi::OsStr::new)
            .chain([fixture.as_os_str()]),
    )
}

#[test]
fn info_on_a_missing_path_fails_with_one_line() {
    let err = fails(["info", "/definitely/not/here.zarr"]);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no Zarr array or group"), "{err}");
}

/// A small `zcrop bench --json` run over the 4-d workload fixture (path or URL appended).
const SMALL_BENCH: [&str; 8] = [
    "bench",
    "--json",
    "--crop",
    "2,3,20,20",
    "--batch-size",
    "4",
    "--batches",
    "3",
];

#[test]
fn bench_reports_stable_json_fields() {
    let v = json_of(
        &zcrop()
            .args(SMALL_BENCH)
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    for key in [
        "backend",
        "path",
        "crop_shape",
        "batch_size",
        "crops_per_s",
        "output_gbps",
        "read_gbps",
        "chunks_per_s",
        "decoded_bytes_per_output_byte",
        "last_needed_bytes_per_output_byte",
        "p50_ms",
        "p99_ms",
        "cold",
    ] {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["batches"], 3);
    assert_eq!(v["crop_shape"], serde_json::json!([2, 3, 20, 20]));
    assert!(v["crops_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["single_core_chunks_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["parallel_decode_chunks_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["memory_decode_chunks_per_s"].as_f64().unwrap() > 0.0);
    // Under a second of reading: the limits are timed after the batches, 0.7 s each.
    assert_eq!(v["decode_probe_slices_between"], 0, "{v}");
    assert!(v["decode_probe_seconds"].as_f64().unwrap() >= 0.7, "{v}");
    // The from-memory sample outgrows the CPU cache (this fixture's chunks repeat in it, but
    // every one is a copy of its own).
    let (sample, llc) = (
        v["memory_decode_sample_bytes"].as_u64().unwrap(),
        v["last_level_cache_bytes"].as_u64().unwrap(),
    );
    assert!(llc > 0 && sample >= 2 * llc, "{v}");
    let share = v["decoded_share_of_chunks"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 1.0, "{v}");
    assert!(
        v["last_needed_bytes_per_output_byte"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    // A warm run of a local store reads all of it first.
    let store_bytes = tree_bytes(&fixture("v3_workload_4d_u2.zarr"));
    assert!(store_bytes > 0);
    assert_eq!(v["prewarmed_bytes"], store_bytes, "{v}");
    assert!(v["prewarm_note"].is_null(), "{v}");
}

#[test]
fn bench_reads_batches_at_once_as_it_reads_them_one_by_one() {
    let run = |batches: &str, in_flight: &str| {
        json_of(
            &zcrop()
                .args(&SMALL_BENCH[..6])
                .args([
                    "--batches",
                    batches,
                    "--warmup",
                    "0",
                    "--in-flight",
                    in_flight,
                    // A cache would serve the batches read together differently.
                    "--chunk-cache",
                    "0",
                ])
                .arg(fixture("v3_workload_4d_u2.zarr"))
                .output()
                .unwrap(),
        )
    };
    // The same four batches of crops, one by one and two at a time.
    let (one, two) = (run("4", "1"), run("4", "2"));
    assert_eq!(one["in_flight"], 1, "{one}");
    assert_eq!(two["in_flight"], 2, "{two}");
    assert_eq!(one["batches"], 4, "{one}");
    assert_eq!(two["batches"], 4, "{two}");
    for key in ["chunks", "chunks_decoded", "bytes_decoded", "output_bytes"] {
        assert_eq!(one["totals"][key], two["totals"][key], "{key}: {one} {two}");
    }
    // Batches are read a whole number of times `--in-flight` at once.
    assert_eq!(run("3", "2")["batches"], 4);
    let err = fails_on_workload(&["bench", "--batches", "1", "--in-flight", "0"]);
    assert!(err.contains("--in-flight"), "{err}");
}

#[test]
fn bench_times_its_decode_limits_between_the_batches() {
    let v = json_of(
        &zcrop()
            .args(&SMALL_BENCH[..6])
            .args(["--duration", "2.5"])
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    // A slice of each probe after every second of reading (the last one may fall just
    // after 2.5 s, or leave a slice for the end).
    let slices = v["decode_probe_slices_between"].as_u64().unwrap();
    assert!((2..=3).contains(&slices), "{v}");
    assert!(v["seconds"].as_f64().unwrap() >= 2.5, "{v}");
    assert!(v["decode_probe_seconds"].as_f64().unwrap() >= 0.7, "{v}");
    assert!(v["single_core_chunks_per_s"].as_f64().unwrap() > 0.0, "{v}");
}

/// Bytes of the files under `dir`.
fn tree_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                tree_bytes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

#[test]
fn bench_of_an_array_in_a_group_pre_reads_that_array_only() {
    let group = fixture("v3_hierarchy.zarr");
    let v = json_of(
        &zcrop()
            .args([
                "bench",
                "--json",
                "--crop",
                "2,10,10",
                "--batch-size",
                "2",
                "--batches",
                "2",
                "--array",
                "images/raw",
            ])
            .arg(&group)
            .output()
            .unwrap(),
    );
    let array_bytes = tree_bytes(&group.join("images/raw"));
    assert!(array_bytes < tree_bytes(&group));
    assert_eq!(v["prewarmed_bytes"], array_bytes, "{v}");
}

#[test]
fn bench_without_prewarm_says_so() {
    let v = json_of(
        &zcrop()
            .args(SMALL_BENCH)
            .arg("--no-prewarm")
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    assert!(v["prewarmed_bytes"].is_null(), "{v}");
    assert_eq!(v["prewarm_note"], "not asked to");
    let text = String::from_utf8(
        zcrop()
            .args(&SMALL_BENCH[..1])
            .args(&SMALL_BENCH[2..])
            .arg("--no-prewarm")
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        text.contains("warm after the warm-up only (not pre-read: not asked to)"),
        "{text}"
    );
}

#[test]
fn bench_with_mapped_files_reports_it() {
    let v = json_of(
        &zcrop()
            .args([
                "bench",
                "--json",
                "--mmap",
                "--crop",
                "2,3,20,20",
                "--batches",
                "2",
            ])
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    assert_eq!(v["map_files"], "always");
    // Every chunk read of the fixture (small files, which `cached` would not map) is mapped.
    assert!(v["mapped_read_share"].as_f64().unwrap() > 0.5, "{v}");
    assert!(v["totals"]["chunks_decoded"].as_u64().unwrap() > 0);
    assert!(v["read_gbps"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_rejects_a_crop_that_does_not_fit() {
    let err = fails_on_workload(&["bench", "--crop", "2,3,200,20", "--batches", "1"]);
    assert!(err.contains("does not fit"), "{err}");
}

#[test]
fn bench_fits_its_default_crop_to_the_array_and_says_so() {
    // The workload fixture is (6, 3, 70, 90): the default (4, 12, 128, 128) does not fit.
    let out = zcrop()
        .args(["bench", "--json", "--batch-size", "2", "--batches", "1"])
        .arg(fixture("v3_workload_4d_u2.zarr"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("crop [4, 3, 70, 90]: the default [4, 12, 128, 128] fitted"),
        "{err}"
    );
    assert_eq!(
        json_of(&out)["crop_shape"],
        serde_json::json!([4, 3, 70, 90])
    );
}

#[test]
fn bench_loader_reports_both_loops() {
    let v = json_of(
        &zcrop()
            .args([
                "bench",
                "loader",
                "--json",
                "--crop",
                "2,3,16,16",
                "--batch-size",
                "3",
                "--batches",
                "4",
                "--rounds",
                "1",
                "--to-f32",
            ])
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    for key in [
        "direct_batches_per_s",
        "loader_batches_per_s",
        "direct_gbps",
        "loader_gbps",
        "time_ratio",
        "page_locked",
        "cuda_registered",
    ] {
        assert!(v.get(key).is_some(), "no {key} in {v}");
    }
    assert_eq!(v["batches"], 4);
    assert_eq!(v["batch_size"], 3);
    assert!(v["loader_batches_per_s"].as_f64().unwrap() > 0.0);
    assert!(v["direct_batches_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_loader_rejects_bad_crops() {
    for (crop, want) in [("2,9,16,16", "does not fit"), ("2,3,16", "4 numbers")] {
        let err = fails_on_workload(&["bench", "loader", "--crop", crop]);
        assert!(
            err.contains(want) && err.trim().lines().count() == 1,
            "{crop}: {err}"
        );
    }
}

#[test]
fn bench_io_reports_stable_json_fields() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        json_of(
            &zcrop()
                .args([
                    "bench",
                    "io",
                    "--json",
                    "--file-size",
                    "4M",
                    "--reads",
                    "500",
                ])
                .args(extra)
                .arg("--data-dir")
                .arg(dir.path())
                .output()
                .unwrap(),
        )
    };
    for (backend, name) in [("uring", "io_uring"), ("portable", "portable")] {
        let v = run(&["--queue-depth", "8", "--backend", backend]);
        for key in [
            "backend",
            "block_size",
            "queue_depth",
            "reads_per_s",
            "gbps",
            "cold",
        ] {
            assert!(v.get(key).is_some(), "no {key} in {v}");
        }
        assert_eq!(v["reads"], 500);
        assert_eq!(v["backend"], name);
        // The file was just read through (pre-read), so its ranges are served from a mapping.
        let mapped = v["mapped_reads"].as_u64().expect("mapped_reads");
        assert!(mapped > 0, "{v}");
    }
    assert_eq!(run(&["--mmap=never"])["mapped_reads"], 0);
}

/// `zcrop bench s3://...` against a moto server on loopback: the same crops as the local run
/// (same seed) need the same chunks and bytes, and no more GETs reach the wire than the engine
/// planned.
#[test]
fn bench_reads_an_s3_url_like_the_local_path() {
    let Some(moto) = zcrop_fixtures::s3::Moto::shared() else {
        return;
    };
    moto.create_bucket("zcrop-cli");
    moto.upload_dir("zcrop-cli", "w.zarr", &fixture("v3_workload_4d_u2.zarr"));
    let seed = ["--seed", "5"];
    let local = json_of(
        &zcrop()
            .args(SMALL_BENCH)
            .args(seed)
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    let mut remote = zcrop();
    remote
        .args(SMALL_BENCH)
        .args(seed)
        .arg("s3://zcrop-cli/w.zarr");
    for (k, v) in moto.storage_options() {
        remote.arg("--storage-option").arg(format!("{k}={v}"));
    }
    let remote = json_of(&remote.output().unwrap());
    assert_eq!(remote["backend"], "object_store");
    assert_eq!(remote["path"], "s3://zcrop-cli/w.zarr");
    assert_eq!(
        remote["totals"], local["totals"],
        "the same chunks and bytes"
    );
    let o = &remote["object"];
    assert_eq!(o["store"], "s3://zcrop-cli");
    let gets = o["gets"].as_u64().unwrap();
    assert!(gets > 0, "{o}");
    // Every GET went out once, or twice where its answer was late (hedged).
    assert_eq!(
        o["http_gets"].as_u64(),
        Some(gets + o["hedged"].as_u64().unwrap()),
        "{o}"
    );
    assert_eq!(o["http_failures"].as_u64(), Some(0), "{o}");
    assert!(local["object"].is_null());

    let mut info = zcrop();
    info.args(["info", "--json", "s3://zcrop-cli/w.zarr"]);
    for (k, v) in moto.storage_options() {
        info.arg("--storage-option").arg(format!("{k}={v}"));
    }
    let remote = json_of(&info.output().unwrap());
    let local = json_of(
        &zcrop()
            .args(["info", "--json"])
            .arg(fixture("v3_workload_4d_u2.zarr"))
            .output()
            .unwrap(),
    );
    assert_eq!(remote["shape"], local["shape"]);
    for key in [
        "storage_chunks_present",
        "inner_chunks_present",
        "stored_bytes",
    ] {
        assert_eq!(remote[key], local[key], "{key}: {remote}");
    }
}

#[test]
fn bench_refuses_storage_options_for_a_local_path() {
    let err = fails_on_workload(&["bench", "--batches", "1", "--storage-option", "anon=true"]);
    assert!(err.contains("--storage-option applies to URLs"), "{err}");
}
