"""Valid windows and weights: ``valid=``, ``valid_times=``, ``weights=`` of ``zcrop.Loader``
and ``zcrop.Samples``, and ``zcrop.valid_windows``.

Oracles: brute force over every position (numpy on the data zarr-python wrote), xarray's own
``sel(method="nearest")`` for masks on other grids, and a chi-square test for weights.
"""

from __future__ import annotations

import math
import pathlib
import pickle
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop
from conftest import FileServer

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

SLOW = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write_array(path: pathlib.Path, data: np.ndarray, chunks, fmt: int = 3, shards=None, dims=None):
    kwargs = {"zarr_format": fmt, "chunks": chunks, "dtype": data.dtype, "shape": data.shape}
    if shards is not None:
        kwargs["shards"] = shards
    if fmt == 3:
        kwargs["dimension_names"] = dims or [f"d{i}" for i in range(data.ndim)]
    a = zarr.create_array(str(path), **kwargs)
    a[...] = data
    if fmt == 2 and dims:
        a.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    return str(path)


def brute_valid(data: np.ndarray, crop, bad) -> np.ndarray:
    """Whether the window of ``crop`` at each origin of ``data`` holds no ``bad`` element."""
    inv = bad(data)
    out = np.zeros(data.shape, dtype=bool)
    for o in np.ndindex(*[n - c + 1 for n, c in zip(data.shape, crop)]):
        out[o] = not inv[tuple(slice(a, a + c) for a, c in zip(o, crop))].any()
    return out


def all_positions(samples: zcrop.Samples) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in samples[i]["meta"]["position"]) for i in range(len(samples))]


def chi2_critical(dof: int) -> float:
    """The chi-square value that ``dof`` degrees of freedom exceed with probability 0.001
    (Wilson-Hilferty; 3.0902 is the normal's upper 0.1% point)."""
    k = 2 / (9 * dof)
    return dof * (1 - k + 3.0902 * math.sqrt(k)) ** 3


def chi2(counts: np.ndarray, expect: np.ndarray) -> float:
    k = expect > 0
    return float((((counts[k] - expect[k]) ** 2) / expect[k]).sum())


def snapshot(loader: zcrop.Loader) -> list:
    """Every batch of ``loader``: each source's bytes, and the meta."""
    with loader:
        return [({k: v.tobytes() for k, v in b.items() if k != "meta"}, b["meta"]) for b in loader]


def snapshot_one(loader: zcrop.Loader) -> tuple:
    """The next batch of ``loader``, as :func:`snapshot` gives each."""
    b = next(loader)
    return {k: v.tobytes() for k, v in b.items() if k != "meta"}, b["meta"]


# --- valid_windows against brute force -------------------------------------------------------


@SLOW
@given(
    seed=st.integers(0, 2**16),
    nan_share=st.sampled_from([0.0, 0.001, 0.01, 0.05]),
    crop=st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6)),
    layout=st.sampled_from(["v3", "v2", "sharded"]),
    budget=st.sampled_from([1, 3000, 1 << 20]),
)
def test_valid_windows_equal_brute_force(tmp_path_factory, seed, nan_share, crop, layout, budget):
    rng = np.random.default_rng(seed)
    data = rng.random((11, 2, 13, 14)).astype("float32")
    data[rng.random(data.shape) < nan_share] = np.nan
    path = tmp_path_factory.mktemp("vw") / "a.zarr"
    fmt, shards = (2, None) if layout == "v2" else (3, (4, 2, 8, 8) if layout == "sharded" else None)
    write_array(path, data, (2, 2, 4, 4), fmt, shards, ["t", "c", "y", "x"])
    src = zcrop.Source(str(path), crop={"t": crop[0], "y": crop[1], "x": crop[2]})
    positions = ["t", "y", "x"]
    mask = zcrop.valid_windows(src, positions, budget=budget, cache=False)
    want = brute_valid(data, (crop[0], 2, crop[1], crop[2]), np.isnan)[:, 0]
    np.testing.assert_array_equal(mask.to_numpy(), want)
    if want.any():
        s = zcrop.Samples(src, positions=positions, valid=mask, mode="epoch", stride=[1, 1, 1])
        assert len(s) == int(want.sum())
        assert sorted(all_positions(s)) == [tuple(p) for p in np.argwhere(want)]
    else:
        with pytest.raises(zcrop.ZcropError, match="allow no"):
            zcrop.Samples(src, positions=positions, valid=mask, length=1)


