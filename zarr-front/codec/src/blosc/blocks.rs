//! Fetching only the blocks of a blosc chunk that a byte range needs.
//!
//! A blosc chunk starts with its header and the offset of every block, and c-blosc stores the
//! blocks one after the other in that order. So a reader of a large chunk from an object store
//! can fetch a short prefix first ([`BlockIndex::prefix_len`]), learn from it where the needed
//! blocks lie ([`BlockIndex::span`]), fetch only those, and rebuild a smaller chunk
//! ([`BlockIndex::assemble`]) that decodes the needed range to the same bytes as the whole
//! chunk would, through this crate's decoder or c-blosc's `getitem`.

use std::ops::Range;

use super::frame::{HEADER, MEMCPYED, RESERVED, VERSION_FORMAT, le_usize};

/// Blocks are assumed to hold at least this many bytes when sizing the prefix: c-blosc picks
/// 8 KiB or more for any chunk over 32 KiB unless told otherwise. A chunk with smaller blocks
/// has more offsets than the prefix holds, and is fetched whole.
const MIN_BLOCK: usize = 4096;

/// Where the blocks of one blosc chunk are, from the prefix of its encoded bytes.
#[derive(Debug, Clone)]
pub struct BlockIndex {
    /// The header and the block offsets, as stored.
    head: Vec<u8>,
    nbytes: usize,
    blocksize: usize,
    typesize: usize,
    cbytes: usize,
    /// Where each block's bytes are in the encoded chunk. c-blosc writes blocks in the order
    /// its threads finish them, so they need not be in order: each ends where the next one in
    /// the chunk begins, the last at the end of the chunk.
    extents: Vec<Range<usize>>,
}

impl BlockIndex {
    /// Bytes of the prefix to fetch for a chunk of `nbytes` decoded bytes: the header and the
    /// offsets of up to `nbytes / 4 KiB` blocks.
    pub fn prefix_len(nbytes: usize) -> usize {
        HEADER + 4 * nbytes.div_ceil(MIN_BLOCK)
    }

    /// Reads the header and block offsets from `prefix`, the first bytes of a blosc chunk
    /// that decodes to `nbytes` bytes (the whole chunk may be shorter than the prefix asked
    /// for). `None` where the chunk cannot be fetched in parts: a damaged or unknown header, a
    /// chunk stored uncompressed or of one block, offsets past the prefix, or two blocks at
    /// one offset. The whole chunk is then fetched, and its decoder words any error.
    pub fn parse(prefix: &[u8], nbytes: usize) -> Option<BlockIndex> {
        if prefix.len() < HEADER {
            return None;
        }
        let (version, flags, typesize) = (prefix[0], prefix[2], usize::from(prefix[3]));
        let declared = le_usize(prefix, 4, "").ok()?;
        let blocksize = le_usize(prefix, 8, "").ok()?;
        let cbytes = le_usize(prefix, 12, "").ok()?;
        if version != VERSION_FORMAT
            || flags & (RESERVED | MEMCPYED) != 0
            || declared != nbytes
            || typesize == 0
            || blocksize == 0
            || blocksize >= nbytes
        {
            return None;
        }
        let nblocks = nbytes.div_ceil(blocksize);
        let head_len = HEADER + 4 * nblocks;
        if head_len > prefix.len() || head_len > cbytes {
            return None;
        }
        let starts: Vec<usize> = (0..nblocks)
            .map(|j| le_usize(prefix, HEADER + 4 * j, "").ok())
            .collect::<Option<_>>()?;
        let mut sorted = starts.clone();
        sorted.sort_unstable();
        let valid = sorted.first().is_some_and(|&s| s >= head_len)
            && sorted.windows(2).all(|w| w[0] < w[1])
            && sorted.last().is_some_and(|&s| s < cbytes);
        if !valid {
            return None;
        }
        let extents = starts
            .iter()
            .map(|&s| {
                let next = sorted.partition_point(|&o| o <= s);
                s..sorted.get(next).copied().unwrap_or(cbytes)
            })
            .collect();
        Some(BlockIndex {
            head: prefix[..head_len].to_vec(),
            nbytes,
            blocksize,
            typesize,
            cbytes,
            extents,
        })
    }

    /// Size of the whole encoded chunk.
    pub fn encoded_len(&self) -> usize {
        self.cbytes
    }

    /// Bytes of the header and block offsets (what a cache of this index holds).
    pub fn head_len(&self) -> usize {
        self.head.len()
    }

    /// Bytes of each block once decoded (the last may hold fewer).
    pub fn blocksize(&self) -> usize {
        self.blocksize
    }

    /// Where each block's bytes are in the encoded chunk, by block number.
    pub fn extents(&self) -> &[Range<usize>] {
        &self.extents
    }

