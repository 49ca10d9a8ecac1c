"""Page-cache and build helpers shared by the benchmark scripts in this folder."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def zcrop_binary() -> str:
    """Builds the `zcrop` CLI in release mode and returns the binary's path."""
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "zcrop"], cwd=ROOT, check=True)
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "release", "zcrop")


def drop_caches() -> bool:
    """Drops the page cache (`sync; echo 1 > /proc/sys/vm/drop_caches`); False when not permitted."""
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1")
        return True
    except OSError:
        return False


def prewarm(path: str) -> int:
    """Reads the file at `path`, or every file under it, once (into the page cache); returns the bytes read."""
    if os.path.isfile(path):
        files = [path]
    else:
        files = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
    total = 0
    for name in files:
        with open(name, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                total += len(chunk)
    return total
