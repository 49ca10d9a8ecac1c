"""Large unsharded blosc chunks read from an object store fetch only the blocks a read needs
(their header first): windows of arrays that zarr-python wrote with blosc's inner codecs,
shuffles, item sizes and block sizes, on moto's server, equal zarr-python's reads of the local
copy, with this on and off."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop

BUCKET = "zcrop-blosc-blocks"
#: (name, dtype, chunk shape, zarr format, compressor): chunks of 1 MiB and more (smaller
#: ones are fetched whole), by blosc's inner codecs, shuffles, item sizes and block sizes.
CASES = [
    ("v2-lz4-f4", "<f4", (1, 400, 720), 2, dict(cname="lz4", clevel=5, shuffle=1)),
    ("v2-zstd-bit-u2", "<u2", (2, 400, 720), 2, dict(cname="zstd", clevel=3, shuffle=2)),
    ("v2-blosclz-f8-small-blocks", "<f8", (1, 400, 720), 2,
     dict(cname="blosclz", clevel=5, shuffle=1, blocksize=1 << 15)),
    ("v2-lz4hc-noshuffle-i4", "<i4", (1, 400, 720), 2, dict(cname="lz4hc", clevel=5, shuffle=0)),
    ("v3-lz4-f4", "float32", (1, 400, 720), 3, dict(cname="lz4", clevel=5, shuffle="shuffle")),
]
SHAPE = (5, 400, 720)


def field(dtype: str, seed: int) -> np.ndarray:
    """A smooth global field with noise, and a band of constant values (whose blocks shrink)."""
    rng = np.random.default_rng(seed)
    t, y, x = np.meshgrid(*(np.arange(n) for n in SHAPE), indexing="ij")
    v = 250 + 30 * np.sin(y / 40.0 + t) * np.cos(x / 70.0) + rng.normal(0, 0.5, SHAPE)
    v[:, 100:140] = 0
    if np.dtype(dtype).kind in "iu":
        v = v * 100
    return v.astype(dtype)


def write(path: pathlib.Path, dtype: str, chunks, fmt: int, comp: dict, data: np.ndarray):
    if fmt == 2:
        from numcodecs import Blosc

        arr = zarr.create_array(str(path), shape=SHAPE, dtype=dtype, chunks=chunks,
                                compressors=Blosc(**comp), zarr_format=2)
    else:
        from zarr.codecs import BloscCodec

        arr = zarr.create_array(str(path), shape=SHAPE, dtype=dtype, chunks=chunks,
                                compressors=BloscCodec(**comp, typesize=np.dtype(dtype).itemsize))
    arr[...] = data


@pytest.fixture(scope="module")
def stores(s3, tmp_path_factory):
    """Every case written locally by zarr-python and uploaded; (local path, url) per name."""
    root = tmp_path_factory.mktemp("blosc-blocks")
    out = {}
    for i, (name, dtype, chunks, fmt, comp) in enumerate(CASES):
        path = root / f"{name}.zarr"
        write(path, dtype, chunks, fmt, comp, field(dtype, i))
        s3.upload_tree(BUCKET, path, f"{name}.zarr")
        out[name] = (path, f"s3://{BUCKET}/{name}.zarr")
    return out


def windows(data) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Up to 6 random windows of one shape: (origins, shape)."""
    shape = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 90)), data.draw(st.integers(1, 200)))
    n = data.draw(st.integers(1, 6))
    origins = np.array([[data.draw(st.integers(0, s - c)) for s, c in zip(SHAPE, shape)] for _ in range(n)])
    return origins, shape


@pytest.mark.parametrize("name", [c[0] for c in CASES])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_windows_equal_zarr_python(stores, s3, name, data):
    # Always by block where that saves half a chunk (by default only where it pays for the
    # round trip, which a lone read on loopback rarely does).
    os.environ["ZCROP_BLOSC_BLOCK_FETCH"] = "always"
    path, url = stores[name]
    expected_array = zarr.open_array(str(path), mode="r")
    origins, shape = windows(data)
    expected = np.stack([expected_array[tuple(slice(o, o + c) for o, c in zip(org, shape))] for org in origins])
    try:
        got = zcrop.open_array(url, storage_options=s3.options).read_crops(origins, shape)
    finally:
        del os.environ["ZCROP_BLOSC_BLOCK_FETCH"]
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("mode", ["always", "never", "auto"])
def test_every_mode_reads_the_same(stores, s3, monkeypatch, mode):
    """ZCROP_BLOSC_BLOCK_FETCH=always|never|auto (zarr-front's s3 tests count the bytes each
    way fetches); the values are the same."""
    path, url = stores["v2-zstd-bit-u2"]
    origins, shape = np.array([[0, 10, 20], [3, 200, 600]]), (2, 64, 64)
    monkeypatch.setenv("ZCROP_BLOSC_BLOCK_FETCH", mode)
    got = zcrop.open_array(url, storage_options=s3.options).read_crops(origins, shape)
    expected = zarr.open_array(str(path), mode="r")
    np.testing.assert_array_equal(got[0], expected[0:2, 10:74, 20:84])
    np.testing.assert_array_equal(got[1], expected[3:5, 200:264, 600:664])


def test_a_bad_setting_is_an_error(stores, s3, monkeypatch):
    monkeypatch.setenv("ZCROP_BLOSC_BLOCK_FETCH", "sometimes")
    with pytest.raises(zcrop.InvalidArgumentError, match="ZCROP_BLOSC_BLOCK_FETCH"):
        zcrop.open_array(stores["v2-lz4-f4"][1], storage_options=s3.options)
