//! Decoding one leaf chunk (an unsharded chunk, or the innermost chunk of a shard).
//!
//! Chains of the form `bytes` + at most one compressor (zstd, blosc, gzip, zlib) + an optional
//! trailing `crc32c` take a fast path: the chunk is decompressed straight into a caller buffer
//! (a reused per-thread scratch buffer, or the crop itself), with one reused zstd context per
//! thread, and only as far as the crops need where the codec allows stopping early: zstd chunks
//! of one block through [`zcrop_codec::zstd`], which decodes only the literal streams holding
//! the needed bytes (several chunks interleaved, see [`LeafDecoder::with_decoded_group`]),
//! blosc through [`zcrop_codec::blosc`] (raw splits read in place, LZ4 splits decoded only up to
//! the needed bytes, and only those bytes unshuffled: straight into the crops where no
//! transform applies, see [`LeafDecoder::with_blosc_chunk`]; other blosc chunks by c-blosc's
//! blocks), gzip and zlib by prefix. Every other
//! chain (transpose, filters, ...) goes through zarrs' `CodecChain::decode`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::Read;
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::Arc;

use zarrs::array::codec::{
    BloscCodec, BytesCodec, BytesCodecConfiguration, Crc32cCodec, GzipCodec, ZlibCodec, ZstdCodec,
};
use zarrs::array::{
    ArrayToBytesCodecTraits, BytesRepresentation, CodecChain, CodecMetadataOptions, CodecOptions,
    DataType, FillValue,
};
use zarrs::metadata::{ConfigurationSerialize, Endianness};
use zarrs::plugin::ExtensionName;

use zcrop_codec::{blosc, ffi, zstd};

use crate::array::WholeReason;

/// A zstd frame decodes block by block; blocks hold up to this many decoded bytes, so stopping
/// early only saves work when at least this much of the chunk is not needed.
const ZSTD_MAX_BLOCK: usize = 128 * 1024;

/// The compressor of a fast-path chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compressor {
    None,
    Zstd { checksum: bool },
    Blosc,
    Gzip,
    Zlib,
}

#[derive(Debug)]
enum Kind {
    Fast {
        compressor: Compressor,
        crc32c: bool,
        /// Byte-swap units of this many bytes after decoding (big-endian data).
        swap_unit: Option<usize>,
    },
    Generic(Arc<CodecChain>),
}

/// How one leaf chunk's bytes become its decoded elements (C order, native endian).
#[derive(Debug)]
pub(crate) struct LeafDecoder {
    kind: Kind,
    /// Decoded size of a chunk in bytes.
    pub(crate) chunk_bytes: usize,
    elsize: usize,
    shape: Vec<NonZeroU64>,
    data_type: DataType,
    fill_value: FillValue,
    options: CodecOptions,
    verify_checksums: bool,
}

/// What decoding one chunk cost.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DecodeCost {
    /// Decoded bytes produced (less than the chunk when decoding stopped early).
    pub(crate) bytes_decoded: u64,
    /// Why the chunk was decoded whole; `None` when only a part was decoded (or nothing: raw
    /// chunks are read in place).
    pub(crate) whole: Option<WholeReason>,
}

/// Why the zstd partial decoder left a chunk to libzstd.
fn zstd_whole_reason(e: &zstd::Error) -> WholeReason {
    match e {
        zstd::Error::Unsupported(zstd::MOST_OF_BLOCK_NEEDED) => WholeReason::ZstdNeededShareOverMax,
        zstd::Error::Unsupported(zstd::TOO_MANY_SEQUENCES) => WholeReason::ZstdTooManySequences,
        zstd::Error::Unsupported(zstd::SEVERAL_BLOCKS) => WholeReason::ZstdMultiBlockFrame,
        zstd::Error::Unsupported(_) | zstd::Error::Corrupt(_) => WholeReason::ZstdOther,
    }
}

/// Why blosc's own decoder left a chunk to c-blosc.
fn blosc_whole_reason(e: &blosc::Error) -> WholeReason {
    match e {
        blosc::Error::Unsupported(blosc::OTHER_COMPRESSOR) => WholeReason::BloscOtherCompressor,
        blosc::Error::Unsupported(_) | blosc::Error::Corrupt(_) => WholeReason::BloscOther,
    }
}

thread_local! {
    static INFLATE: RefCell<Option<libdeflater::Decompressor>> = const { RefCell::new(None) };
    /// Literals of single-chunk partial decodes.
    static ZSTD_BLOCK_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Per-thread buffers of grouped decodes: (chunk, literals) per member.
    static GROUP: RefCell<Vec<(Vec<u8>, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
    /// Decompressed splits of blosc chunks read through [`blosc_block`].
    static BLOSC_SCRATCH: RefCell<blosc::Scratch> = RefCell::new(blosc::Scratch::default());
}

/// Opens the blosc chunk `data` (of `full` decoded bytes) for the bytes `range` through
/// [`blosc_block`] and calls `f` with it; `Err` with why where c-blosc must decode it (see
/// there).
fn with_blosc_block<R>(
    data: &[u8],
    full: usize,
    range: Range<usize>,
    f: impl FnOnce(&blosc::Chunk<'_>) -> R,
) -> Result<(R, DecodeCost), WholeReason> {
    if blosc::decoded_size(data) != Some(full) {
        return Err(WholeReason::BloscOther);
    }
    let needed_whole = range.len() >= full;
    BLOSC_SCRATCH.with(|cell| {
        let mut scratch = cell.borrow_mut();
        let chunk = blosc::open(data, range, &mut scratch).map_err(|e| blosc_whole_reason(&e))?;
        let cost = DecodeCost {
            bytes_decoded: chunk.decoded_bytes() as u64,
            whole: needed_whole.then_some(WholeReason::NeededWhole),
        };
        Ok((f(&chunk), cost))
    })
}

/// Inflates a whole gzip or zlib chunk into `out` (its decoded size) and verifies the trailer's
/// checksum and length. libdeflate decodes it; a stream libdeflate refuses goes through flate2,
/// which decodes what libdeflate does not take (a gzip member followed by other bytes) and
/// otherwise says what is wrong with it.
fn inflate_whole(compressor: Compressor, data: &[u8], out: &mut [u8]) -> Result<(), String> {
    let full = out.len();
    let fast = INFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = slot.get_or_insert_with(libdeflater::Decompressor::new);
        if compressor == Compressor::Gzip {
            d.gzip_decompress(data, out)
        } else {
            d.zlib_decompress(data, out)
        }
    });
    if fast == Ok(full) {
        return Ok(());
    }
    let mut reader = inflate_reader(compressor, data);
    reader
        .read_exact(out)
        .map_err(|e| inflate_err(compressor, &e))?;
    // Reading on to the end verifies the trailer checksum and length.
    let mut extra = [0u8; 1];
    let n = reader
        .read(&mut extra)
        .map_err(|e| inflate_err(compressor, &e))?;
    if n != 0 {
        return Err(
            format!("{compressor:?} stream decodes to more than {full} bytes").to_lowercase(),
        );
    }
    Ok(())
}

