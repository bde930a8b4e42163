"""The step: what a rerun must repeat. Gradients accumulate over every microbatch of one
optimizer step, so when paging fails anywhere in it, the whole step reruns, never one
microbatch.

    def microbatches(step):          # all of one optimizer step, in any order (1F1B too)
        for x, counts in batch:
            with step.paging() as paging:  # a paged_saved_tensors per microbatch's forward
                loss = model(paging.mark(x, counts))
            loss.backward()
    how = pagestash.run_step(pool, microbatches, opt)  # 'paged', or 'rerun' (unpaged)
    opt.step()
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Sequence

import torch

from .errors import PagingError
from .hooks import paged_saved_tensors
from .pool import PagePool


class PagingWarning(UserWarning):
    """A step reran because the pool's flags reported a misuse (a bug), not a lack of room."""


#: A step's two words (docs/design.md, Glossary), one table: its *decision*, what the pool's flags
#: say of it (decide(), PagedStep.finish(), PagingError.decision: the C++ StepDecision), and its
#: *outcome*, how run_step ran it: 'paged' (kept) or 'rerun' (run again without paging); 'eager'
#: when there is no pool (no decision).
OUTCOMES = {"keep": "paged", "rerun_without_paging": "rerun", "report_error": "rerun"}


class StepOutcome(str):
    """What run_step returns: the step's outcome ('paged', 'rerun' or 'eager', a str), and
    `decision`, the decision it ran by ('keep', 'rerun_without_paging', 'report_error'; None for
    'eager')."""

    decision: Optional[str]

    def __new__(cls, outcome: str, decision: Optional[str] = None) -> "StepOutcome":
        made = super().__new__(cls, outcome)
        made.decision = decision
        return made

    @classmethod
    def of(cls, decision: Optional[str]) -> "StepOutcome":
        """The outcome of a step run by `decision` (None: no pool, 'eager')."""
        return cls("eager" if decision is None else OUTCOMES[decision], decision)

    def __reduce__(self):  # pickled (a rank's result sent to another process) as what it is
        return (StepOutcome, (str(self), self.decision))


class _Unpaged:
    """What `step.paging()` gives in a step that runs without paging: a context whose
    `mark()` returns the tensor and pages nothing."""

    def __enter__(self) -> "_Unpaged":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def mark(self, data: torch.Tensor, counts: torch.Tensor, **_) -> torch.Tensor:
        return data


class PagedStep:
    """One optimizer step's paging. Each microbatch's forward runs in its own
    `step.paging()` (a paged_saved_tensors over the pool, or a context that pages nothing
    when `paged` is False); backward runs as usual. After the step's last backward,
    `finish()` ends the step on the pool (end_step), agrees the flags over `group` and
    decides: 'keep', or 'rerun_without_paging' / 'report_error', when the whole step must
    run again without paging from zeroed gradients. A paged step is the pool's step (it
    begins it, as pool.begin_step() does, and its finish() decides it); while it is open, the
    pool's own begin_step(), decide() and reset() raise: they would cut the step in two. An
    unpaged one (`paged=False`) leaves the pool alone and needs no finish(): the rerun by hand
    is `pool.reset()`, the gradients zeroed, then `microbatches(PagedStep(pool, paged=False))`.
    Prefer `run_step`, which does all of it."""

    def __init__(self, pool: Optional[PagePool], *, paged: bool = True, **hook_options):
        if pool is None and paged:
            raise ValueError("pagestash: a paged step needs a pool (PagedStep(None) only with paged=False)")
        self.pool, self.paged, self.hook_options = pool, paged, hook_options
        self.microbatches = 0
        self.reload_cuda_streams: list = []  # the side streams its contexts prefetch on: end_step joins them
        self.decision: Optional[str] = None
        if paged:  # the pool's step: an unpaged one (a rerun) pages nothing and decides nothing
            pool.step_log.open(self)

    def paging(self, **hook_options):
        """A context for one microbatch's forward: paged_saved_tensors(pool, **options) in a
        paged step (`hook_options` of the step, then these), else one that pages nothing."""
        if self.decision is not None:
            raise RuntimeError("pagestash: this step is finished: open a new one for the next step")
        self.microbatches += 1
        if not self.paged:
            return _Unpaged()
        context = paged_saved_tensors(self.pool, **{**self.hook_options, **hook_options})
        self.reload_cuda_streams += [s for s in context.reload_cuda_streams if s not in self.reload_cuda_streams]
        return context

    def finish(self, group=None, cuda_streams: Sequence["torch.cuda.Stream"] = ()) -> str:
        """After the step's last backward: end_step(cuda_streams, and the side streams its
        contexts prefetched on), agree(group) when a group is given or torch.distributed is
        initialised, then decide (reads the flags: one sync).
        Returns the decision; an unpaged step keeps."""
        self.abandon()
        if not self.paged:
            self.decision = "keep"
            return self.decision
        self.pool.end_step([*cuda_streams, *self.reload_cuda_streams])
        if group is not None or (torch.distributed.is_available() and torch.distributed.is_initialized()):
            self.pool.agree(group)
        self.decision = self.pool.decide()
        return self.decision

    def abandon(self) -> None:
        """Closes the step without deciding (after an exception in it)."""
        if self.pool is not None:
            self.pool.step_log.close(self)

    def join_cuda_streams(self, cuda_streams: Sequence["torch.cuda.Stream"] = ()) -> None:
        """Makes the current CUDA stream wait for `cuda_streams` and the side streams the step's
        contexts prefetched on (no host sync): before a reset, no reload of the step may still
        run there."""
        if self.pool is None or self.pool.device.type != "cuda":
            return
        current = torch.cuda.current_stream(self.pool.device)
        for s in [*cuda_streams, *self.reload_cuda_streams]:
            if s != current:
                current.wait_stream(s)

    @property
    def must_rerun(self) -> bool:
        return self.decision is not None and self.decision != "keep"


