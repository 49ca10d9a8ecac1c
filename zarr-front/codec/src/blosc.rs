//! Reading a byte range of a blosc chunk without decoding all of it.
//!
//! c-blosc (format 2, as every c-blosc 1.x and numcodecs writes) decodes whole blocks: each of
//! a block's splits (one byte stream per byte of the type, when shuffled) is decompressed or
//! copied into a temporary buffer, then the whole block is unshuffled into the output. A crop
//! that needs a quarter of a chunk pays for all of it, and a blosc chunk of imagery is mostly
//! copying: the low bytes of 16-bit samples do not compress, so their split is stored raw and
//! c-blosc copies it only to read it again when unshuffling.
//!
//! This module parses the buffer itself and, for each block that holds needed bytes:
//! - takes splits stored raw straight from the encoded bytes, without copying them;
//! - decompresses LZ4 splits only as far as the last needed byte ([`crate::lz4`]);
//!
//! and [`Chunk::gather`] unshuffles just the bytes asked for, into a scratch chunk or straight
//! into the crops ([`Chunk::gather_group`] into a stitch's [`crate::dest::Rows`]), so the needed bytes are touched once.
//!
//! Left to c-blosc (an `Err` here, and the caller falls back): bitshuffle, splits compressed
//! with anything but LZ4 (blosclz, zlib, zstd, snappy), and anything this parser calls damaged
//! (c-blosc then words the error). As with any decoder that stops early, the bytes of a chunk
//! outside the needed range are not verified.

use std::ops::Range;

use crate::dest;
use crate::dest::{PrefetchAlong, Rows, RunGroup};
use crate::lz4;
use crate::shuffle::interleave;

/// Bytes of a blosc header.
const HEADER: usize = 16;
/// The only blosc format version c-blosc 1.x reads.
const VERSION_FORMAT: u8 = 2;
const DOSHUFFLE: u8 = 0x1;
const MEMCPYED: u8 = 0x2;
const DOBITSHUFFLE: u8 = 0x4;
/// A flag c-blosc 1.x refuses ("from the future").
const RESERVED: u8 = 0x8;
const DONT_SPLIT: u8 = 0x10;
/// The compressor code of LZ4 and LZ4HC (same stream format), in the flags' top three bits.
const LZ4_FORMAT: u8 = 1;
/// c-blosc splits blocks into one stream per byte of the type for types up to this size...
const MAX_SPLITS: usize = 16;
/// ...whose streams hold at least this many bytes.
const MIN_BUFFERSIZE: usize = 128;

/// Why a chunk is left to c-blosc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A valid chunk this module does not decode (bitshuffle, another compressor).
    Unsupported(&'static str),
    /// The buffer is damaged; c-blosc words the error.
    Corrupt(&'static str),
}

/// Where a split's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seg {
    /// Not decoded (not needed).
    Unread,
    /// Stored raw at this offset of the encoded bytes.
    Raw(usize),
    /// Decompressed into the scratch buffer, at its place in the block.
    Decoded,
}

/// Reused buffers of [`open`]: decompressed splits, and where each split is.
#[derive(Debug, Default)]
pub struct Scratch {
    tmp: Vec<u8>,
    segs: Vec<Seg>,
}

/// The header facts the layout depends on.
#[derive(Debug, Clone, Copy)]
struct Layout {
    nbytes: usize,
    blocksize: usize,
    /// Bytes per element of the shuffle; 1 when the chunk is not shuffled.
    shuffle: usize,
    /// Splits of a full block (the leftover block has one).
    splits: usize,
    memcpyed: bool,
}

impl Layout {
    /// Size and number of splits of block `j`.
    fn block(&self, j: usize) -> (usize, usize) {
        let start = j * self.blocksize;
        let size = self.blocksize.min(self.nbytes - start);
        let splits = if size == self.blocksize {
            self.splits
        } else {
            1
        };
        (size, splits)
    }
}

