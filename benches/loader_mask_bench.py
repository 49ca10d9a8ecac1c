#!/usr/bin/env python3
"""What a mask costs the loader: batches/s of ``zcrop.Loader`` with ``valid=`` against the same
loader without it, and against reading the masked loader's own crops directly.

Three readers of the same array, alternated ``--repeats`` times, warm page cache:

- ``loader``: ``zcrop.Loader`` without a mask (random crops anywhere);
- ``loader + mask``: the same with ``valid=`` a mask at full position resolution keeping a
  random half of the positions, as runs (``zcrop.ValidMask``);
- ``direct``: ``Array.read_crops`` of exactly the masked loader's crops (origins from
  ``Loader.plan``, planned before the clock starts), one batch after the other.

The clock starts after ``--warmup`` batches of each reader (a loader's first batches include
filling its ring and sizing its read-ahead depth); ``--warmup 0 --steps 40`` measures the first
40 batches after construction instead. Building each loader is timed apart: the median
construction time and the time to its first batch are printed under the table.

    python3 benches/loader_mask_bench.py ARRAY [--batch-size 16] [--steps 200] [--warmup 8]
        [--repeats 5]

ARRAY is a uint16 (T, C, Y, X) store such as ``zcrop bench --prepare-only`` writes.
"""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--steps", type=int, default=200, help="batches timed per run")
    ap.add_argument("--warmup", type=int, default=8, help="batches before the clock starts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--crop", default="4,128,128")
    args = ap.parse_args()
    if args.warmup < 0 or args.steps < 1:
        ap.error("--warmup must be >= 0 and --steps >= 1")
    ct, cy, cx = (int(v) for v in args.crop.split(","))
    prewarm(args.array)
    arr = zcrop.open_array(args.array)
    t, c, y, x = arr.shape
    crop = (ct, c, cy, cx)
    src = zcrop.Source(args.array, crop=crop, dims=["t", 0, "y", "x"], name="x")
    keep = np.random.default_rng(0).random((t, y, x)) < 0.5
    mask = zcrop.ValidMask.from_bools(["t", "y", "x"], keep)
    common = {"positions": ["t", "y", "x"], "batch_size": args.batch_size, "seed": 1}

    total = args.warmup + args.steps
    setup: dict[str, list[tuple[float, float]]] = {"loader": [], "loader + mask": []}

    def run_loader(name: str, valid: object) -> float:
        t0 = time.perf_counter()
        loader = zcrop.Loader(src, valid=valid, steps=total, **common)
        built = time.perf_counter()
        batches = iter(loader)
        next(batches)
        setup[name].append((built - t0, time.perf_counter() - built))
        for _ in range(args.warmup - 1):
            next(batches)
        # Without a warm-up the first batch, taken above, is one of the timed ones.
        start = time.perf_counter() if args.warmup else built
        for batch in batches:
            del batch
        rate = args.steps / (time.perf_counter() - start)
        loader.close()
        return rate

    plan_loader = zcrop.Loader(src, valid=mask, steps=total, **common)
    origins = [
        [m["sources"]["x"]["origin"] for m in plan_loader.plan(step)] for step in range(total)
    ]
    plan_loader.close()

    def run_direct() -> float:
        for batch in origins[: args.warmup]:
            arr.read_crops(batch, crop)
        start = time.perf_counter()
        for batch in origins[args.warmup :]:
            arr.read_crops(batch, crop)
        return args.steps / (time.perf_counter() - start)

    rates: dict[str, list[float]] = {"loader": [], "loader + mask": [], "direct": []}
    for _ in range(args.repeats):
        rates["loader"].append(run_loader("loader", None))
        rates["loader + mask"].append(run_loader("loader + mask", mask))
        rates["direct"].append(run_direct())
    print(f"machine: {cpu_model()}; {args.array}; crop {crop}; batches of {args.batch_size}; "
          f"{args.steps} steps timed after {args.warmup}; medians of {args.repeats}; "
          f"mask: {len(mask.runs)} runs\n")
    print(rate_table(rates, "loader + mask"))
    print()
    for name, times in setup.items():
        built = statistics.median(t for t, _ in times)
        first = statistics.median(f for _, f in times)
        print(f"{name}: construction {built:.2f} s, then first batch {first * 1e3:.0f} ms (medians)")


if __name__ == "__main__":
    main()
