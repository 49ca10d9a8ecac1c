//! Reading arrays of variable-length elements (zarr-python's `string` and `bytes` data types,
//! v2 `|O` arrays with the vlen-utf8 or vlen-bytes codec).
//!
//! Such arrays are mostly coordinates and labels: small, read whole, once. Their chunks are
//! located and read in one submission like any others ([`Array::read_encoded_chunks`]), then
//! decoded whole by zarrs' codec chain, and the elements of the requested box gathered in C
//! order. The fixed-size read paths (regions, crops, selections) refuse them with a typed
//! error naming the array.

use super::Array;
use super::fetch::decode_error;
use crate::error::{Result, ZarrError};

/// What an array's variable-length elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VariableKind {
    /// UTF-8 text (`string`, v2 `|O` with vlen-utf8): checked when read.
    Utf8,
    /// Raw bytes (`bytes`, v2 `|O` with vlen-bytes).
    Bytes,
}

/// Variable-length elements read from an array: element `i` is
/// `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VariableElements {
    /// The elements' bytes, one after the other.
    pub bytes: Vec<u8>,
    /// Where each element starts, and after the last, where it ends: one more than elements.
    pub offsets: Vec<usize>,
}

impl VariableElements {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`'s bytes.
    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.offsets[i]..self.offsets[i + 1]]
    }
}

impl Array {
    /// What the array's elements are, if they have variable length; `None` for fixed-size
    /// elements (numbers, fixed-width strings, times).
    pub fn variable_kind(&self) -> Option<VariableKind> {
        if !self.core.layout.variable {
            None
        } else if self.core.decoder.vlen_bytes() || self.data_type() == "bytes" {
            Some(VariableKind::Bytes)
        } else {
            Some(VariableKind::Utf8)
        }
    }

    /// An error unless the array's elements have a fixed size (what every read path but
    /// [`Array::read_variable`] needs).
    pub(crate) fn fixed_size_elements(&self) -> Result<()> {
        if !self.core.layout.variable {
            return Ok(());
        }
        Err(ZarrError::Unsupported {
            array: self.core.place.name.clone(),
            feature: format!(
                "crops, regions and batched reads of variable-length {} elements (they are \
                 read a box at a time: index the array, or Array::read_variable)",
                self.data_type()
            ),
        })
    }

    /// Decodes the bytes of one chunk (for a sharded array: one innermost chunk) of
    /// variable-length elements: all its elements, C order. Text that is not UTF-8 is an error.
    pub fn decode_variable_chunk(&self, encoded: &[u8]) -> Result<VariableElements> {
        self.decode_variable_at(encoded, "")
    }

    /// [`Array::decode_variable_chunk`] of the chunk at `key` (named in errors).
    fn decode_variable_at(&self, encoded: &[u8], key: &str) -> Result<VariableElements> {
        let kind = self.variable_kind().ok_or_else(|| self.not_variable())?;
        let at = || self.location(key, None);
        let (bytes, offsets) = self
            .core
            .decoder
            .decode_variable(encoded)
            .map_err(|err| decode_error(at(), err))?;
        let elements = VariableElements { bytes, offsets };
        if kind == VariableKind::Utf8
            && let Some(i) =
                (0..elements.len()).find(|&i| std::str::from_utf8(elements.get(i)).is_err())
        {
            return Err(ZarrError::Codec {
                at: at(),
                reason: format!("element {i} of the chunk is not UTF-8 text"),
            });
        }
        Ok(elements)
    }

    /// The error for reading fixed-size elements as variable-length ones.
    fn not_variable(&self) -> ZarrError {
        ZarrError::InvalidArgument(format!(
            "array {:?}: its data type {} has a fixed size, not variable-length elements",
            self.core.place.name,
            self.data_type()
        ))
    }

    /// The variable-length elements of the box at `origin` of `shape`, in C order. Every
    /// chunk the box touches is read (in one submission) and decoded whole; a chunk that is
    /// not stored gives fill values. Text (see [`Array::variable_kind`]) that is not UTF-8 is
    /// an error naming its chunk.
    pub fn read_variable(&self, origin: &[u64], shape: &[u64]) -> Result<VariableElements> {
        if self.variable_kind().is_none() {
            return Err(self.not_variable());
        }
        self.check_dims(origin.len(), "the origin")?;
        self.check_dims(shape.len(), "the shape")?;
        let l = &self.core.layout;
        if let Some(d) = (0..shape.len()).find(|&d| {
            origin[d]
                .checked_add(shape[d])
                .is_none_or(|end| end > l.shape[d])
        }) {
            return Err(ZarrError::OutOfBounds {
                array: self.core.place.name.clone(),
                shape: l.shape.clone(),
                reason: format!(
                    "a box at {origin:?} of shape {shape:?} ends outside dimension {d}"
                ),
            });
        }
        let n = shape.iter().try_fold(1usize, |acc, &s| {
            usize::try_from(s).ok().and_then(|s| acc.checked_mul(s))
        });
        let Some(n) = n else {
            return Err(ZarrError::InvalidArgument(format!(
                "array {:?}: a box of shape {shape:?} has too many elements",
                self.core.place.name
            )));
        };
        if n == 0 {
            return Ok(VariableElements {
                bytes: Vec::new(),
                offsets: vec![0],
            });
        }
        // The leaf chunks the box touches: `first..=last` along each dimension, in C order.
        let leaf = &l.leaf;
        let first: Vec<u64> = origin.iter().zip(leaf).map(|(o, c)| o / c).collect();
        let last: Vec<u64> = (0..shape.len())
            .map(|d| (origin[d] + shape[d] - 1) / leaf[d])
            .collect();
        let span: Vec<u64> = first.iter().zip(&last).map(|(f, l)| l - f + 1).collect();
        let chunks = span
            .iter()
            .try_fold(1usize, |acc, &s| usize::try_from(s).ok()?.checked_mul(acc))
            .unwrap_or(usize::MAX);
        let mut coords = Vec::new();
        coords.try_reserve_exact(chunks).map_err(|_| {
            ZarrError::InvalidArgument(format!(
                "array {:?}: a box of shape {shape:?} touches too many chunks",
                self.core.place.name
            ))
        })?;
        let mut c = first.clone();
        'chunks: loop {
            coords.push(c.clone());
            for d in (0..c.len()).rev() {
                c[d] += 1;
                if c[d] <= last[d] {
                    continue 'chunks;
                }
                c[d] = first[d];
            }
            break;
        }
        let encoded = self.read_encoded_chunks(&coords)?;
        let chunks: Vec<Option<VariableElements>> = coords
            .iter()
            .zip(encoded)
            .map(|(c, e)| {
                e.map(|e| self.decode_variable_at(&e, &self.storage_key(c)))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let fill = self.core.decoder.fill_bytes();
        // Walk the box in C order: the chunk and the element in it of each position.
        let no_memory = |bytes: usize| ZarrError::OutOfMemory {
            what: format!(
                "array {:?}: its variable-length elements",
                self.core.place.name
            ),
            bytes: bytes as u64,
        };
        let mut out = VariableElements::default();
        out.offsets
            .try_reserve_exact(n.saturating_add(1))
            .map_err(|_| no_memory(n.saturating_add(1).saturating_mul(size_of::<usize>())))?;
        out.offsets.push(0);
        let mut idx = vec![0u64; shape.len()];
        for _ in 0..n {
            let (mut chunk, mut within) = (0u64, 0u64);
            for d in 0..shape.len() {
                let g = origin[d] + idx[d];
                chunk = chunk * span[d] + (g / leaf[d] - first[d]);
                within = within * leaf[d] + g % leaf[d];
            }
            let element = match &chunks[chunk as usize] {
                Some(dec) => dec.get(within as usize),
                None => fill,
            };
            out.bytes
                .try_reserve(element.len())
                .map_err(|_| no_memory(out.bytes.len() + element.len()))?;
            out.bytes.extend_from_slice(element);
            out.offsets.push(out.bytes.len());
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Ok(out)
    }
}
