#!/usr/bin/env bash
# Builds the zcrop Python wheel (`make wheel`), or checks that one installs and works where no
# Rust toolchain is (`scripts/wheel.sh --check`, run by scripts/test.sh).
#
#   scripts/wheel.sh           a release wheel for this machine's Python into dist/
#                              (then: pip install dist/zcrop-*.whl)
#   scripts/wheel.sh --check   a wheel of the dev profile (it reuses the debug build of
#                              `make test`), installed into a fresh virtualenv in a temporary
#                              folder with cargo and rustc off PATH; numpy comes from pip; then
#                              zcrop reads a fixture array there and compares it with the
#                              array zarr-python wrote (its .npy)
#
# Needs the Rust toolchain and Python 3.10+ to build; maturin is taken from the test
# virtualenv, from PATH, or installed (the version pybind/requirements-test.txt pins) into a
# virtualenv under $ZCROP_CACHE. PYTHON chooses the interpreter the wheel is for.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECK=0
case "${1:-}" in
    "") ;;
    --check) CHECK=1 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: scripts/wheel.sh [--check]" >&2; exit 2 ;;
esac

CACHE="${ZCROP_CACHE:-$HOME/.cache/zcrop}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
REQ=pybind/requirements-test.txt
pinned() { sed -n "s/^$1==\([^ ]*\).*/\1/p" "$REQ"; }

# The interpreter the wheel is built for (and, with --check, the one the fresh venv uses).
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
PY="$("$PY" -c 'import sys; print(sys.executable)')"

MATURIN=""
for m in "${ZCROP_TEST_VENV:-$CACHE/venv-test}/bin/maturin" "$(command -v maturin || true)"; do
    if [ -n "$m" ] && [ -x "$m" ]; then MATURIN="$m"; break; fi
done
if [ -z "$MATURIN" ]; then
    BUILD_VENV="$CACHE/venv-wheel"
    echo "maturin not found: installing maturin==$(pinned maturin) into $BUILD_VENV"
    "$PY" -m venv "$BUILD_VENV"
    "$BUILD_VENV/bin/python" -m pip install -q "maturin==$(pinned maturin)"
    MATURIN="$BUILD_VENV/bin/maturin"
fi

if [ "$CHECK" = 0 ]; then
    "$MATURIN" build --release -m pybind/Cargo.toml -i "$PY" -o dist/
    echo "built: $(ls -t dist/zcrop-*.whl | head -n 1)"
    echo "install it with: pip install $(ls -t dist/zcrop-*.whl | head -n 1)"
    exit 0
fi

# --- --check -----------------------------------------------------------------------------------
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$MATURIN" build --quiet --profile dev -m pybind/Cargo.toml -i "$PY" -o "$WORK/wheels"
WHEEL="$(ls "$WORK"/wheels/zcrop-*.whl)"
echo "wheel: $(basename "$WHEEL") ($(du -k "$WHEEL" | cut -f1) KiB)"

VENV="$WORK/venv"
"$PY" -m venv "$VENV"
# PATH holds the fresh venv and the system's folders, nothing else: no cargo, rustc or maturin.
PLAIN_PATH="$VENV/bin:/usr/bin:/bin"
for tool in cargo rustc maturin; do
    if env PATH="$PLAIN_PATH" sh -c "command -v $tool" >/dev/null; then
        echo "wheel check: $tool is on the plain PATH ($PLAIN_PATH); cannot prove it is not needed" >&2
        exit 1
    fi
done
# pip keeps the rest of the environment (proxies, certificates, index settings) to reach PyPI
# for numpy; the wheel itself installs with --no-index.
strip_rust() { env -u CARGO_TARGET_DIR -u CARGO_HOME -u RUSTUP_HOME -u RUSTC -u RUSTFLAGS \
    PATH="$PLAIN_PATH" "$@"; }
strip_rust python -m pip install -q --disable-pip-version-check "numpy==$(pinned numpy)"
strip_rust python -m pip install -q --disable-pip-version-check --no-index "$WHEEL"

# Run in a bare environment, from a folder outside the clone, so the installed package is the
# one imported (not pybind/python).
ROOT="$PWD"
mkdir -p "$WORK/run"
(cd "$WORK/run" && env -i PATH="$PLAIN_PATH" HOME="$WORK" LANG=C.UTF-8 \
    python - "$ROOT/fixtures" <<'EOF'
import pathlib
import sys

import numpy as np
import zcrop

fixtures = pathlib.Path(sys.argv[1])
assert "site-packages" in zcrop.__file__, zcrop.__file__
store = fixtures / "data" / "v3_workload_4d_u2_blosc.zarr"
expected = np.load(fixtures / "data" / "expected" / "v3_workload_4d_u2_blosc.npy")
arr = zcrop.open_array(store)
got = arr[...]
assert got.dtype == expected.dtype and np.array_equal(got, expected), "whole array differs"
origins = [[0] * arr.ndim, [n // 2 for n in arr.shape]]
shape = [max(1, n // 3) for n in arr.shape]
crops = arr.read_crops(origins, shape)
for o, c in zip(origins, crops):
    assert np.array_equal(c, expected[tuple(slice(a, a + s) for a, s in zip(o, shape))])
print(f"zcrop {zcrop.__version__} from {pathlib.Path(zcrop.__file__).parent}: "
      f"{store.name} {arr.shape} {arr.dtype} read whole and as 2 crops, equal to the .npy")
EOF
)
env -i PATH="$PLAIN_PATH" HOME="$WORK" LANG=C.UTF-8 zcrop info \
    "fixtures/data/v3_workload_4d_u2_blosc.zarr" >/dev/null
echo "wheel check: installed without cargo or rustc on PATH; the zcrop console script runs"
