"""Type stubs of zcrop's native module (``zcrop._zcrop``, Rust, pyo3).

The public API is the Python package (:mod:`zcrop`); these classes and functions are what it
calls. Results of reads are ``(words, nbytes)``: a ``uint64`` array owning the bytes (handed
over from Rust without a copy) and how many of its bytes are the result, native-endian, C order.
"""

from collections.abc import Callable, Sequence
from os import PathLike
from typing import Any, Final, Literal, TypeAlias, final, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "INLINE_WORK_BYTES",
    "NativeArray",
    "NativeBatch",
    "NativeFftJob",
    "NativeGroup",
    "NativeIcechunk",
    "NativeLoader",
    "NativeSampler",
    "Pending",
    "SourceView",
    "__version__",
    "bool_runs",
    "chunk_cache_usage",
    "cli_main",
    "counter_add",
    "fft_local",
    "icechunk_session_repository",
    "open_icechunk",
    "open_node",
    "read_crops_many",
    "spare_outputs",
    "submit_open",
    "window_any",
]

__version__: Final[str]
#: Reads that decode at most this many bytes run on the calling thread (GIL released).
INLINE_WORK_BYTES: Final[int]

#: One dimension of a selection: ``(start, len)`` or a 1-d ``uint64`` array of indices.
_DimSelection: TypeAlias = tuple[int, int] | npt.NDArray[np.uint64]
#: A read's result: the words owning the bytes, and the number of bytes.
_Words: TypeAlias = tuple[npt.NDArray[np.uint64], int]
#: Called from a zcrop thread (with the GIL) when background work is done: ``(error, value)``.
_Notify: TypeAlias = Callable[[BaseException | None, Any], object]

def cli_main(argv: Sequence[str]) -> int:
    """Runs the ``zcrop`` command line with ``argv`` (program name first); its exit code."""

def open_node(
    path: str | PathLike[str],
    storage_options: Sequence[tuple[str, str]] | None = None,
    chunk_cache: int | str | None = None,
) -> NativeArray | NativeGroup:
    """Opens the array or group at ``path`` (a local path or a URL, with ``storage_options``
    as ``(key, value)`` pairs for a URL); arrays keep decoded chunks in a cache of
    ``chunk_cache`` bytes (or a size such as ``"512M"``)."""

def read_crops_many(
    arrays: Sequence[NativeArray],
    origins: Sequence[npt.NDArray[np.uint64]],
    shapes: Sequence[Sequence[int]],
) -> list[_Words]:
    """Crops of several arrays read as one batch: per array, its ``(N, ndim)`` origins and
    crop shape; one result per array, as :meth:`NativeArray.read_crops` gives it."""

def counter_add(counters: npt.NDArray[np.int64], index: int, delta: int) -> int:
    """Adds ``delta`` to ``counters[index]`` atomically (acquire/release); the new value."""

def chunk_cache_usage() -> tuple[int, int] | None:
    """``(bytes held, budget)`` of the process-wide decoded-chunk cache; ``None`` where it is off."""

def spare_outputs() -> tuple[int, int]:
    """``(buffers, bytes)`` of the outputs of dropped arrays kept for reuse by later reads."""

def submit_open(
    path: str | PathLike[str],
    notify: _Notify,
    storage_options: Sequence[tuple[str, str]] | None = None,
    chunk_cache: int | str | None = None,
) -> Pending:
    """:func:`open_node` on a background thread; ``notify(error, node)`` when done."""

@final
class Pending:
    """Background work in flight."""

    def cancel(self) -> None:
        """Asks the work to stop; it then completes with ``zcrop.CancelledError``."""

    def cancelled(self) -> bool:
        """Whether cancellation was asked for."""

