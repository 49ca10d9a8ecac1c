"""Reading from an S3-compatible object store: every fixture uploaded to a real server (moto's,
started on loopback by the ``s3`` fixture) and read through ``zcrop.open*`` with
``storage_options`` equals the local read; groups, asyncio and the loader work the same; missing
stores, denied requests and bad options raise the right exceptions."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest
import zarr

import zcrop
from conftest import FIXTURES, array_path, assert_same, manifest_entries

ENTRIES = manifest_entries()
BUCKET = "zcrop-fixtures"


@pytest.fixture(scope="module")
def store(s3):
    """Every fixture store uploaded to ``BUCKET`` under its path relative to ``fixtures/``;
    gives the storage options that reach it."""
    s3.upload_tree(BUCKET, FIXTURES / "data", "data")
    return s3


def url(entry: dict) -> str:
    return f"s3://{BUCKET}/{entry['store']}"


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_every_fixture_reads_like_the_local_store(store, entry):
    local = zcrop.open_array(array_path(entry))
    remote = zcrop.open_array(
        url(entry), path=entry["array_path"] or None, storage_options=store.options
    )
    assert remote.shape == local.shape and remote.dtype == local.dtype
    assert remote.native.uri.startswith(url(entry))
    assert_same(local[...], remote[...])
    expected = np.load(FIXTURES / entry["npy"])
    np.testing.assert_array_equal(remote[...], expected)


def test_groups_list_members_over_s3(store):
    for name in ("v2_hierarchy_consolidated.zarr", "v3_hierarchy.zarr"):
        local = zcrop.open_group(str(FIXTURES / "data" / name))
        remote = zcrop.open_group(f"s3://{BUCKET}/data/{name}", storage_options=store.options)
        assert sorted(remote.array_keys()) == sorted(local.array_keys())
        assert sorted(remote.group_keys()) == sorted(local.group_keys())


def test_open_async_and_zarr_style_options(store):
    entry = next(e for e in ENTRIES if e["name"] == "v3_workload_4d_u2")
    # fsspec's names: endpoint_url, key, secret, region_name.
    options = {
        "endpoint_url": store.endpoint,
        "key": "testing",
        "secret": "testing",
        "region_name": "us-east-1",
    }

    async def main():
        a = await zcrop.open_async(url(entry), storage_options=options)
        return await a.getitem((slice(0, 2), 1, slice(10, 30), slice(5, 9)))

    got = asyncio.run(main())
    want = zarr.open_array(array_path(entry), mode="r")[0:2, 1, 10:30, 5:9]
    np.testing.assert_array_equal(got, want)


def test_anonymous_access_reads_a_public_bucket(s3):
    entry = next(e for e in ENTRIES if e["name"] == "v3_zstd_checksum_u8")
    s3.upload_tree("zcrop-public", FIXTURES / entry["store"], "x.zarr", public=True)
    options = {"endpoint_url": s3.endpoint, "anon": True}
    got = zcrop.open_array("s3://zcrop-public/x.zarr", storage_options=options)[...]
    np.testing.assert_array_equal(got, np.load(FIXTURES / entry["npy"]))


def test_a_loader_over_s3_gives_the_local_batches(store):
    entry = next(e for e in ENTRIES if e["name"] == "v3_workload_4d_u2")
    crop = (2, 3, 16, 16)

    def batches(source):
        ld = zcrop.Loader(source, batch_size=4, seed=3, steps=3)
        return [(b["img"].copy(), [m["sources"]["img"]["origin"] for m in b["meta"]]) for b in ld]

    remote = zcrop.Source(url(entry), crop, name="img", storage_options=store.options)
    local = zcrop.Source(array_path(entry), crop, name="img")
    for (r, ro), (l, lo) in zip(batches(remote), batches(local), strict=True):
        assert ro == lo
        np.testing.assert_array_equal(r, l)
    # A Source of an opened S3 array pickles with its URL and options.
    arr = zcrop.open_array(url(entry), storage_options=store.options)
    src = pickle.loads(pickle.dumps(zcrop.Source(arr, crop, name="img")))
    ld = zcrop.Loader(src, batch_size=2, seed=1, steps=1)
    assert next(iter(ld))["img"].shape == (2, *crop)


def test_missing_stores_and_bad_options_raise(store):
    with pytest.raises(zcrop.NodeNotFoundError) as e:
        zcrop.open(f"s3://{BUCKET}/no/such.zarr", storage_options=store.options)
    assert isinstance(e.value, FileNotFoundError)
    assert f"s3://{BUCKET}/no/such.zarr" in str(e.value)
    with pytest.raises(zcrop.InvalidArgumentError, match="colour"):
        zcrop.open(f"s3://{BUCKET}/data/v3_4d_i1.zarr", storage_options={"colour": "blue"})
    with pytest.raises(zcrop.InvalidArgumentError, match="storage_options"):
        zcrop.open(str(FIXTURES / "data/v3_4d_i1.zarr"), storage_options={"anon": True})
    with pytest.raises(TypeError):
        zcrop.open(f"s3://{BUCKET}/x.zarr", storage_options={"anon": object()})


def test_denied_requests_raise_store_errors(store):
    # Unsigned requests to a private bucket are refused by the server.
    options = {"endpoint_url": store.endpoint, "anon": True}
    where = f"s3://{BUCKET}/data/v3_4d_i1.zarr"
    with pytest.raises(zcrop.StoreError) as e:
        zcrop.open_array(where, storage_options=options)
    assert isinstance(e.value, OSError)
    assert "permission denied" in str(e.value)
    assert f"{where}/zarr.json" in str(e.value)
    assert e.value.key == "data/v3_4d_i1.zarr/zarr.json"


def test_plain_http_reads_a_public_store(s3):
    # The same public objects through an https-style URL (object_store's HTTP store: ranged
    # GETs on plain URLs, no S3 signing); moto serves public objects path-style.
    entry = next(e for e in ENTRIES if e["name"] == "v3_sharded_end")
    s3.upload_tree("zcrop-http", FIXTURES / entry["store"], "s.zarr", public=True)
    where = f"{s3.endpoint}/zcrop-http/s.zarr"
    arr = zcrop.open_array(where, path=entry["array_path"] or None)
    np.testing.assert_array_equal(arr[...], np.load(FIXTURES / entry["npy"]))
    with pytest.raises(zcrop.NodeNotFoundError):
        zcrop.open_array(f"{s3.endpoint}/zcrop-http/missing.zarr")
