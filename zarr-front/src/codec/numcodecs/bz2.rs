//! The numcodecs `bz2` compressor (v2 id `bz2`, v3 name `numcodecs.bz2`).
//!
//! numcodecs compresses with Python's `bz2.compress(buf, level)` and decodes with
//! `bz2.decompress`, which reads bzip2 streams one after another and ignores data after them
//! that is not a stream ([`super::decode_streams`] does the same). Decoding goes through the
//! `bzip2` crate's pure-Rust libbzip2 (`libbz2-rs-sys`). Configuration: `{"level": 1}`
//! (encoding only; any integer, or absent).
//!
//! zarrs has a `bz2` codec behind its `bz2` feature, which zcrop leaves off: it decodes into a
//! buffer with no bound, and bzip2 expands a few bytes into megabytes.

use serde::{Deserialize, Serialize};

use super::{Compressor, DecodeError, Limit, Step, StreamDecoder, decode_streams};

/// The `bz2` codec's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Bz2Configuration {
    /// The compression level (encoding only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) level: Option<i64>,
}

/// The numcodecs `bz2` compressor (decoding only).
#[derive(Debug, Clone)]
pub(crate) struct Bz2Codec {
    configuration: Bz2Configuration,
}

super::compressor_codec!(Bz2Codec, v3: "numcodecs.bz2", v2: "bz2");

impl Compressor for Bz2Codec {
    type Configuration = Bz2Configuration;
    const NAME: &'static str = "numcodecs.bz2";

    fn new(configuration: Bz2Configuration) -> Result<Self, String> {
        Ok(Bz2Codec { configuration })
    }

    fn configuration(&self) -> &Bz2Configuration {
        &self.configuration
    }

    fn encoded_bound(decoded: u64) -> Option<u64> {
        // libbzip2's documented bound: 1% more plus 600 bytes.
        decoded.checked_add(decoded / 100)?.checked_add(600)
    }

    fn decode_chunk(&self, src: &[u8], limit: Option<Limit>) -> Result<Vec<u8>, DecodeError> {
        decode(src, limit.ok_or(DecodeError::UnknownSize)?)
    }
}

/// One bzip2 stream.
struct Bz2Stream(bzip2::Decompress);

impl StreamDecoder for Bz2Stream {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<Step, String> {
        let (in0, out0) = (self.0.total_in(), self.0.total_out());
        let status = self
            .0
            .decompress(input, out)
            .map_err(|e| format!("bzip2: {e}"))?;
        // The totals grow by at most the lengths of the slices.
        let read = usize::try_from(self.0.total_in() - in0).unwrap_or(usize::MAX);
        let written = usize::try_from(self.0.total_out() - out0).unwrap_or(usize::MAX);
        Ok(Step {
            read,
            written,
            ended: status == bzip2::Status::StreamEnd,
        })
    }
}

/// Decodes a numcodecs bz2 chunk as Python's `bz2.decompress` does, into at most
/// `limit.max()` bytes.
pub(crate) fn decode(src: &[u8], limit: Limit) -> Result<Vec<u8>, DecodeError> {
    if src.is_empty() {
        // Python decodes no data to no bytes.
        limit.check(0)?;
        return Ok(Vec::new());
    }
    decode_streams(src, limit, || Ok(Bz2Stream(bzip2::Decompress::new(false))))
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use proptest::prelude::*;

    use super::*;

    /// What numcodecs' `BZ2(level).encode` writes: one bzip2 stream.
    fn encode(data: &[u8], level: u32) -> Vec<u8> {
        let mut out = Vec::new();
        bzip2::read::BzEncoder::new(data, bzip2::Compression::new(level))
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * i) >> 5) as u8).collect()
    }

    #[test]
    fn decodes_numcodecs_chunks() {
        // numcodecs.BZ2(1).encode(b"zcrop" * 4)
        let chunk = [
            66, 90, 104, 49, 49, 65, 89, 38, 83, 89, 217, 151, 218, 79, 0, 0, 9, 129, 128, 8, 0,
            208, 16, 32, 0, 48, 205, 0, 85, 12, 148, 164, 33, 79, 23, 114, 69, 56, 80, 144, 217,
            151, 218, 79,
        ];
        assert_eq!(decode(&chunk, Limit::Exact(20)), Ok(b"zcrop".repeat(4)));
        for len in [1, 1000, 300_000] {
            let data = sample(len);
            for level in [1, 9] {
                let enc = encode(&data, level);
                assert_eq!(decode(&enc, Limit::Exact(len)).as_ref(), Ok(&data));
            }
        }
    }

    #[test]
    fn follows_python_on_several_streams() {
        let (a, b) = (sample(500), b"tail".to_vec());
        let mut two = encode(&a, 9);
        two.extend(encode(&b, 1));
        let mut both = a.clone();
        both.extend(&b);
        assert_eq!(decode(&two, Limit::Exact(504)), Ok(both));
        // Garbage after a stream is ignored; a stream cut short is an error.
        let mut junk = encode(&a, 9);
        junk.extend(b"not bzip2 at all");
        assert_eq!(decode(&junk, Limit::Exact(500)).as_ref(), Ok(&a));
        let enc = encode(&a, 9);
        assert_eq!(
            decode(&enc[..enc.len() - 1], Limit::Exact(500)),
            Err(DecodeError::Truncated)
        );
        assert!(matches!(
            decode(b"BZh9 nonsense", Limit::Exact(500)),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn expansion_stops_at_the_limit() {
        // 4 MiB of zeros: a few dozen bytes of bzip2.
        let enc = encode(&vec![0; 4 << 20], 9);
        assert!(enc.len() < 100);
        assert_eq!(
            decode(&enc, Limit::Exact(1000)),
            Err(DecodeError::TooLong { limit: 1000 })
        );
        assert_eq!(
            decode(&enc, Limit::AtMost(1000)),
            Err(DecodeError::TooLong { limit: 1000 })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn round_trips(data in proptest::collection::vec(any::<u8>(), 0..3000), level in 1u32..=9) {
            let enc = encode(&data, level);
            prop_assert_eq!(decode(&enc, Limit::Exact(data.len())), Ok(data));
        }

        #[test]
        fn damaged_chunks_are_errors_not_panics(
            len in 1usize..5000,
            cut in any::<proptest::sample::Index>(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..), 0..4),
        ) {
            let mut enc = encode(&sample(len), 5);
            for (at, x) in flips {
                let i = at.index(enc.len());
                enc[i] ^= x;
            }
            let enc = &enc[..cut.index(enc.len() + 1)];
            if let Ok(out) = decode(enc, Limit::AtMost(len)) {
                prop_assert!(out.len() <= len);
            }
        }

        #[test]
        fn arbitrary_bytes_are_errors_not_panics(
            data in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let _ = decode(&data, Limit::AtMost(1 << 16));
        }
    }
}
