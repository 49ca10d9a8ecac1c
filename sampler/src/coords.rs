//! Coordinate labels: the values of 1-d coordinate arrays (xarray convention) at a crop's
//! origin, so every sample can say *when* and *where* it is, not only at which index.
//!
//! A source array's dimension names come from its v3 `dimension_names` or, for v2, from the
//! `_ARRAY_DIMENSIONS` attribute that xarray writes. A sibling 1-d array in the same group named
//! like a dimension, with that dimension's length, is its coordinate. Its values are read once,
//! when the sampler is built.

use std::sync::Arc;

use zcrop_zarr::{Array, Node};

use crate::error::{Result, SamplerError};

/// One coordinate value, in the coordinate array's own type (times written by xarray are
/// integers counted in the `units` attribute, e.g. "hours since 1970-01-01").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CoordValue {
    /// A signed integer coordinate.
    Int(i64),
    /// An unsigned integer coordinate.
    UInt(u64),
    /// A floating-point coordinate.
    Float(f64),
    /// A boolean coordinate.
    Bool(bool),
}

impl std::fmt::Display for CoordValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CoordValue::Int(v) => write!(f, "{v}"),
            CoordValue::UInt(v) => write!(f, "{v}"),
            CoordValue::Float(v) => write!(f, "{v}"),
            CoordValue::Bool(v) => write!(f, "{v}"),
        }
    }
}

/// The coordinate labels of one crop along one dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordLabel {
    /// The dimension's (and coordinate array's) name, e.g. `time`.
    pub dim: Arc<str>,
    /// The source dimension's index.
    pub axis: usize,
    /// The coordinate at the crop's first index along `axis`.
    pub first: CoordValue,
    /// The coordinate at the crop's last index along `axis`.
    pub last: CoordValue,
    /// The coordinate array's `units` attribute, if any.
    pub units: Option<Arc<str>>,
}

