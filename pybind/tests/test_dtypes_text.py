"""The fixed-size dtypes beyond the numeric ones, as zarr-python 3 and xarray write them:
fixed-width unicode (v3 ``fixed_length_utf32``, v2 ``<U``/``>U``), fixed-width bytes (v3
``null_terminated_bytes``, v2 ``|S``), datetime64 and timedelta64 (v3 ``numpy.datetime64`` /
``numpy.timedelta64`` with a scale factor, v2 ``<M8``/``<m8``). Each in Zarr v2 and v3, with and
without a compressor, sharded, big-endian where the type has a byte order, with fill values
(v2 ``null`` included), missing chunks and edge chunks: zcrop reports the dtype and fill value
zarr-python reports and reads the same values for every selection kind.

Variable-length strings and bytes (v3 ``string`` / ``variable_length_bytes``, v2 ``|O`` with
the vlen-utf8 / vlen-bytes codecs), as zarr-python and xarray write them, read the same for
every selection kind; batched crop reads of them are a typed error. Data types zcrop does not
read (structured dtypes) raise a typed error naming the array and the data type when opened.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop
from conftest import assert_same
from selections import any_selection_kind

#: numpy dtypes (byte order included where zarr-python keeps it in v2).
DTYPES = ["<U5", ">U5", "|S3", "<M8[ns]", ">M8[s]", "<M8[10s]", "<m8[ms]", "<m8[s]"]
#: (shape, chunks): edge chunks along every dimension.
SHAPES = [((11, 9), (4, 4)), ((13, 7, 6), (5, 3, 4))]
#: (zarr format, compressor, sharded)
LAYOUTS = [(2, "zstd", False), (2, None, False), (3, "zstd", False), (3, None, False), (3, "zstd", True)]
#: Fill values: the dtype's default, a chosen one, and (v2) ``null``.
FILLS = ["default", "value", "null"]

EXAMPLES = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

pytestmark = pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")


def values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values of `dtype` that exercise it: strings of every length up to the width, non-ASCII
    code points (some outside the BMP), NaT among times."""
    n = int(np.prod(shape))
    if dtype.kind == "U":
        alphabet = list("abcxyz") + ["é", "漢", "😀", " "]
        width = dtype.itemsize // 4
        flat = ["".join(rng.choice(alphabet, size=rng.integers(0, width + 1))) for _ in range(n)]
        return np.array(flat, dtype=dtype).reshape(shape)
    if dtype.kind == "S":
        flat = [bytes(rng.integers(1, 256, size=rng.integers(0, dtype.itemsize + 1)).astype(np.uint8)) for _ in range(n)]
        return np.array(flat, dtype=dtype).reshape(shape)
    ints = rng.integers(-(2**40), 2**40, size=n)
    ints[rng.random(n) < 0.2] = np.iinfo(np.int64).min  # NaT
    return ints.view(dtype.newbyteorder("=")).astype(dtype).reshape(shape)


def fill_value(dtype: np.dtype, which: str):
    if which != "value":
        return None
    return {"U": "zé", "S": b"ab", "M": np.datetime64(123456, "s"), "m": np.timedelta64(7, "s")}[dtype.kind]


def write(path, dtype, shape, chunks, layout, fill, rng):
    fmt, comp, sharded = layout
    kw = {}
    if fmt == 3:
        if dtype.kind in "UMm":
            kw["serializer"] = zarr.codecs.BytesCodec(endian="big" if dtype.byteorder == ">" else "little")
        if sharded:
            kw["shards"] = tuple(c * 2 for c in chunks)
        kw["compressors"] = zarr.codecs.ZstdCodec(level=1) if comp else None
    else:
        import numcodecs

        kw["compressors"] = numcodecs.Zstd(level=1) if comp else None
    z = zarr.create_array(
        str(path), shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt,
        fill_value=fill_value(dtype, fill), **kw,
    )
    data = values(dtype, shape, rng)
    # The first dimension's last chunk stays unwritten (missing: the fill value), and the
    # written region ends mid-chunk elsewhere.
    stop = (shape[0] - 1) // chunks[0] * chunks[0]
    z[:stop] = data[:stop]
    if fill == "null" and fmt == 2:
        meta = json.loads((path / ".zarray").read_text())
        meta["fill_value"] = None
        (path / ".zarray").write_text(json.dumps(meta))


class Paths(dict):
    """The written arrays by (dtype, shape index, layout index, fill); a short repr keeps
    hypothesis' failure reports readable."""

    def __repr__(self) -> str:
        return f"<{len(self)} arrays>"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtypes_text")
    rng = np.random.default_rng(29)
    paths = Paths()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dt in DTYPES:
            dtype = np.dtype(dt)
            for si, (shape, chunks) in enumerate(SHAPES):
                for li, layout in enumerate(LAYOUTS):
                    for fill in FILLS:
                        if fill == "null" and layout[0] != 2:
                            continue
                        p = root / f"{DTYPES.index(dt)}_{si}_{li}_{fill}.zarr"
                        write(p, dtype, shape, chunks, layout, fill, rng)
                        paths[(dt, si, li, fill)] = str(p)
    return paths


