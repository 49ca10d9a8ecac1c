"""The README's training-loop example runs as written (on a small store made here; on a
machine without CUDA, `.cuda(...)` becomes a host copy)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import torch
import zarr

from conftest import REPO


def readme_torch_example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "zcrop.torch" in b and "DataLoader" in b)
    return example


def test_readme_training_loop_runs(tmp_path):
    root = zarr.open_group(str(tmp_path / "sat.zarr"), mode="w")
    rng = np.random.default_rng(0)
    arr = root.create_array("radiance", shape=(6, 12, 160, 160), chunks=(1, 4, 64, 64),
                            dtype="uint16", dimension_names=["time", "channel", "y", "x"])
    arr[...] = rng.integers(0, 1000, size=arr.shape, dtype=np.uint16)
    example = readme_torch_example().replace("steps=10_000", "steps=3")
    if not torch.cuda.is_available():
        example = example.replace(".cuda(non_blocking=True)", ".to('cpu')")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch as _torch\n"
        "channel_means, channel_stds = [500.0] * 12, [300.0] * 12\n"
        "model = _torch.nn.Conv3d(4, 1, 1).to('cuda' if _torch.cuda.is_available() else 'cpu')\n"
        "opt = _torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "def main():\n"
        "    seen = []\n"
        + textwrap.indent(example, "    ")
        + "        seen.append((batch['batch'], tuple(batch['sat'].shape)))\n"
        "    print('SEEN', seen, ckpt)\n"
        "if __name__ == '__main__':\n"
        "    main()\n"
    )
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SEEN [(0, (32, 4, 12, 128, 128)), (1, (32, 4, 12, 128, 128)), (2, (32, 4, 12, 128, 128))]" in out.stdout
    assert "{'data': {'start': 3}}" in out.stdout
