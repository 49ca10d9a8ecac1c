//! Data types zcrop registers with zarrs as data type plugins, as `codec` registers the
//! numcodecs codecs: zarr-python writes them, zarrs 0.23 does not read them.
//!
//! - `null_terminated_bytes` (v3) and `|S{n}` (v2): numpy's fixed-length byte strings. A
//!   plugin rather than mapping the type onto zarrs' raw bits (`r{8n}`): the metadata stays as
//!   stored (no rewritten name to undo when reporting the dtype), and the fill value is parsed
//!   as zarr-python writes it (base64 text, not the byte list raw bits expect). Elements are
//!   `n` bytes, right-padded with NUL, and have no byte order.
//! - v2 `<M8[unit]` and `<m8[unit]` (`[10s]`: a scale factor): zarrs reads the v3
//!   `numpy.datetime64` and `numpy.timedelta64` types only; the v2 dtype names create them.

use std::any::Any;
use std::borrow::Cow;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::{Arc, LazyLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use zarrs::array::data_type::api::codec_traits::bytes::{
    BytesCodecEndiannessMissingError, BytesDataTypePlugin, BytesDataTypeTraits,
};
use zarrs::array::data_type::api::{
    DataType, DataTypeFillValueError, DataTypeFillValueMetadataError, DataTypePluginV2,
    DataTypePluginV3, DataTypeTraits, DataTypeTraitsV2, DataTypeTraitsV3, FillValue,
};
use zarrs::array::data_type::{NumpyDateTime64DataType, NumpyTimeDelta64DataType, NumpyTimeUnit};
use zarrs::metadata::v2::DataTypeMetadataV2;
use zarrs::metadata::v3::MetadataV3;
use zarrs::metadata::{
    Configuration, ConfigurationSerialize, DataTypeSize, Endianness, FillValueMetadata,
};
use zarrs::plugin::{
    ExtensionAliases, ExtensionAliasesConfig, ExtensionName, PluginCreateError, Regex, ZarrVersion,
    ZarrVersion2, ZarrVersion3,
};

/// The v3 name zarr-python writes.
pub(crate) const NULL_TERMINATED_BYTES: &str = "null_terminated_bytes";

/// Fixed-length byte strings: numpy `|S{n}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NullTerminatedBytes {
    length: NonZeroUsize,
}

/// The v3 configuration: `{"length_bytes": n}`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LengthBytes {
    length_bytes: NonZeroUsize,
}

impl ConfigurationSerialize for LengthBytes {}

impl DataTypeTraitsV3 for NullTerminatedBytes {
    fn create(metadata: &MetadataV3) -> Result<DataType, PluginCreateError> {
        let cfg: LengthBytes = metadata
            .to_typed_configuration()
            .map_err(|e| PluginCreateError::Other(format!("{NULL_TERMINATED_BYTES}: {e}")))?;
        Ok(Arc::new(NullTerminatedBytes {
            length: cfg.length_bytes,
        })
        .into())
    }
}

impl DataTypeTraitsV2 for NullTerminatedBytes {
    fn create(metadata: &DataTypeMetadataV2) -> Result<DataType, PluginCreateError> {
        let DataTypeMetadataV2::Simple(name) = metadata else {
            return Err(PluginCreateError::Other("a structured dtype".into()));
        };
        let length = name
            .strip_prefix("|S")
            .and_then(|n| n.parse::<NonZeroUsize>().ok())
            .ok_or_else(|| PluginCreateError::NameInvalid { name: name.clone() })?;
        Ok(Arc::new(NullTerminatedBytes { length }).into())
    }
}

inventory::submit! {
    DataTypePluginV3::new::<NullTerminatedBytes>()
}

inventory::submit! {
    DataTypePluginV2::new::<NullTerminatedBytes>()
}

static ALIASES_V3: LazyLock<RwLock<ExtensionAliasesConfig>> = LazyLock::new(|| {
    RwLock::new(ExtensionAliasesConfig::new(
        NULL_TERMINATED_BYTES,
        vec![],
        vec![],
    ))
});

static ALIASES_V2: LazyLock<RwLock<ExtensionAliasesConfig>> = LazyLock::new(|| {
    RwLock::new(ExtensionAliasesConfig::new(
        "",
        vec![],
        vec![Regex::new(r"^\|S\d+$").expect("a valid regex")],
    ))
});

