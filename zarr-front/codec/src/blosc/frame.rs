//! The blosc buffer: its header, the splits of each block, and opening a byte range of it
//! (the splits it needs decompressed or found raw).

use std::ops::Range;

use crate::dest;
use crate::dest::PrefetchAlong;
use crate::lz4;

/// Bytes of a blosc header.
pub(super) const HEADER: usize = 16;
/// The only blosc format version c-blosc 1.x reads.
pub(super) const VERSION_FORMAT: u8 = 2;
pub(super) const DOSHUFFLE: u8 = 0x1;
pub(super) const MEMCPYED: u8 = 0x2;
pub(super) const DOBITSHUFFLE: u8 = 0x4;
/// A flag c-blosc 1.x refuses ("from the future").
pub(super) const RESERVED: u8 = 0x8;
pub(super) const DONT_SPLIT: u8 = 0x10;
/// The compressor code of LZ4 and LZ4HC (same stream format), in the flags' top three bits.
pub(super) const LZ4_FORMAT: u8 = 1;
/// The compressor code of zstd (each split one zstd frame).
pub(super) const ZSTD_FORMAT: u8 = 4;
/// c-blosc splits blocks into one stream per byte of the type for types up to this size...
pub(super) const MAX_SPLITS: usize = 16;
/// ...whose streams hold at least this many bytes.
pub(super) const MIN_BUFFERSIZE: usize = 128;

/// [`Error::Unsupported`] of a chunk whose splits are compressed by a codec other than LZ4 or
/// zstd.
pub const OTHER_COMPRESSOR: &str = "splits compressed other than by LZ4 or zstd";

/// Why a chunk is left to c-blosc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A valid chunk this module does not decode (another compressor, an unusual layout).
    Unsupported(&'static str),
    /// The buffer is damaged; c-blosc words the error.
    Corrupt(&'static str),
}

/// Where a split's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seg {
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
    pub(super) tmp: Vec<u8>,
    /// Bitshuffled blocks' needed bytes as byte planes: see [`Chunk::planes`].
    pub(super) planes: Vec<u8>,
    pub(super) segs: Vec<Seg>,
    /// Literals of zstd splits decoded in part.
    literals: Vec<u8>,
}

/// Decodes at least `want` of the zstd-compressed split `src` into `out` (the split's size):
/// only the part zcrop's decoder needs where it takes the frame and that pays, else the whole
/// split with libzstd. Returns how many bytes were decoded.
fn zstd_split(
    src: &[u8],
    out: &mut [u8],
    want: Range<usize>,
    literals: &mut Vec<u8>,
) -> Result<usize, Error> {
    match crate::zstd::decode_range(src, out, want, literals, crate::zstd::MAX_SHARE) {
        Ok(got) => Ok(got.len()),
        Err(crate::zstd::Error::Corrupt(_)) => Err(Error::Corrupt("damaged zstd split")),
        Err(crate::zstd::Error::Unsupported(_)) => {
            match crate::zstd::with_dctx(|d| d.decompress(out, src)) {
                Ok(n) if n == out.len() => Ok(n),
                _ => Err(Error::Corrupt("damaged zstd split")),
            }
        }
    }
}

/// The header facts the layout depends on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) nbytes: usize,
    pub(super) blocksize: usize,
    /// Bytes per element of the shuffle; 1 when the chunk is not shuffled. For a bitshuffled
    /// chunk, the type size.
    pub(super) shuffle: usize,
    /// Bitshuffled: see [`bit_main`].
    pub(super) bits: bool,
    /// Splits of a full block (the leftover block has one).
    pub(super) splits: usize,
    pub(super) memcpyed: bool,
}

