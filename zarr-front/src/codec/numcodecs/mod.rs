//! numcodecs codecs that zarr-python reads and zarrs does not: the compressors `lz4`, `lzma`
//! and `bz2`, and the filter `delta`.
//!
//! | v2 id   | v3 name           | kind           | module    |
//! | ------- | ----------------- | -------------- | --------- |
//! | `lz4`   | `numcodecs.lz4`   | bytes to bytes | [`lz4`]   |
//! | `lzma`  | `numcodecs.lzma`  | bytes to bytes | [`lzma`]  |
//! | `bz2`   | `numcodecs.bz2`   | bytes to bytes | [`bz2`]   |
//! | `delta` | `numcodecs.delta` | array to array | [`delta`] |
//!
//! Each decodes what numcodecs 0.16 writes, byte for byte as zarr-python reads it. zcrop only
//! reads, so the compressors refuse to encode; `delta` encodes too, because zarrs computes the
//! encoded fill value of an array-to-array codec by encoding it.
//!
//! zarrs has a `bz2` codec of its own behind a feature, but it decodes into a buffer that grows
//! as long as the stream goes on, and a bzip2 stream can expand millions of times. Every decoder
//! here writes into a buffer sized from the chunk's known decoded size (from the array's
//! metadata, never from the data), and stops with an error as soon as the data would go past
//! it. None of them panics on any input.

use zarrs::array::BytesRepresentation;
use zarrs::array::codec::api::CodecError;

/// How many bytes a chunk may decode to, from its decoded representation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// Exactly this many (a chunk of a fixed-size data type: every chunk zcrop reads).
    Exact(usize),
    /// At most this many.
    AtMost(usize),
}

impl Limit {
    /// The limit for `repr`, or `None` where the decoded size is not bounded.
    pub(crate) fn of(repr: &BytesRepresentation) -> Option<Limit> {
        match *repr {
            BytesRepresentation::FixedSize(n) => usize::try_from(n).ok().map(Limit::Exact),
            BytesRepresentation::BoundedSize(n) => {
                Some(Limit::AtMost(usize::try_from(n).unwrap_or(usize::MAX)))
            }
            BytesRepresentation::UnboundedSize => None,
        }
    }

    /// The most bytes allowed.
    pub(crate) fn max(self) -> usize {
        match self {
            Limit::Exact(n) | Limit::AtMost(n) => n,
        }
    }

    /// Checks that `len` decoded bytes satisfy the limit.
    pub(crate) fn check(self, len: usize) -> Result<(), DecodeError> {
        match self {
            Limit::Exact(n) if len != n => Err(DecodeError::WrongSize { got: len, want: n }),
            Limit::AtMost(n) if len > n => Err(DecodeError::TooLong { limit: n }),
            _ => Ok(()),
        }
    }
}

/// Why a chunk does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// The data ends inside a compressed stream.
    #[error("the data ends before the end of the compressed stream")]
    Truncated,
    /// The data decodes to more bytes than the chunk holds.
    #[error("the data decodes to more than the {limit} bytes of the chunk")]
    TooLong {
        /// The most bytes allowed.
        limit: usize,
    },
    /// The data decodes (or says it decodes) to another size than the chunk's.
    #[error("the data decodes to {got} bytes, the chunk holds {want}")]
    WrongSize {
        /// What the data gives.
        got: usize,
        /// What the chunk holds.
        want: usize,
    },
    /// The compressed data is malformed: what the decoder said.
    #[error("corrupt data: {0}")]
    Corrupt(String),
    /// The chunk's decoded size is not known (a chain zcrop does not read with this codec).
    #[error("the chunk's decoded size is not known")]
    UnknownSize,
    /// The buffer for the decoded chunk could not be allocated.
    #[error("cannot allocate {0} bytes for the decoded chunk")]
    Alloc(usize),
}

impl DecodeError {
    /// As a zarrs codec error, prefixed with the codec's name.
    pub(crate) fn into_codec_error(self, codec: &str) -> CodecError {
        CodecError::Other(format!("{codec}: {self}"))
    }
}

