#!/usr/bin/env python3
"""The sampler alone: positions drawn per second with masks and weights (no reads).

Positions are those of a (1000, 1000, 1000) array (10^9 positions; the array has metadata
only, its chunks are never read). Each case builds a ``zcrop.Samples`` and times
``positions(first, n)``, the Rust draw loop with the GIL released, in batches of 10^6:

- ``box``: no mask, no weights (the plain uniform draw);
- ``mask 1e9``: a mask at full resolution over all 10^9 positions, given as runs (a
  NaN-like pattern: every (t, y) row has two valid stretches, 2 million runs in all);
- ``weights 1e6``: weights over 100 x 100 x 100 cells of 10 x 10 x 10 positions;
- ``mask 1e9 + weights 1e6``: both;
- ``coarse mask + weights``: a random mask of 100 x 100 x 100 cells, and the weights.

Reports build time, the blocks the allowed positions are stored as, the memory the position
space holds (blocks, lookup tables, the masks' runs and the weights), and positions/s (median
of --repeats). Run with a release build of zcrop installed:

    python3 benches/sampler_bench.py [--repeats 5] [--draws 1000000]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np
import zarr

import zcrop
from machine import cpu_model


def nan_like_runs(shape: tuple[int, int, int], seed: int) -> np.ndarray:
    """Two valid stretches per (t, y) row, at random places: ``(rows * 2, 2)`` runs."""
    t, y, x = shape
    rng = np.random.default_rng(seed)
    rows = np.arange(t * y, dtype=np.uint64) * np.uint64(x)
    a = np.sort(rng.integers(0, x, size=(t * y, 4)), axis=1).astype(np.uint64)
    a[:, 1] = np.maximum(a[:, 1], a[:, 0] + 1)
    a[:, 3] = np.maximum(a[:, 3], a[:, 2] + 1)
    a[:, 2] = np.maximum(a[:, 2], a[:, 1] + 1)
    a[:, 3] = np.minimum(np.maximum(a[:, 3], a[:, 2] + 1), x)
    keep = a[:, 2] < a[:, 3]
    first = np.stack([rows + a[:, 0], rows + a[:, 1]], axis=1)
    second = np.stack([rows + a[:, 2], rows + a[:, 3]], axis=1)[keep]
    runs = np.concatenate([first, second])
    return runs[np.argsort(runs[:, 0], kind="stable")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--draws", type=int, default=1_000_000)
    args = ap.parse_args()

    shape = (1000, 1000, 1000)
    with tempfile.TemporaryDirectory() as d:
        zarr.create_array(f"{d}/a.zarr", shape=shape, chunks=(10, 100, 100), dtype="float32",
                          dimension_names=["t", "y", "x"])
        src = zcrop.Source(f"{d}/a.zarr", crop=(1, 1, 1))
        rng = np.random.default_rng(0)
        weights = rng.lognormal(size=(100, 100, 100))
        weights[rng.random(weights.shape) < 0.2] = 0.0
        fine = zcrop.ValidMask(["t", "y", "x"], shape, [1, 1, 1], nan_like_runs(shape, 1))
        coarse = rng.random((100, 100, 100)) < 0.5
        cases = {
            "box": {},
            "mask 1e9": {"valid": fine},
            "weights 1e6": {"weights": weights},
            "mask 1e9 + weights 1e6": {"valid": fine, "weights": weights},
            "coarse mask + weights": {"valid": coarse, "weights": weights},
        }
        print(f"machine: {cpu_model()}; zcrop {zcrop.__version__}; {args.draws} draws x {args.repeats}")
        print(f"mask 1e9: {len(fine.runs)} runs, {fine.count() / 1e9:.3f} of positions allowed\n")
        print("| case | build s | blocks | held MiB | positions/s (median) |")
        print("|---|---|---|---|---|")
        for name, kw in cases.items():
            t0 = time.perf_counter()
            s = zcrop.Samples(src, length=1, seed=3, **kw)
            build = time.perf_counter() - t0
            held = s._native.position_bytes / 2**20
            rates = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                s._native.positions(r * args.draws, args.draws)
                rates.append(args.draws / (time.perf_counter() - t0))
            print(f"| {name} | {build:.2f} | {s._native.position_blocks} | {held:.0f} | "
                  f"{statistics.median(rates):,.0f} |")
            del s


if __name__ == "__main__":
    main()
