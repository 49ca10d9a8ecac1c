#!/usr/bin/env python3
"""xarray on zcrop against xarray on zarr-python, zarr-python with the zarrs codec pipeline, and
xarray-tensorstore: random windows of every variable of an ERA5-like dataset.

    python3 benches/xarray_bench.py                       # warm and cold, v3 and v2
    python3 benches/xarray_bench.py --modes warm --formats v3 --size 256M --repeats 3
    python3 benches/xarray_bench.py --modes warm --warmup 300  # a long run's steady state
    python3 benches/xarray_bench.py --touch-memory 1024  # memory backed, as on most machines

The dataset is written by xarray (`Dataset.to_zarr` with its defaults: zarr-python's default
codecs) into $ZCROP_BENCH_DATA (default $TMPDIR/zcrop-bench-data): four float32 variables
(t, u, v and a CF-packed int16 `q` with scale_factor/add_offset/_FillValue) of (time, level 4,
latitude 181 descending, longitude 360), chunks (1, 4, 91, 90), about --size in all; `v3` is
Zarr v3 (zstd), `v2` Zarr v2 (blosc lz4). A window is 4 time steps x all levels x 64 x 64 of
every variable. Readers, each in its own process, on the same windows:

- `zcrop isel`: `xr.open_dataset(p, engine="zcrop")`, then `ds.isel(window).load()` per window
  (zcrop's defaults: the process-wide 256 MiB decoded-chunk cache);
- `zcrop isel (no cache)`: the same with `chunk_cache=0`;
- `zcrop isel async`: `await ds.isel(window).load_async()` for --batch windows at once
  (`asyncio.gather`), every variable of every window read concurrently;
- `zcrop batch`: `zcrop.read_windows(ds, starts, sizes)`, --batch windows per call;
- `zarr`: `xr.open_zarr(p, chunks=None)`, `isel(window).load()` (zarr-python 3);
- `zarrs`: the same with zarr-python's codec pipeline set to zarrs';
- `tensorstore`: `xr.decode_cf(xarray_tensorstore.open_zarr(p, mask_and_scale=False))`
  (xarray-tensorstore does not mask non-NaN fill values itself), `isel(window).load()`, with
  its default context (no cache pool);
- `tensorstore (256 MiB cache)`: the same with a context whose cache pool has the budget of
  zcrop's default cache;
- `io floor`: no reader, only the files: per window, every chunk file its variables need read
  whole at once (64 Python threads), nothing decoded. Cold, what plain file reads give a
  reader that reads a window's chunks only when asked (as `isel().load()` does); not a tight
  bound, as the threads add overhead of their own (warm, that overhead is all it measures).

Every reader's values are hashed per window and checked against zcrop's. Each reader runs
--repeats times (order rotated); the median run counts; windows/s after one untimed window.
Warm runs read every file of the dataset once first; cold runs drop the page cache before each
reader (needs root). Also times opening a 100-variable consolidated dataset (median of 7).
Writes xarray.md and xarray.json to --out. Installs the peers into the benchmark virtualenv
(benches/requirements-compare.txt) and zcrop (release) from this checkout.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

READERS = ["zcrop-isel", "zcrop-isel-nocache", "zcrop-async", "zcrop-batch", "zarr", "zarrs",
           "tensorstore", "tensorstore-cache", "io-floor"]
LABEL = {
    "zcrop-isel": "zcrop isel",
    "zcrop-isel-nocache": "zcrop isel (no cache)",
    "zcrop-async": "zcrop isel async",
    "zcrop-batch": "zcrop batch",
    "zarr": "zarr-python 3",
    "zarrs": "zarr-python + zarrs",
    "tensorstore": "xarray-tensorstore",
    "tensorstore-cache": "xarray-tensorstore (256 MiB cache)",
    "io-floor": "io floor",
}
#: The cache pool of `tensorstore-cache`: the budget of zcrop's default decoded-chunk cache.
TS_CACHE_BYTES = 256 << 20
WINDOW = {"time": 4, "latitude": 64, "longitude": 64}
NLAT, NLON, NLEV = 181, 360, 4


# --------------------------------------------------------------------------- data
def make_dataset(path: str, zarr_format: int, ntime: int) -> None:
    import numpy as np
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(35)
    lat = np.linspace(90, -90, NLAT)
    lon = np.arange(NLON, dtype="float64")
    time_ = pd.date_range("2020-01-01", periods=ntime, freq="6h")
    yy, xx = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")

    def field(scale: float, offset: float) -> np.ndarray:
        out = np.empty((ntime, NLEV, NLAT, NLON), dtype="float32")
        for t in range(ntime):
            for k in range(NLEV):
                phase = 0.05 * t + 0.7 * k
                base = np.cos(2 * yy + phase) * np.sin(3 * xx - phase) + 0.3 * np.cos(7 * xx + yy)
                out[t, k] = offset + scale * (base + 0.02 * rng.standard_normal(base.shape))
        return out

    dims = ("time", "level", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "t": (dims, field(20, 260), {"units": "K"}),
            "u": (dims, field(15, 0), {"units": "m s-1"}),
            "v": (dims, field(10, 0), {"units": "m s-1"}),
            "q": (dims, np.abs(field(0.004, 0.006)), {"units": "kg kg-1"}),
        },
        coords={
            "time": time_,
            "level": ("level", np.array([1000, 850, 500, 250], dtype="int32")),
            "latitude": lat,
            "longitude": lon,
        },
    )
    chunks = (1, NLEV, 91, 90)
    encoding = {v: {"chunks": chunks} for v in ds.data_vars}
    encoding["q"].update(
        dtype="int16", scale_factor=1e-6, add_offset=0.01, _FillValue=np.int16(-32768)
    )
    ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=True, encoding=encoding)


def make_wide(path: str) -> None:
    """100 small variables, consolidated: the open-time benchmark."""
    import numpy as np
    import xarray as xr

    data = np.zeros((4, 8, 8), dtype="float32")
    ds = xr.Dataset(
        {f"var{i:03d}": (("time", "y", "x"), data, {"units": "1", "long_name": f"v {i}"})
         for i in range(100)},
        coords={"time": np.arange(4), "y": np.arange(8.0), "x": np.arange(8.0)},
    )
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=True)


# --------------------------------------------------------------------------- workers
def open_reader(reader: str, path: str):
    import xarray as xr

    if reader == "zcrop-isel-nocache":
        return xr.open_dataset(path, engine="zcrop", chunk_cache=0)
    if reader.startswith("zcrop"):
        return xr.open_dataset(path, engine="zcrop")
    if reader == "zarrs":
        import zarr

        zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})
    if reader in ("zarr", "zarrs"):
        return xr.open_zarr(path, chunks=None)
    if reader in ("tensorstore", "tensorstore-cache"):
        import tensorstore
        import xarray_tensorstore

        context = None
        if reader == "tensorstore-cache":
            context = tensorstore.Context({"cache_pool": {"total_bytes_limit": TS_CACHE_BYTES}})
        # xarray-tensorstore refuses CF masking of non-NaN fill values (the packed `q`):
        # opened raw, then decoded by xarray, as its error message advises.
        return xr.decode_cf(xarray_tensorstore.open_zarr(path, mask_and_scale=False, context=context))
    raise ValueError(reader)


def chunk_files(path: str, names: list[str]):
    """For each variable, a function from a window's starts to the paths of the chunk files it
    needs (from zarr-python's metadata: its chunk grid and chunk key encoding)."""
    import itertools

    import zarr

    group = zarr.open_group(path, mode="r")

    def files_of(name: str):
        arr = group[name]
        dims = list(arr.metadata.dimension_names if arr.metadata.zarr_format == 3
                    else arr.attrs["_ARRAY_DIMENSIONS"])
        chunks = arr.chunks

        def files(start: dict) -> list[str]:
            ranges = []
            for d, c, n in zip(dims, chunks, arr.shape):
                lo, size = (int(start[d]), WINDOW[d]) if d in WINDOW else (0, n)
                ranges.append(range(lo // c, (lo + size - 1) // c + 1))
            return [os.path.join(path, name, arr.metadata.encode_chunk_key(k))
                    for k in itertools.product(*ranges)]
        return files

    return [files_of(n) for n in names]


def worker(args: argparse.Namespace) -> None:
    import numpy as np

    windows = json.loads(args.windows)
    starts = {d: np.asarray(v) for d, v in windows.items()}
    n = len(starts["time"])
    if args.worker == "io-floor":
        return io_floor(args, starts, n)
    ds = open_reader(args.worker, args.path)
    names = sorted(ds.data_vars)

    def digest(arrays) -> str:
        h = hashlib.sha256()
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()[:16]

    hashes: list[str] = []
    wall = 0.0
    if args.worker == "zcrop-async":
        import asyncio

        loop = asyncio.new_event_loop()

    def run(lo: int, hi: int, record: bool) -> None:
        # Only the reads are timed: hashing each result (and freeing it) happens with the
        # clock stopped, so no reader pays for the check or holds every result in memory.
        nonlocal wall
        if args.worker == "zcrop-batch":
            import zcrop

            for b in range(lo, hi, args.batch):
                e = min(hi, b + args.batch)
                t0 = time.perf_counter()
                got = zcrop.read_windows(ds, {d: v[b:e] for d, v in starts.items()}, WINDOW,
                                         variables=names, as_numpy=True)
                wall += time.perf_counter() - t0
                if record:
                    hashes.extend(digest([got[k][i] for k in names]) for i in range(e - b))
            return
        if args.worker == "zcrop-async":
            import asyncio

            async def group(b: int, e: int) -> list:
                sels = [{d: slice(int(starts[d][i]), int(starts[d][i]) + WINDOW[d])
                         for d in WINDOW} for i in range(b, e)]
                return await asyncio.gather(*(ds[names].isel(sel).load_async() for sel in sels))

            for b in range(lo, hi, args.batch):
                e = min(hi, b + args.batch)
                t0 = time.perf_counter()
                got = loop.run_until_complete(group(b, e))
                wall += time.perf_counter() - t0
                if record:
                    hashes.extend(digest([w[k].values for k in names]) for w in got)
            return
        for i in range(lo, hi):
            sel = {d: slice(int(starts[d][i]), int(starts[d][i]) + WINDOW[d]) for d in WINDOW}
            t0 = time.perf_counter()
            w = ds[names].isel(sel).load()
            wall += time.perf_counter() - t0
            if record:
                hashes.append(digest([w[k].values for k in names]))

    # Untimed: first touches and lazy imports, then --warmup windows more (caches filled as a
    # long training run has them filled).
    first = 1 + args.warmup
    run(0, first, False)
    wall = 0.0
    run(first, n, True)
    print(json.dumps({"reader": args.worker, "seconds": wall, "windows": n - first,
                      "windows_per_s": (n - first) / wall, "hashes": hashes}))


def io_floor(args: argparse.Namespace, starts: dict, n: int) -> None:
    import concurrent.futures

    import xarray as xr

    names = sorted(xr.open_zarr(args.path).data_vars)
    per_var = chunk_files(args.path, names)
    pool = concurrent.futures.ThreadPoolExecutor(64)

    def read(p: str) -> int:
        with open(p, "rb", buffering=0) as f:
            return len(f.read())

    def window(i: int) -> int:
        start = {d: v[i] for d, v in starts.items()}
        return sum(pool.map(read, [p for files in per_var for p in files(start)]))

    first = 1 + args.warmup
    for i in range(first):
        window(i)
    t0 = time.perf_counter()
    nbytes = sum(window(i) for i in range(first, n))
    wall = time.perf_counter() - t0
    print(json.dumps({"reader": "io-floor", "seconds": wall, "windows": n - first,
                      "windows_per_s": (n - first) / wall, "bytes": nbytes}))


def open_worker(args: argparse.Namespace) -> None:
    times = []
    for _ in range(8):
        t0 = time.perf_counter()
        ds = open_reader(args.worker, args.path)
        times.append(time.perf_counter() - t0)
        assert len(ds.data_vars) == 100
    print(json.dumps({"reader": args.worker, "open_s": statistics.median(times[1:])}))


# --------------------------------------------------------------------------- driver
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--open-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--windows", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="512M", help="dataset size (K/M/G suffix)")
    ap.add_argument("--nwindows", type=int, default=201, help="windows per run (the first untimed)")
    ap.add_argument("--batch", type=int, default=16, help="windows per read_windows call")
    ap.add_argument("--warmup", type=int, default=0,
                    help="windows each reader reads untimed first (other windows than the timed "
                         "ones): the steady state of a long run, its caches filled")
    ap.add_argument("--touch-memory", type=int, default=0, metavar="MIB",
                    help="before each reader, a separate process writes MIB MiB of new memory and "
                         "exits, so that the reader's first touches of new memory cost what they "
                         "cost on a machine that keeps its memory backed (docs/performance.md, "
                         "'Fresh memory on these VMs')")
    ap.add_argument("--formats", default="v3,v2")
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.worker and args.open_worker:
        return open_worker(args)
    if args.worker:
        return worker(args)

    from compare import venv_python
    from pagecache import drop_caches, prewarm

    py = venv_python()
    size = int(float(args.size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[args.size[-1].upper()])
    per_step = 4 * NLEV * NLAT * NLON * 4
    ntime = max(8, size // per_step)
    data = os.environ.get("ZCROP_BENCH_DATA", os.path.join(tempfile.gettempdir(), "zcrop-bench-data"))
    os.makedirs(data, exist_ok=True)
    readers = args.readers.split(",")
    me = os.path.abspath(__file__)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    def call(*extra: str) -> dict:
        out = subprocess.run([py, me, *extra], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise SystemExit(f"{' '.join(extra[:2])} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    import random

    rng = random.Random(args.seed)
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                     "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv),
                     "window": WINDOW, "runs": {}}
    for fmt in args.formats.split(","):
        path = os.path.join(data, f"xarray-era5-{fmt}-t{ntime}.zarr")
        if not os.path.exists(os.path.join(path, "zarr.json" if fmt == "v3" else ".zmetadata")):
            print(f"writing {path} ({ntime} time steps)", flush=True)
            subprocess.run([py, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import xarray_bench as b; "
                            f"b.make_dataset({path!r}, {3 if fmt == 'v3' else 2}, {ntime})"], check=True, env=env)
        nwin = args.warmup + args.nwindows
        windows = {
            "time": [rng.randrange(0, ntime - WINDOW["time"] + 1) for _ in range(nwin)],
            "latitude": [rng.randrange(0, NLAT - WINDOW["latitude"] + 1) for _ in range(nwin)],
            "longitude": [rng.randrange(0, NLON - WINDOW["longitude"] + 1) for _ in range(nwin)],
        }
        for mode in args.modes.split(","):
            runs: dict[str, list] = {r: [] for r in readers}
            for rep in range(args.repeats):
                order = readers[rep % len(readers):] + readers[: rep % len(readers)]
                for r in order:
                    if mode == "warm":
                        prewarm(path)
                    elif not drop_caches():
                        print("cold runs need root (drop_caches); skipped", flush=True)
                        break
                    if args.touch_memory:
                        subprocess.run([py, "-c", "import numpy as np; "
                                        f"np.ones({args.touch_memory} << 20, np.uint8)"], check=True)
                    res = call("--worker", r, "--path", path, "--windows", json.dumps(windows),
                               "--batch", str(args.batch), "--warmup", str(args.warmup))
                    runs[r].append(res)
                    print(f"{fmt} {mode} {LABEL[r]:22s} {res['windows_per_s']:8.1f} windows/s", flush=True)
            ref = next((runs[r][0]["hashes"] for r in readers if runs[r] and r != "io-floor"), None)
            for r in readers:
                for res in runs[r] if r != "io-floor" else []:
                    if res["hashes"] != ref:
                        raise SystemExit(f"{r} read different values than {readers[0]} ({fmt}, {mode})")
            results["runs"][f"{fmt}-{mode}"] = {
                r: statistics.median(x["windows_per_s"] for x in runs[r]) for r in readers if runs[r]
            }
    wide = os.path.join(data, "xarray-wide-100.zarr")
    if not os.path.exists(os.path.join(wide, "zarr.json")):
        subprocess.run([py, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import xarray_bench as b; "
                        f"b.make_wide({wide!r})"], check=True, env=env)
    results["open_s"] = {r: call("--worker", r, "--open-worker", "--path", wide)["open_s"]
                         for r in ("zcrop-isel", "zarr")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "xarray.json"), "w") as f:
        json.dump(results, f, indent=1)
    lines = [f"# xarray readers, {results['date']}", "",
             f"Machine: {results['machine']}. Command: `{results['command']}`. Window: "
             f"4 time steps x {NLEV} levels x 64 x 64 of 4 variables; windows/s, median of "
             f"{args.repeats} runs"
             + (f", each timed after {args.warmup} untimed windows" if args.warmup else "")
             + (f"; {args.touch_memory} MiB of memory touched before each reader"
                if args.touch_memory else "")
             + ".", ""]
    cols = [r for r in readers]
    lines.append("| dataset | " + " | ".join(LABEL[r] for r in cols) + " | zcrop isel / zarr | zcrop isel / tensorstore | zcrop isel / tensorstore (256 MiB cache) | zcrop isel (no cache) / tensorstore | zcrop isel async / tensorstore | zcrop batch / zarr |")
    lines.append("|---" * (len(cols) + 7) + "|")
    for key, med in results["runs"].items():
        def ratio(a: str, b: str) -> str:
            return f"{med[a] / med[b]:.2f}x" if a in med and b in med else "-"
        lines.append(f"| {key} | " + " | ".join(f"{med.get(r, float('nan')):.1f}" for r in cols)
                     + f" | {ratio('zcrop-isel', 'zarr')} | {ratio('zcrop-isel', 'tensorstore')} | {ratio('zcrop-isel', 'tensorstore-cache')} | {ratio('zcrop-isel-nocache', 'tensorstore')} | {ratio('zcrop-async', 'tensorstore')} | {ratio('zcrop-batch', 'zarr')} |")
    o = results["open_s"]
    lines += ["", f"Opening 100 variables (consolidated v3): engine=zcrop {1e3 * o['zcrop-isel']:.1f} ms, "
              f"xr.open_zarr {1e3 * o['zarr']:.1f} ms ({o['zcrop-isel'] / o['zarr']:.2f}x its time)."]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "xarray.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