/// A zeroed buffer of `len` bytes, or an error where the memory cannot be had.
pub(crate) fn zeroed(len: usize) -> Result<Vec<u8>, DecodeError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| DecodeError::Alloc(len))?;
    v.resize(len, 0);
    Ok(v)
}

/// A numcodecs compressor zcrop decodes and does not write. [`compressor_codec!`] makes it a
/// zarrs bytes-to-bytes codec, registered under its Zarr v2 id and v3 name.
pub(crate) trait Compressor: Sized + std::fmt::Debug + Send + Sync + 'static {
    /// Its configuration, as numcodecs writes it.
    type Configuration: serde::Serialize + serde::de::DeserializeOwned;
    /// Its v3 name, for errors.
    const NAME: &'static str;
    /// The codec for `configuration`, or why it is not supported.
    fn new(configuration: Self::Configuration) -> Result<Self, String>;
    /// Its configuration.
    fn configuration(&self) -> &Self::Configuration;
    /// The most bytes `decoded` bytes encode to, if known.
    fn encoded_bound(decoded: u64) -> Option<u64>;
    /// Decodes a chunk into at most `limit` bytes (`None`: the chunk's size is not known).
    fn decode_chunk(&self, src: &[u8], limit: Option<Limit>) -> Result<Vec<u8>, DecodeError>;
}

/// The codec for a configuration in zarrs' form (the body of `CodecTraitsV2/V3::create`).
pub(crate) fn create<C: Compressor + zarrs::array::codec::api::BytesToBytesCodecTraits>(
    configuration: &zarrs::metadata::Configuration,
) -> Result<zarrs::array::codec::api::Codec, zarrs::plugin::PluginCreateError> {
    let configuration: C::Configuration = configuration.to_typed()?;
    let codec = C::new(configuration)
        .map_err(|e| zarrs::plugin::PluginCreateError::Other(format!("{}: {e}", C::NAME)))?;
    Ok(zarrs::array::codec::api::Codec::BytesToBytes(
        std::sync::Arc::new(codec),
    ))
}

/// A compressor's configuration in zarrs' form.
pub(crate) fn configuration_of<C: Compressor>(c: &C) -> Option<zarrs::metadata::Configuration> {
    match serde_json::to_value(c.configuration()) {
        Ok(serde_json::Value::Object(map)) => Some(map.into()),
        _ => None,
    }
}

/// The body of `BytesToBytesCodecTraits::decode` for a compressor.
pub(crate) fn decode_bytes<'a, C: Compressor>(
    c: &C,
    encoded: &[u8],
    decoded_representation: &BytesRepresentation,
) -> Result<std::borrow::Cow<'a, [u8]>, CodecError> {
    c.decode_chunk(encoded, Limit::of(decoded_representation))
        .map(std::borrow::Cow::Owned)
        .map_err(|e| e.into_codec_error(C::NAME))
}

