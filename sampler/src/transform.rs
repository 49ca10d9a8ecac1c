//! Transforms fused into the stitch: while a decoded chunk is still in cache, its elements are
//! converted (dtype, per-channel normalisation) straight into the batch buffer; when a crop's
//! last element is written, the same thread runs its spectral stage (FFT over chosen axes).
//!
//! ## Output layout
//!
//! A source's batch buffer holds `(batch_size, *crop)` elements in C order, native endian:
//!
//! | transform | element | bytes |
//! |---|---|---|
//! | none ([`OutputType::Native`]) | the array's own type | its size |
//! | [`OutputType::Float32`] / [`OutputType::Float64`] | `f32` / `f64` | 4 / 8 |
//! | [`OutputType::Float16`] / [`OutputType::BFloat16`] | IEEE half / bfloat16 (no FFT) | 2 |
//! | + FFT, [`Spectrum::Complex`] | complex64 / complex128: interleaved `(re, im)` f32 / f64 pairs | 8 / 16 |
//! | + FFT, [`Spectrum::Power`] | `re^2 + im^2` as f32 / f64 | 4 / 8 |
//!
//! The FFT is the full two-sided forward transform over the chosen axes, the same as
//! `numpy.fft.fftn(crop, axes=axes, norm=norm)` of the converted (and normalised) crop; the
//! other axes are untouched.

use rustfft::FftNum;
use rustfft::num_complex::Complex;
use zcrop_zarr::StitchTransform;

use crate::error::{Result, spec_err};
use crate::spectral::{FftNorm, NdFft};

/// The element type a source is delivered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputType {
    /// The array's own data type, bytes as decoded (no conversion).
    #[default]
    Native,
    /// `f32`.
    Float32,
    /// `f64`.
    Float64,
    /// IEEE 754 half precision (`numpy.float16`, `torch.float16`), rounded to nearest.
    Float16,
    /// bfloat16 (`torch.bfloat16`, `ml_dtypes.bfloat16`), rounded to nearest.
    BFloat16,
}

/// What the spectral stage delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spectrum {
    /// The complex spectrum (complex64 for `Float32`, complex128 for `Float64`).
    #[default]
    Complex,
    /// The power spectrum `|X|^2` (real, in the output float type).
    Power,
}

/// Per-channel normalisation `(x - mean[c]) / std[c]`, `c` the index along `axis` of the crop.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalize {
    /// The crop axis holding the channels.
    pub axis: usize,
    /// One mean per channel (the crop's length along `axis`).
    pub mean: Vec<f64>,
    /// One standard deviation per channel (non-zero).
    pub std: Vec<f64>,
}

/// CF decoding of packed or masked values, as xarray decodes them: a stored value equal to one
/// of `fills` becomes NaN, any other `x` becomes `x * scale_factor + add_offset`. Applied
/// before [`Normalize`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decode {
    /// CF `scale_factor` (1 when absent).
    pub scale_factor: f64,
    /// CF `add_offset` (0 when absent).
    pub add_offset: f64,
    /// Stored values that mean "missing" (CF `_FillValue`, `missing_value`), as the stored
    /// type's values widened to `f64`.
    pub fills: Vec<f64>,
}

/// An FFT over chosen axes of each crop.
#[derive(Debug, Clone, PartialEq)]
pub struct Fft {
    /// The crop axes to transform (distinct).
    pub axes: Vec<usize>,
    /// Complex spectrum or power spectrum.
    pub output: Spectrum,
    /// Scaling, as numpy's `norm=`.
    pub norm: FftNorm,
}

/// What to do to a source's crops on their way into the batch buffer. Build it with
/// [`Transform::to_f32`] / [`Transform::to_f64`] and the chaining methods.
///
/// ```
/// use zcrop_sampler::{Spectrum, Transform};
/// // uint16 counts -> float32, normalised per channel (axis 1 of a (t, c, y, x) crop), then
/// // the power spectrum over (y, x).
/// let t = Transform::to_f32()
///     .normalize(1, vec![100.0, 200.0], vec![10.0, 20.0])
///     .fft(vec![2, 3], Spectrum::Power);
/// assert!(t.fft.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Transform {
    /// The delivered element type.
    pub dtype: OutputType,
    /// CF decoding, applied during conversion before normalisation.
    pub decode: Option<Decode>,
    /// Per-channel normalisation, applied during conversion.
    pub normalize: Option<Normalize>,
    /// The spectral stage, applied to each finished crop.
    pub fft: Option<Fft>,
}

