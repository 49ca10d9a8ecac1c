//! The numcodecs `delta` filter (v2 id `delta`, v3 name `numcodecs.delta`), an array-to-array
//! codec.
//!
//! numcodecs' `Delta(dtype, astype=None)` views a chunk's elements (flattened in storage
//! order) as `dtype` and stores the first, then each one's difference from the one before
//! (`np.diff`, in `dtype`), cast to `astype` (`dtype` when absent). It decodes with
//! `np.cumsum(enc, out=dec)`: numpy adds in the promotion of the two types
//! (`np.result_type(astype, dtype)`), keeps the running sum in that type and casts each sum to
//! `dtype`. So integers wrap, an `int8` `astype` of `int16` data sums in `int16`, and `float32`
//! steps of `float64` data sum in `float64`. This module does the same, element by element,
//! for the numeric types (`int8` to `uint64`, `float16`, `float32`, `float64`). Configuration,
//! as numcodecs writes it: `{"dtype": "<i4", "astype": "<i2"}` (numpy type strings; the byte
//! order may be left out).
//!
//! The decoded elements are `dtype`'s bits in the array's data type, as zarr-python's
//! `.view(dtype)`: `dtype` must be as wide as the array's data type (it normally is the same).
//! The `bytes` codec before this one in zarrs' chain turns the stored bytes to native order
//! with the array's byte order, which is `dtype`'s; `astype` must then have the same byte
//! order (checked when the codec is made). A float sum cast to an integer type out of its range
//! (or a NaN) gives what numpy gives on x86-64: numpy leaves it to the CPU.

use std::num::NonZeroU64;
use std::sync::Arc;

use half::f16;
use serde::{Deserialize, Serialize};
use zarrs::array::codec::api::{
    Codec, CodecPluginV2, CodecPluginV3, CodecTraitsV2, CodecTraitsV3, PartialDecoderCapability,
    PartialEncoderCapability,
};
use zarrs::array::{
    ArrayBytes, ArrayCodecTraits, ArrayPartialDecoderTraits, ArraySubset, ArrayToArrayCodecTraits,
    CodecError, CodecMetadataOptions, CodecOptions, CodecTraits, DataType, FillValue, Indexer,
    RecommendedConcurrency, data_type,
};
use zarrs::metadata::Configuration;
use zarrs::metadata::v2::MetadataV2;
use zarrs::metadata::v3::MetadataV3;
use zarrs::plugin::{PluginCreateError, ZarrVersion};
use zarrs::storage::StorageError;

use super::{DecodeError, zeroed};

/// The codec's name in errors.
const NAME: &str = "numcodecs.delta";

/// A numeric type of numpy, as `delta` works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Num {
    /// `int8`.
    I8,
    /// `int16`.
    I16,
    /// `int32`.
    I32,
    /// `int64`.
    I64,
    /// `uint8`.
    U8,
    /// `uint16`.
    U16,
    /// `uint32`.
    U32,
    /// `uint64`.
    U64,
    /// `float16`.
    F16,
    /// `float32`.
    F32,
    /// `float64`.
    F64,
}

/// A byte order in a numpy type string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Little,
    Big,
    /// `|`, `=` or none: the machine's (or none, for one byte).
    Native,
}

impl Order {
    /// Little- or big-endian, for a type of `size` bytes (`None` for one byte).
    fn resolve(self, size: usize) -> Option<Order> {
        match self {
            _ if size == 1 => None,
            Order::Native if cfg!(target_endian = "big") => Some(Order::Big),
            Order::Native => Some(Order::Little),
            o => Some(o),
        }
    }
}

impl Num {
    /// The size in bytes.
    pub(crate) fn size(self) -> usize {
        match self {
            Num::I8 | Num::U8 => 1,
            Num::I16 | Num::U16 | Num::F16 => 2,
            Num::I32 | Num::U32 | Num::F32 => 4,
            Num::I64 | Num::U64 | Num::F64 => 8,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, Num::F16 | Num::F32 | Num::F64)
    }

    fn is_signed(self) -> bool {
        matches!(self, Num::I8 | Num::I16 | Num::I32 | Num::I64)
    }

    fn signed(size: usize) -> Num {
        match size {
            1 => Num::I8,
            2 => Num::I16,
            4 => Num::I32,
            _ => Num::I64,
        }
    }

    fn float(size: usize) -> Num {
        match size {
            2 => Num::F16,
            4 => Num::F32,
            _ => Num::F64,
        }
    }

    /// zarrs' data type of this type.
    fn data_type(self) -> DataType {
        match self {
            Num::I8 => data_type::int8(),
            Num::I16 => data_type::int16(),
            Num::I32 => data_type::int32(),
            Num::I64 => data_type::int64(),
            Num::U8 => data_type::uint8(),
            Num::U16 => data_type::uint16(),
            Num::U32 => data_type::uint32(),
            Num::U64 => data_type::uint64(),
            Num::F16 => data_type::float16(),
            Num::F32 => data_type::float32(),
            Num::F64 => data_type::float64(),
        }
    }