/// Registers the [`Compressor`] `$codec` with zarrs under the v3 name `$v3` and the v2 id `$v2`,
/// and implements zarrs' codec traits for it: decoding only, no partial decoding, one thread a
/// chunk.
macro_rules! compressor_codec {
    ($codec:ident, v3: $v3:literal, v2: $v2:literal) => {
        zarrs::plugin::impl_extension_aliases!($codec, v3: $v3, [], v2: $v2, []);

        inventory::submit! {
            zarrs::array::codec::api::CodecPluginV3::new::<$codec>()
        }

        inventory::submit! {
            zarrs::array::codec::api::CodecPluginV2::new::<$codec>()
        }

        impl zarrs::array::codec::api::CodecTraitsV3 for $codec {
            fn create(
                metadata: &zarrs::metadata::v3::MetadataV3,
            ) -> Result<zarrs::array::codec::api::Codec, zarrs::plugin::PluginCreateError> {
                $crate::codec::numcodecs::create::<$codec>(
                    &metadata.configuration().cloned().unwrap_or_default(),
                )
            }
        }

        impl zarrs::array::codec::api::CodecTraitsV2 for $codec {
            fn create(
                metadata: &zarrs::metadata::v2::MetadataV2,
            ) -> Result<zarrs::array::codec::api::Codec, zarrs::plugin::PluginCreateError> {
                $crate::codec::numcodecs::create::<$codec>(metadata.configuration())
            }
        }

        impl zarrs::array::codec::api::CodecTraits for $codec {
            fn as_any(&self) -> &dyn std::any::Any {
                self
            }

            fn configuration(
                &self,
                _version: zarrs::plugin::ZarrVersion,
                _options: &zarrs::array::codec::api::CodecMetadataOptions,
            ) -> Option<zarrs::metadata::Configuration> {
                $crate::codec::numcodecs::configuration_of(self)
            }

            fn partial_decoder_capability(
                &self,
            ) -> zarrs::array::codec::api::PartialDecoderCapability {
                zarrs::array::codec::api::PartialDecoderCapability {
                    partial_read: false,
                    partial_decode: false,
                }
            }

            fn partial_encoder_capability(
                &self,
            ) -> zarrs::array::codec::api::PartialEncoderCapability {
                zarrs::array::codec::api::PartialEncoderCapability {
                    partial_encode: false,
                }
            }
        }

        impl zarrs::array::codec::api::BytesToBytesCodecTraits for $codec {
            fn into_dyn(
                self: std::sync::Arc<Self>,
            ) -> std::sync::Arc<dyn zarrs::array::codec::api::BytesToBytesCodecTraits> {
                self
            }

            fn recommended_concurrency(
                &self,
                _decoded_representation: &zarrs::array::BytesRepresentation,
            ) -> Result<
                zarrs::array::codec::api::RecommendedConcurrency,
                zarrs::array::codec::api::CodecError,
            > {
                Ok(zarrs::array::codec::api::RecommendedConcurrency::new_maximum(1))
            }

            fn encoded_representation(
                &self,
                decoded_representation: &zarrs::array::BytesRepresentation,
            ) -> zarrs::array::BytesRepresentation {
                match decoded_representation
                    .size()
                    .and_then(<$codec as $crate::codec::numcodecs::Compressor>::encoded_bound)
                {
                    Some(n) => zarrs::array::BytesRepresentation::BoundedSize(n),
                    None => zarrs::array::BytesRepresentation::UnboundedSize,
                }
            }

            fn encode<'a>(
                &self,
                _decoded_value: zarrs::array::codec::api::ArrayBytesRaw<'a>,
                _options: &zarrs::array::codec::api::CodecOptions,
            ) -> Result<
                zarrs::array::codec::api::ArrayBytesRaw<'a>,
                zarrs::array::codec::api::CodecError,
            > {
                Err($crate::codec::numcodecs::read_only(
                    <$codec as $crate::codec::numcodecs::Compressor>::NAME,
                ))
            }

            fn decode<'a>(
                &self,
                encoded_value: zarrs::array::codec::api::ArrayBytesRaw<'a>,
                decoded_representation: &zarrs::array::BytesRepresentation,
                _options: &zarrs::array::codec::api::CodecOptions,
            ) -> Result<
                zarrs::array::codec::api::ArrayBytesRaw<'a>,
                zarrs::array::codec::api::CodecError,
            > {
                $crate::codec::numcodecs::decode_bytes(self, &encoded_value, decoded_representation)
            }
        }
    };
}
pub(crate) use compressor_codec;

/// The error of the encoders of read-only codecs.
pub(crate) fn read_only(codec: &str) -> CodecError {
    CodecError::Other(format!(
        "{codec}: zcrop reads Zarr arrays and does not encode chunks"
    ))
}

/// One step of a streaming decoder: reads from `input`, writes to `out`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step {
    /// Bytes of `input` consumed.
    pub(crate) read: usize,
    /// Bytes of `out` written.
    pub(crate) written: usize,
    /// Whether the stream ended.
    pub(crate) ended: bool,
}

/// A streaming decoder of one compressed stream (xz, lzma, raw LZMA, bzip2).
pub(crate) trait StreamDecoder {
    /// Decodes what it can of `input` into `out`; an error is the decoder's complaint.
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<Step, String>;
}

