# Entry points. Each target is one script under scripts/, so CI and people run the same thing.
.PHONY: test fixtures fixtures-check wheel

## Run every test (fmt, clippy, cargo test, the Python package and pytest). Installs what it needs.
test:
	./scripts/test.sh

## Regenerate the fixtures with zarr-python (pinned versions, see fixtures/README.md).
fixtures:
	./scripts/fixtures.sh

## Check that the committed fixtures regenerate byte for byte.
fixtures-check:
	./scripts/fixtures.sh --check

## Build the Python wheel into dist/ (installing it needs no Rust toolchain; see scripts/wheel.sh).
wheel:
	./scripts/wheel.sh
