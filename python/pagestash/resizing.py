"""AutoResize: a pool with a reserve that grows after a step overflowed and shrinks once the
observed steps need less for long enough, sized each time by size_pool from the run's own
counts (docs/python.md, "A pool that grows")."""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import warnings
from typing import Optional

import torch

from .errors import PoolCostWarning
from .pool import PagePool
from .sizing import saved_list, size_pool

_log = logging.getLogger("pagestash")


def _positive(value, name: str, integral: bool = True):
    kinds = numbers.Integral if integral else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ValueError(f"pagestash: auto_resize: {name} = {value!r} must be a positive "
                         f"{'integer' if integral else 'number'}")
    return value


class AutoResize:
    """The automatic mode of a pool with a reserve (PagePool.auto_resize makes it). The pool
    observes the last `window` whole steps' counts (observed_counts(), on the device, no sync).

    - After a step whose decision is 'rerun_without_paging' (an overflow: not a misuse) and in
      which this pool's own operations found no room (not only another rank's), before its
      rerun, the pool grows to `headroom` x the device pages size_pool(saved,
      counts=observed steps, overflow=`overflow`, **sizing) finds, and at least one page more
      than it has, up to its reserve. Where the sizer cannot answer (no whole step observed:
      a replayed CUDA graph runs no host code; steps it cannot size, logged), the pool doubles;
      the step reruns either way.
    - After `shrink_after` steps kept in a row since the pool last changed, it is sized again
      from the observed steps and shrinks to that size when it is smaller (the step must be
      balanced: every page back).

    `sizing`: size_pool's arguments but saved, counts and overflow (schedule, layers,
    microbatches, cap_counts, samples, ...); without a schedule, every stash of a step is taken
    as alive at once (an upper bound: schedule 'lifo', one microbatch, a layer per stash).
    `saved` and `sizing` are checked here, by sizing a step of one token per expert; `headroom`
    is at least 1 (ValueError).
    Each change is logged once on the 'pagestash' logger (a growth as a warning: its step
    reran) and kept in pool.resizes."""

    def __init__(self, pool, saved, *, window: int = 8, shrink_after: int = 100, overflow: float = 1e-3,
                 headroom: float = 1.1, **sizing):
        if not pool.growable:
            raise ValueError("pagestash: auto_resize needs a pool with a reserve: PagePool(..., reserve_bytes=...)")
        self.window = _positive(window, "window")
        self.shrink_after = _positive(shrink_after, "shrink_after")
        self.headroom = _positive(headroom, "headroom", integral=False)
        if not headroom >= 1:
            raise ValueError(f"pagestash: auto_resize: headroom = {headroom!r} must be at least 1 (the pool grows to "
                             "headroom x the pages the observed steps need)")
        if isinstance(overflow, bool) or not isinstance(overflow, numbers.Real) or not 0 < overflow < 1:
            raise ValueError(f"pagestash: auto_resize: overflow = {overflow!r} must be a probability in (0, 1)")
        for name in ("counts", "page_bytes", "host_pages"):
            if name in sizing:
                raise ValueError(f"pagestash: auto_resize sets size_pool's {name} itself (the observed steps, "
                                 "the pool's pages)")
        try:
            inspect.signature(size_pool).bind(saved, **sizing)
        except TypeError as e:
            raise ValueError(f"pagestash: auto_resize: {e} (the sizing arguments are size_pool's)") from None
        self.pool, self.saved, self.overflow, self.sizing = pool, saved, overflow, sizing
        self._size_pool = size_pool
        self._check_sizing()
        self.kept_since_change = 0
        self._grown_at: Optional[int] = None  # the step it last grew after (a step decided again grows once)
        self._warned_full = False

    def _check_sizing(self) -> None:
        """Sizes a step of one token per expert as sized_pages() would size observed steps: the recipes, shapes,
        schedule and sizing arguments are checked here, where they are given (ValueError), not at the first step
        that overflows."""
        layers, microbatches = self.sizing.get("layers"), self.sizing.get("microbatches", 1)
        stashes = 1
        if all(isinstance(n, numbers.Integral) and not isinstance(n, bool) and n > 0 for n in (layers, microbatches)):
            stashes = layers * microbatches
        try:
            experts = max(1, saved_list(self.saved)[0][1].groups)
            self._sizing(torch.ones(1, stashes, experts, dtype=torch.int32), samples=64)
        except (ValueError, TypeError) as e:
            raise ValueError(f"pagestash: auto_resize: {str(e).removeprefix('pagestash: ')}") from None

    def _sizing(self, counts, **defaults):
        args = dict(schedule="lifo", layers=counts.shape[1], microbatches=1, samples=2000, bootstrap=0)
        args.update(defaults)
        args.update(self.sizing)
        with warnings.catch_warnings():  # whether paging pays is the user's choice, made once
            warnings.simplefilter("ignore", PoolCostWarning)
            return self._size_pool(self.saved, counts=counts, overflow=self.overflow, page_bytes=self.pool.page_bytes,
                                   host_pages=0, **args)

    def sized_pages(self) -> Optional[int]:
        """The device pages the observed steps need at the target, with the headroom; None
        without a whole observed step. ValueError when they cannot be sized (steps of different
        shapes: a strict context cut one short)."""
        if not self.pool.step_log.observed:
            return None
        return math.ceil(self._sizing(self.pool.observed_counts()).device_pages * self.headroom)

    def decided(self, decision: str) -> None:
        """What the pool does after its step's decision (decide() and count_decision() call it)."""
        pool = self.pool
        if decision == "rerun_without_paging":
            self.kept_since_change = 0
            if self._grown_at == pool.steps:
                return
            self._grown_at = pool.steps
            if not pool.stats()["overflows"]:  # another rank's pool overflowed (agreed flags): this one had room
                return
            have, reserve = pool.device_pages, pool.device_reserve
            if have >= reserve:
                if not self._warned_full:
                    self._warned_full = True
                    _log.warning("pagestash: the pool overflowed at its reserve (%d device pages): overflowing steps "
                                 "rerun without paging; a larger reserve_bytes would let it grow", reserve)
                return
            try:
                sized, unsized = self.sized_pages(), "no whole step observed"
            except ValueError as e:  # the observed steps' counts (e.g. beyond the capacity): the step reruns all the same
                sized, unsized = None, f"the observed steps could not be sized ({e})"
            why = (f"step {pool.steps - 1} overflowed; " +
                   (f"{len(pool.step_log.observed)} observed steps need {sized} pages at overflow {self.overflow:g}"
                    if sized is not None else f"{unsized}: doubled"))
            try:
                pool.grow(min(reserve, max(have + 1, 2 * have if sized is None else sized)), why=why,
                          level=logging.WARNING)
            except (ValueError, RuntimeError) as e:  # out of memory: the pool as it was, the step reruns
                _log.warning("pagestash: the pool did not grow (%s): %s", why, e)
            return
        if decision != "keep":
            return
        self.kept_since_change += 1
        if self.kept_since_change < self.shrink_after:
            return
        self.kept_since_change = 0
        try:
            sized = self.sized_pages()
        except ValueError as e:
            _log.warning("pagestash: the pool did not shrink: the observed steps could not be sized (%s)", e)
            return
        if sized is None or sized >= pool.device_pages:
            return
        try:
            pool.shrink(sized, why=f"{self.shrink_after} steps kept; {len(pool.step_log.observed)} observed steps need {sized} "
                        f"pages at overflow {self.overflow:g}")
        except ValueError as e:  # pages held at the step's end (a misuse the flags report): try again later
            _log.info("pagestash: the pool did not shrink: %s", e)


PagePool.auto_resize_policy = AutoResize  # what pool.auto_resize() makes (pool.py does not import this module)
