"""Ctrl-C interrupts a long read for real: a child process starts the read, this test sends it
SIGINT, and the child must raise KeyboardInterrupt promptly and stay usable (or, uncaught, exit
the way Python exits on Ctrl-C)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

# The child installs Python's Ctrl-C handler itself: a process started with SIGINT ignored (any
# command run in the background by a non-interactive shell, e.g. `nohup make test &`) passes
# that on, and Python then leaves SIGINT ignored, so these tests would wait forever.
CHILD_PRELUDE = f"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {TESTS!r})
import numpy as np
import zcrop
from slowstore import make_slow_array
"""


def start(body: str) -> subprocess.Popen:
    code = CHILD_PRELUDE + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(child: subprocess.Popen, word: str, timeout: float = 60) -> str:
    """Reads the child's stdout until a line starting with `word`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        if line.startswith(word):
            return line
    child.kill()
    out, err = child.communicate()
    raise AssertionError(f"child never printed {word!r}; stdout={out!r} stderr={err!r}")


def interrupt(child: subprocess.Popen, after: float) -> float:
    """Sends SIGINT `after` seconds from now; returns how long the child then took to print
    its 'interrupted' line."""
    time.sleep(after)
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    wait_for(child, "interrupted")
    return time.monotonic() - sent


def test_ctrl_c_interrupts_a_long_read(tmp_path):
    child = start(
        f"""
        a = zcrop.open_array(make_slow_array({str(tmp_path / "slow.zarr")!r}, side=2048, chunk=4))
        print("reading", flush=True)
        t = time.monotonic()
        try:
            a[...]
            print("finished", time.monotonic() - t, flush=True)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic() - t, flush=True)
        # The array and the process stay usable.
        print("after", int(a[:64, :64].sum()), flush=True)
        """
    )
    wait_for(child, "reading")
    latency = interrupt(child, after=0.3)
    after = wait_for(child, "after")
    assert after.split()[1] == str(7 * 64 * 64)
    assert child.wait(timeout=60) == 0, child.stderr.read()
    assert latency < 1.5, latency


def test_ctrl_c_interrupts_a_read_stuck_in_io():
    """A chunk whose GET never gets an answer (a server that black-holes it): the read never
    completes by itself. (A FIFO as a chunk file, once the way to stall a read, is refused at
    once now.)"""
    child = start(
        """
        import http.server, json, threading
        meta = json.dumps({
            "zarr_format": 3, "node_type": "array", "shape": [2048, 2048], "data_type": "uint8",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [512, 512]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {},
        }).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.endswith("/c/1/1"):
                    threading.Event().wait()  # never answers
                if self.path.endswith("/zarr.json"):
                    body = meta
                elif "/c/0/" in self.path:
                    body = bytes([5]) * 512 * 512
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        options = {
            "endpoint_url": f"http://127.0.0.1:{server.server_address[1]}",
            "region": "us-east-1", "access_key_id": "x", "secret_access_key": "y",
        }
        a = zcrop.open_array("s3://bucket/a.zarr", storage_options=options)
        print("reading", flush=True)
        try:
            a[...]
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        print("after", int(a[0, :512].sum()), flush=True)
        os._exit(0)  # the server's thread still holds the stalled request
        """
    )
    wait_for(child, "reading")
    latency = interrupt(child, after=0.5)
    assert wait_for(child, "after").split()[1] == str(5 * 512)
    child.stdout.close()
    assert child.wait(timeout=60) == 0, child.stderr.read()
    assert latency < 1.5, latency


def test_ctrl_c_interrupts_a_read_into_out(tmp_path):
    """With out=, the read stops at its next chunk before KeyboardInterrupt is raised."""
    child = start(
        f"""
        a = zcrop.open_array(make_slow_array({str(tmp_path / "slow.zarr")!r}, side=2048, chunk=4))
        out = np.empty(a.shape, dtype=a.dtype)
        print("reading", flush=True)
        try:
            for _ in range(1000):
                a.get_basic_selection(Ellipsis, out=out)
            print("finished", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    wait_for(child, "reading")
    latency = interrupt(child, after=1.5)
    assert child.wait(timeout=60) == 0, child.stderr.read()
    assert latency < 3.0, latency


def test_uncaught_ctrl_c_exits_like_python(tmp_path):
    child = start(
        f"""
        a = zcrop.open_array(make_slow_array({str(tmp_path / "slow.zarr")!r}, side=2048, chunk=4))
        print("reading", flush=True)
        a[...]
        print("finished", flush=True)
        """
    )
    wait_for(child, "reading")
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGINT, (child.returncode, out, err)
    assert "KeyboardInterrupt" in err
    assert "finished" not in out
    assert "panicked" not in err and "Fatal" not in err