impl Transform {
    /// No transform: the array's own bytes.
    pub fn none() -> Self {
        Transform::default()
    }

    /// Convert to `f32`.
    pub fn to_f32() -> Self {
        Transform {
            dtype: OutputType::Float32,
            ..Transform::default()
        }
    }

    /// Convert to `f64`.
    pub fn to_f64() -> Self {
        Transform {
            dtype: OutputType::Float64,
            ..Transform::default()
        }
    }

    /// Convert to `dtype`.
    pub fn to(dtype: OutputType) -> Self {
        Transform {
            dtype,
            ..Transform::default()
        }
    }

    /// Adds per-channel normalisation along crop axis `axis`.
    #[must_use]
    pub fn normalize(mut self, axis: usize, mean: Vec<f64>, std: Vec<f64>) -> Self {
        self.normalize = Some(Normalize { axis, mean, std });
        self
    }

    /// Adds CF decoding: values in `fills` become NaN, others `x * scale_factor + add_offset`.
    #[must_use]
    pub fn decode(mut self, scale_factor: f64, add_offset: f64, fills: Vec<f64>) -> Self {
        self.decode = Some(Decode {
            scale_factor,
            add_offset,
            fills,
        });
        self
    }

    /// Adds an FFT over crop axes `axes` (numpy's default scaling).
    #[must_use]
    pub fn fft(mut self, axes: Vec<usize>, output: Spectrum) -> Self {
        self.fft = Some(Fft {
            axes,
            output,
            norm: FftNorm::Backward,
        });
        self
    }

    /// Sets the FFT's scaling (after [`Transform::fft`]).
    #[must_use]
    pub fn fft_norm(mut self, norm: FftNorm) -> Self {
        if let Some(f) = &mut self.fft {
            f.norm = norm;
        }
        self
    }

    /// The crop axes the transform works along (the normalize axis and the FFT axes).
    pub fn axes(&self) -> Vec<usize> {
        let fft = self.fft.iter().flat_map(|f| f.axes.iter().copied());
        self.normalize.iter().map(|n| n.axis).chain(fft).collect()
    }

    /// Whether this transform leaves the bytes as they are.
    pub fn is_identity(&self) -> bool {
        self.dtype == OutputType::Native
            && self.decode.is_none()
            && self.normalize.is_none()
            && self.fft.is_none()
    }
}

/// The element types a conversion reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
    C64,
    C128,
}

impl InType {
    pub(crate) fn from_name(name: &str) -> Option<InType> {
        Some(match name {
            "bool" => InType::Bool,
            "uint8" => InType::U8,
            "int8" => InType::I8,
            "uint16" => InType::U16,
            "int16" => InType::I16,
            "uint32" => InType::U32,
            "int32" => InType::I32,
            "uint64" => InType::U64,
            "int64" => InType::I64,
            "float16" => InType::F16,
            "float32" => InType::F32,
            "float64" => InType::F64,
            "complex64" => InType::C64,
            "complex128" => InType::C128,
            _ => return None,
        })
    }

    pub(crate) fn is_complex(self) -> bool {
        matches!(self, InType::C64 | InType::C128)
    }
}

