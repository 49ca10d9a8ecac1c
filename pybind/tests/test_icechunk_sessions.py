"""Icechunk repositories written by the icechunk package in the test, read by zcrop and
compared with zarr-python (and xarray's zarr backend) reading the same session: several
commits on a branch, a tag, an older snapshot; sharded, unsharded and inline chunks; groups;
xarray datasets; sessions on a directory and on an S3 server; sessions zcrop refuses; virtual
chunks in local files and S3 objects, and targets that changed, shrank or went missing."""

from __future__ import annotations

import datetime
import os
import pickle
import warnings
from typing import Any

import numpy as np
import pytest

import zcrop

icechunk = pytest.importorskip("icechunk")
xr = pytest.importorskip("xarray")
zarr = pytest.importorskip("zarr")
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def weather(seed: int) -> xr.Dataset:
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.normal(280, 5, (8, 24, 36)).astype("float32"),
                    {"units": "K"}),
            "sat": (("time", "band", "lat", "lon"),
                    rng.integers(0, 4000, (8, 3, 24, 36)).astype("uint16")),
        },
        coords={
            "time": np.arange("2020-01-01T00", "2020-01-01T08", dtype="datetime64[h]"),
            "band": np.array(["vis", "ir1", "ir2"]),
            "lat": np.linspace(-20.0, 20.0, 24),
            "lon": np.linspace(0.0, 35.0, 36),
        },
        attrs={"title": "test weather"},
    )


ENCODING = {
    "t2m": {"chunks": (2, 12, 12), "compressors": [zarr.codecs.ZstdCodec(level=1)]},
    # Sharded: shards of (4, 3, 24, 36) holding (1, 1, 12, 12) chunks.
    "sat": {"chunks": (1, 1, 12, 12), "shards": (4, 3, 24, 36)},
}


class Repo:
    """A repository with three commits on main (the second tagged ``v1``): the dataset, then
    t2m's first time steps overwritten, then a new group with a tiny (inline) array."""

    def __init__(self, storage) -> None:
        self.repo = icechunk.Repository.create(storage)
        s = self.repo.writable_session("main")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            weather(0).to_zarr(s.store, zarr_format=3, consolidated=False, encoding=ENCODING)
        self.first = s.commit("first")
        s = self.repo.writable_session("main")
        zarr.open_array(s.store, path="t2m", mode="r+")[:2] = -1.0
        self.second = s.commit("second")
        self.repo.create_tag("v1", self.second)
        s = self.repo.writable_session("main")
        g = zarr.open_group(s.store, mode="r+").create_group("extra", attributes={"k": 1})
        tiny = g.create_array("tiny", shape=(4,), chunks=(2,), dtype="int32",
                              compressors=None, dimension_names=["x"])
        tiny[:] = [1, 2, 3, 4]
        self.third = s.commit("third")

    def session(self, **version):
        return self.repo.readonly_session(**(version or {"branch": "main"}))


@pytest.fixture
def local_repo(tmp_path):
    return Repo(icechunk.local_filesystem_storage(str(tmp_path / "repo")))


def test_every_array_of_every_snapshot_equals_zarr_python(local_repo):
    versions = [
        {"branch": "main"},
        {"tag": "v1"},
        {"snapshot_id": local_repo.first},
    ]
    for version in versions:
        session = local_repo.session(**version)
        snap = zcrop.open_icechunk(session)
        assert snap.snapshot_id == session.snapshot_id
        oracle = zarr.open_group(session.store, mode="r")
        paths = [p.lstrip("/") for p in snap.arrays()]
        assert sorted(paths) == sorted(
            p for p, _ in oracle.members(max_depth=None)
            if isinstance(oracle[p], zarr.Array)
        )
        for path in paths:
            want = oracle[path][...]
            got = snap[path][...]
            assert got.dtype == want.dtype, (version, path)
            np.testing.assert_array_equal(got, want, err_msg=f"{version} {path}")
    # The same versions by path and name.
    tip = zcrop.open_icechunk(local_repo.session())
    assert tip.snapshot_id == local_repo.third
    old = zcrop.open_icechunk(tip, snapshot=local_repo.first)
    assert old.snapshot_id == local_repo.first
    assert "/extra/tiny" not in old.arrays()
    tagged = zcrop.open_icechunk(tip.uri, tag="v1")
    assert tagged.snapshot_id == local_repo.second
    np.testing.assert_array_equal(tagged["t2m"][:2], -1.0)
    np.testing.assert_array_equal(old["t2m"][:2], weather(0).t2m.values[:2])


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(data=st.data())
def test_random_crops_equal_zarr_python(local_repo_once, data):
    session, snap = local_repo_once
    path = data.draw(st.sampled_from(["t2m", "sat"]))
    oracle = zarr.open_array(session.store, path=path, mode="r")
    shape = oracle.shape
    size = tuple(data.draw(st.integers(1, n)) for n in shape)
    origins = [
        tuple(data.draw(st.integers(0, n - s)) for n, s in zip(shape, size))
        for _ in range(data.draw(st.integers(1, 4)))
    ]
    got = snap[path].read_crops(origins, size)
    for crop, origin in zip(got, origins):
        want = oracle[tuple(slice(o, o + s) for o, s in zip(origin, size))]
        np.testing.assert_array_equal(crop, want)


