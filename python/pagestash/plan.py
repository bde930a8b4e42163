"""plan_pool: how many pages a PagePool needs so that a training step overflows it with a
chosen probability. The C++ planner (pagestash/plan.hpp, docs/planning.md) samples steps:
each draws the per-expert counts of every stash alive at the schedule's peak and sums their
exact pages, computed by the library's own work plan for the package's recipes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _C
from .pool import Device, PagePool
from .recipes import Shape

#: (recipe, Shape): one tensor a layer saves for backward.
Saved = Tuple[str, Shape]


@dataclass(frozen=True)
class CurvePoint:
    """A pool of `pages` pages overflows in `overflow` of the sampled steps (`interval`:
    Wilson, at the plan's confidence)."""

    pages: int
    overflow: float
    interval: Tuple[float, float]


@dataclass(frozen=True)
class PoolPlan:
    """What plan_pool found. `pages` (device + host) is the smallest pool whose sampled
    overflow rate is at most the target; `pages_interval` its confidence interval (the
    upper end is the largest sample when too few lie above it: `pages_interval_bounded`
    False, sample more)."""

    pages: int
    pages_interval: Tuple[int, int]
    pages_interval_bounded: bool
    page_bytes: int
    device_pages: int  #: pages - host_pages
    host_pages: int
    bytes: int  #: pages x page_bytes
    full_bytes: int  #: the alive stashes' tensors at full shape: what autograd holds without paging
    saved_fraction: float  #: 1 - device bytes / full_bytes
    overflow_probability: float  #: the planned pool's overflow rate on the sampled steps
    overflow_interval: Tuple[float, float]
    curve: List[CurvePoint]  #: overflow rate against pool size, from the smallest sampled peak to the largest
    alive_stashes: int  #: (layer, microbatch) stashes held at the schedule's peak
    schedule: str
    count_model: str
    samples: int
    confidence: float  #: of the intervals
    mean_pages: float  #: per step at the peak
    page_rounding_bytes: float  #: per step at the peak: pages x page_bytes - the bytes they hold

    def pool(self, device: Device = "cpu", strict: Optional[bool] = None) -> PagePool:
        """A PagePool of the planned size: device_pages on `device`, host_pages of spill."""
        return PagePool(self.device_pages, page_bytes=self.page_bytes, host_pages=self.host_pages, device=device,
                        strict=strict)

    def __str__(self) -> str:
        low, high = self.pages_interval
        o_low, o_high = self.overflow_interval
        return (f"pool: {self.pages} pages of {self.page_bytes} B = {self.bytes / 2**20:.2f} MiB "
                f"({100 * self.confidence:g}% CI {low}..{high}{'' if self.pages_interval_bounded else '+, sample more'}), "
                f"device {self.device_pages}, host {self.host_pages}\n"
                f"overflow on {self.samples} sampled steps: {self.overflow_probability:.5f} "
                f"({o_low:.5f}..{o_high:.5f}); {self.alive_stashes} stashes alive ({self.schedule})\n"
                f"without paging: {self.full_bytes / 2**20:.2f} MiB; the pool saves {100 * self.saved_fraction:.1f}%")


def _saved_list(saved: Union[Saved, Sequence[Saved]]) -> List[Saved]:
    if isinstance(saved, tuple) and len(saved) == 2 and isinstance(saved[0], str):
        saved = [saved]
    out = list(saved)
    if not out:
        raise ValueError("pagestash.plan_pool: saved is empty: give the (recipe, Shape) pairs one layer saves")
    for item in out:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], Shape)):
            raise ValueError(f"pagestash.plan_pool: saved must be (recipe, pagestash.Shape) pairs, not {item!r}")
    return out


def _count_lists(counts) -> List[List[int]]:
    if isinstance(counts, torch.Tensor):
        if counts.dim() != 2 or counts.dtype.is_floating_point or counts.dtype.is_complex:
            raise ValueError(f"pagestash.plan_pool: counts must be an integer [vectors, experts] tensor, not "
                             f"{list(counts.shape)} of {counts.dtype}")
        return counts.cpu().tolist()
    rows = [list(map(int, row)) for row in counts]
    if not rows:
        raise ValueError("pagestash.plan_pool: counts has no count vectors")
    return rows


