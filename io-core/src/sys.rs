//! Raw buffers and syscalls: the unsafe module of io-core besides the io_uring backend.
//!
//! - [`ReadBuf`]: a buffer the kernel reads into, uninitialised beyond what was read, plainly
//!   allocated or aligned for `O_DIRECT`, turned into [`Bytes`] without a copy.
//! - [`pread`]: `pread`/`preadv2(RWF_NOWAIT)` into a [`ReadBuf`].
//! - [`dio_alignment`]: the `O_DIRECT` alignment a file needs (`statx(STATX_DIOALIGN)`).
//! - [`EventFd`]: wakes an io_uring worker when new work is queued.
//! - [`on_fork_in_child`]: the fork handler of `crate::fork`.
//! - [`map_file`] and [`resident`]: read-only file mappings (guarded by `crate::mapguard`) and
//!   whether a range of one is in memory.
#![allow(unsafe_code)]

use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::ptr::NonNull;

use bytes::Bytes;

use crate::files::mapguard::page_size;

/// Memory for one read: `cap` bytes of which the first `filled` were written by the kernel.
#[derive(Debug)]
pub(crate) struct ReadBuf {
    storage: Storage,
    /// Bytes the read may fill (a pooled `Vec` may have more capacity).
    cap: usize,
    filled: usize,
}

#[derive(Debug)]
enum Storage {
    /// A pooled `Vec` whose length is `filled` and capacity at least the read size.
    Plain(Vec<u8>),
    /// Like `Plain`, but freed (not pooled) when the last view drops.
    Unpooled(Vec<u8>),
    /// An aligned allocation for `O_DIRECT`.
    Aligned(AlignedAlloc),
}

impl ReadBuf {
    /// A buffer for `cap` bytes; aligned to `align` when given (a power of two); from the
    /// buffer pool when `recycle` is set. `None` when the memory cannot be had (sizes come
    /// from metadata and length fields: failing must not abort the process).
    pub(crate) fn try_new(cap: usize, align: Option<usize>, recycle: bool) -> Option<Self> {
        let storage = match align {
            Some(a) if cap > 0 => Storage::Aligned(AlignedAlloc::try_new(cap, a)?),
            _ if recycle => Storage::Plain(crate::pool::try_take(cap)?),
            _ => {
                let mut v = Vec::new();
                v.try_reserve_exact(cap).ok()?;
                Storage::Unpooled(v)
            }
        };
        Some(ReadBuf {
            storage,
            cap,
            filled: 0,
        })
    }

    /// [`ReadBuf::try_new`] for sizes known to be small (tests and probes).
    #[cfg(test)]
    pub(crate) fn new(cap: usize, align: Option<usize>, recycle: bool) -> Self {
        Self::try_new(cap, align, recycle).expect("a small buffer")
    }

    /// Bytes written so far.
    pub(crate) fn filled(&self) -> usize {
        self.filled
    }

    /// Total capacity.
    pub(crate) fn capacity(&self) -> usize {
        self.cap
    }

    /// Pointer to the first unwritten byte and how many bytes remain. The pointer stays valid
    /// (the allocation never moves) until the buffer is dropped or turned into [`Bytes`].
    pub(crate) fn spare(&mut self) -> (*mut u8, usize) {
        let base = match &mut self.storage {
            Storage::Plain(v) | Storage::Unpooled(v) => v.as_mut_ptr(),
            Storage::Aligned(a) => a.ptr.as_ptr(),
        };
        let cap = self.capacity();
        // SAFETY: `filled <= cap`, so the offset stays inside (or one past) the allocation.
        (unsafe { base.add(self.filled) }, cap - self.filled)
    }

    /// Records that the kernel wrote `n` more bytes at [`Self::spare`].
    ///
    /// # Safety
    /// The `n` bytes after the previously filled ones must have been written (initialised).
    pub(crate) unsafe fn advance(&mut self, n: usize) {
        assert!(n <= self.capacity() - self.filled, "advance past capacity");
        self.filled += n;
        if let Storage::Plain(v) | Storage::Unpooled(v) = &mut self.storage {
            // SAFETY: the caller guarantees the first `filled` bytes are initialised, and
            // `filled <= self.cap <= v.capacity()` (checked above; the pool hands out vectors
            // with at least `cap` capacity).
            unsafe { v.set_len(self.filled) };
        }
    }

    /// The filled bytes as [`Bytes`], without copying.
    pub(crate) fn into_bytes(self) -> Bytes {
        match self.storage {
            Storage::Plain(v) => Bytes::from_owner(crate::pool::Pooled(v)),
            Storage::Unpooled(v) => Bytes::from(v),
            Storage::Aligned(a) => {
                let filled = self.filled;
                Bytes::from_owner(FilledAligned { alloc: a, filled })
            }
        }
    }
}