/// A blosc chunk opened for reading one byte range: see [`open`].
#[derive(Debug)]
pub struct Chunk<'a> {
    src: &'a [u8],
    tmp: &'a [u8],
    segs: &'a [Seg],
    layout: Layout,
    want: Range<usize>,
    decoded: usize,
    /// For a chunk of one block shuffled by 2, 4 or 8 bytes: that many byte streams (stream k
    /// holds byte k of every element), so [`Chunk::gather`] interleaves without a lookup.
    streams: Option<(usize, [&'a [u8]; 8])>,
}

/// Decompressed size of `src`, a blosc buffer (header only, not validated beyond its length).
pub fn decoded_size(src: &[u8]) -> Option<usize> {
    let b = src.get(4..8)?;
    usize::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
}

fn le_i32(src: &[u8], at: usize) -> Result<i32, Error> {
    let b = src
        .get(at..at + 4)
        .ok_or(Error::Corrupt("header past the end"))?;
    Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn le_usize(src: &[u8], at: usize, what: &'static str) -> Result<usize, Error> {
    usize::try_from(le_i32(src, at)?).map_err(|_| Error::Corrupt(what))
}

/// Opens the blosc buffer `src` for reading the bytes `want` of its decoded chunk: decodes the
/// splits those bytes come from (LZ4 splits only as far as needed) into `scratch`, and finds
/// the raw ones in `src`. Read the bytes with [`Chunk::gather`].
pub fn open<'a>(
    src: &'a [u8],
    want: Range<usize>,
    scratch: &'a mut Scratch,
) -> Result<Chunk<'a>, Error> {
    if src.len() < HEADER {
        return Err(Error::Corrupt("shorter than a blosc header"));
    }
    let (version, flags, typesize) = (src[0], src[2], usize::from(src[3]));
    let nbytes = le_usize(src, 4, "negative size")?;
    let blocksize = le_usize(src, 8, "negative block size")?;
    let ctbytes = le_usize(src, 12, "negative compressed size")?;
    if version != VERSION_FORMAT {
        return Err(Error::Corrupt("unknown blosc format version"));
    }
    if flags & RESERVED != 0 {
        return Err(Error::Corrupt("reserved flag set"));
    }
    if ctbytes > src.len() {
        return Err(Error::Corrupt("compressed size past the end"));
    }
    if ctbytes < HEADER {
        return Err(Error::Corrupt("compressed size shorter than the header"));
    }
    if want.start > want.end || want.end > nbytes {
        return Err(Error::Corrupt("range outside the chunk"));
    }
    if nbytes == 0 || typesize == 0 {
        return Err(Error::Unsupported("empty chunk"));
    }
    // As c-blosc, which refuses blocks larger than the buffer it decodes into (the chunk).
    if blocksize == 0 || blocksize > nbytes {
        return Err(Error::Corrupt("block size outside the chunk"));
    }
    let src = &src[..ctbytes];
    if flags & MEMCPYED != 0 {
        if nbytes + HEADER != ctbytes {
            return Err(Error::Corrupt("stored chunk of the wrong size"));
        }
        let layout = Layout {
            nbytes,
            blocksize: nbytes,
            shuffle: 1,
            splits: 1,
            memcpyed: true,
        };
        scratch.segs.clear();
        scratch.segs.push(Seg::Raw(HEADER));
        let decoded = want.len();
        return Ok(Chunk {
            src,
            tmp: &[],
            segs: &scratch.segs,
            layout,
            want,
            decoded,
            streams: None,
        });
    }
    if flags & DOBITSHUFFLE != 0 {
        return Err(Error::Unsupported("bitshuffle"));
    }
    let shuffle = if flags & DOSHUFFLE != 0 && typesize > 1 {
        typesize
    } else {
        1
    };
    let splits = if flags & DONT_SPLIT == 0
        && typesize <= MAX_SPLITS
        && blocksize / typesize >= MIN_BUFFERSIZE
    {
        typesize
    } else {
        1
    };
    if !blocksize.is_multiple_of(splits) {
        return Err(Error::Unsupported("block not a whole number of splits"));
    }
    let nblocks = nbytes.div_ceil(blocksize);
    if nblocks > (ctbytes - HEADER) / 4 {
        return Err(Error::Corrupt("block offsets past the end"));
    }
    let layout = Layout {
        nbytes,
        blocksize,
        shuffle,
        splits,
        memcpyed: false,
    };
    let compformat = flags >> 5;
    scratch.segs.clear();
    scratch.segs.resize(nblocks * splits, Seg::Unread);
    let mut decoded = 0;
    if !want.is_empty() {
        let (first, last) = (want.start / blocksize, (want.end - 1) / blocksize);
        let tmp_len = ((last + 1) * blocksize).min(nbytes);
        if scratch.tmp.len() < tmp_len {
            scratch.tmp.resize(tmp_len, 0);
        }
        for j in first..=last {
            let base = j * blocksize;
            let (size, nsplits) = layout.block(j);
            let la = want.start.max(base) - base;
            let lb = want.end.min(base + size) - base;
            let seg_len = size / nsplits;
            let need = needed_ranges(la..lb, size, shuffle, nsplits);
            let Some(last_seg) = need.iter().rposition(|r| !r.is_empty()) else {
                continue;
            };
            // First find the needed splits and ask for their bytes: the LZ4 splits' at once
            // (they are read first, at once); the needed bytes of the first raw split one line
            // at a time while the LZ4 splits decode (see `PrefetchAlong`: the unshuffle reads
            // them after), of any other raw split at once.
            let mut at = le_usize(src, HEADER + 4 * j, "negative block offset")?;
            let mut found: [Range<usize>; MAX_SPLITS] = std::array::from_fn(|_| 0..0);
            let mut along: Option<PrefetchAlong<'_>> = None;
            for (s, r) in need.iter().enumerate().take(last_seg + 1) {
                let csize = le_usize(src, at, "negative split size")?;
                let data = at + 4..at + 4 + csize;
                if data.end > src.len() {
                    return Err(Error::Corrupt("split past the end"));
                }
                if let Some(raw) = prefetch_split(src, data.clone(), r, seg_len) {
                    match along {
                        None => along = Some(PrefetchAlong::new(raw)),
                        Some(_) => dest::prefetch_read_l2(raw),
                    }
                }
                found[s] = data;
                at += 4 + csize;
            }
            let mut along = along.unwrap_or_else(PrefetchAlong::none);
            for (s, r) in need.iter().enumerate().take(last_seg + 1) {
                if r.is_empty() {
                    continue;
                }
                let data = found[s].clone();
                let (seg, n) = if data.len() == seg_len {
                    (Seg::Raw(data.start), r.end)
                } else if compformat == LZ4_FORMAT {
                    let n = r.end;
                    let out = &mut scratch.tmp[base + s * seg_len..base + (s + 1) * seg_len];
                    let got = lz4::decompress_along(&src[data], out, n, &mut along)
                        .ok_or(Error::Corrupt("damaged LZ4 split"))?;
                    if got < n || (n == seg_len && got != seg_len) {
                        return Err(Error::Corrupt("LZ4 split too short"));
                    }
                    (Seg::Decoded, n)
                } else {
                    return Err(Error::Unsupported("splits compressed other than by LZ4"));
                };
                scratch.segs[j * splits + s] = seg;
                decoded += n;
            }
            // Lines the LZ4 splits did not take (short splits, none at all, or an error).
            along.finish();
        }
    }
    let scratch: &'a Scratch = scratch;
    let mut chunk = Chunk {
        src,
        tmp: &scratch.tmp,
        segs: &scratch.segs,
        layout,
        want,
        decoded,
        streams: None,
    };
    if nblocks == 1
        && matches!(shuffle, 2 | 4 | 8)
        && nbytes.is_multiple_of(shuffle)
        && !chunk.want.is_empty()
    {
        let neb = nbytes / shuffle;
        let mut streams: [&[u8]; 8] = [&[]; 8];
        for (k, s) in streams.iter_mut().enumerate().take(shuffle) {
            *s = chunk.seg_slice(0, k * neb, neb);
        }
        chunk.streams = Some((shuffle, streams));
    }
    Ok(chunk)
}

