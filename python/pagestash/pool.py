"""PagePool and Record: pagestash's pool and records, in memory from PyTorch's allocator.

A pool is three uint8 tensors (control, device arena, host arena) and a page size; a record
is one uint8 tensor. torch.ops.pagestash reads and writes them; these classes make them,
keep them together, check the flags and read them back.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple, Union

import torch

from . import _C
from ._ops import ops
from .errors import FLAG_NAMES, PagingError, failed_flags
from .recipes import Shape, infer

Device = Union[str, torch.device]


def _aligned_bytes(nbytes: int, device: Device, pin_memory: bool = False, alignment: int = 256) -> torch.Tensor:
    """nbytes uint8 from PyTorch's allocator, the first byte aligned (a view of a slightly
    larger tensor, which it keeps alive)."""
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device, pin_memory=pin_memory)
    offset = (-raw.data_ptr()) % alignment
    return raw[offset:offset + nbytes]


class PagePool:
    """A pool of `device_pages` pages of `page_bytes` bytes (a power of two) on `device`
    ('cpu': the host executor; 'cuda[:n]': the CUDA executor on PyTorch's current stream),
    in tensors from PyTorch's allocator (so torch.cuda.memory_allocated counts it).

    `host_pages` are spill pages in pinned host memory (CUDA pools) or more host memory (CPU
    pools), used when the device pages run out.

    `strict`: whether a record's operations (and the hook's reloads) raise PagingError as
    soon as the pool's flags say a step failed. Checking reads the flags: free for a CPU
    pool (the default there), a synchronisation for a CUDA pool (off by default: use the
    sync-free loop, report() / agree() / decide(), or call check() where a sync is fine).
    """

    def __init__(self, device_pages: int, page_bytes: int = 64 << 10, host_pages: int = 0, device: Device = "cpu",
                 strict: Optional[bool] = None):
        self.device = torch.device(device)
        self.page_bytes = int(page_bytes)
        self.strict = self.device.type == "cpu" if strict is None else bool(strict)
        control, device_arena, host_arena = _C.pool_bytes(self.page_bytes, int(device_pages), int(host_pages))
        cuda = self.device.type == "cuda"
        self.control = _aligned_bytes(control, self.device)
        self.device_arena = _aligned_bytes(device_arena, self.device)
        if cuda and host_arena == 0:
            self.host_arena = torch.empty(0, dtype=torch.uint8, device=self.device)
        else:
            self.host_arena = _aligned_bytes(host_arena, "cpu", pin_memory=cuda)
        _C.init_pool(*self.state)
        #: The flags where the ops write them: int32 words (FLAG_NAMES gives their order),
        #: each 0 or 1, sticky until reset. agree() all-reduces them with MAX.
        self.flags = self.control[:4 * len(FLAG_NAMES)].view(torch.int32)

    @property
    def state(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(control, device arena, host arena, page bytes): the first four arguments of every op."""
        return (self.control, self.device_arena, self.host_arena, self.page_bytes)

    @property
    def config(self) -> Dict[str, int]:
        return dict(page_bytes=self.page_bytes, device_pages=self.device_pages, host_pages=self.host_pages)

    @property
    def device_pages(self) -> int:
        return self.device_arena.numel() // self.page_bytes

    @property
    def host_pages(self) -> int:
        return self.host_arena.numel() // self.page_bytes

    @property
    def nbytes(self) -> int:
        return self.control.numel() + self.device_arena.numel() + self.host_arena.numel()

    def pages_in_use(self) -> int:
        """Device and host pages held by records (reads the counters: synchronises)."""
        s = self.stats()
        return self.device_pages - s["device_pages_free"] + self.host_pages - s["host_pages_free"]

    def record(self, recipe: Optional[str] = None, shape: Optional[Shape] = None, *,
               like: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
               scales: str = "swizzled") -> "Record":
        """A record for one grouped tensor: of `recipe` and `shape`, or of the recipe and
        shape inferred from a tensor `like` its data (and `counts`, for a packed one; see
        pagestash.infer). Made once, outside any graph: it allocates."""
        if recipe is None or shape is None:
            if like is None:
                raise ValueError("pagestash: PagePool.record needs recipe= and shape=, or like= (a tensor to infer them from)")
            recipe, shape = infer(like, counts, recipe=recipe, shape=shape, scales=scales)
        return Record(self, recipe, shape)

    def stats(self) -> dict:
        """Flags and counters, read back (synchronises the device for a CUDA pool)."""
        return _C.pool_stats(*self.state)

    def report(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Writes the flags and counters into `out` (uint8, _C.report_bytes(), on the pool's
        device or pinned) on the current stream, without synchronising; returns it. Read it
        with decode_report(out) after the stream."""
        if out is None:
            out = torch.empty(_C.report_bytes(), dtype=torch.uint8, device=self.device)
        ops.report(*self.state, out)
        return out

    def reset(self) -> None:
        """Every page free, flags and counters cleared (graph-capturable). Records stashed
        before are stale: reloading one raises the `stale` flag."""
        ops.reset(*self.state)

    def end_step(self, streams: Sequence["torch.cuda.Stream"] = ()) -> None:
        """At the end of a step, after its last reload or discard: raises the `unbalanced`
        flag (misuse: a record of the step was neither reloaded nor discarded, its pages
        leak) when any page is still held, and counts them (`pages_held_at_step_end` in
        stats() and the report). Graph-capturable; call it before report() or agree().

        It counts what is held when it runs on the current stream: every other stream that
        reloaded or discarded in this step goes in `streams`, and the current stream waits
        for what each has enqueued so far (no host sync), so that its work is counted.
        Enqueue the next step's first stash after it."""
        streams = list(streams)
        if streams and self.device.type != "cuda":
            raise ValueError(f"end_step: streams are for a CUDA pool; this pool is on {self.device}")
        if streams:
            current = torch.cuda.current_stream(self.device)
            for s in streams:
                if s != current:
                    current.wait_stream(s)
        ops.end_step(*self.state)

    def flag_dict(self) -> Dict[str, int]:
        """Each flag by name, read back (synchronises for a CUDA pool)."""
        return dict(zip(FLAG_NAMES, (int(x) for x in self.flags.cpu())))

    def decide(self) -> str:
        """'keep', 'rerun_without_paging' or 'report_error', from the flags (reads them back:
        synchronises). After agree(), every rank decides the same."""
        return _C.decide([int(x) for x in self.flags.cpu()])

    def check(self, where: str = "") -> None:
        """Raises PagingError naming the raised flags when the step cannot be trusted
        (overflow, or any misuse); host spill is not a failure. Reads the flags:
        synchronises for a CUDA pool."""
        flags = self.flag_dict()
        failed = failed_flags(flags)
        if failed:
            raise PagingError(failed, _C.decide([flags[n] for n in FLAG_NAMES]), where)

    def agree(self, group=None) -> None:
        """All-reduces the flags with MAX over `group` (torch.distributed; the default
        group when None), in place in the pool's memory, so that every rank's decide()
        gives the same answer. In stream order without a host sync where the backend takes
        the pool's device (NCCL for a CUDA pool, Gloo or MPI for a CPU one); otherwise
        through a copy on a device the backend takes."""
        dist = torch.distributed
        backend = str(dist.get_backend(group)).lower()
        wants_cuda = "nccl" in backend and not any(b in backend for b in ("gloo", "mpi"))
        takes_device = ("nccl" in backend) if self.device.type == "cuda" else not wants_cuda
        if takes_device:
            dist.all_reduce(self.flags, op=dist.ReduceOp.MAX, group=group)
            return
        staged = self.flags.to("cuda" if wants_cuda else "cpu")
        dist.all_reduce(staged, op=dist.ReduceOp.MAX, group=group)
        self.flags.copy_(staged)


def decode_report(report: torch.Tensor) -> dict:
    """A report written by PagePool.report, as a dict (flags, counters and the decision)."""
    return _C.decode_report(report.cpu())


class Record:
    """What one stashed grouped tensor keeps between stash and reload, in a uint8 tensor on
    the pool's device: the counts, page ids, work plan, kept buffers (NVFP4's amax), its
    state and the id of its pool (every op checks it). Make it with PagePool.record."""

    def __init__(self, pool: PagePool, recipe: str, shape: Shape):
        if not isinstance(shape, Shape):
            raise ValueError(f"pagestash: shape must be a pagestash.Shape(groups, tokens, hidden), not {shape!r}")
        self.pool = pool
        self.recipe = recipe
        self.shape = shape
        nbytes = _C.record_bytes(*pool.state, recipe, list(shape))
        self.memory = _aligned_bytes(nbytes, pool.device)
        _C.init_record(*pool.state, self.memory, recipe, list(shape))

    def _args(self):
        return (*self.pool.state, self.memory, self.recipe, list(self.shape))

    def _checked(self, check: Optional[bool], op: str) -> None:
        if self.pool.strict if check is None else check:
            self.pool.check(f"at the {op} of a {self.recipe} record {tuple(self.shape)}")

    def stash(self, data: torch.Tensor, counts: torch.Tensor, scales: Optional[torch.Tensor] = None,
              amax: Optional[torch.Tensor] = None, *, check: Optional[bool] = None) -> None:
        """Moves the live bytes of (data, scales) into pages and keeps amax; `counts` (int32,
        one per group, on the pool's device) is read where the op runs, never on the host.
        With `check` (default: the pool's strict), raises PagingError when the pool's flags
        say the step failed."""
        ops.stash(*self._args(), data, counts, scales, amax)
        self._checked(check, "stash")

    def reload(self, data: torch.Tensor, scales: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
               *, zero_tail: bool = False, poison: bool = True, check: Optional[bool] = None) -> None:
        """Copies the stashed bytes into (data, scales, amax) and returns the pages; with
        zero_tail, every byte of the paged buffers outside the live rows is cleared. A reload
        that does not restore (docs/python.md, "Failures") fills data, scales and amax with
        poison, every byte 0xFF (NaN), unless `poison` is False. `check` as for stash."""
        ops.reload(*self._args(), data, scales, amax, zero_tail, poison)
        self._checked(check, "reload")

    def discard(self, *, check: Optional[bool] = None) -> None:
        """Returns the pages without copying."""
        ops.discard(*self._args())
        self._checked(check, "discard")

    def status(self) -> dict:
        """state ('empty', 'stashed', 'overflowed', 'failed', 'reloaded', 'discarded',
        'stale'), error, pages, live bytes (synchronises)."""
        return _C.record_status(*self.pool.state, self.memory, self.recipe, list(self.shape))
