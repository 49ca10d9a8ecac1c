#!/usr/bin/env python3
"""Random crops from an Icechunk repository: zcrop against zarr-python + icechunk, and zcrop on
the same array as a plain Zarr store, locally and from the loopback cloud simulator.

    python3 benches/icechunk_compare.py                        # local, then 0 and 20 ms
    python3 benches/icechunk_compare.py --places local,80 --dataset-size 1G

The dataset is compare.py's `zstd` one (uint16 (T, 12, 1024, 1024), shards of (T', 12, 512,
512) holding (1, 1, 128, 128) chunks, zstd level 1, from `zcrop bench --prepare-only`), copied
by zarr-python into an Icechunk repository (icechunk 1.1.21, spec v1) as the array `data`:
each shard becomes one chunk object, and the manifest says where. Crops are (4, 12, 128, 128).

Places: `local` reads the directories; a number is a first-byte latency in ms on
zcrop-cloudsim (benches/cloud_compare.py's S3-style simulator), which serves both the plain
store and the repository. Readers, each in its own process through compare.py's worker (a
warm-up batch first, --repeats runs in rotated order, median counts): `zcrop` (the plain Zarr
store), `zcrop-icechunk` (zcrop.open_icechunk), `zarr-icechunk` (zarr-python 3 over an
icechunk readonly session, a batch's crops gathered at once). TensorStore cannot read
Icechunk, so it is not a peer here. Writes icechunk.md / icechunk.json to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

from cloud_compare import CloudSim, prepare, run_worker
from compare import LABEL, S3_BUCKET, summarise, venv_python
from machine import cpu_model
from pagecache import zcrop_binary

HERE = os.path.dirname(os.path.abspath(__file__))
READERS = ["zcrop", "zcrop-icechunk", "zarr-icechunk"]
SHAPE = [4, 12, 128, 128]


def write_icechunk(src: str, dst: str) -> None:
    """Copies the array at ``src`` into a new Icechunk repository at ``dst`` as ``data``, with
    the same chunks, shards and codecs (run in the benchmark virtualenv)."""
    import icechunk
    import zarr

    a = zarr.open_array(src, mode="r")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(dst))
    session = repo.writable_session("main")
    b = zarr.create_array(session.store, name="data", shape=a.shape, dtype=a.dtype, chunks=a.chunks,
                          shards=a.shards, compressors=a.compressors, filters=a.filters, serializer=a.serializer,
                          fill_value=a.fill_value, dimension_names=a.metadata.dimension_names)
    step = (a.shards or a.chunks)[0]
    for t in range(0, a.shape[0], step):
        b[t : t + step] = a[t : t + step]
    session.commit(f"copy of {src}")


def run_reader(py: str, reader: str, path: str, origins_file: str, env: dict) -> dict:
    """One run of ``reader`` through compare.py's worker: its JSON report, or {"error": ...}."""
    cmd = [py, os.path.join(HERE, "compare.py"), "--worker", reader, "--path", path, "--origins", origins_file,
           "--shape", ",".join(map(str, SHAPE)), "--warmup"]
    return run_worker(cmd, env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-icechunk", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--places", default="local,0,20", help="`local` and/or simulator latencies in ms")
    ap.add_argument("--dataset-size", default="512M")
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.write_icechunk:
        return write_icechunk(*args.write_icechunk)

    py = venv_python()
    zcrop = zcrop_binary()
    cache = os.environ.get("ZCROP_BENCH_DATA", os.path.join(tempfile.gettempdir(), "zcrop-bench-data"))
    os.makedirs(cache, exist_ok=True)
    plain = prepare("zstd", args.dataset_size, py, zcrop, cache, args.seed)
    repo = plain.rstrip("/") + ".icechunk"
    if not os.path.exists(os.path.join(repo, ".complete")):
        print(f"writing {repo}", file=sys.stderr)
        subprocess.run(["rm", "-rf", repo], check=True)
        subprocess.run([py, os.path.abspath(__file__), "--write-icechunk", plain, repo], check=True, cwd=HERE)
        open(os.path.join(repo, ".complete"), "w").close()
    info = json.loads(subprocess.run([zcrop, "info", "--json", plain], check=True, text=True,
                                     capture_output=True).stdout)
    tmp = tempfile.mkdtemp(prefix="zcrop-icechunk-")
    origins_file = os.path.join(tmp, "origins.npy")
    code = (
        "import numpy as np;"
        f"rng=np.random.default_rng({args.seed});"
        f"o=np.stack([rng.integers(0, s-c+1, size=({args.batches + 1},{args.batch_size})) "
        f"for s,c in zip({info['shape']},{SHAPE})], axis=-1);"
        f"np.save({origins_file!r}, o.astype(np.int64))"
    )
    subprocess.run([py, "-c", code], check=True)
    bucket = os.path.join(tmp, "root", S3_BUCKET)
    os.makedirs(bucket)
    os.symlink(plain, os.path.join(bucket, "data.zarr"))
    os.symlink(repo, os.path.join(bucket, "data.icechunk"))

    readers = args.readers.split(",")
    places = args.places.split(",")
    sim = CloudSim(os.path.join(tmp, "root")) if any(p != "local" for p in places) else None
    results = []
    try:
        for place in places:
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
            if place == "local":
                paths = {"zcrop": plain, "zcrop-icechunk": repo, "zarr-icechunk": repo}
            else:
                sim.call("PUT", "shaping", {"latency_ms": float(place), "jitter_ms": 0.0, "tail_fraction": 0.0,
                                            "tail_factor": 10.0, "conn_bytes_per_s": 0.0, "total_bytes_per_s": 0.0,
                                            "seed": args.seed})
                env.update(ZCROP_BENCH_S3_ENDPOINT=sim.endpoint, ZCROP_BENCH_STATS_URL=f"{sim.endpoint}/_cloudsim/stats")
                url = f"s3://{S3_BUCKET}/data"
                paths = {"zcrop": f"{url}.zarr", "zcrop-icechunk": f"{url}.icechunk", "zarr-icechunk": f"{url}.icechunk"}
            row = {"place": place, "readers": {}}
            runs = {r: [] for r in readers}
            for rep in range(max(1, args.repeats)):
                for r in readers[rep % len(readers):] + readers[:rep % len(readers)]:
                    if "error" in row["readers"].get(r, {}):
                        continue
                    if sim is not None and place != "local":
                        sim.call("POST", "reset")
                    res = run_reader(py, r, paths[r], origins_file, env)
                    if "error" in res:
                        row["readers"][r] = res
                        print(f"{place} {r}: FAILED: {res['error']}", file=sys.stderr)
                        continue
                    runs[r].append(res)
                    print(f"{place} {r} run {rep + 1}: {res['crops_per_s']:.1f} crops/s, p50 {res['p50_ms']:.0f} ms",
                          file=sys.stderr)
            summarise(row, runs)
            results.append(row)
    finally:
        if sim is not None:
            sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    write_report(results, args, info)