@final
class NativeArray:
    """An opened Zarr array (the Rust side of ``zcrop.Array``)."""

    @property
    def shape(self) -> list[int]:
        """The shape."""
    @property
    def chunk_shape(self) -> list[int]:
        """The shape of the chunks that are read and decoded (innermost when sharded)."""
    @property
    def shard_shape(self) -> list[int] | None:
        """The shard shape of a sharded array, else ``None``."""
    @property
    def numpy_dtype(self) -> str:
        """The numpy dtype string zarr-python reports: ``>u2`` for big-endian v2, ``<U5``,
        ``|S3``, ``<M8[ns]``, ``<m8[10s]`` for the fixed-size string and time types."""
    @property
    def data_type(self) -> str:
        """The Zarr v3 data type name."""
    @property
    def fill_value_bytes(self) -> bytes:
        """The fill value: one element, native-endian (UTF-32 code units of a ``<U``
        array, NUL-padded bytes of a ``|S`` array, int64 of a datetime64, NaT for a v2
        ``null`` one; the element's bytes for variable-length strings and bytes)."""
    @property
    def variable_kind(self) -> str | None:
        """``"utf8"`` or ``"bytes"`` for variable-length elements, ``None`` for fixed-size."""
    def read_variable(self, origin: Sequence[int], shape: Sequence[int]) -> list[Any]:
        """The variable-length elements of the box at ``origin`` of ``shape``, C order: a
        list of ``str`` (text) or ``bytes``."""
    @property
    def zarr_format(self) -> int:
        """2 or 3."""
    @property
    def name(self) -> str:
        """The path in the store, ``/``-rooted."""
    @property
    def path(self) -> str:
        """The path relative to the store root."""
    @property
    def dir(self) -> str:
        """The array's directory (for an object store: its key prefix in the bucket)."""
    @property
    def uri(self) -> str:
        """Where the array is: its directory, or its URL."""
    @property
    def storage_options(self) -> list[tuple[str, str]]:
        """The storage options the array was opened with."""
    @property
    def attributes_json(self) -> str:
        """The attributes as JSON."""
    @property
    def metadata_json(self) -> str:
        """The metadata as stored, as JSON."""
    @property
    def dimension_names(self) -> list[str | None] | None:
        """The v3 dimension names, if set."""
    @property
    def sharding_levels(self) -> int:
        """Number of sharding levels (0 when unsharded)."""
    @property
    def decoder(self) -> str:
        """How chunks are decoded, in words."""
    @overload
    def read(self, blocks: Sequence[Sequence[_DimSelection]], out: None = None) -> _Words:
        """Reads orthogonal selections, one output block each, into a new buffer."""
    @overload
    def read(
        self, blocks: Sequence[Sequence[_DimSelection]], out: npt.NDArray[np.uint8]
    ) -> None:
        """Reads orthogonal selections into ``out`` (contiguous, writable, exact size)."""
    @overload
    def read_points(self, coords: npt.NDArray[np.uint64], out: None = None) -> _Words:
        """Reads the elements at the rows of ``coords`` (``(N, ndim)``)."""
    @overload
    def read_points(self, coords: npt.NDArray[np.uint64], out: npt.NDArray[np.uint8]) -> None:
        """Reads the elements at the rows of ``coords`` into ``out``."""
    @overload
    def read_crops(
        self, origins: npt.NDArray[np.uint64], shape: Sequence[int], out: None = None
    ) -> _Words:
        """Reads crops of ``shape`` at the rows of ``origins`` as one planned batch."""
    @overload
    def read_crops(
        self, origins: npt.NDArray[np.uint64], shape: Sequence[int], out: npt.NDArray[np.uint8]
    ) -> None:
        """Reads crops of ``shape`` at the rows of ``origins`` into ``out``."""
    def missing_map(
        self, block: Sequence[_DimSelection], dtype: str, fills: list[float], keep: list[bool]
    ) -> tuple[npt.NDArray[np.bool_], list[int]]:
        """Which elements of ``block`` are NaN or a fill value, reduced over the axes not kept;
        tested as the read decodes them, never written out."""
    def submit_read(self, blocks: Sequence[Sequence[_DimSelection]], notify: _Notify) -> Pending:
        """:meth:`read` in the background; ``notify(error, words)``."""
    def submit_points(self, coords: npt.NDArray[np.uint64], notify: _Notify) -> Pending:
        """:meth:`read_points` in the background."""
    def submit_crops(
        self, origins: npt.NDArray[np.uint64], shape: Sequence[int], notify: _Notify
    ) -> Pending:
        """:meth:`read_crops` in the background."""

def open_icechunk(
    path: str | PathLike[str],
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    storage_options: Sequence[tuple[str, str]] | None = None,
    chunk_cache: int | str | None = None,
    virtual_chunk_containers: Sequence[tuple[str, Sequence[tuple[str, str]]]] | None = None,
) -> NativeIcechunk:
    """Opens one snapshot of an Icechunk repository."""

