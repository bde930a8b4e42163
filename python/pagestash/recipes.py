"""Recipes (the layouts the extension instantiates, by name) and grouped-tensor shapes, in
PyTorch's terms: a shape is read in the tensor's own order, and a recipe and shape can be
inferred from the tensor where that is unambiguous."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch

from . import _C

#: Each recipe as the extension reports it (pagestash/layouts/recipes.hpp, the one list):
#: name, family (the number format), placement, scales ('' where none), and the torch
#: dtype names of its data and scales (None: raw bytes, or no scales).
_TABLE = _C.recipe_table()


def _dtype(name: Optional[str]) -> Optional[torch.dtype]:
    return None if name is None else getattr(torch, name)


#: The compressions a stash offers (pagestash/layouts/recipes.hpp): 'lossless' (byte for byte, the
#: default), then each lossy format ('mxfp8', 'mxfp8_e5m2', 'fp8_1x128'), which only the recipes
#: whose table row says `compressible` (bf16 and fp16) take.
COMPRESSIONS = tuple(_C.compression_names())


def compression_of(compression: Optional[str]) -> str:
    """The compression named by a `compression=` argument: None is 'lossless'. Raises ValueError
    naming the known compressions for anything else."""
    if compression is None:
        return COMPRESSIONS[0]
    if not isinstance(compression, str) or compression not in COMPRESSIONS:
        raise ValueError(f"pagestash: unknown compression {compression!r} (known: {', '.join(COMPRESSIONS)})")
    return compression


#: The number format of each recipe family, and the dtypes its data and scales may have
#: (None: raw bytes, or no scales; uint8 stands for raw bytes in every family).
FAMILIES = {r["family"]: dict(data=_dtype(r["data_dtype"]), scales=_dtype(r["scales_dtype"])) for r in _TABLE}


@dataclass(frozen=True)
class Shape:
    """A grouped tensor's shape, in the order of a capacity-padded tensor's dimensions:
    `groups` (experts), `tokens` (per group for a `capacity` recipe: the capacity; in all
    for a `packed` one) and `hidden` (elements per token; for `plain`, bytes per row).

    A `[groups, capacity, hidden]` BF16 tensor is `Shape(groups, capacity, hidden)`; a
    packed `[tokens, hidden]` one with 8 experts is `Shape(8, tokens, hidden)`."""

    groups: int
    tokens: int
    hidden: int

    def __iter__(self) -> Iterator[int]:  # the ops' `int[] shape`
        return iter((int(self.groups), int(self.tokens), int(self.hidden)))

    def __len__(self) -> int:  # torch.compile guards an iterable's length
        return 3


def recipes() -> List[str]:
    """The recipe names this build instantiates, e.g. 'bf16/capacity', 'nvfp4/packed/swizzled'."""
    return list(_C.recipes())


def family_of(recipe: str) -> str:
    """The number format of a recipe: its name up to the first '/'."""
    return recipe.split("/")[0]


def recipe(family: str, placement: str = "capacity", scales: str = "swizzled") -> str:
    """The name of a recipe: `family` one of FAMILIES ('plain', 'bf16', 'fp16', 'fp32',
    'mxfp8', 'mxfp8_e5m2', 'nvfp4'); `placement` 'packed' (groups back to back),
    'packed_padded' (packed, each group's scales padded to whole tiles) or 'capacity'
    ([groups, capacity, ...]); `scales` 'compact' or 'swizzled' (cuBLAS's 128x4 tiles; MXFP8
    and NVFP4 only); each ignored where the recipe has none. Raises ValueError for a name
    this build does not have."""
    return _recipe_name(family, placement, scales)


def _recipe_name(family: str, placement: str, scales: str) -> str:
    for r in _TABLE:
        if r["family"] == family and r["placement"] in ("", placement) and r["scales"] in ("", scales):
            return r["name"]
    raise ValueError(f"pagestash: no recipe of family {family!r}, placement {placement!r}, scales {scales!r} "
                     f"(known: {', '.join(_C.recipes())})")


def recipe_info(recipe: str, shape: Shape, compression: Optional[str] = None) -> dict:
    """Each buffer's bytes for `shape` (data_bytes, scales_bytes, amax_bytes), the count
    alignment, the token granule `tokens` must be a multiple of, and how each buffer is
    handled (scales_paged, amax_kept). Raises ValueError for a shape the layout refuses, and
    for a compression the recipe or shape cannot take."""
    return _C.recipe_info(recipe, list(shape), compression_of(compression))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype)  # 'torch.bfloat16'


def infer(data: torch.Tensor, counts: Optional[torch.Tensor] = None, *, recipe: Optional[str] = None,
          shape: Optional[Shape] = None, scales: str = "swizzled") -> Tuple[str, Shape]:
    """The recipe and shape of a grouped tensor whose data is `data` and whose live rows
    `counts` gives (one int32 per group), where they follow from the tensor:

    - the family from data's dtype (bfloat16, float16, float32, float8_e4m3fn: MXFP8,
      float8_e5m2: MXFP8 E5M2, float4_e2m1fn_x2: NVFP4); uint8 bytes need `recipe`;
    - the placement from its dimensions: `[groups, capacity, hidden]` is 'capacity',
      `[tokens, hidden]` is 'packed' (groups = counts' length); NVFP4's transposed
      capacity data is `[groups, hidden, capacity / 2]`; a packed NVFP4 tensor needs `shape`;
    - `scales` ('swizzled' by default, as cuBLAS takes them; or 'compact') for MXFP8 and
      NVFP4.

    Either given argument wins. Raises ValueError naming what is missing."""
    if recipe is not None and shape is not None:
        return recipe, shape
    family = family_of(recipe) if recipe is not None else None
    if family is None:
        family = next((f for f, d in FAMILIES.items() if d["data"] == data.dtype), None)
        if family is None:
            known = ", ".join(_dtype_name(d["data"]) for d in FAMILIES.values() if d["data"] is not None)
            raise ValueError(f"pagestash: no recipe is inferred from {_dtype_name(data.dtype)} data: pass recipe= "
                             f"(data dtypes with an inferred recipe: {known})")
    if family == "plain":
        raise ValueError("pagestash: recipe 'plain' needs shape=")
    if recipe is not None and "/" in recipe:
        placement = recipe.split("/")[1]
    elif data.dim() in (2, 3):
        placement = "capacity" if data.dim() == 3 else "packed"
    else:
        raise ValueError(f"pagestash: cannot infer the placement of {family} data of shape {list(data.shape)}: "
                         "pass [groups, capacity, hidden] or [tokens, hidden], or recipe= and shape=")
    if recipe is None:
        recipe = _recipe_name(family, placement, scales)
    if shape is None:
        shape = _infer_shape(family, placement, data, counts)
    return recipe, shape


def _infer_shape(family: str, placement: str, data: torch.Tensor, counts: Optional[torch.Tensor]) -> Shape:
    sizes = list(data.shape)
    what = f"{family}/{placement} data of shape {sizes} ({_dtype_name(data.dtype)})"
    if data.dtype == torch.uint8 and family != "mxfp8" and family != "mxfp8_e5m2":
        raise ValueError(f"pagestash: cannot infer the shape of {what}: pass shape=")
    if placement == "capacity":
        if data.dim() != 3:
            raise ValueError(f"pagestash: {what}: a capacity recipe's data is [groups, capacity, hidden]"
                             f"{' ([groups, hidden, capacity / 2] for NVFP4)' if family == 'nvfp4' else ''}; or pass shape=")
        if family == "nvfp4":  # transposed, 2 values a byte
            return Shape(sizes[0], 2 * sizes[2], sizes[1])
        return Shape(*sizes)
    if family == "nvfp4" or data.dim() != 2:
        raise ValueError(f"pagestash: cannot infer the shape of {what}: a packed recipe's data is [tokens, hidden] "
                         "(NVFP4's groups are transposed one by one: pass shape=)")
    if counts is None:
        raise ValueError(f"pagestash: {what}: packed groups are counted by `counts`: pass counts or shape=")
    return Shape(counts.numel(), sizes[0], sizes[1])
