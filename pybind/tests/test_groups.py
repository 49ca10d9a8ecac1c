"""Groups read through zcrop match zarr-python's view of the same hierarchies."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import zarr

import zcrop
from conftest import FIXTURES, assert_same

HIERARCHIES = ["data/v3_hierarchy.zarr", "data/v2_hierarchy_consolidated.zarr"]


@pytest.fixture(params=HIERARCHIES)
def groups(request):
    path = str(FIXTURES / request.param)
    return zarr.open_group(path, mode="r"), zcrop.open_group(path)


def test_open_returns_a_group(groups):
    z, g = groups
    assert isinstance(zcrop.open(str(FIXTURES / HIERARCHIES[0])), zcrop.Group)
    assert isinstance(g, zcrop.Group)


def test_group_info_matches(groups):
    z, g = groups
    assert (g.name, g.path, g.basename) == (z.name, z.path, z.basename)
    assert g.attrs.asdict() == z.attrs.asdict()
    assert dict(g.attrs) == z.attrs.asdict()
    assert g.zarr_format == z.metadata.zarr_format
    assert g.metadata["node_type"] == "group"


def test_membership_and_iteration_match(groups):
    z, g = groups
    assert sorted(g) == sorted(z) == list(g)
    assert len(g) == len(z)
    assert list(g.keys()) == sorted(z.keys())
    assert sorted(g.array_keys()) == sorted(z.array_keys())
    assert sorted(g.group_keys()) == sorted(z.group_keys())
    assert [n for n, _ in g.members()] == sorted(n for n, _ in z.members())
    deep_z = sorted((n, type(m).__name__) for n, m in z.members(max_depth=None))
    deep_g = sorted((n, type(m).__name__) for n, m in g.members(max_depth=None))
    assert deep_g == deep_z
    assert g.nmembers(max_depth=None) == z.nmembers(max_depth=None)
    for name, _ in z.members(max_depth=None):
        assert name in g
        assert g[name].name == z[name].name
        assert g[name].path == z[name].path
    assert "not-a-member" not in g
    assert 3 not in g
    assert sorted(n for n, _ in g.arrays()) == sorted(n for n, _ in z.arrays())
    assert sorted(n for n, _ in g.groups()) == sorted(n for n, _ in z.groups())
    assert all(isinstance(a, zcrop.Array) for a in g.array_values())
    assert all(isinstance(x, zcrop.Group) for x in g.group_values())


def test_arrays_in_groups_read_like_zarr(groups):
    z, g = groups
    for name, node in z.members(max_depth=None):
        if isinstance(node, zarr.Array):
            assert_same(node[...], g[name][...])
            assert g[name].attrs.asdict() == node.attrs.asdict()


def test_missing_member_is_a_key_error(groups):
    _, g = groups
    with pytest.raises(KeyError):
        g["nope"]
    with pytest.raises(KeyError):
        g["nope/deeper"]
    assert g.get("nope") is None
    assert g.get("nope", 5) == 5
    with pytest.raises(TypeError):
        g[0]  # type: ignore[index]


def test_path_argument_opens_a_sub_node():
    store = str(FIXTURES / "data/v3_hierarchy.zarr")
    a = zcrop.open(store, path="images/raw")
    z = zarr.open(store, path="images/raw", mode="r")
    assert isinstance(a, zcrop.Array)
    assert_same(z[...], a[...])
    assert a.name == z.name == "/images/raw"


def test_async_group_matches_sync():
    store = str(FIXTURES / "data/v2_hierarchy_consolidated.zarr")
    sync = zcrop.open_group(store)

    async def main():
        g = await zcrop.open_async(store)
        assert isinstance(g, zcrop.AsyncGroup)
        assert [n async for n in g.keys()] == list(sync.keys())
        assert [n async for n in g.array_keys()] == list(sync.array_keys())
        assert [n async for n in g.group_keys()] == list(sync.group_keys())
        assert await g.nmembers() == len(sync)
        assert [n async for n, _ in g.members()] == [n for n, _ in sync.members()]
        assert [n async for n, _ in g.arrays()] == [n for n, _ in sync.arrays()]
        assert [n async for n, _ in g.groups()] == [n for n, _ in sync.groups()]
        assert await g.contains("group_a/temperature")
        assert not await g.contains("nope")
        t = await g.getitem("group_a/temperature")
        assert isinstance(t, zcrop.AsyncArray)
        assert_same(sync["group_a/temperature"][...], await t.getitem(Ellipsis))
        with pytest.raises(KeyError):
            await g.getitem("nope")
        assert await g.get("nope", 1) == 1
        assert g.attrs.asdict() == sync.attrs.asdict()

    asyncio.run(main())


def test_zarr_reading_code_works_by_changing_the_import():
    """The same reading code, run with `zarr` and with `zcrop` as the module."""

    def read(lib):
        root = lib.open(str(FIXTURES / "data/v3_hierarchy.zarr"), mode="r")
        raw = root["images/raw"]
        labels = root["images"]["labels"]
        out = {
            "keys": sorted(root.group_keys()),
            "title": root.attrs["title"],
            "shape": raw.shape,
            "dtype": str(raw.dtype),
            "chunks": raw.chunks,
            "first": raw[0],
            "crop": raw[1:3, 5:15:2, -4:],
            "rows": raw.oindex[[0, 3], :, [1, 2]],
            "points": labels.vindex[[0, 5, 19], [1, 2, 23]],
            "mask": labels[labels[...] > 100],
            "fill": labels.fill_value,
            "scalar": root["meta/scalars/offset"][()],
        }
        return out

    expected, got = read(zarr), read(zcrop)
    assert expected.keys() == got.keys()
    for k in expected:
        if isinstance(expected[k], (np.ndarray, np.generic)):
            assert_same(expected[k], got[k])
        else:
            assert expected[k] == got[k], k
