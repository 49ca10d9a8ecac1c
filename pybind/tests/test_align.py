"""Positions in coordinates and sources aligned by their own labels: ``positions=`` as labels,
``align=``, ``tolerance=``, ``window=`` and ``every=`` of ``zcrop.Source``.

Oracles: xarray's own zarr backend and ``sel`` (``method="nearest"`` / ``"ffill"`` /
``"bfill"`` with the same tolerance) for each source's origin, ``isel`` at the reported
origins for the data, and brute force over every position for the sample space.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop

xr = pytest.importorskip("xarray")
pd = pytest.importorskip("pandas")

SLOW = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
METHOD = {"nearest": "nearest", "previous": "ffill", "next": "bfill"}


def write(path: pathlib.Path, name: str, dims, coords, chunks) -> str:
    """A Dataset with one float32 variable whose values encode their own index, written by
    xarray's zarr backend (the oracle's writer)."""
    shape = [len(coords[d]) if d in coords else 3 for d in dims]
    data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    ds = xr.Dataset({name: (dims, data)}, coords={d: coords[d] for d in dims if d in coords})
    ds.to_zarr(str(path), mode="w", encoding={name: {"chunks": chunks}}, zarr_format=3)
    return str(path)


def oracle_index(index: pd.Index, label, rule: str, tolerance) -> int | None:
    """The index xarray's ``sel`` picks for ``label`` under ``rule`` (None: a KeyError)."""
    if rule == "exact":
        got = index.get_indexer([label])
    else:
        got = index.get_indexer([label], method=METHOD[rule], tolerance=tolerance)
    return None if got[0] < 0 else int(got[0])


# --- two sources on different grids and time steps --------------------------------------------


@SLOW
@given(
    lag=st.integers(0, 90),
    rule=st.sampled_from(["exact", "nearest", "previous", "next"]),
    tol=st.sampled_from([None, 10, 40, 200]),
    space=st.sampled_from(["nearest", "exact"]),
)
def test_aligned_origins_match_xarray_sel_and_data_matches_isel(tmp_path_factory, lag, rule, tol, space):
    tmp = tmp_path_factory.mktemp("align")
    t_sat = pd.date_range("2024-01-01 00:00", periods=24, freq="15min")
    t_nwp = pd.date_range("2024-01-01 00:00", periods=6, freq="h") + pd.Timedelta(minutes=lag)
    sat = write(
        tmp / "sat.zarr",
        "ir",
        ["time", "lat", "lon"],
        {"time": t_sat, "lat": np.arange(10, 14, 0.25), "lon": np.arange(0, 5, 0.25)},
        (4, 8, 8),
    )
    nwp = write(
        tmp / "nwp.zarr",
        "t2m",
        ["init_time", "step", "lat", "lon"],
        {"init_time": t_nwp, "step": np.arange(3), "lat": np.arange(9, 15, 1.0),
         "lon": np.arange(-1, 6, 1.0)},
        (2, 3, 4, 4),
    )
    ds_sat = xr.open_dataset(sat, engine="zcrop")
    ds_nwp = xr.open_dataset(nwp, engine="zcrop")
    tolerance = None if tol is None else pd.Timedelta(minutes=tol)
    sources = {
        "sat": zcrop.Source(ds_sat["ir"], crop={"time": 2, "lat": 4, "lon": 4}),
        "nwp": zcrop.Source(
            ds_nwp["t2m"],
            crop={"init_time": 1, "step": 2, "lat": 2, "lon": 2},
            dims=["time", 0, "lat", "lon"],
            align={"init_time": rule, "lat": space, "lon": space},
            tolerance={"init_time": tolerance},
        ),
    }
    positions = ["time", "lat", "lon"]
    # The sample space by brute force: every position each source aligns with, whole crops.
    want = set()
    it, ilat, ilon = (pd.Index(ds_nwp[d].values) for d in ("init_time", "lat", "lon"))
    for p0, t0 in enumerate(t_sat[: 24 - 1]):
        o_t = oracle_index(it, t0, rule, tolerance)
        if o_t is None:
            continue
        for p1, la in enumerate(ds_sat.lat.values[: 16 - 3]):
            o_la = oracle_index(ilat, la, space, None)
            for p2, lo in enumerate(ds_sat.lon.values[: 20 - 3]):
                o_lo = oracle_index(ilon, lo, space, None)
                if None in (o_la, o_lo) or o_la + 2 > 6 or o_lo + 2 > 7:
                    continue
                want.add((p0, p1, p2))
    if not want:
        with pytest.raises((ValueError, zcrop.ZcropError)):
            zcrop.Samples(sources, positions=positions, mode="epoch", stride=[1, 1, 1])
        return
    s = zcrop.Samples(sources, positions=positions, mode="epoch", stride=[1, 1, 1])
    # The sampler alone (no reads) enumerates one epoch: exactly the aligned positions.
    drawn = s._native.positions(0, len(s)).reshape(-1, 3)
    assert len(s) == len(want)
    assert {tuple(int(x) for x in p) for p in drawn} == want
    u = zcrop.Samples(sources, positions=positions, seed=lag, length=25)
    for i in range(0, 25, 3):
        sample = u[i]
        p = [int(x) for x in sample["meta"]["position"]]
        assert tuple(p) in want
        o = [int(x) for x in sample["meta"]["origin"]["nwp"]]
        t0 = t_sat[p[0]]
        assert o[0] == oracle_index(it, t0, rule, tolerance)
        assert o[2] == oracle_index(ilat, ds_sat.lat.values[p[1]], space, None)
        assert o[3] == oracle_index(ilon, ds_sat.lon.values[p[2]], space, None)
        ref = ds_nwp["t2m"].isel(init_time=slice(o[0], o[0] + 1), step=slice(0, 2),
                                 lat=slice(o[2], o[2] + 2), lon=slice(o[3], o[3] + 2))
        np.testing.assert_array_equal(sample["nwp"], ref.values)
        sat_ref = ds_sat["ir"].isel(time=slice(p[0], p[0] + 2), lat=slice(p[1], p[1] + 4),
                                    lon=slice(p[2], p[2] + 4))
        np.testing.assert_array_equal(sample["sat"], sat_ref.values)
        labels = u.labels(i)
        assert labels["nwp"]["init_time"][0] == ds_nwp.init_time.values[o[0]]


