#!/usr/bin/env python3
"""What coordinate alignment costs the loader: batches/s of ``zcrop.Loader`` over two sources
on different grids and time steps, aligned by their labels, against reading the same crops
directly.

The data, written by xarray's zarr backend into a temporary folder (sizes by flag):

- ``sat``: uint16 (time every 15 min, channel, lat, lon) on a 0.05-degree grid, crops of one
  hour of history (``window={"time": ("-45min", "0min")}``, four frames) and all channels;
- ``nwp``: float32 (init_time every 6 h, step, variable, lat, lon) on a 0.25-degree grid,
  aligned ``previous`` on time and ``nearest`` on lat/lon, crops of 6 steps.

Readers, alternated ``--repeats`` times, warm page cache:

- ``loader (aligned)``: ``zcrop.Loader`` over both sources;
- ``direct``: ``Array.read_crops`` of exactly the loader's crops for each source (origins
  from ``Loader.plan``, planned before the clock starts), one batch after the other.

    python3 benches/loader_align_bench.py [--frames 64] [--size 512] [--batch-size 16]
        [--steps 40] [--repeats 5] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

import zcrop
from machine import cpu_model
from pagecache import prewarm
from tables import rate_table


def write(where: str, frames: int, size: int) -> tuple[str, str]:
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    sat_path, nwp_path = os.path.join(where, "sat.zarr"), os.path.join(where, "nwp.zarr")
    if not os.path.exists(sat_path):
        lat = 50 + np.arange(size) * 0.05
        lon = -5 + np.arange(size) * 0.05
        base = (np.sin(np.linspace(0, 6, size))[:, None] * 800 + 1500).astype("uint16")
        data = np.empty((frames, 4, size, size), dtype="uint16")
        for t in range(frames):
            data[t] = base + rng.integers(0, 64, (4, size, size), dtype="uint16")
        xr.Dataset(
            {"ir": (("time", "channel", "lat", "lon"), data)},
            coords={"time": pd.date_range("2024-06-01", periods=frames, freq="15min"),
                    "channel": np.arange(4), "lat": lat, "lon": lon},
        ).to_zarr(sat_path, mode="w", zarr_format=3,
                  encoding={"ir": {"chunks": (1, 1, 128, 128)}})
        n = size // 5 + 2
        inits = frames // 24 + 2
        xr.Dataset(
            {"t": (("init_time", "step", "variable", "lat", "lon"),
                   rng.normal(size=(inits, 12, 3, n, n)).astype("float32"))},
            coords={"init_time": pd.date_range("2024-06-01", periods=inits, freq="6h"),
                    "step": np.arange(12), "variable": np.arange(3),
                    "lat": 50 + np.arange(n) * 0.25, "lon": -5 + np.arange(n) * 0.25},
        ).to_zarr(nwp_path, mode="w", zarr_format=3,
                  encoding={"t": {"chunks": (1, 12, 3, 32, 32)}})
    return sat_path, nwp_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", help="write (or reuse) the data here instead of a temp folder")
    args = ap.parse_args()
    import xarray as xr

    with tempfile.TemporaryDirectory() as tmp:
        where = args.keep or tmp
        os.makedirs(where, exist_ok=True)
        sat_path, nwp_path = write(where, args.frames, args.size)
        prewarm(sat_path)
        prewarm(nwp_path)
        sat = xr.open_dataset(sat_path, engine="zcrop")
        nwp = xr.open_dataset(nwp_path, engine="zcrop")
        sources = {
            "sat": zcrop.Source(sat["ir"], crop={"lat": 128, "lon": 128},
                                window={"time": ("-45min", "0min")}),
            "nwp": zcrop.Source(nwp["t"], crop={"init_time": 1, "step": 6, "lat": 8, "lon": 8},
                                dims=["time", 0, 0, "lat", "lon"],
                                align={"init_time": "previous", "lat": "nearest",
                                       "lon": "nearest"}),
        }
        common = {"positions": ["time", "lat", "lon"], "batch_size": args.batch_size, "seed": 1}

        def run_loader() -> float:
            loader = zcrop.Loader(sources, steps=args.steps, **common)
            t0 = time.perf_counter()
            for batch in loader:
                del batch
            return args.steps / (time.perf_counter() - t0)

        planner = zcrop.Loader(sources, steps=args.steps, **common)
        plans = [planner.plan(step) for step in range(args.steps)]
        crops = {s["name"]: tuple(s["crop"]) for s in planner.sources}
        planner.close()
        arrays = {"sat": zcrop.open_array(sat_path + "/ir"), "nwp": zcrop.open_array(nwp_path + "/t")}
        origins = [
            {name: [m["sources"][name]["origin"] for m in plan] for name in arrays}
            for plan in plans
        ]

        def run_direct() -> float:
            t0 = time.perf_counter()
            for batch in origins:
                for name, arr in arrays.items():
                    arr.read_crops(batch[name], crops[name])
            return args.steps / (time.perf_counter() - t0)

        rates: dict[str, list[float]] = {"loader (aligned)": [], "direct": []}
        for _ in range(args.repeats):
            rates["loader (aligned)"].append(run_loader())
            rates["direct"].append(run_direct())
        print(f"machine: {cpu_model()}; sat {arrays['sat'].shape} uint16, nwp "
              f"{arrays['nwp'].shape} float32; crops {crops}; batches of {args.batch_size}; "
              f"{args.steps} steps; medians of {args.repeats}\n")
        print(rate_table(rates, "direct"))


if __name__ == "__main__":
    main()