/// Asks the CPU for the bytes of `src`, a blosc chunk, that [`open`] reads first for `want`:
/// the header's line must have been asked for earlier (it is read here). For a chunk of one
/// block of two splits (16-bit samples, shuffled), each needed split that is compressed, all
/// of it (a raw split's needed bytes are asked for by [`open`], while the compressed one
/// decodes); for other chunks (and headers this cannot read), all of `src`; nothing for an
/// empty range.
pub fn prefetch(src: &[u8], want: Range<usize>) {
    if want.is_empty() {
        return;
    }
    let two_splits = || -> Option<()> {
        let (flags, typesize) = (*src.get(2)?, usize::from(*src.get(3)?));
        let nbytes = le_usize(src, 4, "").ok()?;
        let blocksize = le_usize(src, 8, "").ok()?;
        if flags & (MEMCPYED | DOBITSHUFFLE | DONT_SPLIT) != 0
            || flags & DOSHUFFLE == 0
            || typesize != 2
            || blocksize != nbytes
            || blocksize / 2 < MIN_BUFFERSIZE
            || want.end > nbytes
        {
            return None;
        }
        let seg_len = nbytes / 2;
        let need = needed_ranges(want.clone(), nbytes, 2, 2);
        let at0 = le_usize(src, HEADER, "").ok()?;
        let csize0 = le_usize(src, at0, "").ok()?;
        let at1 = at0.checked_add(4)?.checked_add(csize0)?;
        prefetch_split(src, at0 + 4..at1, &need[0], seg_len);
        // The second split's size sits after the first split: raw if the rest holds exactly it.
        let rest = src.len().checked_sub(at1)?;
        let csize1 = if rest == 4 + seg_len {
            seg_len
        } else {
            rest.saturating_sub(4)
        };
        dest::prefetch_read(src.get(at1..at1 + 4)?);
        prefetch_split(src, at1 + 4..at1 + 4 + csize1, &need[1], seg_len);
        Some(())
    };
    if two_splits().is_none() {
        dest::prefetch_read(src);
    }
}

