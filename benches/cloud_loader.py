#!/usr/bin/env python3
"""zcrop's Loader reading from zcrop-cloudsim: how much of a bandwidth cap it uses at a given
latency, for each read-ahead depth, and TensorStore reading the same batches ahead as well.

    python3 benches/cloud_loader.py                              # 80 ms, 200 MB/s, zstd
    python3 benches/cloud_loader.py --latency-ms 20 --total-mb-s 500 --prefetch 1,2,4
    python3 benches/cloud_loader.py --dataset era5 --total-mb-s 0 --prefetch 2,auto --warmup 40
    python3 benches/cloud_loader.py --dataset era5 --total-mb-s 0 --prefetch auto --peer-prefetch 1,2,4 --repeats 3

cloud_compare.py reads one batch at a time, so each batch leaves the link idle for a round
trip; the Loader reads `prefetch` batches ahead of the consumer (which here takes each batch
and drops it); `auto` is the Loader's adaptive depth, timed after `--warmup` batches in which
it settles. Per depth: batches/s, crops/s, the MB/s the simulator sent during the timed
batches and that as a share of the cap (with one), the bytes it sent per stored byte of the
chunks the timed batches' crops touch (each chunk once per batch; below 1 where a cache serves
chunks again), and GETs per batch. `era5` is
cloud_compare.py's ERA5-like v2 array, read in (4, 64, 64) windows.

With --peer-prefetch, TensorStore (compare.py's settings: 64 MiB cache pool, 64 requests in
flight, each batch one ts.Batch) reads the Loader's batches, the same origins, keeping that
many batches in flight beyond the one the consumer waits for; every run's batches are hashed
and must agree. --whole-prefetch and --nocache-prefetch run the Loader again at those depths,
fetching large blosc chunks whole and without a chunk cache. Runs in the benchmark virtualenv
(compare.py's), with zcrop built from this checkout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: The Loader run with other settings: the name in the table and the environment.
VARIANTS = {
    "zcrop-whole": ("zcrop Loader, whole chunks", {"ZCROP_BLOSC_BLOCK_FETCH": "never"}),
    "zcrop-nocache": ("zcrop Loader, no chunk cache", {"ZCROP_CHUNK_CACHE": "0"}),
}


def stats(endpoint: str) -> dict:
    """The simulator's counters."""
    import urllib.request

    with urllib.request.urlopen(endpoint + "/_cloudsim/stats", timeout=10) as r:
        return json.load(r)


def run_loader(endpoint: str, url: str, crop: list[int], batch_size: int, prefetch: int | str, steps: int,
               warmup: int, origins_file: str) -> dict:
    """Iterates a Loader over ``url`` (run in the benchmark virtualenv). Its batches' origins go
    to ``origins_file`` (when not there yet) for the peers."""
    import numpy as np

    import zcrop

    source = zcrop.Source(url, tuple(crop), storage_options={
        "endpoint_url": endpoint, "region": "us-east-1", "key": "bench", "secret": "bench"})
    loader = zcrop.Loader([source], batch_size=batch_size, seed=1, prefetch=prefetch, steps=steps + warmup)
    if not os.path.exists(origins_file):
        origins = [[next(iter(m["sources"].values()))["origin"] for m in loader.plan(s)] for s in range(steps + warmup)]
        np.save(origins_file, np.array(origins, dtype=np.int64))
    batches = iter(loader)
    # Untimed batches: the engine measures the store, the shard indexes are read, an adaptive
    # depth settles.
    for _ in range(warmup):
        next(batches)
    hashes = []
    s0, t = stats(endpoint), time.perf_counter()
    for batch in batches:
        data = next(v for k, v in batch.items() if k != "meta")
        hashes.append(hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest())
    seconds, s1 = time.perf_counter() - t, stats(endpoint)
    row = report("zcrop Loader", prefetch, len(hashes), batch_size, seconds, s0, s1, hashes)
    row["depth"] = loader.prefetch_depth
    return row


