#!/usr/bin/env python3
"""zcrop's GPU hand-off on a real CUDA GPU: pinned ring buffers, copies that must not be overtaken.

    python3 benches/gpu_check.py                       # needs torch with CUDA; jax is optional
    python3 benches/gpu_check.py --dataset PATH.zarr   # also copy bandwidth and batches/s

Run from the repository root (it reads a fixture) with the `zcrop` package importable. It checks:

- the loader's ring buffers are page-locked and registered with CUDA, in a fresh process and in
  one where torch already loaded its CUDA runtime;
- copies to the GPU arrive intact while the GPU's stream lags behind (kept busy ~10 ms per
  batch with ``torch.cuda._sleep``) and each ring buffer is reused as soon as it is free
  (2 buffers, 1 batch read ahead): the consumer's ``non_blocking`` copies through
  ``zcrop.torch.ZcropDataset``, ``ZcropDataset(device="cuda")`` and ``zcrop.jax.JaxLoader``.
  The same copies from ``zcrop.Loader`` arrays dropped at once are counted too: nothing
  guards those, and batches overwritten there show what the guards are for.

With ``--dataset`` (a 4-d uint16 array such as ``zcrop bench --prepare-only --codec blosc-lz4``
writes), it times host-to-device copies of one batch of 32 (4, 12, 128, 128) crops from a ring
buffer, from pageable memory and from torch's own pinned memory, and batches/s of
``ZcropDataset`` with no copy, with the consumer's copies and with ``device="cuda"``.

Exits with status 1 when a guarded path delivered a wrong batch or the buffers were not
registered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import torch

import zcrop
import zcrop.torch as zt

FIXTURE = "fixtures/data/v3_workload_4d_u2.zarr"
CROP = (2, 3, 16, 16)
STEPS = 40
LAG_CYCLES = 20_000_000  # about 10 ms at the H100's 1.98 GHz


def source() -> zcrop.Source:
    return zcrop.Source(FIXTURE, CROP, name="img", dtype="float32")


def pin_state_in_child(prelude: str = "") -> dict:
    code = (f"{prelude}import json, zcrop; l = zcrop.Loader(zcrop.Source({FIXTURE!r}, {CROP}), "
            "batch_size=2, steps=1); print(json.dumps(l.pin_state))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def differing(got: list, expected: list[np.ndarray]) -> int:
    torch.cuda.synchronize()
    assert len(got) == len(expected), (len(got), len(expected))
    return sum(not np.array_equal(np.asarray(g.cpu() if hasattr(g, "cpu") else g), e)
               for g, e in zip(got, expected))


def copies(dev: torch.device, lag: int, expected: list[np.ndarray]) -> dict[str, int]:
    """Wrong batches per path, with the GPU's stream kept busy `lag` cycles per batch."""
    kw = dict(batch_size=4, seed=5, steps=STEPS, prefetch=1, buffers=2)
    wrong = {}

    got = []
    for b in zcrop.Loader(source(), **kw):  # unguarded: the arrays are dropped at once
        if lag:
            torch.cuda._sleep(lag)
        got.append(zt._tensor(b["img"]).to(dev, non_blocking=True))
        del b
    wrong["zcrop.Loader arrays, unguarded"] = differing(got, expected)

    got = []
    for b in zt.ZcropDataset(source(), **kw):
        if lag:
            torch.cuda._sleep(lag)
        got.append(b["img"].to(dev, non_blocking=True))
        del b
    wrong["ZcropDataset + the consumer's copies"] = differing(got, expected)

    got = []
    for b in zt.ZcropDataset(source(), device=dev, **kw):
        if lag:
            torch.cuda._sleep(lag)
        got.append(b["img"] * 1)  # the consumer's work, after the copy
    wrong["ZcropDataset(device=cuda)"] = differing(got, expected)
    return wrong


