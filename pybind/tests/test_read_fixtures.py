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
from selections import (
    basic_selection,
    both,
    coordinate_selection,
    mask_selection,
    orthogonal_selection,
    signed,
)

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
    assert len(ENTRIES) == 63


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