/// Inflates the first `out.len()` bytes of a gzip or zlib chunk, not verifying its checksum.
fn inflate_prefix(compressor: Compressor, data: &[u8], out: &mut [u8]) -> Result<(), String> {
    inflate_reader(compressor, data)
        .read_exact(out)
        .map_err(|e| inflate_err(compressor, &e))
}

fn inflate_reader(compressor: Compressor, data: &[u8]) -> Box<dyn Read + '_> {
    if compressor == Compressor::Gzip {
        Box::new(flate2::bufread::GzDecoder::new(data))
    } else {
        Box::new(flate2::bufread::ZlibDecoder::new(data))
    }
}

fn inflate_err(compressor: Compressor, e: &std::io::Error) -> String {
    format!("{compressor:?} stream: {e}").to_lowercase()
}

fn zstd_err(code: usize) -> String {
    format!("zstd: {}", ::zstd::zstd_safe::get_error_name(code))
}

impl LeafDecoder {
    /// Classifies `chain` (the chain that decodes one leaf chunk of `shape`).
    /// `chunk_bytes` is the product of `shape` times `elsize`, checked by the caller.
    pub(crate) fn new(
        chain: Arc<CodecChain>,
        chunk_bytes: usize,
        shape: Vec<NonZeroU64>,
        data_type: DataType,
        fill_value: FillValue,
        elsize: usize,
        verify_checksums: bool,
    ) -> Self {
        let kind = Self::classify(&chain, &data_type, elsize).unwrap_or(Kind::Generic(chain));
        LeafDecoder {
            kind,
            chunk_bytes,
            elsize,
            shape,
            data_type,
            fill_value,
            options: CodecOptions::default()
                .with_concurrent_target(1)
                .with_validate_checksums(verify_checksums),
            verify_checksums,
        }
    }

    fn classify(chain: &CodecChain, data_type: &DataType, elsize: usize) -> Option<Kind> {
        if !chain.array_to_array_codecs().is_empty() {
            return None;
        }
        let a2b = chain.array_to_bytes_codec();
        a2b.as_any().downcast_ref::<BytesCodec>()?;
        let cfg = a2b.configuration_v3(&CodecMetadataOptions::default())?;
        let BytesCodecConfiguration::V1(bytes_cfg) =
            BytesCodecConfiguration::try_from_configuration(cfg).ok()?
        else {
            return None;
        };
        let native = if cfg!(target_endian = "little") {
            Endianness::Little
        } else {
            Endianness::Big
        };
        let swap_unit = match bytes_cfg.endian {
            Some(e) if e != native && elsize > 1 => {
                // Complex numbers are pairs of floats, each swapped on its own; fixed-length
                // UTF-32 strings are swapped per 4-byte code unit; byte strings not at all.
                match data_type.name_v3().as_deref() {
                    Some("complex64" | "complex128") => Some(elsize / 2),
                    Some("fixed_length_utf32") => Some(4),
                    Some(crate::dtype::NULL_TERMINATED_BYTES) => None,
                    _ => Some(elsize),
                }
            }
            _ => None,
        };
        let b2b = chain.bytes_to_bytes_codecs();
        let (comp_codecs, crc32c) = match b2b.split_last() {
            Some((last, rest)) if last.as_any().is::<Crc32cCodec>() => (rest, true),
            _ => (b2b, false),
        };
        let compressor = match comp_codecs {
            [] => Compressor::None,
            [c] => {
                let a = c.as_any();
                if a.is::<ZstdCodec>() {
                    let cfg = c.configuration_v3(&CodecMetadataOptions::default())?;
                    let checksum = cfg
                        .get("checksum")
                        .and_then(serde_json::Value::as_bool)
                        .unwrap_or(false);
                    Compressor::Zstd { checksum }
                } else if a.is::<BloscCodec>() {
                    Compressor::Blosc
                } else if a.is::<GzipCodec>() {
                    Compressor::Gzip
                } else if a.is::<ZlibCodec>() {
                    Compressor::Zlib
                } else {
                    return None;
                }
            }
            _ => return None,
        };
        Some(Kind::Fast {
            compressor,
            crc32c,
            swap_unit,
        })
    }

