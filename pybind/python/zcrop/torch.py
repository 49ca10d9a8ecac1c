"""``zcrop.torch``: zcrop's loader as a ``torch.utils.data.IterableDataset``.

Use it with ``DataLoader(dataset, batch_size=None)``: the dataset yields whole batches (a dict
of tensors, one per source, plus ``"meta"``, the per-sample metadata), already batched and
read ahead in the background by zcrop.

Workers: with ``num_workers=W > 0``, worker ``w`` yields this rank's batches ``w``,
``w + W``, ``w + 2W``, ... (its own zcrop loader reads them as consecutive steps of shard
``w * world_size + rank`` of ``world_size * W``), and the DataLoader's round robin delivers
them in order. The stream is the same for every ``W`` on every rank (batch ``i`` of rank ``r``
holds global samples ``(i * world_size + r) * batch_size ...``): no sample is duplicated or
lost, and results do not depend on the number of workers.

Buffers: in the main process (``num_workers=0``) tensors share memory with zcrop's read-only
ring buffers (no copy); do not modify them in place (``copy=True`` gives writable copies).
With workers, batches reach the main process without a copy too: a worker's loader maps its
ring buffers from memory files, torch maps each file once in both processes, and the tensors
the main process gets are views of the worker's ring. A worker refills a ring buffer only
once the main process has let go of every tensor over it; it has ``prefetch + 5`` buffers, and
when the main process holds more than 4 of its batches (a consumer that keeps many), it copies
the next ones out instead (into a few reused shared-memory slots, then torch's fresh shared
memory). Under torch's ``file_system`` sharing strategy every batch goes through the slots.
``pin_memory=True`` works as usual (torch copies into its own pinned memory). A worker's ring
buffers are not page-locked or registered with CUDA (``pin=True`` asks for it), so no worker
starts a CUDA context of its own.

Start methods: workers may start by ``fork`` (Linux's default before Python 3.14), ``spawn``
or ``forkserver``, whether or not this process used zcrop first; a forked worker starts its
own IO and decode threads on first use.

To the GPU: the ring buffers are page-locked and registered with CUDA, so a copy from them
with ``non_blocking=True`` is queued on a CUDA stream and runs later, while zcrop reuses a ring
buffer as soon as no array or tensor views it. A batch whose tensors were dropped before its
queued copy ran would be overwritten by a later batch first. So, in the main process, each
batch's tensors stay held after the consumer lets go of them, until the consumer's current
CUDA stream has run past the point where the consumer asked for the next batch (an event
recorded then). Before reading on, the dataset waits for the batch before the last one to get
there: the CPU runs at most one step ahead of the GPU's work in this stream. Copies made on
another stream are not covered. ``device="cuda"`` copies each batch itself instead, on a side
stream, and hands over device tensors; the consumer's stream waits for the copy, and the ring
buffer is held until the copy has completed. With workers, the tensors the main process gets
are views of the worker's ring that it keeps until the main process lets go of them, so none
of this applies.
"""

from __future__ import annotations

import collections
import functools
import os
import secrets
import warnings
import weakref
from collections.abc import Iterable, Iterator, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any, overload

import numpy as np
import torch
import torch.utils.data
from torch.multiprocessing.reductions import reduce_tensor

from zcrop._loader import Loader, _sources
from zcrop._zcrop import counter_add

__all__ = ["BatchMeta", "ZcropDataset"]