# --- windows in label units, steps inside crops, labelled positions ----------------------------


@pytest.fixture(scope="module")
def ocf(tmp_path_factory):
    """The Open Climate Fix shape in small: 15-minute satellite, hourly forecasts with steps,
    and a table of stations, on their own time axes."""
    tmp = tmp_path_factory.mktemp("ocf")
    t_sat = pd.date_range("2024-06-01 00:00", periods=96, freq="15min")
    sat = write(tmp / "sat.zarr", "ir", ["time", "channel", "y", "x"],
                {"time": t_sat, "channel": np.arange(3), "y": np.arange(32.0),
                 "x": np.arange(32.0)}, (8, 3, 16, 16))
    nwp = write(tmp / "nwp.zarr", "t2m", ["init_time", "step", "y", "x"],
                {"init_time": pd.date_range("2024-06-01 00:00", periods=8, freq="3h"),
                 "step": np.arange(8), "y": np.arange(0.0, 32.0, 4.0),
                 "x": np.arange(0.0, 32.0, 4.0)}, (2, 8, 8, 8))
    pv = write(tmp / "pv.zarr", "power", ["time", "station"],
               {"time": pd.date_range("2024-05-31 23:00", periods=30, freq="h"),
                "station": np.arange(5)}, (10, 5))
    return (xr.open_dataset(sat, engine="zcrop"), xr.open_dataset(nwp, engine="zcrop"),
            xr.open_dataset(pv, engine="zcrop"))