    /// numpy's promotion of two types (`np.result_type`).
    pub(crate) fn promote(a: Num, b: Num) -> Num {
        match (a.is_float(), b.is_float()) {
            (true, true) => Num::float(a.size().max(b.size())),
            (true, false) | (false, true) => {
                let (f, i) = if a.is_float() { (a, b) } else { (b, a) };
                // The smallest float that holds every value of the integer type, at most
                // float64.
                let holds = match i.size() {
                    1 => 2,
                    2 => 4,
                    _ => 8,
                };
                Num::float(f.size().max(holds))
            }
            (false, false) if a.is_signed() == b.is_signed() => {
                if a.size() >= b.size() {
                    a
                } else {
                    b
                }
            }
            (false, false) => {
                let (s, u) = if a.is_signed() { (a, b) } else { (b, a) };
                if s.size() > u.size() {
                    s
                } else if u.size() < 8 {
                    Num::signed(u.size() * 2)
                } else {
                    Num::F64
                }
            }
        }
    }

    /// Parses a numpy type string as numcodecs writes it (`<i4`, `|u1`, `>f8`; the byte order
    /// may be left out) or a numpy type name (`int32`).
    fn parse(s: &str) -> Result<(Num, Order), String> {
        let (order, code) = match s.as_bytes().first() {
            Some(b'<') => (Order::Little, &s[1..]),
            Some(b'>') => (Order::Big, &s[1..]),
            Some(b'|' | b'=') => (Order::Native, &s[1..]),
            _ => (Order::Native, s),
        };
        let num = match code {
            "i1" | "int8" => Num::I8,
            "i2" | "int16" => Num::I16,
            "i4" | "int32" => Num::I32,
            "i8" | "int64" => Num::I64,
            "u1" | "uint8" => Num::U8,
            "u2" | "uint16" => Num::U16,
            "u4" | "uint32" => Num::U32,
            "u8" | "uint64" => Num::U64,
            "f2" | "float16" => Num::F16,
            "f4" | "float32" => Num::F32,
            "f8" | "float64" => Num::F64,
            _ => {
                return Err(format!(
                    "data type {s:?} is not an integer or float numpy type (such as \"<i4\")"
                ));
            }
        };
        Ok((num, order))
    }
}

/// One value on its way through numpy's casts: an integer (as 64 bits) or a float.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Val {
    I(i64),
    U(u64),
    F(f64),
}

impl Val {
    /// The value of type `num` in `bytes` (`num.size()` bytes, native order).
    fn load(num: Num, bytes: &[u8]) -> Val {
        let mut b = [0u8; 8];
        let n = num.size().min(bytes.len());
        b[..n].copy_from_slice(&bytes[..n]);
        let [b0, b1, b2, b3, ..] = b;
        match num {
            Num::I8 => Val::I(i64::from(i8::from_ne_bytes([b0]))),
            Num::I16 => Val::I(i64::from(i16::from_ne_bytes([b0, b1]))),
            Num::I32 => Val::I(i64::from(i32::from_ne_bytes([b0, b1, b2, b3]))),
            Num::I64 => Val::I(i64::from_ne_bytes(b)),
            Num::U8 => Val::U(u64::from(b0)),
            Num::U16 => Val::U(u64::from(u16::from_ne_bytes([b0, b1]))),
            Num::U32 => Val::U(u64::from(u32::from_ne_bytes([b0, b1, b2, b3]))),
            Num::U64 => Val::U(u64::from_ne_bytes(b)),
            Num::F16 => Val::F(f16::from_ne_bytes([b0, b1]).to_f64()),
            Num::F32 => Val::F(f64::from(f32::from_ne_bytes([b0, b1, b2, b3]))),
            Num::F64 => Val::F(f64::from_ne_bytes(b)),
        }
    }

    /// The value as an integer's 64 bits (a float as numpy casts it to `num`).
    fn bits(self, num: Num) -> u64 {
        match self {
            Val::I(x) => x as u64,
            Val::U(x) => x,
            Val::F(x) => float_to_int(x, num),
        }
    }

    /// The value as a float64 (integers rounded to nearest, as C casts them).
    fn to_f64(self) -> f64 {
        match self {
            Val::I(x) => x as f64,
            Val::U(x) => x as f64,
            Val::F(x) => x,
        }
    }

    /// Casts the value to `num` as numpy does and writes it to `out` (`num.size()` bytes).
    pub(crate) fn store(self, num: Num, out: &mut [u8]) {
        let mut b = [0u8; 8];
        let bytes: &[u8] = match num {
            Num::F64 => {
                b = self.to_f64().to_ne_bytes();
                &b
            }
            Num::F32 => {
                let x = match self {
                    // Straight from the integer, rounded once.
                    Val::I(x) => x as f32,
                    Val::U(x) => x as f32,
                    Val::F(x) => x as f32,
                };
                b[..4].copy_from_slice(&x.to_ne_bytes());
                &b[..4]
            }
            Num::F16 => {
                b[..2].copy_from_slice(&f16::from_f64(self.to_f64()).to_ne_bytes());
                &b[..2]
            }
            _ => {
                let bits = self.bits(num);
                b = match num.size() {
                    1 => {
                        b[0] = bits as u8;
                        b
                    }
                    2 => {
                        b[..2].copy_from_slice(&(bits as u16).to_ne_bytes());
                        b
                    }
                    4 => {
                        b[..4].copy_from_slice(&(bits as u32).to_ne_bytes());
                        b
                    }
                    _ => bits.to_ne_bytes(),
                };
                &b[..num.size()]
            }
        };
        out.copy_from_slice(bytes);
    }