def _zero_grad(zero_grad) -> None:
    if callable(getattr(zero_grad, "zero_grad", None)):
        zero_grad.zero_grad(set_to_none=True)
    elif callable(zero_grad):
        zero_grad()
    else:
        raise TypeError("pagestash.run_step: zero_grad must be an optimizer or module (its zero_grad() is called), "
                        f"or a callable that clears the gradients, not {type(zero_grad).__name__}")


def run_step(pool: Optional[PagePool], microbatches: Callable[[PagedStep], None], zero_grad, *, group=None,
             cuda_streams: Sequence["torch.cuda.Stream"] = (), **hook_options) -> StepOutcome:
    """Runs one optimizer step's microbatches (forward and backward of each, in the order
    `microbatches(step)` chooses) with paging, then decides; when paging failed anywhere in
    the step, clears the gradients, resets the pool and runs the whole step again without
    paging. Returns the step's outcome, 'paged' or 'rerun' (a StepOutcome: its `decision`
    says why); without a pool (None), runs the step unpaged and returns 'eager'.

    The step is run_step's: it begins the pool's step and decides it once (no optimizer
    hook is involved: a skipped optimizer step, a hand-written update or several optimizers
    change nothing). `zero_grad`: the optimizer or module whose gradients the step accumulates (its
    zero_grad(set_to_none=True) runs before the step and before a rerun), or a callable.
    The gradients start from zero: accumulate across run_step calls by summing yourself.
    `group`, `cuda_streams`: as for PagedStep.finish. `hook_options` go to every
    paged_saved_tensors (zero_tail, strict, ...). In strict mode, the PagingError a reload
    raises at the end of its backward is caught here, also wrapped in another exception (as
    torch.distributed.pipelining wraps a stage's): the step reruns. The paged run is not
    strict while the pool observes (so that it stashes the whole step) and with several
    ranks (`group`, or the default group when torch.distributed is initialised): a rank that
    raised in the middle of a step would leave its peers waiting in a collective, so every
    rank runs the step to its end and they decide together. A rerun for 'report_error' (a
    misuse: a bug) warns (PagingWarning) naming the flags."""
    _zero_grad(zero_grad)
    if pool is None:
        _run(PagedStep(None, paged=False), microbatches)
        return StepOutcome.of(None)
    if pool.observing or _several_ranks(group):
        hook_options = {**hook_options, "strict": False}
    step = PagedStep(pool, **hook_options)
    failure = None
    try:
        microbatches(step)
    except Exception as e:  # strict mode: a reload in backward found the step failed
        cause = _paging_error_in(e)
        if cause is None:
            raise
        failure = (cause.flags, cause.decision)
    finally:
        step.abandon()
    # The failed run's graph (and its groups) is gone before the reset, as the exception went.
    if failure is None:
        decision = step.finish(group, cuda_streams)
    else:
        step.join_cuda_streams(cuda_streams)  # a prefetched reload may still run on a side stream
        if _several_ranks(group):  # a check of the user's raised: the peers decide with this rank
            pool.agree(group)
            decision = pool.decide()
        else:
            decision = failure[1]
            pool.count_decision(decision)
    if decision == "keep":
        return StepOutcome.of(decision)
    if decision == "report_error":
        flags = failure[0] if failure else [n for n, v in pool.flag_dict().items() if v]
        warnings.warn(f"pagestash: the pool's flags report a misuse ({', '.join(flags)}), not a lack of room: the "
                      "step reran without paging; this is a bug to report", PagingWarning, stacklevel=2)
    pool.reset()
    pool.count_rerun()
    _zero_grad(zero_grad)
    _run(PagedStep(pool, paged=False), microbatches)
    return StepOutcome.of(decision)


def _several_ranks(group=None) -> bool:
    dist = torch.distributed
    return group is not None or (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _paging_error_in(e: Optional[BaseException]) -> Optional[PagingError]:
    """The PagingError `e` is, or was raised from (its __cause__ / __context__ chain), else None."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, PagingError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _run(step: PagedStep, microbatches) -> None:
    try:
        microbatches(step)
    finally:
        step.abandon()
