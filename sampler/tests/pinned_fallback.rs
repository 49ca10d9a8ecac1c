//! `mlock` failing for real (RLIMIT_MEMLOCK, no CAP_IPC_LOCK) must fall back to pageable memory
//! and say why. The test re-runs this binary in a child process with a 64 KiB lock limit (and,
//! as root, without CAP_IPC_LOCK, through `setpriv`), because the limit would otherwise apply
//! to every test in the process.

use std::process::Command;

use zcrop_sampler::{PinOptions, PinnedBuffer};

const CHILD_ENV: &str = "ZCROP_PIN_FALLBACK_CHILD";

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn mlock_beyond_the_limit_falls_back_and_reports_why() {
    if !which("prlimit") {
        eprintln!("SKIPPED: prlimit (util-linux) is not installed, cannot lower RLIMIT_MEMLOCK");
        return;
    }
    // Check the user: root bypasses RLIMIT_MEMLOCK through CAP_IPC_LOCK.
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root && !which("setpriv") {
        eprintln!("SKIPPED: running as root without setpriv, cannot drop CAP_IPC_LOCK");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args([
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
            "prlimit",
        ]);
        c
    } else {
        Command::new("prlimit")
    };
    cmd.arg("--memlock=65536:65536")
        .arg(&exe)
        .args([
            "--exact",
            "child_allocates_under_a_small_lock_limit",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1");
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains("CHILD-OK"),
        "the child did not run:\n{stdout}\n{stderr}"
    );
}

/// Run only as the child of the test above (it checks the environment it needs).
#[test]
#[ignore = "run by mlock_beyond_the_limit_falls_back_and_reports_why in a child process"]
fn child_allocates_under_a_small_lock_limit() {
    assert_eq!(
        std::env::var(CHILD_ENV).as_deref(),
        Ok("1"),
        "run only as the child"
    );
    let limit = zcrop_sampler::pinned::memlock_limit();
    assert_eq!(limit, Some(65536));
    // Within the limit: locked.
    let small = PinnedBuffer::new(4096, &PinOptions::default()).unwrap();
    assert!(small.state().page_locked, "{:?}", small.state());
    // Beyond it: pageable, with the reason, and still usable.
    let mut big = PinnedBuffer::new(1 << 20, &PinOptions::default()).unwrap();
    let s = big.state().clone();
    assert!(!s.page_locked, "{s:?}");
    let reason = s.reason.unwrap();
    assert!(
        reason.contains("mlock") && reason.contains("65536"),
        "{reason}"
    );
    big.as_mut_slice().fill(3);
    assert!(big.as_slice().iter().all(|&b| b == 3));
    println!("CHILD-OK {reason}");
}
