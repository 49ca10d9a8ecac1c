"""The decoded-chunk cache: one per process shared by default, or an array's own
(``chunk_cache=``); chunks served again while their files are unchanged, never after.

That a cached chunk is served without reading the store is counted in zarr-front's
io_count.rs (the engine's reads); here: the option is taken by every open function, the values
are right, and a cached chunk whose file changed (here: overwritten with garbage) is not served:
the read sees the new bytes, like an array without a cache.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys

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
    shared = zcrop.open_array(str(store))
    uncached = zcrop.open_array(str(store), chunk_cache=0)
    region = (slice(0, 16), slice(0, 16))
    for arr in [cached, shared, uncached, cached, shared]:
        np.testing.assert_array_equal(arr[region], expected[region])
    assert corrupt_chunks(store) > 0
    # All read the corrupt bytes: no cache serves a chunk of a file that changed.
    for arr in [uncached, cached, shared]:
        with pytest.raises(zcrop.ZcropError):
            arr[region]
    # Rewritten as they were: read (and cached) again.
    shutil.rmtree(store)
    shutil.copytree(FIXTURES / entry["store"], store)
    for _ in range(2):
        np.testing.assert_array_equal(cached[region], expected[region])
        np.testing.assert_array_equal(shared[region], expected[region])


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
    # None: the process-wide cache; 0: none.
    assert zcrop.open_array(where, chunk_cache=None).shape == zcrop.open_array(where, chunk_cache=0).shape


#: Runs in a fresh process (so the process-wide cache holds only its reads) with the
#: environment a test gives; prints what it saw.
SHARED_SCRIPT = r"""
import gc, json, sys
import numpy as np
import zcrop

store, npy = sys.argv[1], sys.argv[2]
expected = np.load(npy)
seen = {"before": zcrop.chunk_cache_info()}
a = zcrop.open_array(store)
b = zcrop.open_array(store)
region = (slice(0, 16), slice(0, 16))
for arr in (a, a, b):
    assert (arr[region] == expected[region]).all()
del arr
seen["two_arrays"] = zcrop.chunk_cache_info()
del a
gc.collect()
seen["one_array"] = zcrop.chunk_cache_info()
own = zcrop.open_array(store, chunk_cache="1M")
assert (own[region] == expected[region]).all()
seen["own_cache_too"] = zcrop.chunk_cache_info()
del b
gc.collect()
seen["none"] = zcrop.chunk_cache_info()
print(json.dumps(seen))
"""


def _shared_cache_run(cache_env: str | None) -> subprocess.CompletedProcess:
    entry = ENTRIES["v2_zstd_be_u2"]
    env = {k: v for k, v in os.environ.items() if k != "ZCROP_CHUNK_CACHE"}
    if cache_env is not None:
        env["ZCROP_CHUNK_CACHE"] = cache_env
    return subprocess.run(
        [sys.executable, "-c", SHARED_SCRIPT, str(FIXTURES / entry["store"]),
         str(FIXTURES / entry["npy"])],
        env=env, capture_output=True, text=True, timeout=120,
    )


def test_arrays_share_one_process_wide_cache_by_default():
    entry = ENTRIES["v2_zstd_be_u2"]
    # The script's 16 x 16 region is chunk (0, 0), stored, of 16 x 16 uint16.
    assert entry["chunks"] == [16, 16] and entry["dtype"] == ">u2"
    region_chunks, chunk_bytes = 1, 16 * 16 * 2

    run = _shared_cache_run(None)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    budget = 256 << 20
    assert seen["before"] == {"budget": budget, "used": 0}
    # Two opens of one array: each keeps its own entries, in the one budget.
    assert seen["two_arrays"] == {"budget": budget, "used": 2 * region_chunks * chunk_bytes}
    # A dropped array's entries leave with it.
    assert seen["one_array"] == {"budget": budget, "used": region_chunks * chunk_bytes}
    # An array with a cache of its own leaves the shared one alone.
    assert seen["own_cache_too"] == seen["one_array"]
    assert seen["none"] == {"budget": budget, "used": 0}

    run = _shared_cache_run("1M")
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["two_arrays"] == {"budget": 1 << 20, "used": 2 * region_chunks * chunk_bytes}

    run = _shared_cache_run("0")
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert all(v == {"budget": 0, "used": 0} for v in seen.values()), seen


def test_a_bad_process_cache_budget_is_an_error_naming_the_variable():
    run = _shared_cache_run("lots")
    assert run.returncode != 0
    assert "InvalidArgumentError" in run.stderr, run.stderr
    assert 'ZCROP_CHUNK_CACHE="lots"' in run.stderr, run.stderr


LZ4_SCRIPT = r"""
import json, sys
import numpy as np
import zarr
import zcrop

store = sys.argv[1]
expected = zarr.open_array(store, mode="r")[...]
a = zcrop.open_array(store)
used = []
for i in range(300):
    assert (a[...] == expected).all(), i
    used.append(zcrop.chunk_cache_info()["used"])
print(json.dumps(used))
"""


def test_lz4_chunks_enter_the_shared_cache_once_reads_show_it_would_serve_them(tmp_path):
    numcodecs = pytest.importorskip("numcodecs")
    zarr = pytest.importorskip("zarr")
    store = tmp_path / "lz4.zarr"
    data = np.random.default_rng(3).standard_normal((4, 128, 128)).astype("float32")
    arr = zarr.create_array(str(store), shape=data.shape, chunks=(1, 128, 128), dtype="float32",
                            zarr_format=2, compressors=numcodecs.Blosc("lz4", 5, numcodecs.Blosc.SHUFFLE))
    arr[...] = data
    env = {k: v for k, v in os.environ.items() if k != "ZCROP_CHUNK_CACHE"}
    run = subprocess.run([sys.executable, "-c", LZ4_SCRIPT, str(store)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    used = json.loads(run.stdout)
    # Chunks that decode at copy speed stay out until 512 reads of the array's 4 chunks are
    # counted, all of which the cache would have served; then all four go in.
    chunk_bytes = 128 * 128 * 4
    assert used[:100] == [0] * 100
    assert used[-1] == 4 * chunk_bytes
    first = used.index(4 * chunk_bytes)
    assert 125 <= first <= 135, first
    # Served from the cache, values stay right (checked each read in the script); a file that
    # changes is read again.
    a = zcrop.open_array(str(store))
    for _ in range(140):
        np.testing.assert_array_equal(a[...], data)
    assert corrupt_chunks(store) > 0
    with pytest.raises(zcrop.ZcropError):
        a[...]