def _from_numpy(arr: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, also for ml_dtypes' bfloat16 (viewed as ``torch.bfloat16``)."""
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _tensor(arr: np.ndarray) -> torch.Tensor:
    if arr.flags.writeable:
        return _from_numpy(arr)
    with warnings.catch_warnings():
        # The batch's ring buffer is read-only for zcrop's sake: the tensor is a view of it.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return _from_numpy(arr)


def _shared_tensor(arr: np.ndarray) -> torch.Tensor:
    """A copy of ``arr`` in shared memory, for a DataLoader worker: the worker's queue pickles
    batches later, on its own thread (a view of a ring buffer would hold the buffer until then,
    ``prefetch_factor`` batches ahead), and a tensor already in shared memory pickles without
    the copy that torch would otherwise make then."""
    t = _from_numpy(np.empty(0, dtype=arr.dtype)).new_empty(arr.shape)
    t.share_memory_()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
    t.copy_(_tensor(arr))
    return t


# A carrier's header (a slot's first bytes, a ring buffer's page before its bytes), as int64
# words: tensors over it the worker sent, tensors over it the main process has let go of, 1
# once the worker is done with it, references to it the main process has received.
_SENT, _RELEASED, _RETIRED, _RECEIVED = range(4)
_SLOT_HEADER = 64
_SLOT_ALIGN = 64


def _slot_counters(data: np.ndarray) -> np.ndarray:
    return data[:32].view(np.int64)


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype[Any]:
    """The numpy dtype of ``dtype``'s bytes (bfloat16's: uint16)."""
    if dtype == torch.bfloat16:
        return np.dtype(np.uint16)
    return torch.empty(0, dtype=dtype).numpy().dtype


def _over(data: np.ndarray, dtype: torch.dtype,
          shape: tuple[int, ...]) -> tuple[np.ndarray, torch.Tensor]:
    """A tensor of ``dtype`` and ``shape`` over the bytes ``data``, and the array that its
    storage holds (alive exactly as long as some tensor over it)."""
    arr = data.view(_numpy_dtype(dtype)).reshape(shape)
    t = torch.from_numpy(arr)
    return arr, t.view(dtype) if dtype == torch.bfloat16 else t


class _SlotTensor(torch.Tensor):
    """A tensor over a DataLoader worker's shared memory (a batch slot of :class:`_SlotPool` or
    a ring buffer of :class:`_RingHandOff`, its *carrier*): it pickles as a reference to the
    carrier. Tensors derived from it are ordinary tensors."""

    # Ordinary tensors come out of torch operations on it.
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    _zcrop_slot: tuple[torch.Tensor, int, int]


def _slot_tensor(carrier: torch.Tensor, data: np.ndarray, offset: int, like: np.ndarray,
                 held: list[weakref.ref[np.ndarray]]) -> _SlotTensor:
    """A tensor of ``like``'s type and shape over ``carrier``'s bytes ``data`` at ``offset``,
    which pickles as a reference to the carrier; a weak reference to the array under it goes
    to ``held`` (that array lives exactly as long as some tensor over it)."""
    arr, t = _over(data[offset:offset + like.nbytes], _tensor(like).dtype, tuple(like.shape))
    held.append(weakref.ref(arr))
    view = t.as_subclass(_SlotTensor)
    view._zcrop_slot = (carrier, offset, like.nbytes)
    return view


def _carrier(data: torch.Tensor) -> torch.Tensor:
    """Marks a worker's shared tensor as a carrier: a key unique across processes, not sent yet."""
    data._zcrop_key = (os.getpid(), secrets.token_bytes(8))  # type: ignore[attr-defined]
    data._zcrop_sent = False  # type: ignore[attr-defined]
    return data


def _retire(carrier: torch.Tensor) -> None:
    """The worker sends nothing more over ``carrier``: the main process may forget it."""
    counter_add(_slot_counters(carrier.numpy()), _RETIRED, 1)


#: In the main process: the carriers received from workers, by key. A worker sends each carrier
#: itself once (torch passes its file descriptor, a round trip to the worker's resource sharer)
#: and its key after that.
_RECEIVED_CARRIERS: dict[tuple[int, bytes], torch.Tensor] = {}


def _reduce_slot(t: _SlotTensor) -> tuple[Any, tuple[Any, ...]]:
    carrier, offset, nbytes = t._zcrop_slot
    if (t.data_ptr() != carrier.data_ptr() + offset or not t.is_contiguous()
            or t.nbytes != nbytes):
        # Changed in place since (its storage moved, say): pickled the ordinary way.
        ordinary: tuple[Any, tuple[Any, ...]] = reduce_tensor(  # type: ignore[no-untyped-call]
            t.as_subclass(torch.Tensor)
        )
        return ordinary
    counter_add(_slot_counters(carrier.numpy()), _SENT, 1)
    key = carrier._zcrop_key  # type: ignore[attr-defined]
    first = not carrier._zcrop_sent  # type: ignore[attr-defined]
    carrier._zcrop_sent = True  # type: ignore[attr-defined]
    return _rebuild_slot, (key, carrier if first else None, offset, nbytes, t.dtype,
                           tuple(t.shape))


def _rebuild_slot(key: tuple[int, bytes], carrier: torch.Tensor | None, offset: int,
                  nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """In the main process: a tensor over a worker's carrier, mapped once and kept here until
    the worker has retired it and every reference it sent has arrived. When the last view of
    this tensor goes, the carrier's "let go" count goes up."""
    if carrier is None:
        carrier = _RECEIVED_CARRIERS.get(key)
        if carrier is None:
            raise RuntimeError(
                f"zcrop.torch: a batch from DataLoader worker process {key[0]} refers to shared "
                "memory this process never received (was the batch pickled outside the "
                "DataLoader?)"
            )
    elif key not in _RECEIVED_CARRIERS:
        _forget_retired_carriers()
        _RECEIVED_CARRIERS[key] = carrier
    data = carrier.numpy()
    counters = _slot_counters(data)
    counter_add(counters, _RECEIVED, 1)
    arr, t = _over(data[offset:offset + nbytes], dtype, shape)
    weakref.finalize(arr, counter_add, counters, _RELEASED, 1)
    return t


def _forget_retired_carriers() -> None:
    """Drops the carriers no reference can arrive for any more: retired by their worker (or the
    worker is gone) with every reference it sent received."""
    for key, carrier in list(_RECEIVED_CARRIERS.items()):
        counters = _slot_counters(carrier.numpy())
        done = counter_add(counters, _RECEIVED, 0) == counter_add(counters, _SENT, 0)
        if done and (counter_add(counters, _RETIRED, 0) or not _alive(key[0])):
            del _RECEIVED_CARRIERS[key]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


ForkingPickler.register(_SlotTensor, _reduce_slot)


class _SlotPool:
    """A DataLoader worker's batch slots in shared memory, reused from batch to batch.

    torch sends a worker's tensors to the main process in a fresh shared-memory segment each,
    whose pages both processes fault in anew every batch: on fast codecs more CPU than reading
    the batch. Here the worker copies each batch into a free slot (one segment, mapped once by
    both processes) and yields tensors over it that pickle as (slot, offset, shape). A slot is
    free again once the worker holds no tensor over it and the main process has let go of as
    many as the worker sent (its header's counts). With no slot free and ``max_slots`` made (a
    consumer that holds many batches), :meth:`put` returns None and the batch goes the
    ordinary way.
    """

    def __init__(self, max_slots: int = 8) -> None:
        self.max_slots = max_slots
        #: Per slot: the shared segment, its bytes, and the arrays the worker's tensors hold.
        self.slots: list[tuple[torch.Tensor, np.ndarray, list[weakref.ref[np.ndarray]]]] = []

    def _free(self, slot: int, size: int) -> bool:
        carrier, data, held = self.slots[slot]
        if carrier.numel() < size or any(r() is not None for r in held):
            return False
        counters = _slot_counters(data)
        return counter_add(counters, _SENT, 0) == counter_add(counters, _RELEASED, 0)

    def put(self, arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor] | None:
        """Tensors over a free slot holding copies of ``arrays``; None if there is none."""
        offsets, size = [], _SLOT_HEADER
        for a in arrays.values():
            offsets.append(size)
            size += -(-a.nbytes // _SLOT_ALIGN) * _SLOT_ALIGN
        slot = next((i for i in range(len(self.slots)) if self._free(i, size)), None)
        if slot is None:
            if len(self.slots) >= self.max_slots:
                return None
            carrier = torch.empty(size, dtype=torch.uint8)
            carrier.share_memory_()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
            data = carrier.numpy()
            data[:_SLOT_HEADER] = 0  # counts from 0: torch.empty left the bytes as found
            self.slots.append((_carrier(carrier), data, []))
            slot = len(self.slots) - 1
        carrier, data, held = self.slots[slot]
        held.clear()
        out: dict[str, torch.Tensor] = {}
        for (name, a), offset in zip(arrays.items(), offsets):
            out[name] = _slot_tensor(carrier, data, offset, a, held)
            out[name].copy_(_tensor(a))
        return out

    def retire(self) -> None:
        """Sends nothing more over the slots."""
        for carrier, _, _ in self.slots:
            _retire(carrier)


#: Ring buffers a DataLoader worker's loader has beyond those it reads ahead, and how many of
#: its batches the main process may hold at once before the worker copies batches out.
_RING_SPARE = 5


def _ring_hand_off() -> bool:
    """Whether a worker can hand its ring buffers over: torch shares tensors by file descriptor
    (its default on Linux) and can map a memory file it is given."""
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    return strategy == "file_descriptor" and hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")


class _RingHandOff:
    """A DataLoader worker's batches handed to the main process in its loader's ring buffers.

    The loader maps each ring buffer from a memory file (``shared_memory=True``); the worker
    maps the file into a torch tensor once and yields tensors over it, which pickle as
    (file, offset, shape) like slots do. The file's first page holds the carrier's counts. The worker keeps the batch, so its loader cannot
    refill the buffer, until it holds no tensor over it and the main process has let go of as
    many as the worker sent. It keeps at most ``hold`` batches: with more, :meth:`put` returns
    None and the batch goes the copying way, so the loader always has buffers to read ahead.
    """

    def __init__(self, hold: int) -> None:
        self.hold = hold
        #: Per memory file (by descriptor, open while the loader lives): the tensor over it.
        self.files: dict[int, torch.Tensor] = {}
        #: Per batch kept: the batch, the counts of its file, the arrays its tensors hold.
        self.kept: list[tuple[Any, np.ndarray, list[weakref.ref[np.ndarray]]]] = []

    def release(self) -> None:
        """Lets go of the kept batches the main process is done with (their buffers go back
        to the loader)."""
        self.kept = [
            k for k in self.kept
            if any(r() is not None for r in k[2])
            or counter_add(k[1], _SENT, 0) != counter_add(k[1], _RELEASED, 0)
        ]

    def put(self, batch: Any, arrays: dict[str, np.ndarray],
            memory: tuple[int, int, list[int]] | None) -> dict[str, torch.Tensor] | None:
        """Tensors over the ring buffer that holds ``arrays`` (keeping ``batch``); None if the
        buffer is not shared or ``hold`` batches are kept already."""
        if memory is None or len(self.kept) >= self.hold:
            return None
        fd, size, offsets = memory
        carrier = self.files.get(fd)
        if carrier is None:
            storage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)  # type: ignore[attr-defined]
            carrier = _carrier(torch.empty(0, dtype=torch.uint8).set_(storage))
            self.files[fd] = carrier
        data = carrier.numpy()
        out: dict[str, torch.Tensor] = {}
        held: list[weakref.ref[np.ndarray]] = []
        for (name, a), offset in zip(arrays.items(), offsets):
            out[name] = _slot_tensor(carrier, data, offset, a, held)
        self.kept.append((batch, _slot_counters(data), held))
        return out

    def retire(self) -> None:
        """Sends nothing more over the ring."""
        for carrier in self.files.values():
            _retire(carrier)


def _wait_all(held: collections.deque[tuple[torch.cuda.Event, list[torch.Tensor]]]) -> None:
    """Waits for each held batch's event, oldest first, and lets go of the batch."""
    while held:
        done, _ = held.popleft()
        done.synchronize()


class _DeviceCopier:
    """Copies batches of host tensors to one CUDA device, on a side stream.

    The consumer's current stream waits for each copy (an event), and the device tensors are
    recorded as used on it, so torch's allocator keeps them for as long as it may read them. The
    host tensors (views of a ring buffer) are held until their copy has completed:
    :meth:`release` waits for the copies queued so far and drops them. It waits for the copies
    alone, not for the consumer's work, since they run on their own stream.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        self.held: collections.deque[tuple[torch.cuda.Event, list[torch.Tensor]]] = (
            collections.deque()
        )

    def copy(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        consumer = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.stream):
            out = {k: v.to(self.device, non_blocking=True) for k, v in tensors.items()}
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        consumer.wait_event(done)
        for t in out.values():
            t.record_stream(consumer)
        self.held.append((done, list(tensors.values())))
        return out

    def release(self) -> None:
        _wait_all(self.held)


class _StreamGuard:
    """Holds each batch's host tensors until the consumer's CUDA stream has run past it.

    When the consumer asks for batch ``k + 1`` it has queued its work on batch ``k``, its copy to
    the GPU included: an event recorded then on its current stream completes after that copy.
    :meth:`before_next` records it and holds batch ``k`` until it completes, and first waits for
    the events of older batches, so that while the next batch is read at most one batch is held:
    the one the consumer itself still holds.
    """

    def __init__(self) -> None:
        self.last: list[torch.Tensor] | None = None
        self.held: collections.deque[tuple[torch.cuda.Event, list[torch.Tensor]]] = (
            collections.deque()
        )

    def handed_over(self, tensors: dict[str, torch.Tensor]) -> None:
        self.last = list(tensors.values())

    def before_next(self) -> None:
        _wait_all(self.held)
        # A consumer that has not used CUDA through torch has queued no copy (and torch is not
        # made to start CUDA for it).
        initialized = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        if self.last is not None and initialized:
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(torch.cuda.current_stream())
            self.held.append((done, self.last))
        self.last = None

    def release(self) -> None:
        """Waits until nothing held can still be read by queued work, and lets go of it."""
        self.before_next()
        _wait_all(self.held)


def _cuda_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device (or None for host tensors), got {dev}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r}: CUDA is not available to torch")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class BatchMeta:
    """A batch's per-sample metadata, ``batch["meta"]`` of :class:`ZcropDataset`.

    It reads like the list of dicts :class:`zcrop.Loader` gives (``len``, indexing, iteration,
    ``==`` with such a list); :meth:`tolist` gives that list. It is not a
    ``collections.abc.Sequence``, so torch's ``default_convert``, which
    ``DataLoader(batch_size=None)`` applies to every batch, passes it through unchanged: it
    would otherwise copy every dict of every sample and fail on time labels (numpy
    datetime64), which torch cannot make tensors of.
    """

    __slots__ = ("_samples",)

    def __init__(self, samples: Iterable[dict[str, Any]]) -> None:
        self._samples = list(samples)

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._samples)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        return self._samples[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchMeta):
            return self._samples == other._samples
        if isinstance(other, list):
            return self._samples == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable contents, like a list

    def __repr__(self) -> str:
        return f"BatchMeta({self._samples!r})"

    def __reduce__(self) -> tuple[type[BatchMeta], tuple[list[dict[str, Any]]]]:
        return BatchMeta, (self._samples,)

    def tolist(self) -> list[dict[str, Any]]:
        """The samples' metadata as a list (a new list of the same dicts)."""
        return list(self._samples)


class ZcropDataset(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Batches of random crops for ``torch.utils.data.DataLoader(ds, batch_size=None)``.

    Takes the arguments of :class:`zcrop.Loader` (``sources``, ``batch_size``, ``seed``,
    ``prefetch``, transforms through the sources...). ``rank`` / ``world_size`` default to
    ``torch.distributed``'s when it is initialised. ``steps`` is the number of batches of
    this rank (``len(dataset)``); ``start`` the index of the first batch, for resuming
    (:meth:`state_dict` / :meth:`load_state_dict` hold it). Each yielded batch's ``"batch"``
    entry (and each sample's ``meta["step"]``) is its index in this rank's stream; its
    ``"meta"`` is a :class:`BatchMeta`, the Loader's list of per-sample dicts.

    ``device`` (a CUDA device, ``num_workers=0`` only): yield tensors on that device, copied
    from the pinned ring buffers on a side stream, each ring buffer held until its copy has
    completed (see the module's notes on why a plain ``non_blocking`` copy is not enough).
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
        device: Any = None,
        **loader_kwargs: Any,
    ) -> None:
        super().__init__()
        self.device = _cuda_device(device)
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
        #: The next batch the consumer has not received yet, when iterated in this process.
        self._next = self.start
        #: In a DataLoader worker: (worker id, workers).
        self._worker: tuple[int, int] | None = None
        #: A worker's state to resume from: (its next batch, workers).
        self._resume: tuple[int, int] | None = None
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
        """Where this copy of the dataset is: ``{"start": k}``, the first batch not yet handed
        over (saved after batch ``k - 1``, it resumes at ``k``) when iterated in this process
        (``num_workers=0``). In a DataLoader worker the state is that worker's
        (``"next"``: the next batch it yields, of ``"workers"``), which torchdata's
        ``StatefulDataLoader`` collects from each worker and gives back to it: its
        ``state_dict()`` / ``load_state_dict()`` resume the whole stream exactly. A plain
        ``DataLoader`` with workers iterates copies, and this object does not move: save
        ``{"start": batch["batch"] + 1}`` instead."""
        state = {"start": self._next}
        if self._worker is not None:
            state["next"], state["workers"] = self._next, self._worker[1]
        return state

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at batch ``state["start"]`` (takes effect for the next iterator); a
        worker's state (see :meth:`state_dict`) resumes that worker."""
        self.start = self._next = int(state["start"])
        self._resume = (int(state["next"]), int(state["workers"])) if "next" in state else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        if self.device is not None and info is not None:
            raise RuntimeError(
                f"ZcropDataset(device={str(self.device)!r}) copies to the GPU in the process "
                "that iterates it: use num_workers=0 (zcrop reads in parallel on its own), or "
                "device=None with pin_memory=True"
            )
        # This worker yields this rank's batches start + worker, start + worker + W, ...: batch
        # i is step i // W of shard (i % W) * world + rank of world * W: the same samples as
        # step i of shard rank of world (whatever W), and the worker's steps are consecutive.
        first = self.start + worker
        if self._resume is not None and self._resume[1] == workers:
            first = self._resume[0]  # this worker's next batch, as its saved state says
        self._worker = None if info is None else (worker, workers)
        self._next = first
        if self.steps is not None and first >= self.steps:
            return
        count = None if self.steps is None else -(-(self.steps - first) // workers)
        copier = None if self.device is None else _DeviceCopier(self.device)
        kwargs = dict(self.loader_kwargs)
        ring = None
        if info is not None:
            # A worker's batches leave through shared memory: locking its ring buffers would
            # only spend RLIMIT_MEMLOCK, and registering them would start a CUDA context (GPU
            # memory) in every worker.
            kwargs.setdefault("pin", False)
            if _ring_hand_off():
                prefetch = kwargs.get("prefetch", "auto")
                depth = 2 if prefetch == "auto" else int(prefetch)
                kwargs.setdefault("buffers", depth + _RING_SPARE)
                kwargs["shared_memory"] = True
                ring = _RingHandOff(hold=max(0, int(kwargs["buffers"]) - depth - 1))
        loader = Loader(
            self.sources,
            batch_size=self.batch_size,
            rank=(first % workers) * self.world_size + self.rank,
            world_size=self.world_size * workers,
            start_step=first // workers,
            steps=count,
            copy=self.copy and info is None,
            **kwargs,
        )
        slots = _SlotPool()
        guard = None
        if copier is None and info is None and not self.copy:
            if loader.pin_state["cuda_registered"]:
                guard = _StreamGuard()
        try:
            with loader:
                k = -1
                while True:
                    if guard is not None:
                        guard.before_next()
                    memory = None
                    if ring is None:
                        batch = next(loader, None)
                    else:
                        ring.release()
                        got = loader._next_with_memory()
                        batch, memory = (None, None) if got is None else got
                    if batch is None:
                        break
                    k += 1
                    arrays = {name: value for name, value in batch.items() if name != "meta"}
                    slotted = None if ring is None else ring.put(batch, arrays, memory)
                    if slotted is None and info is not None:
                        slotted = slots.put(arrays)
                    if slotted is not None:
                        tensors = slotted
                    else:
                        convert = _tensor if info is None else _shared_tensor
                        tensors = {name: convert(value) for name, value in arrays.items()}
                    del arrays, slotted
                    if copier is not None:
                        # The last batch's ring buffer is freed here at the earliest, once its
                        # copy has completed.
                        copier.release()
                        tensors = copier.copy(tensors)
                    elif guard is not None:
                        guard.handed_over(tensors)
                    index = first + k * workers
                    for m in batch["meta"]:
                        m["step"] = index  # the batch's index in this rank's stream, whatever W
                    out: dict[str, Any] = {
                        **tensors, "meta": BatchMeta(batch["meta"]), "batch": index
                    }
                    del tensors
                    # Set before handing over: a checkpoint taken while the consumer holds
                    # this batch resumes after it.
                    self._next = index + workers
                    yield out
                    # Not held here while the next batch is read (a ring hand-off keeps the
                    # batch itself until the main process is done with it).
                    del out, batch
        finally:
            slots.retire()
            if ring is not None:
                ring.retire()
            # Queued copies must not outlive the memory they read.
            if copier is not None:
                copier.release()
            if guard is not None:
                guard.release()