    /// The numbers of the blocks that hold the decoded bytes `want` (read as whole items of
    /// `elsize` bytes). `None` when decoding `want` could read other blocks too (c-blosc's
    /// `getitem` is used only where it skips at least one block: the same test as the
    /// decoder's).
    pub fn blocks(&self, want: &Range<usize>, elsize: usize) -> Option<Range<usize>> {
        if want.is_empty() || want.end > self.nbytes {
            return None;
        }
        let unit = |n: usize| n.max(1);
        let (ts, es) = (unit(self.typesize), unit(elsize));
        let start = (want.start / ts * ts).min(want.start / es * es);
        let end = (want.end.div_ceil(ts) * ts).max(want.end.div_ceil(es) * es);
        // Past the end (items that do not divide the chunk) c-blosc would decode it whole.
        if end > self.nbytes || (end - start).checked_add(self.blocksize)? > self.nbytes {
            return None;
        }
        Some(start / self.blocksize..(end - 1) / self.blocksize + 1)
    }

    /// The encoded bytes of the blocks that hold the decoded bytes `want` ([`Self::blocks`]):
    /// from the first to the end of the last of them, in the order they are stored.
    pub fn extent(&self, want: &Range<usize>, elsize: usize) -> Option<Range<usize>> {
        let needed = &self.extents[self.blocks(want, elsize)?];
        let lo = needed.iter().map(|e| e.start).min()?;
        let hi = needed.iter().map(|e| e.end).max()?;
        Some(lo..hi)
    }

    /// The encoded bytes to fetch for the decoded bytes `want` ([`Self::extent`]), where
    /// fetching them saves at least half the chunk.
    pub fn span(&self, want: &Range<usize>, elsize: usize) -> Option<Range<usize>> {
        self.extent(want, elsize)
            .filter(|span| span.len() * 2 <= self.cbytes)
    }

    /// The chunk rebuilt from the header and `fetched`, the encoded bytes `span` (from
    /// [`Self::span`]): the header, then those bytes, with the offsets and the compressed size
    /// rewritten to match. The offsets of the blocks outside `span` point past the end, so a
    /// decoder that reached one would report the chunk damaged rather than read another block.
    pub fn assemble(&self, span: &Range<usize>, fetched: &[u8]) -> Result<Vec<u8>, String> {
        if fetched.len() != span.len() || span.end > self.cbytes {
            return Err(format!(
                "{} bytes fetched for the blosc blocks at {span:?} of a {}-byte chunk",
                fetched.len(),
                self.cbytes
            ));
        }
        let head_len = self.head.len();
        let total = head_len + fetched.len();
        let as_i32 = |n: usize| {
            i32::try_from(n).map_err(|_| format!("blosc chunk of {n} bytes is too large"))
        };
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&self.head);
        out[12..16].copy_from_slice(&as_i32(total)?.to_le_bytes());
        for (j, e) in self.extents.iter().enumerate() {
            let at = if span.start <= e.start && e.end <= span.end {
                e.start - span.start + head_len
            } else {
                total
            };
            out[HEADER + 4 * j..HEADER + 4 * j + 4].copy_from_slice(&as_i32(at)?.to_le_bytes());
        }
        out.extend_from_slice(fetched);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blosc::{Scratch, open};
    use crate::ffi::{blosc_getitem, blosc_header, compress::blosc_compress};
    use proptest::prelude::*;
    use rand::{RngExt, SeedableRng, rngs::StdRng};