    /// The value after wrapping (integers) or rounding (floats) into type `num`.
    fn wrap(self, num: Num) -> Val {
        let mut b = [0u8; 8];
        self.store(num, &mut b[..num.size()]);
        Val::load(num, &b[..num.size()])
    }
}

/// numpy's cast of a float to the integer type `num` on x86-64, as 64 bits: the value truncated
/// toward zero where it fits; otherwise what the CPU's conversions give (numpy converts to
/// 8- and 16-bit types through int32, to uint32 through int64, and to uint64 with an int64
/// conversion of the value or of the value less 2^63).
fn float_to_int(x: f64, num: Num) -> u64 {
    const P31: f64 = 2_147_483_648.0;
    const P32: f64 = 4_294_967_296.0;
    const P63: f64 = 9_223_372_036_854_775_808.0;
    const P64: f64 = 18_446_744_073_709_551_616.0;
    let t = x.trunc();
    let within = |lo: f64, hi: f64| t >= lo && t < hi;
    match num {
        Num::I8 | Num::I16 | Num::U8 | Num::U16 | Num::I32 => {
            let v = if within(-P31, P31) {
                t as i32
            } else {
                i32::MIN
            };
            i64::from(v) as u64
        }
        Num::I64 => {
            if within(-P63, P63) {
                t as i64 as u64
            } else {
                i64::MIN as u64
            }
        }
        Num::U32 => {
            if within(0.0, P32) {
                t as u64
            } else if within(-P31, 0.0) {
                u64::from(t as i32 as u32)
            } else if t < 0.0 {
                1 << 31
            } else {
                0
            }
        }
        _ => {
            if within(0.0, P64) {
                t as u64
            } else if within(-P63, 0.0) {
                t as i64 as u64
            } else if t.is_nan() || t < 0.0 {
                1 << 63
            } else {
                0
            }
        }
    }
}

/// Why a chunk does not decode or encode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DeltaError {
    /// A byte count that is not a whole number of elements.
    #[error("{len} bytes are not a whole number of {size}-byte elements")]
    Ragged {
        /// The bytes.
        len: usize,
        /// The element size.
        size: usize,
    },
    /// The output could not be allocated.
    #[error(transparent)]
    Alloc(#[from] DecodeError),
}

/// A buffer for `n` elements of `num`.
fn output(n: usize, num: Num) -> Result<Vec<u8>, DeltaError> {
    let len = n
        .checked_mul(num.size())
        .ok_or(DecodeError::Alloc(usize::MAX))?;
    Ok(zeroed(len)?)
}

/// The number of `num` elements in `bytes`.
fn count(bytes: &[u8], num: Num) -> Result<usize, DeltaError> {
    if bytes.len().is_multiple_of(num.size()) {
        Ok(bytes.len() / num.size())
    } else {
        Err(DeltaError::Ragged {
            len: bytes.len(),
            size: num.size(),
        })
    }
}

/// Running sums of same-type elements of `N` bytes: `add` adds, the first element is copied.
fn cumsum_same<const N: usize>(
    enc: &[u8],
    out: &mut [u8],
    add: impl Fn([u8; N], [u8; N]) -> [u8; N],
) {
    let (src, _) = enc.as_chunks::<N>();
    let (dst, _) = out.as_chunks_mut::<N>();
    let mut acc: Option<[u8; N]> = None;
    for (o, &e) in dst.iter_mut().zip(src) {
        let next = acc.map_or(e, |a| add(a, e));
        *o = next;
        acc = Some(next);
    }
}

/// [`encode`] or [`decode`]: a chunk's elements, `dtype` and `astype`, to the other form.
type Transform = fn(&[u8], Num, Num) -> Result<Vec<u8>, DeltaError>;

