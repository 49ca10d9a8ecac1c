"""Hypothesis strategies for every kind of zarr-python selection, and the oracle check that
zcrop answers each the way zarr-python does (same values, or the same kind of error)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

from conftest import assert_same


def both(z, a, fn):
    """Runs `fn` on zarr-python's array and zcrop's: both succeed with the same result, or
    both raise the same kind of error."""
    try:
        expected = fn(z)
    except (IndexError, ValueError, TypeError) as e:
        with pytest.raises((IndexError, ValueError, TypeError)) as got:
            fn(a)
        if isinstance(e, IndexError):
            assert isinstance(got.value, IndexError), (e, got.value)
        else:
            assert isinstance(got.value, (ValueError, TypeError)), (e, got.value)
        return
    assert_same(expected, fn(a))


@st.composite
def index_item(draw, n):
    """A basic selection item for a dimension of length n: int (maybe negative or out of
    range), or a slice with maybe-missing, negative or out-of-range bounds and a step >= 1."""
    bound = st.one_of(st.none(), st.integers(-n - 3, n + 3))
    if draw(st.integers(0, 3)) == 0 and n > 0:
        return draw(st.integers(-n - (1 if draw(st.booleans()) else 0), n - 1 + (1 if draw(st.integers(0, 9)) == 0 else 0)))
    step = draw(st.one_of(st.none(), st.integers(1, max(1, n + 1))))
    return slice(draw(bound), draw(bound), step)


@st.composite
def basic_selection(draw, shape):
    items = [draw(index_item(n)) for n in shape]
    # Sometimes fewer items, or an Ellipsis somewhere.
    form = draw(st.integers(0, 3))
    if form == 1 and items:
        items = items[: draw(st.integers(0, len(items)))]
    elif form == 2:
        k = draw(st.integers(0, len(items)))
        drop = draw(st.integers(0, len(items) - k))
        items = items[:k] + [Ellipsis] + items[k + drop :]
    return tuple(items) if draw(st.booleans()) or len(items) != 1 else items[0]


@st.composite
def orthogonal_item(draw, n):
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return draw(index_item(n))
    if kind in (1, 2) and n > 0:
        idx = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=8))
        if kind == 2:
            idx = sorted(set(i % n for i in idx))
        dtype = draw(st.sampled_from(["i8", "i4", "u4", "u8"])) if min(idx) >= 0 else "i8"
        return np.array(idx, dtype=dtype)
    if kind == 3:
        return np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool)
    return slice(draw(st.integers(0, n)), None, draw(st.integers(1, 3)))


@st.composite
def orthogonal_selection(draw, shape):
    return tuple(draw(orthogonal_item(n)) for n in shape)


@st.composite
def coordinate_selection(draw, shape):
    npoints = draw(st.integers(1, 12))
    cols = []
    for n in shape:
        cols.append(np.array(draw(st.lists(st.integers(-n, n - 1), min_size=npoints, max_size=npoints)), dtype="i8"))
    if draw(st.booleans()) and npoints % 2 == 0:
        cols = [c.reshape(2, -1) for c in cols]
    return tuple(cols)


@st.composite
def mask_selection(draw, shape):
    size = int(np.prod(shape))
    mask = np.zeros(size, dtype=bool)
    if size and draw(st.booleans()):
        mask[draw(st.lists(st.integers(0, size - 1), max_size=20))] = True
    elif size:
        mask[:: draw(st.integers(1, size))] = True
    return mask.reshape(shape)


def signed(sel):
    """The same selection with unsigned index arrays as int64: zarr-python 3.1.6 mis-reads
    unsigned index arrays in unordered orthogonal selections (IndexError from numpy inside its
    chunk loop, or wrong dtype errors for uint64), so the oracle gets the same indices signed."""
    return tuple(
        s.astype("i8") if isinstance(s, np.ndarray) and s.dtype.kind == "u" else s for s in sel
    )


def any_selection_kind(z, a, data, kinds=("basic", "orthogonal", "coordinate", "mask", "crops")) -> None:
    """Draws one selection of each kind zarr-python has (basic, orthogonal, coordinate, mask)
    or a batch of crops, and checks that zcrop's array `a` answers it as zarr-python's `z`
    does."""
    kind = data.draw(st.sampled_from(list(kinds)))
    if kind == "basic":
        sel = data.draw(basic_selection(z.shape))
        both(z, a, lambda x: x[sel])
    elif kind == "orthogonal":
        sel = data.draw(orthogonal_selection(z.shape))
        both(z, a, lambda x: x.get_orthogonal_selection(signed(sel) if x is z else sel))
    elif kind == "coordinate":
        sel = data.draw(coordinate_selection(z.shape))
        both(z, a, lambda x: x.vindex[sel])
    elif kind == "mask":
        sel = data.draw(mask_selection(z.shape))
        both(z, a, lambda x: x.get_mask_selection(sel))
    else:
        size = tuple(data.draw(st.integers(1, n)) for n in z.shape)
        origins = [
            [data.draw(st.integers(0, n - s)) for n, s in zip(z.shape, size)] for _ in range(3)
        ]
        got = a.read_crops(origins, size)
        for o, crop in zip(origins, got):
            want = z[tuple(slice(b, b + s) for b, s in zip(o, size))]
            assert np.asarray(crop).tobytes() == np.asarray(want).astype(crop.dtype).tobytes()
