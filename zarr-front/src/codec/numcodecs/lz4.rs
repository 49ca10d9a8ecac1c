//! The numcodecs `lz4` compressor (v2 id `lz4`, v3 name `numcodecs.lz4`).
//!
//! numcodecs writes a 4-byte little-endian header holding the decoded size (a C `int`), then
//! one LZ4 block (`LZ4_compress_fast`), and decodes with `LZ4_decompress_safe` into exactly
//! that many bytes, refusing a size that is not positive and a block that does not fill it.
//! This does the same through liblz4 (the library c-blosc links too). Configuration:
//! `{"acceleration": 1}` (encoding only; any integer, or absent).

use serde::{Deserialize, Serialize};

use super::{Compressor, DecodeError, Limit, zeroed};

/// An LZ4 block never decodes to more than this many bytes per byte (a match costs at least
/// one byte per 255 bytes it copies), so the header of a hostile chunk cannot ask for more.
const MAX_RATIO: usize = 255;

/// The `lz4` codec's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Lz4Configuration {
    /// LZ4's acceleration (encoding only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) acceleration: Option<i64>,
}

/// The numcodecs `lz4` compressor (decoding only).
#[derive(Debug, Clone)]
pub(crate) struct Lz4Codec {
    configuration: Lz4Configuration,
}

super::compressor_codec!(Lz4Codec, v3: "numcodecs.lz4", v2: "lz4");

impl Compressor for Lz4Codec {
    type Configuration = Lz4Configuration;
    const NAME: &'static str = "numcodecs.lz4";

    fn new(configuration: Lz4Configuration) -> Result<Self, String> {
        Ok(Lz4Codec { configuration })
    }

    fn configuration(&self) -> &Lz4Configuration {
        &self.configuration
    }

    fn encoded_bound(decoded: u64) -> Option<u64> {
        // LZ4_compressBound plus the header.
        decoded.checked_add(decoded / 255 + 16 + 4)
    }

    fn decode_chunk(&self, src: &[u8], limit: Option<Limit>) -> Result<Vec<u8>, DecodeError> {
        decode(src, limit)
    }
}

/// Decodes a numcodecs LZ4 chunk: the 4-byte size header, then the block. `limit` bounds the
/// size (`None`: only by what the block could hold).
pub(crate) fn decode(src: &[u8], limit: Option<Limit>) -> Result<Vec<u8>, DecodeError> {
    let Some((header, block)) = src.split_first_chunk::<4>() else {
        return Err(DecodeError::Corrupt(format!(
            "{} bytes, too short for the 4-byte size header",
            src.len()
        )));
    };
    let size = i32::from_le_bytes(*header);
    let Ok(size) = usize::try_from(size) else {
        return Err(DecodeError::Corrupt(format!(
            "negative decoded size {size}"
        )));
    };
    if size == 0 {
        return Err(DecodeError::Corrupt("decoded size 0".into()));
    }
    if let Some(limit) = limit {
        limit.check(size)?;
    }
    if size > block.len().saturating_mul(MAX_RATIO) {
        return Err(DecodeError::Corrupt(format!(
            "a block of {} bytes cannot decode to the {size} bytes its header gives",
            block.len()
        )));
    }
    let mut out = zeroed(size)?;
    match zcrop_codec::ffi::lz4_decompress(block, &mut out, size) {
        Some(n) if n == size => Ok(out),
        Some(n) => Err(DecodeError::WrongSize { got: n, want: size }),
        None => Err(DecodeError::Corrupt("malformed LZ4 block".into())),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use zcrop_codec::ffi::compress::lz4_compress;

    /// What numcodecs' `LZ4.encode` writes (`hc`: liblz4's high-compression mode instead).
    fn encode(data: &[u8], hc: bool) -> Vec<u8> {
        let mut out = u32::try_from(data.len()).unwrap().to_le_bytes().to_vec();
        out.extend(lz4_compress(data, hc));
        out
    }

    fn sample(len: usize, seed: u64) -> Vec<u8> {
        // Runs and noise, so blocks hold both matches and literals.
        let mut x = seed | 1;
        (0..len)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                if (i / 64) % 2 == 0 {
                    (i / 7) as u8
                } else {
                    x as u8
                }
            })
            .collect()
    }

    #[test]
    fn decodes_numcodecs_chunks() {
        // numcodecs.LZ4().encode(bytes(range(10)) * 3): header 30, then liblz4's block.
        let chunk = [
            30, 0, 0, 0, 171, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 80, 5, 6, 7, 8, 9,
        ];
        let want: Vec<u8> = (0..30).map(|i| (i % 10) as u8).collect();
        assert_eq!(decode(&chunk, Some(Limit::Exact(30))), Ok(want));
        for len in [1, 17, 4096, 70_000] {
            let data = sample(len, len as u64);
            for hc in [false, true] {
                let enc = encode(&data, hc);
                assert_eq!(decode(&enc, Some(Limit::Exact(len))).as_ref(), Ok(&data));
                assert_eq!(decode(&enc, None).as_ref(), Ok(&data));
            }
        }
    }

    #[test]
    fn rejects_what_numcodecs_rejects() {
        let enc = encode(&sample(1000, 3), false);
        // Too short for the header; sizes 0 and negative.
        for bad in [
            &[][..],
            &[1, 0, 0][..],
            &[0, 0, 0, 0, 0][..],
            &[0, 0, 0, 0x80, 0][..],
        ] {
            assert!(
                matches!(decode(bad, None), Err(DecodeError::Corrupt(_))),
                "{bad:?}"
            );
        }
        // A header that disagrees with the chunk, or with the block.
        assert_eq!(
            decode(&enc, Some(Limit::Exact(999))),
            Err(DecodeError::WrongSize {
                got: 1000,
                want: 999
            })
        );
        let mut longer = enc.clone();
        longer[..4].copy_from_slice(&1001u32.to_le_bytes());
        assert!(decode(&longer, None).is_err());
        let mut shorter = enc.clone();
        shorter[..4].copy_from_slice(&999u32.to_le_bytes());
        assert!(decode(&shorter, None).is_err());
        // A header asking for far more than the block can hold allocates nothing.
        let mut huge = enc[..20].to_vec();
        huge[..4].copy_from_slice(&i32::MAX.to_le_bytes());
        assert!(matches!(decode(&huge, None), Err(DecodeError::Corrupt(_))));
    }

    proptest! {
        #[test]
        fn round_trips(data in proptest::collection::vec(any::<u8>(), 1..3000), hc: bool) {
            let enc = encode(&data, hc);
            prop_assert_eq!(decode(&enc, Some(Limit::Exact(data.len()))), Ok(data));
        }

        #[test]
        fn damaged_chunks_are_errors_not_panics(
            len in 1usize..5000,
            seed: u64,
            cut in any::<proptest::sample::Index>(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..), 0..4),
        ) {
            let data = sample(len, seed);
            let mut enc = encode(&data, seed % 2 == 0);
            for (at, x) in flips {
                let i = at.index(enc.len());
                enc[i] ^= x;
            }
            let enc = &enc[..cut.index(enc.len() + 1)];
            if let Ok(out) = decode(enc, None) {
                prop_assert!(out.len() <= enc.len() * MAX_RATIO);
            }
            let _ = decode(enc, Some(Limit::Exact(len)));
        }

        #[test]
        fn arbitrary_bytes_are_errors_not_panics(
            data in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let _ = decode(&data, None);
            let _ = decode(&data, Some(Limit::AtMost(1 << 16)));
        }
    }
}
