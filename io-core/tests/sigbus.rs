//! zcrop's `SIGBUS` guard among other handlers. A test binary of its own: it changes the
//! process's `SIGBUS` action.
#![allow(unsafe_code)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use zcrop_io::{IoConfig, IoEngine, MapFiles, ReadRange, ReadRequest, check_mapped};

/// Signals the handler another library installs has seen.
static FOREIGN_SEEN: AtomicUsize = AtomicUsize::new(0);

/// A handler another library might install (one that returns, so the test can go on).
extern "C" fn foreign(_: libc::c_int) {
    FOREIGN_SEEN.fetch_add(1, Ordering::SeqCst);
}

fn file(dir: &Path, name: &str, byte: u8) -> Arc<Path> {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(&vec![byte; 2 << 20])
        .unwrap();
    Arc::from(p.as_path())
}

fn read(e: &IoEngine, path: &Arc<Path>) -> bytes::Bytes {
    let range = ReadRange::new(1000, 100);
    let mut batch = e.submit_mapped([ReadRequest::new(0, Arc::clone(path), range)]);
    let bytes = batch.next().unwrap().result.unwrap();
    check_mapped(&bytes, path, range).unwrap();
    bytes
}

/// A handler installed after zcrop's (Python's `faulthandler.enable()` called later, a
/// DataLoader worker's handlers) would take a fault in zcrop's mappings first and end the
/// process: the next batch puts zcrop's back on top, so reads go on being served from
/// mappings, and a bus error that is not zcrop's still reaches the other handler, once.
#[test]
fn a_handler_installed_after_zcrops_is_chained_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (file(dir.path(), "a", 1), file(dir.path(), "b", 2));
    let e = IoEngine::new(IoConfig {
        map_files: MapFiles::Always,
        ..IoConfig::default()
    })
    .unwrap();
    assert_eq!(read(&e, &a)[..], [1u8; 100]);
    assert_eq!(e.metrics().mapped_reads, 1, "the guard is in place: mapped");

    // SAFETY: installs a handler of the plain signature for SIGBUS, from a zeroed (empty
    // mask, no flags) sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = foreign as *const () as usize;
        libc::sigemptyset(&raw mut sa.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGBUS, &raw const sa, std::ptr::null_mut()),
            0
        );
    }
    assert_eq!(read(&e, &a)[..], [1u8; 100]);
    assert_eq!(read(&e, &b)[..], [2u8; 100]);
    let m = e.metrics();
    assert_eq!(m.mapped_reads, 3, "served from mappings again: {m:?}");

    // A bus error sent to the process (not a fault in a mapping of zcrop's) goes on to the
    // handler zcrop displaced, once.
    // SAFETY: raises SIGBUS in this thread; the handler chain ends in `foreign`, which returns.
    unsafe { libc::raise(libc::SIGBUS) };
    assert_eq!(FOREIGN_SEEN.load(Ordering::SeqCst), 1);
}