@pytest.mark.parametrize("dt", DTYPES)
def test_dtype_fill_value_and_whole_arrays(store, dt):
    for (d, *_), p in store.items():
        if d != dt:
            continue
        z, a = zarr.open_array(p, mode="r"), zcrop.open_array(p)
        assert a.dtype == z.dtype, (p, a.dtype, z.dtype)
        assert str(a.dtype) == str(z.dtype)
        assert repr(a.fill_value) == repr(z.fill_value), (p, a.fill_value, z.fill_value)
        assert_same(z[...], a[...])
        assert_same(z[(0,) * z.ndim], a[(0,) * a.ndim])
        assert_same(z[(-1,) * z.ndim], a[(-1,) * a.ndim])


@pytest.mark.parametrize("dt", DTYPES)
@given(data=st.data())
@EXAMPLES
def test_every_selection_kind(store, dt, data):
    keys = sorted(k for k in store if k[0] == dt)
    p = store[data.draw(st.sampled_from(keys), label="array")]
    z, a = zarr.open_array(p, mode="r"), zcrop.open_array(p)
    any_selection_kind(z, a, data)


@pytest.fixture(scope="module")
def xarray_stores(tmp_path_factory):
    """A dataset with every dtype xarray writes, to_zarr'd in v2 and v3 (xarray stores the
    times as CF int64, the object strings as variable-length strings)."""
    xr = pytest.importorskip("xarray")
    root = tmp_path_factory.mktemp("xarray_dtypes")
    ds = xr.Dataset({
        "name": (("s",), np.array(["abc", "de", "fghij"])),
        "chan": (("c",), np.array([b"ir", b"vis"], dtype="S3")),
        "obj": (("s",), np.array(["x", "yy", "zzz"], dtype=object)),
        "t": (("s",), np.array(["2020-01-01", "NaT", "2021-06-01T12"], dtype="M8[ns]")),
        "dt": (("s",), np.array([1, 2, 3], dtype="m8[s]")),
    })
    paths = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fmt in (2, 3):
            paths[fmt] = str(root / f"v{fmt}.zarr")
            ds.to_zarr(paths[fmt], mode="w", zarr_format=fmt, consolidated=fmt == 2)
    return paths


@pytest.mark.parametrize("fmt", [2, 3])
def test_xarray_written_fixed_size_variables(xarray_stores, fmt):
    zg = zarr.open_group(xarray_stores[fmt], mode="r")
    g = zcrop.open_group(xarray_stores[fmt])
    for name in ("name", "chan", "t", "dt"):
        z, a = zg[name], g[name]
        assert a.dtype == z.dtype
        assert repr(a.fill_value) == repr(z.fill_value)
        assert_same(z[...], a[...])


@pytest.mark.parametrize("fmt", [2, 3])
def test_xarray_written_variable_length_strings(xarray_stores, fmt):
    xr = pytest.importorskip("xarray")
    z, a = zarr.open_group(xarray_stores[fmt], mode="r")["obj"], zcrop.open_group(xarray_stores[fmt])["obj"]
    assert a.dtype == z.dtype
    assert repr(a.fill_value) == repr(z.fill_value)
    assert_same(z[...], a[...])
    kw = {"consolidated": fmt == 2}
    xr.testing.assert_identical(
        xr.open_dataset(xarray_stores[fmt], engine="zcrop", **kw).load(),
        xr.open_zarr(xarray_stores[fmt], **kw).load(),
    )


# --- variable-length strings and bytes ---------------------------------------------------------

#: (zarr format, kind, sharded)
VLEN_LAYOUTS = [(2, "str", False), (2, "bytes", False), (3, "str", False), (3, "bytes", False), (3, "str", True)]