/// An aligned heap allocation, freed on drop.
#[derive(Debug)]
struct AlignedAlloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned exclusively (like a `Box<[u8]>`), so it may move between
// threads and shared references to it are only reads.
unsafe impl Send for AlignedAlloc {}
// SAFETY: see `Send`; `&AlignedAlloc` gives no way to mutate the bytes.
unsafe impl Sync for AlignedAlloc {}

impl AlignedAlloc {
    /// `cap` bytes aligned to `align`; `None` if the memory cannot be had.
    fn try_new(cap: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(cap, align).ok()?;
        // SAFETY: `cap > 0` (checked by the caller), so the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw)?;
        Some(AlignedAlloc { ptr, layout })
    }
}

impl Drop for AlignedAlloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout and not freed before.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The owner `Bytes` keeps alive for an aligned buffer: the allocation and how much is valid.
struct FilledAligned {
    alloc: AlignedAlloc,
    filled: usize,
}

impl AsRef<[u8]> for FilledAligned {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `filled` bytes were written by the kernel (`ReadBuf::advance`'s
        // contract) and the allocation lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.alloc.ptr.as_ptr(), self.filled) }
    }
}

/// Reads at `offset` into the spare capacity of `buf` (at most `max` bytes) and records what
/// was read. With `nowait`, uses `preadv2(RWF_NOWAIT)`, which fails with `EAGAIN` instead of
/// waiting for the device when the data is not in the page cache.
pub(crate) fn pread(
    file: &File,
    buf: &mut ReadBuf,
    offset: u64,
    max: usize,
    nowait: bool,
) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let (ptr, spare) = buf.spare();
    let len = spare.min(max).min(MAX_RW_COUNT);
    let fd = file.as_raw_fd();
    let off = i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    #[cfg(target_os = "linux")]
    let n = if nowait {
        let iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        // The raw system call, not glibc's `preadv2`: that wrapper is a thread cancellation
        // point and brackets the call with cancellation bookkeeping, a visible cost on cached
        // 4 KiB reads. The offset goes in two halves (`pos_l`, `pos_h`) as the kernel expects;
        // on 64-bit kernels `pos_l` alone carries it.
        // SAFETY: `iov` describes `len` writable bytes of `buf`'s spare capacity, which outlives
        // this call; the kernel writes at most `len` bytes there.
        unsafe {
            libc::syscall(
                libc::SYS_preadv2,
                libc::c_long::from(fd),
                &raw const iov,
                1 as libc::c_long,
                off as libc::c_long,
                ((off as u64) >> 32) as libc::c_long,
                libc::c_long::from(libc::RWF_NOWAIT),
            ) as isize
        }
    } else {
        // SAFETY: as above: `ptr` points to `len` writable bytes owned by `buf`.
        unsafe { libc::pread(fd, ptr.cast(), len, off) }
    };
    #[cfg(not(target_os = "linux"))]
    let n = {
        let _ = nowait;
        // SAFETY: `ptr` points to `len` writable bytes owned by `buf`.
        unsafe { libc::pread(fd, ptr.cast(), len, off as libc::off_t) }
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel reported writing `n <= len` bytes at `ptr`.
    unsafe { buf.advance(n) };
    Ok(n)
}

/// The most bytes one `read`-family call transfers on Linux (`MAX_RW_COUNT`).
pub(crate) const MAX_RW_COUNT: usize = 0x7fff_f000;

/// `O_DIRECT` alignment for `file`: `(memory alignment, offset/length alignment)`. Uses
/// `statx(STATX_DIOALIGN)` where the kernel reports it, else 4096 for both (safe for every
/// common device).
pub(crate) fn dio_alignment(file: &File) -> (usize, u64) {
    const FALLBACK: (usize, u64) = (4096, 4096);
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
        // SAFETY: `stx` is a valid, writable `statx` buffer; the empty path with
        // AT_EMPTY_PATH makes statx describe the open file descriptor itself.
        let rc = unsafe {
            libc::statx(
                file.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_DIOALIGN,
                stx.as_mut_ptr(),
            )
        };
        if rc == 0 {
            // SAFETY: statx succeeded and filled the buffer (which was zeroed before anyway).
            let stx = unsafe { stx.assume_init() };
            if stx.stx_mask & libc::STATX_DIOALIGN != 0
                && stx.stx_dio_mem_align > 0
                && stx.stx_dio_offset_align > 0
            {
                return (
                    (stx.stx_dio_mem_align as usize).max(512),
                    u64::from(stx.stx_dio_offset_align).max(512),
                );
            }
        }
    }
    let _ = file;
    FALLBACK
}