    /// A short description for `zcrop info` and logs, e.g. `fast: zstd + crc32c`.
    pub(crate) fn describe(&self) -> String {
        match &self.kind {
            Kind::Fast {
                compressor,
                crc32c,
                swap_unit,
            } => {
                let mut s = match compressor {
                    Compressor::None => "fast path: raw bytes".to_string(),
                    Compressor::Zstd { checksum: true } => {
                        "fast path: zstd (with checksum)".to_string()
                    }
                    Compressor::Zstd { checksum: false } => "fast path: zstd".to_string(),
                    Compressor::Blosc => "fast path: blosc".to_string(),
                    Compressor::Gzip => "fast path: gzip".to_string(),
                    Compressor::Zlib => "fast path: zlib".to_string(),
                };
                if *crc32c {
                    s.push_str(" + crc32c");
                }
                if swap_unit.is_some() {
                    s.push_str(" (big-endian)");
                }
                s
            }
            Kind::Generic(chain) => {
                let names: Vec<String> = chain
                    .array_to_array_codecs()
                    .iter()
                    .map(|c| codec_name(c.name_v3()))
                    .chain(std::iter::once(codec_name(
                        chain.array_to_bytes_codec().name_v3(),
                    )))
                    .chain(
                        chain
                            .bytes_to_bytes_codecs()
                            .iter()
                            .map(|c| codec_name(c.name_v3())),
                    )
                    .collect();
                format!("zarrs codec chain: {}", names.join(" -> "))
            }
        }
    }

    /// Decodes a chunk of variable-length elements: their bytes one after the other, and the
    /// offsets of element `i`'s bytes, `offsets[i]..offsets[i + 1]` (one more than the chunk
    /// has elements). The bytes-to-bytes codecs are zarrs'; the vlen-utf8 / vlen-bytes framing
    /// is parsed here, checked against the chunk's length (zarrs' own parser trusts it).
    pub(crate) fn decode_variable(
        &self,
        encoded: &[u8],
    ) -> Result<(Vec<u8>, Vec<usize>), DecodeError> {
        let Kind::Generic(chain) = &self.kind else {
            return Err("not a chunk of variable-length elements".to_string().into());
        };
        let mut bytes = Cow::Borrowed(encoded);
        for codec in chain.bytes_to_bytes_codecs().iter().rev() {
            bytes = codec
                .decode(bytes, &BytesRepresentation::UnboundedSize, &self.options)
                .map_err(|e| e.to_string())?;
        }
        let elements = self.shape.iter().map(|s| s.get()).product::<u64>();
        Ok(parse_vlen(&bytes, elements)?)
    }

    /// Whether the leaf chunks' array-to-bytes codec is `vlen-bytes` (elements are bytes,
    /// not UTF-8 text).
    pub(crate) fn vlen_bytes(&self) -> bool {
        matches!(&self.kind, Kind::Generic(chain)
            if chain.array_to_bytes_codec().name_v3().as_deref() == Some("vlen-bytes"))
    }

    /// The fill value's bytes (for variable-length elements: the fill element's bytes).
    pub(crate) fn fill_bytes(&self) -> &[u8] {
        self.fill_value.as_ne_bytes()
    }

    /// Whether this chain can decode straight into a caller buffer.
    pub(crate) fn decodes_in_place(&self) -> bool {
        matches!(self.kind, Kind::Fast { .. })
    }

    /// Whether chunks decode only their needed part through [`zstd_block`], whose literal
    /// streams run faster several chunks at a time: see [`Self::with_decoded_group`].
    /// Only chunks that fit one zstd block (128 KiB decoded) qualify: larger ones are frames of
    /// several blocks, which libzstd decodes, and the group's buffers are chunk-sized.
    pub(crate) fn decodes_in_groups(&self) -> bool {
        self.chunk_bytes <= ZSTD_MAX_BLOCK
            && matches!(self.kind, Kind::Fast { compressor: Compressor::Zstd { checksum }, .. }
                if !(checksum && self.verify_checksums))
    }

    /// Decodes several chunks, each with the byte range crops need, and calls `f(k, decoded)`
    /// for each (at least the range valid, as in [`Self::with_decoded`]). zstd chunks of one
    /// block decode their needed parts together ([`zstd::decode_many`]); the others one
    /// by one. Returns each chunk's cost or error.
    pub(crate) fn with_decoded_group(
        &self,
        items: &[(&[u8], Range<usize>)],
        mut f: impl FnMut(usize, &[u8]),
    ) -> Vec<Result<DecodeCost, DecodeError>> {
        let Kind::Fast {
            compressor: Compressor::Zstd { .. },
            crc32c,
            swap_unit,
        } = &self.kind
        else {
            return self.decode_each(items, &mut f);
        };
        if !self.decodes_in_groups() {
            return self.decode_each(items, &mut f);
        }
        let full = self.chunk_bytes;
        GROUP.with(|cell| {
            let mut bufs = cell.borrow_mut();
            if bufs.len() < items.len() {
                bufs.resize_with(items.len(), Default::default);
            }
            let mut results: Vec<Option<Result<DecodeCost, DecodeError>>> = vec![None; items.len()];
            let mut members = Vec::with_capacity(items.len());
            let mut jobs = Vec::with_capacity(items.len());
            for (k, ((bytes, range), (chunk, literals))) in
                items.iter().zip(bufs.iter_mut()).enumerate()
            {
                let range = self.element_range(range);
                if range.len() == full {
                    continue;
                }
                match self
                    .strip_crc32c(bytes, *crc32c)
                    .map_err(DecodeError::from)
                    .and_then(|src| zeroed(chunk, full).map(|()| src))
                {
                    Ok(src) => {
                        members.push(k);
                        jobs.push(zstd::Job {
                            src,
                            out: chunk,
                            want: range,
                            scratch: literals,
                        });
                    }
                    Err(e) => results[k] = Some(Err(e)),
                }
            }
            let decoded = zstd::decode_many(&mut jobs, zstd::MAX_SHARE);
            drop(jobs);
            for (&k, r) in members.iter().zip(decoded) {
                if let Ok(r) = r {
                    let chunk = &mut bufs[k].0;
                    if let Some(unit) = swap_unit {
                        swap_elements(chunk, &r, *unit);
                    }
                    f(k, chunk);
                    results[k] = Some(Ok(DecodeCost {
                        bytes_decoded: r.len() as u64,
                        whole: None,
                    }));
                }
            }
            // The rest (whole chunks, several blocks, damaged frames) through libzstd, which
            // also words the errors.
            let mut scratch = bufs
                .first_mut()
                .map(|b| std::mem::take(&mut b.0))
                .unwrap_or_default();
            let out = results
                .into_iter()
                .enumerate()
                .map(|(k, r)| {
                    r.unwrap_or_else(|| {
                        let (bytes, range) = &items[k];
                        self.with_decoded(bytes, range.clone(), &mut scratch, |c| f(k, c))
                            .map(|((), cost)| cost)
                    })
                })
                .collect();
            if let Some(b) = bufs.first_mut() {
                b.0 = scratch;
            }
            out
        })
    }

