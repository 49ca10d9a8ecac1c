"""Shared helpers for zcrop's Python tests."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"


def cargo_version() -> str:
    """The workspace version from the root Cargo.toml."""
    in_ws = False
    for line in (REPO / "Cargo.toml").read_text().splitlines():
        if line.strip() == "[workspace.package]":
            in_ws = True
        elif line.startswith("["):
            in_ws = False
        elif in_ws and line.startswith("version"):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError("no [workspace.package] version in Cargo.toml")


def rust_binary() -> pathlib.Path | None:
    """The Rust `zcrop` binary built by `cargo test`, if there is one."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    exe = target / "debug" / "zcrop"
    return exe if exe.exists() else None


@pytest.fixture(scope="session")
def manifest() -> list[dict]:
    """The fixtures' manifest (one entry per array)."""
    return json.loads((FIXTURES / "manifest.json").read_text())


def manifest_entries() -> list[dict]:
    """The fixtures' manifest entries, for parametrising tests at collection time."""
    return json.loads((FIXTURES / "manifest.json").read_text())


def array_path(entry: dict) -> str:
    """The directory of a manifest entry's array."""
    store = FIXTURES / entry["store"]
    return str(store / entry["array_path"]) if entry["array_path"] else str(store)


def assert_same(expected, got) -> None:
    """zcrop's result is what zarr-python returned: same type, dtype, shape and bytes
    (bitwise, so NaN payloads and signed zeros count)."""
    import numpy as np

    assert type(got) is type(expected), (type(got), type(expected))
    e, g = np.asarray(expected), np.asarray(got)
    assert g.dtype == e.dtype, (g.dtype, e.dtype)
    assert g.shape == e.shape, (g.shape, e.shape)
    if e.dtype.kind in "OT":
        # Variable-length strings and bytes: the bytes would be pointers.
        assert g.tolist() == e.tolist()
        return
    assert g.tobytes() == e.tobytes()


class FileServer:
    """The files under ``root`` over plain HTTP on loopback (range GETs included), served by a
    thread of this process, counting the GETs of each path. A context manager; ``url`` is
    the root's URL, ``gets()`` the counts so far."""

    def __init__(self, root: pathlib.Path) -> None:
        import http.server
        import re
        import threading

        counts: dict[str, int] = {}
        lock = threading.Lock()

        class Files(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with lock:
                    counts[self.path] = counts.get(self.path, 0) + 1
                path = (root / self.path.lstrip("/")).resolve()
                if not path.is_file():
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = path.read_bytes()
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if m:
                    start = int(m[1])
                    end = min(len(data), int(m[2]) + 1) if m[2] else len(data)
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
                    data = data[start:end]
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._counts, self._lock = counts, lock
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def gets(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class S3Server:
    """A moto server on loopback (see the ``s3`` fixture) and the options that reach it."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        #: zcrop ``storage_options`` with the test credentials.
        self.options = {
            "endpoint_url": self.endpoint,
            "region": "us-east-1",
            "access_key_id": "testing",
            "secret_access_key": "testing",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def upload_tree(
        self, bucket: str, directory: pathlib.Path, prefix: str, public: bool = False
    ) -> int:
        """Uploads every file under ``directory`` as ``prefix/<relative path>`` (readable by
        anyone with ``public``); returns the number of objects."""
        client = self.client()
        acl = {"ACL": "public-read"} if public else {}
        try:
            client.create_bucket(Bucket=bucket, **acl)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        n = 0
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                key = f"{prefix}/{path.relative_to(directory).as_posix()}"
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), **acl)
                n += 1
        return n


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto's, from the test requirements) on a free loopback
    port, for the session. Skipped where moto is not installed, unless ZCROP_REQUIRE_S3=1
    (``make test`` sets it): then its absence fails."""
    import shutil
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which(
        "moto_server"
    )
    if exe is None:
        message = 'S3 tests need moto\'s server: pip install "moto[server]"'
        if os.environ.get("ZCROP_REQUIRE_S3") == "1":
            pytest.fail(message)
        pytest.skip(message)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [exe, "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start on port {port}")
                time.sleep(0.1)
        yield S3Server(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
