#!/usr/bin/env python3
"""io-core against fio, on the same file, block size and queue depth, in one run.

For each block size (4 KiB, 64 KiB) and page-cache state, runs fio's io_uring and psync engines
(and, on warm runs, its mmap engine) and `zcrop bench io` with the io_uring and the portable
backend, interleaved and repeated; prints a markdown table of medians and the ratios the targets
of issue 3 are about.

zcrop runs with its defaults, as zarr-front reads chunks: ranges whose pages are in the page
cache are served from a mapping of the file, without a copy (`--mmap=cached`). So that the
table also shows the copying reads, warm runs add zcrop's io_uring backend with `--mmap=never`,
and fio's mmap engine (which copies out of a mapping) is the reference for mapped reads.

    python3 benches/io_vs_fio.py                 # warm, cold and O_DIRECT, 3 repeats
    python3 benches/io_vs_fio.py --modes warm --repeat 5

Needs root to drop the page cache for cold runs (it says so otherwise). Installs fio with apt
when it is missing. Builds zcrop in release mode first (`cargo build --release`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from pagecache import drop_caches, prewarm, zcrop_binary


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def ensure_fio() -> str:
    fio = shutil.which("fio")
    if fio:
        return fio
    prefix = [] if os.geteuid() == 0 else ["sudo"]
    subprocess.run(prefix + ["apt-get", "install", "-y", "-qq", "fio"], check=True)
    return shutil.which("fio") or sys.exit("fio could not be installed")


def pinned(one_core: bool) -> list[str]:
    """`taskset -c 0` for runs that must use one core (the process and all its threads)."""
    return ["taskset", "-c", "0"] if one_core else []


def run_fio(fio: str, path: str, engine: str, bs: int, qd: int, jobs: int, direct: bool, runtime: float, one_core: bool,
            distinct: tuple[int, int] | None = None) -> dict:
    """fio random reads. With `distinct=(reads, file_bytes)`, fio reads exactly `reads` distinct
    blocks (each job its own slice of the file, fio's random map on), as `zcrop bench io` does:
    on a cold buffered run, a block read twice would come from the page cache the second time."""
    cmd = pinned(one_core) + [
        fio, "--name=zcrop-cmp", f"--filename={path}", "--rw=randread", f"--bs={bs}",
        f"--ioengine={engine}", f"--numjobs={jobs}", "--group_reporting",
        "--output-format=json", f"--direct={int(direct)}", "--invalidate=0", "--randrepeat=0",
    ]
    if distinct is None:
        cmd += ["--time_based", f"--runtime={runtime}", "--norandommap"]
    else:
        reads, file_bytes = distinct
        region = file_bytes // jobs // bs * bs
        per_job = max(1, reads // jobs) * bs
        cmd += [f"--size={region}", f"--offset_increment={region}", f"--io_size={per_job}"]
    if engine == "io_uring":
        cmd.append(f"--iodepth={qd}")
    out = json.loads(sh(cmd).stdout)
    job = out["jobs"][0]
    iops = job["read"]["iops"]
    cpu = (job["usr_cpu"] + job["sys_cpu"]) / 100.0  # cores, summed over jobs
    return {"reads_per_s": iops, "cpu_cores": cpu}


def run_zcrop(zcrop: str, path: str, backend: str, bs: int, qd: int, reads: int, direct: bool, threads: int, one_core: bool,
              mmap: str = "cached") -> dict:
    cmd = pinned(one_core) + [zcrop, "bench", "io", path, "--json", "--no-progress", "--no-prewarm", "--backend", backend,
           "--block-size", str(bs), "--queue-depth", str(qd), "--reads", str(reads), f"--mmap={mmap}"]
    if direct:
        cmd.append("--direct")
    if threads:
        cmd += ["--io-threads", str(threads)]
    r = json.loads(sh(cmd).stdout)
    return {"reads_per_s": r["reads_per_s"], "cpu_cores": r["cpu_cores_used"] or float("nan"),
            "mapped_share": r["mapped_reads"] / max(1, r["reads"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file-size", default="4G")
    ap.add_argument("--queue-depth", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default="warm,cold,direct,warm2", help="warm, cold, direct, warm2 (two cores)")
    ap.add_argument("--block-sizes", default="4096,65536")
    ap.add_argument("--seconds", type=float, default=4.0, help="target length of each measurement")
    ap.add_argument("--data-dir", default=os.environ.get("ZCROP_BENCH_DATA", os.path.join(tempfile.gettempdir(), "zcrop-bench-data")))
    ap.add_argument("--json-out", help="also write all measurements here")
    args = ap.parse_args()

    fio = ensure_fio()
    zcrop = zcrop_binary()
    made = json.loads(sh([zcrop, "bench", "io", "--json", "--no-progress", "--no-prewarm", "--reads", "1",
                          "--file-size", args.file_size, "--data-dir", args.data_dir]).stdout)
    path = made["path"]
    can_drop = drop_caches()
    cpus = os.cpu_count() or 1
    print(f"file {path} ({made['file_bytes'] / 2**30:.1f} GiB), queue depth {args.queue_depth}, "
          f"{cpus} CPUs, fio {sh([fio, '--version']).stdout.strip()}, page cache drop: {'yes' if can_drop else 'NO (not root)'}",
          file=sys.stderr)

    rows = []
    for bs in [int(b) for b in args.block_sizes.split(",")]:
        for mode in args.modes.split(","):
            if mode in ("cold", "direct") and mode == "cold" and not can_drop:
                print("skipping cold runs: cannot drop the page cache", file=sys.stderr)
                continue
            direct = mode == "direct"
            jobs = 2 if mode == "warm2" else 1
            # Expected rates set the number of reads so each run lasts about --seconds.
            expect = {"warm": 500_000, "warm2": 1_000_000, "cold": 60_000, "direct": 60_000}[mode]
            if bs >= 65536:
                expect = min(expect, 500_000 if mode.startswith("warm") else 17_000)
            blocks = made["file_bytes"] // bs
            # Cold runs read each block at most once; warm runs may read blocks again.
            reads = int(expect * args.seconds)
            if mode in ("cold", "direct"):
                reads = min(blocks, reads)
            names = ["fio_io_uring", "fio_psync", "zcrop_uring", "zcrop_portable"]
            if mode.startswith("warm"):
                names += ["fio_mmap", "zcrop_uring_copy"]
            runs: dict[str, list[dict]] = {k: [] for k in names}
            for _ in range(args.repeat):
                for name in runs:
                    if mode.startswith("warm"):
                        prewarm(path)
                    else:
                        drop_caches()
                    one = mode == "warm"  # the one-core comparison: everything on CPU 0
                    # Cold buffered runs read distinct blocks only, in fio as in zcrop.
                    distinct = (reads, made["file_bytes"]) if mode == "cold" else None
                    if name == "fio_io_uring":
                        r = run_fio(fio, path, "io_uring", bs, args.queue_depth, jobs, direct, args.seconds, one, distinct)
                    elif name == "fio_psync":
                        pjobs = jobs if mode.startswith("warm") else args.queue_depth
                        r = run_fio(fio, path, "psync", bs, 1, pjobs, direct, args.seconds, one, distinct)
                    elif name == "fio_mmap":
                        r = run_fio(fio, path, "mmap", bs, 1, jobs, direct, args.seconds, one, distinct)
                    elif name in ("zcrop_uring", "zcrop_uring_copy"):
                        # warm2: the engine's default rings (one per core but one), since the consumer
                        # reads cached data itself: two busy threads on two cores, as fio's two jobs.
                        r = run_zcrop(zcrop, path, "uring", bs, args.queue_depth, reads, direct, 0 if one or mode == "warm2" else 1, one,
                                      "never" if name == "zcrop_uring_copy" else "cached")
                    else:
                        pthreads = jobs if mode.startswith("warm") else args.queue_depth
                        r = run_zcrop(zcrop, path, "portable", bs, args.queue_depth, reads, direct, pthreads, one)
                    runs[name].append(r)
            med = {k: statistics.median(x["reads_per_s"] for x in v) for k, v in runs.items()}
            cpu = {k: statistics.median(x["cpu_cores"] for x in v) for k, v in runs.items()}
            rows.append({"block_size": bs, "mode": mode, "reads_per_s": med, "cpu_cores": cpu, "runs": runs})

    print()
    print("| block | mode | fio io_uring | fio psync | fio mmap | zcrop uring | zcrop uring, copying | zcrop portable "
          "| uring / fio io_uring | uring / best of fio io_uring, psync | uring / fio mmap | copying / best of fio io_uring, psync "
          "| mapped share | uring CPU (cores) | CPU per read, uring / copying / portable (µs) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    nan = float("nan")
    for r in rows:
        m, c = r["reads_per_s"], r["cpu_cores"]
        best = max(m["fio_io_uring"], m["fio_psync"])
        per_read = {k: c[k] / m[k] * 1e6 if k in m else nan for k in ("zcrop_uring", "zcrop_uring_copy", "zcrop_portable")}
        mapped = statistics.median(x["mapped_share"] for x in r["runs"]["zcrop_uring"])

        def cell(k: str) -> str:
            return f"{m[k]:,.0f}" if k in m else "-"

        def ratio(a: str, b: float | None) -> str:
            return f"{m[a] / b:.2f}" if a in m and b else "-"

        cells = [f"{r['block_size'] // 1024} KiB", r["mode"]]
        cells += [cell(k) for k in ("fio_io_uring", "fio_psync", "fio_mmap", "zcrop_uring", "zcrop_uring_copy", "zcrop_portable")]
        cells += [ratio("zcrop_uring", m["fio_io_uring"]), ratio("zcrop_uring", best), ratio("zcrop_uring", m.get("fio_mmap")),
                  ratio("zcrop_uring_copy", best), f"{mapped:.2f}", f"{c['zcrop_uring']:.2f}",
                  " / ".join(f"{per_read[k]:.2f}" for k in ("zcrop_uring", "zcrop_uring_copy", "zcrop_portable"))]
        print("| " + " | ".join(cells) + " |")
    print()
    print("zcrop uring and portable: defaults (cached ranges served from a mapping, no copy; 'mapped share' is the share "
          "of zcrop uring's reads so served); copying = zcrop uring with --mmap=never. fio mmap copies out of a mapping.")
    print("Modes: warm = file in the page cache, every process pinned to one core (taskset -c 0; fio: "
          "1 job; zcrop: 1 ring or 1 pread thread, plus the consumer, on that core); warm2 = both cores "
          "(fio: 2 jobs, zcrop: its default of 1 ring plus the consumer, which reads cached data itself / 2 pread threads); cold = page cache dropped before each run, "
          "buffered reads of distinct blocks only, the same number in fio and zcrop (fio psync: queue-depth "
          "jobs, each on its own slice of the file; zcrop: 1 ring, or queue-depth pread threads); "
          "direct = O_DIRECT, same jobs as cold. Medians of "
          f"{args.repeat} interleaved runs; reads/s.")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