impl ExtensionAliases<ZarrVersion3> for NullTerminatedBytes {
    fn aliases() -> RwLockReadGuard<'static, ExtensionAliasesConfig> {
        ALIASES_V3
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn aliases_mut() -> RwLockWriteGuard<'static, ExtensionAliasesConfig> {
        ALIASES_V3
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ExtensionAliases<ZarrVersion2> for NullTerminatedBytes {
    fn aliases() -> RwLockReadGuard<'static, ExtensionAliasesConfig> {
        ALIASES_V2
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn aliases_mut() -> RwLockWriteGuard<'static, ExtensionAliasesConfig> {
        ALIASES_V2
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl ExtensionName for NullTerminatedBytes {
    fn name(&self, version: ZarrVersion) -> Option<Cow<'static, str>> {
        Some(match version {
            ZarrVersion::V3 => Cow::Borrowed(NULL_TERMINATED_BYTES),
            ZarrVersion::V2 => Cow::Owned(format!("|S{}", self.length)),
        })
    }
}

impl DataTypeTraits for NullTerminatedBytes {
    fn configuration(&self, _version: ZarrVersion) -> Configuration {
        Configuration::from(LengthBytes {
            length_bytes: self.length,
        })
    }

    fn size(&self) -> DataTypeSize {
        DataTypeSize::Fixed(self.length.get())
    }

    /// zarr-python writes the fill value as base64 text (`""` for empty); `0` is what zarrs
    /// makes of a v2 `null` fill, which zarr-python reads as empty.
    fn fill_value(
        &self,
        fill_value_metadata: &FillValueMetadata,
        _version: ZarrVersion,
    ) -> Result<FillValue, DataTypeFillValueMetadataError> {
        let mut bytes = match fill_value_metadata {
            FillValueMetadata::String(s) => BASE64_STANDARD
                .decode(s)
                .map_err(|_| DataTypeFillValueMetadataError)?,
            FillValueMetadata::Number(n) if n.as_u64() == Some(0) => Vec::new(),
            _ => return Err(DataTypeFillValueMetadataError),
        };
        if bytes.len() > self.length.get() {
            return Err(DataTypeFillValueMetadataError);
        }
        bytes.resize(self.length.get(), 0);
        Ok(FillValue::new(bytes))
    }

    fn metadata_fill_value(
        &self,
        fill_value: &FillValue,
    ) -> Result<FillValueMetadata, DataTypeFillValueError> {
        let bytes = fill_value.as_ne_bytes();
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        Ok(FillValueMetadata::from(
            BASE64_STANDARD.encode(&bytes[..end]),
        ))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Bytes have no byte order: the `bytes` codec passes them through.
impl BytesDataTypeTraits for NullTerminatedBytes {
    fn encode<'a>(
        &self,
        bytes: Cow<'a, [u8]>,
        _endianness: Option<Endianness>,
    ) -> Result<Cow<'a, [u8]>, BytesCodecEndiannessMissingError> {
        Ok(bytes)
    }

    fn decode<'a>(
        &self,
        bytes: Cow<'a, [u8]>,
        _endianness: Option<Endianness>,
    ) -> Result<Cow<'a, [u8]>, BytesCodecEndiannessMissingError> {
        Ok(bytes)
    }
}

inventory::submit! {
    BytesDataTypePlugin {
        type_id: std::any::TypeId::of::<NullTerminatedBytes>(),
        caster: |any: &dyn Any| -> Option<&dyn BytesDataTypeTraits> {
            any.downcast_ref::<NullTerminatedBytes>().map(|t| t as &dyn BytesDataTypeTraits)
        },
    }
}

/// The v2 dtypes `<M8[unit]`, `<m8[unit]` (either byte order, a scale factor before the
/// unit): a marker that creates zarrs' `numpy.datetime64` and `numpy.timedelta64`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NumpyTimeV2;

static TIME_ALIASES_V2: LazyLock<RwLock<ExtensionAliasesConfig>> = LazyLock::new(|| {
    RwLock::new(ExtensionAliasesConfig::new(
        "",
        vec![],
        vec![Regex::new(r"^[<>|=]?[Mm]8\[\d*[a-zA-Zμ]+\]$").expect("a valid regex")],
    ))
});