/// Decodes a delta-encoded chunk: `enc` holds elements of `astype`, the result elements of
/// `dtype`, both in native byte order.
pub(crate) fn decode(enc: &[u8], dtype: Num, astype: Num) -> Result<Vec<u8>, DeltaError> {
    let n = count(enc, astype)?;
    let mut out = output(n, dtype)?;
    macro_rules! same_int {
        ($t:ty, $n:literal) => {
            cumsum_same::<$n>(enc, &mut out, |a, e| {
                <$t>::from_ne_bytes(a)
                    .wrapping_add(<$t>::from_ne_bytes(e))
                    .to_ne_bytes()
            })
        };
    }
    if dtype == astype {
        match dtype {
            Num::I8 | Num::U8 => same_int!(u8, 1),
            Num::I16 | Num::U16 => same_int!(u16, 2),
            Num::I32 | Num::U32 => same_int!(u32, 4),
            Num::I64 | Num::U64 => same_int!(u64, 8),
            Num::F16 => cumsum_same::<2>(enc, &mut out, |a, e| {
                let sum = f16::from_ne_bytes(a).to_f32() + f16::from_ne_bytes(e).to_f32();
                f16::from_f32(sum).to_ne_bytes()
            }),
            Num::F32 => cumsum_same::<4>(enc, &mut out, |a, e| {
                (f32::from_ne_bytes(a) + f32::from_ne_bytes(e)).to_ne_bytes()
            }),
            Num::F64 => cumsum_same::<8>(enc, &mut out, |a, e| {
                (f64::from_ne_bytes(a) + f64::from_ne_bytes(e)).to_ne_bytes()
            }),
        }
        return Ok(out);
    }
    let (es, ds) = (astype.size(), dtype.size());
    let values = enc.chunks_exact(es).map(|b| Val::load(astype, b));
    let outs = out.chunks_exact_mut(ds);
    match Num::promote(dtype, astype) {
        // Both integers: wrapping sums in 64 bits, cut to `dtype`.
        p if !p.is_float() => {
            let mut acc = 0u64;
            for (v, o) in values.zip(outs) {
                acc = acc.wrapping_add(v.bits(astype));
                Val::U(acc).store(dtype, o);
            }
        }
        Num::F64 => {
            let mut acc: Option<f64> = None;
            for (v, o) in values.zip(outs) {
                let sum = acc.map_or(v.to_f64(), |a| a + v.to_f64());
                acc = Some(sum);
                Val::F(sum).store(dtype, o);
            }
        }
        // float32 and float16 sums come only from types they hold exactly.
        Num::F32 => {
            let mut acc: Option<f32> = None;
            for (v, o) in values.zip(outs) {
                let x = v.to_f64() as f32;
                let sum = acc.map_or(x, |a| a + x);
                acc = Some(sum);
                Val::F(f64::from(sum)).store(dtype, o);
            }
        }
        _ => {
            let mut acc: Option<f16> = None;
            for (v, o) in values.zip(outs) {
                let x = f16::from_f64(v.to_f64());
                let sum = acc.map_or(x, |a| f16::from_f32(a.to_f32() + x.to_f32()));
                acc = Some(sum);
                Val::F(sum.to_f64()).store(dtype, o);
            }
        }
    }
    Ok(out)
}

/// Encodes as numcodecs does: `dec` holds elements of `dtype`, the result elements of
/// `astype`, both in native byte order.
pub(crate) fn encode(dec: &[u8], dtype: Num, astype: Num) -> Result<Vec<u8>, DeltaError> {
    let n = count(dec, dtype)?;
    let mut out = output(n, astype)?;
    let mut prev: Option<Val> = None;
    for (b, o) in dec
        .chunks_exact(dtype.size())
        .zip(out.chunks_exact_mut(astype.size()))
    {
        let x = Val::load(dtype, b);
        let diff = match (prev, x) {
            (None, _) => x,
            (Some(Val::F(p)), Val::F(x)) => match dtype {
                Num::F16 => Val::F(f64::from(f16::from_f32(x as f32 - p as f32).to_f32())),
                Num::F32 => Val::F(f64::from(x as f32 - p as f32)),
                _ => Val::F(x - p),
            },
            (Some(p), x) => Val::U(x.bits(dtype).wrapping_sub(p.bits(dtype))).wrap(dtype),
        };
        diff.store(astype, o);
        prev = Some(x);
    }
    Ok(out)
}

/// The `delta` filter's configuration, as numcodecs writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeltaConfiguration {
    /// The type of the decoded elements (a numpy type string).
    pub(crate) dtype: String,
    /// The type of the encoded elements (`dtype` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) astype: Option<String>,
}

/// The numcodecs `delta` filter.
#[derive(Debug, Clone)]
pub(crate) struct DeltaCodec {
    configuration: DeltaConfiguration,
    dtype: Num,
    astype: Num,
}

zarrs::plugin::impl_extension_aliases!(DeltaCodec, v3: "numcodecs.delta", [], v2: "delta", []);

inventory::submit! {
    CodecPluginV3::new::<DeltaCodec>()
}

inventory::submit! {
    CodecPluginV2::new::<DeltaCodec>()
}

impl DeltaCodec {
    /// The codec for `configuration`, or why it is not supported.
    pub(crate) fn new(configuration: DeltaConfiguration) -> Result<DeltaCodec, String> {
        let (dtype, dorder) = Num::parse(&configuration.dtype)?;
        let (astype, aorder) = match &configuration.astype {
            Some(a) => Num::parse(a)?,
            None => (dtype, dorder),
        };
        let (d, a) = (dorder.resolve(dtype.size()), aorder.resolve(astype.size()));
        if d.is_some() && a.is_some() && d != a {
            return Err(format!(
                "dtype {:?} and astype {:?} have different byte orders",
                configuration.dtype,
                configuration.astype.as_deref().unwrap_or_default()
            ));
        }
        Ok(DeltaCodec {
            configuration,
            dtype,
            astype,
        })
    }

