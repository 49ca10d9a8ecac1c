"""Selections, normalised the way zarr-python 3 normalises them.

Each function turns a user selection into what the native reader takes: per dimension a
``(start, len)`` range or a 1-d ``uint64`` array of indices (for basic and orthogonal
selections), or an ``(N, ndim)`` ``uint64`` array of coordinates (for coordinate and mask
selections), plus the shape of the result. The rules (which selections are accepted, how
negative indices wrap, how slices clamp, which errors are raised, the result's shape) follow
``zarr.core.indexing`` of zarr-python 3.1, so code written for zarr-python behaves the same.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from zcrop.errors import BoundsError

#: One dimension of an orthogonal selection, as the native reader takes it.
DimSel = Union[tuple[int, int], "npt.NDArray[np.uint64]"]


@dataclass(frozen=True)
class Orthogonal:
    """A basic or orthogonal selection: one range or index list per dimension."""

    dims: list[DimSel]
    #: The result's shape (integer-indexed dimensions dropped).
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Coordinates:
    """A coordinate (or mask) selection: single elements, read in order."""

    coords: npt.NDArray[np.uint64]
    #: The result's shape (the broadcast shape of the coordinate arrays).
    shape: tuple[int, ...]


# --- predicates (zarr.core.indexing) ----------------------------------------------------------


def is_integer(x: Any) -> bool:
    """An integer (Python or numpy), but not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def is_bool(x: Any) -> bool:
    return type(x) in (bool, np.bool_)


def is_integer_list(x: Any) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(is_integer(i) for i in x)


def is_bool_list(x: Any) -> bool:
    return isinstance(x, list) and len(x) > 0 and all(is_bool(i) for i in x)


def is_integer_array(x: Any, ndim: int | None = None) -> bool:
    t = (
        not np.isscalar(x)
        and hasattr(x, "shape")
        and hasattr(x, "dtype")
        and x.dtype.kind in "ui"
    )
    if ndim is not None:
        t = t and len(x.shape) == ndim
    return bool(t)


def is_bool_array(x: Any, ndim: int | None = None) -> bool:
    t = hasattr(x, "shape") and hasattr(x, "dtype") and x.dtype == bool
    if ndim is not None:
        t = t and len(x.shape) == ndim
    return bool(t)


def _is_int_or_bool_iterable(x: Any) -> bool:
    return is_integer_list(x) or is_integer_array(x) or is_bool_array(x) or is_bool_list(x)


def is_pure_fancy_indexing(selection: Any, ndim: int) -> bool:
    """Only integers and integer arrays (or one mask): ``arr[sel]`` means ``arr.vindex[sel]``."""
    if is_bool_array(selection):
        return True
    if ndim == 1 and (
        is_integer_list(selection) or is_integer_array(selection) or is_bool_list(selection)
    ):
        return True
    no_slicing = (
        isinstance(selection, tuple)
        and len(selection) == ndim
        and not any(isinstance(e, slice) or e is Ellipsis for e in selection)
    )
    return (
        no_slicing
        and all(is_integer(e) or is_integer_list(e) or is_integer_array(e) for e in selection)
        and any(is_integer_list(e) or is_integer_array(e) for e in selection)
    )


def is_pure_orthogonal_indexing(selection: Any, ndim: int) -> bool:
    """``arr[sel]`` means ``arr.oindex[sel]``."""
    if not ndim:
        return False
    sel = selection if isinstance(selection, tuple) else (selection,)
    if len(sel) == ndim and all(_is_int_or_bool_iterable(s) for s in sel):
        return True
    return (
        len(sel) <= ndim
        and sum(_is_int_or_bool_iterable(s) for s in sel) <= 1
        and all(_is_int_or_bool_iterable(s) or isinstance(s, int | slice) for s in sel)
    )


# --- normalisation ----------------------------------------------------------------------------


def ensure_tuple(v: Any) -> tuple[Any, ...]:
    return v if isinstance(v, tuple) else (v,)


