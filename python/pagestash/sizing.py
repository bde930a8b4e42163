"""size_pool: how many pages a PagePool needs so that a training step overflows it with a
chosen probability. The C++ sizer (pagestash/sizing.hpp, docs/sizing.md) samples steps:
each draws the per-expert counts of every stash alive at the schedule's peak and sums their
exact pages, computed by the library's own work size for the package's recipes."""

from __future__ import annotations

import numbers
import os
import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch

from . import _C
from .errors import PoolCostWarning
from .pool import Device, PagePool
from .recipes import Shape, compression_of

#: (recipe, Shape), or (recipe, Shape, compression): one tensor a layer saves for backward.
Saved = Union[Tuple[str, Shape], Tuple[str, Shape, Optional[str]]]


@dataclass(frozen=True)
class CurvePoint:
    """A pool of `pages` pages overflows in `overflow` of the sampled steps (`interval`:
    Wilson, at the sizing's confidence)."""

    pages: int
    overflow: float
    interval: Tuple[float, float]


@dataclass(frozen=True)
class PoolSizing:
    """What size_pool found: the C++ PoolSizing's fields (sizing/pool_sizing.hpp,
    `for_each_field`: one table, the same names), and the overflow curve. `pages` (device +
    host) is the smallest pool whose sampled overflow rate is at most the target `overflow`;
    `pages_interval` its confidence interval: the Monte Carlo error and, with measured
    counts, the file's own sampling error (a bootstrap over its steps; `pages_monte_carlo`
    without it). The upper end is the largest sample when too few lie above it:
    `pages_high_bounded` False, sample more."""

    pages: int
    pages_interval: Tuple[int, int]
    pages_high_bounded: bool
    pages_monte_carlo: Tuple[int, int]
    bootstrap_replicates: int  #: 0: no bootstrap (a Dirichlet router)
    bootstrap_interval: Tuple[float, float]  #: the replicates' pools' percentile interval
    page_bytes: int
    device_pages: int  #: pages - host_pages
    host_pages: int
    bytes: int  #: pages x page_bytes
    device_bytes: int  #: device_pages x page_bytes: what the pool costs on the device
    full_bytes: int  #: the alive stashes' tensors at full shape: what autograd holds without paging
    saved_bytes: int  #: full_bytes - device_bytes (negative: the pool takes more)
    saved_fraction: float  #: saved_bytes / full_bytes
    overflow: float  #: the per-step overflow probability it was sized for (size_pool's `overflow`)
    overflow_probability: float  #: the sized pool's overflow rate on the sampled steps
    overflow_interval: Tuple[float, float]
    alive_stashes: int  #: (layer, microbatch) stashes held at once at the schedule's peaks
    peak_moments: int  #: moments of a step holding them (a step overflows if any does)
    schedule: str
    count_model: str
    samples: int  #: steps sampled
    seed: int
    confidence: float  #: of the intervals
    mean_pages: float  #: per step at the peak
    mean_stream_bytes: float  #: per step at the peak: bytes the pages hold
    mean_live_bytes: float  #: per step at the peak: bytes of the live runs
    mean_dropped_tokens: float  #: per step at the peak: tokens beyond the capacity
    page_rounding_bytes: float  #: per step at the peak: pages x page_bytes - the bytes they hold
    segment_rounding_bytes: float  #: per step at the peak: stream bytes - live bytes (segments on 16)
    curve: List[CurvePoint]  #: overflow rate against pool size, from the smallest sampled peak to the largest

    def pool(self, device: Device = "cpu", strict: Optional[bool] = None) -> PagePool:
        """A PagePool of the size it found: device_pages on `device`, host_pages of spill,
        sized for `overflow` (it warns when the steps overflow far more often)."""
        return PagePool(self.device_pages, page_bytes=self.page_bytes, host_pages=self.host_pages, device=device,
                        strict=strict, overflow_target=self.overflow)

    def __str__(self) -> str:
        low, high = self.pages_interval
        o_low, o_high = self.overflow_interval
        return (f"pool: {self.pages} pages of {self.page_bytes} B = {self.bytes / 2**20:.2f} MiB "
                f"({100 * self.confidence:g}% CI {low}..{high}{'' if self.pages_high_bounded else '+, sample more'}), "
                f"device {self.device_pages}, host {self.host_pages}\n"
                f"overflow on {self.samples} sampled steps: {self.overflow_probability:.5f} "
                f"({o_low:.5f}..{o_high:.5f}); {self.alive_stashes} stashes alive ({self.schedule})\n"
                f"without paging: {self.full_bytes / 2**20:.2f} MiB; the pool saves {self.saved_bytes / 2**20:.2f} MiB "
                f"({100 * self.saved_fraction:.1f}%)")