#[derive(Debug, Clone)]
enum Values {
    Int(Vec<i64>),
    UInt(Vec<u64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
}

impl Values {
    fn len(&self) -> usize {
        match self {
            Values::Int(v) => v.len(),
            Values::UInt(v) => v.len(),
            Values::Float(v) => v.len(),
            Values::Bool(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> CoordValue {
        match self {
            Values::Int(v) => CoordValue::Int(v[i]),
            Values::UInt(v) => CoordValue::UInt(v[i]),
            Values::Float(v) => CoordValue::Float(v[i]),
            Values::Bool(v) => CoordValue::Bool(v[i]),
        }
    }
}

/// A loaded coordinate of one source dimension.
#[derive(Debug, Clone)]
pub(crate) struct Coord {
    axis: usize,
    name: Arc<str>,
    units: Option<Arc<str>>,
    values: Values,
}

impl Coord {
    /// The label of a window whose first and last elements are at `first` and `last`. An
    /// index outside the coordinate (a padded crop) is labelled by extending the spacing of
    /// the two labels nearest to it; a boolean coordinate, or one of a single label, repeats
    /// its end label.
    pub(crate) fn label_of(&self, first: i64, last: i64) -> CoordLabel {
        CoordLabel {
            dim: Arc::clone(&self.name),
            axis: self.axis,
            first: self.value_at(first),
            last: self.value_at(last),
            units: self.units.clone(),
        }
    }

    fn value_at(&self, i: i64) -> CoordValue {
        let len = self.values.len() as i64;
        if (0..len).contains(&i) {
            return self.values.get(i as usize);
        }
        // The end label, and how many steps of the end spacing lie beyond it.
        let (end, next, steps) = if i < 0 {
            (0, 1, -i)
        } else {
            (len - 1, len - 2, i - len + 1)
        };
        let at = self.values.get(end as usize);
        if len < 2 {
            return at;
        }
        let before = self.values.get(next as usize);
        match (at, before) {
            (CoordValue::Int(a), CoordValue::Int(b)) => {
                CoordValue::Int(a.saturating_add((a - b).saturating_mul(steps)))
            }
            (CoordValue::UInt(a), CoordValue::UInt(b)) => {
                let v = i128::from(a) + (i128::from(a) - i128::from(b)) * i128::from(steps);
                u64::try_from(v).map_or_else(
                    |_| CoordValue::Int(i64::try_from(v).unwrap_or(i64::MIN)),
                    CoordValue::UInt,
                )
            }
            (CoordValue::Float(a), CoordValue::Float(b)) => {
                CoordValue::Float(a + (a - b) * steps as f64)
            }
            _ => at,
        }
    }

    pub(crate) fn axis(&self) -> usize {
        self.axis
    }

    /// Reads the 1-d array `coord` as the coordinate of `axis` of `array`, checking its length.
    pub(crate) fn load(array: &Array, axis: usize, name: &str, coord: &Array) -> Result<Coord> {
        let err = |reason: String| SamplerError::Spec {
            reason: format!(
                "coordinate {name:?} of {} (axis {axis}): {reason}",
                array.name()
            ),
        };
        if coord.ndim() != 1 {
            return Err(err(format!("it has {} dimensions, not 1", coord.ndim())));
        }
        let len = array.shape()[axis];
        if coord.shape()[0] != len {
            return Err(err(format!(
                "it has {} values, the dimension has {len}",
                coord.shape()[0]
            )));
        }
        let bytes = coord
            .read_region(&[0], &[len])
            .map_err(|error| SamplerError::Open {
                source_name: format!("coordinate {name:?} of {}", array.name()),
                error,
            })?;
        let ints = |es: usize, f: fn(&[u8]) -> i64| bytes.chunks_exact(es).map(f).collect();
        let uints = |es: usize, f: fn(&[u8]) -> u64| bytes.chunks_exact(es).map(f).collect();
        let values = match coord.data_type().as_str() {
            "bool" => Values::Bool(bytes.iter().map(|&b| b != 0).collect()),
            "int8" => Values::Int(ints(1, |b| i64::from(b[0] as i8))),
            "int16" => Values::Int(ints(2, |b| i64::from(i16::from_ne_bytes([b[0], b[1]])))),
            "int32" => Values::Int(ints(4, |b| {
                i64::from(i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            })),
            "int64" => Values::Int(ints(8, |b| {
                i64::from_ne_bytes(b.try_into().expect("8 bytes"))
            })),
            "uint8" => Values::UInt(uints(1, |b| u64::from(b[0]))),
            "uint16" => Values::UInt(uints(2, |b| u64::from(u16::from_ne_bytes([b[0], b[1]])))),
            "uint32" => Values::UInt(uints(4, |b| {
                u64::from(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            })),
            "uint64" => Values::UInt(uints(8, |b| {
                u64::from_ne_bytes(b.try_into().expect("8 bytes"))
            })),
            "float16" => Values::Float(
                bytes
                    .chunks_exact(2)
                    .map(|b| f64::from(half::f16::from_ne_bytes([b[0], b[1]])))
                    .collect(),
            ),
            "float32" => Values::Float(
                bytes
                    .chunks_exact(4)
                    .map(|b| f64::from(f32::from_ne_bytes([b[0], b[1], b[2], b[3]])))
                    .collect(),
            ),
            "float64" => Values::Float(
                bytes
                    .chunks_exact(8)
                    .map(|b| f64::from_ne_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
            ),
            other => return Err(err(format!("data type {other} is not a label type"))),
        };
        let units = coord
            .attributes()
            .get("units")
            .and_then(|u| u.as_str())
            .map(Arc::from);
        Ok(Coord {
            axis,
            name: Arc::from(name),
            units,
            values,
        })
    }
}

/// The dimension names of `array`: v3 `dimension_names`, else the v2 `_ARRAY_DIMENSIONS`
/// attribute (xarray's convention).
pub(crate) fn dimension_names(array: &Array) -> Option<Vec<Option<String>>> {
    if let Some(names) = array.dimension_names() {
        return Some(names);
    }
    let v = array.attributes().get("_ARRAY_DIMENSIONS")?.as_array()?;
    Some(v.iter().map(|n| n.as_str().map(String::from)).collect())
}

/// Finds and loads the coordinates of `array`: 1-d sibling arrays (in the parent group) named
/// like its dimensions and as long as them. A sibling with the right name but the wrong shape
/// is skipped (it is not a coordinate of this array); one that cannot be read is an error.
pub(crate) fn discover(array: &Array) -> Result<Vec<Coord>> {
    let Some(names) = dimension_names(array) else {
        return Ok(Vec::new());
    };
    // The parent group, opened like the array (the same store: a directory or a bucket).
    let Ok(Some(group)) = array.parent() else {
        return Ok(Vec::new());
    };
    let mut coords = Vec::new();
    for (axis, name) in names.iter().enumerate() {
        let Some(name) = name else { continue };
        let Ok(Node::Array(c)) = group.get(name) else {
            continue;
        };
        if c.dir() == array.dir() || c.ndim() != 1 || c.shape()[0] != array.shape()[axis] {
            continue;
        }
        // Text labels (channel names, station ids) are not numbers a sample carries here;
        // the xarray layer labels those dimensions itself.
        let dt = c.data_type();
        if !(dt == "bool"
            || dt.starts_with("int")
            || dt.starts_with("uint")
            || dt.starts_with("float"))
        {
            continue;
        }
        coords.push(Coord::load(array, axis, name, &c)?);
    }
    Ok(coords)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coord(values: Values) -> Coord {
        Coord {
            axis: 0,
            name: Arc::from("lat"),
            units: None,
            values,
        }
    }

    #[test]
    fn labels_past_the_ends_continue_the_nearest_spacing() {
        let c = coord(Values::Float(vec![10.0, 10.5, 11.0, 12.0]));
        let l = c.label_of(-2, 5);
        assert_eq!(
            (l.first, l.last),
            (CoordValue::Float(9.0), CoordValue::Float(14.0))
        );
        let c = coord(Values::UInt(vec![3, 5, 7]));
        assert_eq!(c.label_of(-1, 4).first, CoordValue::UInt(1));
        assert_eq!(c.label_of(-2, 4).first, CoordValue::Int(-1));
        assert_eq!(c.label_of(-2, 4).last, CoordValue::UInt(11));
        let c = coord(Values::Int(vec![-4, -8]));
        assert_eq!(c.label_of(-1, 3).first, CoordValue::Int(0));
        assert_eq!(c.label_of(-1, 3).last, CoordValue::Int(-16));
        let c = coord(Values::Bool(vec![true, false]));
        assert_eq!(c.label_of(-1, 2).first, CoordValue::Bool(true));
        let c = coord(Values::Float(vec![1.0]));
        assert_eq!(c.label_of(-3, 3).last, CoordValue::Float(1.0));
    }
}
