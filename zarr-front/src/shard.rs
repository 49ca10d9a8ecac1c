//! Shard indexes: one sharding level's geometry ([`ShardLevel`]), decoding its index (a pure
//! function of the index's bytes), and checking one entry against its shard's length.

use std::borrow::Cow;
use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::{ArrayToBytesCodecTraits, CodecChain, CodecOptions, FillValue, data_type};

/// One level of sharding: a shard of `shard_shape` split into inner chunks of `inner_shape`.
#[derive(Debug)]
pub(crate) struct ShardLevel {
    pub(crate) shard_shape: Vec<u64>,
    pub(crate) inner_shape: Vec<u64>,
    pub(crate) per_shard: Vec<u64>,
    pub(crate) index_at_start: bool,
    pub(crate) index_bytes: u64,
    pub(crate) index_chain: Arc<CodecChain>,
    pub(crate) index_shape: Vec<NonZeroU64>,
}

/// What a shard index says about one inner chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexEntry {
    /// Not stored: all fill value.
    Missing,
    /// `len` bytes at `offset` from the start of the shard.
    At { offset: u64, len: u64 },
}

impl ShardLevel {
    fn n_inner(&self) -> usize {
        self.per_shard.iter().product::<u64>() as usize
    }

    /// Decodes an index (`index_bytes` long) into `2 * n_inner` numbers: offset and length per
    /// inner chunk, in C order. Verifies its checksum when `verify`.
    pub(crate) fn decode_index(&self, bytes: &[u8], verify: bool) -> Result<Arc<[u64]>, String> {
        if bytes.len() as u64 != self.index_bytes {
            return Err(format!(
                "index has {} bytes, expected {}",
                bytes.len(),
                self.index_bytes
            ));
        }
        let opts = CodecOptions::default()
            .with_concurrent_target(1)
            .with_validate_checksums(verify);
        let decoded = self
            .index_chain
            .decode(
                Cow::Borrowed(bytes),
                &self.index_shape,
                &data_type::uint64(),
                &FillValue::from(u64::MAX),
                &opts,
            )
            .map_err(|e| e.to_string())?
            .into_fixed()
            .map_err(|e| e.to_string())?;
        let words: Arc<[u64]> = decoded
            .chunks_exact(8)
            .map(|b| u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        if words.len() != 2 * self.n_inner() {
            return Err(format!(
                "index decodes to {} numbers, expected {}",
                words.len(),
                2 * self.n_inner()
            ));
        }
        Ok(words)
    }

    /// Entry `inner` of a decoded index, checked against the shard's length when known.
    pub(crate) fn entry(
        index: &[u64],
        inner: usize,
        shard_len: Option<u64>,
    ) -> Result<IndexEntry, String> {
        let (offset, len) = (index[2 * inner], index[2 * inner + 1]);
        if offset == u64::MAX && len == u64::MAX {
            return Ok(IndexEntry::Missing);
        }
        let end = offset.checked_add(len).ok_or_else(|| {
            format!("inner chunk {inner}: offset {offset} + length {len} overflows")
        })?;
        if let Some(shard_len) = shard_len
            && end > shard_len
        {
            return Err(format!(
                "inner chunk {inner} at bytes {offset}..{end} points past the end of its shard ({shard_len} bytes)"
            ));
        }
        Ok(IndexEntry::At { offset, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries() {
        let idx = [0, 10, u64::MAX, u64::MAX, 5, u64::MAX - 1, 100, 50];
        assert_eq!(
            ShardLevel::entry(&idx, 0, None),
            Ok(IndexEntry::At { offset: 0, len: 10 })
        );
        assert_eq!(ShardLevel::entry(&idx, 1, Some(5)), Ok(IndexEntry::Missing));
        assert!(
            ShardLevel::entry(&idx, 2, None)
                .unwrap_err()
                .contains("overflows")
        );
        assert!(
            ShardLevel::entry(&idx, 3, Some(120))
                .unwrap_err()
                .contains("past the end")
        );
        assert!(ShardLevel::entry(&idx, 3, Some(150)).is_ok());
    }
}
