"""PagingError: what strict mode and PagePool.check() raise when the pool's flags say a step
cannot be trusted (and raise_after_backward, which raises it inside a backward once the backward
is done); the warnings that say a pool's sizing does not fit the run, or a mark paged nothing."""

from __future__ import annotations

from typing import Dict, Iterable

import torch

from . import _C

#: The flags' names, in the order of their int32 words in the pool's memory, what each
#: means and its category ('capacity': the step reruns; 'misuse': a bug, the step reruns and
#: reports it; 'info': not a failure): all from the library's one table
#: (PAGESTASH_POOL_FLAGS, pagestash/pool/flags.hpp).
FLAG_NAMES = tuple(_C.flag_names())
FLAG_MEANINGS: Dict[str, str] = dict(zip(FLAG_NAMES, _C.flag_meanings()))
FLAG_CATEGORIES: Dict[str, str] = dict(zip(FLAG_NAMES, _C.flag_categories()))


def failed_flags(flags: Dict[str, int]) -> list:
    """The raised flags that make a step untrustworthy: capacity first, then the kinds of
    misuse (the generic `error` only when no kind of it is named)."""
    raised = [n for n in FLAG_NAMES if flags.get(n) and FLAG_CATEGORIES[n] != "info"]
    capacity = [n for n in raised if FLAG_CATEGORIES[n] == "capacity"]
    kinds = [n for n in raised if FLAG_CATEGORIES[n] == "misuse" and n != "error"]
    return capacity + (kinds or [n for n in raised if n == "error"])


class PagingError(RuntimeError):
    """The pool's flags say that paging failed in this step (`flags`: the raised ones, e.g.
    ['overflow'] or ['bad_counts']; `decision`: what the sync-free loop would do,
    'rerun_without_paging' or 'report_error'; `first`: the operation that first raised a
    failure flag since the pool's reset, as far as the host knows, e.g. 'the stash of
    marked tensor #0 (...)'; the flags are sticky, so a later operation's check sees them
    too). The step's reloaded activations cannot be trusted: reset the pool and rerun the
    step (without paging, or with a larger pool)."""

    def __init__(self, flags: Iterable[str], decision: str, where: str = "", first: str = "",
                 advice: str = "reset the pool and rerun the step"):
        self.flags = list(flags)
        self.decision = decision
        self.first = first
        lines = "; ".join(f"{n}: {FLAG_MEANINGS.get(n, n)}" for n in self.flags)
        raised = f"; first raised by {first}" if first and where != f"at {first}" else ""
        super().__init__(f"pagestash: paging failed{' ' + where if where else ''} ({lines}){raised}; decision "
                         f"{decision!r}: {advice}")


_deferred: set = set()  # the backwards (graph task ids) whose end raises an error found in them


def raise_after_backward(error: BaseException) -> None:
    """Raises `error` now, or, inside a backward, once autograd has run every node of it (a final
    callback of the backward: `backward()` raises it then). An exception raised in the middle of a
    backward leaves the nodes autograd had queued on the thread, which hold the saved-tensor hooks,
    until the thread's next backward; with none, torch frees them after Python has shut down and the
    interpreter ends with SIGSEGV. The first error of a backward is the one raised."""
    task = torch._C._current_graph_task_id()
    if task == -1 or torch.compiler.is_compiling():
        raise error
    if task in _deferred:
        return

    def raise_it():
        _deferred.discard(task)
        raise error

    try:
        torch.autograd.Variable._execution_engine.queue_callback(raise_it)
    except RuntimeError:  # no callback to be had: raised now, as before
        raise error from None
    _deferred.add(task)


class UnpagedWarning(UserWarning):
    """A marked tensor that autograd never saved whole in the context (it saved a copy, an
    autocast copy, or a view of part of it): nothing of it was paged."""


class OverflowRateWarning(UserWarning):
    """Far more steps overflow than the pool was sized for (PagePool(overflow_target=...),
    which PoolSizing.pool(), PagePool.reallocate(sizing) and resize_in_place(sizing) set): each
    reruns without paging. Re-size from the run's own counts (PagePool.observe)."""


class PoolCostWarning(UserWarning):
    """A sized pool takes more memory than it saves: its device bytes exceed what the
    marked tensors take without paging less those bytes."""


class UnpagedStepsWarning(UserWarning):
    """A loop that stopped paging: several steps in a row were not kept, each rerun without
    paging (PagePool.totals' unpaged_streak counts them). It repeats while it lasts, every few
    steps, saying why (a pool too small, at its reserve, or a misuse)."""
