"""Every selection kind, over every numeric dtype in both byte orders, Zarr v2 and v3, each
compressor zcrop decodes itself, with edge chunks: zcrop reads what zarr-python reads.

The data repeats values, so that zstd writes sequences (matches) and zcrop's partial decoding
of a chunk engages and starts mid-element; big-endian data is then swapped from a range that
does not start on an element, the case this file exists to pin.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zcrop
from conftest import assert_same
from selections import any_selection_kind

DTYPES = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16"]
ORDERS = ["<", ">"]
#: (shape, chunks): edge chunks along every dimension.
SHAPES = [((11, 9), (4, 4)), ((13, 7, 6), (5, 3, 4))]
#: (zarr format, compressor, sharded)
LAYOUTS = [
    (2, "zstd", False),
    (2, "blosc", False),
    (2, "gzip", False),
    (2, None, False),
    (3, "zstd", False),
    (3, "blosc", False),
    (3, "gzip", False),
    (3, None, False),
    (3, "zstd", True),
]

EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def repetitive(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values drawn from a small set, in runs, and noise: compressible, with matches at odd
    offsets."""
    n = int(np.prod(shape))
    # Small values (zero high bytes: matches that start mid-element) and wide ones.
    palette = np.concatenate([rng.integers(0, 1000, size=4), rng.integers(0, 2**62, size=3)])
    runs = rng.integers(1, 6, size=n)
    flat = np.repeat(palette[rng.integers(0, 7, size=n)], runs)[:n]
    noise = rng.random(n) < 0.3
    flat[noise] = rng.integers(0, 1000, size=int(noise.sum()))
    if dtype.kind in "fc":
        # Small multiples of 1/4, exact in float16.
        flat = (flat % 2000) / 4.0
        if dtype.kind == "c":
            flat = flat + 1j * np.roll(flat, 3)
        return flat.astype(dtype).reshape(shape)
    return flat.astype(dtype).reshape(shape)  # wraps to the type's width


def compressors(fmt: int, name: str | None, dtype: np.dtype):
    if name is None:
        return None
    if fmt == 2:
        import numcodecs

        return {
            "zstd": numcodecs.Zstd(level=1),
            "blosc": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
            "gzip": numcodecs.GZip(level=1),
        }[name]
    return {
        "zstd": zarr.codecs.ZstdCodec(level=1),
        "blosc": zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle", typesize=dtype.itemsize),
        "gzip": zarr.codecs.GzipCodec(level=1),
    }[name]


class Paths(dict):
    """The written arrays by (dtype, order, shape index, layout index); a short repr keeps
    hypothesis' failure reports readable."""

    def __repr__(self) -> str:
        return f"<{len(self)} arrays>"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Writes each (dtype, order, shape, layout) array once; yields a lookup of their paths."""
    root = tmp_path_factory.mktemp("dtypes")
    rng = np.random.default_rng(36)
    paths = Paths()
    for dt in DTYPES:
        for order in ORDERS:
            dtype = np.dtype(order + dt)
            for si, (shape, chunks) in enumerate(SHAPES):
                data = repetitive(dtype, shape, rng)
                for li, (fmt, comp, sharded) in enumerate(LAYOUTS):
                    p = root / f"{order.replace('<', 'le').replace('>', 'be')}_{dt}_{si}_{li}.zarr"
                    kw = {}
                    if fmt == 3:
                        kw["serializer"] = zarr.codecs.BytesCodec(
                            endian="big" if order == ">" else "little"
                        )
                        if sharded:
                            kw["shards"] = tuple(c * 2 for c in chunks)
                    z = zarr.create_array(
                        str(p), shape=shape, chunks=chunks, dtype=dtype, zarr_format=fmt,
                        compressors=compressors(fmt, comp, dtype), fill_value=0, **kw,
                    )
                    z[...] = data
                    paths[(dt, order, si, li)] = str(p)
    return paths


def arrays(store, dt, order, data):
    si = data.draw(st.integers(0, len(SHAPES) - 1), label="shape")
    li = data.draw(st.integers(0, len(LAYOUTS) - 1), label="layout")
    p = store[(dt, order, si, li)]
    return zarr.open_array(p, mode="r"), zcrop.open_array(p)


CASES = [(dt, o) for dt in DTYPES for o in ORDERS]
IDS = [f"{o.replace('<', 'le').replace('>', 'be')}-{dt}" for dt, o in CASES]


@pytest.mark.parametrize(("dt", "order"), CASES, ids=IDS)
def test_whole_arrays(store, dt, order):
    for si in range(len(SHAPES)):
        for li in range(len(LAYOUTS)):
            p = store[(dt, order, si, li)]
            assert_same(zarr.open_array(p, mode="r")[...], zcrop.open_array(p)[...])


@pytest.mark.parametrize(("dt", "order"), CASES, ids=IDS)
@given(data=st.data())
@EXAMPLES
def test_every_selection_kind(store, dt, order, data):
    z, a = arrays(store, dt, order, data)
    any_selection_kind(z, a, data)
