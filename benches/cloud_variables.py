#!/usr/bin/env python3
"""Several variables of an ARCO-ERA5-like dataset read from zcrop-cloudsim: how zcrop's
process-wide chunk cache shares its budget between arrays that each fit in it but not together.

    python3 benches/cloud_variables.py                      # 4 variables, 20 ms, 16 batches
    python3 benches/cloud_variables.py --variables 2 --latency-ms 80 --repeats 3

The variables are cloud_compare.py's ERA5-like v2 array (64 time steps of one 4.2 MB Blosc-LZ4
chunk each, 147 MB stored) served under several names, so that each is its own array to zcrop.
Each batch reads 8 random (4, 64, 64) windows, the same origins from every variable, one
variable after the other (as xarray loads a dataset's variables); one untimed batch first.
Per run (a fresh process): crops/s over the timed batches, and the GETs and bytes the simulator
served in the whole run (opens and the untimed batch included). Runs in compare.py's benchmark
virtualenv with zcrop built from this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(endpoint: str, names: list[str], batches: int, seed: int) -> dict:
    """Reads the batches (run in the benchmark virtualenv)."""
    import numpy as np

    import zcrop
    from compare import S3_BUCKET

    opts = {"endpoint_url": endpoint, "region": "us-east-1", "key": "bench", "secret": "bench"}
    arrays = [zcrop.open_array(f"s3://{S3_BUCKET}/{n}", storage_options=opts) for n in names]
    rng = np.random.default_rng(seed)
    window = (4, 64, 64)

    def batch() -> None:
        origins = np.stack([rng.integers(0, s - c + 1, size=8) for s, c in zip(arrays[0].shape, window)], axis=-1)
        for a in arrays:
            a.read_crops(origins, window)

    batch()
    t = time.perf_counter()
    for _ in range(batches):
        batch()
    return {"crops_per_s": batches * 8 * len(arrays) / (time.perf_counter() - t)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--variables", type=int, default=4)
    ap.add_argument("--batches", type=int, default=16, help="timed batches per run")
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3, help="runs (medians reported)")
    args = ap.parse_args()
    if args.worker:
        return print(json.dumps(worker(**json.loads(args.worker))))

    from cloud_compare import CloudSim, prepare
    from compare import S3_BUCKET, venv_python
    from pagecache import zcrop_binary

    py = venv_python()
    path = prepare("era5", "256M", py, zcrop_binary(), tempfile.gettempdir(), seed=1)
    root = tempfile.mkdtemp(prefix="zcrop-cloud-variables-")
    os.makedirs(os.path.join(root, S3_BUCKET))
    names = [f"v{i}.zarr" for i in range(args.variables)]
    for n in names:
        os.symlink(path, os.path.join(root, S3_BUCKET, n))
    sim = CloudSim(root)
    rows = []
    try:
        sim.call("PUT", "shaping", {"latency_ms": args.latency_ms})
        for run in range(args.repeats):
            s0 = sim.call("GET", "stats")
            spec = {"endpoint": sim.endpoint, "names": names, "batches": args.batches, "seed": run + 1}
            out = subprocess.run([py, os.path.abspath(__file__), "--worker", json.dumps(spec)], check=True,
                                 capture_output=True, text=True, cwd=HERE)
            s1 = sim.call("GET", "stats")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row.update(gets=s1["gets"] - s0["gets"], mb=(s1["bytes_sent"] - s0["bytes_sent"]) / 1e6)
            rows.append(row)
            print(f"run {run + 1}: {row['crops_per_s']:.1f} crops/s, {row['gets']} GETs, {row['mb']:.0f} MB",
                  file=sys.stderr)
    finally:
        sim.stop()
    med = {k: statistics.median(r[k] for r in rows) for k in ("crops_per_s", "gets", "mb")}
    print(f"{args.variables} ERA5-like variables at {args.latency_ms:g} ms, {args.batches} timed batches of 8 "
          f"windows each, medians of {args.repeats}: {med['crops_per_s']:.1f} crops/s, {med['gets']:.0f} GETs, "
          f"{med['mb']:.0f} MB (`python3 benches/cloud_variables.py {' '.join(sys.argv[1:])}`).")


if __name__ == "__main__":
    main()
