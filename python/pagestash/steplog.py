"""StepLog: a pool's steps as the host sees them, apart from its memory. A step is every
microbatch of one optimizer step, from begin (pool.begin_step(), a PagedStep, run_step) to its
decision (docs/python.md, "What a step is"); the log holds where the open step is (`open_step`,
`begun`, `contexts`, `agreed`, `decision`, `failure`) and, while the pool observes, each step's
counts in the order of its stashes (`observed`). PagePool owns one (`pool.step_log`); the step
(step.py), the pipeline adapter (pipelining.py) and the auto-resizer (resizing.py) read and
change it through these methods, never through the pool's own fields.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch


class StepLog:
    """One pool's step: its state from begin to decision, and the observed steps' counts."""

    def __init__(self):
        #: The open PagedStep (run_step's, or one made by hand), or None: while it is open, the pool's own
        #: begin_step(), decide(), reset() and resizes raise (they would cut the step in two).
        self.open_step: Any = None
        self.begun = False  #: a step begun and not yet decided
        #: The step's decision once decided ('keep', 'rerun_without_paging', 'report_error'), until the next begin.
        self.decision: Optional[str] = None
        self.contexts = 0  #: paged contexts entered since the step began
        self.agreed = False  #: agree() ran since the step began
        self.failure: Optional[BaseException] = None  #: the first PagingError check() raised in the step
        #: Whole steps still to observe (0: not observing); `window`: None, or the last steps kept for ever
        #: (auto_resize), when `observing` does not count down.
        self.observing = 0
        self.window: Optional[int] = None
        #: The observed steps, closed by end_step: an int32 [stashes, experts] tensor each, in the order of its stashes.
        self.observed: List[torch.Tensor] = []
        self._keys: List[tuple] = []  # the open step's counts' keys (each holds its tensor: ids stay theirs)
        self._copies: List[torch.Tensor] = []  # and their copies, one count vector a stash

    # --- the step: begin, contexts, decision -------------------------------------------------------------------

    def begin(self) -> None:
        """A step begins: no decision yet, no context, no agree, no failure."""
        self.begun, self.decision, self.contexts, self.agreed, self.failure = True, None, 0, False, None

    def open(self, step) -> None:
        """`step` (a PagedStep) begins the pool's step and holds it until close(step)."""
        if self.open_step is not None:
            raise RuntimeError("pagestash: this pool already has an open step (PagedStep): finish() it first")
        self.begin()
        self.open_step = step

    def close(self, step) -> None:
        """`step` lets the pool go (finished, or abandoned after an exception); another step's close is ignored."""
        if self.open_step is step:
            self.open_step = None

    def enter_context(self) -> None:
        """A paged context begins (paged_saved_tensors.__enter__): refused once the step is decided, as its failure
        would go undecided or its rerun would miss microbatches."""
        if self.decision is not None:
            raise RuntimeError(
                "pagestash: a paged context after this step's decide(): deciding per microbatch is refused, as a "
                "rerun of one microbatch drops the gradients of those before it (zero_grad) or counts them twice. "
                "Decide once per step, after its last backward, and begin each step with pool.begin_step() "
                "(pagestash.run_step does both); to rerun a whole step paged, begin it again")
        self.contexts += 1

    def decided(self, decision: str) -> Optional[str]:
        """Ends the step with `decision`. Returns the decision it replaces when the same step is decided again (no
        begin since its decision: after agree() brought other ranks' flags), else None (a new step: counted)."""
        again = self.decision if not self.begun else None
        if self.begun or again is not None:
            self.decision = decision  # paged contexts are refused until the next begin
        self.begun, self.agreed, self.failure = False, False, None
        return again

    def refuse_in_open_step(self, what: str) -> None:
        """RuntimeError for pool.`what`() while a PagedStep is open."""
        if self.open_step is not None:
            raise RuntimeError(f"pagestash: pool.{what}() inside an open step (PagedStep, run_step): the step's "
                               "microbatches accumulate gradients together, so the step decides, resets and reruns "
                               "as a whole after its last backward (PagedStep.finish, or run_step)")

    def refuse_in_begun_step(self, what: str) -> None:
        """RuntimeError for pool.`what`() between begin and decision."""
        if self.begun:
            raise RuntimeError(f"pagestash: pool.{what}() inside an open step (between begin_step() and decide()): "
                               "the step's records may hold pages and its decision is not made. Change the pages "
                               "between steps, after decide() (auto_resize() does, before the rerun)")

    # --- the observed counts -------------------------------------------------------------------------------------

    def observe(self, steps: int, window: Optional[int] = None) -> None:
        """Records the next `steps` whole steps (with a `window`: the last `window` steps, for ever), dropping what
        was recorded."""
        self.observing, self.window = steps, window
        self.observed, self._keys, self._copies = [], [], []

    def stop_observing(self) -> None:
        self.observing, self.window = 0, None

    @property
    def stashes_in_step(self) -> int:
        """Count vectors recorded so far in the open observed step."""
        return len(self._copies)

    def note_stash(self, counts: torch.Tensor, key: Optional[tuple] = None) -> None:
        """A stash's counts, while observing. `key`: (tensor, version) of the counts as the caller had them, when
        `counts` is already a private copy of them (the hook's, made at mark()): kept as it is, not copied again.
        Stashes of one key are one (layer, microbatch) stash, one count vector."""
        if not self.observing or torch.compiler.is_compiling():
            return
        copied = key is not None
        key = key or (counts, counts._version)  # a counts buffer rewritten in place is another stash's
        if any(c.data_ptr() == key[0].data_ptr() and c.shape == key[0].shape and v == key[1] for c, v in self._keys):
            return  # another tensor of the same (layer, microbatch)
        self._keys.append(key)
        self._copies.append(counts if copied else counts.detach().clone())

    def close_observed_step(self) -> bool:
        """end_step: the open step's count vectors become an observed step. Returns whether one was recorded (a
        step without stashes is not a step of the schedule)."""
        if not self.observing or not self._copies:
            return False
        self.observed.append(torch.stack(self._copies))
        self._keys, self._copies = [], []
        if self.window is None:
            self.observing -= 1
        else:
            del self.observed[:-self.window]
        return True

    def reorder_last(self, order: List[int]) -> None:
        """Puts the last observed step's count vectors in `order` (indices into them): the pipeline adapter's
        (microbatch, stage, layer) order, not the order the engine ran the forwards."""
        self.observed[-1] = self.observed[-1][torch.tensor(order, dtype=torch.long)]

    def counts(self) -> torch.Tensor:
        """The observed steps as one int32 [steps, stashes, experts] tensor; ValueError without any, or when they
        differ in shape."""
        if not self.observed:
            raise ValueError("pagestash: no observed step: call pool.observe(steps) before the steps, and "
                             "pool.end_step() at the end of each")
        first = self.observed[0].shape
        for i, step in enumerate(self.observed):
            if step.shape != first:
                raise ValueError(f"pagestash: observed step {i} holds {step.shape[0]} count vectors of {step.shape[1]} "
                                 f"experts, step 0 {first[0]} of {first[1]}: whole steps must have the schedule's "
                                 "stashes (each layer's marks sharing one counts tensor)")
        return torch.stack(self.observed)
