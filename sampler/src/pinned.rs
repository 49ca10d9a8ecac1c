//! Host buffers for batches: page-aligned (`mmap`), page-locked (`mlock`) so the kernel never
//! pages them out, and registered with the CUDA runtime (`cudaHostRegister`) when one is
//! present at run time, so host-to-device copies from them can be asynchronous. zcrop has no
//! build-time CUDA dependency: `libcudart` is looked up with `dlopen` (set `ZCROP_CUDART` to a
//! path or file name to choose it).
//!
//! Every step falls back instead of failing: a buffer that cannot be locked (RLIMIT_MEMLOCK,
//! no CAP_IPC_LOCK) or registered (no CUDA runtime, no device) works as ordinary memory, and
//! its [`PinState`] says what it got and why.
//!
//! This is the sampler's only module with `unsafe` code; every block has a `// SAFETY:`
//! comment.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use zcrop_io::fork::{self, PerProcess};

/// What to ask of the OS and CUDA for batch buffers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinOptions {
    /// Page-lock buffers with `mlock`.
    pub lock: bool,
    /// Register buffers with the CUDA runtime when it is present.
    pub cuda: bool,
    /// Lock at most this many bytes in this process (all buffers together); buffers beyond it
    /// stay pageable. `None`: only the OS limit applies.
    pub max_locked_bytes: Option<usize>,
    /// Map the buffer from an anonymous memory file that other processes can map too, through
    /// [`PinnedBuffer::shared_memory`]; otherwise the mapping is private to this process. The
    /// file starts with one page of zeros that zcrop never touches (the sharing processes' own
    /// bookkeeping may live there), then the buffer's bytes.
    pub shared: bool,
}

impl Default for PinOptions {
    fn default() -> Self {
        PinOptions {
            lock: true,
            cuda: true,
            max_locked_bytes: None,
            shared: false,
        }
    }
}

impl PinOptions {
    /// Plain page-aligned memory: no locking, no CUDA registration.
    pub fn pageable() -> Self {
        PinOptions {
            lock: false,
            cuda: false,
            max_locked_bytes: None,
            shared: false,
        }
    }
}

/// What a buffer (or every buffer of a ring) got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinState {
    /// Locked in RAM with `mlock`.
    pub page_locked: bool,
    /// Registered with the CUDA runtime (`cudaHostRegister`).
    pub cuda_registered: bool,
    /// Why locking or registration did not happen, when one of them did not.
    pub reason: Option<String>,
}

impl PinState {
    /// The state shared by all of `states`: locked / registered only if all are, with the first
    /// reason given.
    pub fn combine<'a>(states: impl IntoIterator<Item = &'a PinState>) -> PinState {
        let mut out = PinState {
            page_locked: true,
            cuda_registered: true,
            reason: None,
        };
        let mut any = false;
        for s in states {
            any = true;
            out.page_locked &= s.page_locked;
            out.cuda_registered &= s.cuda_registered;
            if out.reason.is_none() {
                out.reason.clone_from(&s.reason);
            }
        }
        if !any {
            out.page_locked = false;
            out.cuda_registered = false;
        }
        out
    }
}

/// Bytes locked by all live buffers of this process (a child of `fork` starts at 0: page locks
/// are not inherited).
fn locked_bytes() -> &'static AtomicUsize {
    static LOCKED_BYTES: PerProcess<AtomicUsize> = PerProcess::new();
    LOCKED_BYTES.get_or_init(|| AtomicUsize::new(0))
}

/// The OS page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Bytes of the process's RLIMIT_MEMLOCK soft limit (`None` when unlimited or unknown).
pub fn memlock_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// A page-aligned host buffer, zero-filled when created, page-locked and CUDA-registered where
/// possible. It owns its memory; moving it does not move the memory.
pub struct PinnedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
    /// The memory file of a shared buffer (see [`PinnedBuffer::shared_memory`]), mapped from
    /// its start, `header` bytes before `ptr`.
    file: Option<OwnedFd>,
    header: usize,
    locked: bool,
    cuda: Option<&'static CudaRuntime>,
    state: PinState,
    /// The process generation that mapped, locked and registered the buffer.
    generation: u64,
}

