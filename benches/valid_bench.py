#!/usr/bin/env python3
"""``zcrop.valid_windows`` against reading the same data: how close the NaN/fill-mask pass
comes to the rate at which zcrop reads and decodes the array.

For each array: the time of ``valid_windows`` (crop ``--crop`` over the array's first, third
and fourth dimensions, the second taken whole; ``invalid=[0]``; no cache) and the time of
reading the whole array through zcrop in the same slabs of the first dimension, warm page
cache, alternated ``--repeats`` times; medians and their ratio (read time / mask time: 1.0
means the mask costs no more than the read).

    python3 benches/valid_bench.py ARRAY [ARRAY ...] [--crop 4,128,128] [--repeats 3]

Arrays are uint16 (T, C, Y, X) stores such as ``zcrop bench --prepare-only`` writes.
"""

from __future__ import annotations

import argparse
import statistics
import time

import zcrop
from machine import cpu_model
from pagecache import prewarm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("arrays", nargs="+")
    ap.add_argument("--crop", default="4,128,128")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", default="512M")
    args = ap.parse_args()
    ct, cy, cx = (int(v) for v in args.crop.split(","))
    print(f"machine: {cpu_model()}; crop (t, y, x) = ({ct}, {cy}, {cx}); warm; medians of {args.repeats}\n")
    print("| array | GB decoded | read s | valid_windows s | read / valid | valid fraction |")
    print("|---|---|---|---|---|---|")
    for path in args.arrays:
        prewarm(path)
        arr = zcrop.open_array(path)
        t, c, y, x = arr.shape
        src = zcrop.Source(path, crop=(ct, c, cy, cx), dims=["t", 0, "y", "x"])
        step = (arr.shards or arr.chunks)[0]
        reads, masks = [], []
        mask = None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for a in range(0, t, step):
                arr[a : a + step]
            reads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mask = zcrop.valid_windows(src, ["t", "y", "x"], invalid=[0], budget=args.budget,
                                       cache=False, progress=False)
            masks.append(time.perf_counter() - t0)
        r, m = statistics.median(reads), statistics.median(masks)
        assert mask is not None
        share = mask.count() / ((t - ct + 1) * (y - cy + 1) * (x - cx + 1))
        print(f"| {path.rstrip('/').split('/')[-1]} | {arr.nbytes / 1e9:.2f} | {r:.2f} | {m:.2f} | "
              f"{r / m:.2f} | {share:.3f} |")


if __name__ == "__main__":
    main()
