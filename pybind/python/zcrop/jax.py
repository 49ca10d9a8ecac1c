"""``zcrop.jax``: zcrop's loader as an iterator of jax arrays, sharded by JAX process.

Each process reads its share of every global batch: rank ``jax.process_index()`` of
``jax.process_count()``. Arrays are handed to jax without a copy where jax can alias host
memory (``jax.dlpack`` / ``device_put`` of a suitably aligned numpy array on the CPU backend;
zcrop's ring buffers are page-aligned); jax arrays are immutable, and they keep the batch's
ring buffer alive as long as they alias it. On accelerators ``device_put`` copies to the device;
jax keeps the host array (and so the ring buffer) until the copy is done, and lets go of it only
at its next transfer. :class:`JaxLoader` waits for the last batch's copies before it reads the
next batch, so that jax then holds one batch, as a consumer holding its last batch does (without
the wait, jax could hold two, and a loader of ``prefetch + 1`` buffers would stop with "all
batch buffers are held").
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np

from zcrop._loader import Loader

__all__ = ["JaxLoader", "to_jax"]


def to_jax(arr: np.ndarray, device: Any = None) -> jax.Array:
    """A numpy array as a jax array on ``device`` (default: the default device)."""
    out: jax.Array = jax.device_put(arr, device)
    return out


class JaxLoader:
    """Batches of random crops as jax arrays: a dict with one ``(batch_size, *crop)`` array per
    source and ``"meta"`` (per-sample metadata, plain Python).

    Takes :class:`zcrop.Loader`'s arguments; ``rank`` / ``world_size`` default to
    ``jax.process_index()`` / ``jax.process_count()``. ``device`` is where arrays go (default
    device when ``None``). :meth:`state_dict` / :meth:`load_state_dict` resume at a step.
    """

    def __init__(
        self,
        sources: Any,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        device: Any = None,
        **loader_kwargs: Any,
    ) -> None:
        self.rank = jax.process_index() if rank is None else int(rank)
        self.world_size = jax.process_count() if world_size is None else int(world_size)
        self.device = device
        self.loader = Loader(sources, rank=self.rank, world_size=self.world_size, **loader_kwargs)
        self._last: list[jax.Array] = []

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self

    def __next__(self) -> dict[str, Any]:
        jax.block_until_ready(self._last)  # type: ignore[no-untyped-call]
        self._last = []
        batch = next(self.loader)
        out: dict[str, Any] = {
            name: to_jax(value, self.device) for name, value in batch.items() if name != "meta"
        }
        self._last = list(out.values())
        out["meta"] = batch["meta"]
        return out

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, int]:
        """The loader's state (the next step and what a resumed loader must match)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at ``state["step"]``."""
        self.loader.load_state_dict(state)

    def close(self) -> None:
        """Stops the background reads."""
        self.loader.close()