    fn from_configuration(configuration: &Configuration) -> Result<Codec, PluginCreateError> {
        let configuration: DeltaConfiguration = configuration.to_typed()?;
        let codec = DeltaCodec::new(configuration)
            .map_err(|e| PluginCreateError::Other(format!("{NAME}: {e}")))?;
        Ok(Codec::ArrayToArray(Arc::new(codec)))
    }

    /// Checks that the array's elements are as wide as `dtype`.
    fn check(&self, data_type: &DataType) -> Result<(), CodecError> {
        if data_type.fixed_size() == Some(self.dtype.size()) {
            Ok(())
        } else {
            Err(CodecError::Other(format!(
                "{NAME}: dtype {:?} is not as wide as the array's data type {data_type}",
                self.configuration.dtype
            )))
        }
    }

    /// Checks the array's data type, then turns a chunk's elements with `f` (`encode` or
    /// `decode`).
    fn apply<'a>(
        &self,
        bytes: ArrayBytes<'a>,
        data_type: &DataType,
        f: Transform,
    ) -> Result<ArrayBytes<'a>, CodecError> {
        self.check(data_type)?;
        let bytes = bytes.into_fixed()?;
        f(&bytes, self.dtype, self.astype)
            .map(ArrayBytes::from)
            .map_err(|e| CodecError::Other(format!("{NAME}: {e}")))
    }
}

impl CodecTraitsV3 for DeltaCodec {
    fn create(metadata: &MetadataV3) -> Result<Codec, PluginCreateError> {
        Self::from_configuration(&metadata.configuration().cloned().unwrap_or_default())
    }
}

impl CodecTraitsV2 for DeltaCodec {
    fn create(metadata: &MetadataV2) -> Result<Codec, PluginCreateError> {
        Self::from_configuration(metadata.configuration())
    }
}

impl CodecTraits for DeltaCodec {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn configuration(
        &self,
        _version: ZarrVersion,
        _options: &CodecMetadataOptions,
    ) -> Option<Configuration> {
        match serde_json::to_value(&self.configuration) {
            Ok(serde_json::Value::Object(map)) => Some(map.into()),
            _ => None,
        }
    }

    fn partial_decoder_capability(&self) -> PartialDecoderCapability {
        // Every element depends on all the ones before it.
        PartialDecoderCapability {
            partial_read: false,
            partial_decode: false,
        }
    }

    fn partial_encoder_capability(&self) -> PartialEncoderCapability {
        PartialEncoderCapability {
            partial_encode: false,
        }
    }
}

impl ArrayCodecTraits for DeltaCodec {
    fn recommended_concurrency(
        &self,
        _shape: &[NonZeroU64],
        _data_type: &DataType,
    ) -> Result<RecommendedConcurrency, CodecError> {
        Ok(RecommendedConcurrency::new_maximum(1))
    }
}

impl ArrayToArrayCodecTraits for DeltaCodec {
    fn into_dyn(self: Arc<Self>) -> Arc<dyn ArrayToArrayCodecTraits> {
        self
    }

    fn encoded_data_type(&self, decoded_data_type: &DataType) -> Result<DataType, CodecError> {
        self.check(decoded_data_type)?;
        Ok(self.astype.data_type())
    }

    fn encoded_fill_value(
        &self,
        decoded_data_type: &DataType,
        decoded_fill_value: &FillValue,
    ) -> Result<FillValue, CodecError> {
        self.check(decoded_data_type)?;
        // A chunk of one element encodes to the element cast to `astype`.
        let bytes = encode(decoded_fill_value.as_ne_bytes(), self.dtype, self.astype)
            .map_err(|e| CodecError::Other(format!("{NAME}: fill value: {e}")))?;
        Ok(FillValue::new(bytes))
    }

    fn encode<'a>(
        &self,
        bytes: ArrayBytes<'a>,
        _shape: &[NonZeroU64],
        data_type: &DataType,
        _fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<ArrayBytes<'a>, CodecError> {
        self.apply(bytes, data_type, encode)
    }

    fn decode<'a>(
        &self,
        bytes: ArrayBytes<'a>,
        _shape: &[NonZeroU64],
        data_type: &DataType,
        _fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<ArrayBytes<'a>, CodecError> {
        self.apply(bytes, data_type, decode)
    }

    fn partial_decoder(
        self: Arc<Self>,
        input_handle: Arc<dyn ArrayPartialDecoderTraits>,
        shape: &[NonZeroU64],
        data_type: &DataType,
        fill_value: &FillValue,
        _options: &CodecOptions,
    ) -> Result<Arc<dyn ArrayPartialDecoderTraits>, CodecError> {
        self.check(data_type)?;
        Ok(Arc::new(WholeChunk {
            input: input_handle,
            codec: self,
            shape: shape.to_vec(),
            data_type: data_type.clone(),
            fill_value: fill_value.clone(),
        }))
    }
}

