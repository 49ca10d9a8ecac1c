"""The xarray backend (``engine="zcrop"``) against xarray's own Zarr backend, on stores that
xarray itself wrote: Zarr v2 and v3, sharded and not, consolidated and not, CF-packed and
NaN-filled variables, datetime coordinates, non-dimension coordinates, groups.

``xr.open_zarr`` is the oracle: the dataset, its encodings, dask chunks, CF decoding and every
selection must be identical.
"""

from __future__ import annotations

import pathlib
import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

xr = pytest.importorskip("xarray")
pytest.importorskip("dask")

import zcrop  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")


def era5_like() -> xr.Dataset:
    """(time, level, latitude, longitude) with descending latitude, NaNs, a CF-packed int16
    variable, a boolean mask, a scalar and a non-dimension coordinate."""
    rng = np.random.default_rng(29)
    time = pd.date_range("2021-01-01", periods=12, freq="6h")
    level = np.array([1000, 850, 500], dtype="int32")
    lat = np.linspace(90, -90, 19)
    lon = np.arange(0, 360, 10.0)
    shape = (time.size, level.size, lat.size, lon.size)
    t = (250 + 30 * rng.random(shape)).astype("float32")
    t[0, 0, :2] = np.nan
    q = (rng.random(shape) * 0.02).astype("float64")
    q[1, 1, 3, :5] = np.nan
    ds = xr.Dataset(
        {
            "t": (("time", "level", "latitude", "longitude"), t, {"units": "K"}),
            "q": (("time", "level", "latitude", "longitude"), q, {"units": "kg kg-1"}),
            "lsm": (("latitude", "longitude"), rng.random((lat.size, lon.size)) > 0.6),
            "co2": ((), np.float64(415.2)),
        },
        coords={
            "time": time,
            "level": ("level", level, {"units": "hPa"}),
            "latitude": ("latitude", lat, {"units": "degrees_north"}),
            "longitude": ("longitude", lon, {"units": "degrees_east"}),
            "valid_time": ("time", time + pd.Timedelta("1h")),
            "step": ("time", (np.arange(time.size) * 3600).astype("timedelta64[s]")),
        },
        attrs={"title": "ERA5-like", "institution": "zcrop tests"},
    )
    ds["q"].encoding = {
        "dtype": "int16",
        "scale_factor": 1e-6,
        "add_offset": 0.01,
        "_FillValue": np.int16(-32768),
    }
    return ds


def satellite_like() -> xr.Dataset:
    """(time every 15 minutes, channel, y, x) uint16 imagery with a fill value."""
    rng = np.random.default_rng(30)
    time = pd.date_range("2024-06-01T06:00", periods=8, freq="15min")
    data = rng.integers(1, 4000, size=(8, 3, 40, 48), dtype="uint16")
    data[:, :, :6, :] = 0
    ds = xr.Dataset(
        {"radiance": (("time", "channel", "y", "x"), data, {"_FillValue": np.uint16(0)})},
        coords={
            "time": time,
            "channel": ("channel", np.array(["IR_108", "VIS_006", "WV_062"])),
            "band": ("channel", np.array([b"ir", b"vis", b"wv"], dtype="S3")),
            "wavelength": ("channel", np.array([10.8, 0.6, 6.2])),
            "y": np.arange(40) * 2000.0,
            "x": np.arange(48) * 2000.0,
        },
    )
    return ds