    fn decode_each(
        &self,
        items: &[(&[u8], Range<usize>)],
        f: &mut impl FnMut(usize, &[u8]),
    ) -> Vec<Result<DecodeCost, DecodeError>> {
        let mut scratch = Vec::new();
        items
            .iter()
            .enumerate()
            .map(|(k, (bytes, range))| {
                self.with_decoded(bytes, range.clone(), &mut scratch, |c| f(k, c))
                    .map(|((), cost)| cost)
            })
            .collect()
    }

    /// Rounds `range` out to whole elements and clamps it to the chunk.
    fn element_range(&self, range: &Range<usize>) -> Range<usize> {
        let e = self.elsize;
        let start = range.start / e * e;
        let end = range.end.div_ceil(e) * e;
        start..end.min(self.chunk_bytes)
    }

    /// Decodes the chunk `encoded` and calls `f` with its decoded bytes, of which at least
    /// `range` is valid (the whole chunk for chains that cannot stop early). `scratch` is reused
    /// between calls.
    pub(crate) fn with_decoded<R>(
        &self,
        encoded: &[u8],
        range: Range<usize>,
        scratch: &mut Vec<u8>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<(R, DecodeCost), DecodeError> {
        match &self.kind {
            Kind::Generic(chain) => {
                // zarrs allocates the decoded chunk itself, infallibly: make sure first that
                // this process can have that much memory.
                can_allocate(self.chunk_bytes)?;
                let decoded = chain
                    .decode(
                        Cow::Borrowed(encoded),
                        &self.shape,
                        &self.data_type,
                        &self.fill_value,
                        &self.options,
                    )
                    .map_err(|e| e.to_string())?
                    .into_fixed()
                    .map_err(|e| e.to_string())?;
                if decoded.len() != self.chunk_bytes {
                    return Err(format!(
                        "decoded to {} bytes, expected {}",
                        decoded.len(),
                        self.chunk_bytes
                    )
                    .into());
                }
                let whole = if range.len() >= self.chunk_bytes {
                    WholeReason::NeededWhole
                } else {
                    WholeReason::CodecChain
                };
                let cost = DecodeCost {
                    bytes_decoded: self.chunk_bytes as u64,
                    whole: Some(whole),
                };
                Ok((f(&decoded), cost))
            }
            Kind::Fast {
                compressor: Compressor::None,
                crc32c,
                swap_unit: None,
            } => {
                // Stored raw in native order: the encoded bytes are the chunk.
                let data = self.strip_crc32c(encoded, *crc32c)?;
                self.check_raw_len(data)?;
                Ok((f(data), DecodeCost::default()))
            }
            Kind::Fast { .. } => {
                zeroed(scratch, self.chunk_bytes)?;
                let range = self.element_range(&range);
                let cost = self.decode_fast(encoded, scratch, range)?;
                Ok((f(scratch), cost))
            }
        }
    }

    /// Decodes the whole chunk into `out` (exactly [`Self::chunk_bytes`] long). Fast-path chains
    /// only (see [`Self::decodes_in_place`]); others decode and copy.
    pub(crate) fn decode_full_into(
        &self,
        encoded: &[u8],
        out: &mut [u8],
    ) -> Result<DecodeCost, DecodeError> {
        if out.len() != self.chunk_bytes {
            return Err(format!(
                "output of {} bytes for a chunk of {}",
                out.len(),
                self.chunk_bytes
            )
            .into());
        }
        match &self.kind {
            Kind::Fast { .. } => self.decode_fast(encoded, out, 0..self.chunk_bytes),
            Kind::Generic(_) => {
                let mut scratch = Vec::new();
                let ((), cost) =
                    self.with_decoded(encoded, 0..self.chunk_bytes, &mut scratch, |d| {
                        out.copy_from_slice(d);
                    })?;
                Ok(cost)
            }
        }
    }

    fn strip_crc32c<'a>(&self, encoded: &'a [u8], crc32c: bool) -> Result<&'a [u8], String> {
        if !crc32c {
            return Ok(encoded);
        }
        let Some(split) = encoded.len().checked_sub(4) else {
            return Err(format!(
                "{} bytes is too short for a crc32c checksum",
                encoded.len()
            ));
        };
        let (data, sum) = encoded.split_at(split);
        if self.verify_checksums {
            let stored = u32::from_le_bytes([sum[0], sum[1], sum[2], sum[3]]);
            let actual = crc32c::crc32c(data);
            if stored != actual {
                return Err(format!(
                    "crc32c checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
                ));
            }
        }
        Ok(data)
    }

    fn check_raw_len(&self, data: &[u8]) -> Result<(), String> {
        if data.len() == self.chunk_bytes {
            Ok(())
        } else {
            Err(format!(
                "raw chunk has {} bytes, expected {}",
                data.len(),
                self.chunk_bytes
            ))
        }
    }

    /// Decodes at least `range` of the chunk into `out` (chunk-sized). Stops early, or decodes
    /// only the needed blosc blocks, where that saves work and skips no checksum.
    fn decode_fast(
        &self,
        encoded: &[u8],
        out: &mut [u8],
        range: Range<usize>,
    ) -> Result<DecodeCost, DecodeError> {
        let Kind::Fast {
            compressor,
            crc32c,
            swap_unit,
        } = &self.kind
        else {
            return Err("not a fast-path chain".into());
        };
        let data = self.strip_crc32c(encoded, *crc32c)?;
        let full = self.chunk_bytes;
        let needed_whole = range.len() >= full;
        // What a blosc chunk read through `blosc_block` cost (its splits' needed prefixes).
        let mut blosc_cost = None;
        // Why the chunk was decoded whole, where it was.
        let mut whole = None;
        let decoded: Range<usize> = match compressor {
            Compressor::None => {
                self.check_raw_len(data)?;
                out[range.clone()].copy_from_slice(&data[range.clone()]);
                range.clone()
            }
            Compressor::Zstd { checksum } => {
                let checked = *checksum && self.verify_checksums;
                let partial = !checked && !needed_whole;
                // Only a chunk that fits one block can be a one-block frame.
                let within_block = if partial && full <= ZSTD_MAX_BLOCK {
                    ZSTD_BLOCK_SCRATCH.with(|s| {
                        zstd::decode_range(
                            data,
                            out,
                            range.clone(),
                            &mut s.borrow_mut(),
                            zstd::MAX_SHARE,
                        )
                    })
                } else {
                    Err(zstd::Error::Unsupported("whole chunk"))
                };
                let stop_early = partial && range.end + ZSTD_MAX_BLOCK <= full;
                if let Ok(r) = within_block {
                    r
                } else if stop_early {
                    zstd_prefix(data, &mut out[..range.end])?;
                    0..range.end
                } else {
                    whole = Some(if needed_whole {
                        WholeReason::NeededWhole
                    } else if checked {
                        WholeReason::Checksum
                    } else if full > ZSTD_MAX_BLOCK {
                        WholeReason::ZstdMultiBlockFrame
                    } else {
                        within_block
                            .as_ref()
                            .err()
                            .map_or(WholeReason::ZstdOther, zstd_whole_reason)
                    });
                    let n = zstd::with_dctx(|d| d.decompress(out, data)).map_err(zstd_err)?;
                    if n != full {
                        return Err(
                            format!("zstd frame decoded to {n} bytes, expected {full}").into()
                        );
                    }
                    0..full
                }
            }
            Compressor::Blosc => {
                let own = with_blosc_block(data, full, range.clone(), |chunk| {
                    chunk.gather(range.start, &mut out[range.clone()]);
                });
                match own {
                    Ok(((), cost)) => {
                        blosc_cost = Some(cost);
                        range.clone()
                    }
                    Err(refused) => {
                        let h = ffi::blosc_header(data)?;
                        if h.nbytes != full {
                            return Err(format!(
                                "blosc chunk decodes to {} bytes, expected {full}",
                                h.nbytes
                            )
                            .into());
                        }
                        // Only decode a sub-range when it skips at least one whole block.
                        let ts = h.typesize;
                        let start = range.start / ts * ts;
                        let end = range.end.div_ceil(ts) * ts;
                        let skips_a_block = (end - start)
                            .checked_add(h.blocksize)
                            .is_some_and(|n| n <= full);
                        if h.blocksize > 0 && skips_a_block && end <= full {
                            ffi::blosc_getitem(data, &h, start, &mut out[start..end])?;
                            start..end
                        } else {
                            whole = Some(if needed_whole {
                                WholeReason::NeededWhole
                            } else {
                                refused
                            });
                            ffi::blosc_decompress(data, &h, out)?;
                            0..full
                        }
                    }
                }
            }
            Compressor::Gzip | Compressor::Zlib => {
                // gzip and zlib carry a checksum of the whole stream; stop early only when
                // checksums are not verified.
                let end = if self.verify_checksums {
                    full
                } else {
                    range.end
                };
                if end == full {
                    whole = Some(if needed_whole {
                        WholeReason::NeededWhole
                    } else if self.verify_checksums {
                        WholeReason::Checksum
                    } else {
                        WholeReason::NeededEnd
                    });
                    inflate_whole(*compressor, data, out)?;
                } else {
                    inflate_prefix(*compressor, data, &mut out[..end])?;
                }
                0..end
            }
        };
        if let Some(unit) = swap_unit {
            swap_elements(out, &decoded, *unit);
        }
        Ok(blosc_cost.unwrap_or(DecodeCost {
            bytes_decoded: decoded.len() as u64,
            whole,
        }))
    }

    /// Asks the CPU for the bytes of `encoded` that decoding `range` reads (the blosc header's
    /// cache line must have been asked for earlier; see [`blosc::prefetch`]); all of
    /// `encoded` for other chains.
    pub(crate) fn prefetch(&self, encoded: &[u8], range: &Range<usize>) {
        if let Kind::Fast {
            compressor: Compressor::Blosc,
            swap_unit: None,
            crc32c,
        } = &self.kind
        {
            let data = if *crc32c {
                &encoded[..encoded.len().saturating_sub(4)]
            } else {
                encoded
            };
            blosc::prefetch(data, self.element_range(range));
        } else {
            zcrop_codec::dest::prefetch_read(encoded);
        }
    }

    /// Whether the chunk `encoded` decodes at about the speed of a memory copy (no compressor,
    /// or blosc with LZ4 or BloscLZ inside, and no other codec), so that decoding it again
    /// costs about what copying it out of a cache of decoded chunks does.
    pub(crate) fn decodes_fast(&self, encoded: &[u8]) -> bool {
        match &self.kind {
            Kind::Fast {
                compressor: Compressor::None,
                ..
            } => true,
            Kind::Fast {
                compressor: Compressor::Blosc,
                ..
            } => blosc::decodes_fast(encoded),
            _ => false,
        }
    }

    /// Whether chunks decode through the blosc fast path alone (no checksum, no other codec):
    /// then a rebuilt chunk of the needed blocks decodes as the whole one would
    /// ([`zcrop_codec::blosc::BlockIndex`]).
    pub(crate) fn is_plain_blosc(&self) -> bool {
        matches!(
            self.kind,
            Kind::Fast {
                compressor: Compressor::Blosc,
                crc32c: false,
                ..
            }
        )
    }

    /// For blosc chunks [`blosc_block`] reads (native byte order): opens `encoded` for the
    /// bytes `range` and calls `f` with it, to unshuffle the needed bytes straight into the
    /// crops ([`blosc::Chunk::gather`]) instead of into a decoded chunk first. `None`
    /// for other chains and chunks (decode those with [`Self::with_decoded`]).
    pub(crate) fn with_blosc_chunk<R>(
        &self,
        encoded: &[u8],
        range: Range<usize>,
        f: impl FnOnce(&blosc::Chunk<'_>) -> R,
    ) -> Option<Result<(R, DecodeCost), DecodeError>> {
        let Kind::Fast {
            compressor: Compressor::Blosc,
            crc32c,
            swap_unit: None,
        } = &self.kind
        else {
            return None;
        };
        let data = match self.strip_crc32c(encoded, *crc32c) {
            Ok(data) => data,
            Err(e) => return Some(Err(e.into())),
        };
        with_blosc_block(data, self.chunk_bytes, self.element_range(&range), f)
            .ok()
            .map(Ok)
    }
}