def write_report(results: list[dict], args, info: dict) -> None:
    os.makedirs(args.out, exist_ok=True)
    when = datetime.date.today().isoformat()
    machine = f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}"
    cmd = "python3 benches/icechunk_compare.py " + " ".join(sys.argv[1:])
    lines = [
        f"Random crops {tuple(SHAPE)} of uint16 {tuple(info['shape'])} (sharded, zstd level 1), batches of "
        f"{args.batch_size}, {args.batches} timed batches per run, median of {max(1, args.repeats)} runs per reader "
        f"(order rotated; every run in icechunk.json); {when}; {machine}; `{cmd.strip()}`.",
        "",
        "| place | reader | crops/s | GB/s | GETs | p50 ms | p99 ms | vs zarr-python + icechunk | vs zcrop on plain Zarr | same bytes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        rs = row["readers"]
        peer = rs.get("zarr-icechunk", {}).get("crops_per_s")
        own = rs.get("zcrop", {}).get("crops_per_s")
        place = "local files" if row["place"] == "local" else f"simulator, {row['place']} ms"
        for r, v in rs.items():
            if "error" in v:
                lines.append(f"| {place} | {LABEL[r]} | failed: {v['error']} | | | | | | | |")
                continue
            gets = v.get("server", {}).get("gets", "-")
            vs_peer = f"{v['crops_per_s'] / peer:.2f}x" if peer else "-"
            vs_own = f"{v['crops_per_s'] / own:.2f}x" if own else "-"
            same = "reference" if r == "zcrop" else ("yes" if v.get("identical_to_zcrop") else "NO")
            lines.append(
                f"| {place} | {LABEL[r]} | {v['crops_per_s']:.1f} | {v['output_bytes'] / v['seconds'] / 1e9:.3f} | "
                f"{gets} | {v['p50_ms']:.0f} | {v['p99_ms']:.0f} | {vs_peer} | {vs_own} | {same} |"
            )
    with open(os.path.join(args.out, "icechunk.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "icechunk.json"), "w") as f:
        json.dump({"date": when, "machine": machine, "command": cmd, "results": results}, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