def run_tensorstore(endpoint: str, url: str, crop: list[int], batch_size: int, prefetch: int, steps: int,
                    warmup: int, origins_file: str, zarr_format: int) -> dict:
    """TensorStore reading the Loader's batches (from ``origins_file``) with ``prefetch``
    batches in flight ahead of the one taken: each batch one ``ts.Batch`` of futures, started
    as soon as a slot frees."""
    from collections import deque

    import numpy as np

    from compare import tensorstore_open, tensorstore_s3, tensorstore_submit

    os.environ["ZCROP_BENCH_S3_ENDPOINT"] = endpoint
    arr = tensorstore_open(*tensorstore_s3(url, zarr_format))
    origins = np.load(origins_file)
    for b in origins[:warmup]:
        np.stack([f.result() for f in tensorstore_submit(arr, b, crop)])
    timed = origins[warmup:]
    hashes = []
    s0, t = stats(endpoint), time.perf_counter()
    queue = deque(tensorstore_submit(arr, b, crop) for b in timed[:prefetch + 1])
    for i in range(len(timed)):
        data = np.stack([f.result() for f in queue.popleft()])
        if i + prefetch + 1 < len(timed):
            queue.append(tensorstore_submit(arr, timed[i + prefetch + 1], crop))
        hashes.append(hashlib.sha256(np.ascontiguousarray(data).tobytes()).hexdigest())
    seconds, s1 = time.perf_counter() - t, stats(endpoint)
    return report("TensorStore", prefetch, len(hashes), batch_size, seconds, s0, s1, hashes)


def report(reader: str, prefetch, n: int, batch_size: int, seconds: float, s0: dict, s1: dict,
           hashes: list[str]) -> dict:
    return {"reader": reader, "prefetch": prefetch, "batches": n, "seconds": seconds, "batches_per_s": n / seconds,
            "crops_per_s": n * batch_size / seconds, "mb_per_s": (s1["bytes_sent"] - s0["bytes_sent"]) / seconds / 1e6,
            "gets_per_batch": (s1["gets"] - s0["gets"]) / n, "bytes_sent": s1["bytes_sent"] - s0["bytes_sent"],
            "hashes": hashes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--latency-ms", type=float, default=80.0)
    ap.add_argument("--total-mb-s", type=float, default=200.0, help="the server's bandwidth cap, MB/s")
    ap.add_argument("--dataset", choices=["zstd", "blosc", "era5"], default="zstd")
    ap.add_argument("--dataset-size", default="256M")
    ap.add_argument("--prefetch", default="1,2,4", help="the Loader's read-ahead depths to run (numbers or auto)")
    ap.add_argument("--peer-prefetch", default="", help="TensorStore's read-ahead depths to run (numbers; none by default)")
    ap.add_argument("--whole-prefetch", default="",
                    help="depths to run the Loader at with ZCROP_BLOSC_BLOCK_FETCH=never (whole blosc chunks; none by default)")
    ap.add_argument("--nocache-prefetch", default="",
                    help="depths to run the Loader at with ZCROP_CHUNK_CACHE=0 (no chunk cache; none by default)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per reader and depth, in rotated order (medians reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches before the timed ones")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=16, help="timed batches per depth")
    args = ap.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        run = run_tensorstore if spec.pop("reader") == "tensorstore" else run_loader
        return print(json.dumps(run(**spec)))

    from cloud_compare import CloudSim, prepare
    from compare import S3_BUCKET, venv_python
    from pagecache import zcrop_binary

    py = venv_python()
    path = prepare(args.dataset, args.dataset_size, py, zcrop_binary(), tempfile.gettempdir(), seed=1)
    root = tempfile.mkdtemp(prefix="zcrop-cloud-loader-")
    os.makedirs(os.path.join(root, S3_BUCKET))
    os.symlink(path, os.path.join(root, S3_BUCKET, f"{args.dataset}.zarr"))
    origins_file = os.path.join(root, "origins.npy")
    crop = [4, 64, 64] if args.dataset == "era5" else [4, 12, 128, 128]
    zarr_format = 3 if os.path.exists(os.path.join(path, "zarr.json")) else 2
    runs = [("zcrop", p if p == "auto" else int(p)) for p in args.prefetch.split(",") if p]
    if not runs:
        raise SystemExit("--prefetch names no depth: the Loader's run gives the batches every reader reads")
    for variant, depths in (("zcrop-whole", args.whole_prefetch), ("zcrop-nocache", args.nocache_prefetch)):
        runs += [(variant, p if p == "auto" else int(p)) for p in depths.split(",") if p]
    runs += [("tensorstore", int(p)) for p in args.peer_prefetch.split(",") if p]
    sim = CloudSim(root)
    results: dict[tuple, list[dict]] = {r: [] for r in runs}
    try:
        sim.call("PUT", "shaping", {"latency_ms": args.latency_ms, "total_bytes_per_s": args.total_mb_s * 1e6})
        # The first run is the Loader's: it writes the batches' origins that the peers read.
        order = [r for rep in range(args.repeats) for r in runs[rep % len(runs):] + runs[:rep % len(runs)]]
        for reader, depth in order:
            spec = {"reader": reader, "endpoint": sim.endpoint, "url": f"s3://{S3_BUCKET}/{args.dataset}.zarr",
                    "crop": crop, "batch_size": args.batch_size, "prefetch": depth, "steps": args.steps,
                    "warmup": args.warmup, "origins_file": origins_file}
            if reader == "tensorstore":
                spec["zarr_format"] = zarr_format
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **VARIANTS.get(reader, (None, {}))[1])
            out = subprocess.run([py, os.path.abspath(__file__), "--worker", json.dumps(spec)], check=True, text=True,
                                 capture_output=True, env=env, cwd=HERE)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            if reader in VARIANTS:
                row["reader"] = VARIANTS[reader][0]
            results[(reader, depth)].append(row)
            reached = f" (depth {row['depth']} at the end)" if depth == "auto" and "depth" in row else ""
            print(f"{row['reader']} prefetch {depth}{reached}: {row['crops_per_s']:.1f} crops/s, "
                  f"{row['mb_per_s']:.0f} MB/s", file=sys.stderr)
    finally:
        sim.stop()
    needed = json.loads(subprocess.run([py, os.path.join(HERE, "cloud_compare.py"), "--needed-bytes", path, "--origins",
                                        origins_file, "--shape", ",".join(map(str, crop)), "--timed-from",
                                        str(args.warmup)], check=True, text=True, capture_output=True, cwd=HERE).stdout)
    write_table(results, args, crop, sum(needed))


