"""Hostile and changing stores: every case ends in the right values or a clear, typed error,
never an abort, a hang or stale data.

The corpus is generated here: stores written by zarr-python, then damaged (absurd shard index
entries, overflowing shapes, special files, deeply nested metadata), rewritten or deleted
under a live array, and read under small RLIMIT_AS and RLIMIT_NOFILE. Cases that aborted the
process before they were fixed run in a child process, so that an abort fails the test instead
of killing the test run.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import zarr
from numcodecs import CRC32C

import zcrop

# --- helpers -----------------------------------------------------------------------------------


def child(code: str, *, rlimit_as: int | None = None, nofile: int | None = None,
          timeout: float = 120) -> str:
    """Runs `code` in a fresh Python process (with the given resource limits) and returns its
    output; the test fails if the process dies of a signal or exits non-zero."""
    pre = "import resource\n"
    if rlimit_as is not None:
        pre += f"resource.setrlimit(resource.RLIMIT_AS, ({rlimit_as}, {rlimit_as}))\n"
    if nofile is not None:
        pre += f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile}))\n"
    r = subprocess.run(
        [sys.executable, "-c", pre + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"child exited with {r.returncode}:\n{out[-3000:]}"
    return r.stdout


def expect_error(code: str, error: str, **limits) -> str:
    """Runs `code` (which must raise) in a child; returns the message of the `error` it
    raised (a class of zcrop.errors), failing on any other outcome."""
    wrapped = f"""
import zcrop, zcrop.errors
try:
{textwrap.indent(textwrap.dedent(code), "    ")}
except zcrop.errors.{error} as e:
    print("RAISED", type(e).__name__, str(e))
else:
    print("NO ERROR")
