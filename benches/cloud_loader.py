#!/usr/bin/env python3
"""zcrop's Loader reading from zcrop-cloudsim: how much of a bandwidth cap it uses at a given
latency, for each read-ahead depth.

    python3 benches/cloud_loader.py                              # 80 ms, 200 MB/s, zstd
    python3 benches/cloud_loader.py --latency-ms 20 --total-mb-s 500 --prefetch 1,2,4
    python3 benches/cloud_loader.py --dataset era5 --total-mb-s 0 --prefetch 2,auto --warmup 40

cloud_compare.py reads one batch at a time, so each batch leaves the link idle for a round
trip; the Loader reads `prefetch` batches ahead of the consumer (which here takes each batch
and drops it); `auto` is the Loader's adaptive depth, timed after `--warmup` batches in which
it settles. Per depth: batches/s, crops/s, the MB/s the simulator sent during the timed
batches and that as a share of the cap (with one), and GETs per batch. `era5` is
cloud_compare.py's ERA5-like v2 array, read in (4, 64, 64) windows. Runs in the benchmark virtualenv
(compare.py's), with zcrop built from this checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run_loader(endpoint: str, url: str, crop: list[int], batch_size: int, prefetch: int | str, steps: int,
               warmup: int) -> dict:
    """Iterates a Loader over ``url`` (run in the benchmark virtualenv)."""
    import urllib.request

    import zcrop

    def stats() -> dict:
        with urllib.request.urlopen(endpoint + "/_cloudsim/stats", timeout=10) as r:
            return json.load(r)

    source = zcrop.Source(url, tuple(crop), storage_options={
        "endpoint_url": endpoint, "region": "us-east-1", "key": "bench", "secret": "bench"})
    loader = zcrop.Loader([source], batch_size=batch_size, seed=1, prefetch=prefetch, steps=steps + warmup)
    batches = iter(loader)
    # Untimed batches: the engine measures the store, the shard indexes are read, an adaptive
    # depth settles.
    for _ in range(warmup):
        next(batches)
    s0, t = stats(), time.perf_counter()
    n = sum(1 for _ in batches)
    seconds, s1 = time.perf_counter() - t, stats()
    return {"prefetch": prefetch, "batches": n, "seconds": seconds, "batches_per_s": n / seconds,
            "crops_per_s": n * batch_size / seconds, "mb_per_s": (s1["bytes_sent"] - s0["bytes_sent"]) / seconds / 1e6,
            "gets_per_batch": (s1["gets"] - s0["gets"]) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--latency-ms", type=float, default=80.0)
    ap.add_argument("--total-mb-s", type=float, default=200.0, help="the server's bandwidth cap, MB/s")
    ap.add_argument("--dataset", choices=["zstd", "blosc", "era5"], default="zstd")
    ap.add_argument("--dataset-size", default="256M")
    ap.add_argument("--prefetch", default="1,2,4", help="read-ahead depths to run (numbers or auto)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches before the timed ones")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16, help="timed batches per depth")
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        return print(json.dumps(run_loader(**spec)))

    from cloud_compare import CloudSim, prepare
    from compare import S3_BUCKET, venv_python
    from pagecache import zcrop_binary

    py = venv_python()
    path = prepare(args.dataset, args.dataset_size, py, zcrop_binary(), tempfile.gettempdir(), seed=1)
    root = tempfile.mkdtemp(prefix="zcrop-cloud-loader-")
    os.makedirs(os.path.join(root, S3_BUCKET))
    os.symlink(path, os.path.join(root, S3_BUCKET, f"{args.dataset}.zarr"))
    sim = CloudSim(root)
    rows = []
    try:
        sim.call("PUT", "shaping", {"latency_ms": args.latency_ms, "total_bytes_per_s": args.total_mb_s * 1e6})
        crop = [4, 64, 64] if args.dataset == "era5" else [4, 12, 128, 128]
        for depth in (p if p == "auto" else int(p) for p in args.prefetch.split(",")):
            spec = {"endpoint": sim.endpoint, "url": f"s3://{S3_BUCKET}/{args.dataset}.zarr", "crop": crop,
                    "batch_size": args.batch_size, "prefetch": depth, "steps": args.steps, "warmup": args.warmup}
            out = subprocess.run([py, os.path.abspath(__file__), "--worker", json.dumps(spec)], check=True, text=True,
                                 capture_output=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"), cwd=HERE)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        sim.stop()
    cap = f"{args.total_mb_s:g} MB/s cap" if args.total_mb_s else "no bandwidth cap"
    print(f"Loader over `{args.dataset}` from zcrop-cloudsim at {args.latency_ms:g} ms, {cap}, "
          f"batches of {args.batch_size} {tuple(crop)} crops, {args.warmup} untimed and {args.steps} timed batches; "
          f"`python3 benches/cloud_loader.py {' '.join(sys.argv[1:])}`.\n")
    print("| prefetch | batches/s | crops/s | MB/s fetched | share of the cap | GETs per batch |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        share = f"{r['mb_per_s'] / args.total_mb_s:.0%}" if args.total_mb_s else "-"
        print(f"| {r['prefetch']} | {r['batches_per_s']:.2f} | {r['crops_per_s']:.1f} | {r['mb_per_s']:.0f} | "
              f"{share} | {r['gets_per_batch']:.0f} |")


if __name__ == "__main__":
    main()
