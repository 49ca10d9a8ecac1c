//! The numcodecs `lzma` compressor (v2 id `lzma`, v3 name `numcodecs.lzma`).
//!
//! numcodecs compresses with Python's `lzma.compress` and decodes with
//! `lzma.decompress(buf, format=..., filters=...)`, which reads streams one after another and
//! ignores data after them that is not a stream ([`super::decode_streams`] does the same).
//! Decoding goes through liblzma (the library Python's `lzma` module wraps), built from the
//! `liblzma` crate's bundled sources. Configuration, as numcodecs writes it:
//!
//! - `format`: 1 `FORMAT_XZ` (the default), 2 `FORMAT_ALONE` (`.lzma`), 0 `FORMAT_AUTO` (either,
//!   told apart by the header) or 3 `FORMAT_RAW` (no header: the filter chain comes from
//!   `filters`).
//! - `filters`: a list of Python `lzma` filter specifiers, needed by `FORMAT_RAW`:
//!   `{"id": 33}` (LZMA2) or `{"id": 4611686018427387905}` (LZMA1), with `preset`, `dict_size`,
//!   `lc`, `lp`, `pb`, `mode`, `nice_len`, `mf`, `depth`; `{"id": 3, "dist": n}` (delta); or a
//!   branch filter (`id` 4 to 9: x86, PowerPC, IA-64, ARM, ARM-Thumb, SPARC) with
//!   `start_offset`. Other formats record their filters in the stream and ignore these (Python
//!   refuses to decode them with `filters` set; zcrop reads them).
//! - `check` and `preset`: encoding only (a stream records its check; liblzma verifies it).

use liblzma::stream::{Action, Filters, LzmaOptions, Status, Stream};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Compressor, DecodeError, Limit, Step, StreamDecoder, decode_streams};

/// The most memory liblzma may use to decode a stream with a header (mostly the dictionary
/// the header asks for): far more than any preset needs (64 MiB at preset 9), so only a
/// hostile or absurd header is refused.
const MEMLIMIT: u64 = 1 << 30;

/// Python's `lzma.FORMAT_AUTO`.
const FORMAT_AUTO: i64 = 0;
/// Python's `lzma.FORMAT_XZ`.
const FORMAT_XZ: i64 = 1;
/// Python's `lzma.FORMAT_ALONE`.
const FORMAT_ALONE: i64 = 2;
/// Python's `lzma.FORMAT_RAW`.
const FORMAT_RAW: i64 = 3;

/// Python's `lzma.FILTER_LZMA1`.
const FILTER_LZMA1: u64 = 0x4000_0000_0000_0001;
/// Python's `lzma.FILTER_LZMA2`.
const FILTER_LZMA2: u64 = 0x21;
/// Python's `lzma.FILTER_DELTA`.
const FILTER_DELTA: u64 = 3;
/// Python's `lzma.PRESET_DEFAULT`.
const PRESET_DEFAULT: u32 = 6;
/// Python's `lzma.PRESET_EXTREME`, a flag on a preset.
const PRESET_EXTREME: u32 = 0x8000_0000;
/// liblzma's smallest dictionary.
const DICT_SIZE_MIN: u32 = 4096;

fn default_format() -> i64 {
    FORMAT_XZ
}

fn default_check() -> i64 {
    -1
}

/// The `lzma` codec's configuration, as numcodecs writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LzmaConfiguration {
    /// The container format (Python's `lzma.FORMAT_*`).
    #[serde(default = "default_format")]
    pub(crate) format: i64,
    /// The integrity check (encoding only).
    #[serde(default = "default_check")]
    pub(crate) check: i64,
    /// The compression preset (encoding only).
    #[serde(default)]
    pub(crate) preset: Option<i64>,
    /// The filter chain (Python filter specifiers), which `FORMAT_RAW` needs.
    #[serde(default)]
    pub(crate) filters: Option<Vec<Map<String, Value>>>,
}