@pytest.fixture(scope="module")
def local_repo_once(tmp_path_factory):
    repo = Repo(icechunk.local_filesystem_storage(str(tmp_path_factory.mktemp("ic") / "r")))
    session = repo.session()
    return session, zcrop.open_icechunk(session)


def test_groups_walk_the_snapshot(local_repo):
    session = local_repo.session()
    # The kinds of chunk the repository holds: inline in the manifest, and chunk objects.
    assert session.chunk_type("/extra/tiny", [0]) == icechunk.ChunkType.INLINE
    assert session.chunk_type("/t2m", [1, 0, 0]) == icechunk.ChunkType.NATIVE
    snap = zcrop.open_icechunk(session)
    root = snap.group()
    assert isinstance(root, zcrop.Group)
    assert sorted(root.keys()) == ["band", "extra", "lat", "lon", "sat", "t2m", "time"]
    extra = root["extra"]
    assert isinstance(extra, zcrop.Group) and extra.attrs["k"] == 1
    assert dict(extra.arrays())["tiny"].name == "/extra/tiny"
    np.testing.assert_array_equal(snap["extra/tiny"][:], [1, 2, 3, 4])
    assert snap.group("extra").name == "/extra"
    with pytest.raises(TypeError, match="not a group"):
        snap.group("t2m")
    with pytest.raises(KeyError):
        root["nope"]
    with pytest.raises(zcrop.NodeNotFoundError):
        snap["nope"]


def test_xarray_datasets_equal_xarrays_own_backend(local_repo):
    for version in ({"branch": "main"}, {"tag": "v1"}, {"snapshot_id": local_repo.first}):
        session = local_repo.session(**version)
        want = xr.open_zarr(session.store, consolidated=False).load()
        for source in (session, session.store, zcrop.open_icechunk(session)):
            got = xr.open_dataset(source, engine="zcrop")
            xr.testing.assert_identical(got.load(), want)
        lazy = zcrop.open_dataset(session, chunks={})
        assert lazy.t2m.chunks is not None
        xr.testing.assert_identical(lazy.compute(), want)
        # A dataset pickles by repository, snapshot id and path, and reads again.
        again = pickle.loads(pickle.dumps(xr.open_dataset(session, engine="zcrop")))
        xr.testing.assert_identical(again.load(), want)
    session = local_repo.session()
    extra = xr.open_dataset(session, engine="zcrop", group="extra")
    xr.testing.assert_identical(
        extra.load(), xr.open_zarr(session.store, group="extra", consolidated=False).load()
    )
    tree = xr.open_datatree(session, engine="zcrop")
    assert set(tree.children) == {"extra"}


def test_sessions_on_an_s3_server(s3):
    s3.client().create_bucket(Bucket="icechunk-sessions")
    storage = icechunk.s3_storage(
        bucket="icechunk-sessions",
        prefix="weather/repo",
        endpoint_url=s3.endpoint,
        region="us-east-1",
        allow_http=True,
        force_path_style=True,
        access_key_id="testing",
        secret_access_key="testing",
    )
    repo = Repo(storage)
    for version in ({"branch": "main"}, {"tag": "v1"}):
        session = repo.session(**version)
        snap = zcrop.open_icechunk(session)
        assert snap.uri == "s3://icechunk-sessions/weather/repo"
        for path in ("t2m", "sat"):
            want = zarr.open_array(session.store, path=path, mode="r")[...]
            np.testing.assert_array_equal(snap[path][...], want)
        xr.testing.assert_identical(
            xr.open_dataset(session, engine="zcrop").load(),
            xr.open_zarr(session.store, consolidated=False).load(),
        )
    # The same repository by URL.
    by_url = zcrop.open_icechunk("s3://icechunk-sessions/weather/repo", tag="v1",
                                 storage_options=s3.options)
    assert by_url.snapshot_id == repo.second


