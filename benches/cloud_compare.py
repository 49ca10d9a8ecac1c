#!/usr/bin/env python3
"""Random crops from an object store at cloud latency: zcrop against TensorStore and
zarr-python (over obstore, with and without the zarrs codec pipeline), on a loopback simulator.

    python3 benches/cloud_compare.py                                  # 0, 20 and 80 ms
    python3 benches/cloud_compare.py --latencies 80 --datasets v2,era5 --total-mb-s 500
    python3 benches/cloud_compare.py --latencies 20 --jitter-ms 5 --tail-fraction 0.01

The datasets are served by zcrop-cloudsim (benches/cloudsim, built here with cargo), an S3-style
server on 127.0.0.1 that adds a first-byte latency to every response (fixed, plus uniform
jitter, plus a heavy tail: --tail-fraction of requests wait --tail-factor times longer) and caps
bandwidth per connection and in total. Its validation (request rate unshaped, latency and
bandwidth shaped) is in docs/performance.md.

Datasets (uint16 (T, 12, 1024, 1024) from `zcrop bench --prepare-only`, as in compare.py, read
in random (4, 12, 128, 128) crops): `zstd` (sharded v3, zstd level 1), `blosc` (sharded v3,
blosc lz4), `v2` (Zarr v2, unsharded (1, 1, 256, 256) chunks, zstd level 1); and `era5`, an
ARCO-ERA5-like Zarr v2 array written here by zarr-python: float32 (time, 721, 1440) of a
temperature-like field, one time step per chunk (4.2 MB), Blosc LZ4 with byte shuffle
(zarr-python 2's default compressor), read in random (4, 64, 64) windows.

Readers (each in its own process, through compare.py's worker, --repeats runs in rotated
order, median counts): zcrop (`s3://` URL with storage_options; its number of GETs in flight
adapts, up to 512), `zcrop-fixed` (zcrop held at a fixed 64, its old default), TensorStore's
s3 kvstore (64 MiB cache pool, ts.Batch, 64 requests in flight), and zarr-python 3 over
obstore's S3Store (a batch's crops gathered at once, async concurrency 64), plain and with the
zarrs codec pipeline (which fetches a batch's chunks one at a time, so it runs only at 0 ms
unless --all-latencies). --readers can add `zcrop-cache` (zcrop with a 64 MiB chunk cache)
and `zcrop-whole` / `zcrop-blocks` (large blosc chunks always fetched whole / by block). Per
run the simulator counts the GETs and body bytes of the timed batches; the report gives
crops/s, GB/s delivered, GETs, bytes fetched per stored byte the crops need, MB/s fetched,
p50/p99 batch latency, the ratio to the best peer and whether the bytes equal zcrop's.
Writes cloud.md / cloud.json to --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import urllib.request

from compare import LABEL, S3_BUCKET, best_peer, chunks_needed, summarise, venv_python
from corpus import parse_size
from machine import cpu_model
from pagecache import ROOT, zcrop_binary

HERE = os.path.dirname(os.path.abspath(__file__))
READERS = ["zcrop", "zcrop-fixed", "tensorstore", "zarrs-obstore", "zarr-obstore"]
#: Readers that fetch a batch's chunks one after another (a round trip each): run only at
#: 0 ms unless --all-latencies, where a batch of a thousand chunks costs them a thousand
#: round trips.
SERIAL_READERS = {"zarrs-obstore"}
DATASETS = {
    "zstd": ["--codec", "zstd", "--layout", "sharded"],
    "blosc": ["--codec", "blosc-lz4", "--layout", "sharded"],
    "v2": ["--codec", "zstd", "--layout", "v2"],
}
#: ARCO-ERA5's grid: 0.25 degrees, latitude 90 to -90, longitude 0 to 359.75.
ERA5_GRID = (721, 1440)


class CloudSim:
    """zcrop-cloudsim on a free loopback port, serving the directory ``root`` (buckets are its
    subdirectories); stopped with :meth:`stop` or when this process exits."""

    def __init__(self, root: str) -> None:
        exe = build_cloudsim()
        self.proc = subprocess.Popen([exe, "serve", "--root", root, "--exit-with-stdin"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("zcrop-cloudsim did not start")
        self.endpoint = json.loads(line)["endpoint"]

    def call(self, method: str, what: str, body: dict | None = None) -> dict | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.endpoint}/_cloudsim/{what}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read()
        return json.loads(text) if text else None

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)


def build_cloudsim() -> str:
    """Builds the simulator (release) and returns its path."""
    subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "zcrop-cloudsim"], check=True, cwd=ROOT)
    meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--no-deps"], check=True,
                                     capture_output=True, text=True, cwd=ROOT).stdout)
    return os.path.join(meta["target_directory"], "release", "zcrop-cloudsim")


def write_era5(path: str, steps: int, seed: int) -> None:
    """Writes the ERA5-like array (run in the benchmark virtualenv, for its zarr-python)."""
    import numcodecs
    import numpy as np
    import zarr

    from corpus import Evolving, grib16

    ny, nx = ERA5_GRID
    arr = zarr.create_array(path, shape=(steps, ny, nx), dtype="float32", chunks=(1, ny, nx),
                            compressors=numcodecs.Blosc(cname="lz4", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE),
                            filters=None, fill_value=float("nan"), zarr_format=2, overwrite=True,
                            attributes={"_ARRAY_DIMENSIONS": ["time", "latitude", "longitude"], "units": "K"})
    rng = np.random.default_rng([seed, 5])
    lat = np.linspace(90, -90, ny, dtype=np.float32)[:, None]
    base = 288 - 35 * np.sin(np.deg2rad(lat)) ** 2
    anomalies = Evolving(rng, 1, ny, nx, 3.0, 0.95)
    for t in range(steps):
        field = base + 4 * anomalies.step()[0] + 0.02 * rng.standard_normal((ny, nx), dtype=np.float32)
        arr[t] = grib16(field[None])[0]


def prepare(ds: str, size: str, py: str, zcrop: str, cache: str, seed: int) -> str:
    """The dataset's path (written when missing)."""
    if ds in DATASETS:
        return subprocess.run([zcrop, "bench", "--prepare-only", "--no-progress", "--dataset-size", size, *DATASETS[ds]],
                              check=True, text=True, capture_output=True).stdout.strip()
    if ds != "era5":
        raise SystemExit(f"unknown dataset {ds} (have {', '.join([*DATASETS, 'era5'])})")
    steps = max(8, parse_size(size) // (ERA5_GRID[0] * ERA5_GRID[1] * 4))
    path = os.path.join(cache, f"era5-like-v2-t{steps}-s{seed}.zarr")
    if not os.path.exists(os.path.join(path, ".complete")):
        print(f"writing {path} ({steps} time steps)", file=sys.stderr)
        subprocess.run([py, os.path.abspath(__file__), "--write-era5", path, "--steps", str(steps),
                        "--seed", str(seed)], check=True, cwd=HERE)
        open(os.path.join(path, ".complete"), "w").close()
    return path


def needed_bytes(path: str, origins_file: str, shape: list[int], timed_from: int | None = None) -> list[int]:
    """Per timed batch, the stored bytes of the chunks its crops touch (each once): inner chunks
    of a sharded v3 array (from the shard indexes), chunk files of a v2 one. The timed batches
    are all but the last (this script's warm-up batch), or those from `timed_from` on (a
    Loader's, whose untimed batches come first). Run in the benchmark virtualenv, for numpy."""
    import itertools

    import numpy as np

    meta_path = os.path.join(path, "zarr.json")
    sharded = os.path.exists(meta_path)
    if sharded:
        meta = json.load(open(meta_path))
        shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
        inner = meta["codecs"][0]["configuration"]["chunk_shape"]
        sep = meta["chunk_key_encoding"]["configuration"]["separator"]
        per = [s // c for s, c in zip(shard, inner)]
        indexes: dict = {}
    else:
        meta = json.load(open(os.path.join(path, ".zarray")))
        inner = meta["chunks"]
        sep = meta.get("dimension_separator", ".")
    out = []
    batches = np.load(origins_file)
    for batch in batches[:-1] if timed_from is None else batches[timed_from:]:
        touched = set()
        for o in batch:
            ranges = [range(a // c, (a + n - 1) // c + 1) for a, n, c in zip(o, shape, inner)]
            touched.update(itertools.product(*ranges))
        total = 0
        for idx in touched:
            if not sharded:
                total += os.path.getsize(os.path.join(path, sep.join(map(str, idx))))
                continue
            key = tuple(i // p for i, p in zip(idx, per))
            if key not in indexes:
                f = os.path.join(path, "c", *map(str, key)) if sep == "/" else os.path.join(path, "c" + sep + sep.join(map(str, key)))
                n = int(np.prod(per))
                with open(f, "rb") as fh:
                    fh.seek(-(16 * n + 4), os.SEEK_END)
                    indexes[key] = np.frombuffer(fh.read(16 * n), dtype="<u8").reshape(*per, 2)
            nbytes = int(indexes[key][tuple(i % p for i, p in zip(idx, per))][1])
            total += 0 if nbytes == 2**64 - 1 else nbytes
        out.append(total)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write-era5", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--needed-bytes", help=argparse.SUPPRESS)
    ap.add_argument("--origins", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--timed-from", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--latencies", default="0,20,80", help="first-byte latencies to run, ms")
    ap.add_argument("--jitter-ms", type=float, default=0.0, help="uniform jitter added to the latency")
    ap.add_argument("--tail-fraction", type=float, default=0.0, help="share of requests that wait --tail-factor times longer")
    ap.add_argument("--tail-factor", type=float, default=10.0)
    ap.add_argument("--conn-mb-s", type=float, default=0.0, help="bandwidth cap per connection, MB/s (0: none)")
    ap.add_argument("--total-mb-s", type=float, default=0.0, help="bandwidth cap of the server, MB/s (0: none)")
    ap.add_argument("--datasets", default="zstd,blosc,v2,era5")
    ap.add_argument("--dataset-size", default="256M")
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--all-latencies", action="store_true", help="run the serial readers at every latency too")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    if args.write_era5:
        return write_era5(args.write_era5, args.steps, args.seed)
    if args.needed_bytes:
        return print(json.dumps(needed_bytes(args.needed_bytes, args.origins, [int(x) for x in args.shape.split(",")],
                                             args.timed_from)))

    py = venv_python()
    zcrop = zcrop_binary()
    cache = os.environ.get("ZCROP_BENCH_DATA", os.path.join(tempfile.gettempdir(), "zcrop-bench-data"))
    os.makedirs(cache, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="zcrop-cloud-")
    bucket = os.path.join(tmp, "root", S3_BUCKET)
    os.makedirs(bucket)
    readers = args.readers.split(",")
    sets = []
    for ds in args.datasets.split(","):
        path = prepare(ds, args.dataset_size, py, zcrop, cache, args.seed)
        os.symlink(path, os.path.join(bucket, f"{ds}.zarr"))
        info = json.loads(subprocess.run([zcrop, "info", "--json", path], check=True, text=True, capture_output=True).stdout)
        shape = [4, 64, 64] if ds == "era5" else [4, 12, 128, 128]
        origins_file = os.path.join(tmp, f"{ds}.npy")
        code = (
            "import numpy as np, json;"
            f"rng=np.random.default_rng({args.seed});"
            f"o=np.stack([rng.integers(0, s-c+1, size=({args.batches + 1},{args.batch_size})) for s,c in zip({info['shape']},{shape})], axis=-1);"
            f"np.save({origins_file!r}, o.astype(np.int64)); print(json.dumps(o.tolist()))"
        )
        origins = json.loads(subprocess.run([py, "-c", code], check=True, text=True, capture_output=True).stdout)
        needed = sum(chunks_needed(b, shape, info["chunks"]) for b in origins[:-1])
        stored = json.loads(subprocess.run([py, os.path.abspath(__file__), "--needed-bytes", path, "--origins", origins_file,
                                            "--shape", ",".join(map(str, shape))], check=True, text=True,
                                           capture_output=True, cwd=HERE).stdout)
        sets.append((ds, info, shape, origins_file, needed, sum(stored)))

    sim = CloudSim(os.path.join(tmp, "root"))
    results = []
    try:
        for latency in [float(x) for x in args.latencies.split(",")]:
            shaping = {"latency_ms": latency, "jitter_ms": args.jitter_ms, "tail_fraction": args.tail_fraction,
                       "tail_factor": args.tail_factor, "conn_bytes_per_s": args.conn_mb_s * 1e6,
                       "total_bytes_per_s": args.total_mb_s * 1e6, "seed": args.seed}
            sim.call("PUT", "shaping", shaping)
            for ds, info, shape, origins_file, needed, stored in sets:
                row = {"latency_ms": latency, "dataset": ds, "shape": shape, "chunks": info["chunks"],
                       "chunks_needed": needed, "needed_bytes": stored, "shaping": shaping, "readers": {}}
                runs = {r: [] for r in readers}
                for rep in range(max(1, args.repeats)):
                    for r in readers[rep % len(readers):] + readers[:rep % len(readers)]:
                        if {"error", "skipped"} & row["readers"].get(r, {}).keys():
                            continue
                        if r in SERIAL_READERS and latency > 0 and not args.all_latencies:
                            row["readers"][r] = {"skipped": "fetches chunks one at a time (see --all-latencies)"}
                            continue
                        res = run_reader(py, sim, r, ds, info, shape, origins_file)
                        if "error" in res:
                            row["readers"][r] = res
                            print(f"{latency:g} ms {ds} {r}: FAILED: {res['error']}", file=sys.stderr)
                            continue
                        runs[r].append(res)
                        print(f"{latency:g} ms {ds} {r} run {rep + 1}: {res['crops_per_s']:.1f} crops/s, "
                              f"{res['server']['gets']} GETs, p50 {res['p50_ms']:.0f} ms", file=sys.stderr)
                summarise(row, runs)
                results.append(row)
    finally:
        sim.stop()
    write_report(results, args)


def run_reader(py: str, sim: CloudSim, reader: str, ds: str, info: dict, shape: list[int], origins_file: str) -> dict:
    """One run of ``reader`` through compare.py's worker; its JSON report, or {"error": ...}."""
    sim.call("POST", "reset")
    cmd = [py, os.path.join(HERE, "compare.py"), "--worker", reader, "--path", f"s3://{S3_BUCKET}/{ds}.zarr",
           "--origins", origins_file, "--shape", ",".join(map(str, shape)),
           "--zarr-format", str(info.get("zarr_format", 3)), "--warmup"]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", ZCROP_BENCH_S3_ENDPOINT=sim.endpoint,
               ZCROP_BENCH_STATS_URL=f"{sim.endpoint}/_cloudsim/stats")
    return run_worker(cmd, env)


def run_worker(cmd: list[str], env: dict) -> dict:
    """Runs compare.py's worker command ``cmd``: its JSON report, or {"error": ...}."""
    try:
        out = subprocess.run(cmd, text=True, capture_output=True, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_report(results: list[dict], args) -> None:
    os.makedirs(args.out, exist_ok=True)
    when = datetime.date.today().isoformat()
    machine = f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}"
    cmd = "python3 benches/cloud_compare.py " + " ".join(sys.argv[1:])
    shaping = [f"jitter {args.jitter_ms:g} ms"]
    if args.tail_fraction:
        shaping.append(f"{args.tail_fraction:g} of requests {args.tail_factor:g}x slower")
    shaping.append(f"per-connection cap {args.conn_mb_s:g} MB/s" if args.conn_mb_s else "no per-connection cap")
    shaping.append(f"total cap {args.total_mb_s:g} MB/s" if args.total_mb_s else "no total cap")
    lines = [
        f"Random crops (4, 12, 128, 128) (era5: (4, 64, 64)), batches of {args.batch_size}, {args.batches} timed "
        f"batches per run, median of {max(1, args.repeats)} runs per reader (order rotated; every run in cloud.json); "
        f"zcrop-cloudsim on loopback: {', '.join(shaping)}; {when}; {machine}; `{cmd.strip()}`.",
        "",
        "| latency | dataset | reader | crops/s | GB/s | GETs | fetched / needed | MB/s fetched | p50 ms | p99 ms | vs best peer | same bytes |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        best = best_peer(row)
        for r, v in row["readers"].items():
            head = f"| {row['latency_ms']:g} ms | {row['dataset']} | {LABEL[r]} |"
            if "error" in v or "skipped" in v:
                text = f"failed: {v['error']}" if "error" in v else f"not run: {v['skipped']}"
                lines.append(f"{head} {text} | | | | | | | | | |")
                continue
            ratio = f"{v['crops_per_s'] / best:.2f}x" if best else "-"
            same = "reference" if r == "zcrop" else ("yes" if v.get("identical_to_zcrop") else "NO")
            s = v["server"]
            lines.append(
                f"{head} {v['crops_per_s']:.1f} | {v['output_bytes'] / v['seconds'] / 1e9:.3f} | {s['gets']} | "
                f"{s['bytes_sent'] / row['needed_bytes']:.2f} | {s['bytes_sent'] / v['seconds'] / 1e6:.0f} | "
                f"{v['p50_ms']:.0f} | {v['p99_ms']:.0f} | {ratio} | {same} |"
            )
    lines += [
        "",
        "GETs and fetched bytes: the timed batches only, counted by the simulator. fetched / needed: body bytes the "
        "server sent per stored byte of the chunks the crops touch (each chunk once per batch; shard indexes not "
        "counted as needed). MB/s fetched: body bytes per second of the timed batches.",
    ]
    md = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "cloud.md"), "w").write(md)
    json.dump(results, open(os.path.join(args.out, "cloud.json"), "w"), indent=1)
    print(md)


if __name__ == "__main__":
    main()
