#!/usr/bin/env bash
# zcrop's test command (`make test`): everything CI runs, on a machine that has only the Rust
# toolchain, Python 3.10+ with pip, and apt. It installs what it needs itself.
#
#   cargo fmt --check, cargo clippy -D warnings, cargo doc (warnings denied), the Python test
#   virtualenv (it holds moto, the S3-compatible server the object-store tests start on
#   loopback), cargo test --workspace,
#   the fuzz targets for a fixed time (ZCROP_FUZZ_SECONDS per target), then builds the Python
#   package into the virtualenv and runs pytest.
#
# Caches (outside the clone, safe to delete): $ZCROP_CACHE (default ~/.cache/zcrop) holds the
# cargo target dir and the virtualenv, which is rebuilt when pybind/requirements-test.txt changes.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${ZCROP_CACHE:-$HOME/.cache/zcrop}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
VENV="${ZCROP_TEST_VENV:-$CACHE/venv-test}"
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
START=$SECONDS

step() { printf '\n==> %s  (%ds)\n' "$*" $((SECONDS - START)); }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# --- disk space --------------------------------------------------------------------------------
# The build (a few GB under $CARGO_TARGET_DIR) and the tests' temporary arrays (a few hundred MB
# under ${TMPDIR:-/tmp}) need room; a full disk otherwise shows up as some test's ENOSPC. When
# either has less than 3 GiB free, say so and drop cargo's incremental caches (they only speed
# up rebuilds).
free_gib() { local n; n="$(df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }')"; echo "${n:-999}"; }
mkdir -p "$CARGO_TARGET_DIR"
for d in "$CARGO_TARGET_DIR" "${TMPDIR:-/tmp}"; do
    if [ "$(free_gib "$d")" -lt 3 ]; then
        step "low disk space: $(free_gib "$d") GiB free under $d"
        rm -rf "$CARGO_TARGET_DIR"/*/incremental
        echo "after dropping cargo's incremental caches: $(free_gib "$d") GiB free" \
            "(zcrop's benchmark data, if any: ${ZCROP_BENCH_DATA:-${TMPDIR:-/tmp}/zcrop-bench-data})"
    fi
done

# --- system packages ---------------------------------------------------------------------------
missing=()
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)
if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# --- Rust --------------------------------------------------------------------------------------
step "cargo fmt --check"
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo doc --workspace --no-deps (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet

# --- Python test environment (also moto, the S3 server the object-store tests run) -------------
PY="$(command -v python3.11 || command -v python3)"
REQ=pybind/requirements-test.txt
STAMP="$VENV/.requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1) $("$PY" -c 'import sys; print(sys.version.split()[0])')"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    step "virtualenv $VENV ($REQ)"
    rm -rf "$VENV"
    if ! "$PY" -m venv "$VENV"; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
        "$PY" -m venv "$VENV"
    fi
    "$VENV/bin/python" -m pip install -q --upgrade pip
    "$VENV/bin/python" -m pip install -q -r "$REQ"
    echo "$want" > "$STAMP"
fi

# The object-store tests of every crate start moto's server from this virtualenv; here they
# must run, not skip.
export ZCROP_TEST_VENV="$VENV" ZCROP_REQUIRE_S3=1

step "cargo test --workspace"
cargo test --workspace -- --skip fuzz_ 2>&1 | tee "$LOGS/cargo.log"

# The fuzz targets of zarr-front's parsers and decoders on the stable toolchain: the committed
# corpus (zarr-front/fuzz/corpus), then seeded mutations of it for a fixed time per target.
export ZCROP_FUZZ_SECONDS="${ZCROP_FUZZ_SECONDS:-5}"
step "fuzz targets: corpus, then ${ZCROP_FUZZ_SECONDS}s of mutations each"
cargo test -p zcrop-zarr --test fuzz -- --nocapture 2>&1 \
    | grep -E '^(fuzz |test result|thread|.*panicked)' | tee -a "$LOGS/cargo.log"

# --- Python ------------------------------------------------------------------------------------
step "maturin develop (the zcrop Python package)"
VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH" \
    "$VENV/bin/maturin" develop --quiet --manifest-path pybind/Cargo.toml

# pytest's temporary arrays peak at about 7 GiB (one FFT test writes 6 GiB and deletes it; a
# passing test's directory goes as it passes, pyproject.toml). Earlier runs' kept directories
# are dropped first when room is short: a full disk fails unrelated tests with ENOSPC.
PYTEST_TMP="${TMPDIR:-/tmp}/pytest-of-$(id -un)"
if [ "$(free_gib "${TMPDIR:-/tmp}")" -lt 10 ] && [ -d "$PYTEST_TMP" ]; then
    step "low disk space: $(free_gib "${TMPDIR:-/tmp}") GiB free; dropping $PYTEST_TMP"
    rm -rf "$PYTEST_TMP"
fi
step "pytest ($(free_gib "${TMPDIR:-/tmp}") GiB free under ${TMPDIR:-/tmp}; about 7 needed)"
"$VENV/bin/python" -m pytest pybind/tests -q -p no:cacheprovider 2>&1 | tee "$LOGS/pytest.log"

# --- summary -----------------------------------------------------------------------------------
# The wheel: built with the dev profile, installed into a fresh virtualenv with no cargo or
# rustc on PATH, and read there (scripts/wheel.sh --check).
step "wheel: builds and installs into a plain venv"
./scripts/wheel.sh --check

step "summary"
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i;
                        if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } }
     END { printf "cargo test: %d passed, %d failed, %d ignored\n", p, f, g }' "$LOGS/cargo.log"
printf 'pytest: %s\n' "$(grep -E '(passed|failed|error)' "$LOGS/pytest.log" | tail -n 1)"
printf 'total time: %ds\n' $((SECONDS - START))