/// Why a chunk did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The bytes are not a valid encoding of a chunk: what the decoder said.
    Corrupt(String),
    /// The process could not have the memory to decode the chunk into.
    NoMemory(usize),
}

impl From<String> for DecodeError {
    fn from(reason: String) -> Self {
        DecodeError::Corrupt(reason)
    }
}

impl From<&str> for DecodeError {
    fn from(reason: &str) -> Self {
        DecodeError::Corrupt(reason.to_string())
    }
}

/// Makes `buf` exactly `len` bytes long (new bytes zero), failing instead of aborting when the
/// memory cannot be had: `len` comes from metadata.
pub(crate) fn zeroed(buf: &mut Vec<u8>, len: usize) -> Result<(), DecodeError> {
    if buf.len() != len {
        buf.try_reserve_exact(len.saturating_sub(buf.len()))
            .map_err(|_| DecodeError::NoMemory(len))?;
        buf.resize(len, 0);
    }
    Ok(())
}

/// Whether an allocation of `len` bytes succeeds now, for code that will then allocate that
/// much infallibly (zarrs' decoders): a request the process cannot have (address-space limit,
/// or more than exists) fails here, as an error, instead of aborting there.
fn can_allocate(len: usize) -> Result<(), DecodeError> {
    let mut probe: Vec<u8> = Vec::new();
    probe
        .try_reserve_exact(len)
        .map_err(|_| DecodeError::NoMemory(len))
}