/// zarrs' default partial decoder of an array-to-array codec decodes only the elements asked
/// for, which delta cannot: this one decodes the whole chunk and then picks them.
struct WholeChunk {
    input: Arc<dyn ArrayPartialDecoderTraits>,
    codec: Arc<DeltaCodec>,
    shape: Vec<NonZeroU64>,
    data_type: DataType,
    fill_value: FillValue,
}

impl ArrayPartialDecoderTraits for WholeChunk {
    fn data_type(&self) -> &DataType {
        &self.data_type
    }

    fn exists(&self) -> Result<bool, StorageError> {
        self.input.exists()
    }

    fn size_held(&self) -> usize {
        self.input.size_held()
    }

    fn partial_decode(
        &self,
        indexer: &dyn Indexer,
        options: &CodecOptions,
    ) -> Result<ArrayBytes<'_>, CodecError> {
        if !self.input.exists()? {
            // A missing chunk is all fill value (decoding the encoded fill would sum it).
            return ArrayBytes::new_fill_value(&self.data_type, indexer.len(), &self.fill_value)
                .map_err(CodecError::from);
        }
        let shape: Vec<u64> = self.shape.iter().map(|s| s.get()).collect();
        let all = ArraySubset::new_with_shape(shape.clone());
        let encoded = self.input.partial_decode(&all, options)?;
        let decoded = self.codec.decode(
            encoded,
            &self.shape,
            &self.data_type,
            &self.fill_value,
            options,
        )?;
        decoded
            .extract_array_subset(indexer, &shape, &self.data_type)
            .map(ArrayBytes::into_owned)
    }

    fn supports_partial_decode(&self) -> bool {
        false
    }
}

