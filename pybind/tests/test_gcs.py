"""``gs://`` URLs against a GCS emulator on loopback (gcp-storage-emulator from PyPI), with the
options gcsfs users pass (``endpoint_url``, ``token``, ``project``) and the
``STORAGE_EMULATOR_HOST`` variable Google's clients follow.

Oracle: zarr-python reading the same stores from local disk. The emulator is run as GCS
behaves where it differs: it serves concurrent requests (it ships a one-at-a-time HTTP server),
decodes percent-encoded object paths (object_store encodes ``/``, ``.`` and ``-``), sends
``Last-Modified`` and ``ETag`` with objects, and honours suffix ranges (``bytes=-N``, which
sharded stores read their index with).
"""

from __future__ import annotations

import datetime
import email.utils
import http.server
import os
import pathlib
import re
import socket
import types
import urllib.parse
import urllib.request

import numpy as np
import pytest

import zcrop

zarr = pytest.importorskip("zarr")
emulator = pytest.importorskip("gcp_storage_emulator.server")
objects = pytest.importorskip("gcp_storage_emulator.handlers.objects")

BUCKET = "zcrop-test"


class _ThreadingServer(http.server.ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True


def _as_gcs(download):
    """The emulator's download handler, with GCS's object headers and suffix ranges."""

    def handler(request, response, storage, *args, **kwargs):
        p = request.params
        try:
            obj = storage.get_file_obj(p["bucket_name"], p["object_id"])
        except Exception:  # not found: the handler answers 404
            obj = None
        if obj is not None:
            updated = datetime.datetime.fromisoformat(obj["updated"].replace("Z", "+00:00"))
            response["Last-Modified"] = email.utils.format_datetime(updated, usegmt=True)
            response["ETag"] = f'"{obj["md5Hash"]}"'
        m = re.fullmatch(r"\s*bytes=-(\d+)\s*", request.get_header("range", "") or "")
        if m and obj is not None:
            size = len(storage.get_file(p["bucket_name"], p["object_id"]))
            start = max(0, size - int(m[1]))
            get = request.get_header
            request.get_header = lambda name, default=None: (
                f"bytes={start}-" if name.lower() == "range" else get(name, default)
            )
        return download(request, response, storage, *args, **kwargs)

    return handler


@pytest.fixture(scope="module")
def gcs():
    """The emulator's base URL, serving bucket ``zcrop-test``."""
    handlers = [h for _, h in emulator.HANDLERS if objects.download in h.values()]
    patched = _as_gcs(objects.download)
    for h in handlers:
        for method, fn in list(h.items()):
            if fn is objects.download:
                h[method] = patched
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    raw_path = emulator.Request.path
    emulator.Request.path = property(lambda r: urllib.parse.unquote(raw_path.fget(r)))
    http_module = emulator.server
    emulator.server = types.SimpleNamespace(HTTPServer=_ThreadingServer)
    srv = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    try:
        srv.start()
    finally:
        emulator.server = http_module
    yield f"http://127.0.0.1:{port}"
    srv.stop()
    emulator.Request.path = raw_path
    for h in handlers:
        for method, fn in list(h.items()):
            if fn is patched:
                h[method] = objects.download


def upload(base: str, root: pathlib.Path, prefix: str) -> str:
    """Puts every file under ``root`` at ``prefix/...`` in the bucket; returns the gs:// URL."""
    for path in sorted(root.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(root).as_posix()}"
            req = urllib.request.Request(f"{base}/{BUCKET}/{key}", data=path.read_bytes(),
                                         method="PUT")
            urllib.request.urlopen(req).read()
    return f"gs://{BUCKET}/{prefix}"


LAYOUTS = {
    "v2": {"zarr_format": 2, "chunks": (2, 8, 8)},
    "v3": {"zarr_format": 3, "chunks": (2, 8, 8)},
    "sharded": {"zarr_format": 3, "chunks": (1, 4, 4), "shards": (2, 8, 8)},
}


@pytest.fixture(scope="module")
def stores(gcs, tmp_path_factory):
    """Each layout written by zarr-python, locally and in the bucket: {layout: (path, url)}."""
    rng = np.random.default_rng(7)
    data = rng.integers(0, 60000, (5, 20, 24), dtype="uint16")
    out = {}
    for name, kwargs in LAYOUTS.items():
        root = tmp_path_factory.mktemp("gcs") / f"{name}.zarr"
        g = zarr.open_group(str(root), mode="w", zarr_format=kwargs["zarr_format"])
        a = g.create_array("data", shape=data.shape, dtype=data.dtype,
                           **{k: v for k, v in kwargs.items() if k != "zarr_format"})
        a[...] = data
        out[name] = (str(root), upload(gcs, root, f"stores/{name}.zarr"))
    return out


OPTIONS = {"token": "anon", "project": "my-project"}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gs_urls_read_what_zarr_python_reads(gcs, stores, layout):
    local, url = stores[layout]
    want = zarr.open_array(local + "/data")[...]
    options = {**OPTIONS, "endpoint_url": gcs}
    a = zcrop.open_array(url + "/data", storage_options=options)
    np.testing.assert_array_equal(a[...], want)
    np.testing.assert_array_equal(a[1:4, 3:17, 5:22], want[1:4, 3:17, 5:22])
    origins = np.array([[0, 0, 0], [3, 12, 16], [1, 7, 3]], dtype=np.uint64)
    crops = a.read_crops(origins, (2, 8, 8))
    for crop, o in zip(crops, origins.astype(int)):
        np.testing.assert_array_equal(crop, want[o[0] : o[0] + 2, o[1] : o[1] + 8, o[2] : o[2] + 8])
    g = zcrop.open_group(url, storage_options=options)
    np.testing.assert_array_equal(g["data"][2], want[2])


def test_the_emulator_host_variable_is_followed(gcs, stores, monkeypatch):
    _, url = stores["v3"]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.removeprefix("http://"))
    a = zcrop.open_array(url + "/data")
    assert a.shape == (5, 20, 24)
    assert int(a[4, 19, 23]) == int(zarr.open_array(stores["v3"][0] + "/data")[4, 19, 23])


def test_missing_objects_and_bad_options_are_named(gcs, stores):
    options = {**OPTIONS, "endpoint_url": gcs}
    with pytest.raises(zcrop.ZcropError, match="gs://zcrop-test/stores/nothing"):
        zcrop.open_array(f"gs://{BUCKET}/stores/nothing.zarr", storage_options=options)
    with pytest.raises(zcrop.ZcropError, match="requester_pays"):
        zcrop.open_array(stores["v3"][1] + "/data",
                         storage_options={**options, "requester_pays": True})
    assert os.environ.get("STORAGE_EMULATOR_HOST") is None


@pytest.mark.parametrize("spec", ["v1", "v2"])
def test_icechunk_repositories_from_gs_urls(gcs, spec):
    repos = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "icechunk-repos"
    url = upload(gcs, repos / spec, f"icechunk/{spec}")
    options = {**OPTIONS, "endpoint_url": gcs}
    local = zcrop.open_icechunk(repos / spec, tag="v1")
    snap = zcrop.open_icechunk(url, tag="v1", storage_options=options)
    assert snap.snapshot_id == local.snapshot_id
    for path in snap.arrays():
        np.testing.assert_array_equal(snap[path][...], local[path][...])
