"""read_crops: a batch of crops equals numpy slicing of what zarr-python wrote, for every
fixture, sync and async, with and without out=."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop
from conftest import FIXTURES, array_path, manifest_entries

ENTRIES = [e for e in manifest_entries() if e["shape"] and 0 not in e["shape"]]


@pytest.fixture(params=ENTRIES, ids=[e["name"] for e in ENTRIES], scope="module")
def case(request):
    entry = request.param
    return zcrop.open_array(array_path(entry)), np.load(FIXTURES / entry["npy"])


@pytest.fixture(params=ENTRIES, ids=[e["name"] for e in ENTRIES], scope="module")
def path(request):
    return array_path(request.param)


@st.composite
def crops(draw, shape):
    crop = [draw(st.integers(1, n)) for n in shape]
    n = draw(st.integers(0, 6))
    origins = [[draw(st.integers(0, s - c)) for s, c in zip(shape, crop)] for _ in range(n)]
    return np.array(origins, dtype=np.int64).reshape(n, len(shape)), crop


@given(data=st.data())
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_crops_equal_numpy_slices(case, data):
    arr, expected = case
    origins, crop = data.draw(crops(arr.shape))
    got = arr.read_crops(origins, crop)
    assert got.dtype == expected.dtype
    assert got.shape == (len(origins), *crop)
    want = np.empty((len(origins), *crop), dtype=expected.dtype)  # keeps the byte order
    for i, org in enumerate(origins):
        want[i] = expected[tuple(slice(o, o + c) for o, c in zip(org, crop))]
    assert got.tobytes() == want.tobytes()
    out = np.empty(want.shape, dtype=want.dtype)
    assert arr.read_crops(origins, crop, out=out) is out
    assert out.tobytes() == want.tobytes()


def test_crops_sharing_chunks_and_repeats(case):
    arr, expected = case
    crop = [max(1, n // 3) for n in arr.shape]
    origins = np.array([[0] * arr.ndim, [0] * arr.ndim, [n - c for n, c in zip(arr.shape, crop)]])
    got = arr.read_crops(origins, crop)
    for org, g in zip(origins, got):
        assert g.tobytes() == expected[tuple(slice(o, o + c) for o, c in zip(org, crop))].tobytes()
    # Origins may be any integer dtype.
    assert arr.read_crops(origins.astype(np.uint32), crop).tobytes() == got.tobytes()


def test_async_read_crops_equal_sync(path):
    arr = zcrop.open_array(path)
    crop = [max(1, n // 2) for n in arr.shape]
    origins = [[n - c for n, c in zip(arr.shape, crop)], [0] * arr.ndim]

    async def main():
        a = await zcrop.open_async(path)
        return await a.read_crops(origins, crop)

    got = asyncio.run(main())
    assert got.dtype == arr.dtype
    assert got.tobytes() == arr.read_crops(origins, crop).tobytes()


def test_zero_d_array_has_one_crop():
    arr = zcrop.open_array(FIXTURES / "data/v3_0d_f8.zarr")
    got = arr.read_crops(np.zeros((1, 0), dtype=np.int64), ())
    assert got.shape == (1,)
    assert got[0] == arr[()]


def _slices(expected, origins, crop):
    return np.stack([expected[tuple(slice(o, o + c) for o, c in zip(org, crop))] for org in origins])


def test_large_outputs_are_reused_only_when_numpy_is_done_with_them():
    """Outputs of 1 MiB or more go back to zcrop when their last array goes, and the next
    read of that size reuses them, zeroed and fully rewritten; while any view lives, its memory
    is not reused."""
    entry = next(e for e in ENTRIES if e["name"] == "v3_workload_4d_u2")
    arr, expected = zcrop.open_array(array_path(entry)), np.load(FIXTURES / entry["npy"])
    crop = [2, 3, 40, 50]
    n = (2 << 20) // (np.prod(crop) * 2) + 1  # a little over 2 MiB of crops
    rng = np.random.default_rng(7)
    batches = [np.stack([rng.integers(0, s - c + 1, size=n) for s, c in zip(arr.shape, crop)], axis=1)
               for _ in range(3)]

    from zcrop._zcrop import spare_outputs

    nbytes = n * int(np.prod(crop)) * 2
    first = arr.read_crops(batches[0], crop)
    kept = spare_outputs()
    del first
    # Earlier tests may have left the pool full (four outputs): the oldest then makes room.
    dropped = spare_outputs()
    assert dropped[0] == min(kept[0] + 1, 4), "the dropped output was not kept"
    second = arr.read_crops(batches[1], crop)
    reused = spare_outputs()
    assert reused[0] == dropped[0] - 1, "the kept output was not reused"
    np.testing.assert_array_equal(second, _slices(expected, batches[1], crop))

    view = second[1:]
    del second
    assert spare_outputs() == reused, "memory a live view uses was given back"
    third = arr.read_crops(batches[2], crop)
    np.testing.assert_array_equal(view, _slices(expected, batches[1], crop)[1:])
    np.testing.assert_array_equal(third, _slices(expected, batches[2], crop))
    del view
    assert spare_outputs()[1] >= nbytes


def test_at_most_four_outputs_are_kept():
    from zcrop._zcrop import spare_outputs

    entry = next(e for e in ENTRIES if e["name"] == "v3_workload_4d_u2")
    arr = zcrop.open_array(array_path(entry))
    crop = [2, 3, 40, 50]
    n = (1 << 20) // (np.prod(crop) * 2) + 1
    outs = [arr.read_crops(np.zeros((n + i, 4), dtype=np.int64), crop) for i in range(6)]
    del outs
    count, nbytes = spare_outputs()
    assert 1 <= count <= 4
    assert nbytes <= 1 << 30
