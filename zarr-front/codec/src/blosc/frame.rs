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

/// [`Error::Unsupported`] of a bitshuffled chunk.
pub const BITSHUFFLE: &str = "bitshuffle";
/// [`Error::Unsupported`] of a chunk whose splits are compressed by a codec other than LZ4 or
/// zstd.
pub const OTHER_COMPRESSOR: &str = "splits compressed other than by LZ4 or zstd";

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
    /// Bytes per element of the shuffle; 1 when the chunk is not shuffled.
    pub(super) shuffle: usize,
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

/// A blosc chunk opened for reading one byte range: see [`open`].
#[derive(Debug)]
pub struct Chunk<'a> {
    pub(super) src: &'a [u8],
    pub(super) tmp: &'a [u8],
    pub(super) segs: &'a [Seg],
    pub(super) layout: Layout,
    pub(super) want: Range<usize>,
    pub(super) decoded: usize,
    /// For a chunk of one block shuffled by 2, 4 or 8 bytes: that many byte streams (stream k
    /// holds byte k of every element), so [`Chunk::gather`] interleaves without a lookup.
    pub(super) streams: Option<(usize, [&'a [u8]; 8])>,
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
        return Err(Error::Unsupported(BITSHUFFLE));
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

/// For the block bytes `range` of a block of `size` bytes shuffled by `shuffle` (1: not) and
/// stored in `nsplits` equal splits: the bytes of each split they need (empty: none). An LZ4
/// split decodes its prefix up to the range's end.
pub(super) fn needed_ranges(
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
