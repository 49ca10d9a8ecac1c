"""The async API: same results as the sync API (one Rust implementation), many reads in flight
at once, an event loop that keeps running during long reads, cancellation, errors."""

from __future__ import annotations

import asyncio
import shutil
import time

import numpy as np
import pytest

import zcrop
from conftest import FIXTURES, array_path, assert_same, manifest_entries
from slowstore import make_slow_array

ENTRIES = manifest_entries()


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_sync_and_async_agree_on_every_fixture(entry):
    path = array_path(entry)
    sync = zcrop.open_array(path)
    rng = np.random.default_rng(len(entry["name"]))

    async def main():
        arr = await zcrop.open_async(path)
        assert isinstance(arr, zcrop.AsyncArray)
        assert (arr.shape, arr.dtype, arr.chunks, arr.shards) == (
            sync.shape, sync.dtype, sync.chunks, sync.shards)
        assert_same(sync[...], await arr.getitem(Ellipsis))
        assert_same(sync.get_basic_selection(()), await arr.get_basic_selection(()))
        if sync.ndim == 0 or 0 in sync.shape:
            return
        sel = tuple(slice(int(rng.integers(0, n)), None, int(rng.integers(1, 3))) for n in sync.shape)
        assert_same(sync[sel], await arr.getitem(sel))
        idx = tuple(rng.integers(0, n, size=3) for n in sync.shape)
        assert_same(sync.oindex[idx], await arr.oindex.getitem(idx))
        assert_same(sync.get_orthogonal_selection(idx), await arr.get_orthogonal_selection(idx))
        assert_same(sync.vindex[idx], await arr.vindex.getitem(idx))
        assert_same(sync.get_coordinate_selection(idx), await arr.get_coordinate_selection(idx))
        mask = rng.random(sync.shape) < 0.3
        assert_same(sync.get_mask_selection(mask), await arr.get_mask_selection(mask))
        shape = [max(1, n // 2) for n in sync.shape]
        origins = np.stack([rng.integers(0, n - s + 1, size=4) for n, s in zip(sync.shape, shape)], axis=1)
        assert_same(sync.read_crops(origins, shape), await arr.read_crops(origins, shape))

    run(main())


def test_many_concurrent_reads():
    path = str(FIXTURES / "data/v3_workload_4d_u2.zarr")
    sync = zcrop.open_array(path)
    rng = np.random.default_rng(7)
    sels = []
    for _ in range(300):
        starts = [int(rng.integers(0, n)) for n in sync.shape]
        sels.append(tuple(slice(s, s + int(rng.integers(1, 40))) for s in starts))

    async def main():
        arr = await zcrop.open_async(path)
        results = await asyncio.gather(*(arr.getitem(s) for s in sels))
        crops = await asyncio.gather(
            *(arr.read_crops([[0, 0, i, i]], (2, 3, 8, 8)) for i in range(50)))
        return results, crops

    results, crops = run(main())
    for sel, got in zip(sels, results):
        assert_same(sync[sel], got)
    for i, got in enumerate(crops):
        assert_same(sync.read_crops([[0, 0, i, i]], (2, 3, 8, 8)), got)


def test_the_event_loop_keeps_running_during_a_long_read(tmp_path):
    path = make_slow_array(tmp_path / "slow.zarr", side=2048, chunk=4)

    async def main():
        arr = await zcrop.open_async(path)
        ticks: list[float] = []
        done = asyncio.Event()

        async def ticker():
            while not done.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        start = time.monotonic()
        # Two long reads in flight at once, plus short ones that finish meanwhile.
        long_reads = asyncio.gather(arr.getitem(Ellipsis), arr.read_crops([[0, 0]], (1024, 2048)))
        short = await asyncio.gather(*(arr.getitem((slice(i, i + 4), slice(0, 4))) for i in range(20)))
        short_done = time.monotonic()
        whole, crop = await long_reads
        elapsed = time.monotonic() - start
        done.set()
        await t
        return ticks, elapsed, short_done - start, whole, crop, short

    ticks, elapsed, short_time, whole, crop, short = run(main())
    assert whole.shape == (2048, 2048) and int(whole.min()) == int(whole.max()) == 7
    assert crop.shape == (1, 1024, 2048) and int(crop.min()) == 7
    assert all(s.shape == (4, 4) for s in short)
    assert short_time < elapsed / 2, (short_time, elapsed)
    gaps = np.diff(ticks)
    # The loop ran all along: ticks every ~10 ms, never a long stall.
    assert len(ticks) >= elapsed / 0.05, (len(ticks), elapsed)
    assert gaps.max() < 0.25, gaps.max()


def test_cancelling_a_task_cancels_its_read(tmp_path):
    path = make_slow_array(tmp_path / "slow.zarr", side=2048, chunk=4)

    async def main():
        arr = await zcrop.open_async(path)
        task = asyncio.create_task(arr.getitem(Ellipsis))
        await asyncio.sleep(0.2)
        task.cancel()
        t = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled_in = time.monotonic() - t
        # The array is still usable.
        small = await arr.getitem((slice(0, 8), slice(0, 8)))
        return cancelled_in, small

    cancelled_in, small = run(main())
    assert cancelled_in < 0.5
    assert int(small.sum()) == 7 * 64


def test_async_errors(tmp_path):
    store = tmp_path / "bad.zarr"
    shutil.copytree(FIXTURES / "data/v2_zstd_be_u2.zarr", store)
    (store / "1.1").write_bytes(b"garbage" * 10)

    async def main():
        with pytest.raises(FileNotFoundError):
            await zcrop.open_async(tmp_path / "missing.zarr")
        arr = await zcrop.open_async(store)
        with pytest.raises(zcrop.CodecError) as e:
            await arr.getitem(Ellipsis)
        assert e.value.key == "1.1"
        with pytest.raises(IndexError):
            await arr.getitem((30, 0))
        with pytest.raises(zcrop.BoundsError):
            await arr.read_crops([[29, 40]], (2, 2))
        # After errors, reads still work.
        assert (await arr.getitem((slice(0, 4), slice(0, 4)))).shape == (4, 4)
        with pytest.raises(FileNotFoundError):
            await zcrop.open_async(FIXTURES / "data/v3_hierarchy.zarr", path="images/nope")
        sub = await zcrop.open_async(FIXTURES / "data/v3_hierarchy.zarr", path="images/raw")
        assert sub.name == "/images/raw"

    run(main())


def test_exit_waits_for_an_async_result_being_delivered(tmp_path):
    """The result of an async read is delivered by a pool thread attached to Python, through
    asyncio's `call_soon_threadsafe`, which can release the GIL inside (here it sleeps, to make
    that certain). The script's `asyncio.run` then returns and the interpreter exits while the
    thread is still attached: it was cut off mid-callback, and when the timing was right
    CPython aborted ("Fatal Python error: PyGILState_Release"). Exit now waits for the delivery
    to end: the callback finishes and the process exits 0."""
    import subprocess
    import sys

    store = FIXTURES / "data" / "v3_workload_4d_u2.zarr"
    script = tmp_path / "s.py"
    script.write_text(
        "import asyncio, sys, time, zcrop\n"
        "schedule = asyncio.BaseEventLoop.call_soon_threadsafe\n"
        "def slow(loop, *args, **kwargs):\n"
        "    handle = schedule(loop, *args, **kwargs)\n"
        "    time.sleep(0.3)\n"
        "    print('delivered', flush=True)\n"
        "    return handle\n"
        "asyncio.BaseEventLoop.call_soon_threadsafe = slow\n"
        "async def main():\n"
        "    await zcrop.open_async(sys.argv[1])\n"
        "asyncio.run(main())\n"
        "print('end of script', flush=True)\n"
    )
    out = subprocess.run([sys.executable, str(script), str(store)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["end of script", "delivered"], out.stdout
