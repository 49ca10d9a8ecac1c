//! The literals section of a compressed block (RFC 8878, 3.1.1.3.1): raw, RLE or
//! Huffman-coded in one or four streams.

use std::ops::Range;

use super::bits::Backward;
use super::huffman::{Huffman, Stream};
use super::{Error, MAX_BLOCK, Result, corrupt};

/// The literals section of a compressed block.
pub(super) enum Literals<'a> {
    Raw(&'a [u8]),
    Rle(u8, usize),
    Huffman {
        /// The Huffman tree description (its table is built only for blocks decoded here).
        tree: &'a [u8],
        /// The streams (one or four), each with the literal range it produces.
        streams: Vec<(&'a [u8], Range<usize>)>,
        count: usize,
    },
}

impl<'a> Literals<'a> {
    pub(super) fn count(&self) -> usize {
        match self {
            Literals::Raw(r) => r.len(),
            Literals::Rle(_, n) => *n,
            Literals::Huffman { count, .. } => *count,
        }
    }

    /// How many literals decoding `want` takes: whole streams from their starts.
    pub(super) fn cost(&self, want: &Range<usize>) -> usize {
        match self {
            Literals::Huffman { streams, .. } => streams
                .iter()
                .filter(|(_, r)| r.end > want.start && r.start < want.end)
                .map(|(_, r)| r.end.min(want.end) - r.start)
                .sum(),
            _ => want.len(),
        }
    }

    /// Makes literals `want` (literal indices) appear in `out` (indexed by literal): raw and
    /// RLE literals are written now, Huffman streams are queued on `jobs`. Returns the literal
    /// range produced (Huffman streams start where they start).
    pub(super) fn plan(
        &'a self,
        table: Option<&'a Huffman>,
        want: Range<usize>,
        out: &'a mut [u8],
        jobs: &mut Vec<Stream<'a>>,
    ) -> Result<Range<usize>> {
        if want.is_empty() {
            return Ok(want);
        }
        match self {
            Literals::Raw(raw) => {
                out[want.clone()].copy_from_slice(&raw[want.clone()]);
                Ok(want)
            }
            Literals::Rle(b, _) => {
                out[want.clone()].fill(*b);
                Ok(want)
            }
            Literals::Huffman { streams, .. } => {
                let Some(table) = table else {
                    return corrupt("Huffman literals without their table");
                };
                let mut rest: &'a mut [u8] = out;
                let mut rest_base = 0;
                let mut produced = Range {
                    start: usize::MAX,
                    end: 0,
                };
                for (src, range) in streams {
                    if range.end <= want.start || range.start >= want.end {
                        continue;
                    }
                    let end = range.end.min(want.end);
                    let (_, tail) = std::mem::take(&mut rest).split_at_mut(range.start - rest_base);
                    let (mine, after) = tail.split_at_mut(end - range.start);
                    rest = after;
                    rest_base = end;
                    produced.start = produced.start.min(range.start);
                    produced.end = end;
                    let head = Backward::new(src, "Huffman literal stream")?;
                    jobs.push(Stream {
                        table,
                        src,
                        pos: head.pos,
                        out: mine,
                        done: 0,
                        whole: end == range.end,
                    });
                }
                Ok(produced)
            }
        }
    }
}

/// Reads the literals section at the start of `block`; returns it and its size in bytes.
pub(super) fn read_literals(block: &[u8]) -> Result<(Literals<'_>, usize)> {
    let Some(&h0) = block.first() else {
        return corrupt("block without a literals section");
    };
    let kind = h0 & 3;
    let format = (h0 >> 2) & 3;
    let byte = |i: usize| -> Result<u32> {
        block
            .get(i)
            .map(|&b| u32::from(b))
            .ok_or_else(|| Error::Corrupt("literals section header truncated".into()))
    };
    match kind {
        0 | 1 => {
            let (size, head) = match format {
                0 | 2 => ((h0 >> 3) as usize, 1),
                1 => ((u32::from(h0 >> 4) + (byte(1)? << 4)) as usize, 2),
                _ => (
                    (u32::from(h0 >> 4) + (byte(1)? << 4) + (byte(2)? << 12)) as usize,
                    3,
                ),
            };
            if size > MAX_BLOCK {
                return corrupt(format!("{size} literals in one block"));
            }
            if kind == 0 {
                let Some(raw) = block.get(head..head + size) else {
                    return corrupt("raw literals truncated");
                };
                Ok((Literals::Raw(raw), head + size))
            } else {
                Ok((Literals::Rle(byte(head)? as u8, size), head + 1))
            }
        }
        2 => {
            let (regen, comp, head, four) = match format {
                0 | 1 => {
                    let v = u32::from(h0) | byte(1)? << 8 | byte(2)? << 16;
                    ((v >> 4) & 0x3FF, (v >> 14) & 0x3FF, 3, format == 1)
                }
                2 => {
                    let v = u32::from(h0) | byte(1)? << 8 | byte(2)? << 16 | byte(3)? << 24;
                    ((v >> 4) & 0x3FFF, v >> 18, 4, true)
                }
                _ => {
                    let v = u64::from(h0)
                        | u64::from(byte(1)?) << 8
                        | u64::from(byte(2)?) << 16
                        | u64::from(byte(3)?) << 24
                        | u64::from(byte(4)?) << 32;
                    (((v >> 4) & 0x3FFFF) as u32, (v >> 22) as u32, 5, true)
                }
            };
            let (regen, comp) = (regen as usize, comp as usize);
            if regen > MAX_BLOCK {
                return corrupt(format!("{regen} literals in one block"));
            }
            let Some(body) = block.get(head..head + comp) else {
                return corrupt("compressed literals truncated");
            };
            let tree_len = Huffman::description_len(body)?;
            let Some((tree, data)) = body.split_at_checked(tree_len) else {
                return corrupt("Huffman weights truncated");
            };
            let mut streams = Vec::with_capacity(4);
            if four {
                if data.len() < 10 || regen < 4 {
                    return corrupt("four literal streams in too few bytes");
                }
                let sizes = [
                    usize::from(u16::from_le_bytes([data[0], data[1]])),
                    usize::from(u16::from_le_bytes([data[2], data[3]])),
                    usize::from(u16::from_le_bytes([data[4], data[5]])),
                ];
                let Some(last) = (data.len() - 6).checked_sub(sizes.iter().sum::<usize>()) else {
                    return corrupt("literal stream sizes exceed the section");
                };
                let segment = regen.div_ceil(4);
                if 3 * segment >= regen {
                    return corrupt("too few literals for four streams");
                }
                let mut at = 6;
                for (i, size) in sizes.into_iter().chain([last]).enumerate() {
                    let lit = i * segment..((i + 1) * segment).min(regen);
                    streams.push((&data[at..at + size], lit));
                    at += size;
                }
            } else {
                streams.push((data, 0..regen));
            }
            Ok((
                Literals::Huffman {
                    tree,
                    streams,
                    count: regen,
                },
                head + comp,
            ))
        }
        _ => Err(Error::Unsupported(
            "literals reuse the previous block's Huffman table",
        )),
    }
}