/// Opens `path` read-only, with `O_DIRECT` when `direct`, and tells the kernel that access is
/// random (`POSIX_FADV_RANDOM`): every read asks for exactly the bytes it needs, so readahead
/// would only read bytes nobody asked for (a random 64 KiB read would pull 128 KiB).
pub(crate) fn open(path: &std::path::Path, direct: bool) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    // Non-blocking, so that opening a FIFO (or a device) returns at once instead of waiting
    // for a writer; the flag is cleared below once the file is known to be a regular one.
    let mut flags = libc::O_NONBLOCK;
    #[cfg(target_os = "linux")]
    if direct {
        flags |= libc::O_DIRECT;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = direct;
    opts.custom_flags(flags);
    let file = opts.open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            crate::error::NotRegularFile::of(kind),
        ));
    }
    // io_uring answers EAGAIN for reads of an O_NONBLOCK file that would block, instead of
    // reading them in its workers. F_SETFL sets the status flags that can change (of those
    // set at open, only O_DIRECT and O_NONBLOCK): O_DIRECT is kept.
    let keep = flags & !libc::O_NONBLOCK;
    // SAFETY: fcntl on a descriptor we own, with integer arguments only; it touches no memory.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, keep) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: an advisory call on a descriptor we own; it reads and writes no memory.
        // Failure only means the kernel keeps its default readahead.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    }
    Ok(file)
}

/// How many more descriptors this process may open: its `RLIMIT_NOFILE` soft limit less the
/// descriptors open now (counted in `/proc/self/fd` on Linux); `None` if unknown.
pub(crate) fn free_descriptors() -> Option<usize> {
    let mut lim = std::mem::MaybeUninit::<libc::rlimit>::uninit();
    // SAFETY: getrlimit writes one `rlimit` into the pointer, which points at one.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, lim.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: getrlimit succeeded, so it initialised `lim`.
    let soft = unsafe { lim.assume_init() }.rlim_cur;
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    Some(soft.saturating_sub(open))
}

/// A read-only shared mapping of a whole file, unmapped when the last `Bytes` viewing it drops.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    /// Its entry in the `SIGBUS` guard; dropped before the mapping is unmapped.
    registration: Option<crate::files::mapguard::Registration>,
}

// SAFETY: the mapping is read-only and owned by this value alone; sharing or moving the pointer
// between threads is sound (the pages are never written through it).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out shared slices.
unsafe impl Sync for Mapping {}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live PROT_READ mapping until `drop`. If another process
        // truncates the file, touching pages past the new end raises SIGBUS, which the guard
        // (`crate::mapguard`, registered in `map_file`) turns into zeros and a damaged mark
        // that consumers check (`crate::check_mapped`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Out of the guard's registry first: the address range may be reused once unmapped.
        drop(self.registration.take());
        // SAFETY: unmapping exactly the mapping made in `map_file`; no slice of it outlives
        // the `Bytes` that own this value.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The whole of `file` mapped read-only (`MAP_SHARED`, so it reads the page cache without a
/// copy) and registered with the `SIGBUS` guard, as `Bytes`; an empty file gives empty
/// `Bytes`. Fails when the guard cannot take the mapping (handler not installed, registry
/// full).
pub(crate) fn map_file(file: &File) -> io::Result<Bytes> {
    use std::os::fd::AsRawFd;
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| io::Error::other("file larger than the address space"))?;
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: a fresh read-only shared mapping of an open descriptor with no address hint;
    // the result is checked before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
    let mut mapping = Mapping {
        ptr,
        len,
        registration: None,
    };
    // On failure, dropping `mapping` unmaps it.
    mapping.registration = Some(
        crate::files::mapguard::register(ptr.as_ptr() as usize, len)
            .ok_or_else(|| io::Error::other("no SIGBUS guard for the mapping"))?,
    );
    Ok(Bytes::from_owner(mapping))
}

/// Registers `handler` to run in the child of every later `fork`, before `fork` returns there.
/// `handler` must only do what is safe in a child of a threaded process (atomic updates).
pub(crate) fn on_fork_in_child(handler: extern "C" fn()) {
    // SAFETY: registers a plain function pointer, valid for the life of the process; the
    // handler itself is safe code and touches only atomics.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(handler)) };
    if rc != 0 {
        // Only fails without memory for the handler list; then a fork is not seen, as before.
        log::warn!("zcrop-io: pthread_atfork failed ({rc}); zcrop is not fork-safe here");
    }
}