#: name -> (zarr_format, consolidated, encoding maker)
LAYOUTS = {
    "v2": (2, True, lambda ds: {}),
    "v2-plain": (2, False, lambda ds: {}),
    "v3": (3, False, lambda ds: {}),
    "v3-consolidated": (3, True, lambda ds: {}),
    "v3-sharded": (
        3,
        False,
        lambda ds: {
            name: {
                "chunks": tuple(max(1, s // 4) if s > 4 else s for s in v.shape),
                "shards": tuple(max(1, s // 4) * 2 if s > 4 else s for s in v.shape),
            }
            for name, v in ds.data_vars.items()
            if v.ndim >= 2
        },
    ),
}
DATASETS = {"era5": era5_like, "satellite": satellite_like}


def write(ds: xr.Dataset, path: pathlib.Path, layout: str) -> pathlib.Path:
    fmt, consolidated, encoding = LAYOUTS[layout]
    if layout != "v3-sharded":
        # Small chunks, so that selections cross chunk boundaries.
        ds = ds.chunk({d: max(1, n // 3) for d, n in ds.sizes.items()})
        for v in ds.variables.values():
            v.encoding.pop("chunks", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(
            path, mode="w", zarr_format=fmt, consolidated=consolidated, encoding=encoding(ds)
        )
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], pathlib.Path]:
    root = tmp_path_factory.mktemp("xr-corpus")
    return {
        (d, lay): write(make(), root / f"{d}-{lay}.zarr", lay)
        for d, make in DATASETS.items()
        for lay in LAYOUTS
    }


CASES = [(d, lay) for d in DATASETS for lay in LAYOUTS]


def open_both(path: pathlib.Path, **kwargs):
    ours = xr.open_dataset(path, engine="zcrop", **kwargs)
    chunks = kwargs.pop("chunks", None)
    theirs = xr.open_zarr(path, chunks=chunks, **kwargs)
    return ours, theirs


def same_encoding(a: xr.Dataset, b: xr.Dataset) -> None:
    for name in b.variables:
        assert repr(a[name].encoding) == repr(b[name].encoding), name


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_dataset_is_identical_to_open_zarr(corpus, case):
    ours, theirs = open_both(corpus[case])
    assert all(
        not isinstance(v.variable._data, np.ndarray) for v in ours.data_vars.values() if v.ndim
    ), "data variables are lazy until loaded"
    same_encoding(ours, theirs)
    xr.testing.assert_identical(ours.load(), theirs.load())


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_dask_chunks_and_compute_match(corpus, case):
    ours, theirs = open_both(corpus[case], chunks={})
    assert {k: v.chunks for k, v in ours.variables.items()} == {
        k: v.chunks for k, v in theirs.variables.items()
    }
    xr.testing.assert_identical(ours.compute(), theirs.compute())
    # dask's process scheduler pickles each task's backend array and reads in other processes.
    np.testing.assert_array_equal(
        ours["t" if "t" in ours else "radiance"].data.compute(scheduler="processes"),
        theirs["t" if "t" in theirs else "radiance"].values,
    )


@pytest.mark.parametrize("case", [("era5", "v2"), ("era5", "v3-sharded")], ids=str)
def test_without_cf_decoding(corpus, case):
    ours, theirs = open_both(corpus[case], decode_cf=False)
    xr.testing.assert_identical(ours.load(), theirs.load())
    ours, theirs = open_both(corpus[case], mask_and_scale=False, decode_times=False)
    xr.testing.assert_identical(ours.load(), theirs.load())


def test_drop_variables_and_group_errors(corpus):
    path = corpus[("era5", "v3")]
    ours, theirs = open_both(path, drop_variables=["q", "lsm"])
    xr.testing.assert_identical(ours.load(), theirs.load())
    with pytest.raises(FileNotFoundError):
        xr.open_dataset(path.parent / "absent.zarr", engine="zcrop")
    with pytest.raises((FileNotFoundError, KeyError)):
        xr.open_dataset(path, engine="zcrop", group="absent")


def test_consolidated_true_without_consolidated_metadata_raises(corpus):
    with pytest.raises(ValueError, match="consolidated"):
        xr.open_dataset(corpus[("era5", "v3")], engine="zcrop", consolidated=True)


def test_engine_is_registered_and_shorthand_opens():
    assert "zcrop" in xr.backends.list_engines()
    assert hasattr(zcrop, "open_dataset") and hasattr(zcrop, "open_datatree")


def test_shorthand_is_the_engine(corpus):
    path = corpus[("satellite", "v3")]
    xr.testing.assert_identical(
        zcrop.open_dataset(path).load(), xr.open_dataset(path, engine="zcrop").load()
    )


def test_opening_reads_no_data_chunk(corpus, tmp_path):
    """Every chunk of the data variables is replaced by garbage before opening: opening (which
    loads the index coordinates, as xr.open_zarr does) still works; loading a variable then
    fails with a typed error naming the chunk."""
    src = corpus[("satellite", "v3")]
    import shutil

    path = tmp_path / "garbled.zarr"
    shutil.copytree(src, path)
    chunks = [p for p in (path / "radiance" / "c").rglob("*") if p.is_file()]
    assert chunks
    for p in chunks:
        p.write_bytes(b"\x28\xb5\x2f\xfd garbage, not a zstd frame")
    ds = xr.open_dataset(path, engine="zcrop")
    assert ds.sizes["time"] == 8
    np.testing.assert_array_equal(ds.x.values, np.arange(48) * 2000.0)
    with pytest.raises(zcrop.ZcropError, match=r"radiance"):
        ds.radiance.load()


def test_load_async(corpus):
    import asyncio

    path = corpus[("era5", "v3-sharded")]
    ours, theirs = open_both(path)

    async def load():
        return await ours.load_async()

    xr.testing.assert_identical(asyncio.run(load()), theirs.load())
    sub = ours.t.isel(time=[0, 3], latitude=slice(2, 9))

    async def load_sub():
        return await sub.load_async()

    xr.testing.assert_identical(
        asyncio.run(load_sub()), theirs.t.isel(time=[0, 3], latitude=slice(2, 9)).load()
    )


def test_backend_array_pickles(corpus):
    path = corpus[("era5", "v3")]
    ds = xr.open_dataset(path, engine="zcrop")
    wrapper = ds.t.variable._data.array
    clone = pickle.loads(pickle.dumps(wrapper))
    assert clone.shape == wrapper.shape and clone.dtype == wrapper.dtype
    from xarray.core import indexing

    key = indexing.BasicIndexer((slice(None),) * len(clone.shape))
    np.testing.assert_array_equal(clone[key], xr.open_zarr(path).t.variable.values)


def test_datatree_is_identical_to_open_datatree(tmp_path):
    tree = xr.DataTree.from_dict(
        {
            "/": xr.Dataset(attrs={"title": "tree"}),
            "/surface": satellite_like(),
            "/upper": era5_like().drop_vars(["lsm", "co2"]),
            "/upper/mean": era5_like()[["t"]].mean("time", keep_attrs=True),
            "/coarse": era5_like().isel(latitude=slice(None, None, 3)).drop_vars("q"),
        }
    )
    for fmt in (2, 3):
        path = tmp_path / f"tree-v{fmt}.zarr"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree.to_zarr(path, zarr_format=fmt)
        ours = xr.open_datatree(path, engine="zcrop")
        theirs = xr.open_datatree(path, engine="zarr")
        xr.testing.assert_identical(ours.load(), theirs.load())
        sub = xr.open_dataset(path, engine="zcrop", group="upper/mean")
        xr.testing.assert_identical(
            sub.load(), xr.open_zarr(path, group="upper/mean", chunks=None).load()
        )
        subtree = xr.open_datatree(path, engine="zcrop", group="upper")
        xr.testing.assert_identical(
            subtree.load(), xr.open_datatree(path, engine="zarr", group="upper").load()
        )


def test_a_variable_zcrop_cannot_read_is_named_at_open(tmp_path):
    import json

    path = tmp_path / "odd.zarr"
    satellite_like().to_zarr(path, zarr_format=3, consolidated=False)
    meta = path / "radiance" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"].append({"name": "made_up_codec", "configuration": {}})
    meta.write_text(json.dumps(doc))
    with pytest.raises(zcrop.UnsupportedError, match="radiance"):
        xr.open_dataset(path, engine="zcrop")
    ds = xr.open_dataset(path, engine="zcrop", drop_variables=["radiance"])
    assert "radiance" not in ds and ds.sizes["time"] == 8


def test_not_a_zarr_store(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not zarr")
    with pytest.raises(FileNotFoundError):
        xr.open_dataset(tmp_path / "plain", engine="zcrop")
    backend = xr.backends.list_engines()["zcrop"]
    assert not backend.guess_can_open(str(tmp_path / "plain"))
    assert backend.guess_can_open("s3://bucket/data.zarr")


SELECT_CASES = [("era5", "v2"), ("era5", "v3-sharded"), ("satellite", "v3")]


@st.composite
def indexers(draw, sizes: dict[str, int]):
    """An ``isel`` indexer: per dimension nothing, an integer, a slice (with step) or an array
    of integers (unsorted, repeated, negative)."""
    out = {}
    for dim, n in sizes.items():
        kind = draw(st.sampled_from(["none", "int", "slice", "array"]))
        if kind == "int":
            out[dim] = draw(st.integers(-n, n - 1))
        elif kind == "slice":
            a = draw(st.integers(0, n))
            b = draw(st.integers(0, n))
            out[dim] = slice(min(a, b), max(a, b), draw(st.integers(1, 3)))
        elif kind == "array":
            out[dim] = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=5))
    return out


@pytest.mark.parametrize("case", SELECT_CASES, ids=["-".join(c) for c in SELECT_CASES])
def test_random_isel_matches_open_zarr(corpus, case):
    ours, theirs = open_both(corpus[case])
    name = "t" if "t" in ours else "radiance"
    sizes = dict(ours[name].sizes)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(indexers(sizes))
    def check(idx):
        xr.testing.assert_identical(ours[name].isel(idx).load(), theirs[name].isel(idx).load())

    check()


def _siblings(ds, name):
    """The read-together group of variable ``name`` of a dataset opened with engine="zcrop"."""
    from zcrop._xarray import ZcropBackendArray

    data = ds[name].variable._data
    while not isinstance(data, ZcropBackendArray):
        data = data.array
    return data._group


@pytest.mark.parametrize("case", SELECT_CASES, ids=["-".join(c) for c in SELECT_CASES])
def test_random_dataset_windows_match_open_zarr(corpus, case):
    # Whole-dataset loads read the variables over the same dimensions together, started ahead
    # once the pattern shows; any sequence of windows and of variable subsets gives the values
    # xarray's own backend gives.
    ours, theirs = open_both(corpus[case])
    names = [n for n in ours.data_vars if ours[n].ndim == 4]
    sizes = dict(ours[names[0]].sizes)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(indexers(sizes), st.sampled_from([names, names[:1], names[::-1]])),
                    min_size=1, max_size=6))
    def check(steps):
        for idx, subset in steps:
            xr.testing.assert_identical(ours[subset].isel(idx).load(),
                                        theirs[subset].isel(idx).load())

    check()


def test_variables_of_a_window_are_read_together_only_while_asked_together(corpus):
    ours, theirs = open_both(corpus[("era5", "v3-sharded")])
    group = _siblings(ours, "t")
    assert _siblings(ours, "q") is group and _siblings(ours, "lsm") is not group
    windows = iter([dict(time=slice(i, i + 2), latitude=slice(2, 12)) for i in range(11)])

    def load(names=None):
        w = next(windows)
        pick = (lambda d: d) if names is None else (lambda d: d[names])
        xr.testing.assert_identical(pick(ours).isel(w).load(), pick(theirs).isel(w).load())

    for _ in range(4):
        load()
    # Windows 2-4 started "q" ahead when "t" read them, and "q" took those results.
    assert (group.started, group.taken) == (3, 3)
    # One variable: the read started ahead for "q" goes unused (a strike), and reading ahead
    # stops until two variables read one window again.
    load(["t"])
    load(["t"])
    assert (group.started, group.taken, group.strikes, group.active) == (4, 3, 1, False)
    load()
    load()
    assert (group.started, group.taken) == (5, 4)
    load(["t"])
    load(["t"])
    load()
    # A second strike: the group reads only what it is asked from now on.
    assert (group.started, group.strikes, group.active) == (6, 2, False)


def test_a_corrupt_chunk_read_together_names_its_variable(corpus, tmp_path):
    # "q" is read together with "t" once the pattern shows; a garbled chunk of "q" fails that
    # batch, and the error comes from "q"'s own read, naming its key; "t" still reads.
    import shutil

    path = tmp_path / "garbled.zarr"
    shutil.copytree(corpus[("era5", "v3")], path)
    ours = xr.open_dataset(path, engine="zcrop", chunk_cache=0)
    theirs = xr.open_zarr(corpus[("era5", "v3")])
    group = _siblings(ours, "t")
    for i in range(2):
        ours[["t", "q"]].isel(time=slice(i, i + 2)).load()
    assert group.active
    garbled = [p for p in (path / "q" / "c" / "2").rglob("*") if p.is_file()]
    assert garbled
    for p in garbled:
        p.write_bytes(b"\x28\xb5\x2f\xfd garbage, not a zstd frame")
    window = dict(time=slice(8, 10), latitude=slice(3, 9))
    with pytest.raises(zcrop.ZcropError, match=r"q/c/2"):
        ours[["t", "q"]].isel(window).load()
    assert group.started == 2
    xr.testing.assert_identical(ours["t"].isel(window).load(), theirs["t"].isel(window).load())


def test_datasets_pickle_lazy_and_loaded(corpus):
    ours, theirs = open_both(corpus[("era5", "v3-sharded")])
    window = dict(time=slice(1, 3), latitude=slice(2, 12))
    ours.isel(window).load()
    ours.isel(window).load()  # its read-ahead group is active now
    lazy = pickle.loads(pickle.dumps(ours))
    xr.testing.assert_identical(lazy.isel(window).load(), theirs.isel(window).load())
    loaded = pickle.loads(pickle.dumps(ours.isel(window).load()))
    xr.testing.assert_identical(loaded, theirs.isel(window).load())
    lazy.close()


def _load_in_child(ds, window, out):
    out.put(ds.isel(window).load())


def test_a_forked_child_reads_a_window_the_parent_read_ahead(corpus):
    import multiprocessing

    ours, theirs = open_both(corpus[("era5", "v3-sharded")])
    windows = [dict(time=slice(i, i + 2), latitude=slice(2, 12)) for i in range(4)]
    for w in windows[:2]:
        ours.isel(w).load()
    ours["t"].isel(windows[2]).load()  # "q" of window 2 started ahead, left pending at fork
    assert _siblings(ours, "t").pending
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_load_in_child, args=(ours, windows[2], out))
    child.start()
    got = out.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0
    xr.testing.assert_identical(got, theirs.isel(windows[2]).load())


@pytest.mark.parametrize("case", SELECT_CASES, ids=["-".join(c) for c in SELECT_CASES])
def test_random_vectorized_isel_matches_open_zarr(corpus, case):
    ours, theirs = open_both(corpus[case])
    name = "t" if "t" in ours else "radiance"
    dims = list(ours[name].dims)
    sizes = dict(ours[name].sizes)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        npoints = data.draw(st.integers(1, 6))
        chosen = data.draw(st.lists(st.sampled_from(dims), min_size=1, unique=True))
        idx = {
            d: xr.DataArray(
                data.draw(st.lists(st.integers(0, sizes[d] - 1), min_size=npoints, max_size=npoints)),
                dims="points",
            )
            for d in chosen
        }
        for d in dims:
            if d not in idx and data.draw(st.booleans()):
                idx[d] = slice(0, data.draw(st.integers(1, sizes[d])))
        xr.testing.assert_identical(ours[name].isel(idx).load(), theirs[name].isel(idx).load())

    check()


def test_sel_by_labels(corpus):
    ours, theirs = open_both(corpus[("era5", "v3")])
    sel = dict(
        time=slice("2021-01-01T06", "2021-01-02T12"),
        latitude=slice(60, -30),
        longitude=[10.0, 200.0, 350.0],
        level=850,
    )
    xr.testing.assert_identical(ours.sel(sel).load(), theirs.sel(sel).load())
    near = dict(latitude=41.3, longitude=12.9)
    xr.testing.assert_identical(
        ours.t.sel(near, method="nearest").load(), theirs.t.sel(near, method="nearest").load()
    )


def test_object_store(s3, corpus):
    for case in [("era5", "v2"), ("satellite", "v3-sharded")]:
        prefix = "-".join(case)
        s3.upload_tree("xarray", corpus[case], f"{prefix}.zarr")
        url = f"s3://xarray/{prefix}.zarr"
        ours = xr.open_dataset(url, engine="zcrop", storage_options=s3.options)
        local = xr.open_dataset(corpus[case], engine="zcrop")
        starts = {"time": [0, 3, 4], "x" if "x" in ours.dims else "longitude": [1, 0, 5]}
        sizes = {d: 3 for d in starts}
        xr.testing.assert_identical(
            zcrop.read_windows(ours, starts, sizes), zcrop.read_windows(local, starts, sizes)
        )
        xr.testing.assert_identical(ours.load(), xr.open_zarr(corpus[case], chunks=None).load())


@st.composite
def windows(draw, sizes: dict[str, int]):
    """``(starts, sizes)`` of 1 to 6 windows over a random subset of the dimensions."""
    dims = draw(st.lists(st.sampled_from(sorted(sizes)), min_size=1, unique=True))
    n = draw(st.integers(1, 6))
    size = {d: draw(st.integers(1, sizes[d])) for d in dims}
    starts = {
        d: draw(st.lists(st.integers(0, sizes[d] - size[d]), min_size=n, max_size=n))
        for d in dims
    }
    return starts, size


@pytest.mark.parametrize("case", SELECT_CASES, ids=["-".join(c) for c in SELECT_CASES])
def test_read_windows_equals_isel_per_window(corpus, case):
    ours, theirs = open_both(corpus[case])

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(windows(dict(ours.sizes)))
    def check(spec):
        starts, size = spec
        got = zcrop.read_windows(ours, starts, size)
        n = len(next(iter(starts.values())))
        assert got.sizes["sample"] == n
        for i in range(n):
            sel = {d: slice(starts[d][i], starts[d][i] + size[d]) for d in starts}
            want = theirs.isel(sel)
            for name, var in theirs.data_vars.items():
                g = got[name].isel(sample=i) if "sample" in got[name].dims else got[name]
                assert g.dtype == want[name].dtype, name
                np.testing.assert_array_equal(g.values, want[name].values, err_msg=name)
                assert g.attrs == want[name].attrs
            for d in starts:
                assert got[f"{d}_start"].values[i] == starts[d][i]
                if d in theirs.coords:
                    np.testing.assert_array_equal(
                        got[f"{d}_labels"].values[i], want[d].values, err_msg=d
                    )
        as_np = zcrop.read_windows(ours, starts, size, as_numpy=True, variables=[name])
        np.testing.assert_array_equal(as_np[name], got[name].values)

    check()


def test_read_windows_rejects_bad_windows_and_datasets(corpus):
    ds = xr.open_dataset(corpus[("era5", "v3")], engine="zcrop")
    with pytest.raises(IndexError, match="latitude"):
        zcrop.read_windows(ds, {"latitude": [15]}, {"latitude": 5})
    with pytest.raises(KeyError, match="height"):
        zcrop.read_windows(ds, {"height": [0]}, {"height": 1})
    with pytest.raises(ValueError, match="same dimensions"):
        zcrop.read_windows(ds, {"time": [0]}, {"time": 2, "level": 1})
    with pytest.raises(ValueError, match="one start per window"):
        zcrop.read_windows(ds, {"time": [0, 1], "level": [0]}, {"time": 2, "level": 1})
    with pytest.raises(TypeError, match="before isel"):
        zcrop.read_windows(ds.isel(time=slice(2, 8)), {"time": [0]}, {"time": 2})
    chunked = xr.open_dataset(corpus[("era5", "v3")], engine="zcrop", chunks={})
    with pytest.raises(TypeError, match="chunks=None"):
        zcrop.read_windows(chunked, {"time": [0]}, {"time": 2})
    with pytest.raises(TypeError, match="engine='zcrop'"):
        zcrop.read_windows(xr.open_zarr(corpus[("era5", "v3")], chunks=None), {"time": [0]}, {"time": 2})


@pytest.mark.parametrize("case", [("era5", "v2"), ("era5", "v3-sharded")], ids=str)
def test_loader_sources_from_xarray_match_isel(corpus, case):
    """Sources made from variables of an engine="zcrop" Dataset, cropped by dimension name:
    every sample equals xarray's isel at its reported origin, CF-decoded (the packed q too,
    its fill values NaN), with the decoded coordinate labels in the metadata."""
    ours, theirs = open_both(corpus[case])
    crop = {"time": 3, "latitude": 5, "longitude": 7}
    sources = [
        zcrop.Source(ours["q"], crop=crop, dtype="float64"),
        zcrop.Source(ours["t"], crop=crop),
        zcrop.Source(ours["lsm"], crop={"latitude": 5, "longitude": 7}),
    ]
    packed = "scale_factor" in theirs["q"].encoding  # the sharded layout stores q unpacked
    assert (sources[0]._spec["decode"] is not None) == packed
    assert sources[1]._spec["decode"] is None
    loader = zcrop.Loader(sources, batch_size=6, seed=11, steps=3)
    for batch in loader:
        assert batch["q"].dtype == np.float64 and batch["t"].dtype == np.float32
        for i, meta in enumerate(batch["meta"]):
            for name in ("q", "t", "lsm"):
                entry = meta["sources"][name]
                dims = theirs[name].dims
                sel = {d: slice(o, o + n) for d, o, n in zip(dims, entry["origin"], entry["shape"])}
                want = theirs[name].isel(sel)
                np.testing.assert_array_equal(batch[name][i], want.values, err_msg=name)
                for d in dims:
                    np.testing.assert_array_equal(entry["labels"][d], want[d].values)
            assert meta["sources"]["q"]["labels"]["time"].dtype.kind == "M"


def test_loader_source_from_xarray_errors_and_raw_values(corpus):
    ds = xr.open_dataset(corpus[("era5", "v3")], engine="zcrop")
    with pytest.raises(ValueError, match=r"\['lat'\].*latitude"):
        zcrop.Source(ds["t"], crop={"lat": 4})
    raw = zcrop.Source(ds["q"], crop={"time": 2}, decode=False)
    assert raw._spec["decode"] is None and raw._spec["dtype"] == "native"
    batch = next(iter(zcrop.Loader(raw, batch_size=2, seed=0, steps=1)))
    assert batch["q"].dtype == np.int16
    with pytest.raises(ValueError, match="decode=False"):
        zcrop.Source(ds["valid_time"], crop={"time": 2}, decode=True)
    loaded = ds["t"].load()
    with pytest.raises(TypeError, match="loaded in memory"):
        zcrop.Source(loaded, crop={"time": 2})
    with pytest.raises(ValueError, match="xarray"):
        zcrop.Source(corpus[("era5", "v3")] / "t", crop=[1, 1, 1, 1], decode=True)
    clone = pickle.loads(pickle.dumps(zcrop.Source(ds["q"], crop={"time": 2})))
    assert clone._spec == zcrop.Source(ds["q"], crop={"time": 2})._spec
