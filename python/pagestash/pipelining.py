"""Paging under PyTorch's pipeline engine, torch.distributed.pipelining (docs/python.md,
"Pipeline parallelism"):

    paging = pagestash.PipelinePaging(pool, schedule)   # every stage the schedule runs here
    for x, y in batches:
        losses = []
        how = paging.run_step(x, target=y, losses=losses, zero_grad=optimizer)  # 'paged' or 'rerun'
        optimizer.step()

A stage's layers mark what they save with pagestash.mark(t, counts): each stage forward runs
in a paged context of the step, the engine's shape-inference probe in none. The sizer takes
the engine's own order of a rank (pipeline_schedule)."""

from __future__ import annotations

import contextlib
from typing import Dict, List, Optional, Sequence, Union

import torch

from .pool import PagePool
from .step import StepOutcome, run_step


class _TorchPrivate:
    """The only place the package touches torch.distributed.pipelining's private fields (a
    schedule keeps its stages and its losses there, with no public accessor). Checked against
    torch 2.15.0 (PipelineScheduleSingle._stage, PipelineScheduleMulti._stages, both
    schedules' _internal_losses); a torch that renames them fails here, by name."""

    @staticmethod
    def stages(schedule) -> list:
        stages = getattr(schedule, "_stages", None)  # a multi-stage schedule's
        if stages is None and getattr(schedule, "_stage", None) is not None:
            stages = [getattr(schedule, "_stage")]
        if not stages:
            raise ValueError(f"pagestash: PipelinePaging: {type(schedule).__name__} has no stages; pass stages=")
        return list(stages)

    @staticmethod
    def clear_internal_losses(schedule) -> None:
        """torch keeps the losses of a run that raised, and would backward through them again."""
        getattr(schedule, "_internal_losses", []).clear()


class PipelinePaging:
    """Paging for a schedule of torch.distributed.pipelining on this rank: registers a forward
    context on each stage (PipelineStage.register_forward_context) that opens the step's
    paged context for one stage and microbatch; the engine's metadata-inference probe, and a
    forward outside run_step, page nothing. `hook_options` go to every paged context.

    run_step(...) runs `schedule.step(...)` as one step of pagestash.run_step: with several
    ranks the paged run is not strict (a rank that raised in the middle of a schedule would
    leave its peers waiting in recv), every rank runs it to its end, the ranks agree (`group`:
    every rank whose step this is; None: the default group) and every rank reruns the step
    without paging when paging failed anywhere. One rank alone may be strict: the PagingError
    the engine wraps is found, and what the failed run left in the schedule (its losses) is
    cleared before the rerun. observe() and auto_resize() see the step's stashes in the
    documented order (microbatch x layers + layer, the rank's layers stage by stage)."""

    def __init__(self, pool: PagePool, schedule, *, stages: Optional[Sequence] = None, group=None,
                 **hook_options):
        self.pool, self.schedule, self.group, self.hook_options = pool, schedule, group, hook_options
        self.stages = list(stages) if stages is not None else _TorchPrivate.stages(schedule)
        self._handles = [s.register_forward_context(self._context) for s in self.stages]
        self._step = None
        self._entered: List[tuple] = []  # (microbatch, stage, first observed count vector) per paged context
        self.output = None  #: what the last run's schedule.step returned (the last stage's merged output)

    def _context(self, info):
        if info.is_metadata_inference or self._step is None:
            return contextlib.nullcontext()  # shape inference is a probe, not a microbatch of the step
        if self._step.paged:
            self._entered.append((info.microbatch_index, info.stage_index, self.pool.step_log.stashes_in_step))
        return self._step.paging()

    def run_step(self, *args, zero_grad, losses: Optional[list] = None, **step_kwargs) -> StepOutcome:
        """One optimizer step: schedule.step(*args, losses=losses, **step_kwargs) paged, and
        again without paging when paging failed (`losses` is cleared before each run).
        `zero_grad`: the optimizer (or module, or callable) of this rank's stages. Returns
        'paged' or 'rerun', the same on every rank."""

        def microbatches(step):
            if losses is not None:
                losses.clear()
            _TorchPrivate.clear_internal_losses(self.schedule)
            self._step = step
            if step.paged:
                self._entered = []
            try:
                self.output = self.schedule.step(*args, losses=losses, **step_kwargs)
            finally:
                self._step = None

        observed = self.pool.step_log.observed
        before = observed[-1] if observed else None
        how = run_step(self.pool, microbatches, zero_grad, group=self.group, **self.hook_options)
        observed = self.pool.step_log.observed
        if observed and observed[-1] is not before:
            self._order_observed()
        return how

    def _order_observed(self) -> None:
        """The last observed step's count vectors by (microbatch, stage, layer), not in the order
        the engine ran the forwards."""
        log = self.pool.step_log
        bounds = [first for _, _, first in self._entered] + [log.observed[-1].shape[0]]
        keyed = sorted(((mb, stage, i) for (mb, stage, _), lo, hi in zip(self._entered, bounds, bounds[1:])
                        for i in range(lo, hi)))
        log.reorder_last([i for _, _, i in keyed])

    def remove(self) -> None:
        """Removes the forward contexts from the stages."""
        for h in self._handles:
            h.remove()
        self._handles = []


def _actions(action) -> list:
    sub = getattr(action, "sub_actions", None)
    return [a for s in sub for a in _actions(s)] if sub else [action]


def pipeline_schedule(schedule, rank: int, layers: Union[int, Dict[int, int]] = 1) -> str:
    """The order in which `rank` stashes and reloads its stages' layers in one step of
    `schedule` (a torch.distributed.pipelining schedule: its pipeline_order, which every rank
    holds for all ranks), as size_pool's schedule "order:...": a stage forward stashes its
    `layers` (an int, or stage index -> layers), its full or input backward reloads them (a
    zero-bubble weight backward reloads nothing: the hook's reloads happen in the input
    backward). Layers are numbered stage by stage in stage order, so the stash of layer l of
    microbatch m is count vector m x layers + l of a step observe() records under
    PipelinePaging. Raises ValueError for a rank the schedule has no actions for."""
    order = getattr(schedule, "pipeline_order", None)
    if not order or rank not in order:
        raise ValueError(f"pagestash: pipeline_schedule: {type(schedule).__name__} has no action order for rank {rank}")
    actions = [a for action in order[rank] if action is not None for a in _actions(action)]
    kinds = {"FORWARD": "S", "FULL_BACKWARD": "R", "BACKWARD_INPUT": "R"}
    stages = sorted({a.stage_index for a in actions if a.computation_type.name in kinds})
    per = {s: (layers if isinstance(layers, int) else layers[s]) for s in stages}
    first, total = {}, 0
    for s in stages:
        first[s], total = total, total + per[s]
    events, forwards = [], {s: 0 for s in stages}
    for a in actions:
        kind = kinds.get(a.computation_type.name)
        if kind is None:
            continue
        mb = a.microbatch_index
        if kind == "S":  # a stage's forwards run in microbatch order; torch's single-stage schedules misnumber
            mb, forwards[a.stage_index] = forwards[a.stage_index], forwards[a.stage_index] + 1  # theirs off rank 0
        span = range(first[a.stage_index], first[a.stage_index] + per[a.stage_index])
        events += [f"{kind}{l}.{mb}" for l in (span if kind == "S" else reversed(span))]
    return "order:" + ",".join(events)
