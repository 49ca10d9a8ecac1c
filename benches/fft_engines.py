#!/usr/bin/env python3
"""The chunked-axis FFT on each engine, in one run: zcrop in one process (``engine="local"``),
zcrop as a Dask graph on 1, 2 and 4 single-threaded worker processes, and what Dask offers for
the same job (rechunk so the axis is one chunk, ``da.fft.fft``, write with ``to_zarr``), with
rounds alternated and medians reported. Also bytes read and written per input byte.

    python3 benches/fft_engines.py [--case era5|line] [--rounds 3] [--dir DIR]

Cases (written uncompressed with zarr-python into DIR, default a temporary directory):
- ``era5``: float32 (time 8760, 64, 128) in chunks (24, 64, 128): an hourly year of a
  field, the axis in 365 chunks; whole lines fit the task budget (the in-memory plan).
- ``line``: one float32 line of 2**25 samples (128 MiB) in chunks of 2**18, a 64 MiB task
  budget (so the four-step plan) and workers limited to 1 GiB each: Dask's one-chunk FFT of
  the line needs more than that.
- ``line-fits``: one float32 line of 2**24 samples (64 MiB) in chunks of 2**18, a 4 GiB task
  budget (whole lines fit: the in-memory plan) and Dask's default worker memory: the case where
  Dask's one-chunk FFT fits too.

Run it with the package built in release mode (maturin develop --release).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

import zcrop.fft

#: shape, chunks, axis, task budget, worker memory limit (None: dask's default, RAM / workers)
CASES = {
    "era5": ((8760, 64, 128), (24, 64, 128), 0, "256MiB", None),
    "line": ((1 << 25,), (1 << 18,), 0, "64MiB", "1GiB"),
    "line-fits": ((1 << 24,), (1 << 18,), 0, "4GiB", None),
}


def make(path: Path, shape: tuple[int, ...], chunks: tuple[int, ...]) -> None:
    a = zarr.create_array(str(path), shape=shape, chunks=chunks, dtype="f4", compressors=None,
                          overwrite=True)
    rng = np.random.default_rng(0)
    step = chunks[0] * max(1, (64 << 20) // (4 * int(np.prod(chunks))))
    for i in range(0, shape[0], step):
        n = min(step, shape[0] - i)
        a[i : i + n] = rng.standard_normal((n, *shape[1:]), dtype=np.float32)


def dask_rechunk_fft(client, src: str, out: str, axis: int) -> None:
    import dask.array as da

    x = da.from_zarr(src)
    y = da.fft.fft(x.rechunk({axis: -1}), axis=axis).astype(np.complex64)
    y.to_zarr(out, overwrite=True, compute=True, compressors=None)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--case", choices=sorted(CASES), default="era5")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    shape, chunks, axis, budget, limit = CASES[args.case]
    root = Path(args.dir or tempfile.mkdtemp(prefix="zcrop-fft-bench-"))
    src = root / f"{args.case}.zarr"
    if not src.exists():
        make(src, shape, chunks)
    in_bytes = 4 * int(np.prod(shape))
    times: dict[str, list[float]] = {}
    io: dict[str, tuple[float, float]] = {}
    failures: dict[str, str] = {}

    def timed(name: str, fn) -> None:
        out = root / "out.zarr"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        r = fn(str(out))
        times.setdefault(name, []).append(time.perf_counter() - t)
        if r is not None:
            io[name] = (r.read_bytes / in_bytes, r.written_bytes / in_bytes)

    clusters = {
        n: LocalCluster(n_workers=n, threads_per_worker=1, dashboard_address=None,
                        memory_limit=limit or "auto")
        for n in (1, 2, 4)
    }
    clients = {n: Client(c) for n, c in clusters.items()}
    try:
        for _ in range(args.rounds):
            timed("zcrop local", lambda out: zcrop.fft.fft_along_axis(
                str(src), axis, out, memory_per_task=budget))
            for n, c in clients.items():
                timed(f"zcrop dask, {n} worker(s)", lambda out, c=c: zcrop.fft.fft_along_axis(
                    str(src), axis, out, memory_per_task=budget, engine="dask", client=c))
            try:
                timed("dask rechunk + da.fft, 2 workers",
                      lambda out: dask_rechunk_fft(clients[2], str(src), out, axis))
            except Exception as e:  # noqa: BLE001 - reported in the table
                times.setdefault("dask rechunk + da.fft, 2 workers", []).append(float("nan"))
                failures["dask rechunk + da.fft, 2 workers"] = type(e).__name__
    finally:
        for c in clients.values():
            c.close()
        for c in clusters.values():
            c.close()
    local = statistics.median(times["zcrop local"])
    cpus = os.cpu_count()
    print(f"\ncase {args.case}: float32 {shape} chunks {chunks}, axis {axis}, "
          f"task budget {budget}, worker memory limit {limit or 'default'}, "
          f"{in_bytes / 2**20:.0f} MiB in; {cpus} CPUs\n")
    print("| engine | seconds (runs) | median | MB/s in | vs local | read/in | written/in |")
    print("|---|---|---|---|---|---|---|")
    for name, v in times.items():
        if name in failures:
            print(f"| {name} | failed: {failures[name]} | | | | | |")
            continue
        med = statistics.median(v)
        r, w = io.get(name, (float("nan"), float("nan")))
        print(f"| {name} | {', '.join(f'{x:.2f}' for x in v)} | {med:.2f} | "
              f"{in_bytes / med / 1e6:.0f} | {local / med:.2f} | {r:.2f} | {w:.2f} |")


if __name__ == "__main__":
    main()