/// Decodes `src` as Python's `lzma.decompress` and `bz2.decompress` do (which numcodecs calls):
/// one stream after another while data is left; data after the first stream that fails to
/// decode as a stream is ignored, along with what it produced, but data that ends inside a
/// stream is an error. `new` makes the decoder of each stream. The output may not grow past
/// `limit` and must satisfy it at the end. Decoding stops as soon as the output would pass the
/// limit, even inside a stream after the first that Python would go on to find corrupt (and
/// drop): something only damaged chunks hold.
pub(crate) fn decode_streams<D: StreamDecoder>(
    src: &[u8],
    limit: Limit,
    mut new: impl FnMut() -> Result<D, DecodeError>,
) -> Result<Vec<u8>, DecodeError> {
    let max = limit.max();
    // One byte past the limit shows that the data decodes to more.
    let mut out = zeroed(max.checked_add(1).ok_or(DecodeError::Alloc(max))?)?;
    let mut len = 0;
    let mut rest = src;
    let mut first = true;
    loop {
        let mut decoder = new()?;
        let start = len;
        let mut ended = false;
        while !ended {
            if len > max {
                return Err(DecodeError::TooLong { limit: max });
            }
            let step = match decoder.step(rest, &mut out[len..]) {
                Ok(step) => step,
                Err(e) if first => return Err(DecodeError::Corrupt(e)),
                Err(_) => {
                    // What follows the first stream is not a stream: Python ignores it.
                    len = start;
                    rest = &[];
                    break;
                }
            };
            let (Some(r), Some(l)) = (rest.get(step.read..), len.checked_add(step.written)) else {
                return Err(DecodeError::Corrupt(
                    "the decoder reported more than it was given".into(),
                ));
            };
            if step.read == 0 && step.written == 0 && !step.ended {
                return Err(DecodeError::Truncated);
            }
            rest = r;
            len = l;
            ended = step.ended;
        }
        if len > max {
            return Err(DecodeError::TooLong { limit: max });
        }
        first = false;
        if rest.is_empty() {
            break;
        }
    }
    limit.check(len)?;
    out.truncate(len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::num::NonZeroU64;

    use zarrs::array::codec::api::Codec;
    use zarrs::array::{
        ArrayToBytesCodecTraits, CodecChain, CodecMetadataOptions, CodecOptions, FillValue,
        data_type,
    };
    use zarrs::metadata::v2::MetadataV2;
    use zarrs::metadata::v3::MetadataV3;
    use zarrs::plugin::ExtensionName;

    use super::*;

    #[test]
    fn registered_under_v2_ids_and_v3_names() {
        for (v2, v3) in [
            (r#"{"id": "lz4", "acceleration": 1}"#, "numcodecs.lz4"),
            (r#"{"id": "bz2", "level": 1}"#, "numcodecs.bz2"),
            (
                r#"{"id": "lzma", "format": 1, "check": -1, "preset": null, "filters": null}"#,
                "numcodecs.lzma",
            ),
            (
                r#"{"id": "delta", "dtype": "<i4", "astype": "<i2"}"#,
                "numcodecs.delta",
            ),
        ] {
            let metadata: MetadataV2 = serde_json::from_str(v2).unwrap();
            let codec = Codec::from_metadata(&metadata).unwrap();
            assert_eq!(codec.name_v3().as_deref(), Some(v3));
            // zarrs turns v2 metadata into v3 through the codec's v3 configuration, which must
            // make the same codec again: numcodecs' keys, less the id.
            let config = codec
                .configuration_v3(&CodecMetadataOptions::default())
                .unwrap();
            let mut want: serde_json::Map<String, serde_json::Value> =
                serde_json::from_str(v2).unwrap();
            want.remove("id");
            assert_eq!(*config, want, "{v3}");
            let again =
                Codec::from_metadata(&MetadataV3::new_with_configuration(v3, config.clone()))
                    .unwrap();
            assert_eq!(
                again.configuration_v3(&CodecMetadataOptions::default()),
                Some(config)
            );
        }
    }

    #[test]
    fn v3_chains_decode() {
        // numcodecs.delta -> bytes -> numcodecs.lz4, as zarr-python writes a v3 array with
        // these numcodecs codecs.
        let codecs: Vec<MetadataV3> = serde_json::from_str(
            r#"[{"name": "numcodecs.delta", "configuration": {"dtype": "<i4"}},
                {"name": "bytes", "configuration": {"endian": "little"}},
                {"name": "numcodecs.lz4", "configuration": {"acceleration": 1}}]"#,
        )
        .unwrap();
        let chain = CodecChain::from_metadata(&codecs).unwrap();
        let values: Vec<i32> = (0..60).map(|i| i * i - 1000).collect();
        let steps: Vec<u8> = std::iter::once(values[0])
            .chain(values.windows(2).map(|w| w[1] - w[0]))
            .flat_map(i32::to_le_bytes)
            .collect();
        let mut chunk = 240u32.to_le_bytes().to_vec();
        chunk.extend(zcrop_codec::ffi::compress::lz4_compress(&steps, false));
        let shape = [NonZeroU64::new(6).unwrap(), NonZeroU64::new(10).unwrap()];
        let decoded = chain
            .decode(
                Cow::Owned(chunk),
                &shape,
                &data_type::int32(),
                &FillValue::from(0i32),
                &CodecOptions::default(),
            )
            .unwrap()
            .into_fixed()
            .unwrap();
        let want: Vec<u8> = values.iter().flat_map(|v| v.to_ne_bytes()).collect();
        assert_eq!(&decoded[..], &want[..]);
    }

    /// A decoder that copies up to `chunk` bytes a step and ends its stream at a 0 byte
    /// (which it consumes); the byte 0xff is corrupt.
    struct Copy {
        chunk: usize,
    }

    impl StreamDecoder for Copy {
        fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<Step, String> {
            let mut read = 0;
            let mut written = 0;
            while read < input.len() && read < self.chunk {
                match input[read] {
                    0 => {
                        return Ok(Step {
                            read: read + 1,
                            written,
                            ended: true,
                        });
                    }
                    0xff => return Err("bad byte".into()),
                    b => {
                        if written == out.len() {
                            break;
                        }
                        out[written] = b;
                        written += 1;
                        read += 1;
                    }
                }
            }
            Ok(Step {
                read,
                written,
                ended: false,
            })
        }
    }

    fn run(src: &[u8], limit: Limit) -> Result<Vec<u8>, DecodeError> {
        decode_streams(src, limit, || Ok(Copy { chunk: 2 }))
    }

    #[test]
    fn streams_follow_python() {
        assert_eq!(run(b"abc\0", Limit::Exact(3)), Ok(b"abc".to_vec()));
        // Two streams.
        assert_eq!(run(b"ab\0cd\0", Limit::Exact(4)), Ok(b"abcd".to_vec()));
        // A second stream that fails is dropped with its output...
        assert_eq!(run(b"ab\0cd\xff", Limit::AtMost(4)), Ok(b"ab".to_vec()));
        // ... unless its output passed the limit first.
        assert_eq!(
            run(b"ab\0cd\xff", Limit::Exact(2)),
            Err(DecodeError::TooLong { limit: 2 })
        );
        // A first stream that fails is an error.
        assert!(matches!(
            run(b"a\xff\0", Limit::Exact(1)),
            Err(DecodeError::Corrupt(_))
        ));
        // Data that ends inside a stream, first or later, is an error.
        assert_eq!(run(b"abc", Limit::Exact(3)), Err(DecodeError::Truncated));
        assert_eq!(run(b"ab\0cd", Limit::Exact(4)), Err(DecodeError::Truncated));
        assert_eq!(run(b"", Limit::Exact(0)), Err(DecodeError::Truncated));
    }

    #[test]
    fn output_is_bounded() {
        assert_eq!(
            run(b"abcdef\0", Limit::Exact(3)),
            Err(DecodeError::TooLong { limit: 3 })
        );
        assert_eq!(
            run(b"ab\0", Limit::Exact(3)),
            Err(DecodeError::WrongSize { got: 2, want: 3 })
        );
        assert_eq!(run(b"ab\0", Limit::AtMost(3)), Ok(b"ab".to_vec()));
        assert_eq!(
            run(b"abcd\0", Limit::AtMost(3)),
            Err(DecodeError::TooLong { limit: 3 })
        );
        assert_eq!(
            run(b"\0", Limit::Exact(usize::MAX)),
            Err(DecodeError::Alloc(usize::MAX))
        );
    }
}

pub(crate) mod bz2;
pub(crate) mod delta;
pub(crate) mod lz4;
pub(crate) mod lzma;
