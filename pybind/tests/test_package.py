"""The package itself: import, version, the console script, and the fixtures it is tested on."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

import zcrop
from conftest import FIXTURES, cargo_version, rust_binary


def test_version_matches_the_workspace():
    assert zcrop.__version__ == cargo_version()


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def console_script() -> str:
    exe = shutil.which("zcrop", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert exe, "the zcrop console script is not installed next to this Python"
    return exe


def test_console_script_runs_the_cli():
    out = run([console_script(), "--version"])
    assert out.returncode == 0
    assert out.stdout.strip() == f"zcrop {zcrop.__version__}"


def test_console_script_reports_usage_errors_like_the_binary():
    out = run([console_script(), "--definitely-not-a-flag"])
    assert out.returncode == 2
    assert "unexpected argument" in out.stderr
    assert "Traceback" not in out.stderr


def test_console_script_and_rust_binary_are_one_implementation():
    exe = rust_binary()
    if exe is None:
        pytest.skip("no Rust binary under $CARGO_TARGET_DIR/debug (run cargo test first)")
    py = run([console_script(), "--help"])
    rs = run([str(exe), "--help"])
    assert py.returncode == rs.returncode == 0
    assert py.stdout == rs.stdout


def test_fixtures_regenerate_byte_for_byte():
    """The committed fixtures are exactly what fixtures/generate.py writes with pinned zarr."""
    import zarr

    if zarr.__version__ != "3.1.6":
        pytest.fail(f"the test venv must pin zarr 3.1.6 like generate.py, got {zarr.__version__}")
    out = run([sys.executable, str(FIXTURES / "generate.py"), "--check"])
    assert out.returncode == 0, out.stdout + out.stderr