/// Reverses the bytes of every `unit`-byte element of `chunk` that lies wholly inside
/// `decoded`. A partial decode may start or end mid-element (a zstd block's first needed
/// sequence need not start on an element); elements are counted from the chunk's start, so
/// the element-aligned range the crops asked for is always swapped whole.
fn swap_elements(chunk: &mut [u8], decoded: &Range<usize>, unit: usize) {
    let start = decoded.start.div_ceil(unit) * unit;
    let end = (decoded.end.min(chunk.len()) / unit) * unit;
    if start < end {
        for el in chunk[start..end].chunks_exact_mut(unit) {
            el.reverse();
        }
    }
}

/// A codec's v3 name, or `?` for codecs without one.
pub(crate) fn codec_name(name: Option<Cow<'static, str>>) -> String {
    name.map_or_else(|| "?".to_string(), Cow::into_owned)
}

/// Streams a zstd frame into `out` and stops once it is full.
fn zstd_prefix(src: &[u8], out: &mut [u8]) -> Result<(), String> {
    use ::zstd::zstd_safe::{InBuffer, OutBuffer, ResetDirective};
    let want = out.len();
    zstd::with_dctx(|dctx| {
        dctx.reset(ResetDirective::SessionOnly).map_err(zstd_err)?;
        let mut ob = OutBuffer::around(out);
        let mut ib = InBuffer::around(src);
        while ob.pos() < want {
            let before = (ib.pos(), ob.pos());
            let hint = dctx.decompress_stream(&mut ob, &mut ib).map_err(zstd_err)?;
            if hint == 0 && ob.pos() < want {
                return Err(format!(
                    "zstd frame ended after {} of {want} bytes",
                    ob.pos()
                ));
            }
            if (ib.pos(), ob.pos()) == before {
                return Err("zstd frame is truncated".into());
            }
        }
        Ok(())
    })
}

