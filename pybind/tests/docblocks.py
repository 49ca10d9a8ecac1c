"""The Python examples of README.md and docs/python.md, as the tests that run them see them.

A ```python block of a page runs as written, unless an HTML comment right before it (nothing
but blank lines between) says otherwise:

    <!-- setup -->            it writes the data the page's other blocks read: it runs first,
                              in the folder where the others then run
    <!-- not run: REASON -->  it needs what a test machine lacks (a GPU, credentials); it is
                              only compiled, and its ``zcrop`` names looked up

Any other comment right before a block is an error, so a misspelt marker cannot silently
change what runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import re
import subprocess
import sys

from conftest import REPO

README = REPO / "README.md"
PYTHON_GUIDE = REPO / "docs" / "python.md"

_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_COMMENT = re.compile(r"<!--((?:(?!<!--).)*?)-->\s*\Z", re.S)  # the last comment, at the end


@dataclasses.dataclass(frozen=True)
class Block:
    """One ```python block of a page."""

    page: pathlib.Path
    line: int  # of the opening fence, 1-based
    code: str
    marker: str | None  # None (runs), "setup" or "not run"
    reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker != "not run"


def blocks(page: pathlib.Path) -> list[Block]:
    """The page's ```python blocks, in order, with their markers."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip()
        marker, reason = None, ""
        comment = _COMMENT.search(before)
        if comment is not None:
            words = " ".join(comment.group(1).split())
            if words == "setup":
                marker = "setup"
            elif words.startswith("not run:"):
                marker, reason = "not run", words[len("not run:") :].strip()
            else:
                raise AssertionError(
                    f"{page.relative_to(REPO)}:{line}: unknown marker <!--{comment.group(1)}--> "
                    "before a python block (use <!-- setup --> or <!-- not run: REASON -->)"
                )
        out.append(Block(page, line, m.group(1), marker, reason))
    return out


def run(block: Block, cwd: pathlib.Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs a block as a user would run it pasted into a script: a file of its own in ``cwd``,
    run by this interpreter from there."""
    script = cwd / f"example_{block.page.stem}_{block.line}.py"
    script.write_text(block.code)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, script.name], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )


def run_ok(block: Block, cwd: pathlib.Path, timeout: float = 300) -> str:
    """Runs a block; fails the test with its output unless it exits 0. Returns its stdout."""
    out = run(block, cwd, timeout)
    assert out.returncode == 0, (
        f"{block.id} failed (exit {out.returncode}):\n--- code\n{block.code}"
        f"--- stdout\n{out.stdout}--- stderr\n{out.stderr}"
    )
    return out.stdout


def setup(page: pathlib.Path, cwd: pathlib.Path) -> None:
    """Runs the page's setup blocks in ``cwd``."""
    for block in blocks(page):
        if block.marker == "setup":
            run_ok(block, cwd)


_ZCROP_NAME = re.compile(r"\bzcrop(?:\.[A-Za-z_]\w*)+")


def zcrop_names(code: str) -> set[str]:
    """The dotted ``zcrop.…`` names a block uses (``zcrop.torch.ZcropDataset``, ...)."""
    return set(_ZCROP_NAME.findall(code))


def resolve(name: str) -> object:
    """Looks up a dotted name, importing the longest module prefix it has
    (``zcrop.torch.ZcropDataset`` imports ``zcrop.torch``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(name)


def training_loop_block() -> Block:
    """The guide's torch training loop: the block that builds a DataLoader over
    ``zcrop.torch.ZcropDataset`` and steps an optimiser."""
    found = [
        b
        for b in blocks(PYTHON_GUIDE)
        if "zcrop.torch.ZcropDataset" in b.code and "DataLoader" in b.code and "opt.step()" in b.code
    ]
    assert len(found) == 1, [b.id for b in found]
    return found[0]