#[cfg(test)]
// The tables are numpy's output, as it prints it.
#[allow(clippy::unreadable_literal)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const ALL: [Num; 11] = [
        Num::I8,
        Num::I16,
        Num::I32,
        Num::I64,
        Num::U8,
        Num::U16,
        Num::U32,
        Num::U64,
        Num::F16,
        Num::F32,
        Num::F64,
    ];

    fn num(s: &str) -> Num {
        Num::parse(s).unwrap().0
    }

    /// Elements of `num` in native order, from values (integers) or bit patterns (floats).
    fn pack(num: Num, values: &[i128]) -> Vec<u8> {
        let mut out = Vec::new();
        for &v in values {
            let bits = v as u64;
            out.extend_from_slice(&match num.size() {
                1 => vec![bits as u8],
                2 => (bits as u16).to_ne_bytes().to_vec(),
                4 => (bits as u32).to_ne_bytes().to_vec(),
                _ => bits.to_ne_bytes().to_vec(),
            });
        }
        out
    }

    #[test]
    fn decodes_as_numpy_cumsum() {
        // numcodecs.Delta(dtype, astype).decode(enc) with numpy 2.3 (floats as bit patterns).
        #[rustfmt::skip]
        let cases: &[(&str, &str, &[i128], &[i128])] = &[
            ("<i4", "<f8", &[0x3ff8000000000000, 0x400599999999999a, 0xc00f333333333333, 0x4202a05f20000000, 0xc202a05f20000000, 0x7ff8000000000000, 0x3fe0000000000000], &[1, 4, 0, -2147483648, 0, -2147483648, -2147483648]),
            ("|u1", "<f4", &[0x43488000, 0x42c88000, 0xc2480000, 0x447a0000, 0xc4fa0000, 0x3f400000], &[200, 44, 250, 226, 19, 20]),
            ("<u8", "<i8", &[-1, 4611686018427387904, 4611686018427387904, 5, -9223372036854775808, 7], &[18446744073709551615, 4611686018427387904, 9223372036854775808, 9223372036854775808, 0, 7]),
            ("<f4", "<f8", &[0x3fb999999999999a, 0x3fc999999999999a, 0x3fd3333333333333, 0x3e112e0be826d695, 0x4170000000000000, 0x3ff0000000000000, 0x3ff0000000000000, 0x8000000000000000], &[0x3dcccccd, 0x3e99999a, 0x3f19999a, 0x3f19999a, 0x4b800000, 0x4b800001, 0x4b800001, 0x4b800001]),
            ("<f2", "<f2", &[0x2e66, 0x3266, 0x34cd, 0x63d0, 0x399a, 0x8000, 0x7bff], &[0x2e66, 0x34cc, 0x38cc, 0x63d1, 0x63d2, 0x63d2, 0x7c00]),
            ("<f2", "|i1", &[100, 100, -50, 127, -128, 3], &[0x5640, 0x5a40, 0x58b0, 0x5c54, 0x58a8, 0x58c0]),
            ("<i2", "|i1", &[100, 2, 2, 2, 127, 127, 127, -128], &[100, 102, 104, 106, 233, 360, 487, 359]),
            ("|i1", "<u2", &[200, 300, 65535, 7], &[-56, -12, -13, -6]),
            ("<f8", "<f4", &[0x3f800000, 0x322bcc77, 0x322bcc77, 0x40600000, 0x80000000], &[0x3ff0000000000000, 0x3ff0000002af31dc, 0x3ff00000055e63b8, 0x40120000015798ee, 0x40120000015798ee]),
            ("<u4", "<f2", &[0x3e00, 0x7bff, 0xc100, 0x3400], &[1, 65505, 65503, 65503]),
            ("<i8", "<u8", &[18446744073709551615, 3, 9223372036854775808], &[-9223372036854775808, -9223372036854775808, -9223372036854775808]),
            ("<f4", "<i4", &[16777216, 1, 1, -3], &[0x4b800000, 0x4b800000, 0x4b800001, 0x4b7fffff]),
        ];
        for &(dtype, astype, enc, dec) in cases {
            let (d, a) = (num(dtype), num(astype));
            assert_eq!(
                decode(&pack(a, enc), d, a),
                Ok(pack(d, dec)),
                "dtype {dtype}, astype {astype}"
            );
        }
        // The example of numcodecs' documentation: Delta(dtype="i2", astype="i1").
        let x: Vec<i128> = (100..120).step_by(2).collect();
        let enc = encode(&pack(Num::I16, &x), Num::I16, Num::I8).unwrap();
        assert_eq!(enc, pack(Num::I8, &[100, 2, 2, 2, 2, 2, 2, 2, 2, 2]));
        assert_eq!(decode(&enc, Num::I16, Num::I8), Ok(pack(Num::I16, &x)));
    }

    #[test]
    fn casts_floats_to_integers_as_numpy() {
        // np.array(values).astype(t) with numpy 2.3 on x86-64.
        #[rustfmt::skip]
        let values = [0.0, -0.9, 2.7, -2.7, 127.9, 128.0, 200.5, 255.9, 256.0, 300.0, -129.0, -300.0, 40000.0, -40000.0, 70000.0, 2147483648.0, -2147483649.0, 3000000000.0, -3000000000.0, 5000000000.0, 9.223372036854776e+18, 9.22337203685478e+18, -9.22337203685478e+18, 1.9e+19, 3e+19, -1.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
        #[rustfmt::skip]
        let want: &[(&str, &[i128])] = &[
            ("i1", &[0, 0, 2, -2, 127, -128, -56, -1, 0, 44, 127, -44, 64, -64, 112, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0]),
            ("i2", &[0, 0, 2, -2, 127, 128, 200, 255, 256, 300, -129, -300, -25536, 25536, 4464, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0]),
            ("i4", &[0, 0, 2, -2, 127, 128, 200, 255, 256, 300, -129, -300, 40000, -40000, 70000, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -2147483648, -1, -2147483648, -2147483648, -2147483648]),
            ("i8", &[0, 0, 2, -2, 127, 128, 200, 255, 256, 300, -129, -300, 40000, -40000, 70000, 2147483648, -2147483649, 3000000000, -3000000000, 5000000000, -9223372036854775808, -9223372036854775808, -9223372036854775808, -9223372036854775808, -9223372036854775808, -1, -9223372036854775808, -9223372036854775808, -9223372036854775808]),
            ("u1", &[0, 0, 2, 254, 127, 128, 200, 255, 0, 44, 127, 212, 64, 192, 112, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 0, 0, 0]),
            ("u2", &[0, 0, 2, 65534, 127, 128, 200, 255, 256, 300, 65407, 65236, 40000, 25536, 4464, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 65535, 0, 0, 0]),
            ("u4", &[0, 0, 2, 4294967294, 127, 128, 200, 255, 256, 300, 4294967167, 4294966996, 40000, 4294927296, 70000, 2147483648, 2147483648, 3000000000, 2147483648, 0, 0, 0, 2147483648, 0, 0, 4294967295, 0, 2147483648, 0]),
            ("u8", &[0, 0, 2, 18446744073709551614, 127, 128, 200, 255, 256, 300, 18446744073709551487, 18446744073709551316, 40000, 18446744073709511616, 70000, 2147483648, 18446744071562067967, 3000000000, 18446744070709551616, 5000000000, 9223372036854775808, 9223372036854779904, 9223372036854775808, 0, 0, 18446744073709551615, 0, 9223372036854775808, 9223372036854775808]),
        ];
        for &(t, want) in want {
            let t = num(t);
            let got: Vec<i128> = values
                .iter()
                .map(|&x| {
                    let mut b = vec![0; t.size()];
                    Val::F(x).store(t, &mut b);
                    match Val::load(t, &b) {
                        Val::I(v) => i128::from(v),
                        Val::U(v) => i128::from(v),
                        Val::F(_) => unreachable!(),
                    }
                })
                .collect();
            assert_eq!(got, want, "{t:?}");
        }
    }

    #[test]
    fn promotes_as_numpy() {
        // np.result_type(a, b) for every pair, row by row.
        #[rustfmt::skip]
        let numpy = "i1 i2 i4 i8 i2 i4 i8 f8 f2 f4 f8 i2 i2 i4 i8 i2 i4 i8 f8 f4 f4 f8 i4 i4 i4 i8 i4 i4 i8 f8 f8 f8 f8 i8 i8 i8 i8 i8 i8 i8 f8 f8 f8 f8 i2 i2 i4 i8 u1 u2 u4 u8 f2 f4 f8 i4 i4 i4 i8 u2 u2 u4 u8 f4 f4 f8 i8 i8 i8 i8 u4 u4 u4 u8 f8 f8 f8 f8 f8 f8 f8 u8 u8 u8 u8 f8 f8 f8 f2 f4 f8 f8 f2 f4 f8 f8 f2 f4 f8 f4 f4 f8 f8 f4 f4 f8 f8 f4 f4 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8 f8";
        let got: Vec<String> = ALL
            .iter()
            .flat_map(|&a| ALL.iter().map(move |&b| Num::promote(a, b)))
            .map(|p| {
                let kind = if p.is_float() {
                    'f'
                } else if p.is_signed() {
                    'i'
                } else {
                    'u'
                };
                format!("{kind}{}", p.size())
            })
            .collect();
        assert_eq!(got.join(" "), numpy);
    }

    #[test]
    fn configurations() {
        let make = |json: &str| DeltaCodec::new(serde_json::from_str(json).unwrap());
        let c = make(r#"{"dtype": "<i4", "astype": "<i2"}"#).unwrap();
        assert_eq!((c.dtype, c.astype), (Num::I32, Num::I16));
        let c = make(r#"{"dtype": "float64"}"#).unwrap();
        assert_eq!((c.dtype, c.astype), (Num::F64, Num::F64));
        assert!(make(r#"{"dtype": ">u2", "astype": "|u1"}"#).is_ok());
        assert!(make(r#"{"dtype": ">u2", "astype": "<i4"}"#).is_err());
        for bad in [
            r#"{"dtype": "|b1"}"#,
            r#"{"dtype": "<c8"}"#,
            r#"{"dtype": "<i4", "astype": "O"}"#,
        ] {
            assert!(make(bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<DeltaConfiguration>(r#"{"dtype": "<i4", "x": 1}"#).is_err());
    }

    #[test]
    fn codec_checks_the_array_and_encodes_its_fill_value() {
        let config = serde_json::from_str(r#"{"dtype": "<f8", "astype": "<f4"}"#).unwrap();
        let c = DeltaCodec::new(config).unwrap();
        let encoded = c.encoded_data_type(&data_type::float64()).unwrap();
        assert_eq!(encoded.name_v3().as_deref(), Some("float32"));
        // dtype's bits in another type of its width, as numpy's view.
        assert!(c.encoded_data_type(&data_type::int64()).is_ok());
        assert!(c.encoded_data_type(&data_type::float32()).is_err());
        let fill = c
            .encoded_fill_value(&data_type::float64(), &FillValue::from(0.1f64))
            .unwrap();
        assert_eq!(fill.as_ne_bytes(), 0.1f32.to_ne_bytes());
    }

    proptest! {
        #[test]
        fn integers_round_trip(
            data in proptest::collection::vec(any::<u8>(), 0..512),
            d in 0usize..8,
            a in 0usize..8,
        ) {
            let (dtype, astype) = (ALL[d], ALL[a]);
            // Round trips are exact where astype holds every difference (as wide or wider)
            // and numpy sums in integers (uint64 with int64 sums in float64).
            prop_assume!(astype.size() >= dtype.size());
            prop_assume!(!Num::promote(dtype, astype).is_float());
            let data = &data[..data.len() / dtype.size() * dtype.size()];
            let enc = encode(data, dtype, astype).unwrap();
            prop_assert_eq!(decode(&enc, dtype, astype), Ok(data.to_vec()));
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(
            data in proptest::collection::vec(any::<u8>(), 0..256),
            d in 0usize..11,
            a in 0usize..11,
        ) {
            let (dtype, astype) = (ALL[d], ALL[a]);
            match decode(&data, dtype, astype) {
                Ok(out) => prop_assert_eq!(out.len(), data.len() / astype.size() * dtype.size()),
                Err(e) => prop_assert!(matches!(e, DeltaError::Ragged { .. }), "{}", e),
            }
            let _ = encode(&data, dtype, astype);
        }

        #[test]
        fn floats_sum_in_order(xs in proptest::collection::vec(-1e6f64..1e6, 1..64)) {
            let enc: Vec<u8> = xs.iter().flat_map(|x| x.to_ne_bytes()).collect();
            let dec = decode(&enc, Num::F64, Num::F64).unwrap();
            let mut acc = xs[0];
            for (i, x) in xs.iter().enumerate().skip(1) {
                acc += x;
                prop_assert_eq!(&dec[i * 8..i * 8 + 8], &acc.to_ne_bytes());
            }
        }
    }
}