def test_sessions_zcrop_cannot_read_are_refused(local_repo):
    writable = local_repo.repo.writable_session("main")
    zarr.open_array(writable.store, path="t2m", mode="r+")[0, 0, 0] = 5.0
    with pytest.raises(ValueError, match="uncommitted changes"):
        zcrop.open_icechunk(writable)
    with pytest.raises(ValueError, match="uncommitted changes"):
        xr.open_dataset(writable.store, engine="zcrop")
    with pytest.raises(ValueError, match="one snapshot"):
        zcrop.open_icechunk(local_repo.session(), branch="main")
    memory = icechunk.Repository.create(icechunk.in_memory_storage())
    with pytest.raises(zcrop.InvalidArgumentError, match="memory"):
        zcrop.open_icechunk(memory.readonly_session("main"))
    with pytest.raises(TypeError, match="icechunk.Session"):
        zcrop.open_icechunk(42)


def virtual_repo(storage, prefix: str, store_config, credentials, refs) -> Any:
    """A repository whose array ``v`` (8 x 8 float32, chunks of 4 x 8, uncompressed) has
    virtual chunks: ``refs`` maps a chunk key to ``(url, offset, length, checksum)``."""
    config = icechunk.RepositoryConfig.default()
    config.set_virtual_chunk_container(icechunk.VirtualChunkContainer(prefix, store_config))
    repo = icechunk.Repository.create(
        storage, config,
        authorize_virtual_chunk_access=icechunk.containers_credentials({prefix: credentials}),
    )
    s = repo.writable_session("main")
    zarr.create_array(s.store, name="v", shape=(8, 8), chunks=(4, 8), dtype="f4",
                      compressors=None, fill_value=np.nan, dimension_names=["y", "x"])
    for key, (url, offset, length, checksum) in refs.items():
        s.store.set_virtual_ref(key, url, offset=offset, length=length, checksum=checksum)
    s.commit("virtual")
    return repo


VALUES = np.arange(64, dtype="<f4").reshape(8, 8)


def test_virtual_chunks_in_local_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    target = data / "raw.bin"
    target.write_bytes(b"HEADER" + VALUES.tobytes())
    prefix = f"file://{data}/"
    url = f"file://{target}"
    written = datetime.datetime.fromtimestamp(target.stat().st_mtime, datetime.timezone.utc)
    repo = virtual_repo(
        icechunk.local_filesystem_storage(str(tmp_path / "repo")), prefix,
        icechunk.local_filesystem_store(str(data)), None,
        {
            # The first chunk records the file's last-modified time, the second nothing.
            "v/c/0/0": (url, 6, 128, written + datetime.timedelta(seconds=1)),
            "v/c/1/0": (url, 6 + 128, 128, None),
        },
    )
    session = repo.readonly_session("main")
    assert session.chunk_type("/v", [0, 0]) == icechunk.ChunkType.VIRTUAL
    allowed = {prefix: None}
    snap = zcrop.open_icechunk(session, virtual_chunk_containers=allowed)
    want = zarr.open_array(session.store, path="v", mode="r")[...]
    np.testing.assert_array_equal(want, VALUES)
    np.testing.assert_array_equal(snap["v"][...], want)
    crops = snap["v"].read_crops([(1, 2), (3, 0), (4, 4)], (3, 4))
    for crop, (y, x) in zip(crops, [(1, 2), (3, 0), (4, 4)]):
        np.testing.assert_array_equal(crop, want[y : y + 3, x : x + 4])
    ds = xr.open_dataset(session, engine="zcrop", virtual_chunk_containers=allowed)
    xr.testing.assert_identical(ds.load(), xr.open_zarr(session.store, consolidated=False).load())
    again = pickle.loads(pickle.dumps(
        xr.open_dataset(session, engine="zcrop", virtual_chunk_containers=allowed)))
    xr.testing.assert_identical(again.load(), ds)

    # Not allowed: the caller did not name the prefix.
    with pytest.raises(zcrop.StoreError, match="no virtual chunk container") as e:
        zcrop.open_icechunk(session)["v"][...]
    assert e.value.key == url and e.value.node == "/v"
    with pytest.raises(zcrop.StoreError, match="no virtual chunk container"):
        zcrop.open_icechunk(session, virtual_chunk_containers={f"file://{tmp_path}/other/": None}
                            )["v"][...]
    # A reference outside every container the repository declares is refused, even under a
    # prefix the caller allows.
    outside = virtual_repo(
        icechunk.local_filesystem_storage(str(tmp_path / "repo-outside")), f"file://{data}/sub/",
        icechunk.local_filesystem_store(str(data / "sub")), None, {},
    )
    s = outside.writable_session("main")
    s.store.set_virtual_ref("v/c/0/0", url, offset=6, length=128, validate_container=False)
    s.commit("outside")
    with pytest.raises(zcrop.StoreError, match="declares no virtual chunk container"):
        zcrop.open_icechunk(outside.readonly_session("main"),
                            virtual_chunk_containers={f"file://{tmp_path}/": None})["v"][:4]
    # Changed after the reference was written: an error naming the chunk, as icechunk's.
    os.utime(target, (written.timestamp() + 3600,) * 2)
    with pytest.raises(zcrop.StoreError, match=r"virtual chunk \[0, 0\].*modified after"):
        snap["v"][...]
    with pytest.raises(Exception, match="checksum"):
        zarr.open_array(session.store, path="v", mode="r")[...]
    # The second chunk records no version: it still reads.
    np.testing.assert_array_equal(snap["v"][4:], VALUES[4:])
    # Too short, then missing.
    target.write_bytes(b"HEADER" + VALUES.tobytes()[:200])
    with pytest.raises(zcrop.StoreError, match=r"virtual chunk \[1, 0\].*fewer than"):
        snap["v"][4:]
    target.unlink()
    with pytest.raises(zcrop.StoreError, match="does not exist"):
        snap["v"][4:]


