#!/usr/bin/env python3
"""The chunked-axis FFT writing to an object store far away: moto's S3 server on loopback
behind a proxy that holds every request ``--latency-ms`` before passing it on (so each PUT,
GET and LIST costs a round trip), counting requests by method.

Runs ``zcrop.fft.fft_along_axis`` with the target (and, for the Dask engine, the work
directory) on the store: ``local`` writes the output there (temporaries stay local), ``dask``
runs the job's tasks on a LocalCluster of single-threaded workers with every temporary there
too. Reports seconds, requests, and MB/s of input, median of ``--repeats``.

    python3 benches/fft_object_store.py [--latency-ms 20] [--engines local,dask] [--repeats 3]
        [--shape 8,262144] [--budget 4MiB]

The default shape and budget give the four-step plan (lines longer than the budget holds), so
the Dask engine writes and reads back its temporaries on the store.

Needs moto's server (``pip install "moto[server]"``) and, for ``dask``, distributed. The
output is checked against numpy.fft once per engine.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import zarr

import zcrop
import zcrop.fft


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], int]:
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or "moto_server"
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise SystemExit("moto_server did not start")


class Delay:
    """A proxy to ``upstream`` that waits ``seconds`` before forwarding each request."""

    def __init__(self, upstream: int, seconds: float) -> None:
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        local = threading.local()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                with lock:
                    outer.counts[self.command] += 1
                time.sleep(seconds)
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection("127.0.0.1", upstream)
                conn.request(self.command, self.path, body=body, headers=dict(self.headers))
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except (BrokenPipeError, ConnectionResetError):
                    # The client gave up on an answer (a hedged or cancelled request).
                    self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--engines", default="local,dask")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", default="4MiB")
    ap.add_argument("--shape", default="8,262144", help="float32 lines, transformed along axis 1")
    args = ap.parse_args()
    moto, port = start_moto()
    proxy = Delay(port, args.latency_ms / 1000)
    options = {"endpoint_url": f"http://127.0.0.1:{proxy.port}", "region": "us-east-1",
               "access_key_id": "testing", "secret_access_key": "testing"}
    import boto3

    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                 aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="fft")
    root = Path(tempfile.mkdtemp(prefix="zcrop-fft-s3-"))
    lines, n = (int(v) for v in args.shape.split(","))
    x = np.random.default_rng(0).standard_normal((lines, n)).astype("f4")
    src = str(root / "in.zarr")
    zarr.create_array(src, data=x, chunks=(1, min(n, 16384)), compressors=None)
    want = np.fft.fft(x.astype("f8"), axis=1)
    client = None
    print(f"zcrop {zcrop.__version__} from {os.path.dirname(zcrop.__file__)}; latency "
          f"{args.latency_ms} ms; input float32 {x.shape}, budget {args.budget}\n")
    print("| engine | strategy | seconds (runs) | median | MB/s in | PUT | GET | other |")
    print("|---|---|---|---|---|---|---|---|")
    try:
        for engine in args.engines.split(","):
            kwargs: dict[str, object] = {}
            if engine == "dask":
                from distributed import Client, LocalCluster

                cluster = LocalCluster(n_workers=2, threads_per_worker=1,
                                       dashboard_address=None)
                client = Client(cluster)
                kwargs = {"client": client, "work_dir": "s3://fft/work"}
            runs = []
            for r in range(args.repeats):
                proxy.counts.clear()
                t = time.perf_counter()
                report = zcrop.fft.fft_along_axis(
                    src, 1, f"s3://fft/out-{engine}.zarr", memory_per_task=args.budget,
                    engine=engine, overwrite=True, storage_options=options, **kwargs)
                runs.append(time.perf_counter() - t)
                counts = dict(proxy.counts)
                if r == 0:
                    got = zcrop.open_array(f"s3://fft/out-{engine}.zarr",
                                           storage_options=options)[:]
                    err = np.abs(got - want).max() / np.abs(want).max()
                    assert err < 1e-5, err
            med = statistics.median(runs)
            other = sum(v for k, v in counts.items() if k not in ("PUT", "GET"))
            print(f"| {engine} | {report.strategy} | {', '.join(f'{t:.2f}' for t in runs)} | "
                  f"{med:.2f} | {x.nbytes / med / 1e6:.1f} | {counts.get('PUT', 0)} | "
                  f"{counts.get('GET', 0)} | {other} |")
            if client is not None:
                client.close()
                client.cluster.close()
                client = None
    finally:
        proxy.server.shutdown()
        moto.terminate()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
