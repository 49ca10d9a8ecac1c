"""zcrop's SIGBUS guard (which keeps a file truncated under a mapping from killing the
process) among the handlers Python programs install: Python's faulthandler, enabled before or
after zcrop starts mapping files, and torch. zcrop's reads stay right, and a bus error that is
not zcrop's still reaches faulthandler (a traceback) and ends the process as it would without
zcrop.

Each case runs in a child process (ZCROP_IO_MMAP=always, so every read is served from a
mapping while the guard is in place)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import zarr

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux signals")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("sigbus") / "a.zarr")
    z = zarr.create_array(p, shape=(64, 64), chunks=(8, 8), shards=(32, 32), dtype="u2")
    z[:] = np.arange(64 * 64, dtype="u2").reshape(64, 64)
    return p


def child(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ZCROP_IO_MMAP="always", PYTHONFAULTHANDLER="")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env)


READ = """
import numpy as np, zcrop
def read(p):
    got = zcrop.open(p)[:]
    assert (got == np.arange(64 * 64).reshape(64, 64)).all()
"""

# A bus error outside zcrop: a file mapped with Python's mmap, truncated, then touched.
FOREIGN_SIGBUS = """
import mmap, tempfile
f = tempfile.TemporaryFile()
f.write(b"x" * 65536); f.flush()
m = mmap.mmap(f.fileno(), 65536, access=mmap.ACCESS_READ)
f.truncate(0)
print("touching", flush=True)
m[40000]
print("survived", flush=True)
"""

CASES = {
    "faulthandler-first": "import faulthandler; faulthandler.enable()\n" + READ + "read(P)\n",
    "faulthandler-after": READ + "read(P)\nimport faulthandler; faulthandler.enable()\nread(P)\n",
    "torch-first": "import torch, faulthandler; faulthandler.enable()\n" + READ + "read(P)\n",
    "torch-after": READ + "read(P)\nimport torch, faulthandler; faulthandler.enable()\nread(P)\n",
}


@pytest.mark.parametrize("case", list(CASES))
def test_zcrop_reads_and_foreign_bus_errors_still_reach_faulthandler(store, case):
    code = CASES[case].replace("P)", f"{store!r})")
    r = child(code + "print('read ok', flush=True)\n" + FOREIGN_SIGBUS)
    assert "read ok" in r.stdout, r.stdout + r.stderr
    assert "touching" in r.stdout and "survived" not in r.stdout, r.stdout
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr[-2000:])
    assert "Fatal Python error: Bus error" in r.stderr, r.stderr[-2000:]


def test_without_faulthandler_a_foreign_bus_error_still_ends_the_process(store):
    r = child(READ + f"read({store!r})\n" + FOREIGN_SIGBUS)
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr[-2000:])
    assert "survived" not in r.stdout