def replace_lists(selection: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(np.asarray(s) if isinstance(s, list) else s for s in selection)


def pop_fields(selection: Any) -> Any:
    """Rejects field names (zcrop reads no structured dtypes), returns the selection."""
    if isinstance(selection, str) or (
        isinstance(selection, tuple) and any(isinstance(s, str) for s in selection)
    ):
        raise IndexError("invalid 'fields' argument, array does not have any fields")
    return selection


def replace_ellipsis(selection: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """Expands ``...`` and pads with full slices; too many indices is an IndexError."""
    selection = ensure_tuple(selection)
    n_ellipsis = sum(1 for i in selection if i is Ellipsis)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_ellipsis == 1:
        n_left = next(i for i, s in enumerate(selection) if s is Ellipsis)
        n_right = len(selection) - (n_left + 1)
        n_items = len(selection) - 1
        if n_items >= len(shape):
            selection = tuple(i for i in selection if i is not Ellipsis)
        else:
            new = selection[:n_left] + (slice(None),) * (len(shape) - n_items)
            if n_right:
                new += selection[-n_right:]
            selection = new
    if len(selection) < len(shape):
        selection += (slice(None),) * (len(shape) - len(selection))
    if len(selection) > len(shape):
        raise IndexError(
            f"too many indices for array; expected {len(shape)}, got {len(selection)}"
        )
    return tuple(selection)


def _bounds_error(dim_len: int) -> BoundsError:
    return BoundsError(f"index out of bounds for dimension with length {dim_len}")


def _integer(sel: Any, dim_len: int) -> int:
    i = int(sel)
    if i < 0:
        i += dim_len
    if i >= dim_len or i < 0:
        raise _bounds_error(dim_len)
    return i


def _slice(sel: slice, dim_len: int) -> tuple[DimSel, int]:
    start, stop, step = sel.indices(dim_len)
    if step < 1:
        raise IndexError("only slices with step >= 1 are supported.")
    n = max(0, -(-(stop - start) // step))
    if step == 1 or n <= 1:
        return (start, n), n
    return np.arange(start, start + n * step, step, dtype=np.uint64), n


def _points(points: npt.NDArray[Any], dim_len: int) -> DimSel:
    """Wraps negative indices, checks bounds; an ascending run becomes a range."""
    p = np.asarray(points)
    if p.dtype.kind == "i":
        p = np.where(p < 0, p + dim_len, p)
        if p.size and (p.min() < 0 or p.max() >= dim_len):
            raise _bounds_error(dim_len)
    elif p.size and p.max() >= dim_len:
        raise _bounds_error(dim_len)
    p = p.astype(np.uint64, copy=False)
    n = p.size
    if n and int(p[-1]) - int(p[0]) == n - 1 and (n == 1 or bool(np.all(np.diff(p) == 1))):
        return (int(p[0]), n)
    return np.ascontiguousarray(p)


def basic(selection: Any, shape: tuple[int, ...]) -> Orthogonal:
    """A basic selection: integers, slices with positive steps, one ``...``."""
    sel = replace_ellipsis(selection, shape)
    dims: list[DimSel] = []
    out: list[int] = []
    for s, n in zip(sel, shape):
        if is_integer(s):
            dims.append((_integer(s, n), 1))
        elif isinstance(s, slice):
            d, count = _slice(s, n)
            dims.append(d)
            out.append(count)
        else:
            raise IndexError(
                "unsupported selection item for basic indexing; "
                f"expected integer or slice, got {type(s)!r}"
            )
    return Orthogonal(dims, tuple(out))


def orthogonal(selection: Any, shape: tuple[int, ...]) -> Orthogonal:
    """An orthogonal selection: per dimension an integer, a slice, an integer array or a
    Boolean mask (``numpy.ix_`` semantics)."""
    sel = replace_lists(replace_ellipsis(selection, shape))
    dims: list[DimSel] = []
    out: list[int] = []
    for s, n in zip(sel, shape):
        if is_integer(s):
            dims.append((_integer(s, n), 1))
            continue
        if isinstance(s, slice):
            d, count = _slice(s, n)
        elif is_integer_array(s):
            if s.ndim != 1:
                raise IndexError(
                    "integer arrays in an orthogonal selection must be 1-dimensional only"
                )
            d, count = _points(s, n), len(s)
        elif is_bool_array(s):
            if s.ndim != 1:
                raise IndexError(
                    "Boolean arrays in an orthogonal selection must be 1-dimensional only"
                )
            if s.shape[0] != n:
                raise IndexError(
                    "Boolean array has the wrong length for dimension; "
                    f"expected {n}, got {s.shape[0]}"
                )
            idx = np.flatnonzero(s)
            d, count = _points(idx, n), len(idx)
        else:
            raise IndexError(
                "unsupported selection item for orthogonal indexing; "
                "expected integer, slice, integer array or Boolean "
                f"array, got {type(s)!r}"
            )
        dims.append(d)
        out.append(count)
    return Orthogonal(dims, tuple(out))


def _is_coordinate_selection(selection: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    return len(selection) == len(shape) and all(
        is_integer(s) or is_integer_array(s) for s in selection
    )


def _is_mask_selection(selection: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    return (
        len(selection) == 1 and is_bool_array(selection[0]) and selection[0].shape == shape
    )


def coordinate(selection: Any, shape: tuple[int, ...]) -> Coordinates:
    """A coordinate selection: one integer array per dimension, broadcast together."""
    sel = ensure_tuple(selection)
    sel = tuple(np.asarray([i]) if is_integer(i) else i for i in sel)
    sel = replace_lists(sel)
    if not _is_coordinate_selection(sel, shape):
        raise IndexError(
            "invalid coordinate selection; expected one integer "
            "(coordinate) array per dimension of the target array, "
            f"got {selection!r}"
        )
    wrapped = []
    for s, n in zip(sel, shape):
        a = np.asarray(s)
        if a.dtype.kind == "i":
            a = np.where(a < 0, a + n, a)
            if a.size and (a.min() < 0 or a.max() >= n):
                raise _bounds_error(n)
        elif a.size and a.max() >= n:
            raise _bounds_error(n)
        wrapped.append(a)
    arrays = np.broadcast_arrays(*wrapped)  # a ValueError if they do not, like zarr-python
    out_shape = arrays[0].shape if arrays else ()
    coords = np.empty((int(np.prod(out_shape, dtype=np.int64)), len(shape)), dtype=np.uint64)
    for d, a in enumerate(arrays):
        coords[:, d] = a.reshape(-1)
    return Coordinates(coords, out_shape or (1,))


def mask(selection: Any, shape: tuple[int, ...]) -> Coordinates:
    """A mask selection: a Boolean array of the array's shape; the result is 1-d."""
    sel = replace_lists(ensure_tuple(selection))
    if not _is_mask_selection(sel, shape):
        raise IndexError(
            "invalid mask selection; expected one Boolean (mask)"
            f"array with the same shape as the target array, got {sel!r}"
        )
    coords = np.argwhere(sel[0]).astype(np.uint64)
    return Coordinates(coords.reshape(-1, len(shape)), (coords.shape[0],))


def vindex(selection: Any, shape: tuple[int, ...]) -> Coordinates:
    """``arr.vindex[sel]``: a coordinate or a mask selection."""
    sel = replace_lists(ensure_tuple(pop_fields(selection)))
    if _is_coordinate_selection(sel, shape):
        return coordinate(sel, shape)
    if _is_mask_selection(sel, shape):
        return mask(sel, shape)
    raise IndexError(
        "unsupported selection type for vectorized indexing; only "
        "coordinate selection (tuple of integer arrays) and mask selection "
        f"(single Boolean array) are supported; got {sel!r}"
    )


def crop_origins(origins: Any, ndim: int) -> npt.NDArray[np.uint64]:
    """``read_crops`` origins as an ``(N, ndim)`` ``uint64`` array."""
    o = np.asarray(origins)
    if o.size == 0 and ndim > 0:
        o = o.reshape(0, ndim)
    if ndim == 0 and o.size == 0:
        o = o.reshape(1, 0)
    if o.dtype.kind not in "ui" and not (o.size == 0 and o.dtype.kind == "f"):
        raise TypeError(f"crop origins must be integers, got dtype {o.dtype}")
    if o.ndim == 1 and ndim > 0 and o.shape[0] == ndim:
        raise ValueError(
            f"origins must be an (N, {ndim}) array; for one crop, pass [[...]] (got shape "
            f"{o.shape})"
        )
    if o.ndim != 2 or o.shape[1] != ndim:
        raise ValueError(f"origins must be an (N, {ndim}) array, got shape {o.shape}")
    if o.dtype.kind == "i" and o.size and o.min() < 0:
        raise BoundsError("crop origins must not be negative")
    return np.ascontiguousarray(o, dtype=np.uint64)