    /// A smooth field with noise in the low bits, as `typesize`-byte items.
    fn field(n: usize, typesize: usize, seed: u64) -> Vec<u8> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n / typesize)
            .flat_map(|i| {
                let v = ((i as f64 * 0.001).sin() * 1e6) as i64 + rng.random_range(0..64);
                v.to_le_bytes().into_iter().cycle().take(typesize)
            })
            .collect()
    }

    /// Decodes `want` of `chunk` as the read path does: this crate's decoder where it takes
    /// the chunk, else c-blosc's `getitem` over whole items.
    fn decode(chunk: &[u8], want: &Range<usize>) -> Result<Vec<u8>, String> {
        let mut scratch = Scratch::default();
        if let Ok(c) = open(chunk, want.clone(), &mut scratch) {
            let mut out = vec![0u8; want.len()];
            c.gather(want.start, &mut out);
            return Ok(out);
        }
        let h = blosc_header(chunk)?;
        let ts = h.typesize;
        let (start, end) = (want.start / ts * ts, want.end.div_ceil(ts) * ts);
        let mut out = vec![0u8; end - start];
        blosc_getitem(chunk, &h, start, &mut out)?;
        Ok(out[want.start - start..want.end - start].to_vec())
    }

    /// Blocks stored out of order (as c-blosc's threads write them): the chunk with its first
    /// two blocks swapped, their offsets rewritten.
    fn swap_first_blocks(chunk: &[u8]) -> Vec<u8> {
        let at = |j: usize| le_usize(chunk, HEADER + 4 * j, "").unwrap();
        let (a, b, c) = (at(0), at(1), at(2));
        let mut out = chunk[..a].to_vec();
        out.extend_from_slice(&chunk[b..c]);
        out.extend_from_slice(&chunk[a..b]);
        out.extend_from_slice(&chunk[c..]);
        out[HEADER..HEADER + 4].copy_from_slice(&((a + c - b) as i32).to_le_bytes());
        out[HEADER + 4..HEADER + 8].copy_from_slice(&(a as i32).to_le_bytes());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every range decodes from the rebuilt chunk to the bytes of the whole chunk, across
        /// codecs, shuffles, item sizes and block sizes; and fetching in parts engages.
        #[test]
        fn rebuilt_chunks_decode_as_the_whole(
            seed in any::<u64>(),
            typesize in prop::sample::select(vec![1usize, 2, 4, 8]),
            shuffle in 0i32..3,
            cname in prop::sample::select(vec!["lz4", "zstd", "blosclz", "lz4hc"]),
            blocksize in prop::sample::select(vec![0usize, 16 << 10, 64 << 10]),
            blocks in 2usize..24,
            swapped: bool,
        ) {
            let n = blocks * (64 << 10) / typesize * typesize;
            let plain = field(n, typesize, seed);
            let mut whole = blosc_compress(&plain, typesize, shuffle, cname, blocksize);
            let h = blosc_header(&whole).unwrap();
            if swapped && whole[2] & MEMCPYED == 0 && n.div_ceil(h.blocksize) >= 3 {
                whole = swap_first_blocks(&whole);
                prop_assert_eq!(decode(&whole, &(0..n)).unwrap(), &plain[..]);
            }
            let prefix = &whole[..BlockIndex::prefix_len(n).min(whole.len())];
            let Some(index) = BlockIndex::parse(prefix, n) else {
                // Only chunks of one block (or stored uncompressed) are refused.
                prop_assert!(h.blocksize >= n || whole[2] & MEMCPYED != 0);
                return Ok(());
            };
            prop_assert_eq!(index.encoded_len(), whole.len());
            let mut rng = StdRng::seed_from_u64(seed ^ 1);
            let mut engaged = 0;
            for _ in 0..24 {
                let a = rng.random_range(0..n);
                let b = rng.random_range(a + 1..=(a + n / 5).min(n));
                let want = a..b;
                let Some(extent) = index.extent(&want, typesize) else {
                    prop_assert!(index.span(&want, typesize).is_none());
                    continue;
                };
                // Whether it saves half the chunk or not, the extent alone decodes `want`.
                let chunk = index.assemble(&extent, &whole[extent.clone()]).unwrap();
                prop_assert_eq!(decode(&chunk, &want).unwrap(), &plain[want.clone()]);
                let blocks = index.blocks(&want, typesize).unwrap();
                prop_assert!(blocks.start * index.blocksize() <= want.start);
                prop_assert!(want.end <= (blocks.end * index.blocksize()).min(n));
                match index.span(&want, typesize) {
                    Some(span) => {
                        engaged += 1;
                        prop_assert_eq!(&span, &extent);
                        prop_assert!(span.len() * 2 <= whole.len());
                    }
                    None => prop_assert!(extent.len() * 2 > whole.len()),
                }
            }
            prop_assert!(engaged > 0 || index.blocksize * 3 > n);
        }
    }

    #[test]
    fn a_short_or_damaged_prefix_fetches_whole() {
        let n = 1 << 20;
        let plain = field(n, 4, 7);
        let whole = blosc_compress(&plain, 4, 1, "lz4", 64 << 10);
        let index = BlockIndex::parse(&whole[..BlockIndex::prefix_len(n)], n).unwrap();
        assert!(
            n.div_ceil(index.blocksize) >= 4,
            "blocks of {}",
            index.blocksize
        );
        assert_eq!(index.head_len(), HEADER + 4 * n.div_ceil(index.blocksize));
        // Too short for the offsets, a wrong decoded size, a future version, offsets out of
        // order: all fetched whole.
        assert!(BlockIndex::parse(&whole[..HEADER + 8], n).is_none());
        assert!(BlockIndex::parse(&whole[..4096], n / 2).is_none());
        let mut bad = whole[..4096].to_vec();
        bad[0] = 9;
        assert!(BlockIndex::parse(&bad, n).is_none());
        let mut twice = whole[..4096].to_vec();
        twice.copy_within(HEADER + 4..HEADER + 8, HEADER);
        assert!(BlockIndex::parse(&twice, n).is_none());
        // Bytes that do not match the span asked for are an error, not a chunk.
        let span = index.span(&(1000..2000), 4).unwrap();
        assert!(
            index
                .assemble(&span, &whole[span.start..span.end - 1])
                .is_err()
        );
        // A block left out reads as damaged, never as another block's bytes.
        let chunk = index.assemble(&span, &whole[span.clone()]).unwrap();
        let far = n - 4000..n;
        let h = blosc_header(&chunk).unwrap();
        let mut out = vec![0u8; far.len()];
        assert!(blosc_getitem(&chunk, &h, far.start, &mut out).is_err());
        assert!(open(&chunk, far, &mut Scratch::default()).is_err());
    }
}
