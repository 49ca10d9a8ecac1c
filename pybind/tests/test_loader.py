"""zcrop.Loader: crops equal the array, batches are deterministic and independent of prefetch
and threads, resume is exact, ranks are disjoint, transforms match numpy, buffers behave."""

from __future__ import annotations

import gc
import shutil

import numpy as np
import pytest
import zarr

import zcrop
from conftest import FIXTURES, FileServer

WORKLOAD = str(FIXTURES / "data/v3_workload_4d_u2.zarr")  # (6, 3, 70, 90) uint16
CROP = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def data():
    return zarr.open_array(WORKLOAD, mode="r")[...]


def loader(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("seed", 11)
    kw.setdefault("steps", 6)
    return zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img"), **kw)


def crop_at(data, origin, shape):
    return data[tuple(slice(o, o + s) for o, s in zip(origin, shape))]


def snapshot(ld):
    return [(b["img"].copy(), b["meta"]) for b in ld]


def test_batches_are_crops_of_the_array_at_their_metadata(data):
    ld = loader()
    assert len(ld) == 6
    n = 0
    for step, batch in enumerate(ld):
        img, meta = batch["img"], batch["meta"]
        assert img.shape == (4, *CROP) and img.dtype == data.dtype
        assert not img.flags.writeable
        assert len(meta) == 4
        for i, m in enumerate(meta):
            assert (m["step"], m["index"], m["global_index"]) == (step, i, step * 4 + i)
            src = m["sources"]["img"]
            assert src["shape"] == list(CROP)
            assert src["array"] == WORKLOAD
            np.testing.assert_array_equal(img[i], crop_at(data, src["origin"], CROP))
        n += 1
    assert n == 6
    with pytest.raises(StopIteration):
        next(ld)


def test_same_seed_same_batches_whatever_prefetch_workers_threads():
    a = snapshot(loader())
    for kw in ({"prefetch": 1}, {"prefetch": 4, "workers": 3}, {"threads": 1, "pin": False}):
        b = snapshot(loader(**kw))
        assert len(a) == len(b)
        for (x, mx), (y, my) in zip(a, b):
            np.testing.assert_array_equal(x, y)
            assert mx == my
    c = snapshot(loader(seed=12))
    assert any(not np.array_equal(x, y) for (x, _), (y, _) in zip(a, c))


def test_prefetch_depth_is_reported_and_auto_is_the_default():
    assert loader(prefetch=3).prefetch_depth == 3
    auto = loader()
    assert auto.prefetch_depth == 2  # where "auto" starts
    assert len(snapshot(auto)) == 6
    assert auto.prefetch_depth >= 2
    with pytest.raises(ValueError, match="prefetch is a number of batches or 'auto'"):
        loader(prefetch="deep")


def test_plan_is_the_metadata_without_reading():
    ld = loader()
    plans = [ld.plan(s) for s in range(6)]
    assert [b["meta"] for b in ld] == plans


def test_resume_from_state_dict_is_exact():
    full = snapshot(loader(steps=8))
    ld = loader(steps=8)
    for _ in range(3):
        next(ld)
    state = ld.state_dict()
    assert state["step"] == 3
    resumed = loader(steps=8)
    resumed.load_state_dict(state)
    rest = snapshot(resumed)
    assert len(rest) == 5
    for (x, mx), (y, my) in zip(full[3:], rest):
        np.testing.assert_array_equal(x, y)
        assert mx == my
    # start_step does the same, and seeking backwards replays.
    again = loader(steps=8, start_step=5)
    np.testing.assert_array_equal(next(again)["img"], full[5][0])
    again.seek(1)
    np.testing.assert_array_equal(next(again)["img"], full[1][0])
    with pytest.raises(ValueError):
        resumed.load_state_dict({**state, "seed": 99})


def test_ranks_split_each_global_batch():
    whole = snapshot(loader(batch_size=8))
    r0 = snapshot(loader(batch_size=4, rank=0, world_size=2))
    r1 = snapshot(loader(batch_size=4, rank=1, world_size=2))
    for (w, mw), (a, ma), (b, mb) in zip(whole, r0, r1):
        np.testing.assert_array_equal(w, np.concatenate([a, b]))
        assert [m["global_index"] for m in mw] == [m["global_index"] for m in ma + mb]


def test_epoch_mode_visits_every_lattice_point_once():
    ld = zcrop.Loader(
        zcrop.Source(WORKLOAD, CROP, name="img"),
        batch_size=5, seed=3, mode="epoch", stride=[1, 1, 16, 16], steps=40,
    )
    n = ld.epoch_len
    positions = []
    for batch in ld:
        for m in batch["meta"]:
            if m["epoch"] == 0:
                positions.append(tuple(m["position"]))
    assert len(positions) == n == len(set(positions))


def test_transforms_match_numpy(data):
    mean, std = [100.0, 2000.0, 30000.0], [10.0, 20.0, 300.0]
    src = zcrop.Source(WORKLOAD, CROP, name="x", dtype="float32", normalize=(1, mean, std))
    fft = zcrop.Source(WORKLOAD, CROP, name="f", dtype="float64",
                       fft={"axes": [2, 3], "output": "power", "norm": "ortho"})
    ld = zcrop.Loader([src, fft], batch_size=3, seed=5, steps=2)
    for batch in ld:
        assert batch["x"].dtype == np.float32 and batch["f"].dtype == np.float64
        for i, m in enumerate(batch["meta"]):
            raw = crop_at(data, m["sources"]["x"]["origin"], CROP).astype(np.float64)
            want = (raw - np.array(mean)[None, :, None, None]) / np.array(std)[None, :, None, None]
            np.testing.assert_allclose(batch["x"][i], want, rtol=1e-5)
            raw = crop_at(data, m["sources"]["f"]["origin"], CROP).astype(np.float64)
            power = np.abs(np.fft.fftn(raw, axes=(2, 3), norm="ortho")) ** 2
            np.testing.assert_allclose(batch["f"][i], power, rtol=1e-9, atol=1e-6)


def test_sources_by_name_and_dims():
    hier = FIXTURES / "data/v3_hierarchy.zarr"
    raw = zarr.open_array(str(hier / "images/raw"), mode="r")[...]  # (4, 20, 24)
    labels = zarr.open_array(str(hier / "images/labels"), mode="r")[...]  # (20, 24)
    ld = zcrop.Loader(
        {
            "raw": zcrop.Source(zcrop.open_array(hier / "images/raw"), (2, 8, 8), dims=[0, "y", "x"]),
            "labels": zcrop.Source(str(hier / "images/labels"), (8, 8), dims=["y", zcrop.Dim.along("x")]),
        },
        positions=["y", "x"], batch_size=2, seed=1, steps=3,
    )
    assert [s["name"] for s in ld.sources] == ["raw", "labels"]
    for batch in ld:
        for i, m in enumerate(batch["meta"]):
            o_raw, o_lab = m["sources"]["raw"]["origin"], m["sources"]["labels"]["origin"]
            assert o_raw[0] == 0 and o_raw[1:] == o_lab == m["position"]
            np.testing.assert_array_equal(batch["raw"][i], crop_at(raw, o_raw, (2, 8, 8)))
            np.testing.assert_array_equal(batch["labels"][i], crop_at(labels, o_lab, (8, 8)))


def test_views_hold_their_buffer_and_copy_releases_it():
    ld = loader(steps=10, prefetch=1)  # 2 ring buffers
    held = [next(ld)["img"]]
    first = held[0].copy()
    held.append(next(ld)["img"])  # both buffers now held by the consumer
    with pytest.raises(zcrop.LoaderError):
        next(ld)
    np.testing.assert_array_equal(held[0], first)  # still intact
    del held
    gc.collect()
    assert next(ld)["img"].shape == (4, *CROP)
    # copy=True: writable arrays; the buffers go back at once, so holding many is fine.
    ld = loader(steps=10, prefetch=1, copy=True)
    kept = [next(ld)["img"] for _ in range(6)]
    assert all(k.flags.writeable for k in kept)


def test_a_shared_ring_is_seen_through_its_memory_files():
    import os

    plain = [b["img"].copy() for b in loader()]
    ld = loader(shared_memory=True, prefetch=2)
    files = set()
    for want in plain:
        batch, memory = ld._next_with_memory()
        np.testing.assert_array_equal(batch["img"], want)
        fd, size, (offset,) = memory
        files.add(fd)
        assert os.fstat(fd).st_size == size and offset % 4096 == 0 and offset > 0
        assert os.pread(fd, 16, 0) == bytes(16)  # the page before the bytes: left to the user
        assert os.pread(fd, want.nbytes, offset) == want.tobytes()
    assert len(files) == 3  # prefetch 2 + 1 buffers, each its own file
    assert ld._next_with_memory() is None
    assert next(loader())["img"] is not None and loader()._next_with_memory()[1] is None


def test_len_and_endless_loader():
    ld = loader(steps=None)
    with pytest.raises(TypeError):
        len(ld)
    assert next(ld)["img"].shape == (4, *CROP)
    ld.close()
    with pytest.raises(ValueError):
        next(ld)


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        zcrop.Loader(zcrop.Source(tmp_path / "none.zarr", (1,)), batch_size=1)
    with pytest.raises(ValueError):  # a crop larger than the array: no valid position
        zcrop.Loader(zcrop.Source(WORKLOAD, (2, 3, 100, 16)), batch_size=1)
    with pytest.raises(ValueError):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP), batch_size=0)
    with pytest.raises(ValueError):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP), rank=2, world_size=2)
    with pytest.raises(ValueError):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="meta"))
    with pytest.raises(ValueError):
        zcrop.Source(WORKLOAD, CROP, dtype="int8")
    with pytest.raises(TypeError):
        zcrop.Source(123, CROP)
    with pytest.raises(ValueError):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP), mode="epoch")
    # A misspelt position names the ones there are.
    with pytest.raises(ValueError, match=r"follows 'tim' in dims=.*\['time', 'y', 'x'\].*'time'"):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP, dims=["tim", 0, "y", "x"]),
                     positions=["time", "y", "x"])