/// For the split stored at `data` in `src`, if `need` (its needed bytes) is not empty: asks
/// for all of it if it is compressed (not `seg_len` bytes), read first and at once by the LZ4
/// decoder; returns the needed bytes if it is raw, read only after that, by the unshuffle.
///
/// [`open`] asks for those raw bytes one line at a time while the compressed split decodes
/// ([`PrefetchAlong`]); [`prefetch`], a chunk ahead, leaves them: asked for in one burst a
/// chunk ahead, hundreds of lines fill the core's outstanding misses and the burst waits on
/// them.
fn prefetch_split<'s>(
    src: &'s [u8],
    data: Range<usize>,
    need: &Range<usize>,
    seg_len: usize,
) -> Option<&'s [u8]> {
    if need.is_empty() {
        None
    } else if data.len() == seg_len {
        src.get(data.start + need.start..data.start + need.end)
    } else {
        if let Some(bytes) = src.get(data) {
            dest::prefetch_read(bytes);
        }
        None
    }
}

/// For the block bytes `range` of a block of `size` bytes shuffled by `shuffle` (1: not) and
/// stored in `nsplits` equal splits: the bytes of each split they need (empty: none). An LZ4
/// split decodes its prefix up to the range's end.
fn needed_ranges(
    range: Range<usize>,
    size: usize,
    shuffle: usize,
    nsplits: usize,
) -> [Range<usize>; MAX_SPLITS] {
    let mut need: [Range<usize>; MAX_SPLITS] = std::array::from_fn(|_| 0..0);
    if range.is_empty() {
        return need;
    }
    let seg_len = size / nsplits;
    // Marks the positions `q` of the block's split-ordered buffer as needed.
    let mut mark = |q: Range<usize>| {
        if q.is_empty() {
            return;
        }
        for (s, n) in need.iter_mut().enumerate().take(nsplits) {
            let seg = s * seg_len..(s + 1) * seg_len;
            if q.start < seg.end && q.end > seg.start {
                let (a, b) = (
                    q.start.max(seg.start) - seg.start,
                    q.end.min(seg.end) - seg.start,
                );
                *n = if Range::is_empty(n) {
                    a..b
                } else {
                    n.start.min(a)..n.end.max(b)
                };
            }
        }
    };
    if shuffle > 1 {
        let neb = size / shuffle;
        let main = neb * shuffle;
        let (e0, e1) = (range.start / shuffle, range.end.div_ceil(shuffle).min(neb));
        if e0 < e1 {
            for k in 0..shuffle {
                mark(k * neb + e0..k * neb + e1);
            }
        }
        mark(range.start.max(main)..range.end.max(main));
    } else {
        mark(range);
    }
    need
}

