//! Engines in a child of `fork`: a child forked while the parent's engines are busy reads
//! correctly through the engines it inherited and through new ones, without waiting on the
//! parent's threads or locks.
#![allow(unsafe_code)]

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use zcrop_io::fork::{PerProcess, ProcessBound, generation};
use zcrop_io::{BackendChoice, Budget, IoConfig, IoEngine, ReadRange, ReadRequest};

const FILE_LEN: usize = 4 << 20;

fn data_file(dir: &Path) -> PathBuf {
    let path = dir.join("data.bin");
    let mut f = std::fs::File::create(&path).unwrap();
    let bytes: Vec<u8> = (0..FILE_LEN).map(|i| (i * 31 % 251) as u8).collect();
    f.write_all(&bytes).unwrap();
    path
}

/// Reads 64 ranges of `path` through `engine` and checks them against `pread`.
fn read_and_check(engine: &IoEngine, path: &Path, seed: usize) -> Result<(), String> {
    let file = std::fs::File::open(path).unwrap();
    let ranges: Vec<(u64, usize)> = (0..64)
        .map(|i| {
            let offset = ((seed * 7919 + i * 65_537) % (FILE_LEN - 70_000)) as u64;
            (offset, 1 + (i * 4099 + seed) % 65_536)
        })
        .collect();
    let requests: Vec<ReadRequest> = ranges
        .iter()
        .enumerate()
        .map(|(i, &(offset, len))| {
            ReadRequest::new(i as u64, path, ReadRange::new(offset, len as u64))
        })
        .collect();
    let expected: Vec<Vec<u8>> = ranges
        .iter()
        .map(|&(offset, len)| {
            let mut buf = vec![0; len];
            file.read_exact_at(&mut buf, offset).unwrap();
            buf
        })
        .collect();
    for (i, got) in engine.read_all(requests).into_iter().enumerate() {
        let got = got.map_err(|e| format!("read {i}: {e}"))?;
        if got[..] != expected[i][..] {
            return Err(format!("read {i}: wrong bytes"));
        }
    }
    Ok(())
}

/// Forks; the child runs `child` (its `Err` or a panic exits with 1) and the parent waits for
/// it, failing the test if it does not exit with 0 within 30 s.
fn in_child(child: impl FnOnce() -> Result<(), String>) {
    // SAFETY: the child runs only `child` and then `_exit`s, never returning into the test
    // harness; `fork` itself has no preconditions.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)) {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                eprintln!("child: {e}");
                false
            }
            Err(_) => false,
        };
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(i32::from(!ok)) };
    }
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child, non-blocking.
        let r = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
        if r == pid {
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child failed (status {status:#x})"
            );
            return;
        }
        if start.elapsed() > Duration::from_secs(30) {
            // SAFETY: kills and reaps our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &raw mut status, 0);
            }
            panic!("child hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn forked_children_read_through_inherited_and_new_engines_while_the_parent_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = data_file(dir.path());
    let shared = IoEngine::shared().unwrap();
    let engines = [
        ("shared", shared.clone()),
        (
            "uring",
            IoEngine::new(IoConfig {
                backend: BackendChoice::Uring,
                ..IoConfig::default()
            })
            .unwrap(),
        ),
        (
            "portable",
            IoEngine::new(IoConfig {
                backend: BackendChoice::Portable,
                budget: Some(Budget::new(8, 1 << 20)),
                ..IoConfig::default()
            })
            .unwrap(),
        ),
    ];
    // Keep every engine busy while the test forks, so that children are made with reads in
    // flight and locks held.
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = engines
        .iter()
        .map(|(name, e)| {
            let (e, path, stop) = (e.clone(), path.clone(), Arc::clone(&stop));
            let name = *name;
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    read_and_check(&e, &path, n).unwrap_or_else(|err| panic!("{name}: {err}"));
                    n += 1;
                }
            })
        })
        .collect();
    for round in 0..12 {
        let engines = engines.clone();
        let path = path.clone();
        in_child(move || {
            for (name, e) in &engines {
                read_and_check(e, &path, round).map_err(|err| format!("{name}: {err}"))?;
            }
            if !IoEngine::shared().unwrap().same_engine(&engines[0].1) {
                return Err("the inherited shared engine is not the child's shared one".into());
            }
            let fresh = IoEngine::new(IoConfig::default()).map_err(|e| e.to_string())?;
            read_and_check(&fresh, &path, round)?;
            // Dropping the parent's engines here must not wait for the parent's threads.
            drop(engines);
            Ok(())
        });
        std::thread::sleep(Duration::from_millis(3));
    }
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    for (name, e) in &engines {
        read_and_check(e, &path, 99).unwrap_or_else(|err| panic!("{name} after forks: {err}"));
    }
}

#[test]
fn per_process_values_are_rebuilt_in_a_child() {
    static VALUE: PerProcess<(u64, u32)> = PerProcess::new();
    let parent_generation = generation();
    let parent = *VALUE.get_or_init(|| (generation(), std::process::id()));
    let bound = ProcessBound::new(vec![1, 2, 3]);
    in_child(move || {
        if generation() != parent_generation + 1 {
            return Err("the child is not one generation on".into());
        }
        if VALUE.get().is_some() || bound.is_current() {
            return Err("the parent's values are current in the child".into());
        }
        let child = *VALUE.get_or_init(|| (generation(), std::process::id()));
        if child == parent || child.1 != std::process::id() {
            return Err(format!("child value {child:?}, parent's {parent:?}"));
        }
        drop(bound); // leaked, not freed: the parent's
        Ok(())
    });
    assert_eq!(*VALUE.get().unwrap(), parent);
}
