#!/usr/bin/env bash
# The GPU checks on a machine that has a CUDA GPU and torch but no Rust toolchain and no network
# (the device machines lent to some sessions). Two halves:
#
#   scripts/device.sh prepare   here: a release wheel for that machine's Python (PYTHON, default
#                               python3.12), unpacked into .device/site, and the wheels the
#                               tests need there (zarr-python and its codecs) into
#                               .device/wheels; .device/ is ignored by git, so carry it
#   scripts/device.sh check     there, from the repository root: installs the carried wheels,
#                               puts .device/site first on PYTHONPATH (the working tree's
#                               Python files over the wheel's), then runs the GPU and fork
#                               tests, benches/gpu_check.py and benches/loader_fork.py
#                               (throughput per start method on that host's cores, on the
#                               default batches and on 12.6 MB blosc-lz4 ones); output
#                               goes to $OUT/device-check.txt when OUT is set
#
# Each step of `check` has a time limit, so a hang leaves the rest of the report.
set -uo pipefail
cd "$(dirname "$0")/.."

DEV=.device
case "${1:-}" in
prepare)
    set -e
    PY="${PYTHON:-python3.12}"
    PYVER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    rm -rf "$DEV/site" && mkdir -p "$DEV/wheels"
    PYTHON="$PY" scripts/wheel.sh
    WHEEL="$(ls -t dist/zcrop-*-cp${PYVER/./}-*.whl | head -n 1)"
    "$PY" -m pip install -q --no-deps --target "$DEV/site" "$WHEEL"
    # Debug info is most of the module's size, and the check needs none of it.
    strip --strip-unneeded "$DEV"/site/zcrop/_zcrop*.so
    REQ=pybind/requirements-test.txt
    pins=$(grep -E '^(zarr|numcodecs)==' "$REQ")
    # shellcheck disable=SC2086  # one argument per pin
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
        -d "$DEV/wheels" $pins donfig google-crc32c
    du -sh "$DEV"
    echo "carry $DEV; run: bash scripts/device.sh check"
    ;;
check)
    [ -n "${OUT:-}" ] && exec > >(tee "$OUT/device-check.txt") 2>&1
    nvidia-smi -L
    echo "cores: $(nproc)"
    python3 -m pip install -q --no-index --no-deps "$DEV"/wheels/*.whl
    cp -r pybind/python/zcrop/. "$DEV/site/zcrop/"
    export PYTHONPATH="$PWD/$DEV/site${PYTHONPATH:+:$PYTHONPATH}"
    python3 -c "import torch, zcrop; print('zcrop from', zcrop.__file__, '| torch',
        torch.__version__, '| CUDA', torch.cuda.is_available())"
    # Most wanted first: each step has its own limit, and a report cut short keeps the rest.
    echo "=== benches/loader_fork.py: default batches (1 MiB, zstd)"
    timeout 170 python3 benches/loader_fork.py --workers 0,2,4 --methods fork,forkserver,spawn \
        --timed 600 --repeats 3 --skip-memory 2>&1 | grep -E "^\||^machine|^dataset"
    echo "=== benches/loader_fork.py: 12.6 MB batches of blosc-lz4"
    lz4=$(timeout 60 python3 -m zcrop._cli bench --prepare-only --codec blosc-lz4 \
        --dataset-size 1G --data-dir /tmp/zcrop-bench-data | tail -n 1)
    timeout 100 python3 benches/loader_fork.py --array "$lz4" --crop 4,12,128,128 \
        --batch-size 8 --workers 0,2,4 --methods fork --timed 300 --repeats 3 --skip-memory \
        2>&1 | grep -E "^\||^machine|^dataset"
    echo "=== benches/gpu_check.py"
    timeout 90 python3 benches/gpu_check.py 2>&1 | tail -15
    echo "=== pytest: GPU, fork and loader tests"
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfs --tb=short \
        pybind/tests/test_fork.py pybind/tests/test_torch.py pybind/tests/test_jax.py \
        pybind/tests/test_loader.py -k "not s3" 2>&1 | grep -v "Warning\|os.fork" | tail -40
    echo "=== done"
    ;;
*)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