/// Calls `f(re, im)` for each element of `src` (native-endian elements of `ty`).
#[inline]
pub(crate) fn for_each_value(ty: InType, src: &[u8], mut f: impl FnMut(f64, f64)) {
    macro_rules! real {
        ($t:ty, $n:expr) => {
            for b in src.chunks_exact($n) {
                let v = <$t>::from_ne_bytes(b.try_into().expect("element bytes"));
                #[allow(clippy::cast_lossless)]
                f(v as f64, 0.0);
            }
        };
    }
    match ty {
        InType::Bool => src
            .iter()
            .for_each(|&b| f(f64::from(u8::from(b != 0)), 0.0)),
        InType::U8 => src.iter().for_each(|&b| f(f64::from(b), 0.0)),
        InType::I8 => src.iter().for_each(|&b| f(f64::from(b as i8), 0.0)),
        InType::U16 => real!(u16, 2),
        InType::I16 => real!(i16, 2),
        InType::U32 => real!(u32, 4),
        InType::I32 => real!(i32, 4),
        InType::U64 => real!(u64, 8),
        InType::I64 => real!(i64, 8),
        InType::F16 => {
            for b in src.chunks_exact(2) {
                f(f64::from(half::f16::from_ne_bytes([b[0], b[1]])), 0.0);
            }
        }
        InType::F32 => real!(f32, 4),
        InType::F64 => real!(f64, 8),
        InType::C64 => {
            for b in src.chunks_exact(8) {
                let re = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                let im = f32::from_ne_bytes([b[4], b[5], b[6], b[7]]);
                f(f64::from(re), f64::from(im));
            }
        }
        InType::C128 => {
            for b in src.chunks_exact(16) {
                let re = f64::from_ne_bytes(b[..8].try_into().expect("8 bytes"));
                let im = f64::from_ne_bytes(b[8..].try_into().expect("8 bytes"));
                f(re, im);
            }
        }
    }
}

/// A float type the transforms write.
pub(crate) trait OutScalar: Copy {
    const SIZE: usize;
    fn of(v: f64) -> Self;
    fn write(self, dst: &mut [u8]);
}

/// An output float type the FFT stage also works in.
pub(crate) trait OutFloat: OutScalar + FftNum {
    fn read(src: &[u8]) -> Self;
}

impl OutScalar for half::f16 {
    const SIZE: usize = 2;
    #[inline]
    fn of(v: f64) -> Self {
        half::f16::from_f64(v)
    }
    #[inline]
    fn write(self, dst: &mut [u8]) {
        dst.copy_from_slice(&self.to_ne_bytes());
    }
}

impl OutScalar for half::bf16 {
    const SIZE: usize = 2;
    #[inline]
    fn of(v: f64) -> Self {
        half::bf16::from_f64(v)
    }
    #[inline]
    fn write(self, dst: &mut [u8]) {
        dst.copy_from_slice(&self.to_ne_bytes());
    }
}