def test_a_corrupt_chunk_fails_its_batch_only(tmp_path):
    store = tmp_path / "w.zarr"
    shutil.copytree(WORKLOAD, store)
    for f in sorted((store / "c").rglob("*")):
        if f.is_file():
            f.write_bytes(b"\x00garbage" * 100)  # every shard broken
    ld = zcrop.Loader(zcrop.Source(str(store), CROP, name="img"), batch_size=2, steps=3)
    for _ in range(3):
        with pytest.raises(zcrop.ZcropError) as e:
            next(ld)
        assert "step" in str(e.value)
    with pytest.raises(StopIteration):
        next(ld)


def test_step_follows_each_batch_at_once():
    # The step is recorded before a batch is handed over, not after (a read right after
    # `next` saw the old step now and then).
    ld = loader(steps=60, batch_size=1)
    for k in range(60):
        batch = next(ld)
        assert batch["meta"][0]["step"] == k
        assert ld.step == k + 1


def test_region_bounds_where_windows_start():
    # (6, 3, 70, 90) positions time, channel, y, x; crops (2, 3, 16, 16).
    start, end = [0, 0, 10, 20], [5, 1, 30, 40]
    ld = loader(region=(start, end), steps=20, batch_size=8)
    origins = [m["sources"]["img"]["origin"] for b in ld for m in b["meta"]]
    assert all(s <= o < e for origin in origins for o, s, e in zip(origin, start, end))
    assert any(o[2] + CROP[2] > end[2] for o in origins), "windows reach past end"
    bounds = [6, 3, 40, 60]  # whole windows inside [start, bounds)
    whole = loader(region=(start, [b - c + 1 for b, c in zip(bounds, CROP)]), steps=20,
                   batch_size=8)
    for b in whole:
        for m in b["meta"]:
            o = m["sources"]["img"]["origin"]
            assert all(s <= x and x + c <= e for x, c, s, e in zip(o, CROP, start, bounds))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sixteen_bit_float_outputs_round_the_float64_values_to_nearest(dtype):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    norm = (1, [100.0, 200.0, 300.0], [30.0, 70.0, 110.0])
    kw = {"batch_size": 4, "seed": 3, "steps": 3, "copy": True}
    wide = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float64",
                                     normalize=norm), **kw)
    narrow = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype=dtype,
                                       normalize=norm), **kw)
    target = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    for a, b in zip(wide, narrow):
        assert b["img"].dtype == np.dtype(target)
        np.testing.assert_array_equal(b["img"].view(np.uint16),
                                      a["img"].astype(target).view(np.uint16))


