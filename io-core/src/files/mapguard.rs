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
//! default action). A handler another library installs later (Python's `faulthandler`, a
//! PyTorch DataLoader worker's) would take our faults first: every batch that may use
//! mappings checks that ours is still in place and puts it back on top, chained to the newer
//! one; a signal passed on that comes back to ours takes the default action. The registry is a
//! fixed array of atomics, so the handler neither locks nor allocates.
#![allow(unsafe_code)]

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

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

/// The action ours displaced last (leaked: a handler may be reading it at any time, and ours
/// is installed again only when another library displaced it, a few times per process at
/// most). Null before ours is installed.
static PREVIOUS: AtomicPtr<Previous> = AtomicPtr::new(std::ptr::null_mut());

/// Handlers of ours passing a signal on, on this process's threads (the signal may come back:
/// a handler that displaced ours may pass it on to ours).
static PASSING_ON: AtomicUsize = AtomicUsize::new(0);

/// Puts our handler in place, remembering the action it displaces.
fn put_in_place() -> std::io::Result<()> {
    // SAFETY: sigaction with a zeroed (valid: empty mask, no flags) struct and out-pointers to
    // locals; the handler is an `extern "C"` function of the SA_SIGINFO signature.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Recorded before ours goes in, so the handler always finds it.
        PREVIOUS.store(Box::into_raw(Box::new(Previous(old))), Ordering::Release);
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
    put_in_place()
}

/// Whether the guard was in place when last checked ([`check_in_place`]); mappings serve
/// reads only while it is.
static IN_PLACE: AtomicBool = AtomicBool::new(true);

/// Whether mappings may serve reads: the guard was in place when last checked (one atomic
/// load).
pub(crate) fn in_place() -> bool {
    IN_PLACE.load(Ordering::Acquire)
}

/// Checks (one system call) that the `SIGBUS` action is still ours, and puts ours back on top
/// if another library replaced it since (Python's `faulthandler.enable()` called later, a
/// PyTorch DataLoader worker's handlers): that handler would take a fault in one of our
/// mappings first and end the process. Faults that are not ours still go to it. Whether the
/// guard is in place now, for [`in_place`]; if it cannot be put back, files are read, not
/// served from mappings. Called when a file is mapped and when a batch that may use mappings
/// starts.
pub(crate) fn check_in_place() -> bool {
    if !installed() {
        return false;
    }
    // SAFETY: sigaction with a null new action only reads the current one into a local.
    let current = unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &raw mut cur) != 0 {
            IN_PLACE.store(false, Ordering::Release);
            return false;
        }
        cur.sa_sigaction
    };
    let ours = current == on_sigbus as *const () as usize
        || match put_in_place() {
            Ok(()) => {
                log::debug!("another SIGBUS handler replaced zcrop's; put zcrop's back on top");
                true
            }
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    log::warn!(
                        "another SIGBUS handler replaced zcrop's and it cannot be put back \
                         ({e}); files are read, not served from mappings"
                    );
                });
                false
            }
        };
    IN_PLACE.store(ours, Ordering::Release);
    ours
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
    // Not ours: whatever was there before, once. A signal that comes back while we pass it
    // on (the handler we displaced passes it to ours again) takes the default action.
    let previous = PREVIOUS.load(Ordering::Acquire);
    if PASSING_ON.fetch_add(1, Ordering::AcqRel) > 0 || previous.is_null() {
        default_action(sig, code);
    } else {
        // SAFETY: a leaked `Previous`, never freed.
        let prev = unsafe { &(*previous).0 };
        pass_on(prev, sig, code, info, ctx);
    }
    PASSING_ON.fetch_sub(1, Ordering::AcqRel);
}

/// Hands the signal to the action `prev` stands for.
fn pass_on(
    prev: &libc::sigaction,
    sig: libc::c_int,
    code: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        default_action(sig, code);
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

/// The default action for `sig`: a fault raised by the kernel happens again on return and
/// takes it; a signal sent by a process is raised again.
fn default_action(sig: libc::c_int, code: libc::c_int) {
    // SAFETY: restoring the default action with a zeroed (empty mask) struct, then raising
    // the signal: both async-signal-safe system calls.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &raw const dfl, std::ptr::null_mut());
        if code <= 0 {
            libc::raise(sig);
        }
    }
}

/// A registered mapping; unregistered when dropped (before the mapping is unmapped).
#[derive(Debug)]
pub(crate) struct Registration(usize);

/// Registers the mapping `start..start + len`; `None` if the handler is not in place or every
/// slot is taken (the file is then read instead of mapped).
pub(crate) fn register(start: usize, len: usize) -> Option<Registration> {
    if start == 0 || len == 0 || !installed() || !check_in_place() {
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
