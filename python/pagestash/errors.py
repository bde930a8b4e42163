"""PagingError: what strict mode and PagePool.check() raise when the pool's flags say a step
cannot be trusted."""

from __future__ import annotations

from typing import Dict, Iterable

from . import _C

#: The flags' names, in the order of their int32 words in the pool's memory
#: (include/pagestash/pool/flags.hpp).
FLAG_NAMES = tuple(_C.flag_names())

#: What each flag means (host_spill is not a failure).
FLAG_MEANINGS: Dict[str, str] = {
    "overflow": "a stash found no room: the pool is too small for this step (or a stash after that skipped)",
    "error": "misuse (its kinds below)",
    "host_spill": "a stash used host pages (not a failure)",
    "bad_counts": "a stash found a count its tensor cannot hold (negative, beyond the capacity, or off the packed "
                  "alignment)",
    "still_stashed": "a stash into a record that still held pages",
    "not_stashed": "a reload or discard of a record that holds no pages (a double reload, or one after a discard)",
    "stale": "a reload of a record stashed before the pool's reset()",
    "refused_launch": "a launch on a record while another launch on it was in flight",
    "foreign_record": "a record used with a pool it was not made for",
}

#: Flags that are not failures.
INFORMATIONAL = frozenset({"host_spill"})


def failed_flags(flags: Dict[str, int]) -> list:
    """The raised flags that make a step untrustworthy, most specific first (`error` only
    when no kind of it is named)."""
    raised = [n for n in FLAG_NAMES if flags.get(n) and n not in INFORMATIONAL]
    kinds = [n for n in raised if n not in ("overflow", "error")]
    return (["overflow"] if "overflow" in raised else []) + (kinds or [n for n in raised if n == "error"])


class PagingError(RuntimeError):
    """The pool's flags say that paging failed in this step (`flags`: the raised ones, e.g.
    ['overflow'] or ['bad_counts']; `decision`: what the sync-free loop would do,
    'rerun_without_paging' or 'report_error'). The step's reloaded activations cannot be
    trusted: reset the pool and rerun the step (without paging, or with a larger pool)."""

    def __init__(self, flags: Iterable[str], decision: str, where: str = ""):
        self.flags = list(flags)
        self.decision = decision
        lines = "; ".join(f"{n}: {FLAG_MEANINGS.get(n, n)}" for n in self.flags)
        super().__init__(f"pagestash: paging failed{' ' + where if where else ''} ({lines}); decision "
                         f"{decision!r}: reset the pool and rerun the step")
