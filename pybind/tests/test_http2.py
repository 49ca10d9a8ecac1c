"""HTTP/2 on request: an ``https://`` store served by hypercorn (HTTP/2 or HTTP/1.1 over TLS by
ALPN, a certificate from trustme) on loopback. By default zcrop asks for HTTP/1.1 (as
object_store does: one HTTP/2 connection capped GCS downloads near 250 MB/s in its
measurements) and reuses its connections; ``storage_options={"http2": True}`` negotiates
HTTP/2 and multiplexes the ranged GETs over a few connections. Values as zarr-python reads
them from the same files.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import pathlib
import re
import socket
import threading

import numpy as np
import pytest

import zcrop

zarr = pytest.importorskip("zarr")
trustme = pytest.importorskip("trustme")
hypercorn_asyncio = pytest.importorskip("hypercorn.asyncio")
hypercorn_config = pytest.importorskip("hypercorn.config")


class FileServer:
    """An ASGI app serving the files under ``root`` with ranges (``bytes=a-b``, ``bytes=a-``,
    ``bytes=-n``), ``Last-Modified`` and ``ETag``, as object stores do; it records each
    request's HTTP version and client address."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.requests: list[tuple[str, tuple[str, int]]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        self.requests.append((scope["http_version"], tuple(scope["client"])))
        path = (self.root / scope["path"].lstrip("/")).resolve()
        if not path.is_file() or self.root.resolve() not in path.parents:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        data = path.read_bytes()
        st = path.stat()
        headers = [
            (b"last-modified", email.utils.formatdate(st.st_mtime, usegmt=True).encode()),
            (b"etag", f'"{st.st_mtime_ns:x}-{st.st_size:x}"'.encode()),
            (b"accept-ranges", b"bytes"),
        ]
        status, body = 200, data
        rng = dict(scope["headers"]).get(b"range", b"").decode()
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
        if m and (m[1] or m[2]):
            if m[1]:
                start = int(m[1])
                end = min(len(data), int(m[2]) + 1) if m[2] else len(data)
            else:
                start, end = max(0, len(data) - int(m[2])), len(data)
            status, body = 206, data[start:end]
            headers.append((b"content-range", f"bytes {start}-{end - 1}/{len(data)}".encode()))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body",
                    "body": b"" if scope["method"] == "HEAD" else body})


@pytest.fixture(scope="module")
def https(tmp_path_factory):
    """``(base URL, FileServer, local root)``: HTTP/2 over TLS on loopback."""
    root = tmp_path_factory.mktemp("h2")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certs = tmp_path_factory.mktemp("certs")
    cert_file, key_file = certs / "cert.pem", certs / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = hypercorn_config.Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = str(cert_file), str(key_file)
    config.alpn_protocols = ["h2", "http/1.1"]
    config.accesslog = config.errorlog = None
    app = FileServer(root)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()

    async def main():
        task = asyncio.ensure_future(hypercorn_asyncio.serve(app, config, shutdown_trigger=stop.wait))
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        started.set()
        await task

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(30), "hypercorn did not start"
    yield f"https://127.0.0.1:{port}", app, root
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


@pytest.mark.parametrize("http2", [False, True])
def test_https_stores_over_http1_or_http2(https, http2):
    base, app, root = https
    rng = np.random.default_rng(5)
    data = rng.integers(0, 60000, (6, 40, 48), dtype="uint16")
    for name, kwargs in {"v2": {"zarr_format": 2, "chunks": (2, 8, 8)},
                         "sharded": {"zarr_format": 3, "chunks": (1, 4, 4), "shards": (2, 8, 8)}}.items():
        path = os.path.join(root, f"{name}.zarr")
        if not os.path.exists(path):
            zarr.create_array(path, data=data, **kwargs)
        app.requests.clear()
        options = {"allow_invalid_certificates": True, "http2": http2}
        a = zcrop.open_array(f"{base}/{name}.zarr", storage_options=options)
        np.testing.assert_array_equal(a[...], data)
        opened = {c for _, c in app.requests}
        origins = np.array([[0, 0, 0], [4, 30, 40], [2, 13, 7]], dtype=np.uint64)
        for _ in range(3):
            for crop, o in zip(a.read_crops(origins, (2, 10, 8)), origins.astype(int)):
                np.testing.assert_array_equal(crop, data[o[0]:o[0] + 2, o[1]:o[1] + 10, o[2]:o[2] + 8])
        versions = {v for v, _ in app.requests}
        connections = {c for _, c in app.requests}
        assert versions == ({"2"} if http2 else {"1.1"}), (name, versions)
        # Connections are kept: the crops after the whole-array read open none of their own.
        assert connections == opened, (name, len(opened), len(connections))
        if http2:
            # Every GET multiplexed over a few connections.
            assert len(app.requests) >= 20 and len(connections) <= 4, (name, len(connections))