/// One filter of a raw filter chain.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Filter {
    /// LZMA1 or LZMA2, with what decoding needs of its options.
    Lzma {
        /// LZMA2 rather than LZMA1.
        lzma2: bool,
        /// The preset the options start from.
        preset: u32,
        /// Options set explicitly.
        dict_size: Option<u32>,
        /// Literal context bits.
        lc: Option<u32>,
        /// Literal position bits.
        lp: Option<u32>,
        /// Position bits.
        pb: Option<u32>,
    },
    /// The delta filter with its distance (1 to 256).
    Delta(u32),
    /// A branch filter (`id` 4 to 9) with its start offset.
    Branch(u64, u32),
}

/// Reads the unsigned 32-bit option `key` of filter specifier `spec`.
fn option_u32(spec: &Map<String, Value>, key: &str) -> Result<Option<u32>, String> {
    match spec.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| format!("filter option {key:?} is {v}, not a 32-bit unsigned integer")),
    }
}

/// Parses one Python filter specifier, refusing keys Python's `lzma` refuses.
fn parse_filter(spec: &Map<String, Value>) -> Result<Filter, String> {
    let id = spec
        .get("id")
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("filter specifier {spec:?} has no integer \"id\""))?;
    let allowed: &[&str] = match id {
        FILTER_LZMA1 | FILTER_LZMA2 => &[
            "id",
            "preset",
            "dict_size",
            "lc",
            "lp",
            "pb",
            "mode",
            "nice_len",
            "mf",
            "depth",
        ],
        FILTER_DELTA => &["id", "dist"],
        4..=9 => &["id", "start_offset"],
        _ => return Err(format!("unknown filter id {id}")),
    };
    if let Some(key) = spec.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("filter {id} has no option {key:?}"));
    }
    // Encoder-only options still have to be numbers, as Python checks.
    for key in ["mode", "nice_len", "mf", "depth"] {
        option_u32(spec, key)?;
    }
    Ok(match id {
        FILTER_LZMA1 | FILTER_LZMA2 => Filter::Lzma {
            lzma2: id == FILTER_LZMA2,
            preset: match option_u32(spec, "preset")?.unwrap_or(PRESET_DEFAULT) {
                p if p & !PRESET_EXTREME <= 9 => p,
                p => return Err(format!("invalid preset {p}")),
            },
            dict_size: option_u32(spec, "dict_size")?,
            lc: option_u32(spec, "lc")?,
            lp: option_u32(spec, "lp")?,
            pb: option_u32(spec, "pb")?,
        },
        FILTER_DELTA => {
            let dist = option_u32(spec, "dist")?.unwrap_or(1);
            if !(1..=256).contains(&dist) {
                return Err(format!("delta filter distance {dist} is not in 1..=256"));
            }
            Filter::Delta(dist)
        }
        _ => Filter::Branch(id, option_u32(spec, "start_offset")?.unwrap_or(0)),
    })
}

/// Builds liblzma's filter chain for `chain`, with LZMA dictionaries no larger than `limit`
/// bytes need (a dictionary past the end of the output is never used).
fn build_filters(chain: &[Filter], limit: usize) -> Result<Filters, DecodeError> {
    let options_error = |e: liblzma::stream::Error| {
        DecodeError::Corrupt(format!("the filter chain's options are invalid: {e:?}"))
    };
    let enough = u32::try_from(limit).unwrap_or(u32::MAX).max(DICT_SIZE_MIN);
    let mut filters = Filters::new();
    for filter in chain {
        match *filter {
            Filter::Lzma {
                lzma2,
                preset,
                dict_size,
                lc,
                lp,
                pb,
            } => {
                let mut options = LzmaOptions::new_preset(preset).map_err(options_error)?;
                let dict = dict_size.unwrap_or_else(|| preset_dict_size(preset));
                options.dict_size(dict.min(enough));
                if let Some(lc) = lc {
                    options.literal_context_bits(lc);
                }
                if let Some(lp) = lp {
                    options.literal_position_bits(lp);
                }
                if let Some(pb) = pb {
                    options.position_bits(pb);
                }
                if lzma2 {
                    filters.lzma2(&options);
                } else {
                    filters.lzma1(&options);
                }
            }
            Filter::Delta(dist) => {
                // The property byte is the distance less one (checked to be 1..=256).
                let prop = u8::try_from(dist - 1).unwrap_or(u8::MAX);
                filters.delta_properties(&[prop]).map_err(options_error)?;
            }
            Filter::Branch(id, start) => {
                let props = start.to_le_bytes();
                match id {
                    4 => filters.x86_properties(&props),
                    5 => filters.powerpc_properties(&props),
                    6 => filters.ia64_properties(&props),
                    7 => filters.arm_properties(&props),
                    8 => filters.arm_thumb_properties(&props),
                    _ => filters.sparc_properties(&props),
                }
                .map_err(options_error)?;
            }
        }
    }
    Ok(filters)
}

