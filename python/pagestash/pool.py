"""PagePool and Record: pagestash's pool and records.

A pool is three uint8 tensors (control, device arena, host arena) and a page size, held by its
memory (memory.py: from PyTorch's allocator for a fixed pool, mapped by the library for a pool
with a reserve), and its step log (steplog.py: the step from begin to decision, and the observed
counts); a record is one uint8 tensor from PyTorch's allocator. torch.ops.pagestash reads and
writes them; these classes make them, keep them together, check the flags and read them back.
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
import os
import sys
import warnings
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch

from . import _C
from ._ops import ops
from .errors import (FLAG_CATEGORIES, FLAG_NAMES, OverflowRateWarning, PagingError, UnpagedStepsWarning, failed_flags,
                     raise_after_backward)
from .memory import Device, PoolMemory, aligned_bytes, reserve_pages
from .recipes import Shape, compression_of, infer
from .steplog import StepLog
_log = logging.getLogger("pagestash")


def _graph_break_for_check() -> None:
    """Under torch.compile a strict check reads the flags on the host, between two graphs:
    the graph break says so (fullgraph=True raises it)."""
    msg = ("pagestash: a strict check reads the pool's flags on the host, between two graphs: inside "
           "torch.compile(fullgraph=True), pass check=False (or PagePool(strict=False)) and call pool.check() "
           "after the compiled region")
    try:
        torch._dynamo.graph_break(msg=msg)
    except TypeError:  # torch before graph_break(msg): a graph break all the same
        torch._dynamo.graph_break()


_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel, from the function that calls this, of the first frame outside the
    package: the user's call, whether it went through decide() or run_step()."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE:
        frame, level = frame.f_back, level + 1
    return level


class PagePool:
    """A pool of `device_pages` pages of `page_bytes` bytes (a power of two) on `device`
    ('cpu': the host executor; 'cuda[:n]': the CUDA executor on PyTorch's current CUDA stream).
    Without a reserve its memory comes from PyTorch's allocator (so torch.cuda.memory_allocated
    counts it); with one, the library maps it (memory() says which: `allocator`).

    `host_pages` are spill pages in pinned host memory (CUDA pools) or more host memory (CPU
    pools), used when the device pages run out.

    `strict`: whether a record's operations (and the hook's reloads) raise PagingError as
    soon as the pool's flags say a step failed. Checking reads the flags: free for a CPU
    pool (the default there), a synchronisation for a CUDA pool (off by default: use the
    sync-free loop, report() / agree() / decide(), or call check() where a sync is fine).

    `overflow_target`: the per-step overflow probability the pool was sized for
    (PoolSizing.pool() passes the sizing's target); decide() warns (OverflowRateWarning) once
    the steps overflow far more often. None: no such check.

    `reserve_bytes`: a pool that grows. The most bytes its device pages may ever take, held as
    address space (rounded up to whole pages): its reserve; grow() and shrink() change the pages
    between steps and no page, tensor or captured CUDA graph moves (docs/python.md, "A pool that
    grows"). Its memory is the library's, not PyTorch's allocator's: memory() counts it.
    `host_reserve_bytes`: the same for the host pages (a CUDA pool's spill: pinned host memory
    the library registers for the device as it grows).

    Its memory (`memory_owner`, a pagestash.memory.PoolMemory, chosen here once: TorchMemory or
    ReservedMemory) and its step (`step_log`, a pagestash.StepLog) are objects of their own.
    """

    #: What auto_resize() makes: pagestash.AutoResize, which resizing.py sets when it is imported (the package
    #: imports it). The auto-resizer sizes with size_pool, whose PoolSizing.pool() makes PagePools: this module
    #: imports neither, so that no import cycle runs through the pool.
    auto_resize_policy = None

    def __init__(self, device_pages: int, page_bytes: int = 64 << 10, host_pages: int = 0, device: Device = "cpu",
                 strict: Optional[bool] = None, overflow_target: Optional[float] = None,
                 reserve_bytes: Optional[int] = None, host_reserve_bytes: Optional[int] = None):
        self.device = torch.device(device)
        self.strict = self.device.type == "cpu" if strict is None else bool(strict)
        #: Cumulative over the pool's life (reset() and reallocate() keep them, unlike the device
        #: counters): steps decide() counted, those whose decision was not 'keep', reruns
        #: count_rerun() counted.
        self.steps = 0
        self.overflowed_steps = 0
        self.reruns = 0
        #: The steps in a row, up to the last decided, whose decision was not 'keep' (each reruns unpaged; 0 after a
        #: kept step): a pool that stops paging warns (UnpagedStepsWarning) at the 3rd and every 10th after.
        self.unpaged_streak = 0
        self._streak_before = 0  # before the step decided last (a step decided again replaces its own)
        self._target(overflow_target)
        #: The step, as the user says it (docs/python.md, "What a step is"): from begin_step() to decide();
        #: PagedStep and run_step begin and decide theirs. The step log holds it, and the observed counts.
        self.step_log = StepLog()
        self._auto = None  # auto_resize()'s policy
        #: Each change of the pool's pages: dicts of step, old and new (device_pages, host_pages), and why.
        self.resizes: List[dict] = []
        reserve = [reserve_pages(b, int(page_bytes), what) for b, what in
                   ((reserve_bytes, "reserve_bytes"), (host_reserve_bytes, "host_reserve_bytes"))]
        self._allocate(PoolMemory.make(self.device, int(page_bytes), int(device_pages), int(host_pages), *reserve))

    def _allocate(self, memory: PoolMemory) -> None:
        """The pool's memory from now on (records of the memory before are another pool's)."""
        #: The pool's memory (pagestash.memory.PoolMemory): its parts, pages, reserve; grow and shrink.
        self.memory_owner = memory
        #: The flags where the ops write them: int32 words (FLAG_NAMES gives their order),
        #: each 0 or 1, sticky until reset. agree() all-reduces them with MAX.
        self.flags = self.control[:4 * len(FLAG_NAMES)].view(torch.int32)
        # Which operation first raised a failure flag (the flags are sticky: a later
        # operation's check sees them too). _first: that operation once found, until
        # reset; _unread: (first, last, count) of the operations run since the flags were
        # last read clean. A CPU pool reads them after each operation (free), so it knows
        # the operation; a CUDA pool knows the range when it next reads them.
        self._first: Optional[str] = None
        self._unread: Optional[Tuple[str, str, int]] = None

    def __deepcopy__(self, memo) -> "PagePool":
        """A new, empty pool of the same config, device and strictness, with its own id (a
        byte copy would share the id, and each pool would take the other's records)."""
        reserve = {k: v or None for k, v in self.memory_owner.reserve_bytes().items()}
        return PagePool(self.device_pages, self.page_bytes, self.host_pages, self.device, self.strict, **reserve)

    def __copy__(self) -> "PagePool":
        """The same pool (its memory shared): it takes the original's records."""
        alias = object.__new__(PagePool)
        alias.__dict__.update(self.__dict__)
        return alias

    def __reduce_ex__(self, protocol):
        """Refused: a pickled pool (torch.save too) would come back with this pool's id, and each
        pool would take the other's records and pages."""
        raise TypeError(f"pagestash: a PagePool ({self.device_pages} device pages of {self.page_bytes} bytes on "
                        f"{self.device}) cannot be pickled or saved: the copy would keep its id, and take its records. "
                        "Save its config (pool.config) and make a new pool from it, or copy.deepcopy(pool) for an "
                        "empty pool with its own id")

    def _ran(self, operation: str) -> None:
        """Notes that `operation` (e.g. 'the stash of a bf16/capacity record (2, 32, 64)')
        was enqueued on the pool, for PagingError's `first`. Not inside torch.compile: traced
        code may not change Python state (a higher-order op, as autograd.Function, refuses it)."""
        if self._first is not None or torch.compiler.is_compiling():
            return
        first, _, count = self._unread or (operation, operation, 0)
        self._unread = (first, operation, count + 1)
        if self.device.type == "cpu" and not torch.compiler.is_compiling():  # reading them would break the graph
            self.flag_dict()

    def _note(self, flags: Dict[str, int]) -> None:
        """Flags just read: the first failure's operation, from the operations since the
        last clean read."""
        failed = failed_flags(flags)
        if not failed:
            self._unread = None
        elif self._first is None:
            if self._unread is None:
                where = ("no operation of this pool since its flags were last read clean (a raw "
                         "torch.ops.pagestash op, or a write to pool.flags)")
            elif self._unread[2] == 1:
                where = self._unread[0]
            else:
                where = (f"one of the {self._unread[2]} operations from {self._unread[0]} to {self._unread[1]} "
                         "(a CUDA pool reads its flags only when asked: check() after an operation to know which)")
            self._first = where

    # --- its memory (memory_owner): parts, pages, reserve, grow and shrink -------------------------------------

    @property
    def page_bytes(self) -> int:
        return self.memory_owner.page_bytes

    @property
    def control(self) -> torch.Tensor:
        return self.memory_owner.control

    @property
    def device_arena(self) -> torch.Tensor:
        """The device pages' bytes, at the reserve's size (a pool with a reserve backs only its pages)."""
        return self.memory_owner.device_arena

    @property
    def host_arena(self) -> torch.Tensor:
        return self.memory_owner.host_arena

    @property
    def state(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """(control, device arena, host arena, page bytes): the first four arguments of every op."""
        return self.memory_owner.state

    @property
    def config(self) -> Dict[str, int]:
        """page_bytes, device_pages and host_pages; with a reserve, reserve_bytes and host_reserve_bytes too: what
        PagePool(**config) takes (a pool that grew is made at the pages it has now)."""
        return dict(page_bytes=self.page_bytes, device_pages=self.device_pages, host_pages=self.host_pages,
                    **self.memory_owner.reserve_bytes())

    @property
    def device_pages(self) -> int:
        """The device pages it has now, backed, free or held (a pool that grows: as grow() and shrink() left
        them); pages_held() counts those records hold, device_reserve the most it may have."""
        return self.memory_owner.device_pages

    @property
    def host_pages(self) -> int:
        """The host pages it has now (as device_pages)."""
        return self.memory_owner.host_pages

    @property
    def device_reserve(self) -> int:
        """The most device pages it may have (grow()'s limit, its page ids): the reserve, or device_pages for a
        pool without one."""
        return self.memory_owner.device_reserve

    @property
    def host_reserve(self) -> int:
        return self.memory_owner.host_reserve

    @property
    def growable(self) -> bool:
        """Whether it has a reserve (grow(), shrink(), resize_in_place(), auto_resize())."""
        return self.memory_owner.growable

    @property
    def nbytes(self) -> int:
        """Bytes of memory the pool holds now (memory(): by part)."""
        m = self.memory()
        return m["control_bytes"] + m["device_bytes"] + m["host_bytes"]

    def memory(self) -> Dict[str, Union[int, str]]:
        """What the pool's memory costs now, in bytes: control_bytes, device_bytes and host_bytes (backed by
        physical memory: a reserve's in whole 2 MiB granules), device_reserved_bytes and host_reserved_bytes (address
        space, backed or not), and `allocator`: 'pytorch' (torch.cuda.memory_allocated counts the pool) or
        'pagestash' (a pool with a reserve: PyTorch's allocator sees none of it). No sync."""
        return self.memory_owner.memory()

    def grow(self, device_pages: Optional[int] = None, host_pages: Optional[int] = None, *,
             why: str = "grow() called", level: int = logging.INFO) -> None:
        """Gives a pool with a reserve `device_pages` and `host_pages` in all (None: as it has), no fewer than it has
        and none beyond the reserve: backs their memory, then adds their ids to the free pages, in the pool's CUDA
        stream order (a CPU pool: now). Records, tensors and captured CUDA graphs stay valid; a graph replayed after
        it may take the new pages. Not inside an open step (between begin_step() and decide(), or a PagedStep:
        RuntimeError), nor while a CUDA stream captures. ValueError for bad pages (nothing changed), RuntimeError
        when memory runs out (the pool as it was). Logged (`resizes`, and the 'pagestash' logger at `level`)."""
        self._change_pages(True, device_pages, host_pages, why, level)

    def shrink(self, device_pages: Optional[int] = None, host_pages: Optional[int] = None, *,
               why: str = "shrink() called", level: int = logging.INFO) -> None:
        """Keeps `device_pages` and `host_pages` (None: as it has) of a pool with a reserve, no more than it has (0
        and 0: none, all its memory back, as a pool may start with none and grow), and gives the memory past them
        back, between steps (as grow()), with every page back (after a balanced end_step): else ValueError, nothing
        changed. A CUDA pool synchronises its stream to know. Logged (`resizes`)."""
        self._change_pages(False, device_pages, host_pages, why, level)

    def _change_pages(self, growing: bool, device_pages: Optional[int], host_pages: Optional[int], why: str,
                      level: int) -> None:
        what = "grow" if growing else "shrink"
        self.memory_owner.can_change_pages(what)
        self.step_log.refuse_in_open_step(what)
        self.step_log.refuse_in_begun_step(what)
        old = (self.device_pages, self.host_pages)
        new = tuple(o if n is None else n for o, n in zip(old, (device_pages, host_pages)))
        for n, name in zip(new, ("device_pages", "host_pages")):
            if isinstance(n, bool) or not isinstance(n, numbers.Integral):
                raise ValueError(f"pagestash: PagePool.{what}: {name} = {n!r} is not a number of pages")
        if new == old:
            return
        (self.memory_owner.grow if growing else self.memory_owner.shrink)(int(new[0]), int(new[1]))
        self.resizes.append(dict(step=self.steps, old=old, new=new, why=why))
        _log.log(level, "pagestash: the pool %s from %d to %d device pages, %d to %d host pages (%s)",
                 "grew" if growing else "shrank", old[0], new[0], old[1], new[1], why)

    def pages_held(self) -> int:
        """Device and host pages records hold now (reads the counters: synchronises)."""
        s = self.stats()
        return self.device_pages - s["device_pages_free"] + self.host_pages - s["host_pages_free"]

    #: Deprecated name of pages_held() (the pages records hold).
    pages_in_use = pages_held

    def record(self, recipe: Optional[str] = None, shape: Optional[Shape] = None, *,
               like: Optional[torch.Tensor] = None, counts: Optional[torch.Tensor] = None,
               scales: str = "swizzled", compression: Optional[str] = None) -> "Record":
        """A record for one grouped tensor: of `recipe` and `shape`, or of the recipe and
        shape inferred from a tensor `like` its data (and `counts`, for a packed one; see
        pagestash.infer). Made once, outside any graph: it allocates.

        `compression`: how its pages keep the data, one of pagestash.COMPRESSIONS. None or
        'lossless': byte for byte. 'mxfp8', 'mxfp8_e5m2', 'fp8_1x128': a bf16 or fp16 recipe's
        data paged as FP8 codes and block scales (about half the pages); the reload gives
        dequantize(quantize(x)), lossy (docs/python.md, "Compressed stash"). Raises ValueError
        for an unknown name, a recipe that is not bf16 or fp16, or a hidden that is not a
        multiple of the format's block."""
        if recipe is None or shape is None:
            if like is None:
                raise ValueError("pagestash: PagePool.record needs recipe= and shape=, or like= (a tensor to infer them from)")
            recipe, shape = infer(like, counts, recipe=recipe, shape=shape, scales=scales)
        return Record(self, recipe, shape, compression)

    def stats(self) -> dict:
        """Flags and counters, read back (synchronises the device for a CUDA pool); with the
        cumulative `steps`, `overflowed_steps` and `reruns` (totals), which reset() keeps."""
        return {**_C.pool_stats(*self.state), **self.totals}

    @property
    def totals(self) -> Dict[str, int]:
        """The cumulative counters, kept on the host (no sync): steps decide() counted, those
        whose decision was not 'keep', reruns count_rerun() counted, and the steps in a row, up to
        the last, whose decision was not 'keep' (unpaged_streak)."""
        return dict(steps=self.steps, overflowed_steps=self.overflowed_steps, reruns=self.reruns,
                    unpaged_streak=self.unpaged_streak)

    def count_rerun(self) -> None:
        """Counts a step rerun without paging (in `totals`): call it when you rerun one."""
        self.reruns += 1

    def count_decision(self, decision: str) -> None:
        """Counts a decision made without reading the flags: run_step's, from the PagingError a
        strict check raised in the step (its `decision`). decide() counts its own."""
        self._decided(decision)

    def _target(self, overflow: Optional[float]) -> None:
        """Arms the overflow-rate warning for a sizing's target, counting from this step."""
        if overflow is not None and (isinstance(overflow, bool) or not isinstance(overflow, numbers.Real)
                                     or not 0 < overflow < 1):
            raise ValueError(f"pagestash: overflow_target = {overflow!r} must be a probability in (0, 1), or None")
        self.overflow_target = overflow
        self._target_since = (self.steps, self.overflowed_steps)
        self._rate_warned = False

    def _check_overflow_rate(self) -> None:
        """Warns once per sizing when the steps since it overflow more than twice as often as
        the target and so often that the target rate would give as many with probability below
        1e-6 (the Chernoff bound exp(-n KL(observed || target)) of the binomial tail)."""
        p = self.overflow_target
        if p is None or self._rate_warned:
            return
        n = self.steps - self._target_since[0]
        k = self.overflowed_steps - self._target_since[1]
        q = k / n
        if q <= 2 * p:
            return
        divergence = q * math.log(q / p) + (0 if q == 1 else (1 - q) * math.log((1 - q) / (1 - p)))
        if n * divergence <= math.log(1e6):  # the bound must be below 1e-6
            return
        self._rate_warned = True
        warnings.warn(f"pagestash: {k} of the {n} steps since this pool was sized overflowed ({q:.1%}) against "
                      f"the target {p:.3g}: its sizing does not describe this run's router, and every overflowed step "
                      f"reruns without paging (double compute). Re-size from the run's own counts: pool.observe(steps), "
                      f"then sizing = pagestash.size_pool(saved, counts=pool.observed_counts(), ...) and "
                      f"pool.resize(sizing): reallocate(sizing), or resize_in_place(sizing) for a pool with a reserve "
                      f"(docs/python.md, 'Sizing the pool')", OverflowRateWarning, stacklevel=3)

    def reallocate(self, sizing) -> None:
        """Replaces a fixed pool's memory by new memory of `sizing`'s size (a PoolSizing: its
        device_pages, host_pages and page_bytes), between steps, and checks the overflow rate
        against the sizing's target from here on. Records do not survive: those made before are
        another pool's (a Record's op raises ValueError; a raw op raises the `foreign_record`
        flag); the hook makes its records per stash, so none survives a finished step. The
        cumulative counters and an observation go on; the old memory goes back to PyTorch's
        allocator. Reads the counters (synchronises); raises ValueError while records hold pages,
        and for a pool with a reserve (which keeps its memory: resize_in_place)."""
        self._check_resize(sizing, "reallocate")
        if self.growable:
            raise ValueError("pagestash: PagePool.reallocate: a pool with a reserve keeps its memory and its records: "
                             "resize_in_place(sizing) grows or shrinks it to the sizing's pages")
        self._allocate(PoolMemory.make(self.device, sizing.page_bytes, sizing.device_pages, sizing.host_pages))
        self._target(sizing.overflow)

    def resize_in_place(self, sizing) -> None:
        """Grows or shrinks a pool with a reserve to `sizing`'s pages (a PoolSizing of its page_bytes, pages within
        the reserve: else ValueError), between steps, and checks the overflow rate against the sizing's target
        from here on. Its memory, ids and records survive. Reads the counters (synchronises); raises ValueError
        while records hold pages, and for a fixed pool (reallocate(sizing) replaces its memory)."""
        self._check_resize(sizing, "resize_in_place")
        self.memory_owner.can_change_pages("resize_in_place")
        if sizing.page_bytes != self.page_bytes:
            raise ValueError(f"pagestash: PagePool.resize: the sizing's pages are of {sizing.page_bytes} bytes, "
                             f"this pool's (with a reserve) of {self.page_bytes}: size it with "
                             f"page_bytes={self.page_bytes}")
        want = (sizing.device_pages, sizing.host_pages)
        why = "resize(sizing)"
        self.grow(*(max(w, h) for w, h in zip(want, (self.device_pages, self.host_pages))), why=why)
        self.shrink(*want, why=why)
        self._target(sizing.overflow)

    def resize(self, sizing) -> None:
        """Deprecated: reallocate(sizing) for a fixed pool (records do not survive), resize_in_place(sizing)
        for a pool with a reserve (records survive), as `growable` says."""
        (self.resize_in_place if self.growable else self.reallocate)(sizing)

    def _check_resize(self, sizing, what: str) -> None:
        """A resize's checks: a PoolSizing (anything with its pages and target: this module does not import the
        sizer), between steps, no page held."""
        if not all(hasattr(sizing, f) for f in ("device_pages", "host_pages", "page_bytes", "overflow")):
            raise ValueError(f"pagestash: PagePool.{what} takes a PoolSizing (from pagestash.size_pool), not "
                             f"{sizing!r}")
        self.step_log.refuse_in_open_step("resize")
        self.step_log.refuse_in_begun_step("resize")
        held = self.pages_held()
        if held:
            raise ValueError(f"pagestash: PagePool.resize between steps: records still hold {held} pages (reload or "
                             "discard them, and call end_step(), first)")

    def observe(self, steps: int) -> None:
        """Records the counts of every stash of the next `steps` whole steps, without a sync
        (each stash's counts are copied on the device); end_step() closes a step, and
        observed_counts() gives them for pagestash.size_pool(saved, counts=...). A layer's
        marks share its counts tensor: stashes of one counts tensor are one (layer,
        microbatch) stash, one count vector. A step that overflows is recorded all the same.
        Observe eager steps: the recording is host code, which a replayed CUDA graph skips.
        Calling it again drops what was recorded."""
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 1:
            raise ValueError(f"pagestash: PagePool.observe(steps): steps = {steps!r} must be a positive integer")
        if self._auto is not None:
            raise ValueError("pagestash: PagePool.observe: auto_resize() observes this pool's steps already (its "
                             "window: observed_counts()); auto_resize(None) turns it off")
        self.step_log.observe(int(steps))

    @property
    def observing(self) -> int:
        """Whole steps observe() still records (0: not recording)."""
        return self.step_log.observing

    def auto_resize(self, saved, *, window: int = 8, shrink_after: int = 100, overflow: float = 1e-3,
                    headroom: float = 1.1, **sizing):
        """The automatic mode of a pool with a reserve (pagestash.AutoResize): after a step that
        overflowed, before its rerun, the pool grows to what size_pool(saved, ...) finds for
        the last `window` observed steps at `overflow` (times `headroom`), up to the reserve;
        after `shrink_after` steps kept in a row it shrinks to that size when smaller. `sizing`:
        size_pool's other arguments (schedule, layers, microbatches, ...). The pool observes
        from here on (observe(): the steps run to their end, not strict, under run_step).
        `saved` None turns it off. Returns the policy. ValueError without a reserve or for bad
        arguments."""
        if saved is None:
            self._auto = None
            self.step_log.stop_observing()
            return None
        if self.auto_resize_policy is None:  # set by pagestash.resizing, which `import pagestash` imports
            raise RuntimeError("pagestash: auto_resize needs pagestash.resizing imported (import pagestash does)")
        self._auto = self.auto_resize_policy(self, saved, window=window, shrink_after=shrink_after,
                                             overflow=overflow, headroom=headroom, **sizing)
        self.step_log.observe(1, window=self._auto.window)
        return self._auto

    def observed_counts(self) -> torch.Tensor:
        """The whole steps observed so far (closed by end_step()), as an int32 tensor
        [steps, stashes, experts] on the pool's device (nothing synchronises): the stashes of
        a step in the order they came (microbatch * layers + layer when each microbatch runs
        the layers in order), what pagestash.size_pool(saved, counts=...) takes. Raises
        ValueError when no step was observed or the steps differ in shape."""
        return self.step_log.counts()

    def report(self, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Writes the flags and counters into `out` (uint8, _C.report_bytes(), on the pool's
        device or pinned) on the current CUDA stream, without synchronising; returns it. Read it
        with decode_report(out) after the CUDA stream."""
        if out is None:
            out = torch.empty(_C.report_bytes(), dtype=torch.uint8, device=self.device)
        ops.report(*self.state, out)
        return out

    def reset(self) -> None:
        """Every page free, flags and device counters cleared (graph-capturable; the
        cumulative `totals` stay). Records stashed before are stale: reloading one raises the
        `stale` flag. Refused inside an open PagedStep (run_step resets between the failed
        run and the rerun)."""
        self.step_log.refuse_in_open_step("reset")
        ops.reset(*self.state)
        self._first, self._unread, self.step_log.failure = None, None, None

    def begin_step(self) -> None:
        """Begins a step: every microbatch of one optimizer step (forward and backward) runs
        after it, and decide() ends it, once, after its last backward. run_step and PagedStep
        call it; a loop of one's own calls it before each step's first microbatch (and before a
        paged rerun of a whole step). Host bookkeeping only: nothing runs on the device.
        Raises RuntimeError inside an open PagedStep."""
        self.step_log.refuse_in_open_step("begin_step")
        self.step_log.begin()

    def end_step(self, cuda_streams: Sequence["torch.cuda.Stream"] = ()) -> None:
        """At the end of a step, after its last reload or discard: raises the `unbalanced`
        flag (misuse: a record of the step was neither reloaded nor discarded, its pages
        leak) when any page is still held, and counts them (`pages_held_at_step_end` in
        stats() and the report). Graph-capturable; call it before report() or agree().

        It counts what is held when it runs on the current CUDA stream: every other CUDA stream that
        reloaded or discarded in this step goes in `cuda_streams`, and the current CUDA stream waits
        for what each has enqueued so far (no host sync), so that its work is counted.
        Enqueue the next step's first stash after it. It closes a step observe() records."""
        cuda_streams = list(cuda_streams)
        if cuda_streams and self.device.type != "cuda":
            raise ValueError(f"end_step: cuda_streams are for a CUDA pool; this pool is on {self.device}")
        if cuda_streams:
            current = torch.cuda.current_stream(self.device)
            for s in cuda_streams:
                if s != current:
                    current.wait_stream(s)
        ops.end_step(*self.state)
        self.step_log.close_observed_step()
        self._ran("the end_step")

    def flag_dict(self) -> Dict[str, int]:
        """Each flag by name, read back (synchronises for a CUDA pool)."""
        flags = dict(zip(FLAG_NAMES, self.flags.tolist()))
        self._note(flags)
        return flags

    def decide(self, *, alone: bool = False) -> str:
        """'keep', 'rerun_without_paging' or 'report_error', from the flags (reads them back:
        synchronises): the decision of the step begin_step() began, after its last backward
        (end_step() first). After agree(), every rank decides the same. It counts the step and
        its outcome (`totals`), and warns (OverflowRateWarning) when the steps overflow far
        more often than `overflow_target`. Deciding again with no paged context between (after
        agree() brought other ranks' flags) decides the same step anew, counted once. After a
        PagingError of the step (strict mode, check()), pages still held at end_step (`unbalanced`:
        microbatches whose backward the error cut short) are its consequence: the decision is the
        error's ('rerun_without_paging' for an overflow), not 'report_error'. Counts the steps in
        a row that were not kept (`unpaged_streak`), and warns (UnpagedStepsWarning) while they last.

        Raises RuntimeError after paged contexts (paged_saved_tensors) outside a step (no
        begin_step() before them): the pool cannot tell which microbatches a rerun must repeat.
        Without paged contexts (records used directly) a decide() is a step of its own.

        With several ranks (torch.distributed initialised, more than one rank) it raises
        RuntimeError unless agree() ran since the step began: a rank that decided alone would
        rerun a step its peers keep, and their collectives would pair the wrong steps
        (wrong or NaN parameters, no error). `alone=True` is for a pool whose step no other
        rank shares."""
        log = self.step_log
        log.refuse_in_open_step("decide")
        dist = torch.distributed
        if (not alone and not log.agreed and dist.is_available() and dist.is_initialized()
                and dist.get_world_size() > 1):
            raise RuntimeError(
                f"pagestash: pool.decide() on one of {dist.get_world_size()} ranks without pool.agree() in this step: "
                "a rank that decides alone may rerun a step its peers keep, and their collectives then pair "
                "different steps (wrong or NaN parameters, no error). Call pool.agree(group) after end_step() "
                "(run_step and PagedStep.finish do), or decide(alone=True) for a pool no other rank's step shares")
        if not log.begun and log.decision is None and log.contexts:
            raise RuntimeError(
                "pagestash: pool.decide() outside a step: a step is what lies between pool.begin_step() and "
                "decide(), which ends it once, after its last backward. Call pool.begin_step() before each "
                "optimizer step's first microbatch, or use pagestash.run_step / PagedStep, which do")
        flags = self.flag_dict()
        decision = _C.decide(list(flags.values()))
        failure = log.failure
        if (decision == "report_error" and failure is not None and failure.decision == "rerun_without_paging"
                and {n for n in failed_flags(flags) if FLAG_CATEGORIES[n] == "misuse"} <= {"unbalanced"}):
            # A PagingError cut the step short: what its unfinished microbatches hold is its consequence, not a bug.
            decision = failure.decision
        self._decided(decision)
        return decision

    def _decided(self, decision: str) -> None:
        """A decision (by decide(), or by run_step from a strict-mode PagingError), counted once
        per step: a begun step's, a step of records alone, or a begun step's again (replaced)."""
        again = self.step_log.decided(decision)
        if again is not None:
            self.overflowed_steps -= again != "keep"
        else:
            self.steps += 1
            self._streak_before = self.unpaged_streak
        self.overflowed_steps += decision != "keep"
        streak = self.unpaged_streak
        self.unpaged_streak = 0 if decision == "keep" else self._streak_before + 1
        self._check_overflow_rate()
        if self._auto is not None:
            self._auto.decided(decision)
        if self.unpaged_streak != streak:
            self._warn_unpaged(decision)

    UNPAGED_WARN_AFTER, UNPAGED_WARN_EVERY = 3, 10  #: the streak's first warning, and the steps between two

    def _warn_unpaged(self, decision: str) -> None:
        """Warns (UnpagedStepsWarning) at the UNPAGED_WARN_AFTER-th step in a row that was not kept,
        and every UNPAGED_WARN_EVERY-th after: a loop that stops paging says so, at a bounded rate."""
        n = self.unpaged_streak
        if n < self.UNPAGED_WARN_AFTER or (n - self.UNPAGED_WARN_AFTER) % self.UNPAGED_WARN_EVERY:
            return
        if decision == "report_error":
            why = "its flags report a misuse, a bug to report (decide() gives 'report_error'; run_step names the flags)"
        elif self._auto is not None and self.device_pages >= self.device_reserve:
            why = (f"it is at its reserve ({self.device_reserve} device pages), so auto_resize cannot grow it: make "
                   "it with a larger reserve_bytes")
        else:
            why = ("they need more pages than it has: grow it (grow(), auto_resize() on a pool with a reserve) or size "
                   "it from the run's own steps (observe(), size_pool, reallocate() or resize_in_place())")
        warnings.warn(f"pagestash: the last {n} steps were all rerun without paging (decision {decision!r}; "
                      f"pool.totals['unpaged_streak']): this pool pages nothing while it lasts, and each step runs "
                      f"twice. {why[0].upper()}{why[1:]}", UnpagedStepsWarning, stacklevel=_caller_stacklevel())

    def check(self, where: str = "") -> None:
        """Raises PagingError naming the raised flags when the step cannot be trusted
        (overflow, or any misuse); host spill is not a failure. Reads the flags:
        synchronises for a CUDA pool."""
        flags = self.flag_dict()
        failed = failed_flags(flags)
        if failed:
            error = PagingError(failed, _C.decide([flags[n] for n in FLAG_NAMES]), where, self._first or "",
                                *self._advice())
            if self.step_log.failure is None:
                self.step_log.failure = error  # decide() knows what it cut short
            raise error

    def strict_check(self, where: str) -> None:
        """A strict mode's check (of a record's operation, of the hook's reload): check(), whose
        PagingError, inside a backward, raises at the backward's end (raise_after_backward), after
        every node of it has run: the reloads after it restore or poison, and return their pages."""
        try:
            self.check(where)
        except PagingError as e:
            raise_after_backward(e)

    def _advice(self) -> Tuple[str, ...]:
        """What to do when a check fails in the middle of a step: the gradients hold part of it."""
        log = self.step_log
        if not log.contexts:
            return ()
        since = "in this step" if log.begun else "since the pool was made or last began a step"
        return (f"{log.contexts} paged context(s) ran {since}, and the gradients hold the backward of every "
                "microbatch that finished (this backward's too, NaN where a reload did not restore): zero them, reset "
                "the pool and rerun the whole step without paging (pagestash.run_step does)",)

    def agree(self, group=None) -> None:
        """All-reduces the flags with MAX over `group` (torch.distributed; the default
        group when None), in place in the pool's memory, so that every rank's decide()
        gives the same answer. In CUDA stream order without a host sync where the backend takes
        the pool's device (NCCL for a CUDA pool, Gloo or MPI for a CPU one); otherwise
        through a copy on a device the backend takes."""
        dist = torch.distributed
        backend = str(dist.get_backend(group)).lower()
        wants_cuda = "nccl" in backend and not any(b in backend for b in ("gloo", "mpi"))
        takes_device = ("nccl" in backend) if self.device.type == "cuda" else not wants_cuda
        if takes_device:
            dist.all_reduce(self.flags, op=dist.ReduceOp.MAX, group=group)
        else:
            staged = self.flags.to("cuda" if wants_cuda else "cpu")
            dist.all_reduce(staged, op=dist.ReduceOp.MAX, group=group)
            self.flags.copy_(staged)
        self.step_log.agreed = True
        self._ran("agree() (the flags of every rank)")


def decode_report(report: torch.Tensor) -> dict:
    """A report written by PagePool.report, as a dict (flags, counters and the decision)."""
    return _C.decode_report(report.cpu())


class Record:
    """What one stashed grouped tensor keeps between stash and reload, in a uint8 tensor on
    the pool's device: the counts, page ids, work plan, kept buffers (NVFP4's amax), its
    state and the id of its pool (every op checks it). Make it with PagePool.record."""

    def __init__(self, pool: PagePool, recipe: str, shape: Shape, compression: Optional[str] = None):
        if not isinstance(shape, Shape):
            raise ValueError(f"pagestash: shape must be a pagestash.Shape(groups, tokens, hidden), not {shape!r}")
        self.pool = pool
        self.recipe = recipe
        self.shape = shape
        #: How its pages keep the data: 'lossless', or a lossy format's name (PagePool.record's `compression`).
        self.compression = compression_of(compression)
        #: How errors name it (the hook names it after the marked tensor).
        lossy = "" if self.compression == "lossless" else f" ({self.compression})"
        self.name = f"a {recipe} record {tuple(shape)}{lossy}"
        self._pool_memory = pool.memory_owner  # the pool's memory it was made for (reallocate() replaces it)
        nbytes = _C.record_bytes(*pool.state, recipe, list(shape), self.compression)
        self.memory = aligned_bytes(nbytes, pool.device)
        _C.init_record(*pool.state, self.memory, recipe, list(shape), self.compression)

    def __deepcopy__(self, memo) -> "Record":
        """An empty record of the same recipe, shape and compression in the deep copy of its
        pool (a new pool: see PagePool.__deepcopy__); stashed pages are not copied."""
        return Record(copy.deepcopy(self.pool, memo), self.recipe, self.shape, self.compression)

    def _args(self):
        if self._pool_memory is not self.pool.memory_owner:
            raise ValueError(f"pagestash: {self.name} is another pool's: it was made before pool.resize() or "
                             "reallocate() replaced the pool's memory. Make a new record (pool.record(...)) after "
                             "reallocating")
        return (*self.pool.state, self.memory, self.recipe, list(self.shape))

    def _checked(self, check: Optional[bool], op: str) -> None:
        self.pool._ran(f"the {op} of {self.name}")
        if self.pool.strict if check is None else check:
            if torch.compiler.is_compiling():
                _graph_break_for_check()
            self.pool.strict_check(f"at the {op} of {self.name}")

    def stash(self, data: torch.Tensor, counts: torch.Tensor, scales: Optional[torch.Tensor] = None,
              amax: Optional[torch.Tensor] = None, *, check: Optional[bool] = None, counts_key=None) -> None:
        """Moves the live bytes of (data, scales) into pages and keeps amax; `counts` (int32,
        one per group, on the pool's device) is read where the op runs, never on the host.
        With `check` (default: the pool's strict), raises PagingError when the pool's flags
        say the step failed (inside a backward: at its end, once autograd has run every node).
        `counts_key`: while the pool observes, what makes this stash one count vector with others
        (StepLog.note_stash; the hook passes its marks' key); None: `counts` itself."""
        ops.stash(*self._args(), data, counts, scales, amax, compression=self.compression)
        self.pool.step_log.note_stash(counts, counts_key)
        self._checked(check, "stash")

    def reload(self, data: torch.Tensor, scales: Optional[torch.Tensor] = None, amax: Optional[torch.Tensor] = None,
               *, zero_tail: bool = False, poison: bool = True, check: Optional[bool] = None) -> None:
        """Copies the stashed bytes into (data, scales, amax) and returns the pages; with
        zero_tail, every byte of the paged buffers outside the live rows is cleared. A reload
        that does not restore (docs/python.md, "Failures") fills data, scales and amax with
        poison, every byte 0xFF (NaN), unless `poison` is False. `check` as for stash."""
        ops.reload(*self._args(), data, scales, amax, zero_tail, poison, compression=self.compression)
        self._checked(check, "reload")

    def discard(self, *, check: Optional[bool] = None) -> None:
        """Returns the pages without copying."""
        ops.discard(*self._args(), compression=self.compression)
        self._checked(check, "discard")

    def status(self) -> dict:
        """The C++ RecordStatus as a dict, every field of its table (stash/record.hpp) in the
        table's order: state ('empty', 'stashed', 'overflowed', 'failed', 'reloaded',
        'discarded', 'stale'), error (a flag's name, or 'none'), first_bad_group, generation,
        pages, device_pages, stream_bytes, live_bytes, host_pages, refused_blocks,
        launch_in_flight (synchronises). Its pages are the record's, those it holds: not the
        pool's device_pages and host_pages."""
        return _C.record_status(*self._args(), self.compression)
