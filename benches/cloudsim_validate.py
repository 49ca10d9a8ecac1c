#!/usr/bin/env python3
"""Checks zcrop-cloudsim itself: how many requests it serves unshaped, and whether shaped it
delivers the configured first-byte latency and bandwidth (within 10%).

    python3 benches/cloudsim_validate.py                     # prints a markdown table
    python3 benches/cloudsim_validate.py --cloud-json benches/results/cloud.json

Each check runs `zcrop-cloudsim load` (keep-alive connections sending range GETs of one 64 MB
object back to back, timing headers and bodies) against a fresh shaping of one running server.
With --cloud-json, the highest GET rate any reader reached at each latency of that benchmark
run is compared with what the simulator sustains (it should be 10x it). On a small machine the
server, the load generator and the readers share the cores, so the unshaped rate measured is a
floor; the check also takes the server's CPU time per request during that load (from /proc)
and compares the reader's rate with the rate that CPU cost allows on this machine's cores.
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

from cloud_compare import CloudSim, build_cloudsim
from machine import cpu_model

#: (what, shaping, load, measured key, expected value, unit).
CHECKS = [
    ("latency 20 ms", {"latency_ms": 20}, {"range_bytes": 16384, "concurrency": 64}, "first_byte_p50", 20.0, "ms"),
    ("latency 80 ms", {"latency_ms": 80}, {"range_bytes": 16384, "concurrency": 64}, "first_byte_p50", 80.0, "ms"),
    ("latency 20 ms + jitter U(0, 10) ms: median", {"latency_ms": 20, "jitter_ms": 10},
     {"range_bytes": 16384, "concurrency": 64}, "first_byte_p50", 25.0, "ms"),
    ("latency 20 ms, 2% of requests 10x: p99", {"latency_ms": 20, "tail_fraction": 0.02, "tail_factor": 10},
     {"range_bytes": 16384, "concurrency": 64}, "first_byte_p99", 200.0, "ms"),
    ("per-connection cap 50 MB/s, 1 connection", {"conn_bytes_per_s": 50e6},
     {"range_bytes": 4_000_000, "concurrency": 1}, "conn_mb_s", 50.0, "MB/s"),
    ("per-connection cap 10 MB/s, 8 connections: each", {"conn_bytes_per_s": 10e6},
     {"range_bytes": 1_000_000, "concurrency": 8}, "conn_mb_s", 10.0, "MB/s"),
    ("per-connection cap 10 MB/s, 8 connections: total", {"conn_bytes_per_s": 10e6},
     {"range_bytes": 1_000_000, "concurrency": 8}, "total_mb_s", 80.0, "MB/s"),
    ("total cap 200 MB/s, 32 connections", {"total_bytes_per_s": 200e6},
     {"range_bytes": 1_000_000, "concurrency": 32}, "total_mb_s", 200.0, "MB/s"),
    ("total cap 500 MB/s at 80 ms, 256 connections", {"latency_ms": 80, "total_bytes_per_s": 500e6},
     {"range_bytes": 1_000_000, "concurrency": 256}, "total_mb_s", 500.0, "MB/s"),
]


def load(exe: str, addr: str, seconds: float, range_bytes: int, concurrency: int) -> dict:
    out = subprocess.run([exe, "load", "--addr", addr, "--path", "/check/object", "--range-bytes", str(range_bytes),
                          "--concurrency", str(concurrency), "--seconds", str(seconds)],
                         check=True, capture_output=True, text=True)
    r = json.loads(out.stdout)
    return {
        "requests_per_s": r["requests_per_s"],
        "first_byte_p50": r["first_byte_ms"]["p50"],
        "first_byte_p99": r["first_byte_ms"]["p99"],
        "conn_mb_s": r["conn_bytes_per_s_p50"] / 1e6,
        "total_mb_s": r["bytes_per_s"] / 1e6,
    }


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process `pid` has used (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each check")
    ap.add_argument("--cloud-json", help="a cloud_compare.py report: the fastest reader's GET rate to compare with")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    exe = build_cloudsim()
    root = tempfile.mkdtemp(prefix="zcrop-cloudsim-check-")
    os.makedirs(os.path.join(root, "check"))
    with open(os.path.join(root, "check", "object"), "wb") as f:
        f.write(os.urandom(64_000_000))
    sim = CloudSim(root)
    addr = sim.endpoint.removeprefix("http://")
    rows, ok = [], True
    try:
        sim.call("PUT", "shaping", {})
        cpu0 = cpu_seconds(sim.proc.pid)
        free = load(exe, addr, args.seconds, 16384, 64)
        per_get = (cpu_seconds(sim.proc.pid) - cpu0) / (free["requests_per_s"] * args.seconds)
        capacity = (os.cpu_count() or 1) / per_get
        rows.append(("unshaped: 16 KiB GETs, 64 connections (the load generator on the same cores)",
                     f"{free['requests_per_s']:.0f} requests/s", "", ""))
        rows.append((f"server CPU per GET, and the rate it allows on {os.cpu_count()} cores",
                     f"{per_get * 1e6:.1f} us: {capacity:.0f} requests/s", "", ""))
        if args.cloud_json:
            # The fastest reader's GET rate over its timed batches, at each latency.
            fastest: dict[float, tuple[float, str]] = {}
            for row in json.load(open(args.cloud_json)):
                for reader, v in row["readers"].items():
                    if "server" not in v:
                        continue
                    rate = v["server"]["gets"] / v["seconds"]
                    if rate > fastest.get(row["latency_ms"], (0.0, ""))[0]:
                        fastest[row["latency_ms"]] = (rate, f"{reader} on {row['dataset']}")
            for latency, (rate, who) in sorted(fastest.items()):
                good = capacity >= 10 * rate
                ok &= good
                rows.append((f"fastest reader's GET rate at {latency:g} ms ({who}); measured unshaped rate "
                             f"{free['requests_per_s'] / rate:.1f}x it", f"{rate:.0f} GETs/s",
                             f"<= {capacity / 10:.0f} (a tenth of the CPU-bound rate)", "yes" if good else "NO"))
        for what, shaping, spec, key, want, unit in CHECKS:
            sim.call("PUT", "shaping", shaping)
            got = load(exe, addr, args.seconds, **spec)[key]
            good = abs(got - want) <= 0.1 * want
            ok &= good
            rows.append((what, f"{got:.1f} {unit}", f"{want:g} {unit}", "yes" if good else "NO"))
    finally:
        sim.stop()
    when = datetime.date.today().isoformat()
    machine = f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} {platform.release()}"
    lines = [f"zcrop-cloudsim validation, {when}, {machine}, {args.seconds:g} s per check; "
             f"`python3 benches/cloudsim_validate.py {' '.join(sys.argv[1:])}`.", "",
             "| check | measured | configured | within 10% |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        open(args.out, "w").write(md)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