// SAFETY: the buffer exclusively owns its mapping (like a `Box<[u8]>`); shared references only
// read it and mutation needs `&mut self`, so it may move to and be shared between threads.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as for `Send`: `&PinnedBuffer` gives read-only access.
unsafe impl Sync for PinnedBuffer {}

impl std::fmt::Debug for PinnedBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl PinnedBuffer {
    /// Maps `len` bytes (rounded up to whole pages; at least one page), then locks and
    /// registers them as `options` allow. Only the mapping itself can fail.
    pub fn new(len: usize, options: &PinOptions) -> std::io::Result<PinnedBuffer> {
        let page = page_size();
        let map_len = len
            .max(1)
            .checked_next_multiple_of(page)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        let header = if options.shared { page } else { 0 };
        let file = if options.shared {
            Some(memory_file(header + map_len)?)
        } else {
            None
        };
        let (flags, fd) = match &file {
            Some(f) => (libc::MAP_SHARED, std::os::fd::AsRawFd::as_raw_fd(f)),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a new mapping with no address hint, anonymous or of the whole memory file
        // just sized to `header + map_len`; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                header + map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `header` is within the mapping just made.
        let data = unsafe { p.cast::<u8>().add(header) };
        let ptr = NonNull::new(data).ok_or_else(std::io::Error::last_os_error)?;
        let mut buf = PinnedBuffer {
            ptr,
            len,
            map_len,
            file,
            header,
            locked: false,
            cuda: None,
            state: PinState {
                page_locked: false,
                cuda_registered: false,
                reason: None,
            },
            generation: fork::generation(),
        };
        let mut reasons = Vec::new();
        if options.lock {
            match buf.lock(options.max_locked_bytes) {
                Ok(()) => {}
                Err(r) => reasons.push(r),
            }
        } else {
            reasons.push("page locking disabled".to_string());
        }
        if options.cuda {
            match CudaRuntime::system() {
                Ok(rt) => match rt.register(buf.ptr.as_ptr().cast(), buf.map_len) {
                    Ok(()) => buf.cuda = Some(rt),
                    Err(r) => reasons.push(r),
                },
                Err(r) => reasons.push(r.clone()),
            }
        } else {
            reasons.push("CUDA registration disabled".to_string());
        }
        buf.state = PinState {
            page_locked: buf.locked,
            cuda_registered: buf.cuda.is_some(),
            reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        };
        Ok(buf)
    }

    fn lock(&mut self, cap: Option<usize>) -> Result<(), String> {
        let before = locked_bytes().fetch_add(self.map_len, Ordering::AcqRel);
        if let Some(cap) = cap
            && before + self.map_len > cap
        {
            locked_bytes().fetch_sub(self.map_len, Ordering::AcqRel);
            return Err(format!(
                "not page-locked: the configured cap of {cap} locked bytes would be exceeded"
            ));
        }
        // SAFETY: the range is exactly our live mapping.
        let rc = unsafe { libc::mlock(self.ptr.as_ptr().cast(), self.map_len) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            locked_bytes().fetch_sub(self.map_len, Ordering::AcqRel);
            let limit =
                memlock_limit().map_or_else(|| "unlimited".into(), |l| format!("{l} bytes"));
            return Err(format!(
                "not page-locked: mlock of {} bytes failed ({e}; RLIMIT_MEMLOCK is {limit})",
                self.map_len
            ));
        }
        self.locked = true;
        Ok(())
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What this buffer got.
    pub fn state(&self) -> &PinState {
        &self.state
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is live, at least `len` bytes, initialised (zero-filled by mmap
        // or written since), and only `&mut self` can write it.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The start address (page-aligned), e.g. for a host-to-device copy.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// A shared buffer's memory file (see [`PinOptions::shared`]), the file's size in bytes and
    /// the offset of the buffer's bytes in it (one page). `None` for a private buffer.
    pub fn shared_memory(&self) -> Option<(BorrowedFd<'_>, usize, usize)> {
        self.file
            .as_ref()
            .map(|f| (f.as_fd(), self.header + self.map_len, self.header))
    }
}

/// A new anonymous memory file of `len` bytes (zero-filled), closed on exec.
fn memory_file(len: usize) -> std::io::Result<OwnedFd> {
    // SAFETY: the name is a valid C string; the result is checked.
    let fd = unsafe { libc::memfd_create(c"zcrop-ring".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let size = libc::off_t::try_from(len)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
    // SAFETY: `file` is a valid descriptor of a memory file.
    if unsafe { libc::ftruncate(std::os::fd::AsRawFd::as_raw_fd(&file), size) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.generation == fork::generation() {
            self.release();
        }
        // SAFETY: unmapping exactly the mapping created in `new` (it starts `header` bytes
        // before `ptr`); no reference to it outlives `self`.
        unsafe {
            libc::munmap(
                self.ptr.as_ptr().sub(self.header).cast(),
                self.header + self.map_len,
            )
        };
    }
}

impl PinnedBuffer {
    /// Unregisters and unlocks the buffer. Not in a child of `fork`: its copy of the mapping
    /// is neither locked nor registered (and CUDA must not be called there).
    fn release(&mut self) {
        if let Some(rt) = self.cuda {
            rt.unregister(self.ptr.as_ptr().cast());
        }
        if self.locked {
            // SAFETY: the range is our live mapping, locked in `lock`.
            unsafe { libc::munlock(self.ptr.as_ptr().cast(), self.map_len) };
            locked_bytes().fetch_sub(self.map_len, Ordering::AcqRel);
        }
    }
}

type HostRegister = unsafe extern "C" fn(*mut c_void, usize, c_uint) -> c_int;
type HostUnregister = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetDeviceCount = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// `cudaHostRegisterPortable`: the memory counts as pinned for every CUDA context.
const CUDA_HOST_REGISTER_PORTABLE: c_uint = 1;

/// The library names tried when `ZCROP_CUDART` is not set.
pub const CUDART_NAMES: &[&str] = &[
    "libcudart.so",
    "libcudart.so.13",
    "libcudart.so.12",
    "libcudart.so.11.0",
];

/// The CUDA runtime library, loaded at run time with `dlopen`.
pub struct CudaRuntime {
    path: String,
    devices: i32,
    host_register: HostRegister,
    host_unregister: HostUnregister,
    error_string: Option<GetErrorString>,
}

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime")
            .field("path", &self.path)
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns null or a valid C string owned by libdl.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl* call on this thread.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

impl CudaRuntime {
    /// Loads the CUDA runtime `name` (a file name searched like `dlopen` does, or a path) and
    /// checks that it sees at least one device. The library stays loaded for the life of the
    /// process.
    pub fn open(name: &str) -> Result<CudaRuntime, String> {
        if name.is_empty() {
            // dlopen("") would hand back the program itself, which has no CUDA symbols.
            return Err("no CUDA runtime: the library name is empty".into());
        }
        let cname = CString::new(name).map_err(|_| format!("bad library name {name:?}"))?;
        // SAFETY: a valid C string; RTLD_NOW resolves everything now. Loading runs the
        // library's initialisers, which for libcudart do not touch the GPU.
        let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(format!(
                "no CUDA runtime: cannot load {name}: {}",
                dl_error()
            ));
        }
        let sym = |s: &CStr| -> Result<*mut c_void, String> {
            // SAFETY: `handle` is a live handle and `s` a valid C string.
            let p = unsafe { libc::dlsym(handle, s.as_ptr()) };
            if p.is_null() {
                Err(format!(
                    "no CUDA runtime: {name} has no symbol {}",
                    s.to_string_lossy()
                ))
            } else {
                Ok(p)
            }
        };
        let loaded = (|| {
            let reg = sym(c"cudaHostRegister")?;
            let unreg = sym(c"cudaHostUnregister")?;
            let count = sym(c"cudaGetDeviceCount")?;
            let err = sym(c"cudaGetErrorString").ok();
            Ok::<_, String>((reg, unreg, count, err))
        })();
        let (reg, unreg, count, err) = match loaded {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: a handle from dlopen above, not used afterwards.
                unsafe { libc::dlclose(handle) };
                return Err(e);
            }
        };
        // SAFETY: these symbols of the CUDA runtime have exactly these C signatures
        // (cuda_runtime_api.h: cudaError_t is a C enum, i.e. int).
        let (host_register, host_unregister, get_count, error_string) = unsafe {
            (
                std::mem::transmute::<*mut c_void, HostRegister>(reg),
                std::mem::transmute::<*mut c_void, HostUnregister>(unreg),
                std::mem::transmute::<*mut c_void, GetDeviceCount>(count),
                err.map(|e| std::mem::transmute::<*mut c_void, GetErrorString>(e)),
            )
        };
        let mut devices: c_int = 0;
        // SAFETY: `devices` is a valid out-pointer.
        let rc = unsafe { get_count(&raw mut devices) };
        let rt = CudaRuntime {
            path: name.to_string(),
            devices,
            host_register,
            host_unregister,
            error_string,
        };
        if rc != 0 {
            return Err(format!(
                "no usable CUDA device: cudaGetDeviceCount failed: {}",
                rt.describe(rc)
            ));
        }
        if devices <= 0 {
            return Err("no usable CUDA device: cudaGetDeviceCount found none".into());
        }
        Ok(rt)
    }

    /// The process's CUDA runtime: `ZCROP_CUDART` if set and not empty, else the first of
    /// [`CUDART_NAMES`] that loads and sees a device; looked up once per process and cached
    /// (in a child of `fork` again: CUDA there fails if the parent initialised it, and the
    /// buffers stay page-locked only, saying why).
    pub fn system() -> Result<&'static CudaRuntime, &'static String> {
        static RT: PerProcess<Result<CudaRuntime, String>> = PerProcess::new();
        RT.get_or_init(|| {
            // Set but empty counts as not set, as for most variables of this kind.
            if let Ok(name) = std::env::var("ZCROP_CUDART")
                && !name.is_empty()
            {
                return CudaRuntime::open(&name);
            }
            let mut errors = Vec::new();
            for name in CUDART_NAMES {
                match CudaRuntime::open(name) {
                    Ok(rt) => return Ok(rt),
                    Err(e) => errors.push(e),
                }
            }
            // The first error names the plain name; the rest repeat it for each version.
            Err(errors.into_iter().next().unwrap_or_default())
        })
        .as_ref()
    }

    /// The library that was loaded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Number of CUDA devices it sees.
    pub fn device_count(&self) -> i32 {
        self.devices
    }

    fn describe(&self, rc: c_int) -> String {
        let msg = self.error_string.map(|f| {
            // SAFETY: cudaGetErrorString takes any error code and returns a static C string.
            let p = unsafe { f(rc) };
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: non-null static NUL-terminated string.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        });
        format!("error {rc} {}", msg.unwrap_or_default())
    }

    fn register(&self, ptr: *mut c_void, len: usize) -> Result<(), String> {
        // SAFETY: `ptr..ptr+len` is a live mapping owned by the calling buffer, which
        // unregisters it before unmapping.
        let rc = unsafe { (self.host_register)(ptr, len, CUDA_HOST_REGISTER_PORTABLE) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("cudaHostRegister failed: {}", self.describe(rc)))
        }
    }

    fn unregister(&self, ptr: *mut c_void) {
        // SAFETY: `ptr` was registered by `register` and is still mapped.
        let rc = unsafe { (self.host_unregister)(ptr) };
        if rc != 0 {
            log::warn!("cudaHostUnregister failed: {}", self.describe(rc));
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Plain numeric element types, for which every bit pattern is a valid value.
pub trait Element: sealed::Sealed + Copy {}

macro_rules! element {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {}
    )*};
}
element!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// `bytes` as a slice of `T`, if it is aligned for `T` and a whole number of them (batch
/// buffers always are: each source starts on a page boundary).
pub fn as_elements<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    // SAFETY: `T` is a plain numeric type (sealed), so every bit pattern is valid; `align_to`
    // only hands out the aligned middle, and we accept it only when it is the whole slice.
    let (head, mid, tail) = unsafe { bytes.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_page_aligned_zeroed_and_writable() {
        for len in [0usize, 1, 4095, 4096, 100_000] {
            let mut b = PinnedBuffer::new(len, &PinOptions::pageable()).unwrap();
            assert_eq!(b.as_ptr() as usize % page_size(), 0);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
            let s = b.state();
            assert!(!s.page_locked && !s.cuda_registered);
            assert!(s.reason.as_deref().unwrap().contains("disabled"));
        }
    }

    #[test]
    fn locking_reports_what_happened() {
        let b = PinnedBuffer::new(1 << 16, &PinOptions::default()).unwrap();
        let s = b.state();
        if !s.page_locked {
            assert!(s.reason.as_deref().unwrap().contains("mlock"), "{s:?}");
        }
        // CUDA: registered exactly when the runtime loads and sees a device.
        match CudaRuntime::system() {
            Ok(_) => assert!(s.cuda_registered, "{s:?}"),
            Err(why) => {
                assert!(!s.cuda_registered);
                assert!(s.reason.as_deref().unwrap().contains(why.as_str()), "{s:?}");
            }
        }
    }

    #[test]
    fn the_lock_cap_falls_back_to_pageable_memory() {
        let opts = PinOptions {
            lock: true,
            cuda: false,
            max_locked_bytes: Some(1),
            shared: false,
        };
        let mut b = PinnedBuffer::new(8192, &opts).unwrap();
        assert!(!b.state().page_locked);
        assert!(b.state().reason.as_deref().unwrap().contains("cap"));
        b.as_mut_slice()[8191] = 1;
    }

    #[test]
    fn missing_or_wrong_cuda_libraries_are_reported_not_fatal() {
        let e = CudaRuntime::open("").unwrap_err();
        assert!(e.contains("empty"), "{e}");
        let e = CudaRuntime::open("/nonexistent/libcudart.so").unwrap_err();
        assert!(e.contains("cannot load"), "{e}");
        // A real library without the CUDA symbols.
        let e = CudaRuntime::open("libc.so.6").unwrap_err();
        assert!(e.contains("cudaHostRegister"), "{e}");
    }

    #[test]
    fn combined_states() {
        let a = PinState {
            page_locked: true,
            cuda_registered: false,
            reason: Some("no CUDA".into()),
        };
        let b = PinState {
            page_locked: false,
            cuda_registered: false,
            reason: Some("mlock".into()),
        };
        let c = PinState::combine([&a, &b]);
        assert!(!c.page_locked && !c.cuda_registered);
        assert_eq!(c.reason.as_deref(), Some("no CUDA"));
        assert!(!PinState::combine([]).page_locked);
    }

    #[test]
    fn a_shared_buffer_is_seen_through_its_memory_file() {
        let opts = PinOptions {
            shared: true,
            ..PinOptions::pageable()
        };
        let mut b = PinnedBuffer::new(10_000, &opts).unwrap();
        b.as_mut_slice()[9_999] = 42;
        let (fd, size, at) = b.shared_memory().unwrap();
        assert_eq!(at, page_size());
        assert_eq!(size, at + 10_000usize.next_multiple_of(page_size()));
        let mut seen = [1u8; 2];
        assert_eq!(pread_at(fd, &mut seen[..1], 0), 1);
        assert_eq!(pread_at(fd, &mut seen[1..], (at + 9_999) as i64), 1);
        assert_eq!(seen, [0, 42]);
        assert!(
            PinnedBuffer::new(16, &PinOptions::pageable())
                .unwrap()
                .shared_memory()
                .is_none()
        );
    }

    /// `pread` on a borrowed descriptor (the test's only way to look at the file).
    fn pread_at(fd: BorrowedFd<'_>, buf: &mut [u8], at: i64) -> isize {
        let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
        // SAFETY: `buf` is valid for `buf.len()` bytes and `raw` is a live descriptor.
        unsafe { libc::pread(raw, buf.as_mut_ptr().cast(), buf.len(), at) }
    }

    #[test]
    fn typed_views_check_alignment() {
        let b = PinnedBuffer::new(16, &PinOptions::pageable()).unwrap();
        assert_eq!(as_elements::<f32>(b.as_slice()).unwrap().len(), 4);
        assert!(as_elements::<f32>(&b.as_slice()[1..5]).is_none());
        assert!(as_elements::<f64>(&b.as_slice()[..12]).is_none());
    }
}
