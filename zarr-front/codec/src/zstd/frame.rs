//! The zstd frame around a single block (RFC 8878, 3.1): magic, frame header, block header.

use super::bits::bits_at;
use super::{Error, MAGIC, MAX_BLOCK, Result, SEVERAL_BLOCKS, corrupt};

/// The frame's single block, located.
pub(super) struct Frame<'a> {
    pub(super) block: &'a [u8],
    pub(super) kind: u8,
    /// The block's size field: stored bytes, or decoded bytes for an RLE block.
    pub(super) size: usize,
    /// Decoded size, when the frame header declares it.
    pub(super) content_size: Option<usize>,
}

pub(super) fn read_frame(src: &[u8]) -> Result<Frame<'_>> {
    if src.len() < 6 {
        return corrupt(format!("{} bytes is too short for a zstd frame", src.len()));
    }
    let magic = u32::from_le_bytes([src[0], src[1], src[2], src[3]]);
    if magic != MAGIC {
        return Err(Error::Unsupported("not a plain zstd frame"));
    }
    let fhd = src[4];
    if fhd & 0x08 != 0 {
        return corrupt("reserved bit set in the frame header");
    }
    let single = fhd & 0x20 != 0;
    let checksum = fhd & 0x04 != 0;
    let mut at = 5 + usize::from(!single);
    let dict_bytes = [0, 1, 2, 4][usize::from(fhd & 3)];
    let dict = bits_at(src, 8 * at as i64, 8 * dict_bytes as u32);
    if dict != 0 {
        return Err(Error::Unsupported("frame needs a dictionary"));
    }
    at += dict_bytes;
    let fcs_bytes = match fhd >> 6 {
        0 => usize::from(single),
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let content_size = if fcs_bytes == 0 {
        None
    } else {
        let Some(b) = src.get(at..at + fcs_bytes) else {
            return corrupt("frame header truncated");
        };
        let mut v = [0u8; 8];
        v[..fcs_bytes].copy_from_slice(b);
        let v = u64::from_le_bytes(v) + if fcs_bytes == 2 { 256 } else { 0 };
        Some(usize::try_from(v).map_err(|_| Error::Corrupt("content size overflow".into()))?)
    };
    at += fcs_bytes;
    let Some(h) = src.get(at..at + 3) else {
        return corrupt("block header truncated");
    };
    let h = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
    at += 3;
    if h & 1 == 0 {
        return Err(Error::Unsupported(SEVERAL_BLOCKS));
    }
    let kind = ((h >> 1) & 3) as u8;
    let size = (h >> 3) as usize;
    let stored = match kind {
        0 | 2 => size,
        1 => 1,
        _ => return corrupt("reserved block type"),
    };
    if size > MAX_BLOCK {
        return corrupt(format!("block of {size} bytes"));
    }
    let Some(block) = src.get(at..at + stored) else {
        return corrupt("block truncated");
    };
    let end = at + stored + if checksum { 4 } else { 0 };
    if end != src.len() {
        return Err(Error::Unsupported("bytes after the first frame"));
    }
    Ok(Frame {
        block,
        kind,
        size,
        content_size,
    })
}
