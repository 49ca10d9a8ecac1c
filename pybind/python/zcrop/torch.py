"""``zcrop.torch``: zcrop's loader as a ``torch.utils.data.IterableDataset``.

Use it with ``DataLoader(dataset, batch_size=None)``: the dataset yields whole batches (a dict
of tensors, one per source, plus ``"meta"``, the per-sample metadata), already batched and
read ahead in the background by zcrop.

Workers: with ``num_workers=W > 0`` each DataLoader worker runs its own zcrop loader on its own
share of every batch (shard ``rank * W + w`` of ``world_size * W``), and the DataLoader's
round-robin delivers them in order. On a single rank the stream of samples is the same for
every ``W`` (batch ``i`` holds global samples ``i * batch_size ...``): no sample is duplicated
or lost, and results do not depend on the number of workers.

Buffers: in the main process (``num_workers=0``) tensors share memory with zcrop's read-only
ring buffers (no copy); do not modify them in place (``copy=True`` gives writable copies).
With workers, torch moves tensors to shared memory to send them to the main process.
``pin_memory=True`` works as usual (torch copies into its own pinned memory).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.utils.data

from zcrop._loader import Loader, _sources

__all__ = ["ZcropDataset"]


def _tensor(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return torch.from_numpy(arr)
    with warnings.catch_warnings():
        # The batch's ring buffer is read-only for zcrop's sake: the tensor is a view of it.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


class ZcropDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Batches of random crops for ``torch.utils.data.DataLoader(ds, batch_size=None)``.

    Takes the arguments of :class:`zcrop.Loader` (``sources``, ``batch_size``, ``seed``,
    ``prefetch``, transforms through the sources...). ``rank`` / ``world_size`` default to
    ``torch.distributed``'s when it is initialised. ``steps`` is the number of batches of
    this rank (``len(dataset)``); ``start`` the index of the first batch, for resuming
    (:meth:`state_dict` / :meth:`load_state_dict` hold it). Each yielded batch's ``"batch"``
    entry (and each sample's ``meta["step"]``) is its index in this rank's stream.
    """

    def __init__(
        self,
        sources: Any,
        *,
        batch_size: int,
        steps: int | None = None,
        start: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        copy: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        _sources(sources)  # validate early, in the main process
        if rank is None or world_size is None:
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
        self.sources = sources
        self.batch_size = int(batch_size)
        self.steps = None if steps is None else int(steps)
        self.start = int(start)
        self.rank = 0 if rank is None else int(rank)
        self.world_size = 1 if world_size is None else int(world_size)
        self.copy = bool(copy)
        self.loader_kwargs = dict(loader_kwargs)
        for key in ("start_step", "shard"):
            if key in self.loader_kwargs:
                raise TypeError(f"{key} is set by ZcropDataset (use start=)")

    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("an endless dataset (steps=None) has no length")
        return max(0, self.steps - self.start)

    def state_dict(self) -> dict[str, int]:
        """The index of the next batch to read; pass the last seen ``batch["batch"] + 1``
        to :meth:`load_state_dict` to resume after it."""
        return {"start": self.start}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at batch ``state["start"]`` (takes effect for the next iterator)."""
        self.start = int(state["start"])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        # This worker yields this rank's batches start + worker, start + worker + W, ...: batch
        # i is step i // W of shard rank * W + i % W, so the worker's steps are consecutive.
        first = self.start + worker
        if self.steps is not None and first >= self.steps:
            return
        count = None if self.steps is None else -(-(self.steps - first) // workers)
        loader = Loader(
            self.sources,
            batch_size=self.batch_size,
            rank=self.rank * workers + first % workers,
            world_size=self.world_size * workers,
            start_step=first // workers,
            steps=count,
            copy=self.copy,
            **self.loader_kwargs,
        )
        with loader:
            for k, batch in enumerate(loader):
                out: dict[str, Any] = {
                    name: _tensor(value) for name, value in batch.items() if name != "meta"
                }
                index = first + k * workers
                for m in batch["meta"]:
                    m["step"] = index  # the batch's index in this rank's stream, whatever W
                out["meta"] = batch["meta"]
                out["batch"] = index
                yield out