/// The dictionary size of an LZMA preset (liblzma's `lzma_lzma_preset`).
fn preset_dict_size(preset: u32) -> u32 {
    const SIZES: [u32; 10] = [18, 20, 21, 22, 22, 23, 23, 24, 25, 26];
    1 << SIZES[(preset & !PRESET_EXTREME).min(9) as usize]
}

/// How chunks are decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Format {
    /// Python's `FORMAT_AUTO`: xz or `.lzma`, told apart by the header.
    Auto,
    /// Python's `FORMAT_XZ`.
    Xz,
    /// Python's `FORMAT_ALONE` (`.lzma`).
    Alone,
    /// Python's `FORMAT_RAW` with this filter chain.
    Raw(Vec<Filter>),
}

impl Format {
    fn of(configuration: &LzmaConfiguration) -> Result<Format, String> {
        Ok(match configuration.format {
            FORMAT_AUTO => Format::Auto,
            FORMAT_XZ => Format::Xz,
            FORMAT_ALONE => Format::Alone,
            FORMAT_RAW => {
                let specs = configuration
                    .filters
                    .as_deref()
                    .ok_or("format 3 (FORMAT_RAW) needs \"filters\"")?;
                if specs.is_empty() {
                    return Err("format 3 (FORMAT_RAW) needs at least one filter".into());
                }
                Format::Raw(specs.iter().map(parse_filter).collect::<Result<_, _>>()?)
            }
            f => return Err(format!("unknown format {f} (Python's lzma has 0 to 3)")),
        })
    }
}

/// The numcodecs `lzma` compressor (decoding only).
#[derive(Debug, Clone)]
pub(crate) struct LzmaCodec {
    configuration: LzmaConfiguration,
    format: Format,
}

super::compressor_codec!(LzmaCodec, v3: "numcodecs.lzma", v2: "lzma");

impl Compressor for LzmaCodec {
    type Configuration = LzmaConfiguration;
    const NAME: &'static str = "numcodecs.lzma";

    fn new(configuration: LzmaConfiguration) -> Result<Self, String> {
        let format = Format::of(&configuration)?;
        Ok(LzmaCodec {
            configuration,
            format,
        })
    }

    fn configuration(&self) -> &LzmaConfiguration {
        &self.configuration
    }

    fn encoded_bound(_decoded: u64) -> Option<u64> {
        None
    }

    fn decode_chunk(&self, src: &[u8], limit: Option<Limit>) -> Result<Vec<u8>, DecodeError> {
        self.decode(src, limit.ok_or(DecodeError::UnknownSize)?)
    }
}

