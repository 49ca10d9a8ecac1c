#!/usr/bin/env python3
"""A benchmark corpus of Zarr arrays that look like users' data, written by zarr-python.

    python3 benches/corpus.py                                # every kind and codec, 128M each
    python3 benches/corpus.py --size 256M --out /data/corpus --kinds satellite,precip \\
        --codecs zstd3,v2-gzip

Four kinds of data, each a time series, generated block by block (one block of time steps per
shard) from seeded ``np.random.default_rng`` streams, so the same --seed and --size give the
same values whatever subset is written:

- ``satellite``: uint16 (T, 12, Y, X) imagery: a static landscape per band (power-law spectrum),
  Gaussian sensor noise of sigma 1-2 per band, bright cloud blobs that drift and evolve, and
  zero-filled nodata swaths on some time steps. Shards (16, 12, 512, 512) of (1, 1, 128, 128);
  v2 chunks (1, 1, 256, 256). Crop (4, 12, 128, 128).
- ``era5``: float32 (time, level, lat, lon) = (T, 13, 181, 360) temperature on 13 pressure
  levels: a lapse-rate profile, a pole-to-equator gradient and anomalies with a k^-3 spatial
  power spectrum (FFT of seeded noise) evolving as an AR(1) process, plus noise of 0.02 K,
  rounded to 16 bits per field as in ERA5's GRIB archive.
  Shards (8, 13, 182, 360) of (1, 13, 91, 90); v2 chunks (1, 13, 91, 90). Crop (4, 13, 64, 64).
- ``cf-int16``: the same kind of field CF-packed into int16 (``scale_factor``, ``add_offset``,
  ``_FillValue`` = -32767, also the Zarr fill value) with levels below a smooth orography
  filled. Same layout and crop as ``era5``.
- ``precip``: float32 (T, 360, 720), mostly exact zeros with lognormal rain patches that drift.
  Shards (16, 360, 720) of (1, 180, 180); v2 chunks (1, 180, 360). Crop (4, 128, 128).

Each kind is written with every codec asked for: sharded Zarr v3 with zstd levels 1, 3 and 9
(``zstd1``, ``zstd3``, ``zstd9``), blosc (clevel 5) with LZ4 or zstd inside and byte shuffle or
bitshuffle (``blosc-lz4``, ``blosc-lz4-bit``, ``blosc-zstd``, ``blosc-zstd-bit``), and unsharded
Zarr v2 with zstd level 3, blosc-lz4 with byte shuffle and gzip level 5 (``v2-zstd``,
``v2-blosc``, ``v2-gzip``). Arrays go to OUT/<kind>/<codec>.zarr; OUT/corpus.json lists them
(shape, chunks, shards, crop, bytes stored) for ``benches/compare.py --corpus OUT``. A dataset
already written with the same kind, codec, size and seed is kept.

--size is the uncompressed size of each array (rounded down to whole shards of time steps, at
least one). The script runs under the zarr-python and numcodecs pinned in
benches/requirements-compare.txt (it re-runs itself in the benchmark virtualenv that
compare.py keeps, creating it if needed), so the encoders are the ones users run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = "corpus.json"
DONE = ".corpus-complete"


# --------------------------------------------------------------------------- sizes and layouts
def parse_size(s: str) -> int:
    """``"128M"`` -> 134217728 (K, M, G: powers of 1024; a plain number is bytes)."""
    s = s.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s.rstrip("KMG")) * mult)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Shape, chunking and crop of one kind's arrays at one size."""

    shape: tuple[int, ...]
    #: Inner chunks of the sharded v3 arrays.
    inner: tuple[int, ...]
    shards: tuple[int, ...]
    #: Chunks of the unsharded v2 arrays.
    v2_chunks: tuple[int, ...]
    crop: tuple[int, ...]


