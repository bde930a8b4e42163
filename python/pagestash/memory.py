"""A pool's memory, apart from its steps: who owns the bytes, how many pages they hold, and
how they grow and shrink. One interface (PoolMemory), two owners, chosen once when the pool
is made (PoolMemory.make):

- TorchMemory: a fixed pool, its three parts (control, device arena, host arena) tensors from
  PyTorch's allocator (torch.cuda.memory_allocated counts them); it never changes size.
- ReservedMemory: a pool with a reserve, whose memory the library maps as it grows (the
  extension's ReservedPool owns it; its parts are tensors over that memory, each keeping it
  alive); PyTorch's allocator sees none of it.

The words (docs/design.md, Glossary): the *reserve* (`device_reserve`, `host_reserve`) is the
most pages a pool may have, its page ids; the *pages* (`device_pages`, `host_pages`) are those
it has now, backed by memory, free or held; the pages *held* are those records hold now
(PagePool.pages_held(), which reads the device's counters).
"""

from __future__ import annotations

import numbers
from typing import Dict, Optional, Tuple, Union

import torch

from . import _C

Device = Union[str, torch.device]


def aligned_bytes(nbytes: int, device: Device, pin_memory: bool = False, alignment: int = 256) -> torch.Tensor:
    """nbytes uint8 from PyTorch's allocator, the first byte aligned (a view of a slightly
    larger tensor, which it keeps alive)."""
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device, pin_memory=pin_memory)
    offset = (-raw.data_ptr()) % alignment
    return raw[offset:offset + nbytes]


