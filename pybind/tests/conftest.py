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
    assert g.tobytes() == e.tobytes()
