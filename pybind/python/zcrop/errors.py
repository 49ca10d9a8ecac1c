"""zcrop's exceptions: the whole tree, declared in this one file.

Every error raised by zcrop's native code is a :class:`ZcropError`. Each class also derives
from the builtin exception a plain ``except`` clause would expect, so code written for
zarr-python or numpy keeps working:

============================  =================================================================
class                         raised when
============================  =================================================================
:class:`NodeNotFoundError`    no Zarr array or group at a path (also a :class:`FileNotFoundError`)
:class:`NodeTypeError`        a group where an array was expected, or the reverse (also a
                              :class:`FileNotFoundError` and a :class:`ValueError`, like
                              zarr-python's errors for the same case)
:class:`MetadataError`        metadata that is not valid JSON or not valid Zarr (also a
                              :class:`ValueError`)
:class:`UnsupportedError`     a codec, data type or feature zcrop cannot read (also a
                              :class:`NotImplementedError`)
:class:`BoundsError`          a selection outside the array (also an :class:`IndexError`)
:class:`InvalidArgumentError` a bad argument, e.g. an ``out=`` buffer of the wrong size (also a
                              :class:`ValueError`)
:class:`StoreError`           reading the store failed: permissions, IO errors, truncated files
                              (also an :class:`OSError`)
:class:`CodecError`           chunk bytes that do not decode (corrupt, truncated, bad checksum)
:class:`ShardIndexError`      a corrupt shard index, or one pointing outside its shard (a
                              :class:`CodecError`)
:class:`OutOfMemoryError`     no memory for a chunk, a read buffer or an output (also a
                              :class:`MemoryError`)
:class:`TransformError`       a transform failed on a block
:class:`CancelledError`       a read was cancelled
:class:`LoaderError`          a loader cannot go on, e.g. the consumer holds every batch buffer
                              (also a :class:`RuntimeError`)
:class:`InternalError`        a bug in zcrop (a Rust panic, caught before it reached Python)
============================  =================================================================

:class:`StoreError`, :class:`CodecError` and :class:`ShardIndexError` carry ``node`` (the array's
path in its store), ``key`` (the store key) and ``byte_range`` (``(start, stop)`` or ``None``)
attributes; their message names all three.

Ctrl-C during a read raises the usual :class:`KeyboardInterrupt`.
"""

from __future__ import annotations

__all__ = [
    "BoundsError",
    "CancelledError",
    "CodecError",
    "InternalError",
    "InvalidArgumentError",
    "LoaderError",
    "MetadataError",
    "NodeNotFoundError",
    "NodeTypeError",
    "OutOfMemoryError",
    "ShardIndexError",
    "StoreError",
    "TransformError",
    "UnsupportedError",
    "ZcropError",
]


class ZcropError(Exception):
    """Base class of every error zcrop raises."""


class NodeNotFoundError(ZcropError, FileNotFoundError):
    """No Zarr array or group at the path (a :class:`FileNotFoundError`)."""


class NodeTypeError(NodeNotFoundError, ValueError):
    """A group where an array was expected, or the reverse.

    Also a :class:`FileNotFoundError` ("no array there") and a :class:`ValueError`, the two
    types zarr-python raises for this case.
    """


class MetadataError(ZcropError, ValueError):
    """Metadata that is not valid JSON or not valid Zarr metadata (a :class:`ValueError`)."""


class UnsupportedError(ZcropError, NotImplementedError):
    """A codec, data type or feature that zcrop cannot read (a :class:`NotImplementedError`)."""


class BoundsError(ZcropError, IndexError):
    """A selection outside the array (an :class:`IndexError`)."""


class InvalidArgumentError(ZcropError, ValueError):
    """A bad argument, such as an ``out=`` buffer of the wrong size (a :class:`ValueError`)."""


class StoreError(ZcropError, OSError):
    """Reading the store failed (an :class:`OSError`).

    Attributes ``node``, ``key`` and ``byte_range`` say where.
    """

    node: str | None
    key: str | None
    byte_range: tuple[int, int] | None


class CodecError(ZcropError):
    """Chunk bytes that do not decode: corrupt, truncated, or failing their checksum.

    Attributes ``node``, ``key`` and ``byte_range`` say where.
    """

    node: str | None
    key: str | None
    byte_range: tuple[int, int] | None


class ShardIndexError(CodecError):
    """A shard index that is corrupt or points outside its shard."""


class OutOfMemoryError(ZcropError, MemoryError):
    """The memory for a chunk, a read buffer or an output could not be had (a
    :class:`MemoryError`): the process's address-space limit (``ulimit -v``, common on HPC
    batch nodes) or the machine's memory is smaller than what the read needs. The message says
    what needed how many bytes, and where.
    """

    node: str | None
    key: str | None
    byte_range: tuple[int, int] | None


class TransformError(ZcropError):
    """A transform failed on a block."""


class CancelledError(ZcropError):
    """A read was cancelled before it finished."""


class LoaderError(ZcropError, RuntimeError):
    """A loader cannot go on, e.g. the consumer holds every batch buffer of its ring (drop a
    batch, or use ``copy=True``). A batch whose read failed raises the read's own error."""


class InternalError(ZcropError):
    """A bug in zcrop: a Rust panic, caught before it could reach Python. Please report it."""