def saved_list(saved: Union[Saved, Sequence[Saved]]) -> List[Tuple[str, Shape, str]]:
    """(recipe, Shape, compression) for each saved tensor: a pair is lossless."""
    if isinstance(saved, tuple) and len(saved) in (2, 3) and isinstance(saved[0], str):
        saved = [saved]
    out = list(saved)
    if not out:
        raise ValueError("pagestash.size_pool: saved is empty: give the (recipe, Shape) pairs one layer saves")
    for item in out:
        if not (isinstance(item, tuple) and len(item) in (2, 3) and isinstance(item[0], str)
                and isinstance(item[1], Shape)):
            raise ValueError(f"pagestash.size_pool: saved must be (recipe, pagestash.Shape) pairs (or (recipe, Shape, "
                             f"compression) triples), not {item!r}")
    return [(item[0], item[1], compression_of(item[2] if len(item) == 3 else None)) for item in out]


def _integer(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"pagestash.size_pool: {where} = {value!r} is not an integer (counts are whole tokens)")
    return int(value)


def _measured(counts):
    """counts as (independent vectors, whole steps, file): one of them given."""
    if isinstance(counts, (str, os.PathLike)):
        return [], [], os.fspath(counts)
    if isinstance(counts, torch.Tensor):
        if counts.dim() not in (2, 3) or counts.dtype.is_floating_point or counts.dtype.is_complex:
            raise ValueError(f"pagestash.size_pool: counts must be an integer [vectors, experts] or "
                             f"[steps, stashes, experts] tensor, not {list(counts.shape)} of {counts.dtype}")
        rows = counts.cpu().tolist()
        return (rows, [], "") if counts.dim() == 2 else ([], rows, "")
    rows = list(counts)
    if not rows:
        raise ValueError("pagestash.size_pool: counts has no count vectors")
    steps = all(isinstance(r, (list, tuple)) and r and isinstance(r[0], (list, tuple)) for r in rows)
    if steps:
        return [], [[[_integer(x, f"counts[{s}][{i}][{e}]") for e, x in enumerate(v)] for i, v in enumerate(step)]
                    for s, step in enumerate(rows)], ""
    return [[_integer(x, f"counts[{i}][{e}]") for e, x in enumerate(row)] for i, row in enumerate(rows)], [], ""


#: size_pool's request, name -> default: SizingRequest's table (python/csrc/sizing.hpp), the
#: command's defaults (pagestash_size). size_pool sends exactly these keys.
DEFAULTS = dict(_C.sizing_request)


