#!/usr/bin/env python3
"""Builds seed corpora for the fuzz targets from the committed fixtures (stdlib only).

    python3 zarr-front/fuzz/seed.py && cd zarr-front && cargo +nightly fuzz run chunk -- -max_total_time=600
    (targets: metadata, shard_index, chunk, chunk_range)
"""

import json
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "fixtures"


def main() -> None:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    roots = [e for e in manifest if e["array_path"] == ""]
    corpus = {name: HERE / "corpus" / name for name in ("metadata", "shard_index", "chunk", "chunk_range")}
    for d in corpus.values():
        d.mkdir(parents=True, exist_ok=True)
    for i, e in enumerate(roots):
        store = FIXTURES / e["store"]
        meta = store / ("zarr.json" if e["zarr_format"] == 3 else ".zarray")
        prefix = bytes([1 if e["zarr_format"] == 3 else 0])
        (corpus["metadata"] / f"{e['name']}").write_bytes(prefix + meta.read_bytes())
        files = sorted(p for p in store.rglob("*") if p.is_file() and not p.name.startswith((".z", "zarr.json")))
        for j, f in enumerate(files[:3]):
            (corpus["chunk"] / f"{e['name']}_{j}").write_bytes(bytes([i % 256]) + f.read_bytes())
            # chunk_range: array, start (u16 LE), length (u16 LE), then the chunk.
            head = bytes([i % 256, 16, 0, 200, 0])
            (corpus["chunk_range"] / f"{e['name']}_{j}").write_bytes(head + f.read_bytes())
    sharded = ["v3_sharded_end", "v3_sharded_start", "v3_sharded_partial_nocrc_u1", "v3_nested_sharding"]
    for i, name in enumerate(sharded):
        store = FIXTURES / f"data/{name}.zarr"
        for j, f in enumerate(sorted(p for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")[:2]):
            data = f.read_bytes()
            (corpus["shard_index"] / f"{name}_{j}_end").write_bytes(bytes([i | 0x80]) + data[-132:])
            (corpus["shard_index"] / f"{name}_{j}_start").write_bytes(bytes([i | 0x80]) + data[:132])
    for name, d in corpus.items():
        print(f"{name}: {len(list(d.iterdir()))} seeds")


if __name__ == "__main__":
    main()