/// A Linux eventfd used to wake an io_uring worker.
#[cfg(target_os = "linux")]
#[derive(Debug)]
pub(crate) struct EventFd(std::os::fd::OwnedFd);

#[cfg(target_os = "linux")]
impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own.
        Ok(EventFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }))
    }

    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.0.as_raw_fd()
    }

    /// Adds 1 to the counter, waking a pending read.
    pub(crate) fn notify(&self) {
        // SAFETY: writes 8 bytes from a valid u64 to our own eventfd. Errors (counter overflow,
        // impossible at 1 per submission) leave the worker to wake on its next completion.
        unsafe { libc::eventfd_write(self.raw(), 1) };
    }
}

/// Whether every page of `bytes[start..end]` is in memory, for `bytes` the mapping of all of
/// `file` made by [`map_file`]: by `cachestat(2)` on `file` where the kernel has it (Linux
/// 6.5; it asks the page cache alone), else by `mincore` on the mapping, which also takes the
/// process's memory-map lock and walks its page tables (on cached 4 KiB reads from two cores,
/// that lock's cache line bouncing between them cost more than the rest of the check). Never
/// claims a page that is not: for a file this process may not write (and does not own), Linux
/// reports only the pages mapped into this process, so cached pages not touched through the
/// mapping yet count as absent.
pub(crate) fn resident(file: &File, bytes: &Bytes, start: usize, end: usize) -> bool {
    if start >= end || end > bytes.len() {
        return start == end;
    }
    match cached(file, start as u64, (end - start) as u64) {
        Some(all) => all,
        None => mapped_resident(bytes, start, end),
    }
}

/// Whether every page of `start..end` (non-empty) of `file` is in the page cache, by
/// `cachestat(2)` alone: `None` where the kernel cannot say (then [`resident`] asks `mincore`,
/// whose cost grows with the range, so callers asking about more than they read do not).
pub(crate) fn cachestat_resident(file: &File, start: usize, end: usize) -> Option<bool> {
    if start >= end {
        return None;
    }
    cached(file, start as u64, (end - start) as u64)
}

/// Asks the kernel to drop `file`'s pages (written and synced) from the page cache (tests of
/// residency: tmpfs keeps them).
#[cfg(test)]
pub(crate) fn drop_from_page_cache(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open descriptor; no memory is passed.
    let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(r, 0);
}

/// `cachestat(2)`'s system call number: one number on every architecture since Linux 5.1's
/// common table (the `libc` crate does not name it for glibc targets yet).
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether all pages of `offset..offset + len` (non-empty) of `file` are in the page cache, by
/// `cachestat(2)`; `None` when the kernel cannot say (no such call before Linux 6.5, or
/// refused), and then for good after `ENOSYS`.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
fn cached(file: &File, offset: u64, len: u64) -> Option<bool> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Ordering::Relaxed) {
        return None;
    }
    let range = Range { off: offset, len };
    // `struct cachestat`: nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted.
    let mut stat = [0u64; 5];
    // SAFETY: cachestat reads one `cachestat_range` (a `repr(C)` struct of its two u64s) and
    // writes one `cachestat` (five u64s, the array), both on this stack frame; the descriptor
    // is open for the duration of the call.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            libc::c_long::from(file.as_raw_fd()),
            &raw const range,
            stat.as_mut_ptr(),
            0 as libc::c_long,
        )
    };
    if r != 0 {
        if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            MISSING.store(true, Ordering::Relaxed);
        }
        return None;
    }
    let page = page_size() as u64;
    let pages = (offset + len).div_ceil(page) - offset / page;
    Some(stat[0] >= pages)
}

#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
fn cached(_file: &File, _offset: u64, _len: u64) -> Option<bool> {
    None
}