/// Parses the vlen-utf8 / vlen-bytes framing of a chunk of `elements` elements: a
/// little-endian `u32` count, then per element a `u32` length and that many bytes.
fn parse_vlen(b: &[u8], elements: u64) -> Result<(Vec<u8>, Vec<usize>), String> {
    let u32_at = |pos: usize| -> Option<u64> {
        let word = b.get(pos..pos.checked_add(4)?)?;
        Some(u64::from(u32::from_le_bytes(word.try_into().ok()?)))
    };
    let count =
        u32_at(0).ok_or_else(|| format!("{} bytes, too short for a vlen header", b.len()))?;
    if count != elements {
        return Err(format!(
            "the vlen header counts {count} elements, the chunk has {elements}"
        ));
    }
    // Each element takes at least its 4-byte length.
    if count > (b.len() as u64 - 4) / 4 {
        return Err(format!("{count} elements cannot fit in {} bytes", b.len()));
    }
    let n = count as usize;
    let mut bytes = Vec::with_capacity(b.len() - 4 - 4 * n);
    let mut offsets = Vec::with_capacity(n + 1);
    offsets.push(0);
    let mut pos = 4usize;
    for i in 0..n {
        let len = u32_at(pos).ok_or_else(|| format!("element {i}'s length is cut off"))?;
        pos += 4;
        let end = pos
            .checked_add(len as usize)
            .filter(|&e| e <= b.len())
            .ok_or_else(|| {
                format!(
                    "element {i} of {len} bytes at byte {pos} runs past the chunk's end ({} bytes)",
                    b.len()
                )
            })?;
        bytes.extend_from_slice(&b[pos..end]);
        offsets.push(bytes.len());
        pos = end;
    }
    if pos != b.len() {
        return Err(format!("{} bytes after the last element", b.len() - pos));
    }
    Ok((bytes, offsets))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn vlen(elements: &[&[u8]]) -> Vec<u8> {
        let mut b = (elements.len() as u32).to_le_bytes().to_vec();
        for e in elements {
            b.extend_from_slice(&(e.len() as u32).to_le_bytes());
            b.extend_from_slice(e);
        }
        b
    }

    #[test]
    fn vlen_framing_parses_and_rejects_what_does_not_add_up() {
        let good = vlen(&[b"ab", b"", b"\xff\x00z"]);
        let (bytes, offsets) = parse_vlen(&good, 3).unwrap();
        assert_eq!(bytes, b"ab\xff\x00z");
        assert_eq!(offsets, [0, 2, 2, 5]);
        assert!(
            parse_vlen(&good, 4)
                .unwrap_err()
                .contains("counts 3 elements")
        );
        assert!(
            parse_vlen(&good[..good.len() - 1], 3)
                .unwrap_err()
                .contains("runs past")
        );
        let cut = vlen(&[b"abcd", b""]);
        assert!(parse_vlen(&cut[..14], 2).unwrap_err().contains("cut off"));
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(
            parse_vlen(&trailing, 3)
                .unwrap_err()
                .contains("after the last")
        );
        assert!(parse_vlen(&[1, 0], 1).unwrap_err().contains("too short"));
        // A count the bytes cannot hold is refused before anything is allocated for it.
        let huge = vlen(&[b"a"]);
        let mut huge = huge;
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            parse_vlen(&huge, u64::from(u32::MAX))
                .unwrap_err()
                .contains("cannot fit")
        );
    }

    proptest! {
        /// Any bytes: elements or an error, never a panic; parsed elements re-frame to the
        /// same bytes.
        #[test]
        fn vlen_parsing_never_panics(b in proptest::collection::vec(any::<u8>(), 0..64), n in 0u64..8) {
            if let Ok((bytes, offsets)) = parse_vlen(&b, n) {
                let elements: Vec<&[u8]> = offsets.windows(2).map(|w| &bytes[w[0]..w[1]]).collect();
                prop_assert_eq!(vlen(&elements), b);
            }
        }
    }

    /// A decoder of (128, 128) uint16 chunks through `codecs` (v3 codec metadata after
    /// `bytes`).
    fn decoder(codecs: &serde_json::Value) -> LeafDecoder {
        let mut metadata =
            vec![serde_json::json!({"name": "bytes", "configuration": {"endian": "little"}})];
        metadata.extend(codecs.as_array().unwrap().iter().cloned());
        let metadata: Vec<zarrs::metadata::v3::MetadataV3> =
            serde_json::from_value(serde_json::Value::Array(metadata)).unwrap();
        let chain = CodecChain::from_metadata(&metadata).unwrap();
        let shape = vec![NonZeroU64::new(128).unwrap(); 2];
        LeafDecoder::new(
            Arc::new(chain),
            128 * 128 * 2,
            shape,
            zarrs::array::data_type::uint16(),
            FillValue::from([0u8; 2]),
            2,
            false,
        )
    }

    /// uint16 imagery: a smooth field plus 5 bits of noise, little-endian bytes.
    fn imagery() -> Vec<u8> {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        (0..128 * 128u32)
            .flat_map(|i| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let (y, x) = (f64::from(i / 128), f64::from(i % 128));
                let base = 20000.0 + 8000.0 * ((y * 0.011).sin() * (x * 0.013).cos());
                (base as u16 + (state % 32) as u16).to_le_bytes()
            })
            .collect()
    }

    /// Decodes `range` of `encoded` with `d`, checks the bytes against `plain`, and returns
    /// why the chunk was decoded whole.
    fn whole_reason(
        d: &LeafDecoder,
        encoded: &[u8],
        plain: &[u8],
        range: Range<usize>,
    ) -> Option<WholeReason> {
        let ((), cost) = d
            .with_decoded(encoded, range.clone(), &mut Vec::new(), |c| {
                assert_eq!(c[range.clone()], plain[range.clone()], "{range:?}");
            })
            .unwrap();
        let whole = cost.bytes_decoded == plain.len() as u64;
        assert_eq!(cost.whole.is_some(), whole, "{range:?}: {cost:?}");
        cost.whole
    }

    #[test]
    fn chunks_decoded_whole_say_why() {
        let plain = imagery();
        let full = plain.len();
        let band = full / 2..full / 2 + 512;
        let most = 100..full - 100;

        let zstd_chunk = ::zstd::bulk::compress(&plain, 3).unwrap();
        let d = decoder(
            &serde_json::json!([{"name": "zstd", "configuration": {"level": 3, "checksum": false}}]),
        );
        assert_eq!(whole_reason(&d, &zstd_chunk, &plain, band.clone()), None);
        assert_eq!(
            whole_reason(&d, &zstd_chunk, &plain, 0..full),
            Some(WholeReason::NeededWhole)
        );
        assert_eq!(
            whole_reason(&d, &zstd_chunk, &plain, most.clone()),
            Some(WholeReason::ZstdNeededShareOverMax)
        );

        let blosc = |shuffle: i32| ffi::compress::blosc_compress(&plain, 2, shuffle, "lz4", 0);
        let json = |shuffle: &str| {
            serde_json::json!([{"name": "blosc", "configuration": {
                "cname": "lz4", "clevel": 5, "shuffle": shuffle, "typesize": 2, "blocksize": 0}}])
        };
        let d = decoder(&json("shuffle"));
        assert_eq!(whole_reason(&d, &blosc(1), &plain, band.clone()), None);
        // Bitshuffled chunks are read by zcrop's blosc path too.
        let d = decoder(&json("bitshuffle"));
        assert_eq!(whole_reason(&d, &blosc(2), &plain, band.clone()), None);

        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(5));
        std::io::Write::write_all(&mut gz, &plain).unwrap();
        let gz = gz.finish().unwrap();
        let d = decoder(&serde_json::json!([{"name": "gzip", "configuration": {"level": 5}}]));
        assert_eq!(whole_reason(&d, &gz, &plain, band), None);
        assert_eq!(
            whole_reason(&d, &gz, &plain, full - 10..full),
            Some(WholeReason::NeededEnd)
        );
    }

    fn deflated(compressor: Compressor, plain: &[u8], level: u32) -> Vec<u8> {
        use std::io::Write;
        let level = flate2::Compression::new(level);
        if compressor == Compressor::Gzip {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), level);
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        } else {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), level);
            e.write_all(plain).unwrap();
            e.finish().unwrap()
        }
    }

    /// What flate2 alone makes of a whole stream: the chunk, or that it refuses it.
    fn flate2_whole(compressor: Compressor, data: &[u8], full: usize) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        inflate_reader(compressor, data)
            .read_to_end(&mut out)
            .ok()?;
        (out.len() == full).then_some(out)
    }

    #[test]
    fn whole_gzip_and_zlib_chunks_inflate_and_bad_streams_are_refused() {
        let plain = imagery();
        let full = plain.len();
        for compressor in [Compressor::Gzip, Compressor::Zlib] {
            for level in [0, 1, 5, 9] {
                for data in [plain.clone(), vec![0u8; full]] {
                    let stream = deflated(compressor, &data, level);
                    let mut out = vec![0xA5u8; full];
                    inflate_whole(compressor, &stream, &mut out).unwrap();
                    assert_eq!(out, data, "{compressor:?} level {level}");
                    let mut head = vec![0u8; 1000];
                    inflate_prefix(compressor, &stream, &mut head).unwrap();
                    assert_eq!(head, data[..1000]);
                }
            }
            let stream = deflated(compressor, &plain, 5);
            let mut out = vec![0u8; full];
            // A stream of more bytes than the chunk holds.
            let mut longer = plain.clone();
            longer.extend_from_slice(b"more");
            let err =
                inflate_whole(compressor, &deflated(compressor, &longer, 5), &mut out).unwrap_err();
            assert!(err.contains("decodes to more than 32768 bytes"), "{err}");
            // Fewer bytes than the chunk holds.
            let err = inflate_whole(
                compressor,
                &deflated(compressor, &plain[..100], 5),
                &mut out,
            )
            .unwrap_err();
            assert!(
                err.starts_with(&format!("{compressor:?} stream").to_lowercase()),
                "{err}"
            );
            // A wrong checksum, and a cut stream.
            let mut bad = stream.clone();
            let n = bad.len();
            bad[n - 5] ^= 1;
            assert!(inflate_whole(compressor, &bad, &mut out).is_err());
            assert!(inflate_whole(compressor, &stream[..n - 3], &mut out).is_err());
        }
        // A gzip member followed by other bytes: libdeflate refuses it, flate2 reads the member.
        let mut trailing = deflated(Compressor::Gzip, &plain, 5);
        trailing.extend_from_slice(&[0u8; 7]);
        let mut out = vec![0u8; full];
        inflate_whole(Compressor::Gzip, &trailing, &mut out).unwrap();
        assert_eq!(out, plain);
    }

    proptest! {
        /// A damaged stream inflates to what flate2 makes of it, or is refused where flate2
        /// refuses it.
        #[test]
        fn damaged_deflate_streams_agree_with_flate2(
            gzip in any::<bool>(),
            at in 0usize..4096,
            flip in 1u8..=255,
            cut in 0usize..64,
        ) {
            let compressor = if gzip { Compressor::Gzip } else { Compressor::Zlib };
            let plain: Vec<u8> = imagery()[..4096].to_vec();
            let mut stream = deflated(compressor, &plain, 5);
            let at = at % stream.len();
            stream[at] ^= flip;
            stream.truncate(stream.len() - cut.min(stream.len()));
            let mut out = vec![0u8; plain.len()];
            let ours = inflate_whole(compressor, &stream, &mut out).ok().map(|()| out);
            prop_assert_eq!(ours, flate2_whole(compressor, &stream, plain.len()));
        }
    }

    #[test]
    fn swapping_a_range_that_starts_mid_element_swaps_whole_elements_only() {
        // Eight big-endian u32s; a partial decode wrote bytes 5..27.
        let want: Vec<u32> = (0..8).map(|i| 0x0102_0304 * (i + 1)).collect();
        let mut chunk: Vec<u8> = want.iter().flat_map(|v| v.to_be_bytes()).collect();
        swap_elements(&mut chunk, &(5..27), 4);
        let got: Vec<u32> = chunk
            .chunks_exact(4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // Elements 2..6 lie wholly inside 5..27: swapped; 0, 1, 6 and 7 untouched.
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            if (2..6).contains(&i) {
                assert_eq!(g, w, "element {i}");
            } else {
                assert_eq!(g, u32::from_ne_bytes(w.to_be_bytes()), "element {i}");
            }
        }
    }
}