impl Layout {
    /// Size and number of splits of block `j`.
    pub(super) fn block(&self, j: usize) -> (usize, usize) {
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

/// Bytes at the start of a bitshuffled block of `size` bytes that c-blosc transposed, for a
/// type of `ts` bytes: all whole elements if they are a multiple of 8 (and at least one), else
/// none. The transposed bytes are `8 * ts` rows of `elements / 8` bytes, row `8 * k + b`
/// holding bit `b` of byte `k` of every element; the bytes after them are stored as they are.
pub(super) fn bit_main(size: usize, ts: usize) -> usize {
    let elements = size / ts;
    if elements > 0 && elements.is_multiple_of(8) {
        elements * ts
    } else {
        0
    }
}

/// A blosc chunk opened for reading one byte range: see [`open`].
#[derive(Debug)]
pub struct Chunk<'a> {
    pub(super) src: &'a [u8],
    pub(super) tmp: &'a [u8],
    pub(super) segs: &'a [Seg],
    /// For a bitshuffled chunk: the needed groups of each block's transposed part, as the byte
    /// shuffle lays them out (byte `k` of element `e` of block `j` at `j * blocksize +
    /// k * (size / ts) + e`), so the unshuffle reads them as it reads a byte-shuffled block.
    pub(super) planes: &'a [u8],
    pub(super) layout: Layout,
    pub(super) want: Range<usize>,
    pub(super) decoded: usize,
    /// For a chunk of one block shuffled by 2, 4 or 8 bytes: that many byte streams (stream k
    /// holds byte k of every element), so [`Chunk::gather`] interleaves without a lookup.
    pub(super) streams: Option<(usize, [&'a [u8]; 8])>,
}

/// Whether `src`, a blosc buffer, decodes at about the speed of a memory copy: stored raw,
/// or compressed by LZ4 or BloscLZ (the header's flags only, not validated).
pub fn decodes_fast(src: &[u8]) -> bool {
    src.get(2)
        .is_some_and(|&flags| flags & MEMCPYED != 0 || matches!(flags >> 5, 0 | LZ4_FORMAT))
}

/// Decompressed size of `src`, a blosc buffer (header only, not validated beyond its length).
pub fn decoded_size(src: &[u8]) -> Option<usize> {
    let b = src.get(4..8)?;
    usize::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
}

pub(super) fn le_i32(src: &[u8], at: usize) -> Result<i32, Error> {
    let b = src
        .get(at..at + 4)
        .ok_or(Error::Corrupt("header past the end"))?;
    Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

pub(super) fn le_usize(src: &[u8], at: usize, what: &'static str) -> Result<usize, Error> {
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
            bits: false,
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
            planes: &[],
            layout,
            want,
            decoded,
            streams: None,
        });
    }
    // As c-blosc: the byte shuffle wins when both flags are set; a bitshuffled block shorter
    // than one element is stored as it is (`bit_main` is 0 then).
    let byte_shuffle = flags & DOSHUFFLE != 0 && typesize > 1;
    let bits = !byte_shuffle && flags & DOBITSHUFFLE != 0;
    let shuffle = if byte_shuffle || bits { typesize } else { 1 };
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
        bits,
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
        if bits && scratch.planes.len() < tmp_len {
            scratch.planes.resize(tmp_len, 0);
        }
        for j in first..=last {
            let base = j * blocksize;
            let (size, nsplits) = layout.block(j);
            let la = want.start.max(base) - base;
            let lb = want.end.min(base + size) - base;
            let seg_len = size / nsplits;
            let need = needed_ranges(la..lb, size, shuffle, nsplits, bits);
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
                } else if compformat == ZSTD_FORMAT {
                    let out = &mut scratch.tmp[base + s * seg_len..base + (s + 1) * seg_len];
                    let n = zstd_split(&src[data], out, r.clone(), &mut scratch.literals)?;
                    (Seg::Decoded, n)
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
                    return Err(Error::Unsupported(OTHER_COMPRESSOR));
                };
                scratch.segs[j * splits + s] = seg;
                decoded += n;
            }
            // Lines the LZ4 splits did not take (short splits, none at all, or an error).
            along.finish();
            if bits {
                let planes = &mut scratch.planes[base..base + size];
                let split = |q: usize, len: usize| {
                    seg_bytes(src, &scratch.tmp, &scratch.segs, &layout, j, q, len)
                };
                transpose_band(split, planes, size, shuffle, la..lb);
            }
        }
    }
    let scratch: &'a Scratch = scratch;
    let mut chunk = Chunk {
        src,
        tmp: &scratch.tmp,
        segs: &scratch.segs,
        planes: &scratch.planes,
        layout,
        want,
        decoded,
        streams: None,
    };
    if nblocks == 1
        && matches!(shuffle, 2 | 4 | 8)
        && nbytes.is_multiple_of(shuffle)
        && (!bits || bit_main(nbytes, shuffle) == nbytes)
        && !chunk.want.is_empty()
    {
        let neb = nbytes / shuffle;
        let mut streams: [&[u8]; 8] = [&[]; 8];
        for (k, s) in streams.iter_mut().enumerate().take(shuffle) {
            *s = chunk.shuffled(0, k * neb, neb);
        }
        chunk.streams = Some((shuffle, streams));
    }
    Ok(chunk)
}