def time_steps(size: int, step_bytes: int, block: int) -> int:
    """Time steps of an array of about ``size`` bytes: whole blocks, at least one."""
    return max(block, size // step_bytes // block * block)


def satellite_layout(size: int) -> Layout:
    """uint16 (T, 12, Y, X); Y = X = 1024 from 384 MiB (one shard of time steps), else 512."""
    side = 1024 if size >= 16 * 12 * 1024 * 1024 * 2 else 512
    t = time_steps(size, 12 * side * side * 2, 16)
    return Layout((t, 12, side, side), (1, 1, 128, 128), (16, 12, 512, 512), (1, 1, 256, 256), (4, 12, 128, 128))


LEVELS = (1000, 925, 850, 700, 600, 500, 400, 300, 250, 200, 150, 100, 50)


def era5_layout(size: int, itemsize: int) -> Layout:
    """(T, 13, 181, 360): 1-degree global fields on 13 pressure levels, 8 time steps a shard."""
    t = time_steps(size, len(LEVELS) * 181 * 360 * itemsize, 8)
    return Layout((t, len(LEVELS), 181, 360), (1, 13, 91, 90), (8, 13, 182, 360), (1, 13, 91, 90), (4, 13, 64, 64))


def precip_layout(size: int) -> Layout:
    """float32 (T, 360, 720): a half-degree global field, 16 time steps a shard."""
    t = time_steps(size, 360 * 720 * 4, 16)
    return Layout((t, 360, 720), (1, 180, 180), (16, 360, 720), (1, 180, 360), (4, 128, 128))


# --------------------------------------------------------------------------- fields
def powerlaw(rng, count: int, ny: int, nx: int, slope: float):
    """``count`` periodic float32 fields of (ny, nx) with power spectrum ~ k**-slope, unit std."""
    import numpy as np

    amp = spectrum(ny, nx, slope)
    coef = rng.standard_normal((count, ny, nx // 2 + 1), dtype=np.float32) * amp
    coef = coef + 1j * rng.standard_normal((count, ny, nx // 2 + 1), dtype=np.float32) * amp
    f = np.fft.irfft2(coef, s=(ny, nx), norm="ortho").astype(np.float32)
    f -= f.mean(axis=(1, 2), keepdims=True)
    f /= f.std(axis=(1, 2), keepdims=True) + 1e-12
    return f


def spectrum(ny: int, nx: int, slope: float):
    """Amplitudes k**(-slope/2) of a real FFT grid (ny, nx // 2 + 1), zero at k = 0."""
    import numpy as np

    k = np.hypot(np.fft.fftfreq(ny)[:, None], np.fft.rfftfreq(nx)[None, :])
    k[0, 0] = np.inf
    return (k ** (-slope / 2)).astype(np.float32)


class Evolving:
    """Fields with a k**-slope spectrum that evolve in time as AR(1) in spectral space
    (``rho`` per step), ``count`` of them, unit std on average."""

    def __init__(self, rng, count: int, ny: int, nx: int, slope: float, rho: float) -> None:
        import numpy as np

        self.rng, self.ny, self.nx, self.rho = rng, ny, nx, rho
        amp = spectrum(ny, nx, slope)
        # irfft2 with norm="ortho" of unit complex noise times amp has variance ~ 2 mean(amp^2).
        self.amp = amp / np.sqrt(2 * np.mean(amp**2))
        self.state = self._noise(count)

    def _noise(self, count: int):
        import numpy as np

        shape = (count, self.ny, self.nx // 2 + 1)
        return self.rng.standard_normal(shape, dtype=np.float32) + 1j * self.rng.standard_normal(shape, dtype=np.float32)

    def step(self):
        """The fields at the next time step: float32 (count, ny, nx)."""
        import numpy as np

        self.state = self.rho * self.state + np.sqrt(1 - self.rho**2) * self._noise(self.state.shape[0])
        return np.fft.irfft2(self.state * self.amp, s=(self.ny, self.nx), norm="ortho").astype(np.float32)


#: Spectral slope and per-band standard deviation (DN) of the satellite kind's landscape.
LAND_SLOPE = 3.5
LAND_STD = (60.0, 250.0)


def satellite_blocks(layout: Layout, seed: int) -> Iterator[Any]:
    """uint16 blocks of 16 time steps: landscape + clouds + noise, nodata swaths zero."""
    import numpy as np

    t_all, bands, ny, nx = layout.shape
    rng = np.random.default_rng([seed, 1])
    common = powerlaw(rng, 1, ny, nx, LAND_SLOPE)
    own = powerlaw(rng, bands, ny, nx, LAND_SLOPE)
    means = rng.uniform(400, 3000, bands).astype(np.float32)[:, None, None]
    stds = rng.uniform(LAND_STD[0], LAND_STD[1], bands).astype(np.float32)[:, None, None]
    land = np.clip(means + stds * (0.8 * common + 0.6 * own), 1, 12000).astype(np.float32)
    sigma = rng.uniform(1.0, 2.0, bands).astype(np.float32)[:, None, None]
    cloud_tint = rng.uniform(0.85, 1.0, bands).astype(np.float32)[:, None, None]
    clouds = Evolving(rng, 2, ny, nx, 3.5, 0.9)
    drift = rng.uniform(-6, 6, 2)
    yy, xx = np.mgrid[0:ny, 0:nx].astype(np.float32)
    for t0 in range(0, t_all, 16):
        block = np.empty((16, bands, ny, nx), dtype=np.uint16)
        for i in range(16):
            t = t0 + i
            shape_field, texture = clouds.step()
            shift = (int(drift[0] * t) % ny, int(drift[1] * t) % nx)
            shape_field = np.roll(shape_field, shift, axis=(0, 1))
            texture = np.roll(texture, shift, axis=(0, 1))
            cover = np.clip((shape_field - 0.4) / 0.6, 0, 1)
            bright = 7000 + 1500 * texture
            gain = np.float32(1 + 0.03 * rng.standard_normal())
            img = land * gain * (1 - cover) + cloud_tint * bright * cover
            img += sigma * rng.standard_normal((bands, ny, nx), dtype=np.float32)
            np.clip(img, 1, 65535, out=img)
            out = img.astype(np.uint16)
            if rng.random() < 0.4:
                # The edge of the sensor's swath: a slanted line, no data beyond it.
                theta = np.deg2rad(rng.uniform(-15, 15))
                c = rng.uniform(0.3, 0.9) * nx
                nodata = xx * np.cos(theta) + yy * np.sin(theta) > c
                if rng.random() < 0.5:
                    nodata = ~nodata
                out[:, nodata] = 0
            block[i] = out
        yield t0, block


def temperature(rng, t_all: int, ny: int, nx: int) -> Iterator[Any]:
    """ERA5-like temperature (K), float32 (13, ny, nx) per time step."""
    import numpy as np

    p = np.array(LEVELS, dtype=np.float32)[:, None, None]
    lat = np.linspace(90, -90, ny, dtype=np.float32)[None, :, None]
    profile = 288 * (p / 1000) ** 0.19
    gradient = -35 * np.sin(np.deg2rad(lat)) ** 2 * (p / 1000)
    # One field shared by all levels, one per level: anomalies correlated in the vertical.
    anomalies = Evolving(rng, 1 + len(LEVELS), ny, nx, 3.0, 0.95)
    amplitude = (2 + 4 * (p / 1000)).astype(np.float32)
    for _ in range(t_all):
        a = anomalies.step()
        field = profile + gradient + amplitude * (0.8 * a[:1] + 0.6 * a[1:])
        field += 0.02 * rng.standard_normal(field.shape, dtype=np.float32)
        yield field.astype(np.float32)


def grib16(field):
    """``field`` (levels, ny, nx) rounded as ERA5's GRIB archive stores it: per level a
    reference value plus 16-bit multiples of a power of two (ERA5 in Zarr is mostly converted
    from GRIB, so its float32 values carry that grid)."""
    import numpy as np

    f = field.astype(np.float64)
    ref = f.min(axis=(1, 2), keepdims=True)
    span = f.max(axis=(1, 2), keepdims=True) - ref
    step = 2.0 ** np.ceil(np.log2(np.maximum(span, 1e-30) / 65535))
    return (ref + np.rint((f - ref) / step) * step).astype(np.float32)


def era5_blocks(layout: Layout, seed: int) -> Iterator[Any]:
    """float32 blocks of 8 time steps of :func:`temperature`, GRIB-rounded (:func:`grib16`)."""
    import numpy as np

    t_all, _, ny, nx = layout.shape
    rng = np.random.default_rng([seed, 2])
    steps = temperature(rng, t_all, ny, nx)
    for t0 in range(0, t_all, 8):
        yield t0, np.stack([grib16(next(steps)) for _ in range(8)])


#: CF packing of the int16 kind: (value - ADD_OFFSET) / SCALE_FACTOR, rounded.
SCALE_FACTOR = 150.0 / 65532
ADD_OFFSET = 255.0
FILL_INT16 = -32767


def cf_int16_blocks(layout: Layout, seed: int) -> Iterator[Any]:
    """int16 blocks of 8 time steps: temperature CF-packed, below-ground levels filled."""
    import numpy as np

    t_all, _, ny, nx = layout.shape
    rng = np.random.default_rng([seed, 3])
    orography = np.clip(powerlaw(rng, 1, ny, nx, 3.5)[0], 0, None)
    surface_pressure = 1013 - 350 * orography
    below = np.array(LEVELS, dtype=np.float32)[:, None, None] > surface_pressure[None]
    steps = temperature(rng, t_all, ny, nx)
    for t0 in range(0, t_all, 8):
        field = np.stack([next(steps) for _ in range(8)])
        packed = np.clip(np.rint((field - ADD_OFFSET) / SCALE_FACTOR), -32766, 32767).astype(np.int16)
        packed[:, below] = FILL_INT16
        yield t0, packed


def precip_blocks(layout: Layout, seed: int) -> Iterator[Any]:
    """float32 blocks of 16 time steps: exact zeros, lognormal rain patches that drift."""
    import numpy as np

    t_all, ny, nx = layout.shape
    rng = np.random.default_rng([seed, 4])
    fields = Evolving(rng, 2, ny, nx, 3.0, 0.9)
    lat = np.linspace(90, -90, ny, dtype=np.float32)[:, None]
    # More rain near the equator: a lower threshold there.
    threshold = 1.0 + 0.6 * np.abs(np.sin(np.deg2rad(lat)))
    for t0 in range(0, t_all, 16):
        block = np.zeros((16, ny, nx), dtype=np.float32)
        for i in range(16):
            occurrence, intensity = fields.step()
            shift = (2 * (t0 + i)) % nx
            occurrence = np.roll(occurrence, shift, axis=1)
            intensity = np.roll(intensity, shift, axis=1)
            wet = occurrence > threshold
            edge = np.clip((occurrence - threshold) * 3, 0, 1)
            noise = 0.3 * rng.standard_normal((ny, nx), dtype=np.float32)
            rain = np.exp(-0.5 + 1.0 * intensity + noise) * edge
            block[i][wet] = rain[wet]
        yield t0, block


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of data: its layout at a size, dtype, fill value, attributes and blocks."""

    layout: Callable[[int], Layout]
    dtype: str
    fill_value: int | float
    dims: tuple[str, ...]
    attributes: dict[str, Any]
    blocks: Callable[[Layout, int], Iterator[Any]]


KINDS: dict[str, Kind] = {
    "satellite": Kind(satellite_layout, "uint16", 0, ("time", "band", "y", "x"),
                      {"long_name": "top-of-atmosphere reflectance (DN)", "nodata": 0}, satellite_blocks),
    "era5": Kind(lambda s: era5_layout(s, 4), "float32", 0.0, ("time", "level", "latitude", "longitude"),
                 {"long_name": "temperature", "units": "K"}, era5_blocks),
    "cf-int16": Kind(lambda s: era5_layout(s, 2), "int16", FILL_INT16, ("time", "level", "latitude", "longitude"),
                     {"long_name": "temperature", "units": "K", "scale_factor": SCALE_FACTOR,
                      "add_offset": ADD_OFFSET, "_FillValue": FILL_INT16}, cf_int16_blocks),
    "precip": Kind(precip_layout, "float32", 0.0, ("time", "latitude", "longitude"),
                   {"long_name": "precipitation rate", "units": "mm h-1"}, precip_blocks),
}

#: codec name -> (Zarr format, a description for the manifest).
CODECS: dict[str, tuple[int, str]] = {
    "zstd1": (3, "zstd level 1"),
    "zstd3": (3, "zstd level 3"),
    "zstd9": (3, "zstd level 9"),
    "blosc-lz4": (3, "blosc lz4 clevel 5, byte shuffle"),
    "blosc-lz4-bit": (3, "blosc lz4 clevel 5, bitshuffle"),
    "blosc-zstd": (3, "blosc zstd clevel 5, byte shuffle"),
    "blosc-zstd-bit": (3, "blosc zstd clevel 5, bitshuffle"),
    "v2-zstd": (2, "zstd level 3"),
    "v2-blosc": (2, "blosc lz4 clevel 5, byte shuffle"),
    "v2-gzip": (2, "gzip level 5"),
}


def compressor(codec: str, itemsize: int) -> Any:
    """The zarr-python (v3) or numcodecs (v2) compressor of ``codec``."""
    import numcodecs
    from zarr.codecs import BloscCodec, ZstdCodec

    if codec.startswith("zstd"):
        return ZstdCodec(level=int(codec[4:]), checksum=False)
    if codec.startswith("blosc-"):
        _, cname, *bit = codec.split("-")
        return BloscCodec(cname=cname, clevel=5, shuffle="bitshuffle" if bit else "shuffle", typesize=itemsize)
    if codec == "v2-zstd":
        return numcodecs.Zstd(level=3)
    if codec == "v2-blosc":
        return numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    if codec == "v2-gzip":
        return numcodecs.GZip(level=5)
    raise SystemExit(f"unknown codec {codec}")


# --------------------------------------------------------------------------- writing
def create(path: str, kind: Kind, layout: Layout, codec: str) -> Any:
    """Creates the (empty) array of ``kind`` with ``codec`` at ``path``."""
    import numpy as np
    import zarr

    fmt, _ = CODECS[codec]
    comp = compressor(codec, np.dtype(kind.dtype).itemsize)
    if fmt == 3:
        return zarr.create_array(path, shape=layout.shape, dtype=kind.dtype, chunks=layout.inner, shards=layout.shards,
                                 compressors=[comp], fill_value=kind.fill_value, dimension_names=kind.dims,
                                 attributes=kind.attributes, zarr_format=3, overwrite=True)
    return zarr.create_array(path, shape=layout.shape, dtype=kind.dtype, chunks=layout.v2_chunks, compressors=comp,
                             filters=None, fill_value=kind.fill_value, zarr_format=2, overwrite=True,
                             attributes={**kind.attributes, "_ARRAY_DIMENSIONS": list(kind.dims)})


def stored_bytes(path: str) -> int:
    """Bytes of every file under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def write_kind(out: str, name: str, codecs: list[str], size: int, seed: int, force: bool) -> list[dict[str, Any]]:
    """Writes kind ``name`` with each of ``codecs`` under ``out``; returns their manifest entries."""
    kind = KINDS[name]
    layout = kind.layout(size)
    entries, todo = {}, {}
    for codec in codecs:
        fmt, desc = CODECS[codec]
        rel = os.path.join(name, f"{codec}.zarr")
        spec = {"name": f"{name}-{codec}", "kind": name, "codec": codec, "codec_description": desc, "path": rel,
                "zarr_format": fmt, "dtype": kind.dtype, "shape": list(layout.shape),
                "chunks": list(layout.inner if fmt == 3 else layout.v2_chunks),
                "shards": list(layout.shards) if fmt == 3 else None, "crop": list(layout.crop),
                "fill_value": kind.fill_value, "size": size, "seed": seed}
        entries[codec] = spec
        done = os.path.join(out, rel, DONE)
        if not force and os.path.exists(done):
            with open(done) as f:
                if json.load(f) == spec:
                    continue
        shutil.rmtree(os.path.join(out, rel), ignore_errors=True)
        todo[codec] = create(os.path.join(out, rel), kind, layout, codec)
    if todo:
        t = time.perf_counter()
        write_s = dict.fromkeys(todo, 0.0)
        for t0, block in kind.blocks(layout, seed):
            for codec, arr in todo.items():
                w = time.perf_counter()
                arr[t0:t0 + block.shape[0]] = block
                write_s[codec] += time.perf_counter() - w
        print(f"{name}: {len(todo)} arrays of {layout.shape} {kind.dtype} in {time.perf_counter() - t:.1f} s "
              f"(writing: {', '.join(f'{c} {s:.1f} s' for c, s in write_s.items())})", file=sys.stderr)
        for codec in todo:
            with open(os.path.join(out, entries[codec]["path"], DONE), "w") as f:
                json.dump(entries[codec], f)
    import numpy as np

    result = []
    for codec, spec in entries.items():
        stored = stored_bytes(os.path.join(out, spec["path"]))
        raw = int(np.prod(spec["shape"])) * np.dtype(kind.dtype).itemsize
        result.append({**spec, "stored_bytes": stored, "ratio": round(raw / max(stored, 1), 3)})
    return result


def in_pinned_env() -> bool:
    """Whether this interpreter has the zarr-python and numcodecs of requirements-compare.txt."""
    pins = {}
    with open(os.path.join(HERE, "requirements-compare.txt")) as f:
        for line in f:
            name, _, version = line.split("#")[0].strip().partition("==")
            pins[name] = version
    try:
        import numcodecs
        import zarr
    except ImportError:
        return False
    return zarr.__version__ == pins["zarr"] and numcodecs.__version__ == pins["numcodecs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="where the corpus goes (default: <tmp>/zcrop-corpus)")
    ap.add_argument("--size", default="128M", help="uncompressed size of each array (K, M, G)")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}")
    ap.add_argument("--codecs", default=",".join(CODECS), help=f"comma-separated, of {','.join(CODECS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rewrite datasets that are already there")
    args = ap.parse_args()
    kinds, codecs = args.kinds.split(","), args.codecs.split(",")
    for k in kinds:
        if k not in KINDS:
            raise SystemExit(f"unknown kind {k!r} (have {', '.join(KINDS)})")
    for c in codecs:
        if c not in CODECS:
            raise SystemExit(f"unknown codec {c!r} (have {', '.join(CODECS)})")
    if not in_pinned_env():
        sys.path.insert(0, HERE)
        from compare import peer_python

        py = peer_python()
        os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])
    import numcodecs
    import zarr

    out = os.path.abspath(args.out or os.path.join(tempfile.gettempdir(), "zcrop-corpus"))
    os.makedirs(out, exist_ok=True)
    size = parse_size(args.size)
    entries = []
    for k in kinds:
        entries += write_kind(out, k, codecs, size, args.seed, args.force)
    # Merge with what an earlier run listed (other kinds or codecs), replacing entries of the
    # same name.
    path = os.path.join(out, MANIFEST)
    old = []
    if os.path.exists(path):
        with open(path) as f:
            old = json.load(f).get("datasets", [])
    names = {e["name"] for e in entries}
    datasets = [e for e in old if e["name"] not in names and os.path.exists(os.path.join(out, e["path"], DONE))]
    datasets += entries
    with open(path, "w") as f:
        json.dump({"zarr": zarr.__version__, "numcodecs": numcodecs.__version__, "datasets": datasets}, f, indent=1)
    for e in entries:
        print(f"{e['name']:<26} {e['stored_bytes'] / 2**20:8.1f} MiB  ratio {e['ratio']:6.2f}  {e['path']}")
    print(out)


if __name__ == "__main__":
    main()