/// [`resident`] by `mincore` on the mapping (`start < end <= bytes.len()`).
fn mapped_resident(bytes: &Bytes, start: usize, end: usize) -> bool {
    /// Pages asked about per `mincore` call (a range within 64 pages takes one call).
    const PAGES_PER_CALL: usize = 64;
    let page = page_size();
    let base = bytes.as_ptr() as usize;
    let last = base + end;
    let mut at = (base + start) & !(page - 1);
    let mut vec = [0u8; PAGES_PER_CALL];
    while at < last {
        let len = (last - at).min(PAGES_PER_CALL * page);
        // SAFETY: `at..at+len` lies within the live mapping `bytes` views (rounded down to a
        // page, and the mapping starts on one), and `vec` has room for one byte per page.
        let r = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr()) };
        if r != 0 || vec[..len.div_ceil(page)].iter().any(|v| v & 1 == 0) {
            return false;
        }
        at += len;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use std::io::Write;

    /// A range of many pages (more than one `mincore` call) of a file just written, so in the
    /// page cache, owned by this process: resident; ranges outside the mapping are not.
    #[test]
    fn resident_pages_of_a_mapped_file() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        let whole = map_file(&f.reopen().unwrap()).unwrap();
        let file = f.reopen().unwrap();
        assert!(resident(&file, &whole, 100, (1 << 20) - 7));
        assert!(resident(&file, &whole, 5000, 5001));
        assert!(resident(&file, &whole, 10, 10), "an empty range");
        assert!(
            !resident(&file, &whole, 10, (1 << 20) + 1),
            "past the mapping"
        );
        assert!(mapped_resident(&whole, 100, (1 << 20) - 7));
    }

    /// `cachestat` and `mincore` agree on a file dropped from the page cache (written, synced,
    /// `POSIX_FADV_DONTNEED`) of which every other 16 KiB were then read again, over ranges that
    /// start and end inside pages. Where the kernel dropped nothing (tmpfs) both say cached.
    #[test]
    fn cachestat_agrees_with_mincore() {
        const LEN: usize = 4 << 20;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![3u8; LEN]).unwrap();
        f.as_file().sync_all().unwrap();
        let file = f.reopen().unwrap();
        drop_from_page_cache(&file);
        // Every other 16 KiB stretch read back in.
        for at in (0..LEN).step_by(32 << 10) {
            let mut buf = ReadBuf::new(16 << 10, None, false);
            assert_eq!(
                pread(&file, &mut buf, at as u64, 16 << 10, false).unwrap(),
                16 << 10
            );
        }
        let whole = map_file(&file).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (mut checked, mut absent) = (0, 0);
        for _ in 0..2000 {
            let start = rng.random_range(0..LEN - 1);
            let end = rng.random_range(start + 1..=(start + (12 << 10)).min(LEN));
            // Asked twice where the answers differ: a page reclaimed between the two calls
            // (some kernels reclaim cold pages on their own, e.g. DAMON) makes them disagree
            // once; asked again, both must agree.
            let by_mincore = || mapped_resident(&whole, start, end);
            let settled = |a: &dyn Fn() -> bool| match (a(), by_mincore()) {
                (x, y) if x == y => (x, y),
                _ => (a(), by_mincore()),
            };
            let by_cachestat = || cached(&file, start as u64, (end - start) as u64);
            if by_cachestat().is_some() {
                let (c, m) = settled(&|| by_cachestat() == Some(true));
                assert_eq!(c, m, "{start}..{end}");
                checked += 1;
            }
            let (r, by_mincore) = settled(&|| resident(&file, &whole, start, end));
            assert_eq!(r, by_mincore, "{start}..{end}");
            absent += usize::from(!by_mincore);
        }
        let page_of = |at: usize| mapped_resident(&whole, at, at + 1);
        if !page_of(4096) {
            // The drop worked: the pages read again are back, and some ranges were absent.
            assert!(
                page_of(32 << 10) && (100..1900).contains(&absent),
                "{absent}"
            );
        }
        let (major, minor) = kernel_version();
        if cfg!(target_os = "linux")
            && (cfg!(target_arch = "x86_64") || cfg!(target_arch = "aarch64"))
            && (major, minor) >= (6, 5)
        {
            assert_eq!(checked, 2000, "cachestat answered on Linux {major}.{minor}");
        }
        eprintln!("{absent} of 2000 ranges not cached");
    }

    /// The running kernel's (major, minor) version.
    fn kernel_version() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    #[test]
    fn plain_and_aligned_reads_round_trip() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        f.write_all(&data).unwrap();
        let file = f.reopen().unwrap();
        for (align, recycle) in [(None, true), (None, false), (Some(4096), true)] {
            let mut buf = ReadBuf::new(9900, align, recycle);
            let n = pread(&file, &mut buf, 100, 5000, false).unwrap();
            assert_eq!(n, 5000);
            let n2 = pread(&file, &mut buf, 5100, usize::MAX, false).unwrap();
            assert_eq!(n2, 4900, "stops at end of file");
            assert_eq!(
                pread(&file, &mut buf, 10_000, usize::MAX, false).unwrap(),
                0
            );
            let bytes = buf.into_bytes();
            assert_eq!(&bytes[..], &data[100..]);
        }
    }

    #[test]
    fn alignment_is_a_power_of_two() {
        let f = tempfile::tempfile().unwrap();
        let (mem, off) = dio_alignment(&f);
        assert!(mem.is_power_of_two() && off.is_power_of_two());
    }
}