impl ExtensionAliases<ZarrVersion2> for NumpyTimeV2 {
    fn aliases() -> RwLockReadGuard<'static, ExtensionAliasesConfig> {
        TIME_ALIASES_V2
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn aliases_mut() -> RwLockWriteGuard<'static, ExtensionAliasesConfig> {
        TIME_ALIASES_V2
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl DataTypeTraitsV2 for NumpyTimeV2 {
    fn create(metadata: &DataTypeMetadataV2) -> Result<DataType, PluginCreateError> {
        let DataTypeMetadataV2::Simple(name) = metadata else {
            return Err(PluginCreateError::Other("a structured dtype".into()));
        };
        let invalid = || PluginCreateError::NameInvalid { name: name.clone() };
        let body = name.trim_start_matches(['<', '>', '|', '=']);
        let (kind, rest) = body.split_at_checked(2).ok_or_else(invalid)?;
        let inner = rest
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .ok_or_else(invalid)?;
        let digits = inner.len() - inner.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let (scale, unit) = inner.split_at(digits);
        let scale = if scale.is_empty() {
            NonZeroU32::MIN
        } else {
            scale.parse().map_err(|_| invalid())?
        };
        let unit: NumpyTimeUnit =
            serde_json::from_value(serde_json::Value::from(unit)).map_err(|_| invalid())?;
        match kind {
            "M8" => Ok(Arc::new(NumpyDateTime64DataType::new(unit, scale)).into()),
            "m8" => Ok(Arc::new(NumpyTimeDelta64DataType::new(unit, scale)).into()),
            _ => Err(invalid()),
        }
    }
}

inventory::submit! {
    DataTypePluginV2::new::<NumpyTimeV2>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(length: usize) -> DataType {
        let md: MetadataV3 = serde_json::from_value(serde_json::json!({
            "name": NULL_TERMINATED_BYTES,
            "configuration": {"length_bytes": length}
        }))
        .unwrap();
        DataType::from_metadata(&md).unwrap()
    }

    #[test]
    fn v3_and_v2_names_create_it() {
        let dt = v3(3);
        assert_eq!(dt.fixed_size(), Some(3));
        assert_eq!(dt.name_v3().as_deref(), Some(NULL_TERMINATED_BYTES));
        let v2 =
            zarrs::convert::data_type_metadata_v2_to_v3(&DataTypeMetadataV2::Simple("|S5".into()))
                .unwrap();
        assert_eq!(v2.name(), NULL_TERMINATED_BYTES);
        assert_eq!(DataType::from_metadata(&v2).unwrap().fixed_size(), Some(5));
    }

    #[test]
    fn v2_time_dtypes_create_zarrs_numpy_time_types() {
        for (v2, name, unit, scale) in [
            ("<M8[ns]", "numpy.datetime64", "ns", 1),
            (">M8[10s]", "numpy.datetime64", "s", 10),
            ("<m8[ms]", "numpy.timedelta64", "ms", 1),
            ("<m8[D]", "numpy.timedelta64", "D", 1),
        ] {
            let md = DataTypeMetadataV2::Simple(v2.into());
            let dt = DataType::from_metadata(&md).unwrap();
            assert_eq!(dt.name_v3().as_deref(), Some(name), "{v2}");
            assert_eq!(dt.fixed_size(), Some(8));
            let cfg = dt.configuration_v3();
            assert_eq!(cfg.get("unit"), Some(&unit.into()), "{v2}");
            assert_eq!(cfg.get("scale_factor"), Some(&scale.into()), "{v2}");
        }
        for bad in ["<M8", "<M8[]", "<M8[0s]", "<M8[xs]", "<M4[s]"] {
            let md = DataTypeMetadataV2::Simple(bad.into());
            assert!(DataType::from_metadata(&md).is_err(), "{bad}");
        }
    }

    #[test]
    fn fill_values_are_base64_padded_with_nul() {
        let dt = v3(3);
        let fill = |m: FillValueMetadata| dt.fill_value_v3(&m).map(|f| f.as_ne_bytes().to_vec());
        assert_eq!(fill("YWI=".into()).unwrap(), b"ab\0");
        assert_eq!(fill("".into()).unwrap(), b"\0\0\0");
        assert_eq!(fill(0.into()).unwrap(), b"\0\0\0");
        assert!(fill("YWJjZA==".into()).is_err(), "4 bytes do not fit in 3");
        assert!(fill("not base64!".into()).is_err());
        assert!(fill(1.into()).is_err());
    }
}