/// The longest run (bytes) that [`Chunk::gather_group`] writes with streaming stores
/// ([`Rows::write_interleaved2`]); longer runs take the per-run gather. A run's whole cache
/// lines then go to memory without being read first. Runs of 128 bytes at any alignment have
/// one whole line in most cases; the partial lines at their ends are stored as usual.
const STREAMED_RUN: usize = 512;

impl<'a> Chunk<'a> {
    /// Bytes decompressed or read from raw splits to open this range.
    pub fn decoded_bytes(&self) -> usize {
        self.decoded
    }

    /// `len` bytes at position `q` of block `j`'s split-ordered buffer (one split holds them).
    fn seg_slice(&self, j: usize, q: usize, len: usize) -> &'a [u8] {
        let (size, nsplits) = self.layout.block(j);
        let seg_len = size / nsplits;
        let s = q / seg_len;
        let off = q % seg_len;
        match self.segs[j * self.layout.splits + s] {
            Seg::Raw(at) => &self.src[at + off..at + off + len],
            Seg::Decoded => {
                let at = j * self.layout.blocksize + s * seg_len + off;
                &self.tmp[at..at + len]
            }
            Seg::Unread => unreachable!("blosc split {s} of block {j} read but not opened"),
        }
    }

    /// Writes the decoded chunk's bytes `at..at + out.len()` into `out`. The bytes must lie in
    /// the range the chunk was opened for.
    ///
    /// # Panics
    /// If they do not (the planner's guarantee).
    #[inline]
    pub fn gather(&self, at: usize, out: &mut [u8]) {
        assert!(
            at >= self.want.start && at + out.len() <= self.want.end,
            "blosc gather {at}+{} outside the opened range {:?}",
            out.len(),
            self.want
        );
        // The common case (16-bit samples in one block), called once per row of a crop in the
        // chunk, so kept small enough to inline and free of divisions by the type size: with
        // the general path's four divisions and large frame, `gather` alone was 7% of a
        // blosc-lz4 crop read's samples in perf.
        if let Some((2, s)) = &self.streams
            && at.is_multiple_of(2)
            && out.len().is_multiple_of(2)
        {
            let (e0, e1) = (at / 2, at / 2 + out.len() / 2);
            interleave::<2>([&s[0][e0..e1], &s[1][e0..e1]], out);
            return;
        }
        self.gather_general(at, out);
    }

    /// Gathers the runs of `group` (decoded-chunk bytes `group.src + i * group.src_step`, as
    /// many as `rows.row(i)` holds) into `rows`. The common case (16-bit samples in one block,
    /// every run inside the opened range and at most `STREAMED_RUN` bytes) checks the group
    /// once and interleaves run by run; anything else gathers run by run.
    pub fn gather_group(&self, group: &RunGroup, rows: &mut Rows<'_>) {
        let len = rows.run_len();
        if let Some((2, s)) = &self.streams
            && len.is_multiple_of(2)
            && group.src.is_multiple_of(2)
            && group.src_step.is_multiple_of(2)
            && let Some(end) = (group.rows.max(1) - 1)
                .checked_mul(group.src_step)
                .and_then(|x| x.checked_add(group.src + len))
            && group.src >= self.want.start
            && end <= self.want.end
            && len <= STREAMED_RUN
        {
            let (e0, e1) = (group.src / 2, end / 2);
            let (a, b) = (&s[0][e0..e1], &s[1][e0..e1]);
            let (half, step) = (len / 2, group.src_step / 2);
            for i in 0..group.rows {
                let at = i * step;
                rows.write_interleaved2(i, &a[at..at + half], &b[at..at + half]);
            }
            return;
        }
        for i in 0..group.rows {
            self.gather(group.src + i * group.src_step, rows.row(i));
        }
    }

    /// [`Self::gather`] of any chunk this module opens.
    #[inline(never)]
    fn gather_general(&self, at: usize, out: &mut [u8]) {
        if self.layout.memcpyed {
            out.copy_from_slice(&self.src[HEADER + at..HEADER + at + out.len()]);
            return;
        }
        if let Some((ts, s)) = &self.streams
            && at.is_multiple_of(*ts)
            && out.len().is_multiple_of(*ts)
        {
            let (e0, e1) = (at / ts, (at + out.len()) / ts);
            match ts {
                2 => interleave::<2>([&s[0][e0..e1], &s[1][e0..e1]], out),
                4 => interleave::<4>(std::array::from_fn(|k| &s[k][e0..e1]), out),
                _ => interleave::<8>(std::array::from_fn(|k| &s[k][e0..e1]), out),
            }
            return;
        }
        let bs = self.layout.blocksize;
        let mut p = at;
        let mut out = out;
        while !out.is_empty() {
            let j = p / bs;
            let (size, nsplits) = self.layout.block(j);
            let lp = p - j * bs;
            let n = out.len().min(size - lp);
            let (here, rest) = out.split_at_mut(n);
            if self.layout.shuffle > 1 {
                self.unshuffle(j, size, lp, here);
            } else {
                // Not shuffled: the block is its splits in order.
                let seg_len = size / nsplits;
                let mut q = lp;
                let mut to = &mut here[..];
                while !to.is_empty() {
                    let len = to.len().min(seg_len - q % seg_len);
                    let (part, later) = to.split_at_mut(len);
                    part.copy_from_slice(self.seg_slice(j, q, len));
                    to = later;
                    q += len;
                }
            }
            out = rest;
            p += n;
        }
    }

    /// Unshuffles the bytes `lp..lp + out.len()` of block `j` (of `size` bytes) into `out`.
    fn unshuffle(&self, j: usize, size: usize, lp: usize, out: &mut [u8]) {
        let ts = self.layout.shuffle;
        let neb = size / ts;
        let main = neb * ts;
        let end = lp + out.len();
        // Shuffled part: element e's byte k is byte e of stream k.
        let mut p = lp;
        let byte = |p: usize| self.seg_slice(j, (p % ts) * neb + p / ts, 1)[0];
        while p < end.min(main) && !p.is_multiple_of(ts) {
            out[p - lp] = byte(p);
            p += 1;
        }
        let whole_end = end.min(main) / ts * ts;
        if p < whole_end {
            let (e0, e1) = (p / ts, whole_end / ts);
            let to = &mut out[p - lp..whole_end - lp];
            let stream = |k: usize| self.seg_slice(j, k * neb + e0, e1 - e0);
            match ts {
                2 => interleave::<2>([stream(0), stream(1)], to),
                4 => interleave::<4>(std::array::from_fn(stream), to),
                8 => interleave::<8>(std::array::from_fn(stream), to),
                _ => {
                    for k in 0..ts {
                        for (o, &b) in to[k..].iter_mut().step_by(ts).zip(stream(k)) {
                            *o = b;
                        }
                    }
                }
            }
            p = whole_end;
        }
        while p < end.min(main) {
            out[p - lp] = byte(p);
            p += 1;
        }
        // Bytes past the last whole element are stored as they are, at the block's end.
        if end > main {
            let from = p.max(main);
            out[from - lp..].copy_from_slice(self.seg_slice(j, from, end - from));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::compress::blosc_compress as compress;
    use rand::{RngExt, SeedableRng};

    /// Imagery-like 16-bit samples: a smooth field plus noise in the low byte.
    fn imagery(rng: &mut rand::rngs::StdRng, n: usize, elsize: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n * elsize);
        let mut v: u64 = rng.random();
        for i in 0..n {
            if i % 97 == 0 {
                v = v.wrapping_add(rng.random_range(0..1000));
            }
            let x = v.wrapping_add(rng.random_range(0..256u64)) ^ ((i as u64 / 128) << 9);
            out.extend((0..elsize).map(|b| x.to_le_bytes()[b % 8]));
        }
        out
    }

    fn check_ranges(encoded: &[u8], expected: &[u8], rng: &mut rand::rngs::StdRng, what: &str) {
        let mut scratch = Scratch::default();
        let len = expected.len();
        for t in 0..40 {
            let (a, b) = match t {
                0 => (0, len),
                1 => (0, 1.min(len)),
                2 => (len.saturating_sub(3), len),
                _ => {
                    let a = rng.random_range(0..=len);
                    (a, rng.random_range(a..=len))
                }
            };
            prefetch(encoded, a..b);
            let chunk =
                open(encoded, a..b, &mut scratch).unwrap_or_else(|e| panic!("{what}: {e:?}"));
            let mut out = vec![0xAAu8; b - a];
            chunk.gather(a, &mut out);
            assert_eq!(out, expected[a..b], "{what}: range {a}..{b}");
            // Gathered in pieces, as the stitch asks for rows.
            if b > a {
                let mid = rng.random_range(a..=b);
                let mut pieces = vec![0u8; b - a];
                let (head, tail) = pieces.split_at_mut(mid - a);
                chunk.gather(a, head);
                chunk.gather(mid, tail);
                assert_eq!(
                    pieces,
                    expected[a..b],
                    "{what}: pieces of {a}..{b} at {mid}"
                );
            }
        }
    }

    #[test]
    fn ranges_equal_c_blosc_across_layouts() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut tried, mut several_blocks) = (0, 0);
        for &elsize in &[1usize, 2, 4, 8, 3, 16] {
            for &n in &[1usize, 7, 100, 1000, 16384, 40000, 150_000] {
                for &(shuffle, cname) in &[
                    (1, "lz4"),
                    (0, "lz4"),
                    (1, "lz4hc"),
                    (1, "blosclz"),
                    (2, "lz4"),
                ] {
                    for &blocksize in &[0usize, 4096] {
                        let data = if rng.random_bool(0.3) {
                            (0..n * elsize).map(|_| rng.random()).collect()
                        } else {
                            imagery(&mut rng, n, elsize)
                        };
                        let encoded = compress(&data, elsize, shuffle, cname, blocksize);
                        let what = format!(
                            "elsize {elsize} n {n} shuffle {shuffle} {cname} bs {blocksize}"
                        );
                        match open(&encoded, 0..data.len(), &mut Scratch::default()) {
                            Ok(chunk) => {
                                if chunk.layout.blocksize < chunk.layout.nbytes {
                                    several_blocks += 1;
                                }
                                check_ranges(&encoded, &data, &mut rng, &what);
                                tried += 1;
                            }
                            // Bitshuffle and blosclz (when a split compresses) are c-blosc's.
                            Err(Error::Unsupported(_)) => {
                                assert!(shuffle == 2 || cname == "blosclz", "{what}");
                            }
                            Err(e) => panic!("{what}: {e:?}"),
                        }
                    }
                }
            }
        }
        assert!(tried > 250, "only {tried} layouts took this path");
        assert!(
            several_blocks > 20,
            "only {several_blocks} chunks of several blocks"
        );
    }

    #[test]
    fn a_needed_prefix_stops_the_lz4_split_early() {
        // Constant high bytes compress; random low bytes are stored raw.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let data: Vec<u8> = (0..16384).flat_map(|_| [rng.random::<u8>(), 7u8]).collect();
        let encoded = compress(&data, 2, 1, "lz4", 0);
        let mut scratch = Scratch::default();
        let chunk = open(&encoded, 0..200, &mut scratch).unwrap();
        // 100 elements: 100 bytes of each of the two splits.
        assert_eq!(chunk.decoded_bytes(), 200);
        assert_eq!(chunk.segs, [Seg::Raw(24), Seg::Decoded]);
        let chunk = open(&encoded, 1000..1001, &mut scratch).unwrap();
        // Both splits up to element 500: the LZ4 one decodes that far, the raw one is only
        // read at element 500.
        assert_eq!(chunk.decoded_bytes(), 2 * 501);
        let mut out = [0u8];
        chunk.gather(1000, &mut out);
        assert_eq!(out[0], data[1000]);
        // A prefix of most of the LZ4 split decodes only that far too: 15000 elements of each
        // split.
        let chunk = open(&encoded, 0..30000, &mut scratch).unwrap();
        assert_eq!(chunk.decoded_bytes(), 2 * 15000);
        let mut out = vec![0u8; 30000];
        chunk.gather(0, &mut out);
        assert_eq!(out, data[..30000]);
    }

    #[test]
    fn damaged_buffers_are_errors_not_panics() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let data = imagery(&mut rng, 16384, 2);
        let good = compress(&data, 2, 1, "lz4", 0);
        let mut corrupt = 0;
        for t in 0..3000 {
            let mut bad = good.clone();
            match t % 3 {
                0 => bad.truncate(rng.random_range(0..good.len())),
                1 => {
                    for _ in 0..rng.random_range(1..4) {
                        let i = rng.random_range(0..bad.len());
                        bad[i] ^= 1 << rng.random_range(0..8);
                    }
                }
                _ => {
                    let i = rng.random_range(HEADER..bad.len());
                    for b in &mut bad[i..] {
                        *b = rng.random();
                    }
                }
            }
            let a = rng.random_range(0..data.len());
            let b = rng.random_range(a..=data.len());
            // Prefetching reads the header too, and must not trip over damage either.
            prefetch(&bad, a..b);
            match open(&bad, a..b, &mut Scratch::default()) {
                Ok(chunk) => {
                    let mut out = vec![0; b - a];
                    chunk.gather(a, &mut out);
                }
                Err(Error::Corrupt(_)) => corrupt += 1,
                Err(Error::Unsupported(_)) => {}
            }
        }
        assert!(corrupt > 500, "only {corrupt} damaged buffers detected");
        // Found by fuzzing: a compressed size below the header's own.
        for ctbytes in [0i32, 3, 15] {
            let mut bad = good.clone();
            bad[12..16].copy_from_slice(&ctbytes.to_le_bytes());
            assert!(matches!(
                open(&bad, 0..10, &mut Scratch::default()),
                Err(Error::Corrupt(_))
            ));
        }
    }

    #[test]
    fn stored_chunks_and_a_range_past_the_end() {
        let data: Vec<u8> = (0..=255).collect();
        // Random bytes do not compress: c-blosc stores the chunk (the memcpyed flag).
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let noise: Vec<u8> = (0..4096).map(|_| rng.random()).collect();
        let stored = compress(&noise, 1, 0, "lz4", 0);
        assert_ne!(stored[2] & MEMCPYED, 0, "expected a stored chunk");
        check_ranges(&stored, &noise, &mut rng, "stored");
        let encoded = compress(&data, 1, 0, "lz4", 0);
        assert!(matches!(
            open(&encoded, 0..257, &mut Scratch::default()),
            Err(Error::Corrupt(_))
        ));
        assert_eq!(decoded_size(&encoded), Some(256));
    }
}