def test_sixteen_bit_floats_take_no_fft():
    with pytest.raises(ValueError, match="16-bit"):
        zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float16",
                                  fft={"axes": [2, 3]}))


def test_url_sources_open_without_holding_the_gil(tmp_path):
    """A loader opens its URL sources (metadata GETs) with the GIL released: here the store is
    served by a thread of this process, which could not answer while the GIL was held (the
    open would wait out the client's timeout)."""
    import time

    data = np.arange(4 * 64 * 64, dtype="uint16").reshape(4, 64, 64)
    z = zarr.create_array(tmp_path / "a.zarr", shape=data.shape, chunks=(1, 32, 32),
                          dtype=data.dtype)
    z[...] = data
    with FileServer(tmp_path) as server:
        t0 = time.monotonic()
        src = zcrop.Source(f"{server.url}/a.zarr", crop=(1, 8, 8), name="a")
        batches = [(b["a"].copy(), b["meta"]) for b in zcrop.Loader(src, batch_size=4, steps=2)]
        assert time.monotonic() - t0 < 20, "the open waited on the store's thread"
        assert server.gets(), "read through the server"
    assert len(batches) == 2
    for crops, meta in batches:
        for x, m in zip(crops, meta):
            np.testing.assert_array_equal(x, crop_at(data, m["sources"]["a"]["origin"], (1, 8, 8)))
