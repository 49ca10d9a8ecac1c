"""Valid windows and weights: ``valid=``, ``valid_times=``, ``weights=`` of ``zcrop.Loader``
and ``zcrop.Samples``, and ``zcrop.valid_windows``.

Oracles: brute force over every position (numpy on the data zarr-python wrote), xarray's own
``sel(method="nearest")`` for masks on other grids, and a chi-square test for weights.
"""

from __future__ import annotations

import pathlib
import pickle
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop

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
