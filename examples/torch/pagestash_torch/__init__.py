"""pagestash for PyTorch: paged stashing of grouped MoE activations.

torch.ops.pagestash.{stash, reload, discard, reset, report} over tensors (the host executor
for CPU tensors, the CUDA executor for CUDA ones), a PagePool and records in memory from
PyTorch's allocator, named recipes, and `paged_saved_tensors`, a saved-tensor hook context
that pages marked activations between forward and backward. See docs/python.md.
"""

from ._ops import ops
from .hooks import count_activation, paged_saved_tensors
from .pool import FLAG_NAMES, PagePool, Record, Shape, decode_report, recipe, recipe_info, recipes
from . import _C

with_cuda = _C.with_cuda

__all__ = ["ops", "count_activation", "paged_saved_tensors", "FLAG_NAMES", "PagePool", "Record", "Shape", "decode_report", "recipe",
           "recipe_info", "recipes", "with_cuda"]
