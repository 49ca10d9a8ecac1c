#!/usr/bin/env python3
"""zcrop's loader in torch DataLoader workers: throughput per start method, and what a forked
worker costs in memory.

    python3 benches/loader_fork.py                        # the defaults
    python3 benches/loader_fork.py --workers 0,2,4,8 --methods fork --timed 200 --repeats 5
    python3 benches/loader_fork.py --skip-throughput --parent-gb 8
    python3 benches/loader_fork.py --array "$(zcrop bench --prepare-only --codec blosc-lz4)" \
        --crop 4,12,128,128 --batch-size 8 --methods fork --skip-memory   # 12.6 MB batches

Needs torch and zarr-python next to zcrop (the test virtualenv has both). The dataset, one uint16
array of --shape in chunks of --chunks (zarr-python 3's default codecs), is written into a
temporary directory (or --data, kept and reused); --array reads an existing array instead.

(i) Throughput: batches/s of the in-process ``zcrop.Loader`` against
``DataLoader(ZcropDataset(...), batch_size=None, num_workers=N)`` for each N of --workers and each
start method of --methods (N=0 runs in the main process: one row). Every configuration runs in a
process of its own that has used zcrop first (opened and read the array, as a training script
does before it makes its DataLoader); each of --repeats runs starts new workers and times
--timed batches once every worker has delivered its first batch (worker start-up excluded; the
"first batch" column is the time to the first); the median run counts. The ratio column is to
the in-process Loader's median.

(ii) Memory: a process holding --parent-gb GB of resident numpy arrays, after using zcrop, starts
2 workers with each start method and iterates 20 batches; each worker's VmRSS (which counts pages
shared with the parent) and private memory (Private_Clean + Private_Dirty of
/proc/PID/smaps_rollup: what it copied or allocated itself).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from machine import cpu_model  # benches/machine.py: this script's folder is on sys.path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# --------------------------------------------------------------------------- helpers
def machine() -> str:
    cpu = cpu_model()
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{cpu}; {os.cpu_count()} cores ({avail} usable by this process); "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}")


def proc_memory(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and private memory (Private_Clean + Private_Dirty) of a process, in MB."""
    out = {"rss_mb": float("nan"), "private_mb": float("nan")}
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                out["rss_mb"] = int(line.split()[1]) / 1024
        private = 0
        try:
            text = open(f"/proc/{pid}/smaps_rollup").read()
        except FileNotFoundError:
            text = open(f"/proc/{pid}/smaps").read()
        for line in text.splitlines():
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                private += int(line.split()[1])
        out["private_mb"] = private / 1024
    except OSError:
        pass
    return out


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def make_dataset(path: str, shape: list[int], chunks: list[int]) -> None:
    import numpy as np
    import zarr

    arr = zarr.create_array(path, shape=shape, chunks=chunks, dtype="uint16", zarr_format=3,
                            overwrite=True)
    rng = np.random.default_rng(7)
    grid = np.add.outer(np.arange(shape[-2]), np.arange(shape[-1])).astype(np.float64)
    for i in range(shape[0]):
        # Smooth waves plus noise: compresses like real data, somewhat.
        base = 20000 + 10000 * np.sin(grid / (17.0 + i))
        block = base + rng.normal(0, 300, size=tuple(shape[1:]))
        arr[i] = np.clip(block, 0, 65535).astype(np.uint16)


# --------------------------------------------------------------------------- child side
def dataset(args):
    import zcrop
    import zcrop.torch

    return zcrop.torch.ZcropDataset(
        zcrop.Source(args.array, ints(args.crop), name="x"),
        batch_size=args.batch_size, seed=args.seed, steps=None,
    )


def use_zcrop(args) -> None:
    import zcrop

    a = zcrop.open_array(args.array)
    a[0, :, :64, :64]


def child_loader(args) -> dict:
    """The in-process zcrop.Loader: --repeats runs of --timed batches after one batch."""
    import zcrop

    use_zcrop(args)

    def start():
        ld = zcrop.Loader(zcrop.Source(args.array, ints(args.crop), name="x"),
                          batch_size=args.batch_size, seed=args.seed)
        return ld, ld.close

    return time_stream(start, args)