def test_virtual_chunks_in_s3_objects(s3):
    client = s3.client()
    client.create_bucket(Bucket="icechunk-virtual")
    client.put_object(Bucket="icechunk-virtual", Key="nc/raw.bin", Body=VALUES.tobytes())
    etag = client.head_object(Bucket="icechunk-virtual", Key="nc/raw.bin")["ETag"]
    url = "s3://icechunk-virtual/nc/raw.bin"
    store_config = icechunk.s3_store(region="us-east-1", endpoint_url=s3.endpoint,
                                     allow_http=True, force_path_style=True)
    credentials = icechunk.s3_static_credentials(access_key_id="testing",
                                                 secret_access_key="testing")
    repo = virtual_repo(
        icechunk.s3_storage(bucket="icechunk-virtual", prefix="repo", endpoint_url=s3.endpoint,
                            region="us-east-1", allow_http=True, force_path_style=True,
                            access_key_id="testing", secret_access_key="testing"),
        "s3://icechunk-virtual/nc/", store_config, credentials,
        {"v/c/0/0": (url, 0, 128, etag), "v/c/1/0": (url, 128, 128, etag)},
    )
    session = repo.readonly_session("main")
    # The endpoint, region and allow_http come from the container the repository declares;
    # the caller gives the credentials.
    snap = zcrop.open_icechunk(
        session, virtual_chunk_containers={"s3://icechunk-virtual/nc/": {
            "key": "testing", "secret": "testing"}})
    want = zarr.open_array(session.store, path="v", mode="r")[...]
    np.testing.assert_array_equal(want, VALUES)
    np.testing.assert_array_equal(snap["v"][...], want)
    # Rewritten: its ETag changes, and both readers refuse it.
    client.put_object(Bucket="icechunk-virtual", Key="nc/raw.bin", Body=VALUES[::-1].tobytes())
    with pytest.raises(zcrop.StoreError, match=r"virtual chunk \[0, 0\].*ETag") as e:
        snap["v"][...]
    assert e.value.key == url
    with pytest.raises(Exception, match="checksum"):
        zarr.open_array(session.store, path="v", mode="r")[...]


def test_split_manifests(tmp_path):
    """Manifests split along time (one per two chunks): a read fetches the manifests whose
    extents hold its chunks, and the values equal zarr-python's."""
    split = icechunk.ManifestSplittingConfig.from_dict(
        {icechunk.ManifestSplitCondition.AnyArray(): {icechunk.ManifestSplitDimCondition.Any(): 2}}
    )
    config = icechunk.RepositoryConfig(manifest=icechunk.ManifestConfig(splitting=split))
    repo = icechunk.Repository.create(
        icechunk.local_filesystem_storage(str(tmp_path / "repo")), config)
    s = repo.writable_session("main")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weather(1).to_zarr(s.store, zarr_format=3, consolidated=False, encoding=ENCODING)
    s.commit("split")
    manifests = list((tmp_path / "repo" / "manifests").iterdir())
    assert len(manifests) > 2, manifests
    session = repo.readonly_session("main")
    snap = zcrop.open_icechunk(session)
    for path in ("t2m", "sat"):
        want = zarr.open_array(session.store, path=path, mode="r")[...]
        np.testing.assert_array_equal(snap[path][...], want)
        np.testing.assert_array_equal(snap[path][5:7], want[5:7])