def test_windows_in_label_units_and_every_kth_frame(ocf):
    sat, nwp, pv = ocf
    sources = {
        # One hour of history up to t0: five 15-minute frames.
        "sat": zcrop.Source(sat["ir"], crop={"y": 8, "x": 8}, window={"time": ("-1h", "0h")}),
        # Three hours of hourly frames from the same data: every 4th frame.
        "hourly": zcrop.Source(sat["ir"], crop={"y": 8, "x": 8}, window={"time": ("-3h", "0h")},
                               every={"time": 4}),
        # The forecast initialised at or before t0 (within 3 h), its first 4 steps.
        "nwp": zcrop.Source(nwp["t2m"], crop={"init_time": 1, "step": 4, "y": 2, "x": 2},
                            dims=["time", 0, "y", "x"], align={"init_time": "previous", "y": "nearest", "x": "nearest"},
                            tolerance={"init_time": "3h"}),
        # Station readings from 2 h before t0 to 1 h after, by exact hour.
        "pv": zcrop.Source(pv["power"], crop={}, window={"time": (-2, 2)}),
    }
    s = zcrop.Samples(sources, positions=["time", "y", "x"], seed=4, length=40)
    assert s[0]["sat"].shape == (5, 3, 8, 8)
    assert s[0]["hourly"].shape == (4, 3, 8, 8)
    assert s[0]["pv"].shape == (4, 5)
    t_sat = sat.time.values
    for i in range(40):
        out = s[i]
        p = [int(x) for x in out["meta"]["position"]]
        t0 = t_sat[p[0]]
        labels = s.labels(i)
        times = labels["sat"]["time"]
        np.testing.assert_array_equal(times, t0 - np.arange(60, -1, -15).astype("m8[m]"))
        np.testing.assert_array_equal(
            labels["hourly"]["time"], t0 - np.arange(180, -1, -60).astype("m8[m]")
        )
        np.testing.assert_array_equal(
            out["hourly"], sat["ir"].sel(time=labels["hourly"]["time"]).isel(
                y=slice(p[1], p[1] + 8), x=slice(p[2], p[2] + 8)).values
        )
        np.testing.assert_array_equal(
            out["sat"], sat["ir"].sel(time=slice(t0 - np.timedelta64(1, "h"), t0)).isel(
                y=slice(p[1], p[1] + 8), x=slice(p[2], p[2] + 8)).values
        )
        init = nwp.init_time.sel(init_time=t0, method="ffill", tolerance=pd.Timedelta("3h"))
        assert labels["nwp"]["init_time"][0] == init.values
        yy = nwp.y.sel(y=sat.y.values[p[1]], method="nearest").values
        assert labels["nwp"]["y"][0] == yy
        # The pv window: the reading at t0 (t0 on the hour exactly) and its neighbours.
        hour = pv.indexes["time"].get_loc(pd.Timestamp(t0))
        np.testing.assert_array_equal(out["pv"], pv["power"].isel(time=slice(hour - 2, hour + 2)).values)
        assert pd.Timestamp(t0).minute == 0  # exact alignment of pv drew only whole hours


def test_positions_as_labels_slices_and_explicit_times(ocf):
    sat, nwp, _ = ocf
    src = zcrop.Source(sat["ir"], crop={"time": 1, "y": 4, "x": 4})
    # A label slice restricts positions, inclusive as sel.
    s = zcrop.Samples(src, positions={"time": slice("2024-06-01 03:00", "2024-06-01 05:00"),
                                      "y": None, "x": None}, mode="epoch", stride=[1, 1, 1])
    times = {s.labels(i)["ir"]["time"][0] for i in range(0, len(s), 97)}
    assert len(s) == 9 * 29 * 29
    assert min(times) >= np.datetime64("2024-06-01T03:00") and max(times) <= np.datetime64("2024-06-01T05:00")
    # Explicit t0 times: the grid is those labels, each source aligns to them.
    t0s = pd.to_datetime(["2024-06-01 01:00", "2024-06-01 07:30", "2024-06-01 20:15"])
    s = zcrop.Samples(src, positions={"time": t0s, "y": None, "x": None}, mode="epoch",
                      stride=[1, 1, 1])
    assert len(s) == 3 * 29 * 29
    got = sorted({s.labels(i)["ir"]["time"][0] for i in range(len(s))})
    np.testing.assert_array_equal(got, t0s.values)
    # Loader meta carries the same labels, and valid_times filters explicit positions too.
    with zcrop.Loader(src, positions={"time": t0s, "y": None, "x": None}, batch_size=4, seed=1,
                      valid_times=t0s[1:], steps=3) as loader:
        for batch in loader:
            for m in batch["meta"]:
                assert m["sources"]["ir"]["labels"]["time"][0] in t0s.values[1:]