JAX_CHILD = """
import json, sys, numpy as np, jax, zcrop, zcrop.jax as zj
if jax.default_backend() == "cpu":  # arrays alias the ring buffers there: nothing to check
    print(json.dumps({{"skipped": "jax has no accelerator"}}))
    sys.exit()
def src():
    return zcrop.Source({fixture!r}, {crop}, name="img", dtype="float32")
kw = dict(batch_size=4, seed=5, steps={steps})
want = [b["img"] for b in zcrop.Loader(src(), copy=True, pin=False, **kw)]
got = [b["img"] for b in zj.JaxLoader(src(), prefetch=1, buffers=2, **kw)]
wrong = sum(not np.array_equal(np.asarray(g), w) for g, w in zip(got, want))
print(json.dumps({{"device": str(got[0].devices()), "wrong": wrong}}))
"""


def jax_copies() -> dict | str:
    code = JAX_CHILD.format(fixture=FIXTURE, crop=CROP, steps=STEPS)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        return "failed: " + out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"
    return json.loads(out.stdout.strip().splitlines()[-1])


def throughput(dev: torch.device, path: str) -> None:
    src = zcrop.Source(path, (4, 12, 128, 128), name="x")
    with zcrop.Loader(src, batch_size=32, seed=1, steps=2) as ld:
        ring = zt._tensor(next(ld)["x"])
        pageable = torch.from_numpy(ring.numpy().copy())
        pinned = pageable.pin_memory()
        print(f"is_pinned: ring {ring.is_pinned()}, pageable {pageable.is_pinned()}, "
              f"torch's {pinned.is_pinned()}")
        for name, t in (("ring buffer", ring), ("pageable", pageable), ("torch pinned", pinned)):
            for _ in range(3):
                t.to(dev, non_blocking=True)
            torch.cuda.synchronize()
            n, t0 = 20, time.perf_counter()
            for _ in range(n):
                t.to(dev, non_blocking=True)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / n
            print(f"host-to-device from {name}: {t.nbytes / dt / 1e9:.1f} GB/s "
                  f"({t.nbytes / 1e6:.1f} MB per copy)")
        del ring
    for step_ms in (0, 4):
        for label in ("no copy", "the consumer's copies", "device=cuda"):
            ds = zt.ZcropDataset(src, batch_size=32, seed=1, steps=80, prefetch=4,
                                 device=dev if label == "device=cuda" else None)
            it = iter(ds)
            next(it)
            n, t0 = 0, time.perf_counter()
            for b in it:
                x = b["x"]
                if label == "the consumer's copies":
                    x = x.to(dev, non_blocking=True)
                if step_ms:
                    torch.cuda._sleep(int(step_ms * 1.98e6))
                n += 1
            torch.cuda.synchronize()
            print(f"ZcropDataset, {label}, GPU step ~{step_ms} ms: "
                  f"{n / (time.perf_counter() - t0):.1f} batches/s ({n} batches)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", help="a 4-d uint16 array for the bandwidth and batches/s part")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible to torch", file=sys.stderr)
        return 2
    ok = True
    fresh = pin_state_in_child()
    after_torch = pin_state_in_child("import torch; torch.cuda.init(); ")
    print("ring buffers, fresh process:", fresh)
    print("ring buffers, after torch's CUDA init:", after_torch)
    ok &= fresh["cuda_registered"] and after_torch["cuda_registered"]

    dev = torch.device("cuda", 0)
    print("torch", torch.__version__, torch.cuda.get_device_name(dev))
    expected = [b["img"] for b in zcrop.Loader(source(), batch_size=4, seed=5, steps=STEPS,
                                               copy=True, pin=False)]
    for lag in (0, LAG_CYCLES):
        for path, wrong in copies(dev, lag, expected).items():
            print(f"GPU lag {lag} cycles/batch, {path}: {wrong} of {STEPS} batches wrong")
            ok &= wrong == 0 or "unguarded" in path
    jax_result = jax_copies()
    print("JaxLoader:", jax_result)
    if isinstance(jax_result, dict):
        ok &= jax_result.get("wrong", 0) == 0
    elif "No module named 'jax'" not in jax_result:
        ok = False
    if args.dataset:
        throughput(dev, args.dataset)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