def size_pool(saved: Union[Saved, Sequence[Saved]], *, schedule: str = DEFAULTS["schedule"],
              layers: Optional[int] = None, microbatches: Optional[int] = None, tokens: Optional[int] = None,
              top_k: int = DEFAULTS["top_k"], alpha: float = DEFAULTS["alpha"],
              correlation: float = DEFAULTS["correlation"], counts=None, cap_counts: bool = DEFAULTS["cap_counts"],
              capacity: Optional[int] = None, sampler: str = DEFAULTS["sampler"],
              overflow: float = DEFAULTS["overflow"], page_bytes: int = DEFAULTS["page_bytes"],
              host_pages: int = DEFAULTS["host_pages"], samples: int = DEFAULTS["samples"],
              seed: int = DEFAULTS["seed"], confidence: float = DEFAULTS["confidence"],
              bootstrap: int = DEFAULTS["bootstrap"], curve_points: int = DEFAULTS["curve_points"]) -> PoolSizing:
    """Sizes a PagePool for a target per-step overflow probability.

    - `saved`: what one MoE layer saves for backward, as (recipe, Shape) pairs, e.g.
      `[("bf16/capacity", Shape(experts, capacity, hidden)), ...]`, or (recipe, Shape,
      compression) triples for tensors paged compressed (PagePool.record's `compression`). The tensors share the
      layer's routing (one count per expert) and must hold the same tokens per expert.
    - `schedule`: the order of a step's stashes and reloads: 'lifo' (every forward, then
      every backward), '1f1b:P' (P pipeline stages, Megatron-LM's order on the first stage),
      '1f1b:P:V' (interleaved) or 'list:a,b,...' (microbatches held per layer); `layers`
      are the MoE layers on this rank, `microbatches` per step (defaults 4 and 8, the
      command's: `DEFAULTS`). A step overflows if the pool is short at any moment of it.
    - the router, one draw per stash: `tokens` per microbatch, each to `top_k` experts,
      expert popularity from Dirichlet(`alpha`) (smaller: more uneven), every count capped
      at `capacity` (default: what the tensors hold); `correlation` in [0, 1], the share of
      the popularity a step's stashes have in common (0: independent); `sampler`
      'multinomial' (fast) or 'per_token' (exact, slower). Or `counts` measured in training:
      whole steps ([steps, layers x microbatches, experts] nested lists or tensor; stash
      index microbatch * layers + layer), a step drawn at a time; independent vectors
      ([vectors, experts]), one drawn per stash; or a file path (docs/sizing.md's format).
      Counts above the capacity are refused unless `cap_counts`.
    - `overflow`: the target probability that a step overflows; `samples` steps are drawn
      from `seed`; `bootstrap` replicates over measured steps widen the interval by the
      file's error; `page_bytes` and `host_pages` as PagePool takes them.

    Returns a PoolSizing; `sizing.pool(device)` makes the PagePool (or, between steps,
    `pool.reallocate(sizing)` gives a fixed pool that size, `pool.resize_in_place(sizing)` one
    with a reserve). Warns (PoolCostWarning) when the sized pool costs more
    than it saves: its device bytes above `saved_bytes`. Raises ValueError naming
    what is wrong for a bad argument (an unknown recipe, a shape the recipe cannot hold,
    tensors of different capacities, counts beyond the experts, a bad schedule, ...)."""
    pairs = saved_list(saved)
    if counts is None and tokens is None:
        raise ValueError("pagestash.size_pool: give the router (tokens=, top_k=, alpha=) or measured counts=")
    if seed < 0:
        raise ValueError(f"pagestash.size_pool: seed = {seed} must not be negative")
    vectors, steps, path = ([], [], "") if counts is None else _measured(counts)
    layers = DEFAULTS["layers"] if layers is None else layers
    microbatches = DEFAULTS["microbatches"] if microbatches is None else microbatches
    request = dict(recipes=[r for r, _, _ in pairs], shapes=[list(s) for _, s, _ in pairs],
                   compressions=[c for _, _, c in pairs], schedule=schedule,
                   layers=int(layers), microbatches=int(microbatches), tokens=0 if tokens is None else int(tokens),
                   top_k=int(top_k), alpha=float(alpha), sampler=sampler, correlation=float(correlation),
                   capacity=0 if capacity is None else int(capacity), counts_file=path, count_steps=steps,
                   counts=vectors, cap_counts=bool(cap_counts), page_bytes=int(page_bytes),
                   host_pages=int(host_pages), samples=int(samples), seed=int(seed), overflow=float(overflow),
                   confidence=float(confidence), bootstrap=int(bootstrap), curve_points=int(curve_points))
    d = _C.size_pool(**request)
    d["curve"] = [CurvePoint(p, o, (lo, hi)) for p, o, lo, hi in d["curve"]]
    sizing = PoolSizing(**d)
    if sizing.device_bytes > sizing.saved_bytes:
        warnings.warn(f"pagestash: the sized pool costs more than it saves: its {sizing.device_bytes / 2**20:.2f} MiB "
                      f"on the device save {sizing.saved_bytes / 2**20:.2f} MiB of the {sizing.full_bytes / 2**20:.2f} MiB "
                      f"autograd holds for these tensors without paging ({100 * sizing.saved_fraction:.1f}%). Paging pays "
                      "where the router leaves capacity rows empty; with these counts page fewer tensors (or none), "
                      "spill to the host (host_pages=), or size for a higher overflow rate", PoolCostWarning, stacklevel=2)
    return sizing