def test_loader_and_samples_agree_across_workers_and_restarts(ocf):
    sat, nwp, _ = ocf
    sources = {
        "sat": zcrop.Source(sat["ir"], crop={"y": 8, "x": 8}, window={"time": ("-1h", "0h")}),
        "nwp": zcrop.Source(nwp["t2m"], crop={"init_time": 1, "step": 2, "y": 2, "x": 2}, dims=["time", 0, "y", "x"],
                            align={"init_time": "previous", "y": "nearest", "x": "nearest"}),
    }
    kwargs = dict(positions=["time", "y", "x"], batch_size=3, seed=9)
    with zcrop.Loader(sources, workers=1, prefetch=1, steps=4, **kwargs) as a:
        first = [{k: v.copy() for k, v in b.items() if k != "meta"} for b in a]
    with zcrop.Loader(sources, workers=3, prefetch=4, start_step=2, steps=2, **kwargs) as b:
        resumed = [{k: v.copy() for k, v in x.items() if k != "meta"} for x in b]
    for x, y in zip(first[2:], resumed):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    s = zcrop.Samples(sources, positions=["time", "y", "x"], seed=9, length=12)
    for i in range(12):
        np.testing.assert_array_equal(s[i]["nwp"], first[i // 3]["nwp"][i % 3])


def same(a, b) -> bool:
    """Equal batches or meta: dicts and lists by item, numpy arrays by dtype, shape and bytes."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes() == b.tobytes())
    return type(a) is type(b) and a == b


def take(loader, n=None) -> list:
    """Batches of ``loader`` (all, or the next ``n``), copied out of its ring buffers."""
    out = []
    for b in loader:
        out.append({k: v if k == "meta" else v.copy() for k, v in b.items()})
        if n is not None and len(out) == n:
            break
    return out


# A fresh process builds the pickled loader arguments and writes its batches back.
RESTART = """
import pickle, sys
import zcrop
sources, kw = pickle.load(open(sys.argv[1], "rb"))
with zcrop.Loader(sources, **kw) as loader:
    batches = [{k: v if k == "meta" else v.copy() for k, v in b.items()} for b in loader]
pickle.dump(batches, open(sys.argv[2], "wb"))
"""


def test_aligned_masked_weighted_batches_are_identical_everywhere(ocf, tmp_path):
    """Three sources aligned by labels (a label-unit window, a forecast by init time, stations
    by exact hour), a DataArray valid= on a coarser (y, x) grid and DataArray weights= over
    time: batch k is the same bytes and meta (labels included) in a fresh process with another
    hash seed, after load_state_dict or seek, and whatever threads, prefetch and workers; and
    Samples gives the same samples."""
    sat, nwp, pv = ocf
    sources = {
        "sat": zcrop.Source(sat["ir"], crop={"y": 8, "x": 8}, window={"time": ("-1h", "0h")}),
        "nwp": zcrop.Source(nwp["t2m"], crop={"init_time": 1, "step": 2, "y": 2, "x": 2},
                            dims=["time", 0, "y", "x"],
                            align={"init_time": "previous", "y": "nearest", "x": "nearest"}),
        "pv": zcrop.Source(pv["power"], crop={}, window={"time": (-2, 2)}),
    }
    rng = np.random.default_rng(6)
    land = xr.DataArray(rng.random((4, 4)) < 0.6, dims=("y", "x"),
                        coords={"y": np.arange(3.5, 32.0, 8.0), "x": np.arange(3.5, 32.0, 8.0)})
    times = pd.date_range("2024-06-01", periods=9, freq="3h")
    busy = xr.DataArray(rng.random(9) + 0.2, dims="time", coords={"time": times})
    busy[4] = 0.0
    kw = dict(positions=["time", "y", "x"], valid=land, weights=busy, batch_size=3, seed=5,
              steps=6)
    base = take(zcrop.Loader(sources, **kw, prefetch=1, workers=1, threads=1))
    # Not vacuous: each draw is on the hour (pv aligns exactly), on land, of positive weight.
    for batch in base:
        for m in batch["meta"]:
            t0 = pd.Timestamp(sat.time.values[m["position"][0]])
            y, x = (float(sat[d].values[p]) for d, p in zip("yx", m["position"][1:]))
            assert t0.minute == 0 and bool(land.sel(y=y, x=x, method="nearest"))
            assert float(busy.sel(time=t0, method="nearest")) > 0
    for more in ({}, {"prefetch": 4, "workers": 3}, {"threads": 2, "pin": False}):
        assert same(take(zcrop.Loader(sources, **kw, **more)), base), more
    # A restart in a fresh process, another hash seed (no set or dict order leaks in).
    args, out = tmp_path / "args.pkl", tmp_path / "out.pkl"
    args.write_bytes(pickle.dumps((sources, kw)))
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", RESTART, str(args), str(out)], check=True, env=env,
                   timeout=120)
    assert same(pickle.loads(out.read_bytes()), base)
    # Resumed from a state saved by a loader with other settings, and by seek back and forth.
    first = zcrop.Loader(sources, **kw, workers=3, prefetch=2)
    take(first, 2)
    state = first.state_dict()
    first.close()
    resumed = zcrop.Loader(sources, **kw)
    resumed.load_state_dict(state)
    assert same(take(resumed), base[2:])
    with zcrop.Loader(sources, **kw, prefetch=3) as ld:
        ld.seek(4)
        assert same(take(ld, 1), base[4:5])
        ld.seek(1)
        assert same(take(ld), base[1:])
    # Samples: sample i is sample i of the loader, position, origins and data.
    s = zcrop.Samples(sources, positions=kw["positions"], valid=land, weights=busy, seed=5,
                      length=18)
    for i in range(18):
        got, want = s[i], base[i // 3]
        m = want["meta"][i % 3]
        assert list(got["meta"]["position"]) == m["position"]
        for name in sources:
            assert list(got["meta"]["origin"][name]) == m["sources"][name]["origin"]
            np.testing.assert_array_equal(got[name], want[name][i % 3])


def test_valid_windows_follow_aligned_and_stepped_sources(tmp_path):
    t = pd.date_range("2024-01-01", periods=40, freq="15min")
    path = write(tmp_path / "a.zarr", "v", ["time", "y"], {"time": t, "y": np.arange(12.0)}, (8, 12))
    ds = xr.open_dataset(path, engine="zcrop")
    raw = ds["v"].values.copy()
    # NaNs written through zarr-python under xarray's variable: frame 9 row 3, frame 22 row 7.
    import zarr

    arr = zarr.open_array(path + "/v")
    for f, r in ((9, 3), (22, 7)):
        raw[f, r] = np.nan
    arr[...] = raw
    ds = xr.open_dataset(path, engine="zcrop")
    src = zcrop.Source(ds["v"], crop={"y": 2}, window={"time": ("-2h", "0h")}, every={"time": 4})
    mask = zcrop.valid_windows(src, ["time", "y"], cache=False)
    s = zcrop.Samples(src, positions=["time", "y"], valid=mask, mode="epoch", stride=[1, 1])
    got = {tuple(int(x) for x in s[i]["meta"]["position"]) for i in range(len(s))}
    want = set()
    for p in range(40):
        start = p - 8
        if start < 0:
            continue
        for y in range(11):
            if not np.isnan(raw[start : p + 1 : 4, y : y + 2]).any():
                want.add((p, y))
    assert got == want


# --- bad input ---------------------------------------------------------------------------------


def test_bad_alignment_input_is_named(ocf, tmp_path):
    sat, nwp, pv = ocf
    positions = ["time", "y", "x"]
    sat_src = zcrop.Source(sat["ir"], crop={"time": 1, "y": 8, "x": 8})
    # A tolerance that leaves no position: rows half-way between the positions' rows.
    off = write(tmp_path / "off.zarr", "off", ["time", "y", "x"],
                {"time": sat.time.values, "y": np.arange(0.5, 32.0, 4.0), "x": np.arange(32.0)},
                (8, 8, 8))
    far = zcrop.Source(xr.open_dataset(off, engine="zcrop")["off"], crop={"time": 1, "y": 1, "x": 1},
                       align={"y": "nearest"}, tolerance={"y": 0.25})
    with pytest.raises(ValueError, match=r"source 'off' dimension 'y'.*no position.*tolerance 0.25"):
        zcrop.Samples([sat_src, far], positions=positions, length=1)
    # Two sources that each align, but never at the same position: hourly data on the hour
    # and on the half hour, by exact label. The error names both and the dimension.
    for i, start in enumerate(["2024-06-01 00:00", "2024-06-01 00:30"]):
        write(tmp_path / f"h{i}.zarr", f"h{i}", ["time", "y", "x"],
              {"time": pd.date_range(start, periods=24, freq="h"), "y": np.arange(32.0),
               "x": np.arange(32.0)}, (8, 8, 8))
    hourly = [zcrop.Source(xr.open_dataset(tmp_path / f"h{i}.zarr", engine="zcrop")[f"h{i}"],
                           crop={"time": 1, "y": 2, "x": 2}) for i in range(2)]
    disjoint = (r"along position dimension 'time' have no position in common: "
                r"source 'h0' dimension 'time' \(align 'exact'\) aligns at 24 of 96 positions "
                r"\(2024-06-01T00:00, 2024-06-01T01:00, .*; source 'h1' dimension 'time' "
                r"\(align 'exact'\) aligns at 24 of 96 positions \(2024-06-01T00:30, ")
    for make in (lambda: zcrop.Samples([sat_src, *hourly], positions=positions, length=1),
                 lambda: zcrop.Loader([sat_src, *hourly], positions=positions),
                 lambda: zcrop.valid_windows([sat_src, *hourly], positions, cache=False)):
        with pytest.raises(zcrop.InvalidArgumentError, match=disjoint):
            make()
    # Whole windows, not labels, keep them apart: the previous hour with 2 hours of history
    # fits from t0 = 02:00 on, the next half hour with 23 hours ahead only up to 01:30.
    late = zcrop.Source(xr.open_dataset(tmp_path / "h0.zarr", engine="zcrop")["h0"],
                        crop={"y": 2, "x": 2}, align={"time": "previous"},
                        window={"time": (-2, 1)})
    ahead = zcrop.Source(xr.open_dataset(tmp_path / "h1.zarr", engine="zcrop")["h1"],
                         crop={"time": 23, "y": 2, "x": 2}, align={"time": "next"})
    with pytest.raises(ValueError, match=r"source 'h0' dimension 'time' \(align 'previous'\) "
                                         r"aligns at 88 of 96 positions \(2024-06-01T02:00, .*"
                                         r"source 'h1' dimension 'time' \(align 'next'\) "
                                         r"aligns at 7 of 96 positions"):
        zcrop.Samples([sat_src, late, ahead], positions=positions, length=1)
    # A coordinate that is not monotonic.
    t = pd.to_datetime(["2024-06-01 00:00", "2024-06-01 02:00", "2024-06-01 01:00"])
    bad = write(tmp_path / "bad.zarr", "b", ["time", "y", "x"],
                {"time": t, "y": np.arange(32.0), "x": np.arange(32.0)}, (3, 8, 8))
    src = zcrop.Source(xr.open_dataset(bad, engine="zcrop")["b"], crop={"time": 1, "y": 2, "x": 2})
    with pytest.raises(ValueError, match=r"source 'b' dimension 'time'.*not strictly monotonic"):
        zcrop.Samples([sat_src, src], positions=positions, length=1)
    # Unknown names, rules and units.
    with pytest.raises(ValueError, match=r"align names \['tim'\]"):
        zcrop.Source(sat["ir"], crop={"y": 8}, align={"tim": "nearest"})
    with pytest.raises(ValueError, match="align must be one of"):
        zcrop.Source(sat["ir"], crop={"y": 8}, align="closest")
    with pytest.raises(TypeError, match="give a timedelta"):
        zcrop.Source(sat["ir"], crop={"y": 8}, window={"time": (-1.5, 0.0)})
    with pytest.raises(ValueError, match="window .* is empty"):
        zcrop.Source(sat["ir"], crop={"y": 8}, window={"time": (2, 2)})
    with pytest.raises(ValueError, match="every must be at least 1"):
        zcrop.Source(sat["ir"], crop={"y": 8}, every={"time": 0})
    # Label-unit windows need a regular coordinate.
    with pytest.raises(ValueError, match="regularly spaced"):
        zcrop.Source(xr.open_dataset(bad, engine="zcrop")["b"], crop={"y": 2},
                     window={"time": ("-1h", "0h")})
    # A path source cannot follow labelled positions by index, nor take align=.
    with pytest.raises(ValueError, match="by index"):
        zcrop.Samples([sat_src, zcrop.Source(str(tmp_path / "bad.zarr" / "b"), crop=[1, 2, 2])],
                      positions={"time": sat.time.values[:3], "y": None, "x": None}, length=1)
    with pytest.raises(ValueError, match="align= aligns by coordinate labels"):
        zcrop.Source(str(tmp_path / "bad.zarr" / "b"), crop=[1, 2, 2], align="nearest")
    # A scale on a labelled dimension contradicts its labels.
    with pytest.raises(ValueError, match="drop the scale"):
        zcrop.Samples([sat_src, zcrop.Source(pv["power"], crop={"time": 1},
                                             dims=[zcrop.Dim.along("time").scale(1, 4), 0])],
                      positions=positions, length=1)
    # A label slice outside the coordinate.
    with pytest.raises(ValueError, match="selects no label"):
        zcrop.Samples(sat_src, positions={"time": slice("2030-01-01", None), "y": None, "x": None},
                      length=1)


def test_a_typo_in_a_position_name_lists_the_names(ocf):
    sat, _, _ = ocf
    src = zcrop.Source(sat["ir"], crop={"time": 1, "y": 8, "x": 8})
    with pytest.raises(ValueError, match=r"position 'yy' is not a dimension.*did you mean 'y'"):
        zcrop.Samples(src, positions=["time", "yy", "x"], length=1)
    with pytest.raises(ValueError, match=r"position 'tme' .*'channel', 'time', 'x', 'y'"):
        zcrop.Samples(src, positions={"tme": None, "y": None, "x": None}, length=1)
    bad = zcrop.Source(sat["ir"], crop={"time": 1, "y": 8, "x": 8}, dims=["tim", 0, "y", "x"])
    with pytest.raises(ValueError, match=r"follows 'tim' in dims=.*did you mean 'time'"):
        zcrop.Samples(bad, positions=["time", "y", "x"], length=1)


def test_channels_selected_by_label(ocf, tmp_path):
    sat, _, _ = ocf
    raw = sat["ir"]
    # Text labels: a dataset whose channels have names.
    named = raw.assign_coords(channel=["IR_108", "VIS_006", "WV_062"]).to_dataset()
    vals = named["ir"].values.copy()
    vals[:, 1] = np.nan  # VIS_006 missing everywhere: not selected, so it must not matter
    vals[10, 2, 5, 5] = np.nan
    named["ir"].values = vals
    path = tmp_path / "named.zarr"
    named.to_zarr(str(path), mode="w", zarr_format=3)
    ds = xr.open_dataset(str(path), engine="zcrop")
    src = zcrop.Source(ds["ir"], crop={"time": 2, "y": 4, "x": 4},
                       select={"channel": ["WV_062", "IR_108"]}, every={"time": 3})
    s = zcrop.Samples(src, positions=["time", "y", "x"], seed=2, length=6)
    for i in range(6):
        out = s[i]
        t, y, x = (int(v) for v in out["meta"]["position"])
        want = ds["ir"].isel(time=[t, t + 3], y=slice(y, y + 4), x=slice(x, x + 4)).sel(
            channel=["WV_062", "IR_108"])
        np.testing.assert_array_equal(out["ir"], want.values)
        assert list(s.labels(i)["ir"]["channel"]) == ["WV_062", "IR_108"]
    # Only windows clean in the selected channels count: NaN in the unselected one is ignored.
    mask = zcrop.valid_windows(src, ["time", "y", "x"], cache=False)
    sel = vals[:, [2, 0]]
    want = np.zeros(mask.shape, dtype=bool)
    for t in range(96 - 3):
        for y in range(32 - 3):
            for x in range(32 - 3):
                want[t, y, x] = not np.isnan(sel[[t, t + 3], :, y : y + 4, x : x + 4]).any()
    np.testing.assert_array_equal(mask.to_numpy(), want)
    assert 0 < mask.count() < 93 * 29 * 29
    with pytest.raises(ValueError, match=r"\['IR_999'\] not among its labels"):
        zcrop.Source(ds["ir"], crop={"time": 1}, select={"channel": ["IR_999"]})
    with pytest.raises(ValueError, match="takes no window or every"):
        zcrop.Source(ds["ir"], crop={"time": 1}, select={"channel": [0]}, every={"channel": 2})


def test_longitude_wraps_around(tmp_path):
    lon = np.arange(0.0, 360.0, 10.0)
    path = write(tmp_path / "g.zarr", "t", ["time", "lat", "lon"],
                 {"time": pd.date_range("2024-01-01", periods=4, freq="6h"),
                  "lat": np.arange(-30.0, 40.0, 10.0), "lon": lon}, (2, 7, 12))
    raw = zcrop.open(path + "/t")[...]
    raw[1, 3, 35] = np.nan
    import zarr

    zarr.open_array(path + "/t")[...] = raw
    ds = xr.open_dataset(path, engine="zcrop")
    src = zcrop.Source(ds["t"], crop={"time": 1, "lat": 2, "lon": 6}, wrap="lon")
    s = zcrop.Samples(src, positions=["time", "lat", "lon"], mode="epoch", stride=[1, 1, 1])
    assert len(s) == 4 * 6 * 36  # every longitude is a position
    for i in range(0, len(s), 7):
        out = s[i]
        t, y, x = (int(v) for v in out["meta"]["position"])
        cols = (x + np.arange(6)) % 36
        np.testing.assert_array_equal(out["t"], raw[t : t + 1, y : y + 2][..., cols])
        np.testing.assert_array_equal(s.labels(i)["t"]["lon"], lon[cols])
    # valid_windows wraps too: the NaN at lon index 35 spoils windows starting at 30..35.
    mask = zcrop.valid_windows(src, ["time", "lat", "lon"], cache=False).to_numpy()
    want = np.zeros((4, 7, 36), dtype=bool)  # the grid: every lat; the last starts no window
    for x in range(36):
        cols = (x + np.arange(6)) % 36
        for y in range(6):
            want[:, y, x] = ~np.isnan(raw[:, y : y + 2][..., cols]).any(axis=(1, 2))
    np.testing.assert_array_equal(mask, want)
    assert not want[1, 3, 32] and want[1, 3, 29]


def test_windows_on_fixed_dimensions_start_where_they_say(ocf):
    _, nwp, _ = ocf
    sat = ocf[0]
    ref = zcrop.Source(sat["ir"], crop={"time": 1, "y": 8, "x": 8})
    # Steps 2..5 of the forecast: a window in steps on a dimension that follows no position.
    src = zcrop.Source(nwp["t2m"], crop={"init_time": 1, "y": 2, "x": 2},
                       window={"step": (2, 6)}, dims=["time", 0, "y", "x"],
                       align={"init_time": "previous", "y": "nearest", "x": "nearest"})
    s = zcrop.Samples([ref, src], positions=["time", "y", "x"], seed=1, length=4)
    for i in range(4):
        o = [int(v) for v in s[i]["meta"]["origin"]["t2m"]]
        assert o[1] == 2 and s[i]["t2m"].shape == (1, 4, 2, 2)
        want = nwp["t2m"].isel(init_time=slice(o[0], o[0] + 1), step=slice(2, 6),
                               y=slice(o[2], o[2] + 2), x=slice(o[3], o[3] + 2))
        np.testing.assert_array_equal(s[i]["t2m"], want.values)
    with pytest.raises(ValueError, match="follows no position"):
        zcrop.Samples([ref, zcrop.Source(nwp["t2m"], crop={"init_time": 1, "y": 2, "x": 2},
                                         window={"step": (1.0, 3.0)},
                                         dims=["time", 0, "y", "x"],
                                         align={"init_time": "previous", "y": "nearest",
                                                "x": "nearest"})],
                      positions=["time", "y", "x"], length=1)


def test_periodic_sources_align_across_longitude_conventions(tmp_path):
    """Positions labelled -180..180 (a satellite grid) align with a 0..360 analysis that
    wraps, nearest across the seam included, as xarray would after converting the labels."""
    t = pd.date_range("2024-01-01", periods=2, freq="6h")
    pos_lon = np.arange(-180.0, 180.0, 2.5)
    sat = write(tmp_path / "s.zarr", "s", ["time", "lon"], {"time": t, "lon": pos_lon}, (2, 36))
    era_lon = np.arange(0.0, 360.0, 10.0)
    era = write(tmp_path / "e.zarr", "e", ["time", "lon"], {"time": t, "lon": era_lon}, (2, 36))
    s_ds = xr.open_dataset(sat, engine="zcrop")
    e_ds = xr.open_dataset(era, engine="zcrop")
    srcs = [
        zcrop.Source(s_ds["s"], crop={"time": 1, "lon": 4}, wrap="lon"),
        zcrop.Source(e_ds["e"], crop={"time": 1, "lon": 3}, wrap="lon", align={"lon": "nearest"}),
    ]
    s = zcrop.Samples(srcs, positions=["time", "lon"], mode="epoch", stride=[1, 1])
    assert len(s) == 2 * len(pos_lon)
    idx = pd.Index(np.append(era_lon, 360.0))
    for i in range(len(s)):
        plan = s._native.plan(i)[0]
        p = plan["position"][1]
        want = idx.get_indexer([pos_lon[p] % 360.0], method="nearest")[0] % 36
        assert plan["sources"]["e"]["origin"][1] == want, (pos_lon[p], want)


@pytest.mark.parametrize("budget", [1, 1 << 20])
def test_valid_windows_stream_along_a_periodic_first_position(tmp_path, budget):
    """Longitude listed first: valid_windows streams along it, reading rows past its end from
    its start, for a source that follows it one to one and one aligned by labels (-180..180
    positions on a 0..360 grid, whose table crosses the seam)."""
    t = pd.date_range("2024-01-01", periods=3, freq="6h")
    pos_lon = np.arange(-180.0, 180.0, 5.0)
    era_lon = np.arange(0.0, 360.0, 5.0)
    sat = write(tmp_path / "s.zarr", "s", ["time", "lon"], {"time": t, "lon": pos_lon}, (3, 8))
    era = write(tmp_path / "e.zarr", "e", ["time", "lon"], {"time": t, "lon": era_lon}, (3, 8))
    import zarr

    rng = np.random.default_rng(3)
    raw = {}
    for name, path in (("s", sat), ("e", era)):
        data = zcrop.open(path + "/" + name)[...]
        data[rng.random(data.shape) < 0.04] = np.nan
        zarr.open_array(path + "/" + name)[...] = data
        raw[name] = data
    s_ds = xr.open_dataset(sat, engine="zcrop")
    e_ds = xr.open_dataset(era, engine="zcrop")
    srcs = [
        zcrop.Source(s_ds["s"], crop={"time": 2, "lon": 5}, wrap="lon"),
        zcrop.Source(e_ds["e"], crop={"time": 1, "lon": 7}, wrap="lon",
                     window={"lon": (-3, 4)}),
    ]
    mask = zcrop.valid_windows(srcs, ["lon", "time"], budget=budget, cache=False).to_numpy()
    n = len(pos_lon)
    want = np.zeros((n, 3), dtype=bool)
    for x in range(n):
        e0 = int(np.flatnonzero(np.isclose(era_lon, pos_lon[x] % 360.0))[0])
        for ti in range(2):  # the satellite window takes 2 steps
            sat_ok = ~np.isnan(raw["s"][ti : ti + 2, (x + np.arange(5)) % n]).any()
            era_ok = ~np.isnan(raw["e"][ti, (e0 - 3 + np.arange(7)) % n]).any()
            want[x, ti] = sat_ok and era_ok
    np.testing.assert_array_equal(mask, want)
    assert want.any() and not want.all()
