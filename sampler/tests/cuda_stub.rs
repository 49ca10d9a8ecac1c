//! The CUDA host-registration path, against a stand-in CUDA runtime.
//!
//! There is no GPU on the test machines, so this builds a tiny shared library with the four
//! entry points zcrop loads from `libcudart` (`cudaGetDeviceCount`, `cudaHostRegister`,
//! `cudaHostUnregister`, `cudaGetErrorString`), which logs every call to a file, and points
//! `ZCROP_CUDART` at it in a child process (this binary, re-run; the runtime is looked up once
//! per process). It checks what zcrop does with a runtime: it registers every ring buffer, whole
//! and page-aligned, as portable pinned memory (every batch's data lies in one), unregisters the same pointer on drop, and
//! reports a refused registration or a runtime without devices as a reason, not an error. What
//! the real runtime does with the registration (DMA from pinned pages) is CUDA's part.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use zcrop_sampler::pinned::{CudaRuntime, PinOptions, PinnedBuffer, page_size};
use zcrop_sampler::{Loader, LoaderConfig, Sampler};

const CHILD_ENV: &str = "ZCROP_CUDA_STUB_CHILD";

const STUB_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void note(const char *what, void *p, size_t n, unsigned f) {
    const char *path = getenv("STUB_LOG");
    if (!path) return;
    FILE *out = fopen(path, "a");
    if (!out) return;
    fprintf(out, "%s %lu %lu %u\n", what, (unsigned long)p, (unsigned long)n, f);
    fclose(out);
}

int cudaGetDeviceCount(int *count) {
    const char *d = getenv("STUB_DEVICES");
    *count = d ? atoi(d) : 1;
    return 0;
}

int cudaHostRegister(void *p, size_t n, unsigned flags) {
    if (getenv("STUB_REFUSE")) return 2; /* cudaErrorMemoryAllocation */
    note("register", p, n, flags);
    return 0;
}

int cudaHostUnregister(void *p) {
    note("unregister", p, 0, 0);
    return 0;
}

const char *cudaGetErrorString(int rc) {
    return rc == 2 ? "out of memory (stub)" : "stub error";
}
"#;

/// Builds the stand-in runtime into `dir`.
fn build_stub(dir: &Path) -> PathBuf {
    let src = dir.join("cudart_stub.c");
    let lib = dir.join("libcudart_stub.so");
    std::fs::write(&src, STUB_C).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("this test needs a C compiler ({cc}): {e}"));
    assert!(
        out.status.success(),
        "{cc} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// Runs `child` (one of the ignored tests below) with the stub as the CUDA runtime.
fn run_child(child: &str, lib: &Path, log: &Path, env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", child, "--ignored", "--nocapture"])
        .env(CHILD_ENV, "1")
        .env("ZCROP_CUDART", lib)
        .env("STUB_LOG", log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{child} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The stub's log: (call, pointer, length, flags) per line.
fn calls(log: &Path) -> Vec<(String, usize, usize, u32)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            )
        })
        .collect()
}

/// The values the child printed as `KEY=value`.
fn reported(stdout: &str, key: &str) -> Vec<usize> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().parse().unwrap())
        .collect()
}

#[test]
fn buffers_are_registered_whole_and_unregistered_on_drop() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_stub(dir.path());
    let log = dir.path().join("calls.log");
    let stdout = run_child("child_registers_a_buffer", &lib, &log, &[]);
    let ptr = reported(&stdout, "PTR");
    assert_eq!(ptr.len(), 1, "{stdout}");
    let page = page_size();
    assert_eq!(
        calls(&log),
        vec![
            ("register".to_string(), ptr[0], 4 * page, 1),
            ("unregister".to_string(), ptr[0], 0, 0),
        ],
        "one portable registration of the whole mapping, undone on drop"
    );
}

