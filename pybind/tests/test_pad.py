"""Edge padding (``pad=`` and ``fill=`` of ``zcrop.Source``): windows centred on every pixel,
crops past the array's ends filled.

Oracles: ``numpy.pad`` of the data zarr-python wrote, sliced at the reported (signed) origins;
brute force over ``numpy.pad`` for ``valid_windows``; xarray's coordinates, extended by their
spacing, for meta labels.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop

zarr = pytest.importorskip("zarr")

SLOW = settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write(path, data, chunks, fmt=3, shards=None):
    kwargs = {"zarr_format": fmt, "chunks": chunks, "dtype": data.dtype, "shape": data.shape}
    if fmt == 3:
        kwargs["dimension_names"] = ["t", "c", "y", "x"]
        if shards is not None:
            kwargs["shards"] = shards
    a = zarr.create_array(str(path), **kwargs)
    a[...] = data
    if fmt == 2:
        a.attrs["_ARRAY_DIMENSIONS"] = ["t", "c", "y", "x"]
    return str(path)


def centred(cy, cx, jitter=0):
    return [
        zcrop.Dim.along("t"),
        zcrop.Dim.fixed(0),
        zcrop.Dim.along("y").offset(-(cy // 2)).jitter(jitter),
        zcrop.Dim.along("x").offset(-(cx // 2)),
    ]


@SLOW
@given(
    seed=st.integers(0, 2**16),
    crop=st.tuples(st.integers(1, 3), st.integers(1, 9), st.integers(1, 11)),
    layout=st.sampled_from(["v3", "v2", "sharded"]),
    dtype=st.sampled_from(["uint16", "float32"]),
    out=st.sampled_from([None, "float32"]),
    fill=st.sampled_from([None, 7]),
    jitter=st.integers(0, 2),
)
def test_padded_windows_equal_numpy_pad(tmp_path_factory, seed, crop, layout, dtype, out, fill, jitter):
    rng = np.random.default_rng(seed)
    data = (rng.random((5, 2, 12, 13)) * 1000).astype(dtype)
    fmt, shards = (2, None) if layout == "v2" else (3, (2, 2, 8, 8) if layout == "sharded" else None)
    path = write(tmp_path_factory.mktemp("pad") / "a.zarr", data, (1, 2, 4, 4), fmt, shards)
    ct, cy, cx = crop
    src = zcrop.Source(path, [ct, 2, cy, cx], name="a", dims=centred(cy, cx, jitter), pad=["y", "x"],
                       dtype=out, fill=fill)
    s = zcrop.Samples(src, positions=["t", "y", "x"], mode="epoch", stride=[1, 1, 1])
    # Every pixel is a position; only time, unpadded, bounds the crop.
    assert len(s) == (5 - ct + 1) * 12 * 13
    delivered = np.dtype(out or dtype)
    value = fill if fill is not None else (np.nan if delivered.kind == "f" else 0)
    margin = cy + cx + 2
    padded = np.pad(data.astype(delivered), [(0, 0), (0, 0), (margin, margin), (margin, margin)],
                    constant_values=value)
    for i in range(0, len(s), 5):
        got = s[i]
        t, y, x = (int(v) for v in got["meta"]["position"])
        o = got["meta"]["origin"]["a"]
        assert o[0] == t and o[3] == x - cx // 2 and abs(o[2] - (y - cy // 2)) <= jitter
        want = padded[o[0] : o[0] + ct, :, o[2] + margin : o[2] + margin + cy,
                      o[3] + margin : o[3] + margin + cx]
        np.testing.assert_array_equal(got["a"], want)
        assert got["a"].dtype == delivered


@pytest.mark.parametrize("positions", [["t", "y", "x"], ["y", "x", "t"]])
def test_valid_windows_count_padding_as_present(tmp_path, positions):
    """Windows past the ends are valid where their part inside holds no NaN, streaming along
    an unpadded first position (time) or a padded one (y)."""
    rng = np.random.default_rng(1)
    data = rng.random((4, 1, 10, 11)).astype("float32")
    data[rng.random(data.shape) < 0.03] = np.nan
    path = write(tmp_path / "a.zarr", data, (1, 1, 4, 4))
    cy, cx = 5, 4
    src = zcrop.Source(path, [2, 1, cy, cx], name="a", dims=centred(cy, cx), pad=["y", "x"])
    bad = np.pad(np.isnan(data[:, 0]), [(0, 0), (cy, cy), (cx, cx)], constant_values=False)
    want = np.zeros((4, 10, 11), dtype=bool)
    for t in range(3):  # a window of 2 steps starts at 0..2
        for y in range(10):
            for x in range(11):
                oy, ox = y - cy // 2 + cy, x - cx // 2 + cx
                want[t, y, x] = not bad[t : t + 2, oy : oy + cy, ox : ox + cx].any()
    order = ["t", "y", "x"]
    want = want.transpose([order.index(p) for p in positions])
    # Slabs of one row of positions, and the whole array at once.
    for budget in (1, 1 << 20):
        mask = zcrop.valid_windows(src, positions, budget=budget, cache=False)
        np.testing.assert_array_equal(mask.to_numpy(), want)
    s = zcrop.Samples(src, positions=positions, valid=mask, mode="epoch", stride=[1, 1, 1])
    assert len(s) == int(want.sum())
    for i in range(0, len(s), 11):
        got = s[i]
        o = got["meta"]["origin"]["a"]
        y0, x0 = max(o[2], 0), max(o[3], 0)
        y1, x1 = min(o[2] + cy, 10), min(o[3] + cx, 11)
        real = got["a"][:, :, y0 - o[2] : y1 - o[2], x0 - o[3] : x1 - o[3]]
        assert real.size and not np.isnan(real).any()
        assert np.isnan(got["a"]).sum() == got["a"].size - real.size  # NaN: the fill only


def test_padded_labels_continue_the_coordinate(tmp_path):
    xr = pytest.importorskip("xarray")
    pd = pytest.importorskip("pandas")
    lat = np.arange(50.0, 56.0, 0.5)
    lon = np.arange(-4.0, 2.0, 0.25)
    time = pd.date_range("2024-06-01", periods=6, freq="h")
    ds = xr.Dataset(
        {"t2m": (("time", "lat", "lon"), np.arange(6 * 12 * 24, dtype="float32").reshape(6, 12, 24))},
        coords={"time": time, "lat": lat, "lon": lon},
    )
    ds.to_zarr(str(tmp_path / "d.zarr"), mode="w", zarr_format=3, consolidated=False)
    da = xr.open_dataset(str(tmp_path / "d.zarr"), engine="zcrop")["t2m"]
    src = zcrop.Source(da, crop={"time": 2, "lat": 8, "lon": 8}, pad=["lat", "lon"],
                       window={"lat": (-4, 4), "lon": (-4, 4)}, fill=-1)
    s = zcrop.Samples(src, positions=["time", "lat", "lon"], mode="epoch", stride=[1, 1, 1])
    assert len(s) == 5 * 12 * 24
    padded = ds["t2m"].pad(lat=(4, 4), lon=(4, 4), constant_values=-1)
    seen_outside = 0
    for i in range(0, len(s), 13):
        got = s[i]
        o = got["meta"]["origin"]["t2m"]
        t, y, x = (int(v) for v in got["meta"]["position"])
        assert (o[1], o[2]) == (y - 4, x - 4)
        want = padded.isel(time=slice(t, t + 2), lat=slice(o[1] + 4, o[1] + 12),
                           lon=slice(o[2] + 4, o[2] + 12))
        np.testing.assert_array_equal(got["t2m"], want.values)
        labels = s.labels(i)["t2m"]
        np.testing.assert_allclose(labels["lat"], 50.0 + 0.5 * np.arange(o[1], o[1] + 8))
        np.testing.assert_allclose(labels["lon"], -4.0 + 0.25 * np.arange(o[2], o[2] + 8))
        seen_outside += o[1] < 0 or o[2] + 8 > 24
    assert seen_outside > 0


def test_padding_input_errors_are_named(tmp_path):
    data = np.zeros((3, 2, 8, 8), dtype="uint16")
    path = write(tmp_path / "a.zarr", data, (1, 2, 4, 4))
    with pytest.raises(ValueError, match="pad names 'z'"):
        zcrop.Source(path, [1, 2, 4, 4], pad="z")
    with pytest.raises(ValueError, match="fill= is the value of padding"):
        zcrop.Source(path, [1, 2, 4, 4], fill=0)
    positions = ["t", "y", "x"]
    bad = zcrop.Source(path, [1, 2, 4, 4], pad="c")
    with pytest.raises(zcrop.ZcropError, match="dimension 1 cannot be padded: it follows no position"):
        zcrop.Samples(bad, positions=positions, length=1)
    fft = zcrop.Source(path, [1, 2, 4, 4], pad="y", dtype="float32", fft={"axes": [3]})
    with pytest.raises(zcrop.ZcropError, match="FFT"):
        zcrop.Samples(fft, positions=positions, length=1)
    neg = zcrop.Source(path, [1, 2, 4, 4], pad="y", fill=-1)
    with pytest.raises(zcrop.ZcropError, match="fill value -1 is not a uint16 value"):
        zcrop.Samples(neg, positions=positions, length=1)