impl OutScalar for f32 {
    const SIZE: usize = 4;
    #[inline]
    fn of(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn write(self, dst: &mut [u8]) {
        dst.copy_from_slice(&self.to_ne_bytes());
    }
}

impl OutFloat for f32 {
    #[inline]
    fn read(src: &[u8]) -> Self {
        f32::from_ne_bytes(src.try_into().expect("4 bytes"))
    }
}

impl OutScalar for f64 {
    const SIZE: usize = 8;
    #[inline]
    fn of(v: f64) -> Self {
        v
    }
    #[inline]
    fn write(self, dst: &mut [u8]) {
        dst.copy_from_slice(&self.to_ne_bytes());
    }
}

impl OutFloat for f64 {
    #[inline]
    fn read(src: &[u8]) -> Self {
        f64::from_ne_bytes(src.try_into().expect("8 bytes"))
    }
}

enum Plans {
    None,
    F32(NdFft<f32>),
    F64(NdFft<f64>),
}

/// A [`Transform`] compiled for one source (its data type and crop shape): the
/// [`StitchTransform`] handed to zarr-front.
pub(crate) struct Fused {
    input: InType,
    dtype: OutputType,
    /// Per channel: `y = x * scale + shift`; one entry (1, 0) without normalisation.
    scale: Vec<f64>,
    shift: Vec<f64>,
    /// Stored values delivered as NaN (CF fill values).
    fills: Vec<f64>,
    axis: Option<usize>,
    /// The conversion writes complex elements (imaginary part 0) for the FFT to work on.
    complex_stage: bool,
    power: bool,
    plans: Plans,
    out_elsize: usize,
    crop_elems: usize,
}

impl Fused {
    /// Compiles `t` for crops of `crop` from an array of v3 data type `data_type`.
    pub(crate) fn new(t: &Transform, data_type: &str, crop: &[u64]) -> Result<Option<Fused>> {
        if t.is_identity() {
            return Ok(None);
        }
        let float = match t.dtype {
            OutputType::Native => {
                return Err(spec_err(
                    "CF decoding, normalisation and FFT need a float output type \
                     (Transform::to_f32 or to_f64)",
                ));
            }
            OutputType::Float32 => 4,
            OutputType::Float64 => 8,
            OutputType::Float16 | OutputType::BFloat16 => {
                if t.fft.is_some() {
                    return Err(spec_err(
                        "an FFT needs a float32 or float64 output type, not a 16-bit one",
                    ));
                }
                2
            }
        };
        let input = InType::from_name(data_type)
            .ok_or_else(|| spec_err(format!("cannot convert data type {data_type}")))?;
        if input.is_complex() {
            return Err(spec_err(format!(
                "cannot convert complex data ({data_type}) to a real float type; use OutputType::Native"
            )));
        }
        let (scale, shift, axis) = match &t.normalize {
            None => (vec![1.0], vec![0.0], None),
            Some(n) => {
                let Some(&len) = crop.get(n.axis) else {
                    return Err(spec_err(format!(
                        "normalisation axis {} outside a {}-d crop",
                        n.axis,
                        crop.len()
                    )));
                };
                if n.mean.len() as u64 != len || n.std.len() as u64 != len {
                    return Err(spec_err(format!(
                        "normalisation along axis {} needs {len} means and stds (the crop's length), got {} and {}",
                        n.axis,
                        n.mean.len(),
                        n.std.len()
                    )));
                }
                if n.std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
                    return Err(spec_err("normalisation stds must be finite and non-zero"));
                }
                let scale: Vec<f64> = n.std.iter().map(|s| 1.0 / s).collect();
                let shift = n.mean.iter().zip(&scale).map(|(m, s)| -m * s).collect();
                (scale, shift, Some(n.axis))
            }
        };
        // Decoding first: ((x * sf + off) * a + b) = x * (sf * a) + (off * a + b).
        let (scale, shift, fills) = match &t.decode {
            None => (scale, shift, Vec::new()),
            Some(d) => {
                if !d.scale_factor.is_finite() || !d.add_offset.is_finite() {
                    return Err(spec_err("scale_factor and add_offset must be finite"));
                }
                let shift = shift
                    .iter()
                    .zip(&scale)
                    .map(|(b, a)| d.add_offset * a + b)
                    .collect();
                let scale = scale.iter().map(|a| d.scale_factor * a).collect();
                (scale, shift, d.fills.clone())
            }
        };
        let crop_elems = crop.iter().product::<u64>() as usize;
        let (plans, complex_stage, power) = match &t.fft {
            None => (Plans::None, false, false),
            Some(f) => {
                let mut seen = vec![false; crop.len()];
                for &a in &f.axes {
                    if a >= crop.len() || std::mem::replace(&mut seen[a], true) {
                        return Err(spec_err(format!(
                            "FFT axes {:?} must be distinct axes of a {}-d crop",
                            f.axes,
                            crop.len()
                        )));
                    }
                }
                if f.axes.is_empty() {
                    return Err(spec_err("an FFT needs at least one axis"));
                }
                let plans = if float == 4 {
                    Plans::F32(NdFft::new(crop, &f.axes, f.norm))
                } else {
                    Plans::F64(NdFft::new(crop, &f.axes, f.norm))
                };
                let power = f.output == Spectrum::Power;
                (plans, !power, power)
            }
        };
        Ok(Some(Fused {
            input,
            dtype: t.dtype,
            scale,
            shift,
            fills,
            axis,
            complex_stage,
            power,
            plans,
            out_elsize: if complex_stage { 2 * float } else { float },
            crop_elems,
        }))
    }

