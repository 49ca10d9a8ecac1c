#!/usr/bin/env python3
"""The Loader's read-ahead depths on a local array: batches/s with each ``--prefetch`` value
(numbers or ``auto``), alternated ``--rounds`` times, medians. A consumer that takes each batch
and drops it, so the loader is the limit: where decoding is, an adaptive depth should neither
gain nor lose.

    python3 benches/loader_prefetch.py ARRAY [--prefetch 2,auto] [--rounds 7]

ARRAY is a uint16 (T, C, Y, X) store such as ``zcrop bench --prepare-only`` writes; crops
(4, C, 128, 128), batches of 8, 40 untimed then ``--steps`` timed batches per run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import zcrop


def run(path: str, prefetch: int | str, steps: int) -> float:
    channels = zcrop.open_array(path).shape[1]
    src = zcrop.Source(path, (4, channels, 128, 128), dims=["t", 0, "y", "x"])
    loader = zcrop.Loader(src, positions=["t", "y", "x"], batch_size=8, prefetch=prefetch,
                          steps=steps + 40, pin=False)
    batches = iter(loader)
    for _ in range(40):
        next(batches)
    t = time.perf_counter()
    n = sum(1 for _ in batches)
    return n / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("array")
    ap.add_argument("--prefetch", default="2,auto")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    depths = [p if p == "auto" else int(p) for p in args.prefetch.split(",")]
    runs: dict[int | str, list[float]] = {d: [] for d in depths}
    for _ in range(args.rounds):
        for d in depths:
            runs[d].append(run(args.array, d, args.steps))
    print("| prefetch | batches/s (runs) | median |")
    print("|---|---|---|")
    for d, v in runs.items():
        print(f"| {d} | {', '.join(f'{x:.1f}' for x in v)} | {statistics.median(v):.1f} |")


if __name__ == "__main__":
    main()