#[test]
fn every_ring_buffer_of_a_loader_is_registered_and_released() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_stub(dir.path());
    let log = dir.path().join("calls.log");
    let stdout = run_child("child_runs_a_loader", &lib, &log, &[]);
    let ptrs = reported(&stdout, "BATCH_PTR");
    assert!(!ptrs.is_empty(), "{stdout}");
    let calls = calls(&log);
    let ranges: Vec<(usize, usize)> = calls
        .iter()
        .filter(|c| c.0 == "register")
        .map(|c| (c.1, c.2))
        .collect();
    let registered: Vec<usize> = ranges.iter().map(|r| r.0).collect();
    let mut unregistered: Vec<usize> = calls
        .iter()
        .filter(|c| c.0 == "unregister")
        .map(|c| c.1)
        .collect();
    for p in &ptrs {
        assert!(
            ranges
                .iter()
                .any(|&(start, len)| (start..start + len).contains(p)),
            "batch data at {p:#x} is in no registered buffer: {ranges:?}"
        );
    }
    let mut sorted = registered.clone();
    sorted.sort_unstable();
    unregistered.sort_unstable();
    assert_eq!(sorted, unregistered, "every registration undone on drop");
    for c in calls.iter().filter(|c| c.0 == "register") {
        assert_eq!(c.1 % page_size(), 0);
        assert_eq!(c.2 % page_size(), 0);
        assert_eq!(c.3, 1, "cudaHostRegisterPortable");
    }
}

#[test]
fn a_refused_registration_or_no_device_is_a_reason_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_stub(dir.path());
    let log = dir.path().join("calls.log");
    let refused = run_child(
        "child_reports_pin_state",
        &lib,
        &log,
        &[("STUB_REFUSE", "1")],
    );
    assert!(refused.contains("REGISTERED=false"), "{refused}");
    assert!(
        refused.contains("cudaHostRegister failed: error 2 out of memory (stub)"),
        "{refused}"
    );
    let none = run_child(
        "child_reports_pin_state",
        &lib,
        &log,
        &[("STUB_DEVICES", "0")],
    );
    assert!(none.contains("REGISTERED=false"), "{none}");
    assert!(none.contains("found none"), "{none}");
    // Set but empty means not set: the usual names are tried (and found or not), not "".
    let empty = run_child(
        "child_reports_pin_state",
        &lib,
        &log,
        &[("ZCROP_CUDART", "")],
    );
    assert!(
        empty.contains("REGISTERED=true") || empty.contains("cannot load libcudart.so"),
        "{empty}"
    );
    assert!(
        calls(&log).is_empty(),
        "nothing registered: {:?}",
        calls(&log)
    );
}

fn child_only() {
    assert!(
        std::env::var_os(CHILD_ENV).is_some(),
        "run only as a child of the tests above"
    );
}

#[test]
#[ignore = "run by buffers_are_registered_whole_and_unregistered_on_drop in a child process"]
fn child_registers_a_buffer() {
    child_only();
    let rt = CudaRuntime::system().expect("the stub loads");
    assert_eq!(rt.device_count(), 1);
    let options = PinOptions {
        lock: false,
        ..PinOptions::default()
    };
    let buf = PinnedBuffer::new(3 * page_size() + 5, &options).unwrap();
    assert!(buf.state().cuda_registered, "{:?}", buf.state());
    println!("PTR={}", buf.as_ptr() as usize);
    drop(buf);
}

#[test]
#[ignore = "run by every_ring_buffer_of_a_loader_is_registered_and_released in a child process"]
fn child_runs_a_loader() {
    child_only();
    let sampler = Sampler::new(common::three_sources().batch_size(2)).unwrap();
    let mut loader = Loader::new(sampler, LoaderConfig::default()).unwrap();
    assert!(
        loader.pin_state().cuda_registered,
        "{:?}",
        loader.pin_state()
    );
    for _ in 0..3 {
        let b = loader.next_batch().unwrap();
        assert!(b.pin_state().cuda_registered);
        for s in 0..3 {
            println!("BATCH_PTR={}", b.as_ptr(s) as usize);
        }
    }
    drop(loader);
}

#[test]
#[ignore = "run by a_refused_registration_or_no_device_is_a_reason_not_an_error in a child process"]
fn child_reports_pin_state() {
    child_only();
    let buf = PinnedBuffer::new(page_size(), &PinOptions::default()).unwrap();
    let s = buf.state();
    println!("REGISTERED={}", s.cuda_registered);
    println!("REASON={}", s.reason.as_deref().unwrap_or(""));
}