def time_stream(start, args, warm: int = 1) -> dict:
    """Batches/s of the iterator ``start()`` returns (with its closer) after its first ``warm``
    batches, over ``--repeats`` fresh iterators; and how long each took to its first batch."""
    runs, first = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        it, close = start()
        next(it)
        first.append(time.perf_counter() - t0)
        for _ in range(warm - 1):
            next(it)
        t = time.perf_counter()
        for _ in range(args.timed):
            next(it)
        runs.append(args.timed / (time.perf_counter() - t))
        close()
    return {"runs": runs, "first": first}


def child_dataloader(args) -> dict:
    """DataLoader(ZcropDataset) with --n workers started by --method."""
    import multiprocessing
    import warnings

    import torch.utils.data

    warnings.filterwarnings("ignore", message=".*os.fork.*")
    use_zcrop(args)
    kw = {}
    if args.n > 0:
        ctx = multiprocessing.get_context(args.method)
        if args.method == "forkserver":
            ctx.set_forkserver_preload(["torch", "zcrop.torch"])
        kw = {"num_workers": args.n, "multiprocessing_context": ctx, "timeout": 120}

    def start():
        it = iter(torch.utils.data.DataLoader(dataset(args), batch_size=None, **kw))
        return it, lambda: None  # its workers stop when the next repeat drops it

    # The DataLoader asks its workers in turn: once batch n - 1 is in, every worker has started
    # (spawned workers import torch one after another, for seconds).
    return time_stream(start, args, warm=max(1, args.n))


