"""``zcrop.Group`` and ``zcrop.AsyncGroup``: zarr-python's read API for groups."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any, Union

from zcrop._array import Array, AsyncArray, Attributes, _Node, await_native
from zcrop._zcrop import NativeArray, NativeGroup
from zcrop.errors import NodeNotFoundError

__all__ = ["AsyncGroup", "Group"]

Node = Union[Array, "Group"]
AsyncNode = Union[AsyncArray, "AsyncGroup"]


def wrap(native: NativeArray | NativeGroup) -> Array | Group:
    """A sync ``Array`` or ``Group`` around a native node."""
    if isinstance(native, NativeArray):
        return Array(native)
    return Group(native)


def wrap_async(native: NativeArray | NativeGroup) -> AsyncArray | AsyncGroup:
    """An ``AsyncArray`` or ``AsyncGroup`` around a native node."""
    if isinstance(native, NativeArray):
        return AsyncArray(native)
    return AsyncGroup(native)


class _GroupBase(_Node):
    __slots__ = ()

    _native: NativeGroup

    def __init__(self, native: NativeGroup) -> None:
        self._native = native
        self._attrs = None
        skipped = native.skipped_consolidated_keys
        if skipped:
            warnings.warn(
                f"zcrop: group {native.uri}: consolidated metadata has entries no member can "
                f"have, left out: {', '.join(map(repr, skipped))}",
                stacklevel=4,
            )

    @property
    def metadata(self) -> dict[str, Any]:
        """The group's metadata: ``zarr_format``, ``node_type``, ``attributes``, and whether it
        is ``consolidated``."""
        return {
            "zarr_format": self.zarr_format,
            "node_type": "group",
            "attributes": self.attrs.asdict(),
            "consolidated": bool(self._native.is_consolidated),
        }

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


def _child(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


class Group(_GroupBase):
    """A Zarr group opened for reading, with zarr-python's read API: ``group[name]`` (nested
    paths allowed), ``name in group``, iteration over member names, :meth:`members`,
    :meth:`arrays`, :meth:`groups` and their ``*_keys``/``*_values`` variants."""

    __slots__ = ()

    def __getitem__(self, path: str) -> Array | Group:
        """The member at ``path`` (a name or a ``/``-separated path); ``KeyError`` if absent."""
        if not isinstance(path, str):
            raise TypeError(f"group members are named by strings, got {type(path)!r}")
        try:
            return wrap(self._native.get(path))
        except NodeNotFoundError:
            raise KeyError(path) from None

    def get(self, path: str, default: Any = None) -> Any:
        """The member at ``path``, or ``default``."""
        try:
            return self[path]
        except KeyError:
            return default

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self.get(path) is not None

    def _member_kinds(self) -> list[tuple[str, str]]:
        return [(str(n), str(k)) for n, k in self._native.members()]

    def keys(self) -> Iterator[str]:
        """The direct members' names, sorted."""
        return iter([n for n, _ in self._member_kinds()])

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def __len__(self) -> int:
        return len(self._member_kinds())

    def members(self, max_depth: int | None = 0) -> tuple[tuple[str, Array | Group], ...]:
        """``(name, node)`` pairs sorted by name: direct members for ``max_depth=0``, nested
        ones down to ``max_depth`` more levels (all for ``None``) with ``/``-joined names."""
        out: list[tuple[str, Array | Group]] = []
        self._collect(out, "", max_depth)
        return tuple(out)

    def _collect(self, out: list[tuple[str, Array | Group]], prefix: str, depth: int | None) -> None:
        for name, _ in self._member_kinds():
            node = self[name]
            out.append((_child(prefix, name), node))
            if isinstance(node, Group) and (depth is None or depth > 0):
                node._collect(out, _child(prefix, name), None if depth is None else depth - 1)

    def nmembers(self, max_depth: int | None = 0) -> int:
        """The number of members (see :meth:`members`)."""
        return len(self.members(max_depth))

    def arrays(self) -> Iterator[tuple[str, Array]]:
        """``(name, array)`` for each member array."""
        for name, kind in self._member_kinds():
            if kind == "array":
                node = self[name]
                assert isinstance(node, Array)
                yield name, node

    def groups(self) -> Iterator[tuple[str, Group]]:
        """``(name, group)`` for each member group."""
        for name, kind in self._member_kinds():
            if kind == "group":
                node = self[name]
                assert isinstance(node, Group)
                yield name, node

    def array_keys(self) -> Iterator[str]:
        """The member arrays' names."""
        return iter([n for n, k in self._member_kinds() if k == "array"])

    def group_keys(self) -> Iterator[str]:
        """The member groups' names."""
        return iter([n for n, k in self._member_kinds() if k == "group"])

    def array_values(self) -> Iterator[Array]:
        """The member arrays."""
        return (a for _, a in self.arrays())

    def group_values(self) -> Iterator[Group]:
        """The member groups."""
        return (g for _, g in self.groups())


class AsyncGroup(_GroupBase):
    """A Zarr group opened from asyncio: ``await group.getitem(name)``, ``async for`` over
    :meth:`members`, :meth:`keys`, :meth:`arrays`, :meth:`groups`."""

    __slots__ = ()

    async def getitem(self, path: str) -> AsyncArray | AsyncGroup:
        """The member at ``path``; ``KeyError`` if absent."""
        try:
            return wrap_async(await await_native(self._native.submit_get, path))
        except NodeNotFoundError:
            raise KeyError(path) from None

    async def get(self, path: str, default: Any = None) -> Any:
        """The member at ``path``, or ``default``."""
        try:
            return await self.getitem(path)
        except KeyError:
            return default

    async def contains(self, path: str) -> bool:
        """Whether there is a member at ``path``."""
        return (await self.get(path)) is not None

    async def _member_kinds(self) -> list[tuple[str, str]]:
        return [(str(n), str(k)) for n, k in await await_native(self._native.submit_members)]

    async def nmembers(self) -> int:
        """The number of direct members."""
        return len(await self._member_kinds())

    async def members(self) -> AsyncIterator[tuple[str, AsyncArray | AsyncGroup]]:
        """``(name, node)`` for each direct member, sorted by name."""
        for name, _ in await self._member_kinds():
            yield name, await self.getitem(name)

    async def keys(self) -> AsyncIterator[str]:
        """The direct members' names, sorted."""
        for name, _ in await self._member_kinds():
            yield name

    async def arrays(self) -> AsyncIterator[tuple[str, AsyncArray]]:
        """``(name, array)`` for each member array."""
        for name, kind in await self._member_kinds():
            if kind == "array":
                node = await self.getitem(name)
                assert isinstance(node, AsyncArray)
                yield name, node

    async def groups(self) -> AsyncIterator[tuple[str, AsyncGroup]]:
        """``(name, group)`` for each member group."""
        for name, kind in await self._member_kinds():
            if kind == "group":
                node = await self.getitem(name)
                assert isinstance(node, AsyncGroup)
                yield name, node

    async def array_keys(self) -> AsyncIterator[str]:
        """The member arrays' names."""
        for name, kind in await self._member_kinds():
            if kind == "array":
                yield name

    async def group_keys(self) -> AsyncIterator[str]:
        """The member groups' names."""
        for name, kind in await self._member_kinds():
            if kind == "group":
                yield name
