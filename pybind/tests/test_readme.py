"""The README's Python example, and the training loop of docs/python.md, run as written.

The README's example writes its own dataset with xarray and reads it back with zcrop; it runs
as a script in an empty temporary folder. The training loop reads the guide's sample data
(written first by the guide's setup block) and trains on the GPU when torch has CUDA, on the
CPU otherwise; its printed batches are checked against what its arguments ask for.
"""

from __future__ import annotations

import re

from docblocks import PYTHON_GUIDE, README, Block, blocks, run_ok, setup, training_loop_block


def readme_examples() -> list[Block]:
    return [b for b in blocks(README) if b.runs]


def test_readme_example_runs(tmp_path):
    examples = readme_examples()
    assert len(examples) == 1, [b.id for b in examples]
    example = examples[0]
    # What the README promises to show: a dataset written by xarray, read by zcrop.
    for needed in ("import xarray", ".to_zarr(", "zcrop.open(", "read_crops("):
        assert needed in example.code, f"{example.id} no longer shows {needed}"
    out = run_ok(example, tmp_path)
    assert out.strip(), "the example prints what it read"


def test_training_loop_runs(tmp_path):
    block = training_loop_block()
    steps = int(re.search(r"\bsteps=(\d+)", block.code).group(1))
    batch_size = int(re.search(r"\bbatch_size=(\d+)", block.code).group(1))
    crop = re.search(r'"example.zarr/radiance", \(([\d, ]+)\)', block.code).group(1)
    crop_shape = tuple(int(n) for n in crop.split(","))
    setup(PYTHON_GUIDE, tmp_path)
    out = run_ok(block, tmp_path)
    seen = re.findall(r"^(\d+) \(([\d, ]+)\) loss (-?[\d.]+|nan)$", out, flags=re.M)
    assert [int(i) for i, _, _ in seen] == list(range(steps)), out
    for _, shape, loss in seen:
        assert tuple(int(n) for n in shape.split(",")) == (batch_size, *crop_shape), out
        assert loss != "nan", out
    assert f"resume from {{'data': {{'start': {steps}}}}}" in out, out
