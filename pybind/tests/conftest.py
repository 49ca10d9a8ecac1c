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
