//! Surviving files that shrink under a mapping.
//!
//! Reading a page of a file mapping that lies past the file's end (another process truncated
//! it after it was mapped) raises `SIGBUS`, which kills the process. Every mapping io-core
//! serves reads from is registered here, and a `SIGBUS` handler, installed once before the
//! first mapping, recognises faults inside a registered mapping: it maps a page of zeros over
//! the lost page, marks the mapping as damaged and returns, so the faulting code reads zeros
//! instead of dying. Consumers of mapped results call [`crate::check_mapped`] once they are done
//! with the bytes and turn a damaged mapping into an error ([`crate::IoError::FileChanged`]);
//! the engine stops serving reads from a damaged mapping.
//!
//! Faults outside io-core's mappings go to the handler that was installed before (or the
//! default action). The registry is a fixed array of atomics, so the handler neither locks nor
//! allocates.
#![allow(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

/// Mappings that can be registered at once; beyond that, files are read instead of mapped.
pub(crate) const SLOTS: usize = 4096;

struct Slot {
    /// 0 free, 1 taken.
    state: AtomicU8,
    /// First byte of the mapping; 0 while not (yet) published.
    start: AtomicUsize,
    len: AtomicUsize,
    damaged: AtomicBool,
}

static REGISTRY: [Slot; SLOTS] = [const {
    Slot {
        state: AtomicU8::new(0),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        damaged: AtomicBool::new(false),
    }
}; SLOTS];

/// Mappings damaged so far (a fast "none" for [`intact`]).
static DAMAGED: AtomicUsize = AtomicUsize::new(0);

/// The page size, read before the handler is installed (the handler may not call `sysconf`).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action before ours, to pass faults that are not ours on to.
struct Previous(libc::sigaction);
// SAFETY: a plain C struct of function pointers, flags and a signal mask; written once before
// the handler is installed and only read afterwards.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// Installs the handler (once per process); whether it is in place.
pub(crate) fn installed() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| match install() {
        Ok(()) => true,
        Err(e) => {
            log::warn!("cannot install the SIGBUS handler ({e}); files will be read, not mapped");
            false
        }
    })
}

fn install() -> std::io::Result<()> {
    PAGE.store(page_size(), Ordering::Relaxed);
    // SAFETY: sigaction with a zeroed (valid: empty mask, no flags) struct and out-pointers to
    // locals; the handler is an `extern "C"` function of the SA_SIGINFO signature.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Recorded before ours goes in, so the handler always finds it.
        let _ = PREVIOUS.set(Previous(old));
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = on_sigbus as *const () as usize;
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&raw mut new.sa_mask);
        if libc::sigaction(libc::SIGBUS, &raw const new, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The registered mapping holding `addr`, if any. Async-signal-safe.
fn find(addr: usize) -> Option<&'static Slot> {
    REGISTRY.iter().find(|s| {
        let start = s.start.load(Ordering::Acquire);
        start != 0 && addr >= start && addr - start < s.len.load(Ordering::Acquire)
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; `si_addr` is meaningful for the faults it
    // raises itself (si_code > 0), which are the only ones handled here.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code > 0
        && let Some(slot) = find(addr)
    {
        let page = addr & !(PAGE.load(Ordering::Relaxed) - 1);
        // SAFETY: replaces one page inside a live mapping of ours (registered mappings are
        // unregistered before they are unmapped) with private zeros; mmap is
        // async-signal-safe in practice (a plain system call).
        let p = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE.load(Ordering::Relaxed),
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            if !slot.damaged.swap(true, Ordering::AcqRel) {
                DAMAGED.fetch_add(1, Ordering::AcqRel);
            }
            return;
        }
    }
    // Not ours: whatever was there before.
    let Some(Previous(prev)) = PREVIOUS.get() else {
        return;
    };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restoring the default action with a zeroed (empty mask) struct; a fault
        // raised by the kernel then happens again on return and takes that action; a signal
        // sent by a process is raised again.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &raw const dfl, std::ptr::null_mut());
            if code <= 0 {
                libc::raise(sig);
            }
        }
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO takes the signal number alone.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

/// A registered mapping; unregistered when dropped (before the mapping is unmapped).
#[derive(Debug)]
pub(crate) struct Registration(usize);

/// Registers the mapping `start..start + len`; `None` if the handler is not installed or every
/// slot is taken (the file is then read instead of mapped).
pub(crate) fn register(start: usize, len: usize) -> Option<Registration> {
    if start == 0 || len == 0 || !installed() {
        return None;
    }
    let i = REGISTRY.iter().position(|s| {
        s.state
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })?;
    let s = &REGISTRY[i];
    s.damaged.store(false, Ordering::Relaxed);
    s.len.store(len, Ordering::Release);
    s.start.store(start, Ordering::Release);
    Some(Registration(i))
}

impl Drop for Registration {
    fn drop(&mut self) {
        let s = &REGISTRY[self.0];
        s.start.store(0, Ordering::Release);
        if s.damaged.swap(false, Ordering::AcqRel) {
            DAMAGED.fetch_sub(1, Ordering::AcqRel);
        }
        s.state.store(0, Ordering::Release);
    }
}

/// Whether the bytes at `ptr` are free of lost pages: `false` only if `ptr` lies in a
/// registered mapping that lost a page. One atomic load while no mapping ever did.
pub(crate) fn intact(ptr: *const u8) -> bool {
    if DAMAGED.load(Ordering::Acquire) == 0 {
        return true;
    }
    find(ptr as usize).is_none_or(|s| !s.damaged.load(Ordering::Acquire))
}

/// The system's page size.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}