def reserve_pages(nbytes: Optional[int], page_bytes: int, what: str) -> int:
    """A reserve given in bytes (PagePool's `reserve_bytes`, `host_reserve_bytes`), as whole pages (0: none)."""
    if nbytes is None:
        return 0
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes <= 0:
        raise ValueError(f"pagestash: PagePool's {what} = {nbytes!r} must be a positive number of bytes, or None")
    return -(-int(nbytes) // page_bytes) if page_bytes > 0 else 0


class PoolMemory:
    """The memory of one pool: its parts as uint8 tensors (`control`, `device_arena`,
    `host_arena`) and `page_bytes`; the pages it has and its reserve; grow and shrink.
    Made once per pool memory (PoolMemory.make); a pool that reallocates gets a new one, and
    a record keeps the one it was made for (a record of another memory is another pool's)."""

    #: Who owns the bytes: 'pytorch' (PyTorch's allocator) or 'pagestash' (the library maps them).
    allocator = ""
    control: torch.Tensor
    device_arena: torch.Tensor
    host_arena: torch.Tensor
    page_bytes: int

    @staticmethod
    def make(device: torch.device, page_bytes: int, device_pages: int, host_pages: int, device_reserve: int = 0,
             host_reserve: int = 0) -> "PoolMemory":
        """TorchMemory without a reserve, ReservedMemory with one (pages, as PoolConfig's device_reserve and
        host_reserve: 0 is none)."""
        if device_reserve or host_reserve:
            return ReservedMemory(device, page_bytes, device_pages, host_pages, device_reserve, host_reserve)
        return TorchMemory(device, page_bytes, device_pages, host_pages)

    @property
    def state(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(control, device arena, host arena, page bytes): the first four arguments of every op."""
        return (self.control, self.device_arena, self.host_arena, self.page_bytes)

    @property
    def device_pages(self) -> int:
        """The device pages the pool has now (backed, free or held)."""
        raise NotImplementedError

    @property
    def host_pages(self) -> int:
        raise NotImplementedError

    @property
    def device_reserve(self) -> int:
        """The most device pages the pool may have (its page ids): the arena's pages."""
        return self.device_arena.numel() // self.page_bytes

    @property
    def host_reserve(self) -> int:
        return self.host_arena.numel() // self.page_bytes

    @property
    def growable(self) -> bool:
        """Whether grow() and shrink() may change its pages (a reserve)."""
        return False

    def reserve_bytes(self) -> Dict[str, int]:
        """PagePool's reserve arguments for a pool of this memory: {} without a reserve."""
        return {}

    def memory(self) -> Dict[str, Union[int, str]]:
        """What it costs now, in bytes: control_bytes, device_bytes and host_bytes (backed), device_reserved_bytes
        and host_reserved_bytes (address space, backed or not), and `allocator`. No sync."""
        raise NotImplementedError

    def can_change_pages(self, what: str) -> None:
        """Raises ValueError naming PagePool.`what` when grow and shrink cannot change its pages (no reserve)."""
        if not self.growable:
            raise ValueError(f"pagestash: PagePool.{what}: this pool has no reserve (make it with PagePool(..., "
                             "reserve_bytes=...)); a fixed pool changes size by reallocate(sizing)")

    def grow(self, device_pages: int, host_pages: int) -> None:
        """To `device_pages` and `host_pages` in all, within the reserve, in the pool's stream order."""
        self.can_change_pages("grow")

    def shrink(self, device_pages: int, host_pages: int) -> None:
        """To `device_pages` and `host_pages`, every page back (else ValueError, nothing changed)."""
        self.can_change_pages("shrink")


class TorchMemory(PoolMemory):
    """A fixed pool's memory, from PyTorch's allocator: its pages are its reserve."""

    allocator = "pytorch"

    def __init__(self, device: torch.device, page_bytes: int, device_pages: int, host_pages: int):
        self.page_bytes = page_bytes
        control, device_arena, host_arena = _C.pool_bytes(page_bytes, device_pages, host_pages)
        cuda = device.type == "cuda"
        self.control = aligned_bytes(control, device)
        self.device_arena = aligned_bytes(device_arena, device)
        if cuda and host_arena == 0:
            self.host_arena = torch.empty(0, dtype=torch.uint8, device=device)
        else:
            self.host_arena = aligned_bytes(host_arena, "cpu", pin_memory=cuda)
        _C.init_pool(*self.state)

    @property
    def device_pages(self) -> int:
        return self.device_reserve

    @property
    def host_pages(self) -> int:
        return self.host_reserve

    def memory(self) -> Dict[str, Union[int, str]]:
        d, h = self.device_arena.numel(), self.host_arena.numel()
        return dict(control_bytes=self.control.numel(), device_bytes=d, host_bytes=h, device_reserved_bytes=d,
                    host_reserved_bytes=h, allocator=self.allocator)


class ReservedMemory(PoolMemory):
    """A pool with a reserve: the extension's ReservedPool maps its memory as it grows (the arenas'
    tensors span the reserve; only the pages it has are backed, and only the ops read them)."""

    allocator = "pagestash"

    def __init__(self, device: torch.device, page_bytes: int, device_pages: int, host_pages: int,
                 device_reserve: int, host_reserve: int):
        self.page_bytes = page_bytes
        if device.type == "cuda" and device.index is None:  # the library's pool lives on one device: name it
            device = torch.device("cuda", torch.cuda.current_device())
        self.reserved = _C.reserved_pool(page_bytes, device_pages, host_pages, device_reserve, host_reserve,
                                         str(device))
        self.control, self.device_arena, self.host_arena = self.reserved.parts()

    @property
    def device_pages(self) -> int:
        return self.reserved.device_pages

    @property
    def host_pages(self) -> int:
        return self.reserved.host_pages

    @property
    def growable(self) -> bool:
        return True

    def reserve_bytes(self) -> Dict[str, int]:
        return dict(reserve_bytes=self.device_reserve * self.page_bytes,
                    host_reserve_bytes=self.host_reserve * self.page_bytes)

    def memory(self) -> Dict[str, Union[int, str]]:
        return {**self.reserved.memory(), "allocator": self.allocator}

    def grow(self, device_pages: int, host_pages: int) -> None:
        self.reserved.grow(device_pages, host_pages)

    def shrink(self, device_pages: int, host_pages: int) -> None:
        self.reserved.shrink(device_pages, host_pages)
