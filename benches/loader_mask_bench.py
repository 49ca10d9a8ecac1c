#!/usr/bin/env python3
"""What a mask costs the loader: batches/s of ``zcrop.Loader`` with ``valid=`` against the same
loader without it, and against reading the masked loader's own crops directly.

Three readers of the same array, alternated ``--repeats`` times, warm page cache:

- ``loader``: ``zcrop.Loader`` without a mask (random crops anywhere);
- ``loader + mask``: the same with ``valid=`` a mask at full position resolution keeping a
  random half of the positions, as runs (``zcrop.ValidMask``);
- ``direct``: ``Array.read_crops`` of exactly the masked loader's crops (origins from
  ``Loader.plan``, planned before the clock starts), one batch after the other.

    python3 benches/loader_mask_bench.py ARRAY [--batch-size 16] [--steps 40] [--repeats 5]

ARRAY is a uint16 (T, C, Y, X) store such as ``zcrop bench --prepare-only`` writes.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import zcrop
from machine import cpu_model
from pagecache import prewarm
from tables import rate_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("array")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--crop", default="4,128,128")
    args = ap.parse_args()
    ct, cy, cx = (int(v) for v in args.crop.split(","))
    prewarm(args.array)
    arr = zcrop.open_array(args.array)
    t, c, y, x = arr.shape
    crop = (ct, c, cy, cx)
    src = zcrop.Source(args.array, crop=crop, dims=["t", 0, "y", "x"], name="x")
    keep = np.random.default_rng(0).random((t, y, x)) < 0.5
    mask = zcrop.ValidMask.from_bools(["t", "y", "x"], keep)
    common = {"positions": ["t", "y", "x"], "batch_size": args.batch_size, "seed": 1}

    def run_loader(valid: object) -> float:
        loader = zcrop.Loader(src, valid=valid, steps=args.steps, **common)
        t0 = time.perf_counter()
        for batch in loader:
            del batch
        return args.steps / (time.perf_counter() - t0)

    plan_loader = zcrop.Loader(src, valid=mask, steps=args.steps, **common)
    origins = [
        [m["sources"]["x"]["origin"] for m in plan_loader.plan(step)] for step in range(args.steps)
    ]
    plan_loader.close()

    def run_direct() -> float:
        t0 = time.perf_counter()
        for batch in origins:
            arr.read_crops(batch, crop)
        return args.steps / (time.perf_counter() - t0)

    rates: dict[str, list[float]] = {"loader": [], "loader + mask": [], "direct": []}
    for _ in range(args.repeats):
        rates["loader"].append(run_loader(None))
        rates["loader + mask"].append(run_loader(mask))
        rates["direct"].append(run_direct())
    print(f"machine: {cpu_model()}; {args.array}; crop {crop}; batches of {args.batch_size}; "
          f"{args.steps} steps; medians of {args.repeats}; mask: {len(mask.runs)} runs\n")
    print(rate_table(rates, "loader + mask"))


if __name__ == "__main__":
    main()