"""
    out = child(wrapped, **limits)
    assert out.startswith("RAISED"), out
    return out


def sharded(path, shape=(8, 8), chunks=(2, 2), shards=(8, 8)):
    z = zarr.create_array(str(path), shape=shape, chunks=chunks, shards=shards, dtype="u1",
                          compressors=None)
    z[:] = 1
    return z


def patch_index_entry(shard_file, n_inner: int, entry: int, offset: int, length: int) -> None:
    """Rewrites entry `entry` of the shard's index (at its end, with a crc32c) to
    (`offset`, `length`), with a valid checksum."""
    b = open(shard_file, "rb").read()
    size = n_inner * 16 + 4
    idx = bytearray(b[-size:-4])
    struct.pack_into("<QQ", idx, entry * 16, offset, length)
    open(shard_file, "wb").write(b[:-size] + bytes(CRC32C().encode(bytes(idx))))


def write_v2_meta(path, **meta) -> None:
    os.makedirs(path, exist_ok=True)
    base = {"zarr_format": 2, "compressor": None, "fill_value": 0, "order": "C",
            "filters": None, "dtype": "|u1"}
    base.update(meta)
    with open(os.path.join(path, ".zarray"), "w") as f:
        json.dump(base, f)


# --- 3. sizes from untrusted bytes: no allocation before a check ------------------------------


@pytest.mark.parametrize("length", [2**62, 2**33], ids=["2^62", "2^33"])
@pytest.mark.parametrize("limit", [None, 4 << 30], ids=["unlimited", "rlimit_as_4G"])
def test_a_shard_index_entry_longer_than_the_shard_is_a_shard_index_error(tmp_path, length,
                                                                         limit):
    p = tmp_path / "s.zarr"
    sharded(p)
    patch_index_entry(p / "c" / "0" / "0", 16, 0, 0, length)
    out = expect_error(f"zcrop.open({str(p)!r})[:]", "ShardIndexError", rlimit_as=limit)
    assert "c/0/0" in out and "past the end of the shard file" in out


def test_a_huge_chunk_shape_with_a_tiny_chunk_is_a_memory_error_not_an_abort(tmp_path):
    p = tmp_path / "big.zarr"
    write_v2_meta(p, shape=[2**62], chunks=[2**62], compressor={"id": "zstd", "level": 1})
    import numcodecs

    (p / "0").write_bytes(numcodecs.Zstd().encode(b"x" * 20))
    out = expect_error(f"zcrop.open({str(p)!r})[:10]", "OutOfMemoryError")
    assert str(2**62) in out and '"0"' in out
    # A raw chunk of the wrong size is a codec error naming the sizes.
    write_v2_meta(p, shape=[2**62], chunks=[2**62])
    (p / "0").write_bytes(b"x" * 20)
    with pytest.raises(zcrop.CodecError, match="20 bytes"):
        zcrop.open(str(p))[:10]


def test_a_valid_chunk_larger_than_the_address_space_limit_is_a_memory_error(tmp_path):
    p = tmp_path / "large.zarr"
    n = 1600 << 20
    write_v2_meta(p, shape=[n], chunks=[n])
    with open(p / "0", "wb") as f:
        f.truncate(n)  # sparse: no disk used
    out = expect_error(f"zcrop.open({str(p)!r})[:10]", "OutOfMemoryError", rlimit_as=2 << 30)
    assert "cannot allocate" in out
    # And it is also the builtin MemoryError.
    assert issubclass(zcrop.OutOfMemoryError, MemoryError)


# --- 4. sizes from metadata: checked at open ---------------------------------------------------
# (Arrays themselves may be larger than 2^64 bytes: their chunks, mostly missing, still read;
# see zarr-front/tests/errors.rs. What must fit is what is ever allocated: a chunk, an index.)

OVERFLOWING = [
    ("2d_u8", dict(shape=[2**40, 2**40], chunks=[2**40, 2**40], dtype="<u8")),
    ("1d_u8", dict(shape=[2**63 - 1], chunks=[2**62], dtype="<u8")),
    ("2d_u1", dict(shape=[2**62, 4], chunks=[2**62, 4], dtype="|u1")),
    # The array fits in 2^64 bytes, one chunk does not fit in memory.
    ("chunk", dict(shape=[2**62], chunks=[2**62], dtype="<u2")),
]


@pytest.mark.parametrize(("name", "meta"), OVERFLOWING, ids=[n for n, _ in OVERFLOWING])
def test_overflowing_sizes_are_metadata_errors_at_open(tmp_path, name, meta):
    p = tmp_path / f"{name}.zarr"
    write_v2_meta(p, **meta)
    with pytest.raises(zcrop.MetadataError, match="bytes"):
        zcrop.open(str(p))


def v3_sharded_meta(shape, shard, inner):
    return {
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": shard}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": inner, "codecs": [{"name": "bytes"}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}}],
    }


@pytest.mark.parametrize(("shape", "shard", "inner", "what"), [
    ([2**62, 2**62], [2**62, 2**62], [1, 1], "a shard index"),
    ([2**31, 2**31], [2**31, 2**31], [1, 1], "a shard index"),
    ([2**62, 4], [2**62, 4], [2**62, 4], "a chunk"),
])
def test_overflowing_shard_sizes_are_metadata_errors_at_open(tmp_path, shape, shard, inner,
                                                             what):
    p = tmp_path / "s.zarr"
    p.mkdir()
    (p / "zarr.json").write_text(json.dumps(v3_sharded_meta(shape, shard, inner)))
    with pytest.raises(zcrop.MetadataError, match=what):
        zcrop.open(str(p))


# --- 2. files rewritten or deleted under a live array -----------------------------------------

LAYOUTS = [
    pytest.param(dict(zarr_format=2), id="v2"),
    pytest.param(dict(zarr_format=3), id="v3"),
    pytest.param(dict(zarr_format=3, shards=(4, 4)), id="v3-sharded"),
]


def chunk_files(root):
    return [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
            if not f.startswith(".") and f != "zarr.json"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("chunk_cache", [None, 1 << 20], ids=["no-cache", "chunk-cache"])
def test_a_store_rewritten_by_zarr_python_reads_its_new_values(tmp_path, layout, chunk_cache):
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(8, 8), chunks=(2, 2), dtype="u2", **layout)
    z[:] = 1
    a = zcrop.open(p, chunk_cache=chunk_cache)
    assert a[:].sum() == 64
    assert a.read_crops([[0, 0]], (8, 8)).sum() == 64
    zarr.open_array(p, mode="r+")[:] = np.arange(64, dtype="u2").reshape(8, 8)
    want = np.arange(64).reshape(8, 8)
    for arr in (a, zcrop.open(p, chunk_cache=chunk_cache)):
        assert np.array_equal(arr[:], want)
        assert np.array_equal(arr.read_crops([[2, 2]], (4, 4))[0], want[2:6, 2:6])
    # Deleted chunks read as the fill value, through the same array too.
    for f in chunk_files(p):
        os.remove(f)
    for arr in (a, zcrop.open(p, chunk_cache=chunk_cache)):
        assert arr[:].sum() == 0
        assert arr.read_crops([[1, 1]], (3, 3)).sum() == 0


def test_a_shard_rewritten_in_place_is_read_again(tmp_path):
    """Same inode, new contents (a writer that truncates and rewrites): the cached index of
    the old contents must not be used."""
    p = str(tmp_path / "a.zarr")
    z = zarr.create_array(p, shape=(8,), chunks=(2,), shards=(8,), dtype="u2", compressors=None)
    z[:] = 1
    a = zcrop.open(p)
    assert a[:].sum() == 8
    other = str(tmp_path / "b.zarr")
    y = zarr.create_array(other, shape=(8,), chunks=(2,), shards=(8,), dtype="u2",
                          compressors=None)
    y[:] = np.arange(8, dtype="u2")
    y[0:2] = 0  # an inner chunk of fill value: the index differs, not only the data
    new = open(os.path.join(other, "c", "0"), "rb").read()
    shard = os.path.join(p, "c", "0")
    ino = os.stat(shard).st_ino
    with open(shard, "r+b") as f:
        f.truncate(0)
        f.write(new)
    assert os.stat(shard).st_ino == ino
    assert np.array_equal(a[:], np.r_[0, 0, np.arange(2, 8)])


# --- 5. file descriptors ----------------------------------------------------------------------


def test_reading_more_chunk_files_than_the_descriptor_limit_leaves_descriptors_to_the_app(
    tmp_path,
):
    p = str(tmp_path / "many.zarr")
    z = zarr.create_array(p, shape=(1100, 4), chunks=(1, 4), dtype="u2", zarr_format=2,
                          compressors=None)
    z[:] = np.arange(4400, dtype="u2").reshape(1100, 4)
    out = child(f"""
        import asyncio, numpy as np, zcrop
        a = zcrop.open({p!r})
        for _ in range(2):
            assert (a[:] == np.arange(4400).reshape(1100, 4)).all()
        # The application can still open files, import and run asyncio.
        files = [open({p!r} + "/.zarray") for _ in range(600)]
        import decimal, fractions
        asyncio.run(asyncio.sleep(0))
        print("ok", len(files))
    """, nofile=1024)
    assert out.strip() == "ok 600"


def test_out_of_descriptors_is_a_store_error_and_the_app_recovers(tmp_path):
    """The limit is lowered below what the engine planned for after it started: zcrop closes
    its cached files and retries; where even that cannot work, the read is a StoreError (not a
    metadata error), and the application can open files afterwards."""
    p = str(tmp_path / "many.zarr")
    z = zarr.create_array(p, shape=(300, 4), chunks=(1, 4), dtype="u2", zarr_format=2,
                          compressors=None)
    z[:] = 7
    out = child(f"""
        import os, resource, zcrop
        a = zcrop.open({p!r})
        assert a[:].sum() == 7 * 1200          # the cache now holds files open
        used = len(os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + 8, used + 8))
        b = zcrop.open({p!r})
        assert b[:].sum() == 7 * 1200          # evicts and retries
        hog = []
        try:
            while True:
                hog.append(open("/dev/null"))
        except OSError:
            pass
        try:
            a[100:200]
            print("read")
        except zcrop.StoreError as e:
            assert "Too many open files" in str(e) or "descriptor" in str(e), str(e)
            print("StoreError")
        del hog
        open({p!r} + "/.zarray").close()
        print("recovered")
    """)
    lines = out.split()
    assert lines[-1] == "recovered" and lines[-2] in ("read", "StoreError"), out


# --- 7. special files, messages, options, deadlines, nesting ----------------------------------


def test_a_fifo_as_chunk_or_metadata_is_refused_not_waited_on(tmp_path):
    p = str(tmp_path / "fifo.zarr")
    z = zarr.create_array(p, shape=(4,), chunks=(2,), dtype="u1", zarr_format=2,
                          compressors=None)
    z[:] = 1
    os.remove(p + "/0")
    os.mkfifo(p + "/0")
    t = time.monotonic()
    with pytest.raises(zcrop.StoreError, match="FIFO") as e:
        zcrop.open(p)[:]
    assert e.value.key == "0"
    # A device where a chunk should be.
    os.remove(p + "/0")
    os.symlink("/dev/zero", p + "/0")
    with pytest.raises(zcrop.StoreError, match="character device"):
        zcrop.open(p)[:]
    os.remove(p + "/.zarray")
    os.mkfifo(p + "/.zarray")
    with pytest.raises(zcrop.StoreError, match="FIFO"):
        zcrop.open(p)
    assert time.monotonic() - t < 30


def test_metadata_that_cannot_be_read_is_a_store_error(tmp_path):
    p = tmp_path / "a.zarr"
    (p / ".zarray").mkdir(parents=True)
    with pytest.raises(zcrop.StoreError, match="directory"):
        zcrop.open(str(p))


def test_node_not_found_reads_like_file_not_found(tmp_path):
    missing = str(tmp_path / "nothing.zarr")
    with pytest.raises(zcrop.NodeNotFoundError) as e:
        zcrop.open(missing)
    import errno

    assert e.value.errno == errno.ENOENT
    assert e.value.filename == missing
    assert str(e.value) == f"[Errno 2] No Zarr array or group: {missing!r}"


def test_a_dotdot_key_in_consolidated_metadata_is_skipped_with_a_warning(tmp_path):
    p = str(tmp_path / "g.zarr")
    g = zarr.open_group(p, mode="w", zarr_format=2)
    g.create_array("a", shape=(2,), dtype="u1")
    zarr.consolidate_metadata(p)
    meta = json.load(open(p + "/.zmetadata"))
    meta["metadata"]["../.zarray"] = meta["metadata"]["a/.zarray"]
    meta["metadata"]["a/../../b/.zgroup"] = {"zarr_format": 2}
    json.dump(meta, open(p + "/.zmetadata", "w"))
    with pytest.warns(UserWarning, match=r"left out: '\.\./\.zarray', 'a/\.\./\.\./b/\.zgroup'"):
        grp = zcrop.open_group(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert [name for name, _ in grp.arrays()] == ["a"]
        assert [name for name, _ in grp.members()] == ["a"]


@pytest.mark.parametrize("options", [
    {"no_such_option": "1"}, {"max_retries": "many"}, {"retry_timeout": "soon"},
])
def test_bad_storage_options_are_invalid_argument_errors(options):
    with pytest.raises(zcrop.InvalidArgumentError):
        zcrop.open("s3://bucket/data.zarr", storage_options=options)


def test_storage_options_on_a_local_path_are_an_invalid_argument_error(tmp_path):
    with pytest.raises(zcrop.InvalidArgumentError, match="local path"):
        zcrop.open(str(tmp_path), storage_options={"anon": True})


def test_a_server_that_never_answers_fails_the_read_within_its_deadline():
    """A TCP server that accepts connections and never answers: the read raises StoreError
    within the deadline the options set (timeout + retry_timeout), it does not hang."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = server.getsockname()[1]
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "region": "us-east-1",
               "access_key_id": "x", "secret_access_key": "y",
               "timeout": "1s", "retry_timeout": 2, "max_retries": 2}
    t = time.monotonic()
    try:
        with pytest.raises(zcrop.StoreError):
            zcrop.open("s3://bucket/data.zarr", storage_options=options)
        assert time.monotonic() - t < 15
    finally:
        server.close()
        for c in held:
            c.close()


def test_the_default_object_store_deadline_is_documented():
    import zcrop._api

    doc = zcrop._api.__doc__
    assert "retry_timeout" in doc and "90 seconds" in doc


def test_metadata_nested_as_deep_as_zarr_python_reads_opens(tmp_path):
    p = str(tmp_path / "n.zarr")
    z = zarr.create_array(p, shape=(4,), chunks=(2,), dtype="u1", zarr_format=3)
    z[:] = 3
    meta = json.load(open(p + "/zarr.json"))
    for depth, ok in [(200, True), (600, False)]:
        v: object = 1
        for _ in range(depth):
            v = [v]
        meta["attributes"] = {"deep": v}
        with open(p + "/zarr.json", "w") as f:
            f.write(json.dumps(meta))
        if ok:
            assert zarr.open_array(p)[:].sum() == 12
            assert zcrop.open(p)[:].sum() == 12
        else:
            with pytest.raises(zcrop.MetadataError, match="nested"):
                zcrop.open(p)
