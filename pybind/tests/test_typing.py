"""The package is typed: the native module's stubs match it (mypy.stubtest), the package passes
mypy --strict, it ships py.typed, and every public name has a docstring."""

from __future__ import annotations

import inspect
import pathlib
import subprocess
import sys

import zcrop

PACKAGE = pathlib.Path(zcrop.__file__).parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)


def test_native_stubs_match_the_module():
    out = run("mypy.stubtest", "zcrop._zcrop")
    assert out.returncode == 0, out.stdout + out.stderr


def test_package_passes_mypy_strict():
    out = run("mypy", "--strict", "--no-incremental", str(PACKAGE))
    assert out.returncode == 0, out.stdout + out.stderr


def test_py_typed_and_stub_ship_with_the_package():
    assert (PACKAGE / "py.typed").exists()
    assert (PACKAGE / "_zcrop.pyi").exists()


def test_every_public_name_has_a_docstring():
    missing = []
    for name in zcrop.__all__:
        obj = getattr(zcrop, name)
        if name == "__version__":
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if callable(member) or isinstance(member, property):
                    if not inspect.getdoc(member):
                        missing.append(f"{name}.{attr}")
    assert not missing, missing
