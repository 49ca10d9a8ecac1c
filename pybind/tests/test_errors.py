"""Bad inputs raise the right exception types, with the key and byte range where it matters;
none crashes the interpreter."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zcrop
from conftest import FIXTURES


def copy_fixture(tmp_path: pathlib.Path, name: str) -> pathlib.Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / "data" / name, dst)
    return dst


# --- missing stores and wrong node types ------------------------------------------------------


@pytest.mark.parametrize("opener", [zcrop.open, zcrop.open_array, zcrop.open_group])
def test_missing_store_is_file_not_found(tmp_path, opener):
    with pytest.raises(FileNotFoundError) as e:
        opener(str(tmp_path / "nope.zarr"))
    assert isinstance(e.value, zcrop.NodeNotFoundError)
    assert isinstance(e.value, zcrop.ZcropError)
    assert "nope.zarr" in str(e.value)


def test_missing_store_is_file_not_found_async(tmp_path):
    with pytest.raises(FileNotFoundError):
        asyncio.run(zcrop.open_async(tmp_path / "nope.zarr"))


def test_an_empty_directory_is_not_a_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        zcrop.open(tmp_path)


def test_wrong_node_type():
    with pytest.raises(zcrop.NodeTypeError) as e:
        zcrop.open_array(FIXTURES / "data/v3_hierarchy.zarr")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, ValueError)
    with pytest.raises(zcrop.NodeTypeError):
        zcrop.open_group(FIXTURES / "data/v2_zstd_be_u2.zarr")


def test_zarr_format_mismatch_is_not_found():
    with pytest.raises(FileNotFoundError):
        zcrop.open(FIXTURES / "data/v2_zstd_be_u2.zarr", zarr_format=3)
    assert zcrop.open(FIXTURES / "data/v2_zstd_be_u2.zarr", zarr_format=2).zarr_format == 2


def test_store_arguments():
    path = FIXTURES / "data/v2_zstd_be_u2.zarr"
    assert zcrop.open(f"file://{path}").shape == (30, 41)
    assert zcrop.open(store=path, mode="r").shape == (30, 41)
    import zarr.storage

    assert zcrop.open(zarr.storage.LocalStore(path, read_only=True)).shape == (30, 41)
    for mode in ("w", "w-", "x"):
        with pytest.raises(ValueError, match="reading"):
            zcrop.open(path, mode=mode)
    with pytest.raises(ValueError):
        zcrop.open(path, storage_options={"anon": True})
    with pytest.raises(TypeError):
        zcrop.open(path, not_an_option=1)
    with pytest.raises(TypeError):
        zcrop.open(12345)
    with pytest.raises(TypeError):
        zcrop.open()


# --- metadata ---------------------------------------------------------------------------------


def test_invalid_metadata_json_is_a_value_error(tmp_path):
    store = copy_fixture(tmp_path, "v3_bytes_le_raw.zarr")
    (store / "zarr.json").write_text("{")
    with pytest.raises(ValueError) as e:
        zcrop.open(store)
    assert isinstance(e.value, zcrop.MetadataError)
    assert "zarr.json" in str(e.value)


def test_invalid_metadata_fields_are_a_value_error(tmp_path):
    store = copy_fixture(tmp_path, "v3_bytes_le_raw.zarr")
    meta = json.loads((store / "zarr.json").read_text())
    meta["shape"] = "not a shape"
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(zcrop.MetadataError):
        zcrop.open_array(store)


def test_invalid_v2_metadata(tmp_path):
    store = copy_fixture(tmp_path, "v2_zstd_be_u2.zarr")
    (store / ".zarray").write_text('{"zarr_format": 2, "shape": [3]}')
    with pytest.raises(zcrop.MetadataError):
        zcrop.open(store)
    (store / ".zarray").write_text("[1, 2")
    with pytest.raises(ValueError):
        zcrop.open(store)


def test_unsupported_codec(tmp_path):
    store = copy_fixture(tmp_path, "v3_bytes_le_raw.zarr")
    meta = json.loads((store / "zarr.json").read_text())
    meta["codecs"].append({"name": "no_such_codec"})
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(zcrop.UnsupportedError) as e:
        zcrop.open(store)
    assert isinstance(e.value, NotImplementedError)
    assert "no_such_codec" in str(e.value)


def test_unsupported_data_type(tmp_path):
    store = copy_fixture(tmp_path, "v3_bytes_le_raw.zarr")
    meta = json.loads((store / "zarr.json").read_text())
    meta["data_type"] = "int4"
    meta["fill_value"] = 0
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(zcrop.ZcropError) as e:
        zcrop.open(store)
    assert isinstance(e.value, (zcrop.UnsupportedError, zcrop.MetadataError))


def test_strings_through_a_codec_other_than_vlen_utf8_are_unsupported(tmp_path):
    store = copy_fixture(tmp_path, "v3_bytes_le_raw.zarr")
    meta = json.loads((store / "zarr.json").read_text())
    meta["data_type"] = "string"
    meta["fill_value"] = ""
    meta["codecs"] = [{"name": "vlen", "configuration": {}}]
    (store / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(zcrop.UnsupportedError, match=r"vlen"):
        zcrop.open(store)


# --- corrupt data -----------------------------------------------------------------------------


def test_corrupt_chunk_is_a_codec_error_naming_the_key(tmp_path):
    store = copy_fixture(tmp_path, "v2_zstd_be_u2.zarr")
    (store / "1.1").write_bytes(b"this is not zstd data" * 3)
    arr = zcrop.open_array(store)
    assert arr[:16, :16].shape == (16, 16)  # chunk 0.0 is fine
    with pytest.raises(zcrop.CodecError) as e:
        arr[...]
    assert e.value.key == "1.1"
    assert e.value.node == "/"
    assert "1.1" in str(e.value)


def test_corrupt_inner_chunk_names_key_and_byte_range(tmp_path):
    store = copy_fixture(tmp_path, "v3_sharded_end.zarr")
    shard = store / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    # Damage the chunk payloads, not the index at the end (16 bytes per inner chunk + crc32c).
    index_len = 16 * (32 // 8) * (24 // 8) + 4
    for i in range(0, len(data) - index_len, 7):
        data[i] ^= 0x5A
    shard.write_bytes(bytes(data))
    arr = zcrop.open_array(store)
    with pytest.raises(zcrop.CodecError) as e:
        arr[:32, :24]
    assert e.value.key == "c/0/0"
    assert e.value.byte_range is not None
    start, stop = e.value.byte_range
    assert 0 <= start < stop <= len(data) - index_len
    assert f"bytes {start}..{stop}" in str(e.value)


def test_checksum_mismatch_is_a_codec_error(tmp_path):
    store = copy_fixture(tmp_path, "v3_crc32c_i1.zarr")
    chunk = next(p for p in sorted((store / "c").rglob("*")) if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(zcrop.CodecError) as e:
        zcrop.open_array(store)[...]
    assert "c/" in e.value.key


def test_corrupt_shard_index_is_a_shard_index_error(tmp_path):
    store = copy_fixture(tmp_path, "v3_sharded_end.zarr")
    shard = store / "c" / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the index: its crc32c no longer matches
    shard.write_bytes(bytes(data))
    with pytest.raises(zcrop.ShardIndexError) as e:
        zcrop.open_array(store)[...]
    assert isinstance(e.value, zcrop.CodecError)
    assert e.value.key == "c/0/0"


def test_truncated_shard_is_an_error(tmp_path):
    store = copy_fixture(tmp_path, "v3_sharded_start.zarr")
    shard = next(p for p in sorted((store / "c").rglob("*")) if p.is_file())
    shard.write_bytes(shard.read_bytes()[:20])
    with pytest.raises(zcrop.ZcropError) as e:
        zcrop.open_array(store)[...]
    assert isinstance(e.value, (zcrop.ShardIndexError, zcrop.StoreError))


def test_unreadable_chunk_is_a_store_error(tmp_path):
    store = copy_fixture(tmp_path, "v2_zstd_be_u2.zarr")
    chunk = store / "0.0"
    chunk.unlink()
    chunk.mkdir()  # a directory where the chunk file should be: reading it fails in the OS
    with pytest.raises(zcrop.StoreError) as e:
        zcrop.open_array(store)[...]
    assert isinstance(e.value, OSError)
    assert e.value.key == "0.0"


CODEC_FIXTURES = [
    "v2_blosc_lz4_shuffle.zarr",
    "v2_gzip_be_f8.zarr",
    "v2_zlib_be_i4_order_f.zarr",
    "v2_zstd_be_u2.zarr",
    "v3_transpose_blosc_f4.zarr",
    "v3_zstd_checksum_u8.zarr",
    "v3_gzip_f2.zarr",
    "v3_bytes_le_raw.zarr",
    "v3_sharded_end.zarr",
    "v3_nested_sharding.zarr",
]


@pytest.mark.parametrize("name", CODEC_FIXTURES)
@given(garbage=st.binary(max_size=300), at=st.integers(0, 10_000))
@settings(max_examples=15, deadline=None, derandomize=True)
def test_garbage_chunks_never_crash(tmp_path_factory, name, garbage, at):
    """Any bytes in place of (or spliced into) a chunk: a result or a ZcropError."""
    store = copy_fixture(tmp_path_factory.mktemp("g"), name)
    files = sorted(p for p in store.rglob("*") if p.is_file() and not p.name.startswith((".z", "zarr.json")))
    victim = files[at % len(files)]
    old = victim.read_bytes()
    victim.write_bytes(old[: at % (len(old) + 1)] + garbage if at % 2 else garbage)
    arr = zcrop.open_array(store)
    try:
        arr[...]
        arr.read_crops(np.zeros((2, arr.ndim), dtype=np.int64), [1] * arr.ndim)
    except zcrop.ZcropError:
        pass


# --- bad selections and arguments -------------------------------------------------------------


@pytest.fixture
def arr():
    return zcrop.open_array(FIXTURES / "data/v2_zstd_be_u2.zarr")  # (30, 41)


@pytest.mark.parametrize(
    "sel, error",
    [
        ((30, 0), IndexError),
        ((0, -42), IndexError),
        ((1.5,), IndexError),
        (("a",), IndexError),
        ((None,), IndexError),
        ((0, 0, 0), IndexError),
        ((Ellipsis, Ellipsis), IndexError),
        ((slice(None, None, -1),), IndexError),
        ((slice(None, None, 0),), ValueError),
        ((np.array([0, 30]), slice(None)), IndexError),
        ((slice(None), [True, False]), IndexError),
        ((np.zeros((2, 2), dtype=int), slice(None)), IndexError),
    ],
)
def test_bad_selections(arr, sel, error):
    with pytest.raises(error):
        arr[sel]


def test_out_of_bounds_is_a_bounds_error(arr):
    with pytest.raises(zcrop.BoundsError):
        arr[30]
    with pytest.raises(zcrop.BoundsError):
        arr.vindex[[0, 1], [2, 41]]
    with pytest.raises(zcrop.BoundsError):
        arr.oindex[[0, -31], :]
    with pytest.raises(IndexError):
        arr.vindex[[0, 1], 1:3]
    with pytest.raises(zcrop.BoundsError):
        arr.read_crops([[25, 0]], (6, 5))
    with pytest.raises(zcrop.BoundsError):
        arr.read_crops([[-1, 0]], (6, 5))


def test_bad_out_arguments(arr):
    with pytest.raises(ValueError, match="shape"):
        arr.get_basic_selection(Ellipsis, out=np.empty((30, 40), ">u2"))
    with pytest.raises(ValueError, match="dtype"):
        arr.get_basic_selection(Ellipsis, out=np.empty((30, 41), "f8"))
    with pytest.raises(ValueError, match="contiguous"):
        arr.get_basic_selection(Ellipsis, out=np.empty((41, 30), ">u2").T)
    ro = np.empty((30, 41), ">u2")
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        arr.get_basic_selection(Ellipsis, out=ro)
    with pytest.raises(TypeError):
        arr.get_basic_selection(Ellipsis, out=[[0] * 41] * 30)
    with pytest.raises(ValueError):
        arr.read_crops([[0, 0]], (2, 2), out=np.empty((2, 2, 2), ">u2"))


def test_bad_read_crops_arguments(arr):
    with pytest.raises(ValueError):
        arr.read_crops([0, 0], (2, 2))  # one origin must be [[0, 0]]
    with pytest.raises(ValueError):
        arr.read_crops([[0, 0, 0]], (2, 2))
    with pytest.raises(ValueError):
        arr.read_crops([[0, 0]], (2, 2, 2))
    with pytest.raises(ValueError):
        arr.read_crops([[0, 0]], (2, -2))
    with pytest.raises(TypeError):
        arr.read_crops([[0.5, 0]], (2, 2))
    assert arr.read_crops(np.zeros((0, 2), dtype=int), (2, 2)).shape == (0, 2, 2)


def test_fields_are_rejected_like_zarr(arr):
    with pytest.raises(IndexError):
        arr["field"]
    with pytest.raises(IndexError):
        arr.get_basic_selection(Ellipsis, fields="x")


def test_the_exception_tree_is_one_hierarchy():
    for name in zcrop.errors.__all__:
        cls = getattr(zcrop, name)
        assert issubclass(cls, zcrop.ZcropError)
    assert issubclass(zcrop.StoreError, OSError)
    assert issubclass(zcrop.MetadataError, ValueError)
    assert issubclass(zcrop.BoundsError, IndexError)
    assert issubclass(zcrop.InvalidArgumentError, ValueError)
    assert issubclass(zcrop.ShardIndexError, zcrop.CodecError)


def test_read_only():
    arr = zcrop.open_array(FIXTURES / "data/v2_zstd_be_u2.zarr")
    assert arr.read_only
    with pytest.raises(TypeError):
        arr[0, 0] = 1  # type: ignore[index]
    assert os.access(FIXTURES / "data/v2_zstd_be_u2.zarr", os.R_OK)