/// `len` bytes at position `q` of block `j`'s split-ordered buffer (one split holds them): in
/// `src` for a raw split, in `tmp` for a decoded one.
pub(super) fn seg_bytes<'s>(
    src: &'s [u8],
    tmp: &'s [u8],
    segs: &[Seg],
    layout: &Layout,
    j: usize,
    q: usize,
    len: usize,
) -> &'s [u8] {
    let (size, nsplits) = layout.block(j);
    let seg_len = size / nsplits;
    let s = q / seg_len;
    let off = q % seg_len;
    match segs[j * layout.splits + s] {
        Seg::Raw(at) => &src[at + off..at + off + len],
        Seg::Decoded => {
            let at = j * layout.blocksize + s * seg_len + off;
            &tmp[at..at + len]
        }
        Seg::Unread => unreachable!("blosc split {s} of block {j} read but not opened"),
    }
}

/// Writes into `planes` (a block of `size` bytes, type size `ts`) the groups of 8 elements
/// that hold the block bytes `range`, bit-unshuffled into byte planes: byte `k` of element `e`
/// at `k * (size / ts) + e`. `split(q, len)` gives the bit-transposed block's bytes `q..q +
/// len`. Each group's byte `k` is the 8x8 bit transpose of one byte of each of rows `8 * k ..
/// 8 * k + 8`: gathering those bytes is the byte shuffle's interleave of 8 streams.
fn transpose_band<'s>(
    split: impl Fn(usize, usize) -> &'s [u8],
    planes: &mut [u8],
    size: usize,
    ts: usize,
    range: Range<usize>,
) {
    let main = bit_main(size, ts);
    let stop = range.end.min(main);
    if range.start >= stop {
        return;
    }
    let (elements, row) = (main / ts, main / ts / 8);
    let (g0, g1) = (range.start / ts / 8, stop.div_ceil(ts).div_ceil(8));
    for k in 0..ts {
        let rows: [&[u8]; 8] = std::array::from_fn(|b| split((8 * k + b) * row + g0, g1 - g0));
        let plane = &mut planes[k * elements + 8 * g0..k * elements + 8 * g1];
        crate::shuffle::interleave::<8>(rows, plane);
        for word in plane.chunks_exact_mut(8) {
            let x = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            word.copy_from_slice(&transpose_bits(x).to_le_bytes());
        }
    }
}

/// Transposes the 8x8 bit matrix `x` (byte `r` its row `r`, bit `c` of it column `c`): byte
/// `c` of the result holds bit `c` of every byte of `x`. bitshuffle's `TRANS_BIT_8X8`.
pub(super) fn transpose_bits(mut x: u64) -> u64 {
    let mut t = (x ^ (x >> 7)) & 0x00AA_00AA_00AA_00AA;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000_CCCC_0000_CCCC;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x0000_0000_F0F0_F0F0;
    x ^ t ^ (t << 28)
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
        let need = needed_ranges(want.clone(), nbytes, 2, 2, false);
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
pub(super) fn prefetch_split<'s>(
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

/// For the block bytes `range` of a block of `size` bytes shuffled by `shuffle` (1: not;
/// with `bits`, bitshuffled by that type size) and stored in `nsplits` equal splits: the bytes
/// of each split they need (empty: none). An LZ4 split decodes its prefix up to the range's
/// end. The shuffled part is planes of equal length: one per byte of the type, with element `e`
/// at byte `e`; or bitshuffled, one row per bit of the type, with the group of 8 elements
/// holding `e` at byte `e / 8`. A band of elements needs a band of every plane.
pub(super) fn needed_ranges(
    range: Range<usize>,
    size: usize,
    shuffle: usize,
    nsplits: usize,
    bits: bool,
) -> [Range<usize>; MAX_SPLITS] {
    let mut need: [Range<usize>; MAX_SPLITS] = std::array::from_fn(|_| 0..0);
    if range.is_empty() {
        return need;
    }
    let mut mark = |q: Range<usize>| mark_needed(&mut need, q, size / nsplits, nsplits);
    if shuffle > 1 || bits {
        let neb = size / shuffle;
        let main = if bits {
            bit_main(size, shuffle)
        } else {
            neb * shuffle
        };
        let (e0, e1) = (range.start / shuffle, range.end.min(main).div_ceil(shuffle));
        if e0 < e1 {
            let (planes, len, lo, hi) = if bits {
                (8 * shuffle, main / shuffle / 8, e0 / 8, e1.div_ceil(8))
            } else {
                (shuffle, neb, e0, e1)
            };
            for k in 0..planes {
                mark(k * len + lo..k * len + hi);
            }
        }
        mark(range.start.max(main)..range.end.max(main));
    } else {
        mark(range);
    }
    need
}

/// Widens `need` (per split, the bytes needed) by the positions `q` of a block's split-ordered
/// buffer, in splits of `seg_len` bytes.
fn mark_needed(
    need: &mut [Range<usize>; MAX_SPLITS],
    q: Range<usize>,
    seg_len: usize,
    nsplits: usize,
) {
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
}
