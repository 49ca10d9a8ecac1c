//! C-blosc and liblz4 calls: one of zcrop-codec's unsafe modules.
//!
//! zarrs decodes blosc into a fresh `Vec` and then copies; zcrop decodes straight into the
//! caller's buffer (a reused scratch buffer, or the crop itself), and can decode only the blocks
//! that hold a prefix of the chunk. Most blosc chunks do not come here at all:
//! [`crate::blosc`] reads them, calling only [`lz4_decompress`] for their LZ4 splits.
#![allow(unsafe_code)]

use std::ffi::c_void;

/// Facts from a validated blosc header.
#[derive(Debug, Clone, Copy)]
pub struct BloscHeader {
    /// Decoded size.
    pub nbytes: usize,
    /// Item size the buffer was shuffled with.
    pub typesize: usize,
    /// Bytes per block (the unit blosc can decode alone).
    pub blocksize: usize,
}

/// Validates `src` as one blosc buffer and reads its header.
pub fn blosc_header(src: &[u8]) -> Result<BloscHeader, String> {
    let mut nbytes = 0usize;
    // SAFETY: `src` is a valid slice of `src.len()` bytes; validate reads at most that many and
    // writes one usize to `nbytes`.
    let rc = unsafe {
        blosc_src::blosc_cbuffer_validate(src.as_ptr().cast(), src.len(), &raw mut nbytes)
    };
    if rc != 0 {
        return Err(format!("not a valid blosc buffer ({} bytes)", src.len()));
    }
    let (mut n, mut cbytes, mut blocksize, mut typesize, mut flags) =
        (0usize, 0usize, 0usize, 0usize, 0i32);
    // SAFETY: the header (16 bytes) was validated to lie within `src`; the calls only read it.
    unsafe {
        blosc_src::blosc_cbuffer_sizes(
            src.as_ptr().cast(),
            &raw mut n,
            &raw mut cbytes,
            &raw mut blocksize,
        );
        blosc_src::blosc_cbuffer_metainfo(src.as_ptr().cast(), &raw mut typesize, &raw mut flags);
    }
    if cbytes > src.len() {
        return Err(format!(
            "blosc header claims {cbytes} compressed bytes but the chunk has {}",
            src.len()
        ));
    }
    // c-blosc writes blocks of at most the buffer's size; a larger (or negative, read as
    // nearly `usize::MAX`) block size is a damaged header.
    if blocksize > nbytes.max(1) {
        return Err(format!(
            "blosc header claims blocks of {blocksize} bytes in a buffer of {nbytes}"
        ));
    }
    Ok(BloscHeader {
        nbytes,
        typesize: typesize.max(1),
        blocksize,
    })
}

/// Decompresses the whole of `src` into `dst`, which must be exactly `header.nbytes` long.
pub fn blosc_decompress(src: &[u8], header: &BloscHeader, dst: &mut [u8]) -> Result<(), String> {
    if dst.len() != header.nbytes {
        return Err(format!(
            "blosc chunk decodes to {} bytes, expected {}",
            header.nbytes,
            dst.len()
        ));
    }
    // SAFETY: `src` was validated by `blosc_header` (its compressed size fits in the slice);
    // `dst` has exactly the `nbytes` the header announces; one internal thread (a local
    // context, no global state).
    let n = unsafe {
        blosc_src::blosc_decompress_ctx(
            src.as_ptr().cast(),
            dst.as_mut_ptr().cast::<c_void>(),
            dst.len(),
            1,
        )
    };
    if n < 0 || n as usize != dst.len() {
        return Err(format!("blosc decompression failed (code {n})"));
    }
    Ok(())
}

/// Decompresses only the items `[start, start + dst.len() / typesize)` of `src` into `dst`,
/// decoding just the blocks that hold them. `dst.len()` and the start must be multiples of the
/// typesize (checked).
pub fn blosc_getitem(
    src: &[u8],
    header: &BloscHeader,
    start_byte: usize,
    dst: &mut [u8],
) -> Result<(), String> {
    let ts = header.typesize;
    if !start_byte.is_multiple_of(ts)
        || !dst.len().is_multiple_of(ts)
        || start_byte + dst.len() > header.nbytes
    {
        return Err(format!(
            "blosc partial read {start_byte}+{} does not fit items of {ts} bytes in {}",
            dst.len(),
            header.nbytes
        ));
    }
    let start =
        i32::try_from(start_byte / ts).map_err(|_| "blosc item index overflow".to_string())?;
    let nitems =
        i32::try_from(dst.len() / ts).map_err(|_| "blosc item count overflow".to_string())?;
    // SAFETY: `src` was validated by `blosc_header`; the item range lies within the decoded size
    // (checked above) and `dst` holds exactly `nitems * typesize` bytes.
    let n = unsafe {
        blosc_src::blosc_getitem(src.as_ptr().cast(), start, nitems, dst.as_mut_ptr().cast())
    };
    if n < 0 || n as usize != dst.len() {
        return Err(format!("blosc partial decompression failed (code {n})"));
    }
    Ok(())
}

