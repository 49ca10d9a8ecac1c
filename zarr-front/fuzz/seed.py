#!/usr/bin/env python3
"""Builds seed corpora for the fuzz targets from the committed fixtures (stdlib only).

    python3 zarr-front/fuzz/seed.py && cd zarr-front && cargo +nightly fuzz run chunk -- -max_total_time=600
    (targets: metadata, shard_index, chunk, chunk_range, lz4, vlen, blosc_blocks, zstd_range)
"""

import json
import math
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "fixtures"


def lz4_splits(buf: bytes) -> list[tuple[int, bytes]]:
    """The LZ4-compressed splits of the first block of `buf` if it is a blosc chunk compressed
    with LZ4 (each with its decoded size), else none."""
    if len(buf) < 20 or buf[0] != 2 or buf[2] >> 5 != 1 or buf[2] & 0x2:
        return []
    flags, typesize = buf[2], buf[3]
    nbytes, blocksize = int.from_bytes(buf[4:8], "little"), int.from_bytes(buf[8:12], "little")
    if blocksize == 0 or blocksize > nbytes:
        return []
    size = min(blocksize, nbytes)
    split = not flags & 0x10 and typesize <= 16 and size // typesize >= 128 and size == blocksize
    nsplits = typesize if split else 1
    seg = size // nsplits
    at = int.from_bytes(buf[16:20], "little")
    out = []
    for _ in range(nsplits):
        csize = int.from_bytes(buf[at : at + 4], "little", signed=True)
        data = buf[at + 4 : at + 4 + csize]
        if csize <= 0 or len(data) != csize:
            break
        if csize != seg and seg < 1 << 16:
            out.append((seg, data))
        at += 4 + csize
    return out


def vlen_frame(elements: list[bytes]) -> bytes:
    """A vlen-utf8 / vlen-bytes chunk: a u32 count, then each element's u32 length and bytes."""
    out = len(elements).to_bytes(4, "little")
    for e in elements:
        out += len(e).to_bytes(4, "little") + e
    return out


#: vlen seeds: element lists (the head byte holds the count less one; no zstd).
VLEN_SEEDS = {
    "one-empty": [b""],
    "three": [b"ab", b"", "\u00e9\u6f22\U0001f600".encode()],
    "long": [b"x" * 300, b"y", b"z" * 40, b"", b"q"],
    "not-utf8": [b"\xff\xfe", b"ok"],
}


def main() -> None:
    manifest = json.loads((FIXTURES / "manifest.json").read_text())
    roots = [e for e in manifest if e["array_path"] == ""]
    names = ("metadata", "shard_index", "chunk", "chunk_range", "lz4", "vlen", "blosc_blocks", "zstd_range")
    corpus = {name: HERE / "corpus" / name for name in names}
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
        for j, f in enumerate(files):
            for k, block in enumerate(lz4_splits(f.read_bytes())[:2]):
                # lz4: output size (u16 LE), target (u16 LE), then the LZ4 block.
                cap, _ = block
                head = cap.to_bytes(2, "little") + (cap // 2).to_bytes(2, "little")
                (corpus["lz4"] / f"{e['name']}_{j}_{k}").write_bytes(head + block[1])
    sharded = ["v3_sharded_end", "v3_sharded_start", "v3_sharded_partial_nocrc_u1", "v3_nested_sharding"]
    for i, name in enumerate(sharded):
        store = FIXTURES / f"data/{name}.zarr"
        for j, f in enumerate(sorted(p for p in store.rglob("*") if p.is_file() and p.name != "zarr.json")[:2]):
            data = f.read_bytes()
            (corpus["shard_index"] / f"{name}_{j}_end").write_bytes(bytes([i | 0x80]) + data[-132:])
            (corpus["shard_index"] / f"{name}_{j}_start").write_bytes(bytes([i | 0x80]) + data[:132])
    # blosc_blocks: mode, start (u16 LE), length (u16 LE), item size - 1, then a blosc chunk
    # of the fixtures (even mode) or data for c-blosc to compress (odd mode: codec, shuffle and
    # block size from the mode's bits).
    for e in roots:
        for j, f in enumerate(sorted((FIXTURES / e["store"]).rglob("*"))[:8]):
            data = f.read_bytes() if f.is_file() else b""
            if data[:1] == b"\x02" and len(data) > 16:
                (corpus["blosc_blocks"] / f"{e['name']}_{j}").write_bytes(bytes([0, 0, 1, 0, 4, 3]) + data)
    smooth = b"".join(int(20000 + 8000 * math.sin(i / 700) + (i * 7919) % 23).to_bytes(2, "little") for i in range(24576))
    for k, mode in enumerate((1, 3, 9, 67, 99, 161)):
        start = (k * 9000 % 40000).to_bytes(2, "little")
        (corpus["blosc_blocks"] / f"data_{mode}").write_bytes(bytes([mode]) + start + (3000).to_bytes(2, "little") + bytes([k % 4]) + smooth)
    # zstd_range: mode, start (u16 LE), length (u16 LE), chunk size (u16 LE), then a zstd frame
    # of the fixtures (even mode) or data for zstd to compress (odd mode: level from bits 2-3).
    for e in roots:
        for j, f in enumerate(sorted((FIXTURES / e["store"]).rglob("*"))[:4]):
            data = f.read_bytes() if f.is_file() else b""
            if data[:4] == b"\x28\xb5\x2f\xfd" and len(data) < 4096:
                # Chunk size 0: the size the frame declares.
                head = bytes([0]) + (8).to_bytes(2, "little") + (64).to_bytes(2, "little") + bytes(2)
                (corpus["zstd_range"] / f"{e['name']}_{j}").write_bytes(head + data)
    words = b"zarr chunk shard crop decode the a io ".split()
    text = b" ".join(words[(i * 7 + i // 5) % len(words)] for i in range(1500))
    for k, mode in enumerate((1, 5, 9, 13)):
        start = (k * 2500).to_bytes(2, "little")
        (corpus["zstd_range"] / f"smooth_{mode}").write_bytes(bytes([mode]) + start + (4000).to_bytes(2, "little") + bytes(2) + smooth[:16384])
        (corpus["zstd_range"] / f"text_{mode}").write_bytes(bytes([mode]) + start + (900).to_bytes(2, "little") + bytes(2) + text)
    for name, elements in VLEN_SEEDS.items():
        (corpus["vlen"] / name).write_bytes(bytes([len(elements) - 1]) + vlen_frame(elements))
    for name, d in corpus.items():
        print(f"{name}: {len(list(d.iterdir()))} seeds")


if __name__ == "__main__":
    main()