@final
class NativeIcechunk:
    """One snapshot of an Icechunk repository (the Rust side of ``zcrop.IcechunkSnapshot``)."""

    @property
    def id(self) -> str: ...
    @property
    def uri(self) -> str: ...
    def nodes(self) -> list[tuple[str, bool]]: ...
    def array(self, path: str) -> NativeArray: ...
    def get(self, path: str) -> NativeArray | NativeGroup: ...

def icechunk_session_repository(session: bytes) -> tuple[str, list[tuple[str, str]]]:
    """Where the repository of a serialized icechunk ``Session`` is: its path or URL and
    storage options."""

@final
class NativeGroup:
    """An opened Zarr group (the Rust side of ``zcrop.Group``)."""

    @property
    def name(self) -> str:
        """The path in the store, ``/``-rooted."""
    @property
    def path(self) -> str:
        """The path relative to the store root."""
    @property
    def zarr_format(self) -> int:
        """2 or 3."""
    @property
    def attributes_json(self) -> str:
        """The attributes as JSON."""
    @property
    def uri(self) -> str:
        """Where the group is: its directory, or its URL."""
    @property
    def is_consolidated(self) -> bool:
        """Whether the metadata is consolidated."""
    @property
    def skipped_consolidated_keys(self) -> list[str]:
        """Consolidated metadata keys no member can have, left out."""
    def get(self, path: str) -> NativeArray | NativeGroup:
        """Opens the member at ``path``."""
    def members(self) -> list[tuple[str, Literal["array", "group"]]]:
        """The direct members, sorted by name."""
    def submit_get(self, path: str, notify: _Notify) -> Pending:
        """:meth:`get` in the background."""
    def submit_members(self, notify: _Notify) -> Pending:
        """:meth:`members` in the background."""

@final
class NativeSampler:
    """A sampler without threads (the Rust side of ``zcrop.Samples``)."""

    def __new__(cls, spec: dict[str, Any]) -> NativeSampler:
        """Builds the sampler from a loader spec dict."""
    def read(self, step: int) -> list[npt.NDArray[np.uint64]]:
        """Reads batch ``step``: per source, 64-bit words holding its bytes at their start."""
    def plan(self, step: int) -> list[dict[str, Any]]:
        """The metadata of batch ``step``'s samples (no IO)."""
    @property
    def sources(self) -> list[dict[str, Any]]:
        """Per source: ``name``, ``array``, ``crop``, ``dtype``, ``element_size``,
        ``origins``."""
    @property
    def epoch_len(self) -> int:
        """Allowed sample positions."""
    @property
    def position_grid(self) -> list[int]:
        """The position grid fitted masks and weights refer to."""
    @property
    def position_box(self) -> tuple[list[int], list[int]]:
        """The valid position box: ``(start, end)``."""
    @property
    def position_blocks(self) -> int:
        """Number of disjoint boxes holding the allowed positions."""
    @property
    def position_bytes(self) -> int:
        """Heap bytes of the position space (blocks, lookup tables, masks' runs, weights)."""
    def allows(self, pos: list[int]) -> bool:
        """Whether the sampler may draw position ``pos``."""
    def positions(self, first: int, n: int) -> npt.NDArray[np.uint64]:
        """The positions of global samples ``first .. first + n``, flattened."""

@final
class NativeLoader:
    """A running loader over the sampler (the Rust side of ``zcrop.Loader``)."""

    def __new__(cls, spec: dict[str, Any]) -> NativeLoader:
        """Builds the sampler and starts the loader from a spec dict (see ``zcrop/_loader.py``)."""
    def next(self) -> NativeBatch | None:
        """The next batch in step order (GIL released, Ctrl-C honoured), ``None`` at the end."""
    def seek(self, step: int) -> None:
        """Restarts the stream at ``step``."""
    @property
    def next_step(self) -> int:
        """The step the next batch will be."""
    @property
    def position_grid(self) -> list[int]:
        """The position grid fitted masks and weights refer to."""
    @property
    def sources(self) -> list[dict[str, Any]]:
        """Per source: ``name``, ``array``, ``crop``, ``dtype``, ``element_size``."""
    @property
    def batch_size(self) -> int:
        """Samples per batch on this rank."""
    @property
    def epoch_len(self) -> int:
        """Allowed sample positions."""
    @property
    def position_box(self) -> tuple[list[int], list[int]]:
        """The valid position box."""
    @property
    def steps(self) -> tuple[int, int | None]:
        """The first step and the end step."""
    @property
    def pin_state(self) -> dict[str, Any]:
        """Whether the ring buffers are page-locked / CUDA-registered, and why not."""
    @property
    def buffer_bytes(self) -> int:
        """Bytes of one ring buffer."""
    @property
    def prefetch_depth(self) -> int:
        """Batches read ahead now."""
    def plan(self, step: int) -> list[dict[str, Any]]:
        """The metadata of batch ``step``'s samples, without reading."""