unsafe extern "C" {
    /// From liblz4 (linked through `lz4-sys`), which does not bind it.
    fn LZ4_decompress_safe_partial(
        src: *const std::ffi::c_char,
        dst: *mut std::ffi::c_char,
        src_size: std::ffi::c_int,
        target_output_size: std::ffi::c_int,
        dst_capacity: std::ffi::c_int,
    ) -> std::ffi::c_int;
}

/// Decompresses the LZ4 block `src` into `dst`, stopping once `want` bytes are out
/// (`want <= dst.len()`); returns how many bytes it produced, or `None` if the block is
/// malformed. With `want == dst.len()` the whole block is decoded (and must fill `dst`, which
/// the caller checks).
pub fn lz4_decompress(src: &[u8], dst: &mut [u8], want: usize) -> Option<usize> {
    let src_size = i32::try_from(src.len()).ok()?;
    let cap = i32::try_from(dst.len()).ok()?;
    let target = i32::try_from(want.min(dst.len())).ok()?;
    let n = if target == cap {
        // SAFETY: `src` holds `src_size` readable bytes and `dst` `cap` writable ones; the safe
        // decoder never reads or writes outside them, whatever the input.
        unsafe {
            lz4_sys::LZ4_decompress_safe(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_size,
                cap,
            )
        }
    } else {
        // SAFETY: as above; the partial decoder also stays within `cap` and stops at `target`
        // (<= `cap`).
        unsafe {
            LZ4_decompress_safe_partial(
                src.as_ptr().cast(),
                dst.as_mut_ptr().cast(),
                src_size,
                target,
                cap,
            )
        }
    };
    usize::try_from(n).ok()
}

/// The C libraries' compressors, to make the chunks that tests, fuzz targets and benchmarks
/// decode.
pub mod compress {
    /// Compresses `data` with c-blosc (clevel 5; `shuffle` 0 none, 1 byte, 2 bit; `blocksize`
    /// 0 for c-blosc's choice), into `data.len() + 16` bytes as numcodecs and zarrs do, so data
    /// that does not compress is stored (the memcpyed flag).
    ///
    /// # Panics
    /// If `cname` holds a NUL byte or c-blosc fails.
    pub fn blosc_compress(
        data: &[u8],
        typesize: usize,
        shuffle: i32,
        cname: &str,
        blocksize: usize,
    ) -> Vec<u8> {
        let mut out = vec![0u8; data.len() + 16];
        let cname = std::ffi::CString::new(cname).unwrap();
        // SAFETY: `data` and `out` are valid for their lengths; c-blosc writes at most
        // `out.len()` bytes (>= data.len() + BLOSC_MAX_OVERHEAD) and reads `data.len()`.
        let n = unsafe {
            blosc_src::blosc_compress_ctx(
                5,
                shuffle,
                typesize,
                data.len(),
                data.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                out.len(),
                cname.as_ptr(),
                blocksize,
                1,
            )
        };
        assert!(n > 0, "blosc compression failed ({n})");
        out.truncate(n as usize);
        out
    }

    /// liblz4's compression of `data` (`hc`: its high-compression mode, whose matches are
    /// longer and overlap more).
    ///
    /// # Panics
    /// If `data` is longer than liblz4 takes (2 GiB).
    pub fn lz4_compress(data: &[u8], hc: bool) -> Vec<u8> {
        let len = i32::try_from(data.len()).unwrap();
        // SAFETY: plain arithmetic on a size.
        let bound = unsafe { lz4_sys::LZ4_compressBound(len) };
        let mut out = vec![0u8; usize::try_from(bound).unwrap()];
        // SAFETY: `data` holds `len` readable bytes and `out` `bound` writable ones.
        let n = unsafe {
            if hc {
                lz4_sys::LZ4_compress_HC(
                    data.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    len,
                    bound,
                    9,
                )
            } else {
                lz4_sys::LZ4_compress_default(
                    data.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    len,
                    bound,
                )
            }
        };
        out.truncate(usize::try_from(n).unwrap());
        out
    }
}
