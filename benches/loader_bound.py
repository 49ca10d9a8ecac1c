#!/usr/bin/env python3
"""The most DataLoader workers can deliver on this machine, relative to the in-process Loader:
the CPU per batch of torch's DataLoader machinery and zcrop's hand-off alone (workers that
yield a ready batch over a slot, no reading), against the CPU per batch of the Loader reading
the default batches of ``benches/loader_fork.py``. Where reading keeps every core busy,
workers reach at most read / (read + hand-off) of the Loader's batches/s.

    python3 benches/loader_bound.py

Needs torch and zarr-python next to zcrop (the test virtualenv has both).
"""
from __future__ import annotations

import resource
import tempfile
import time

import numpy as np
import torch
import torch.utils.data
import zarr

import zcrop
import zcrop.torch as zt


def cpu() -> float:
    """CPU seconds of this process and its waited-for children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Ready(torch.utils.data.IterableDataset):
    """Yields the same ready batch over a worker's slot, ``n`` times in all."""

    def __init__(self, n, meta):
        self.n, self.meta = n, meta

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        pool = zt._SlotPool()
        out = pool.put({"img": np.ones((16, 2, 4, 64, 64), np.uint16)})
        for i in range(info.id, self.n, info.num_workers):
            yield {**out, "meta": zt.BatchMeta(self.meta), "batch": i}

def main():
    d = tempfile.mkdtemp()
    a = zarr.create_array(d + "/a.zarr", shape=(32, 4, 256, 256), chunks=(1, 1, 64, 64),
                          dtype="uint16")
    a[:] = np.random.default_rng(0).integers(0, 4000, a.shape, dtype=np.uint16)
    src = zcrop.Source(d + "/a.zarr", (2, 4, 64, 64), name="img")
    n = 1500
    ld = zcrop.Loader(src, batch_size=16, seed=1, steps=n + 50)
    for _ in range(50):
        next(ld)
    c0, t0 = cpu(), time.perf_counter()
    for b in ld:
        meta = b["meta"]
    c1, t1 = cpu(), time.perf_counter()
    read = (c1 - c0) / n
    print(f"Loader: {n / (t1 - t0):.0f} batches/s, {read * 1e3:.2f} ms CPU per batch")
    for w in (2, 4):
        dl = torch.utils.data.DataLoader(Ready(n, meta), batch_size=None, num_workers=w)
        c0, t0 = cpu(), time.perf_counter()
        k = sum(1 for _ in dl)
        del dl
        c1, t1 = cpu(), time.perf_counter()
        hand = (c1 - c0) / k
        print(f"DataLoader hand-off only, {w} workers: {k / (t1 - t0):.0f} batches/s, "
              f"{hand * 1e3:.2f} ms CPU per batch (worker start included); "
              f"bound {read / (read + hand):.2f}x")

if __name__ == "__main__":
    main()
