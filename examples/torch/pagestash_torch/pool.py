"""PagePool and Record: pagestash's pool and records, in memory from PyTorch's allocator.

A pool is three uint8 tensors (control, device arena, host arena) and a page size; a record
is one uint8 tensor. torch.ops.pagestash reads and writes them; these classes make them,
keep them together and read them back.
"""

from dataclasses import dataclass

import torch

from . import _C
from ._ops import ops

FLAG_NAMES = tuple(_C.flag_names())  # the order of the flag words (pagestash/pool/flags.hpp)


def recipes():
    """The recipe names this build instantiates, e.g. 'bf16/capacity', 'nvfp4/packed/swizzled'."""
    return list(_C.recipes())


def recipe(family, placement="capacity", scales="swizzled"):
    """The name of a recipe: family 'plain', 'bf16', 'fp16', 'mxfp8' or 'nvfp4'; placement
    'packed' or 'capacity'; scales 'compact' or 'swizzled' (MXFP8 and NVFP4 only)."""
    if family == "plain":
        name = "plain"
    elif family in ("bf16", "fp16"):
        name = f"{family}/{placement}"
    else:
        name = f"{family}/{placement}/{scales}"
    if name not in _C.recipes():
        raise ValueError(f"pagestash: no recipe {name!r} (known: {', '.join(_C.recipes())})")
    return name


@dataclass(frozen=True)
class Shape:
    """A grouped tensor's shape as pagestash sees it: max_tokens (packed: rows in all;
    capacity: rows per group), hidden (elements per token; for 'plain': bytes per row) and
    groups (experts)."""

    max_tokens: int
    hidden: int
    groups: int = 1


def recipe_info(name, shape):
    """Each buffer's bytes for `shape`, the count alignment and the token granule."""
    return _C.recipe_info(name, shape.max_tokens, shape.hidden, shape.groups)


def _aligned_bytes(nbytes, device, pin_memory=False, alignment=256):
    """nbytes uint8 from PyTorch's allocator, the first byte aligned (a view of a slightly
    larger tensor, which it keeps alive)."""
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device, pin_memory=pin_memory)
    offset = (-raw.data_ptr()) % alignment
    return raw[offset:offset + nbytes]


class PagePool:
    """A pool of fixed-size pages on `device` ('cpu': the host executor; 'cuda[:n]': the CUDA
    executor on PyTorch's current stream), in tensors from PyTorch's allocator (so
    torch.cuda.memory_allocated counts it).

    host_pages are spill pages in pinned host memory (CUDA pools) or more host memory (CPU
    pools), used when the device pages run out.
    """

    def __init__(self, device_pages, page_bytes=64 << 10, host_pages=0, device="cpu"):
        self.device = torch.device(device)
        self.page_bytes = int(page_bytes)
        control, device_arena, host_arena = _C.pool_bytes(self.page_bytes, int(device_pages), int(host_pages))
        cuda = self.device.type == "cuda"
        self.control = _aligned_bytes(control, self.device)
        self.device_arena = _aligned_bytes(device_arena, self.device)
        if cuda and host_arena == 0:
            self.host_arena = torch.empty(0, dtype=torch.uint8, device=self.device)
        else:
            self.host_arena = _aligned_bytes(host_arena, "cpu", pin_memory=cuda)
        _C.init_pool(*self.state)
        # The flags where the ops write them: 8 int32 words, each 0 or 1, sticky until reset
        # (FLAG_NAMES gives their order). All-reduce them with MAX to agree across ranks.
        self.flags = self.control[:32].view(torch.int32)

    @property
    def state(self):
        """(control, device arena, host arena, page bytes): what reset and report take; the
        other ops take the three parts first and the page size after the record."""
        return (self.control, self.device_arena, self.host_arena, self.page_bytes)

    @property
    def config(self):
        return dict(page_bytes=self.page_bytes, device_pages=self.device_pages, host_pages=self.host_pages)

    @property
    def device_pages(self):
        return self.device_arena.numel() // self.page_bytes

    @property
    def host_pages(self):
        return self.host_arena.numel() // self.page_bytes

    @property
    def nbytes(self):
        return self.control.numel() + self.device_arena.numel() + self.host_arena.numel()

    def pages_in_use(self):
        """Device and host pages held by records (reads the counters: synchronises)."""
        s = self.stats()
        return self.device_pages - s["device_pages_free"] + self.host_pages - s["host_pages_free"]

    def record(self, recipe_name, shape):
        """A record for one grouped tensor of `shape` in recipe `recipe_name`."""
        return Record(self, recipe_name, shape)

    def stats(self):
        """Flags and counters, read back (synchronises the device for a CUDA pool)."""
        return _C.pool_stats(*self.state)

    def report(self, out=None):
        """Writes the flags and counters into `out` (uint8, _C.report_bytes(), on the pool's
        device or pinned) on the current stream, without synchronising; returns it. Read it
        with decode_report(out.cpu()) after the stream."""
        if out is None:
            out = torch.empty(_C.report_bytes(), dtype=torch.uint8, device=self.device)
        ops.report(*self.state, out)
        return out

    def reset(self):
        """Every page free, flags and counters cleared (graph-capturable). Records stashed
        before are stale."""
        ops.reset(*self.state)

    def decide(self):
        """'keep', 'rerun_without_paging' or 'report_error', from the flags (reads them back:
        synchronises). After an all-reduce of `flags`, every rank decides the same."""
        return _C.decide([int(x) for x in self.flags.cpu()])

    def flag_dict(self):
        return dict(zip(FLAG_NAMES, (int(x) for x in self.flags.cpu())))


def decode_report(report):
    """A report written by PagePool.report, as a dict (flags, counters and the decision)."""
    return _C.decode_report(report.cpu())


class Record:
    """What one stashed grouped tensor keeps between stash and reload, in a uint8 tensor on the
    pool's device: the counts, page ids, work plan, kept buffers (NVFP4's amax) and state."""

    def __init__(self, pool, recipe_name, shape):
        self.pool = pool
        self.recipe = recipe_name
        self.shape = shape
        nbytes = _C.record_bytes(*pool.state, recipe_name, shape.max_tokens, shape.hidden, shape.groups)
        self.memory = _aligned_bytes(nbytes, pool.device)
        _C.init_record(*pool.state, recipe_name, shape.max_tokens, shape.hidden, shape.groups, self.memory)

    def _args(self):
        s = self.shape
        return (*self.pool.state[:3], self.memory, self.recipe, self.pool.page_bytes, s.max_tokens, s.hidden, s.groups)

    def stash(self, data, counts, scales=None, amax=None):
        """Moves the live bytes of (data, scales) into pages and keeps amax; `counts` (int32,
        one per group, on the pool's device) is read where the op runs, never on the host."""
        ops.stash(*self._args(), data, scales, amax, counts)

    def reload(self, data, scales=None, amax=None, zero_tail=False):
        """Copies the stashed bytes into (data, scales, amax) and returns the pages; with
        zero_tail, every byte of the paged buffers outside the live rows is cleared."""
        ops.reload(*self._args(), data, scales, amax, zero_tail)

    def discard(self):
        """Returns the pages without copying."""
        ops.discard(*self._args())

    def status(self):
        """state ('empty', 'stashed', 'overflowed', 'failed', 'reloaded', 'discarded',
        'stale'), error, pages, live bytes (synchronises)."""
        s = self.shape
        return _C.record_status(*self.pool.state[:3], self.pool.page_bytes, self.recipe, s.max_tokens, s.hidden,
                                s.groups, self.memory)