@final
class NativeBatch:
    """One batch: a ring buffer and the metadata of its samples."""

    @property
    def step(self) -> int:
        """The step."""
    def __len__(self) -> int:
        """Number of samples."""
    @property
    def num_sources(self) -> int:
        """Number of sources."""
    def dtype(self, s: int) -> str:
        """The delivered element type of source ``s`` (a v3 name, also a numpy name)."""
    def shape(self, s: int) -> list[int]:
        """``(batch_size, *crop)`` of source ``s``."""
    def view(self, s: int) -> SourceView:
        """A read-only buffer over source ``s``'s bytes (keeps the batch alive)."""
    def shared_memory(self) -> tuple[int, int, list[int]] | None:
        """With a ring mapped shared: ``(fd, file size, offset of each source's bytes)``."""
    def samples(self) -> list[dict[str, Any]]:
        """The metadata of every sample."""
    @property
    def read_time(self) -> float:
        """Seconds a worker took to plan and read this batch."""
    @property
    def stats(self) -> dict[str, int]:
        """What the reads of this batch did."""
    @property
    def pin_state(self) -> dict[str, Any]:
        """Whether this batch's buffer is page-locked / CUDA-registered."""

@final
class SourceView:
    """One source's bytes of a batch, exported read-only through the buffer protocol."""

    def __len__(self) -> int:
        """Number of bytes."""

def window_any(
    map: npt.NDArray[np.bool_], shape: list[int], windows: list[int]
) -> tuple[npt.NDArray[np.bool_], list[int]]:
    """Whether each window of a boolean map holds a True."""

def bool_runs(flags: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint64]:
    """The ``[start, end)`` runs of True of a flat boolean array, shape ``(n, 2)``."""

def fft_local(
    input: str | PathLike[str],
    output: str | PathLike[str],
    axis: int,
    memory_budget: int,
    norm: str,
    dtype: str,
    temp_dir: str | PathLike[str] | None = None,
    overwrite: bool = False,
    storage_options: list[tuple[str, str]] | None = None,
    input_storage_options: list[tuple[str, str]] | None = None,
    axis_name: str | None = None,
) -> dict[str, Any]:
    """The out-of-core FFT along ``axis`` in this process; returns its report."""

@final
class NativeFftJob:
    """A chunked FFT cut into tasks (``zcrop.fft``'s Dask and Cubed engines run them)."""

    @staticmethod
    def create(
        input: str | PathLike[str],
        output: str | PathLike[str],
        axis: int,
        memory_budget: int,
        norm: str,
        dtype: str,
        work_dir: str | PathLike[str],
        task_bytes: int,
        max_tasks: int,
        overwrite: bool,
        storage_options: list[tuple[str, str]] | None = None,
        input_storage_options: list[tuple[str, str]] | None = None,
        axis_name: str | None = None,
    ) -> tuple[NativeFftJob, int | None]: ...
    @staticmethod
    def from_json(
        json: str,
        storage_options: list[tuple[str, str]] | None = None,
        input_storage_options: list[tuple[str, str]] | None = None,
    ) -> NativeFftJob: ...
    def to_json(self) -> str: ...
    def stages(self) -> list[dict[str, Any]]: ...
    @property
    def strategy(self) -> str: ...
    @property
    def output(self) -> str: ...
    @property
    def work_dir(self) -> str: ...
    @property
    def output_chunks(self) -> list[int]: ...
    def done_in(self, stage: int) -> int: ...
    def check_access(self) -> None: ...
    def run_task(self, stage: int, task: int) -> dict[str, Any]: ...
    def finish(self) -> None: ...