    /// The v3 name of the delivered element type.
    pub(crate) fn output_dtype(&self) -> &'static str {
        match (self.dtype, self.complex_stage) {
            (OutputType::Float64, true) => "complex128",
            (OutputType::Float64, false) => "float64",
            (OutputType::Float16, _) => "float16",
            (OutputType::BFloat16, _) => "bfloat16",
            (_, true) => "complex64",
            (_, false) => "float32",
        }
    }

    fn convert_as<O: OutScalar>(&self, src: &[u8], dst: &mut [u8], c: usize) {
        let (a, b) = (self.scale[c], self.shift[c]);
        let step = if self.complex_stage {
            2 * O::SIZE
        } else {
            O::SIZE
        };
        let mut out = dst.chunks_exact_mut(step);
        let fills = &self.fills[..];
        for_each_value(self.input, src, |x, _| {
            let o = out.next().expect("output matches input");
            let value = if !fills.is_empty() && fills.contains(&x) {
                f64::NAN
            } else {
                x * a + b
            };
            O::of(value).write(&mut o[..O::SIZE]);
            if step > O::SIZE {
                O::of(0.0).write(&mut o[O::SIZE..]);
            }
        });
    }

    fn finish_as<O: OutFloat>(&self, plan: &NdFft<O>, block: &mut [u8]) {
        let mut data: Vec<Complex<O>> = Vec::with_capacity(self.crop_elems);
        if self.power {
            data.extend(
                block
                    .chunks_exact(O::SIZE)
                    .map(|b| Complex::new(O::read(b), O::zero())),
            );
        } else {
            data.extend(
                block
                    .chunks_exact(2 * O::SIZE)
                    .map(|b| Complex::new(O::read(&b[..O::SIZE]), O::read(&b[O::SIZE..]))),
            );
        }
        plan.process(&mut data);
        if self.power {
            for (v, o) in data.iter().zip(block.chunks_exact_mut(O::SIZE)) {
                v.norm_sqr().write(o);
            }
        } else {
            for (v, o) in data.iter().zip(block.chunks_exact_mut(2 * O::SIZE)) {
                v.re.write(&mut o[..O::SIZE]);
                v.im.write(&mut o[O::SIZE..]);
            }
        }
    }
}

impl StitchTransform for Fused {
    fn output_element_size(&self) -> usize {
        self.out_elsize
    }

    fn axis(&self) -> Option<usize> {
        self.axis
    }

    fn convert(&self, src: &[u8], dst: &mut [u8], axis_index: u64, _: usize) {
        let c = if self.axis.is_some() {
            axis_index as usize
        } else {
            0
        };
        match self.dtype {
            OutputType::Float64 => self.convert_as::<f64>(src, dst, c),
            OutputType::Float16 => self.convert_as::<half::f16>(src, dst, c),
            OutputType::BFloat16 => self.convert_as::<half::bf16>(src, dst, c),
            _ => self.convert_as::<f32>(src, dst, c),
        }
    }

