"""``chunk_cache=``: decoded chunks kept per array, served again while their files are
unchanged, never after.

That a cached chunk is served without reading the store is counted in zarr-front's
io_count.rs (the engine's reads); here: the option is taken by every open function, the values
are right, and a cached chunk whose file changed (here: overwritten with garbage) is not served:
the read sees the new bytes, like an array without a cache.
"""

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
    np.testing.assert_array_equal(cached[region], expected[region])
    assert corrupt_chunks(store) > 0
    # Both read the corrupt bytes: the cache serves no chunk of a file that changed.
    with pytest.raises(zcrop.ZcropError):
        uncached[region]
    with pytest.raises(zcrop.ZcropError):
        cached[region]
    # Rewritten as they were: read (and cached) again.
    shutil.rmtree(store)
    shutil.copytree(FIXTURES / entry["store"], store)
    for _ in range(2):
        np.testing.assert_array_equal(cached[region], expected[region])


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
    np.testing.assert_array_equal(asyncio.run(arr.getitem(...)), expected)
    corrupt_chunks(store)
    with pytest.raises(zcrop.ZcropError):
        asyncio.run(arr.getitem(...))

    async def bad_budget():
        await zcrop.open_async(str(store), chunk_cache="lots")

    with pytest.raises(ValueError, match="chunk_cache"):
        asyncio.run(bad_budget())


def test_bad_cache_budgets_are_refused(tmp_path):
    where = str(FIXTURES / ENTRIES["v3_sharded_end"]["store"])
    for bad, exc in [(-1, ValueError), ("lots", ValueError), (True, TypeError), (1.5, TypeError)]:
        with pytest.raises(exc, match="chunk_cache"):
            zcrop.open_array(where, chunk_cache=bad)
    # None and 0 mean no cache.
    assert zcrop.open_array(where, chunk_cache=None).shape == zcrop.open_array(where, chunk_cache=0).shape
