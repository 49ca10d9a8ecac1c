#!/usr/bin/env bash
# Regenerates fixtures/ with the pinned zarr-python (or checks them with --check), in a cached
# virtualenv: the same one the tests use, so versions cannot drift apart.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${ZCROP_CACHE:-$HOME/.cache/zcrop}"
VENV="${ZCROP_FIXTURES_VENV:-$CACHE/venv-fixtures}"
PY="$(command -v python3.11 || command -v python3)"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q zarr==3.1.6 numcodecs==0.16.6 numpy==2.3.5
fi
exec "$VENV/bin/python" fixtures/generate.py "$@"