    fn finish_block(&self, _request: usize, block: &mut [u8]) -> Result<(), String> {
        match &self.plans {
            Plans::None => {}
            Plans::F32(p) => self.finish_as::<f32>(p, block),
            Plans::F64(p) => self.finish_as::<f64>(p, block),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(f: &Fused, src: &[u8], c: u64) -> Vec<u8> {
        let n = src.len() / 2;
        let mut dst = vec![0u8; n * f.output_element_size()];
        f.convert(src, &mut dst, c, 0);
        dst
    }

    #[test]
    fn sixteen_bit_floats_round_to_nearest_and_refuse_an_fft() {
        let src: Vec<u8> = [0u16, 1, 1000, 40_000]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let expect = |v: f64| (v - 3.0) / 7.0;
        for (dtype, name) in [
            (OutputType::Float16, "float16"),
            (OutputType::BFloat16, "bfloat16"),
        ] {
            let t = Transform::to(dtype).normalize(0, vec![3.0], vec![7.0]);
            let f = Fused::new(&t, "uint16", &[1, 4]).unwrap().unwrap();
            assert_eq!((f.output_dtype(), f.output_element_size()), (name, 2));
            let out = run(&f, &src, 0);
            let got: Vec<u16> = out
                .chunks_exact(2)
                .map(|b| u16::from_ne_bytes([b[0], b[1]]))
                .collect();
            let want: Vec<u16> = [0.0, 1.0, 1000.0, 40_000.0]
                .iter()
                .map(|&v| match dtype {
                    OutputType::Float16 => half::f16::from_f64(expect(v)).to_bits(),
                    _ => half::bf16::from_f64(expect(v)).to_bits(),
                })
                .collect();
            assert_eq!(got, want, "{name}");
            let fft = Transform::to(dtype).fft(vec![1], Spectrum::Power);
            let err = Fused::new(&fft, "uint16", &[1, 4]).err().unwrap();
            assert!(err.to_string().contains("16-bit"), "{err}");
        }
    }

    #[test]
    fn converts_and_normalises_per_channel() {
        let t = Transform::to_f32().normalize(0, vec![1.0, 10.0], vec![2.0, 4.0]);
        let f = Fused::new(&t, "uint16", &[2, 3]).unwrap().unwrap();
        assert_eq!(f.output_dtype(), "float32");
        assert_eq!(f.axis(), Some(0));
        let src: Vec<u8> = [5u16, 7, 9].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let out = run(&f, &src, 1);
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, vec![-1.25, -0.75, -0.25]);
    }

    #[test]
    fn cf_decoding_masks_fills_then_scales_before_normalising() {
        // int16 packed with scale 0.5, offset 10 and fill -1, then normalised per channel.
        let t = Transform::to_f64().decode(0.5, 10.0, vec![-1.0]).normalize(
            0,
            vec![0.0, 10.0],
            vec![1.0, 2.0],
        );
        let f = Fused::new(&t, "int16", &[2, 3]).unwrap().unwrap();
        let src: Vec<u8> = [4i16, -1, 6].iter().flat_map(|v| v.to_ne_bytes()).collect();
        let got: Vec<f64> = run(&f, &src, 1)
            .chunks_exact(8)
            .map(|b| f64::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(
            got[0].to_bits(),
            ((4.0 * 0.5 + 10.0 - 10.0) / 2.0f64).to_bits()
        );
        assert!(got[1].is_nan(), "the fill value is missing data");
        assert_eq!(
            got[2].to_bits(),
            ((6.0 * 0.5 + 10.0 - 10.0) / 2.0f64).to_bits()
        );
        // Without normalisation the arithmetic is xarray's: x * scale_factor + add_offset.
        let t = Transform::to_f64().decode(0.01, 280.0, vec![]);
        let f = Fused::new(&t, "int16", &[3]).unwrap().unwrap();
        let got = f64::from_ne_bytes(run(&f, &7i16.to_ne_bytes(), 0)[..8].try_into().unwrap());
        assert_eq!(got.to_bits(), (7.0f64 * 0.01 + 280.0).to_bits());
        assert!(Fused::new(&Transform::none().decode(1.0, 0.0, vec![]), "int16", &[3]).is_err());
        assert!(
            Fused::new(
                &Transform::to_f32().decode(f64::NAN, 0.0, vec![]),
                "int16",
                &[3]
            )
            .is_err()
        );
    }

    #[test]
    #[allow(clippy::float_cmp)] // exact: every value is representable
    fn every_input_type_converts() {
        let cases: Vec<(&str, Vec<u8>, f64)> = vec![
            ("bool", vec![1], 1.0),
            ("uint8", vec![200], 200.0),
            ("int8", vec![0xff], -1.0),
            ("int16", (-300i16).to_ne_bytes().to_vec(), -300.0),
            ("uint32", 70_000u32.to_ne_bytes().to_vec(), 70_000.0),
            ("int32", (-70_000i32).to_ne_bytes().to_vec(), -70_000.0),
            ("uint64", 1u64.to_ne_bytes().to_vec(), 1.0),
            ("int64", (-5i64).to_ne_bytes().to_vec(), -5.0),
            (
                "float16",
                half::f16::from_f32(0.5).to_ne_bytes().to_vec(),
                0.5,
            ),
            ("float32", 1.5f32.to_ne_bytes().to_vec(), 1.5),
            ("float64", (-2.25f64).to_ne_bytes().to_vec(), -2.25),
        ];
        for (name, bytes, want) in cases {
            let f = Fused::new(&Transform::to_f64(), name, &[1])
                .unwrap()
                .unwrap();
            let mut out = [0u8; 8];
            f.convert(&bytes, &mut out, 0, 0);
            assert_eq!(f64::from_ne_bytes(out), want, "{name}");
        }
    }

    #[test]
    fn invalid_transforms_are_rejected() {
        let native_norm = Transform {
            normalize: Some(Normalize {
                axis: 0,
                mean: vec![0.0],
                std: vec![1.0],
            }),
            ..Transform::default()
        };
        assert!(Fused::new(&native_norm, "uint16", &[1]).is_err());
        let wrong_len = Transform::to_f32().normalize(0, vec![0.0], vec![1.0]);
        assert!(Fused::new(&wrong_len, "uint16", &[2]).is_err());
        let zero_std = Transform::to_f32().normalize(0, vec![0.0], vec![0.0]);
        assert!(Fused::new(&zero_std, "uint16", &[1]).is_err());
        let dup_axes = Transform::to_f32().fft(vec![0, 0], Spectrum::Complex);
        assert!(Fused::new(&dup_axes, "uint16", &[4]).is_err());
        let bad_axis = Transform::to_f32().fft(vec![1], Spectrum::Complex);
        assert!(Fused::new(&bad_axis, "uint16", &[4]).is_err());
        assert!(Fused::new(&Transform::to_f32(), "complex64", &[4]).is_err());
        assert!(
            Fused::new(&Transform::none(), "uint16", &[4])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_fft_stage_matches_the_naive_dft() {
        use crate::spectral::naive_dft;
        let crop = [3u64, 4, 5];
        let vals: Vec<u16> = (0..60).map(|i| ((i * 7919) % 251) as u16).collect();
        let src: Vec<u8> = vals.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let input: Vec<Complex<f64>> = vals
            .iter()
            .map(|&v| Complex::new(f64::from(v), 0.0))
            .collect();
        let want = naive_dft(&input, &[3, 4, 5], &[1, 2]);
        for output in [Spectrum::Complex, Spectrum::Power] {
            for t in [Transform::to_f32(), Transform::to_f64()] {
                let t = t.fft(vec![1, 2], output).fft_norm(FftNorm::Ortho);
                let f = Fused::new(&t, "uint16", &crop).unwrap().unwrap();
                let mut block = run(&f, &src, 0);
                f.finish_block(0, &mut block).unwrap();
                let es = f.output_element_size();
                let scale = 1.0 / 20f64.sqrt();
                let tol = if t.dtype == OutputType::Float32 {
                    1e-4
                } else {
                    1e-10
                };
                for (i, w) in want.iter().enumerate() {
                    let w = w * scale;
                    let el = &block[i * es..(i + 1) * es];
                    let got = match (es, output) {
                        (8, Spectrum::Complex) => Complex::new(
                            f64::from(f32::read(&el[..4])),
                            f64::from(f32::read(&el[4..])),
                        ),
                        (16, _) => Complex::new(f64::read(&el[..8]), f64::read(&el[8..])),
                        (4, _) => Complex::new(f64::from(f32::read(el)), 0.0),
                        (8, Spectrum::Power) => Complex::new(f64::read(el), 0.0),
                        _ => unreachable!(),
                    };
                    let want = if output == Spectrum::Power {
                        Complex::new(w.norm_sqr(), 0.0)
                    } else {
                        w
                    };
                    assert!(
                        (got - want).norm() <= tol * (1.0 + want.norm()),
                        "{output:?} {:?} element {i}: {got} vs {want}",
                        t.dtype
                    );
                }
            }
        }
    }
}