def plan_pool(saved: Union[Saved, Sequence[Saved]], *, schedule: str = "lifo", layers: int = 1,
              microbatches: int = 1, tokens: Optional[int] = None, top_k: int = 1, alpha: float = 1.0,
              counts=None, capacity: Optional[int] = None, sampler: str = "multinomial",
              overflow: float = 1e-3, page_bytes: int = 64 << 10, host_pages: int = 0, samples: int = 20000,
              seed: int = 1, confidence: float = 0.95, curve_points: int = 24) -> PoolPlan:
    """Sizes a PagePool for a target per-step overflow probability.

    - `saved`: what one MoE layer saves for backward, as (recipe, Shape) pairs, e.g.
      `[("bf16/capacity", Shape(experts, capacity, hidden)), ...]`. The tensors share the
      layer's routing (one count per expert) and must hold the same tokens per expert.
    - `schedule`: 'lifo' (every forward, then every backward: layers x microbatches stashes
      alive), '1f1b:P' (P pipeline stages), '1f1b:P:V' (interleaved) or 'list:a,b,...'
      (microbatches held per layer); `layers` are the MoE layers on this rank.
    - the router, one draw per stash: `tokens` per microbatch, each to `top_k` experts,
      expert popularity from Dirichlet(`alpha`) (smaller: more uneven), every count capped
      at `capacity` (default: what the tensors hold); `sampler` 'multinomial' (fast) or
      'per_token' (exact, slower). Or `counts`: count vectors measured in training (a list
      of lists or an integer [vectors, experts] tensor), drawn with replacement.
    - `overflow`: the target probability that a step overflows; `samples` steps are drawn
      from `seed`; `page_bytes` and `host_pages` as PagePool takes them.

    Returns a PoolPlan; `plan.pool(device)` makes the PagePool. Raises ValueError naming
    what is wrong for a bad argument (an unknown recipe, a shape the recipe cannot hold,
    tensors of different capacities, counts beyond the experts, a bad schedule, ...)."""
    pairs = _saved_list(saved)
    if counts is None and tokens is None:
        raise ValueError("pagestash.plan_pool: give the router (tokens=, top_k=, alpha=) or measured counts=")
    if seed < 0:
        raise ValueError(f"pagestash.plan_pool: seed = {seed} must not be negative")
    d = _C.plan_pool(recipes=[r for r, _ in pairs], shapes=[list(s) for _, s in pairs], schedule=schedule,
                     layers=int(layers), microbatches=int(microbatches), tokens=0 if tokens is None else int(tokens),
                     top_k=int(top_k), alpha=float(alpha), sampler=sampler,
                     capacity=0 if capacity is None else int(capacity),
                     counts=[] if counts is None else _count_lists(counts), page_bytes=int(page_bytes),
                     host_pages=int(host_pages), samples=int(samples), seed=int(seed), overflow=float(overflow),
                     confidence=float(confidence), curve_points=int(curve_points))
    return PoolPlan(pages=d["pages"], pages_interval=(d["pages_low"], d["pages_high"]),
                    pages_interval_bounded=d["pages_high_bounded"], page_bytes=d["page_bytes"],
                    device_pages=d["device_pages"], host_pages=d["host_pages"], bytes=d["bytes"],
                    full_bytes=d["full_bytes"], saved_fraction=d["saved_fraction"],
                    overflow_probability=d["overflow_probability"],
                    overflow_interval=(d["overflow_low"], d["overflow_high"]),
                    curve=[CurvePoint(p, o, (lo, hi)) for p, o, lo, hi in d["curve"]],
                    alive_stashes=d["alive_stashes"], schedule=d["schedule"], count_model=d["count_model"],
                    samples=d["samples"], confidence=float(confidence), mean_pages=d["mean_pages"], page_rounding_bytes=d["page_rounding_bytes"])
