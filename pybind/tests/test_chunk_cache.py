"""``chunk_cache=``: decoded chunks kept per array and served again without reading the store.

Proved by corrupting every chunk file after a first read: a cached array still returns the
right data for the region it read, an uncached one raises, and a region outside what was
cached reads the corrupt bytes and raises too."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest

import zcrop
from conftest import FIXTURES, manifest_entries

ENTRIES = {e["name"]: e for e in manifest_entries()}


def corrupt_chunks(store) -> int:
    """Overwrites every chunk (or shard) file under ``store`` with garbage of its size."""
    n = 0
    for f in store.rglob("*"):
        if f.is_file() and not f.name.startswith(".") and f.name != "zarr.json":
            f.write_bytes(b"\x5a" * f.stat().st_size)
            n += 1
    return n


@pytest.mark.parametrize("name", ["v2_zstd_be_u2", "v3_sharded_end"])
@pytest.mark.parametrize("cache", [1 << 20, "1M", "64KiB"])
def test_cached_chunks_are_served_without_reading_the_store(tmp_path, name, cache):
    entry = ENTRIES[name]
    store = tmp_path / "a.zarr"
    shutil.copytree(FIXTURES / entry["store"], store)
    expected = np.load(FIXTURES / entry["npy"])
    cached = zcrop.open_array(str(store), chunk_cache=cache)
    uncached = zcrop.open_array(str(store))
    region = (slice(0, 16), slice(0, 16))
    np.testing.assert_array_equal(cached[region], expected[region])
    np.testing.assert_array_equal(uncached[region], expected[region])
    assert corrupt_chunks(store) > 0
    # The cached array decodes nothing again for the region it has read...
    np.testing.assert_array_equal(cached[region], expected[region])
    # ... while an array without a cache reads the corrupt bytes, and so does the cached one
    # for chunks it has not seen.
    with pytest.raises(zcrop.ZcropError):
        uncached[region]
    with pytest.raises(zcrop.ZcropError):
        cached[...]


def test_open_async_takes_the_cache(tmp_path):
    entry = ENTRIES["v3_sharded_end"]
    store = tmp_path / "a.zarr"
    shutil.copytree(FIXTURES / entry["store"], store)
    expected = np.load(FIXTURES / entry["npy"])

    async def first_read():
        a = await zcrop.open_async(str(store), chunk_cache="1M")
        return a, await a.getitem(...)

    arr, got = asyncio.run(first_read())
    np.testing.assert_array_equal(got, expected)
    corrupt_chunks(store)
    np.testing.assert_array_equal(asyncio.run(arr.getitem(...)), expected)


def test_bad_cache_budgets_are_refused(tmp_path):
    where = str(FIXTURES / ENTRIES["v3_sharded_end"]["store"])
    for bad, exc in [(-1, ValueError), ("lots", ValueError), (True, TypeError), (1.5, TypeError)]:
        with pytest.raises(exc, match="chunk_cache"):
            zcrop.open_array(where, chunk_cache=bad)
    # None and 0 mean no cache.
    assert zcrop.open_array(where, chunk_cache=None).shape == zcrop.open_array(where, chunk_cache=0).shape
