"""Stores that take long to read, written directly (no zarr-python), for the Ctrl-C and event
loop tests: one shard of many tiny gzip inner chunks, so a whole read does a lot of per-chunk
work while its result stays small."""

from __future__ import annotations

import gzip
import json
import os
import pathlib

import numpy as np


def make_slow_array(root: str | os.PathLike, side: int = 2048, chunk: int = 4, value: int = 7) -> str:
    """A v3 uint8 array of (side, side), one shard with (side/chunk)^2 gzip inner chunks, every
    element `value`. Returns its path."""
    root = pathlib.Path(root)
    (root / "c" / "0").mkdir(parents=True, exist_ok=True)
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [side, side],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [side, side]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [
            {
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [chunk, chunk],
                    "codecs": [{"name": "bytes"}, {"name": "gzip", "configuration": {"level": 1}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": "end",
                },
            }
        ],
        "attributes": {},
        "storage_transformers": [],
    }
    (root / "zarr.json").write_text(json.dumps(meta))
    payload = gzip.compress(bytes([value]) * chunk * chunk, compresslevel=1, mtime=0)
    n = (side // chunk) ** 2
    index = np.empty((n, 2), dtype="<u8")
    index[:, 0] = np.arange(n, dtype=np.uint64) * len(payload)
    index[:, 1] = len(payload)
    with open(root / "c" / "0" / "0", "wb") as f:
        f.write(payload * n)
        f.write(index.tobytes())
    return str(root)
