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
