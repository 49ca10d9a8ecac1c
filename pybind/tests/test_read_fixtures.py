"""Every fixture read through zcrop equals what zarr-python reads: metadata, whole arrays, and
random selections of every kind (hypothesis), including which selections are errors."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop
from conftest import FIXTURES, array_path, assert_same, manifest_entries

ENTRIES = manifest_entries()
IDS = [e["name"] for e in ENTRIES]
EXAMPLES = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(params=ENTRIES, ids=IDS, scope="module")
def pair(request):
    """(zarr-python array, zcrop array, manifest entry) for one fixture."""
    path = array_path(request.param)
    return zarr.open_array(path, mode="r"), zcrop.open_array(path), request.param


def test_manifest_covers_every_fixture():
    assert len(ENTRIES) == 53


def test_metadata_matches_zarr_python(pair):
    z, a, entry = pair
    for attr in (
        "shape", "dtype", "chunks", "shards", "ndim", "size", "nbytes", "name", "path",
        "basename", "nchunks", "cdata_shape", "order",
    ):
        assert getattr(a, attr) == getattr(z, attr), attr
    assert a.zarr_format == z.metadata.zarr_format == entry["zarr_format"]
    assert dict(a.attrs) == z.attrs.asdict() == entry["attributes"]
    assert a.attrs.asdict() == z.attrs.asdict()
    # The fill value: same type, same bits (NaN included), or None for a v2 null fill.
    if z.fill_value is None:
        assert a.fill_value is None
    else:
        assert type(a.fill_value) is type(z.fill_value)
        assert np.asarray(a.fill_value).tobytes() == np.asarray(z.fill_value).tobytes()
    assert a.metadata["zarr_format"] == entry["zarr_format"]
    assert a.metadata.to_dict()["shape"] == list(entry["shape"])
    assert len(a) == z.shape[0] if z.ndim else True


def test_whole_array_matches_zarr_python_and_expected_npy(pair):
    z, a, entry = pair
    expected = np.load(FIXTURES / entry["npy"])
    for sel in (Ellipsis, ()):
        assert_same(z[sel], a[sel])
    got = a[...]
    assert np.asarray(got).dtype == expected.dtype
    assert np.asarray(got).tobytes() == expected.tobytes()
    assert np.asarray(a).tobytes() == expected.tobytes()
    if z.ndim:
        assert_same(z[:], a[:])
        assert_same(z.get_basic_selection(), a.get_basic_selection())


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


@given(data=st.data())
@EXAMPLES
def test_random_basic_selections(pair, data):
    z, a, _ = pair
    sel = data.draw(basic_selection(z.shape))
    both(z, a, lambda x: x[sel])
    both(z, a, lambda x: x.get_basic_selection(sel))


@given(data=st.data())
@EXAMPLES
def test_random_orthogonal_selections(pair, data):
    z, a, _ = pair
    if z.ndim == 0:
        return
    sel = data.draw(orthogonal_selection(z.shape))

    def on(fn):
        return lambda x: fn(x, signed(sel) if x is z else sel)

    both(z, a, on(lambda x, s: x.get_orthogonal_selection(s)))
    both(z, a, on(lambda x, s: x.oindex[s]))
    both(z, a, on(lambda x, s: x[s]))


@given(data=st.data())
@EXAMPLES
def test_random_coordinate_selections(pair, data):
    z, a, _ = pair
    if z.ndim == 0 or 0 in z.shape:
        return
    sel = data.draw(coordinate_selection(z.shape))
    both(z, a, lambda x: x.get_coordinate_selection(sel))
    both(z, a, lambda x: x.vindex[sel])
    both(z, a, lambda x: x[sel])


@given(data=st.data())
@EXAMPLES
def test_random_mask_selections(pair, data):
    z, a, _ = pair
    if z.ndim == 0:
        return
    sel = data.draw(mask_selection(z.shape))
    both(z, a, lambda x: x.get_mask_selection(sel))
    both(z, a, lambda x: x.vindex[sel])


@given(data=st.data())
@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_block_selections(pair, data):
    z, a, _ = pair
    if z.ndim == 0:
        return
    sel = tuple(
        data.draw(st.one_of(st.integers(-c, c - 1), st.just(slice(None)), st.just(slice(0, 1))))
        for c in z.cdata_shape
    )
    both(z, a, lambda x: x.get_block_selection(sel))
    both(z, a, lambda x: x.blocks[sel])


def test_out_parameter_fills_the_callers_array(pair):
    z, a, _ = pair
    expected = z[...]
    if z.ndim == 0:
        out = np.empty((), dtype=a.dtype)
        got = a.get_basic_selection((), out=out)
        assert np.asarray(got).tobytes() == np.asarray(expected).tobytes()
        return
    for dtype in {a.dtype, a.dtype.newbyteorder("=")}:
        out = np.empty(z.shape, dtype=dtype)
        assert a.get_basic_selection(Ellipsis, out=out) is out
        assert np.array_equal(out, expected, equal_nan=out.dtype.kind in "fc")
    sel = tuple(np.array([0, s - 1]) for s in z.shape)
    out = np.empty((2,) * z.ndim, dtype=a.dtype)
    assert a.get_orthogonal_selection(sel, out=out) is out
    assert_same(z.get_orthogonal_selection(sel), out)
    out = np.empty(2, dtype=a.dtype)
    assert a.get_coordinate_selection(sel, out=out) is out
    assert_same(z.get_coordinate_selection(sel), out)