def write_table(results: dict[tuple, list[dict]], args, crop: list[int], needed: int) -> None:
    """Prints the medians per reader and depth, the best zcrop depth against the best peer
    depth, and whether every run delivered the same bytes."""
    import statistics

    cap = f"{args.total_mb_s:g} MB/s cap" if args.total_mb_s else "no bandwidth cap"
    print(f"Batches over `{args.dataset}` from zcrop-cloudsim at {args.latency_ms:g} ms, {cap}, "
          f"batches of {args.batch_size} {tuple(crop)} crops, {args.warmup} untimed and {args.steps} timed batches, "
          f"medians of {args.repeats}; `python3 benches/cloud_loader.py {' '.join(sys.argv[1:])}`.\n")
    print("| reader | prefetch | batches/s | crops/s | MB/s fetched | share of the cap | fetched / needed | GETs per batch |")
    print("|---|---|---|---|---|---|---|---|")
    best: dict[str, float] = {}
    hashes = {tuple(r["hashes"]) for rows in results.values() for r in rows}
    for (reader, depth), rows in results.items():
        med = {k: statistics.median(r[k] for r in rows)
               for k in ("batches_per_s", "crops_per_s", "mb_per_s", "gets_per_batch", "bytes_sent")}
        best[reader] = max(best.get(reader, 0.0), med["crops_per_s"])
        share = f"{med['mb_per_s'] / args.total_mb_s:.0%}" if args.total_mb_s else "-"
        reached = sorted(r["depth"] for r in rows if "depth" in r)
        shown = f"{depth} (reached {', '.join(map(str, reached))})" if depth == "auto" and reached else depth
        print(f"| {rows[0]['reader']} | {shown} | {med['batches_per_s']:.2f} | {med['crops_per_s']:.1f} | "
              f"{med['mb_per_s']:.0f} | {share} | {med['bytes_sent'] / needed:.2f} | {med['gets_per_batch']:.0f} |")
    if "zcrop" in best and "tensorstore" in best:
        print(f"\nBest zcrop depth against TensorStore's best: {best['zcrop'] / best['tensorstore']:.2f}x.")
    print(f"Identical bytes across every run: {'yes' if len(hashes) == 1 else 'NO'}.")


if __name__ == "__main__":
    main()