def child_memory(args) -> dict:
    """A parent with --parent-gb GB of resident arrays; 2 workers by --method; their memory."""
    import multiprocessing
    import warnings

    import numpy as np
    import torch.utils.data

    warnings.filterwarnings("ignore", message=".*os.fork.*")
    n = int(args.parent_gb * (1 << 30)) // 8
    held = [np.ones(n // 4, dtype=np.float64) for _ in range(4)]  # resident: every page written
    use_zcrop(args)
    ctx = multiprocessing.get_context(args.method)
    if args.method == "forkserver":
        ctx.set_forkserver_preload(["torch", "zcrop.torch"])
    it = iter(torch.utils.data.DataLoader(dataset(args), batch_size=None, num_workers=2,
                                          multiprocessing_context=ctx, timeout=120))
    for _ in range(20):
        next(it)
    workers = [{"pid": w.pid, **proc_memory(w.pid)} for w in it._workers]
    parent = proc_memory()
    del it
    return {"parent": parent, "workers": workers, "held_gb": sum(h.nbytes for h in held) / 2**30}


def run_child(args, mode: str, **extra) -> dict:
    """Runs one measurement in a fresh process; {"error": ...} when it failed."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--array", args.array,
           "--crop", args.crop, "--batch-size", str(args.batch_size), "--seed", str(args.seed),
           "--timed", str(args.timed), "--repeats", str(args.repeats),
           "--parent-gb", str(args.parent_gb)]
    for k, v in extra.items():
        cmd += [f"--{k}", str(v)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {args.child_timeout} s"}
    if p.returncode != 0:
        lines = [x for x in p.stderr.strip().splitlines() if x.strip()]
        last = next((x for x in reversed(lines) if "Error" in x), lines[-1] if lines else "?")
        return {"error": last.strip()[:160]}
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--array", help="read this existing array instead of writing one (such as "
                    "`zcrop bench --prepare-only` writes); --shape and --chunks are then ignored")
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--method", default="fork", help=argparse.SUPPRESS)
    ap.add_argument("--data", help="where the dataset goes (kept and reused; default: a temporary "
                    "directory, removed at the end)")
    ap.add_argument("--shape", default="32,4,256,256", help="the array's shape (uint16)")
    ap.add_argument("--chunks", default="1,1,64,64", help="the array's chunks")
    ap.add_argument("--crop", default="2,4,64,64", help="crop shape")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", default="0,2,4", help="DataLoader num_workers values")
    ap.add_argument("--methods", default="fork,forkserver,spawn", help="worker start methods")
    ap.add_argument("--timed", type=int, default=40, help="timed batches per run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per configuration (median)")
    ap.add_argument("--parent-gb", type=float, default=2.0,
                    help="GB of numpy arrays the parent holds in the memory test")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--child-timeout", type=float, default=600, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        fn = {"loader": child_loader, "dataloader": child_dataloader, "memory": child_memory}
        print(json.dumps(fn[args.child](args)))
        return

    print(f"machine: {machine()}")
    print("command: " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]))
    import zcrop

    print(f"zcrop {zcrop.__version__} from {os.path.dirname(zcrop.__file__)}")
    tmp = None
    try:
        if args.array:
            # The user's array is only read, never written (a v2 array has no zarr.json).
            a = zcrop.open_array(args.array)
            described = f"{args.array}: {a.dtype} {a.shape}, chunks {a.chunks}"
        else:
            root = args.data or (tmp := tempfile.mkdtemp(prefix="zcrop-loader-fork-"))
            args.array = os.path.join(root, "bench.zarr")
            described = f"uint16 {tuple(ints(args.shape))}, chunks {tuple(ints(args.chunks))}"
            if not os.path.exists(os.path.join(args.array, "zarr.json")):
                t = time.perf_counter()
                make_dataset(args.array, ints(args.shape), ints(args.chunks))
                print(f"dataset: wrote {args.array} in {time.perf_counter() - t:.1f} s")
        print(f"dataset: {described}; batches of {args.batch_size} crops "
              f"{tuple(ints(args.crop))}")
        print()
        if not args.skip_throughput:
            throughput(args)
        if not args.skip_memory:
            memory(args)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def throughput(args) -> None:
    methods = [m for m in args.methods.split(",") if m]
    rows = [("zcrop.Loader (in-process)", "-", "-", run_child(args, "loader"))]
    for n in ints(args.workers):
        for method in methods if n > 0 else ["-"]:
            extra = {"n": n, "method": method if n > 0 else "fork"}
            rows.append(("DataLoader(ZcropDataset)", method, n,
                         run_child(args, "dataloader", **extra)))
            print(f"  measured: {rows[-1][0]} {method} workers={n}", file=sys.stderr)
    base = statistics.median(rows[0][3]["runs"]) if "runs" in rows[0][3] else None
    print(f"(i) throughput: {args.timed} timed batches per run once every worker has delivered "
          f"a batch, median of {args.repeats} runs (new workers each run); ratio to the "
          "in-process Loader")
    print()
    print("| reader | start method | workers | batches/s | range | vs Loader | first batch s |")
    print("|---|---|---|---|---|---|---|")
    for name, method, n, r in rows:
        if "error" in r:
            print(f"| {name} | {method} | {n} | failed: {r['error']} | | | |")
            continue
        med = statistics.median(r["runs"])
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"| {name} | {method} | {n} | {med:.1f} | {min(r['runs']):.1f}-{max(r['runs']):.1f} "
              f"| {ratio} | {statistics.median(r['first']):.2f} |")
    print()


def memory(args) -> None:
    print(f"(ii) memory: parent holds {args.parent_gb:g} GB of resident numpy arrays and has used "
          "zcrop; 2 workers, measured after 20 batches (MB)")
    print()
    print("A forked worker's VmRSS counts the parent's pages it maps (shared, copy-on-write); "
          "its private memory is what it copied or allocated. The parent's private memory drops "
          "by what forked workers share with it.")
    print()
    print("| start method | process | VmRSS | private (Private_Clean + Private_Dirty) |")
    print("|---|---|---|---|")
    for method in [m for m in args.methods.split(",") if m]:
        r = run_child(args, "memory", method=method)
        if "error" in r:
            print(f"| {method} | - | failed: {r['error']} | |")
            continue
        p = r["parent"]
        print(f"| {method} | parent | {p['rss_mb']:.0f} | {p['private_mb']:.0f} |")
        for i, w in enumerate(r["workers"]):
            print(f"| {method} | worker {i} (pid {w['pid']}) | {w['rss_mb']:.0f} | "
                  f"{w['private_mb']:.0f} |")
    print()


if __name__ == "__main__":
    main()
