"""pagestash for PyTorch: paged stashing of grouped MoE activations.

torch.ops.pagestash.{stash, reload, discard, reset, end_step, report} over tensors (the host executor
for CPU tensors, the CUDA executor for CUDA ones), a PagePool (its memory from PyTorch's allocator,
or, with a reserve, mapped by the library: pagestash.memory; its steps in a StepLog) and records,
named recipes, and `paged_saved_tensors`, a saved-tensor hook context
that pages marked activations between forward and backward, and `size_pool`, which sizes a
pool for a target overflow probability (from the run's own counts: PagePool.observe), and
`run_step`, which runs one optimizer step's microbatches paged and reruns the whole step
without paging when paging failed; a pool with a reserve grows and shrinks between steps
(PagePool(reserve_bytes=...), grow, shrink, auto_resize). See
docs/python.md.
"""

import torch  # noqa: F401  (first: it loads libtorch and libc10, which _C links against)

from . import _C
from ._ops import ops
from .errors import (FLAG_CATEGORIES, FLAG_MEANINGS, FLAG_NAMES, OverflowRateWarning, PagingError, PoolCostWarning,
                     UnpagedStepsWarning, UnpagedWarning)
from .memory import PoolMemory, ReservedMemory, TorchMemory
from .steplog import StepLog
from .pool import PagePool, Record, decode_report
from .hooks import count_activation, mark, paged_saved_tensors
from .sizing import CurvePoint, PoolSizing, size_pool
from .resizing import AutoResize
from .recipes import COMPRESSIONS, FAMILIES, Shape, infer, recipe, recipe_info, recipes
from .step import OUTCOMES, PagedStep, PagingWarning, StepOutcome, run_step
from .pipelining import PipelinePaging, pipeline_schedule
from .te import te_layer

#: Whether this build has the CUDA executor (CUDA tensors); the host executor is always there.
with_cuda: bool = _C.with_cuda
__version__: str = _C.version

__all__ = ["ops", "COMPRESSIONS", "FAMILIES", "FLAG_CATEGORIES", "FLAG_MEANINGS", "FLAG_NAMES", "OverflowRateWarning", "PagingError", "PoolCostWarning",
           "UnpagedStepsWarning", "UnpagedWarning", "count_activation",
           "paged_saved_tensors", "CurvePoint", "PoolSizing", "size_pool", "PagePool", "Record", "decode_report", "Shape",
           "infer", "recipe", "recipe_info", "recipes", "PagedStep", "PagingWarning", "run_step", "StepOutcome", "OUTCOMES", "StepLog",
           "PoolMemory", "TorchMemory", "ReservedMemory", "AutoResize", "mark", "PipelinePaging", "pipeline_schedule", "te_layer", "with_cuda", "__version__"]