def vlen_values(kind: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Strings (empty, long, non-ASCII, outside the BMP) or bytes (any byte, NUL included)."""
    n = int(np.prod(shape))
    lengths = rng.choice([0, 1, 3, 40, 300], size=n)
    if kind == "str":
        alphabet = list("abcxyz") + ["é", "漢", "😀", " ", "\x00"]
        flat = ["".join(rng.choice(alphabet, size=k)) for k in lengths]
    else:
        flat = [bytes(rng.integers(0, 256, size=k).astype(np.uint8)) for k in lengths]
    return np.array(flat, dtype=object).reshape(shape)


@pytest.fixture(scope="module")
def vlen_store(tmp_path_factory):
    """Variable-length arrays in every layout, with edge chunks and chunks never written."""
    from zarr.dtype import VariableLengthBytes, VariableLengthUTF8

    root = tmp_path_factory.mktemp("vlen")
    rng = np.random.default_rng(29)
    paths = {}
    for fmt, kind, sharded in VLEN_LAYOUTS:
        for shape, chunks in SHAPES:
            p = str(root / f"v{fmt}-{kind}-{sharded}-{len(shape)}d.zarr")
            dtype = VariableLengthUTF8() if kind == "str" else VariableLengthBytes()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z = zarr.create_array(
                    p, shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt,
                    shards=tuple(2 * c for c in chunks) if sharded else None,
                )
                data = vlen_values(kind, shape, rng)
                # Leave the last chunk along the first dimension unwritten: fill values.
                keep = tuple(slice(0, (shape[0] - 1) // chunks[0] * chunks[0]) if d == 0 else slice(None)
                             for d in range(len(shape)))
                z[keep] = data[keep]
            paths[(fmt, kind, sharded, len(shape))] = p
    return paths


def test_vlen_dtype_fill_value_and_whole_arrays(vlen_store):
    for p in vlen_store.values():
        z, a = zarr.open_array(p, mode="r"), zcrop.open_array(p)
        assert a.dtype == z.dtype, p
        assert a.fill_value == z.fill_value, p
        assert_same(z[...], a[...])


@given(data=st.data())
@EXAMPLES
def test_vlen_every_selection_kind(vlen_store, data):
    p = vlen_store[data.draw(st.sampled_from(sorted(vlen_store)), label="array")]
    z, a = zarr.open_array(p, mode="r"), zcrop.open_array(p)
    any_selection_kind(z, a, data, kinds=("basic", "orthogonal", "coordinate", "mask"))


def test_vlen_out_and_async(vlen_store):
    import asyncio

    p = vlen_store[(3, "str", True, 3)]
    z = zarr.open_array(p, mode="r")
    a = zcrop.open_array(p)
    out = np.empty((3, 2, 6), dtype=a.dtype)
    assert a.get_basic_selection((slice(2, 5), slice(1, 3)), out=out) is out
    assert_same(z[2:5, 1:3], out)

    async def read():
        aa = await zcrop.open_async(p)
        return await aa.getitem((slice(None), 2)), await aa.vindex.getitem(([0, 12], [1, 6], [5, 0]))

    got, points = asyncio.run(read())
    assert_same(z[:, 2], got)
    assert_same(z.vindex[[0, 12], [1, 6], [5, 0]], points)


def test_vlen_crop_batches_are_a_typed_error_naming_the_array(vlen_store):
    a = zcrop.open_array(vlen_store[(3, "str", False, 2)])
    with pytest.raises(zcrop.UnsupportedError, match=r'"/".*variable-length string'):
        a.read_crops([[0, 0]], [2, 2])


def test_vlen_box_too_large_to_hold_is_an_error_not_an_abort(tmp_path):
    from zarr.dtype import VariableLengthUTF8

    p = str(tmp_path / "huge.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.create_array(p, shape=(2**61,), chunks=(2**58,), dtype=VariableLengthUTF8())
    a = zcrop.open_array(p)
    assert a[5] == ""
    with pytest.raises(zcrop.OutOfMemoryError, match=r'"/"'):
        a[...]


def test_vlen_corrupt_chunks_are_codec_errors_naming_the_key(tmp_path):
    """Truncated and bit-flipped chunks, and bytes that are not UTF-8 in a string array: a
    CodecError naming the chunk's key (or, where the damage still parses, values), never a
    crash or a panic."""
    from zarr.dtype import VariableLengthBytes

    rng = np.random.default_rng(7)
    p = tmp_path / "v.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z = zarr.create_array(str(p), shape=(6,), chunks=(6,), dtype=VariableLengthBytes(), compressors=None)
        z[:] = np.array([b"ab", b"\xff\xfe", b"", b"xyz", b"q" * 50, b"r"], dtype=object)
    good = (p / "c" / "0").read_bytes()
    # The same bytes as text: vlen-bytes and vlen-utf8 share their encoding.
    meta = json.loads((p / "zarr.json").read_text())
    meta["data_type"] = "string"
    meta["fill_value"] = ""
    meta["codecs"][0]["name"] = "vlen-utf8"
    (p / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(zcrop.CodecError, match=r"c/0.*element 1 .*not UTF-8"):
        zcrop.open_array(str(p))[...]
    for _ in range(60):
        bad = bytearray(good)
        if rng.random() < 0.5:
            bad = bad[: rng.integers(0, len(bad))]
        else:
            for i in rng.integers(0, len(bad), size=3):
                bad[i] = int(rng.integers(0, 256))
        (p / "c" / "0").write_bytes(bytes(bad))
        try:
            zcrop.open_array(str(p))[...]
        except zcrop.CodecError as e:
            assert "c/0" in str(e)


def test_unreadable_dtypes_are_a_typed_error_not_a_metadata_error(tmp_path):
    p = tmp_path / "structured.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.create_array(str(p), shape=(4,), dtype=[("a", "<i4"), ("b", "<f4")], zarr_format=2, fill_value=None)
    with pytest.raises(zcrop.UnsupportedError, match=r'"/".*data type') as e:
        zcrop.open_array(str(p))
    assert "metadata" not in str(e.value)
