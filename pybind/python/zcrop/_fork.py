"""Fork safety: zcrop's Rust side runs threads (IO, decoding, reads in flight), and a process
forked from one running them gets none of them, so zcrop would hang there. Rather than hang,
zcrop raises in such a child and says what to do (start workers with "spawn" or "forkserver",
or use zcrop in the parent only after forking)."""

from __future__ import annotations

import os

_started_in: int | None = None


def started() -> None:
    """Records that this process has started zcrop's threads (any open or read)."""
    global _started_in
    if _started_in is None:
        _started_in = os.getpid()
    elif _started_in != os.getpid():
        check()


def check() -> None:
    """Raises in a process forked from one where zcrop's threads were running."""
    if _started_in is not None and _started_in != os.getpid():
        raise RuntimeError(
            "zcrop was used in the parent process before this process was forked, and its "
            "threads do not survive fork(); start worker processes with the 'spawn' or "
            "'forkserver' method (e.g. DataLoader(..., multiprocessing_context='forkserver')), "
            "or use zcrop in the parent only after the workers are started"
        )