def test_valid_windows_with_two_sources_jitter_scale_and_fills(tmp_path):
    """A fine source and a 2x coarser one with jitter; fill values of a packed xarray
    variable; extra invalid values."""
    rng = np.random.default_rng(5)
    fine = rng.integers(1, 100, size=(9, 20, 22)).astype("int16")
    fine[rng.random(fine.shape) < 0.01] = 0
    coarse = rng.random((9, 10, 11)).astype("float64")
    coarse[rng.random(coarse.shape) < 0.02] = np.nan
    ds = xr.Dataset(
        {
            "fine": (("time", "y", "x"), np.where(fine == 0, np.nan, fine * 0.5).astype("f4")),
            "coarse": (("time", "yc", "xc"), coarse),
        },
        coords={"time": pd.date_range("2020-01-01", periods=9, freq="h")},
    )
    ds["fine"].encoding = {"_FillValue": np.int16(0), "scale_factor": 0.5, "dtype": "int16"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(tmp_path / "d.zarr", zarr_format=3, consolidated=False)
    opened = zcrop.open_dataset(tmp_path / "d.zarr")
    crop_f, crop_c, jit = (2, 4, 4), (2, 2, 3), 1
    sources = {
        "fine": zcrop.Source(opened["fine"], crop={"time": 2, "y": 4, "x": 4}),
        "coarse": zcrop.Source(
            opened["coarse"],
            crop={"time": 2, "yc": 2, "xc": 3},
            dims=["time", zcrop.Dim.along("y").scale(1, 2).jitter(jit), zcrop.Dim.along("x").scale(1, 2)],
        ),
    }
    positions = ["time", "y", "x"]
    mask = zcrop.valid_windows(sources, positions, invalid={"fine": [7]}, cache=False, budget=500)
    ok_f = brute_valid(fine, crop_f, lambda a: (a == 0) | (a == 7))
    ok_c = brute_valid(coarse, crop_c, np.isnan)
    want = np.zeros((9, 20, 22), dtype=bool)
    for t, y, x in np.ndindex(*want.shape):
        yc, xc = y // 2, x // 2
        if not ok_f[t, y, x] or not jit <= yc <= 10 - crop_c[1] - jit or xc > 11 - crop_c[2]:
            continue
        want[t, y, x] = all(ok_c[t, yc + j, xc] for j in range(-jit, jit + 1))
    np.testing.assert_array_equal(mask.to_numpy(), want)
    loader = zcrop.Loader(sources, positions=positions, valid=mask, batch_size=16, steps=5, seed=3)
    for batch in loader:
        assert not np.isnan(batch["fine"]).any() and not np.isnan(batch["coarse"]).any()
        for m in batch["meta"]:
            assert want[tuple(m["position"])]
            assert 7 not in fine[tuple(slice(o, o + c) for o, c in zip(m["sources"]["fine"]["origin"], crop_f))]


def test_valid_windows_cache_is_keyed_by_the_data(tmp_path):
    data = np.ones((6, 10, 10), dtype="float32")
    data[2, 3, 3] = np.nan
    path = write_array(tmp_path / "a.zarr", data, (3, 5, 5))
    src = zcrop.Source(path, crop=(2, 3, 3))
    cache = tmp_path / "cache"
    first = zcrop.valid_windows(src, cache=cache)
    files = list(cache.iterdir())
    assert len(files) == 1
    again = zcrop.valid_windows(src, cache=cache)
    np.testing.assert_array_equal(first.runs, again.runs)
    # The cached answer is used: a doctored cache file is what comes back.
    np.savez(files[0], runs=np.zeros((0, 2), dtype=np.uint64))
    assert zcrop.valid_windows(src, cache=cache).count() == 0
    # New data, new key: computed again.
    a = zarr.open_array(path, mode="r+")
    a[2, 3, 3] = 1.0
    fresh = zcrop.valid_windows(src, cache=cache)
    assert fresh.count() == 5 * 8 * 8
    assert len(list(cache.iterdir())) == 2
    # A different crop is a different mask.
    assert zcrop.valid_windows(zcrop.Source(path, crop=(1, 3, 3)), cache=cache).count() == 6 * 8 * 8


def test_valid_windows_cache_tells_apart_channels_steps_and_long_tables(tmp_path):
    """Selected channels and steps place windows differently: each has its own cached mask.
    Lookup tables enter the key by their bytes, so tables that differ only in the middle
    (which numpy would print the same) do too."""
    from zcrop._array import Array
    from zcrop._valid import _cache_key, _Plan

    data = np.ones((6, 2, 10, 10), dtype="float32")
    data[2, 1, 3, 3] = np.nan
    path = write_array(tmp_path / "a.zarr", data, (3, 2, 5, 5), dims=["t", "c", "y", "x"])
    cache = tmp_path / "cache"
    crop = {"t": 2, "c": 1, "y": 3, "x": 3}
    clean = zcrop.valid_windows(zcrop.Source(path, crop=crop, select={"c": [0]}), ["t", "y", "x"],
                                cache=cache)
    spoilt = zcrop.valid_windows(zcrop.Source(path, crop=crop, select={"c": [1]}), ["t", "y", "x"],
                                 cache=cache)
    assert clean.count() == 5 * 8 * 8 and spoilt.count() == 5 * 8 * 8 - 2 * 3 * 3
    stepped = zcrop.valid_windows(
        zcrop.Source(path, crop=crop, select={"c": [1]}, every={"y": 2}), ["t", "y", "x"],
        cache=cache,
    )
    assert stepped.count() == 5 * 6 * 8 - 2 * 2 * 3
    assert len(list(cache.iterdir())) == 3

    table = np.arange(5000, dtype=np.int64)
    other = table.copy()
    other[2500] += 1
    assert str(table) == str(other)
    plan = _Plan("a", Array(zcrop.open_array(path).native), [], {}, [], None)
    info = {"origins": [("lookup", 0, table, 0, 0, 1)], "crop": [1], "every": [1],
            "picks": [None], "wrap": None, "pad": [False]}
    keys = {
        _cache_key(["t"], [5000], [plan], [{**info, "origins": [("lookup", 0, t, 0, 0, 1)]}])
        for t in (table, other)
    }
    assert len(keys) == 2


# --- valid= forms ----------------------------------------------------------------------------


@pytest.fixture
def grid_array(tmp_path):
    data = np.arange(10 * 12 * 14, dtype="float32").reshape(10, 12, 14)
    return write_array(tmp_path / "g.zarr", data, (5, 6, 7), dims=["t", "y", "x"])


def test_numpy_valid_per_position_and_per_block(grid_array):
    src = zcrop.Source(grid_array, crop=(2, 3, 3))
    rng = np.random.default_rng(1)
    full = rng.random((10, 12, 14)) < 0.3
    s = zcrop.Samples(src, valid=full, mode="epoch", stride=[1, 1, 1])
    box = np.zeros_like(full)
    box[:9, :10, :12] = True
    assert sorted(all_positions(s)) == [tuple(p) for p in np.argwhere(full & box)]
    # One value per 4 x 4 x 3 block: ceil(10/4), ceil(12/4), ceil(14/3) values.
    coarse = rng.random((3, 3, 5)) < 0.5
    s = zcrop.Samples(src, valid=coarse, mode="epoch", stride=[1, 1, 1])
    expanded = coarse.repeat(4, 0).repeat(4, 1).repeat(3, 2)[:10, :12, :14]
    assert sorted(all_positions(s)) == [tuple(p) for p in np.argwhere(expanded & box)]
    # Uniform draws stay inside, and a list of masks intersects.
    u = zcrop.Samples(src, valid=[full, coarse], length=300, seed=4)
    for p in all_positions(u):
        assert full[p] and expanded[p]
    with pytest.raises(zcrop.ZcropError, match=r"ceil\(10 / c\)"):
        zcrop.Samples(src, valid=np.ones((7, 12, 14), bool), length=1)
    with pytest.raises(ValueError, match="2 dimensions"):
        zcrop.Samples(src, valid=np.ones((12, 14), bool), length=1)
    with pytest.raises(TypeError, match="boolean"):
        zcrop.Samples(src, valid=np.ones((10, 12, 14)), length=1)
    with pytest.raises(zcrop.ZcropError, match="allow no"):
        zcrop.Samples(src, valid=np.zeros((10, 12, 14), bool), length=1)


@pytest.fixture
def labelled(tmp_path):
    """Hourly 0.5-degree t2m over (time, latitude descending, longitude)."""
    time = pd.date_range("2021-03-01", periods=24, freq="h")
    lat = np.arange(30.0, 20.0 - 0.01, -0.5)
    lon = np.arange(0.0, 12.0, 0.5)
    rng = np.random.default_rng(2)
    ds = xr.Dataset(
        {"t2m": (("time", "latitude", "longitude"), rng.random((24, lat.size, lon.size)).astype("f4"))},
        coords={"time": time, "latitude": lat, "longitude": lon},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(tmp_path / "l.zarr", zarr_format=3, consolidated=False)
    return zcrop.open_dataset(tmp_path / "l.zarr"), ds


@SLOW
@given(seed=st.integers(0, 2**16), factor=st.sampled_from([1, 2, 4]))
def test_dataarray_valid_on_a_coarser_grid_matches_nearest_sel(labelled, seed, factor):
    opened, ds = labelled
    rng = np.random.default_rng(seed)
    # A land-sea-like mask on a grid `factor` times coarser, ascending latitude, shifted.
    lat = np.arange(19.0, 31.5, 0.5 * factor)
    lon = np.arange(-0.25, 12.5, 0.5 * factor)
    land = xr.DataArray(rng.random((lat.size, lon.size)) < 0.5, dims=("latitude", "longitude"),
                        coords={"latitude": lat, "longitude": lon})
    src = zcrop.Source(opened["t2m"], crop={"time": 1, "latitude": 3, "longitude": 3})
    if not land.any():
        return
    s = zcrop.Samples(src, valid=land, length=200, seed=seed)
    for i in range(len(s)):
        t, y, x = (int(v) for v in s[i]["meta"]["position"])
        la, lo = ds.latitude.values[y], ds.longitude.values[x]
        assert bool(land.sel(latitude=la, longitude=lo, method="nearest")), (la, lo)
    # Every allowed position is reachable: the epoch covers exactly the allowed ones.
    e = zcrop.Samples(src, valid=land, mode="epoch", stride=[6, 1, 1])
    want = {
        (t, y, x)
        for t in range(0, 24, 6)
        for y in range(ds.latitude.size - 2)
        for x in range(ds.longitude.size - 2)
        if bool(land.sel(latitude=ds.latitude.values[y], longitude=ds.longitude.values[x], method="nearest"))
    }
    assert set(all_positions(e)) == want and len(e) == len(want)


def test_valid_times_and_label_errors(labelled):
    opened, ds = labelled
    src = zcrop.Source(opened["t2m"], crop={"time": 2, "latitude": 4, "longitude": 4})
    times = ds.time.values[[1, 5, 6, 17]]
    s = zcrop.Samples(src, valid_times=times, length=100, seed=1)
    for i in range(len(s)):
        assert ds.time.values[int(s[i]["meta"]["position"][0])] in times
        assert s.labels(i)["t2m"]["time"][0] in times
    with pytest.raises(ValueError, match="not 'time' labels"):
        zcrop.Samples(src, valid_times=["1999-01-01"], length=1)
    # An empty list allows nothing: said at construction, not left to the sampler.
    for empty in ([], np.array([], dtype="datetime64[ns]")):
        with pytest.raises(ValueError, match="valid_times is empty"):
            zcrop.Loader(src, valid_times=empty, batch_size=1)
    narrow = xr.DataArray([True, True], dims="latitude", coords={"latitude": [25.0, 25.5]})
    with pytest.raises(ValueError, match="does not cover"):
        zcrop.Samples(src, valid=narrow, length=1)
    wobbly = xr.DataArray([True] * 3, dims="longitude", coords={"longitude": [0.0, 5.0, 2.0]})
    with pytest.raises(ValueError, match="not strictly monotonic"):
        zcrop.Samples(src, valid=wobbly, length=1)
    extra = xr.DataArray([True], dims="level", coords={"level": [500]})
    with pytest.raises(ValueError, match="not position dimensions"):
        zcrop.Samples(src, valid=extra, length=1)
    with pytest.raises(ValueError, match="no xarray source"):
        zcrop.Samples(zcrop.Source(src._spec["array"], crop=(2, 4, 4)), valid=narrow, length=1)


# --- weights ---------------------------------------------------------------------------------


def test_weights_are_followed_and_deterministic(grid_array):
    src = zcrop.Source(grid_array, crop=(1, 3, 3))
    # Weights per block of 5 x 6 x 7 positions: 2 x 2 x 2 cells.
    w = np.array([[[1.0, 0.0], [2.0, 0.5]], [[0.0, 3.0], [1.0, 4.0]]])
    s = zcrop.Samples(src, weights=w, length=1)
    n = 40_000
    pos = np.asarray(s._native.positions(0, n)).reshape(n, 3)
    cells = (pos[:, 0] // 5) * 4 + (pos[:, 1] // 6) * 2 + pos[:, 2] // 7
    counts = np.bincount(cells, minlength=8)
    # Positions per cell inside the box (t < 10, y < 10, x < 12).
    size = np.array([[[5 * 6 * 7, 5 * 6 * 5], [5 * 4 * 7, 5 * 4 * 5]]] * 2).ravel()
    expect = w.ravel() * size
    expect = expect / expect.sum() * n
    assert counts[expect == 0].sum() == 0
    k = expect > 0
    chi2 = (((counts[k] - expect[k]) ** 2) / expect[k]).sum()
    assert chi2 < 20.5, (chi2, counts, expect)  # 5 degrees of freedom: p = 0.001
    again = zcrop.Samples(src, weights=w, length=1)
    np.testing.assert_array_equal(np.asarray(again._native.positions(0, n)).reshape(n, 3), pos)
    # Sample i of a loader is sample i of Samples, whatever the batch size and workers.
    loader = zcrop.Loader(src, weights=w, batch_size=7, steps=4, workers=3, prefetch=3, copy=True)
    got = [tuple(m["position"]) for b in loader for m in b["meta"]]
    assert got == [tuple(int(x) for x in p) for p in pos[:28]]
    with pytest.raises(ValueError, match="uniform"):
        zcrop.Samples(src, weights=w, mode="epoch", stride=[1, 1, 1])
    with pytest.raises(zcrop.ZcropError, match="non-negative"):
        zcrop.Samples(src, weights=-w, length=1)
    with pytest.raises(zcrop.ZcropError, match="every weight is zero"):
        zcrop.Samples(src, weights=np.zeros_like(w), length=1)


def test_samples_with_fields_pickle(grid_array):
    src = zcrop.Source(grid_array, crop=(2, 3, 3))
    valid = np.random.default_rng(3).random((10, 12, 14)) < 0.5
    w = np.ones((2, 2, 2))
    s = zcrop.Samples(src, valid=valid, weights=w, length=50, seed=9)
    t = pickle.loads(pickle.dumps(s))
    for i in range(0, 50, 7):
        np.testing.assert_array_equal(s[i]["meta"]["position"], t[i]["meta"]["position"])


# --- determinism and draws with masks and weights together --------------------------------------


def test_masked_weighted_batches_are_identical_across_restarts_seek_and_settings(tmp_path):
    """With valid= (a ValidMask and a numpy block mask) and weights=, batch k is a pure function
    of the seed and k: the same bytes and meta from a fresh loader, one resumed by
    load_state_dict or seek (forwards and back), and whatever threads, prefetch and workers."""
    rng = np.random.default_rng(8)
    data = rng.random((12, 16, 18)).astype("float32")
    data[rng.random(data.shape) < 0.02] = np.nan
    path = write_array(tmp_path / "n.zarr", data, (4, 8, 9), dims=["t", "y", "x"])
    src = zcrop.Source(path, crop=(2, 3, 3), name="x")
    clean = zcrop.valid_windows(src, cache=False)
    blocks = rng.random((3, 4, 6)) < 0.7  # one value per 4 x 4 x 3 positions
    w = rng.random((2, 2, 3))  # one per 6 x 8 x 6
    w[0, 1, 2] = 0.0
    kw = dict(valid=[clean, blocks], weights=w, batch_size=5, seed=21, steps=8)

    def run(**more):
        return snapshot(zcrop.Loader(src, **{**kw, **more}))

    base = run(prefetch=1, workers=1, threads=1)
    # Not vacuous: every draw is clean, allowed by both masks and of positive weight.
    ok = clean.to_numpy()
    for batch, meta in base:
        assert not np.isnan(np.frombuffer(batch["x"], dtype="float32")).any()
        for m in meta:
            t, y, x = m["position"]
            assert ok[t, y, x] and blocks[t // 4, y // 4, x // 3] and w[t // 6, y // 8, x // 6] > 0
    for more in ({}, {"prefetch": 4, "workers": 3}, {"threads": 2, "pin": False},
                 {"prefetch": "auto", "workers": 2, "copy": True}):
        assert run(**more) == base, more
    assert run(seed=22) != base
    # Resumed from a state saved by a loader with other settings.
    first = zcrop.Loader(src, **{**kw, "workers": 3, "prefetch": 3})
    for _ in range(3):
        next(first)
    state = first.state_dict()
    first.close()
    resumed = zcrop.Loader(src, **{**kw, "threads": 1})
    resumed.load_state_dict(state)
    assert snapshot(resumed) == base[3:]
    # Seeking forwards, then back (reads in flight are dropped), and start_step.
    with zcrop.Loader(src, **{**kw, "prefetch": 4}) as ld:
        ld.seek(6)
        assert snapshot_one(ld) == base[6]
        ld.seek(2)
        assert snapshot(ld) == base[2:]
    assert run(start_step=5, steps=3) == base[5:]


def test_weighted_draws_under_a_mask_follow_weight_times_allowed_positions(grid_array):
    """valid= and weights= together: each allowed position is drawn with probability
    proportional to its cell's weight, so a cell's share is its weight times its number of
    allowed positions (not times its size): a chi-square test per position, fixed seed."""
    src = zcrop.Source(grid_array, crop=(1, 3, 3))  # positions t < 10, y < 10, x < 12
    w = np.array([[[1.0, 0.0], [2.0, 0.5]], [[0.3, 3.0], [1.0, 4.0]]])  # cells of 5 x 6 x 7
    t, y, x = np.indices((10, 12, 14))
    cell = (t // 5, y // 6, x // 7)
    # Masks of very different density per weight cell, so that weight x allowed count and
    # weight x cell size disagree.
    density = np.array([[[0.9, 0.5], [0.15, 0.8]], [[0.6, 0.1], [0.85, 0.3]]])
    rng = np.random.default_rng(12)
    fine = rng.random((10, 12, 14)) < density[cell]
    coarse = rng.random((3, 3, 5)) < 0.8  # one value per 4 x 4 x 3 positions
    allowed = fine & coarse[t // 4, y // 4, x // 3] & (y < 10) & (x < 12)
    s = zcrop.Samples(
        src, valid=[zcrop.ValidMask.from_bools(["t", "y", "x"], fine), coarse], weights=w,
        length=1,
    )
    n = 60_000
    pos = np.asarray(s._native.positions(0, n)).reshape(n, 3)
    counts = np.bincount(np.ravel_multi_index(pos.T, (10, 12, 14)), minlength=10 * 12 * 14)
    mass = np.where(allowed, w[cell], 0.0).ravel()
    assert counts[mass == 0].sum() == 0  # never outside the masks, never at weight zero
    expect = mass / mass.sum() * n
    dof = int((mass > 0).sum()) - 1
    assert dof > 100 and expect[mass > 0].min() > 20
    assert chi2(counts, expect) < chi2_critical(dof)
    # The test tells the rules apart: weight x cell size spread over the allowed positions
    # (or no weights at all) fails it.
    per_cell = np.zeros_like(w)
    np.add.at(per_cell, tuple(c[allowed] for c in cell), 1)
    size = np.zeros_like(w)
    np.add.at(size, tuple(c[(y < 10) & (x < 12)] for c in cell), 1)
    wrong = np.where(allowed, (w * size / np.maximum(per_cell, 1))[cell], 0.0).ravel()
    assert chi2(counts, wrong / wrong.sum() * n) > chi2_critical(dof)
    flat = (mass > 0) * 1.0
    assert chi2(counts, flat / flat.sum() * n) > chi2_critical(dof)
    # A cell that the masks leave empty gets no mass, whatever its weight.
    empty = fine.copy()
    empty[5:, 6:, 7:] = False
    s = zcrop.Samples(src, valid=empty, weights=w, length=1)
    pos = np.asarray(s._native.positions(0, 5000)).reshape(-1, 3)
    assert not ((pos[:, 0] >= 5) & (pos[:, 1] >= 6) & (pos[:, 2] >= 7)).any()


def test_dataarray_weights_on_a_coarser_grid_are_followed(tmp_path):
    """weights= as a DataArray on coordinates: cos(latitude) on a grid 5 times coarser than a
    descending 2-degree latitude. Draws per latitude follow the weight xarray's
    sel(method="nearest") gives each position's label (chi-square, fixed seed)."""
    lat = np.arange(80.0, -80.5, -2.0)
    lon = np.arange(0.0, 16.0, 2.0)
    ds = xr.Dataset(
        {"t": (("time", "latitude", "longitude"), np.zeros((2, lat.size, lon.size), "f4"))},
        coords={"time": pd.date_range("2022-01-01", periods=2, freq="6h"), "latitude": lat,
                "longitude": lon},
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(tmp_path / "w.zarr", zarr_format=3, consolidated=False)
    opened = zcrop.open_dataset(tmp_path / "w.zarr")
    src = zcrop.Source(opened["t"], crop={"time": 1, "latitude": 3, "longitude": 3})
    coarse = np.arange(-84.0, 87.0, 10.0)  # ascending, no position half-way between labels
    weights = xr.DataArray(np.cos(np.deg2rad(coarse)), dims="latitude",
                           coords={"latitude": coarse})
    s = zcrop.Samples(src, weights=weights, length=1, seed=3)
    n = 40_000
    pos = np.asarray(s._native.positions(0, n)).reshape(n, 3)
    rows = lat.size - 2  # window starts along latitude
    counts = np.bincount(pos[:, 1], minlength=rows)
    want = np.array([float(weights.sel(latitude=la, method="nearest")) for la in lat[:rows]])
    expect = want / want.sum() * n
    assert chi2(counts, expect) < chi2_critical(rows - 1)
    uniform = np.full(rows, n / rows)
    assert chi2(counts, uniform) > chi2_critical(rows - 1)  # the weights matter here
    # Time and longitude are not weighted: uniform over their positions.
    for axis, m in ((0, 2), (2, lon.size - 2)):
        c = np.bincount(pos[:, axis], minlength=m)
        assert chi2(c, np.full(m, n / m)) < chi2_critical(m - 1)


def test_valid_windows_reads_each_chunk_once(tmp_path):
    """valid_windows streams in slabs (a tiny budget: one position row each), and each source
    reads only rows it has not read yet, in whole chunks: over HTTP, every chunk of both
    arrays is fetched exactly once, a jittered coarse source whose windows overlap from slab
    to slab included. (zcrop exposes no decode counter for this path: the store's GETs count
    the reads.)"""
    rng = np.random.default_rng(4)
    fine = rng.random((20, 12, 30)).astype("float32") + 1
    fine[rng.random(fine.shape) < 0.002] = np.nan
    coarse = rng.random((10, 12, 30)).astype("float32") + 1
    coarse[rng.random(coarse.shape) < 0.002] = np.nan
    write_array(tmp_path / "f.zarr", fine, (4, 6, 10), dims=["t", "y", "x"])
    write_array(tmp_path / "c.zarr", coarse, (3, 6, 10), dims=["t", "y", "x"])

    def sources(where):
        return [
            zcrop.Source(f"{where}/f.zarr", crop=(2, 3, 3), name="f"),
            zcrop.Source(f"{where}/c.zarr", crop=(2, 3, 3), name="c",
                         dims=[zcrop.Dim.along("t").scale(1, 2).jitter(1), "y", "x"]),
        ]

    with FileServer(tmp_path) as server:
        mask = zcrop.valid_windows(sources(server.url), budget=1, cache=False)
        gets = server.gets()
    chunks = {k: n for k, n in gets.items() if "/c/" in k}
    # The windows of the positions (t in 2..15) reach every element of both arrays: every
    # chunk is needed, 5 x 2 x 3 of the fine array and 4 x 2 x 3 of the coarse one.
    want = {f"/f.zarr/c/{a}/{b}/{c}" for a in range(5) for b in range(2) for c in range(3)}
    want |= {f"/c.zarr/c/{a}/{b}/{c}" for a in range(4) for b in range(2) for c in range(3)}
    assert set(chunks) == want
    assert all(n == 1 for n in chunks.values()), {k: n for k, n in chunks.items() if n > 1}
    # And what was read is right: the same mask as from the local store.
    local = zcrop.valid_windows(sources(str(tmp_path)), cache=False)
    np.testing.assert_array_equal(mask.to_numpy(), local.to_numpy())
    assert 0 < mask.count() < 14 * 10 * 28