impl LzmaCodec {
    /// Decodes a chunk as numcodecs does, into at most `limit.max()` bytes.
    pub(crate) fn decode(&self, src: &[u8], limit: Limit) -> Result<Vec<u8>, DecodeError> {
        decode_streams(src, limit, || {
            let stream = match &self.format {
                Format::Auto => Stream::new_auto_decoder(MEMLIMIT, 0),
                Format::Xz => Stream::new_stream_decoder(MEMLIMIT, 0),
                Format::Alone => Stream::new_lzma_decoder(MEMLIMIT),
                Format::Raw(chain) => Stream::new_raw_decoder(&build_filters(chain, limit.max())?),
            }
            .map_err(|e| DecodeError::Corrupt(format!("liblzma refuses the decoder: {e:?}")))?;
            Ok(LzmaStream(stream))
        })
    }
}

/// One liblzma stream.
struct LzmaStream(Stream);

impl StreamDecoder for LzmaStream {
    fn step(&mut self, input: &[u8], out: &mut [u8]) -> Result<Step, String> {
        let (in0, out0) = (self.0.total_in(), self.0.total_out());
        // Python decodes with LZMA_RUN: a stream ends at its own end marker.
        let status = self
            .0
            .process(input, out, Action::Run)
            .map_err(|e| format!("liblzma: {e:?}"))?;
        // The totals grow by at most the lengths of the slices.
        let read = usize::try_from(self.0.total_in() - in0).unwrap_or(usize::MAX);
        let written = usize::try_from(self.0.total_out() - out0).unwrap_or(usize::MAX);
        Ok(Step {
            read,
            written,
            ended: status == Status::StreamEnd,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn codec(json: &str) -> LzmaCodec {
        LzmaCodec::new(serde_json::from_str(json).unwrap()).unwrap()
    }

    /// liblzma's encoding of `data` into one stream of `format` (xz with `check`, `.lzma`, or
    /// raw with `filters`), as Python's `lzma.compress` does.
    fn encode(data: &[u8], stream: Stream) -> Vec<u8> {
        let mut stream = stream;
        let mut out = Vec::with_capacity(data.len() + data.len() / 2 + 1024);
        loop {
            let read = usize::try_from(stream.total_in()).unwrap();
            match stream
                .process_vec(&data[read..], &mut out, Action::Finish)
                .unwrap()
            {
                Status::StreamEnd => return out,
                _ => out.reserve(out.capacity().max(4096)),
            }
        }
    }

    fn xz(data: &[u8], preset: u32) -> Vec<u8> {
        encode(
            data,
            Stream::new_easy_encoder(preset, liblzma::stream::Check::Crc64).unwrap(),
        )
    }

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 7) ^ (i >> 3)) as u8).collect()
    }

    #[test]
    fn decodes_numcodecs_chunks() {
        // numcodecs.LZMA().encode(b"zcrop" * 4): xz, CRC64, preset 6.
        let chunk = [
            253, 55, 122, 88, 90, 0, 0, 4, 230, 214, 180, 70, 2, 0, 33, 1, 22, 0, 0, 0, 116, 47,
            229, 163, 224, 0, 19, 0, 11, 93, 0, 61, 24, 202, 171, 183, 44, 136, 114, 8, 0, 0, 0, 0,
            235, 27, 123, 90, 88, 238, 157, 105, 0, 1, 39, 20, 51, 211, 153, 224, 31, 182, 243,
            125, 1, 0, 0, 0, 0, 4, 89, 90,
        ];
        let xz = codec(r#"{"format": 1, "check": -1, "preset": null, "filters": null}"#);
        assert_eq!(xz.decode(&chunk, Limit::Exact(20)), Ok(b"zcrop".repeat(4)));
        // The same through FORMAT_AUTO.
        assert_eq!(
            codec(r#"{"format": 0}"#).decode(&chunk, Limit::Exact(20)),
            Ok(b"zcrop".repeat(4))
        );
        // numcodecs.LZMA(format=3, filters=[{"id": 3, "dist": 4}, {"id": 33, "preset": 1}])
        // .encode(bytes(range(40)))
        let raw = codec(
            r#"{"format": 3, "check": -1, "preset": null,
                "filters": [{"id": 3, "dist": 4}, {"id": 33, "preset": 1}]}"#,
        );
        let chunk = [
            224, 0, 39, 0, 11, 93, 0, 0, 0, 82, 80, 10, 160, 121, 183, 248, 0, 0, 0,
        ];
        let want: Vec<u8> = (0..40).collect();
        assert_eq!(raw.decode(&chunk, Limit::Exact(40)), Ok(want));
    }

    #[test]
    fn decodes_every_format() {
        let data = sample(100_000);
        let n = data.len();
        for preset in [0, 6, 9] {
            assert_eq!(
                codec("{}")
                    .decode(&xz(&data, preset), Limit::Exact(n))
                    .as_ref(),
                Ok(&data)
            );
        }
        for check in [
            liblzma::stream::Check::None,
            liblzma::stream::Check::Crc32,
            liblzma::stream::Check::Sha256,
        ] {
            let enc = encode(&data, Stream::new_easy_encoder(1, check).unwrap());
            assert_eq!(
                codec("{}").decode(&enc, Limit::Exact(n)).as_ref(),
                Ok(&data)
            );
        }
        let options = LzmaOptions::new_preset(3).unwrap();
        let alone = encode(&data, Stream::new_lzma_encoder(&options).unwrap());
        assert_eq!(
            codec(r#"{"format": 2}"#)
                .decode(&alone, Limit::Exact(n))
                .as_ref(),
            Ok(&data)
        );
        assert_eq!(
            codec(r#"{"format": 0}"#)
                .decode(&alone, Limit::Exact(n))
                .as_ref(),
            Ok(&data)
        );
        // Raw chains: LZMA1 with its options, and a branch filter before LZMA2.
        let mut lzma1 = LzmaOptions::new_preset(2).unwrap();
        lzma1
            .dict_size(1 << 16)
            .literal_context_bits(1)
            .position_bits(0);
        let raw = encode(
            &data,
            Stream::new_raw_encoder(Filters::new().lzma1(&lzma1)).unwrap(),
        );
        let spec = r#"{"format": 3, "filters": [
            {"id": 4611686018427387905, "preset": 2, "dict_size": 65536, "lc": 1, "pb": 0}]}"#;
        assert_eq!(
            codec(spec).decode(&raw, Limit::Exact(n)).as_ref(),
            Ok(&data)
        );
        let lzma2 = LzmaOptions::new_preset(1).unwrap();
        let raw = encode(
            &data,
            Stream::new_raw_encoder(
                Filters::new()
                    .x86_properties(&16u32.to_le_bytes())
                    .unwrap()
                    .lzma2(&lzma2),
            )
            .unwrap(),
        );
        let spec =
            r#"{"format": 3, "filters": [{"id": 4, "start_offset": 16}, {"id": 33, "preset": 1}]}"#;
        assert_eq!(
            codec(spec).decode(&raw, Limit::Exact(n)).as_ref(),
            Ok(&data)
        );
        // The xz stream records its filters: `filters` is not needed (nor used) to decode.
        let with_filters = r#"{"format": 1, "filters": [{"id": 33, "preset": 1}]}"#;
        assert_eq!(
            codec(with_filters)
                .decode(&xz(&data, 1), Limit::Exact(n))
                .as_ref(),
            Ok(&data)
        );
    }

    #[test]
    fn refuses_configurations_python_refuses() {
        for bad in [
            r#"{"format": 4}"#,
            r#"{"format": 3}"#,
            r#"{"format": 3, "filters": []}"#,
            r#"{"format": 3, "filters": [{"id": 33, "bogus": 1}]}"#,
            r#"{"format": 3, "filters": [{"id": 3, "dist": 0}]}"#,
            r#"{"format": 3, "filters": [{"id": 3, "dist": 257}]}"#,
            r#"{"format": 3, "filters": [{"id": 99}]}"#,
            r#"{"format": 3, "filters": [{"dist": 1}]}"#,
            r#"{"format": 3, "filters": [{"id": 33, "dict_size": -1}]}"#,
        ] {
            let cfg: LzmaConfiguration = serde_json::from_str(bad).unwrap();
            assert!(LzmaCodec::new(cfg).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<LzmaConfiguration>(r#"{"level": 1}"#).is_err());
        // A chain liblzma refuses (LZMA2 not last) is an error when decoding.
        let c = codec(r#"{"format": 3, "filters": [{"id": 33}, {"id": 3}]}"#);
        assert!(matches!(
            c.decode(&[0], Limit::Exact(1)),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn follows_python_on_several_streams() {
        let (a, b) = (sample(3000), sample(10));
        let mut two = xz(&a, 1);
        two.extend(xz(&b, 1));
        let mut both = a.clone();
        both.extend(&b);
        let c = codec("{}");
        assert_eq!(c.decode(&two, Limit::Exact(3010)), Ok(both));
        // Garbage of a header's length or more after a stream is ignored; a stream cut short,
        // or a shorter tail that could still start a stream, is an error.
        let mut junk = xz(&a, 1);
        junk.extend([0; 16]);
        assert_eq!(c.decode(&junk, Limit::Exact(3000)).as_ref(), Ok(&a));
        let mut tail = xz(&a, 1);
        tail.extend([0xfd, b'7']);
        assert_eq!(
            c.decode(&tail, Limit::Exact(3000)),
            Err(DecodeError::Truncated)
        );
        let enc = xz(&a, 1);
        assert_eq!(
            c.decode(&enc[..enc.len() - 1], Limit::Exact(3000)),
            Err(DecodeError::Truncated)
        );
        assert!(matches!(
            c.decode(&[0; 64], Limit::Exact(3000)),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn expansion_stops_at_the_limit() {
        let enc = xz(&vec![0; 8 << 20], 9);
        assert!(enc.len() < 2000);
        let c = codec("{}");
        assert_eq!(
            c.decode(&enc, Limit::Exact(1000)),
            Err(DecodeError::TooLong { limit: 1000 })
        );
        assert_eq!(
            c.decode(&enc, Limit::AtMost(1000)),
            Err(DecodeError::TooLong { limit: 1000 })
        );
        assert_eq!(
            c.decode(&enc, Limit::Exact(9 << 20)),
            Err(DecodeError::WrongSize {
                got: 8 << 20,
                want: 9 << 20
            })
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn round_trips(data in proptest::collection::vec(any::<u8>(), 0..3000), preset in 0u32..=3) {
            let enc = xz(&data, preset);
            prop_assert_eq!(codec("{}").decode(&enc, Limit::Exact(data.len())), Ok(data));
        }

        #[test]
        fn damaged_chunks_are_errors_not_panics(
            len in 1usize..5000,
            raw: bool,
            cut in any::<proptest::sample::Index>(),
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), 1u8..), 0..4),
        ) {
            let data = sample(len);
            let (c, mut enc) = if raw {
                let lzma2 = LzmaOptions::new_preset(1).unwrap();
                let enc = encode(&data, Stream::new_raw_encoder(Filters::new().lzma2(&lzma2)).unwrap());
                (codec(r#"{"format": 3, "filters": [{"id": 33, "preset": 1}]}"#), enc)
            } else {
                (codec("{}"), xz(&data, 1))
            };
            for (at, x) in flips {
                let i = at.index(enc.len());
                enc[i] ^= x;
            }
            let enc = &enc[..cut.index(enc.len() + 1)];
            if let Ok(out) = c.decode(enc, Limit::AtMost(len)) {
                prop_assert!(out.len() <= len);
            }
        }

        #[test]
        fn arbitrary_bytes_are_errors_not_panics(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            format in 0i64..=3,
        ) {
            let c = LzmaCodec::new(LzmaConfiguration {
                format,
                check: -1,
                preset: None,
                filters: Some(vec![serde_json::from_str(r#"{"id": 33}"#).unwrap()]),
            })
            .unwrap();
            let _ = c.decode(&data, Limit::AtMost(1 << 16));
        }
    }
}
