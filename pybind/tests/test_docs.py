"""The Python examples of docs/python.md run as written.

Each block runs in a subprocess, as a script of its own, in one temporary folder where the
page's setup block (the sample data) ran first. Blocks marked ``<!-- not run: REASON -->``
(they need an S3 bucket or a GPU) are compiled and their ``zcrop`` names looked up instead;
there must be few of them, each with its reason. See docblocks.py for the markers.
"""

from __future__ import annotations

import pathlib

import pytest

from docblocks import (
    PYTHON_GUIDE,
    README,
    blocks,
    resolve,
    run,
    setup,
    training_loop_block,
    zcrop_names,
)

# Blocks the test machine cannot run; each says why in its marker.
MAX_NOT_RUN = 3

GUIDE_BLOCKS = blocks(PYTHON_GUIDE)
RUNNABLE = [b for b in GUIDE_BLOCKS if b.marker is None]
NOT_RUN = [b for b in GUIDE_BLOCKS if b.marker == "not run"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A folder holding the guide's sample data."""
    where = tmp_path_factory.mktemp("python-guide")
    setup(PYTHON_GUIDE, where)
    return where


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.id for b in RUNNABLE])
def test_guide_example_runs(block, workdir):
    if block == training_loop_block():
        pytest.skip("run by test_readme.py::test_training_loop_runs, which checks its batches")
    out = run(block, workdir)
    assert out.returncode == 0, (
        f"{block.id} failed (exit {out.returncode}):\n--- code\n{block.code}"
        f"--- stdout\n{out.stdout}--- stderr\n{out.stderr}"
    )


def test_guide_has_its_examples():
    """The page has its sample data and enough runnable examples that a broken parser or a
    page marked not-run wholesale cannot pass unnoticed."""
    assert sum(b.marker == "setup" for b in GUIDE_BLOCKS) == 1
    assert len(RUNNABLE) >= 10, [b.id for b in RUNNABLE]


@pytest.mark.parametrize("page", [README, PYTHON_GUIDE], ids=["README.md", "docs/python.md"])
def test_not_run_blocks_are_few_and_explained(page):
    not_run = [b for b in blocks(page) if b.marker == "not run"]
    limit = 0 if page == README else MAX_NOT_RUN
    assert len(not_run) <= limit, [(b.id, b.reason) for b in not_run]
    for b in not_run:
        assert len(b.reason.split()) >= 3, f"{b.id}: say why it cannot run ({b.reason!r})"


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.id for b in NOT_RUN])
def test_not_run_blocks_compile(block):
    compile(block.code, block.id, "exec")


@pytest.mark.parametrize(
    "block", [b for p in (README, PYTHON_GUIDE) for b in blocks(p)],
    ids=[b.id for p in (README, PYTHON_GUIDE) for b in blocks(p)],
)
def test_zcrop_names_exist(block):
    """Every ``zcrop.…`` name an example uses exists (also in the blocks not run)."""
    for name in sorted(zcrop_names(block.code)):
        try:
            resolve(name)
        except (ImportError, AttributeError) as e:
            pytest.fail(f"{block.id}: {name} does not exist ({e})")
