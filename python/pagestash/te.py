"""TransformerEngine's paged-stash markers: what TE's grouped layers mark for backward, paged as
the recipe its layout is, with no mark() call.

TE (`transformer_engine/pytorch/utils.py`, `mark_grouped_tensor`, from PR 3423; the fused grouped
MLP, `transformer_engine/pytorch/ops/fused/grouped_mlp.py`, calls it) sets the attribute
`grouped_tensor_scale_inv` on the storage its grouped layers save: `False` on a plain or
unquantized tensor and on a quantized grouped tensor's `columnwise_data`, `True` on its
`columnwise_scale_inv`. The buffers are TE's grouped storage: flat (1-D) `torch.uint8` for
MXFP8 and NVFP4 (`GroupedTensorStorage`, `Quantizer::create_grouped_tensor`), of `tokens` rows
(the buffer's first logical dimension) of `hidden` elements.

Inside a paged context, within `te_layer(counts, tokens)`, a saved tensor that carries the
attribute becomes what `mark()` would have made of it:

- unquantized (bfloat16, float16, float32; marker False): rows, `'<dtype>/packed'`,
  `Shape(len(counts), tokens, numel / tokens)`;
- quantized (marker False on the data, True on its scales, saved one after the other, as TE's
  `prepare_for_saving` lists them): the family from the two sizes (MXFP8: `tokens * hidden`
  data bytes and `ru(tokens / 32, 4) * ru(hidden, 128)` E8M0 scales, 32 tokens a block; NVFP4:
  `tokens * hidden / 2` data bytes, transposed, and `ru(hidden, 128) * ru(ceil(tokens / 16), 4)`
  E4M3 scales, 16 tokens a block: `get_scale_shape` of the whole `[tokens, hidden]`), the
  placement from TE's number of groups: several (`groups > 1`, TE's graph-safe grouped kernels:
  each group's block after the last, `'packed'`) or one (TE quantizes the whole tensor:
  NVFP4's columnwise data is `[hidden, tokens / 2]`, its live bytes a run per hidden row,
  `'capacity'` with one group), and the scales `'swizzled'` (TE's GEMM-ready storage) unless
  `te_layer(scales='compact')`. NVFP4's amax is not marked: TE keeps it (autograd holds its
  `groups` floats); the record's amax is a zero of its own.

A marked tensor that fits no layout (its dtype, its size against `tokens`, a quantized
buffer without its partner) raises ValueError naming it: nothing is paged as what it is not.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import List, Optional, Tuple

import torch

from .hooks import PackedSave, UnpagedWarning, paged_contexts, register_marker
from .recipes import Shape, recipe_info

#: The attribute TransformerEngine's mark_grouped_tensor sets: False on data (and plain tensors),
#: True on a quantized grouped tensor's columnwise scales.
MARKER = "grouped_tensor_scale_inv"

#: Elements of a quantization block along tokens, and the TE format each family is.
MXFP8_BLOCK, NVFP4_BLOCK = 32, 16

_ROWS = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# The dtypes TE's quantized storage may have (its own is uint8), by role, and the families each allows.
_DATA = {torch.uint8: ("mxfp8", "nvfp4"), torch.float8_e4m3fn: ("mxfp8",), torch.float8_e5m2: ("mxfp8_e5m2",),
         torch.float4_e2m1fn_x2: ("nvfp4",)}
_SCALES = {torch.uint8: ("mxfp8", "mxfp8_e5m2", "nvfp4"), torch.float8_e8m0fnu: ("mxfp8", "mxfp8_e5m2"),
           torch.float8_e4m3fn: ("nvfp4",)}


def _ru(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _cdiv(x: int, m: int) -> int:
    return (x + m - 1) // m


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _describe(t: torch.Tensor) -> str:
    return f"{t.dtype}, shape {list(t.shape)}, {_nbytes(t)} bytes"


def te_scale_bytes(family: str, tokens: int, hidden: int) -> int:
    """The bytes of TE's columnwise scales of a `[tokens, hidden]` tensor (get_scale_shape(shape,
    columnwise=True)): MXFP8 `[ru(tokens // 32, 4), ru(hidden, 128)]`, NVFP4
    `[ru(hidden, 128), ru(ceil(tokens / 16), 4)]`, one byte each."""
    if family == "nvfp4":
        return _ru(hidden, 128) * _ru(_cdiv(tokens, NVFP4_BLOCK), 4)
    return _ru(tokens // MXFP8_BLOCK, 4) * _ru(hidden, 128)


def rows_layout(data: torch.Tensor, tokens: int, groups: int = 1) -> Tuple[str, Shape]:
    """The recipe and shape of TE's unquantized grouped storage (marker False): `tokens` rows of
    `numel / tokens` elements, packed, `groups` counts. Raises ValueError when it is no such tensor."""
    family = _ROWS.get(data.dtype)
    if family is None:
        raise ValueError(f"its dtype {data.dtype} is neither unquantized rows ({', '.join(map(str, _ROWS))}) nor "
                         f"TE's quantized data ({', '.join(map(str, _DATA))})")
    if data.dim() not in (1, 2) or (data.dim() == 2 and data.shape[0] != tokens) or data.numel() % tokens:
        raise ValueError(f"TE's unquantized grouped storage is [tokens * hidden] or [tokens, hidden] with tokens = "
                         f"{tokens} (the layer's te_layer(tokens=...)); {list(data.shape)} is neither")
    if data.numel() == 0:
        raise ValueError("it is empty")
    return f"{family}/packed", Shape(groups, tokens, data.numel() // tokens)


def quantized_layout(data: torch.Tensor, scales: torch.Tensor, tokens: int, groups: int, te_groups: int,
                     scale_layout: str = "swizzled") -> Tuple[str, Shape]:
    """The recipe and shape of TE's columnwise quantized grouped storage: `data` (marker False)
    and its `scales` (marker True), `tokens` rows, `te_groups` TE groups (1: one tensor quantized
    whole; more: TE's grouped kernels, each group's block after the last), `groups` counts.
    The family is the one whose TE sizes both buffers have. Raises ValueError naming what fits
    none."""
    d, s = _nbytes(data), _nbytes(scales)
    families = [f for f in _DATA.get(data.dtype, ()) if f in _SCALES.get(scales.dtype, ())]
    if not families:
        raise ValueError(f"data of {data.dtype} and scales of {scales.dtype} are no TE quantized pair (data: "
                         f"{', '.join(map(str, _DATA))}; scales: {', '.join(map(str, _SCALES))})")
    fits, tried = [], []
    for family in families:
        elements = 2 * d if family == "nvfp4" else d  # NVFP4: two values a byte
        hidden = elements // tokens
        block = NVFP4_BLOCK if family == "nvfp4" else MXFP8_BLOCK
        if elements % tokens or hidden == 0:
            tried.append(f"{family}: {d} data bytes are not {tokens} tokens of whole rows")
        elif hidden % block:
            tried.append(f"{family}: hidden {hidden} is not a multiple of its block {block}")
        elif s != te_scale_bytes(family, tokens, hidden):
            tried.append(f"{family}: hidden {hidden} has {te_scale_bytes(family, tokens, hidden)} scale bytes, "
                         f"not {s}")
        else:
            fits.append((family, hidden))
    if len(fits) != 1:
        raise ValueError("its size fits no TE layout: " + "; ".join(tried) if not fits else
                         f"its size fits several TE layouts ({fits}): pass typed buffers")
    family, hidden = fits[0]
    if te_groups > 1 and hidden % 128:
        raise ValueError(f"TE's grouped kernels ({te_groups} groups) need hidden a multiple of 128, not {hidden}")
    placement = "packed" if te_groups > 1 else "capacity"
    return f"{family}/{placement}/{scale_layout}", Shape(groups if te_groups > 1 else 1, tokens, hidden)


class te_layer:
    """The counts of one TransformerEngine grouped layer, for the paged context it runs in.

        with ps.paged_saved_tensors(pool) as paging:
            with ps.te_layer(tokens_per_expert, tokens=T):  # per-expert counts (int, on the pool's device)
                y = grouped_mlp(x, tokens_per_expert)        # what TE marks is paged: no mark() call

    `counts`: the layer's device counts, per group (`[groups]`) or their total (one element,
    then `groups=` says TE's number of groups); any integer dtype, converted to int32 once
    (no sync). `tokens`: the rows of TE's grouped buffers (their first logical dimension, what
    Megatron calls max_num_tokens). `groups`: TE's number of groups (default: counts' length);
    `scales`: 'swizzled' (TE's GEMM-ready scales, the default) or 'compact'. `name` names the
    layer in errors. Outside a paged context (an unpaged rerun) it does nothing.

    `saved` lists the (recipe, Shape) of what the layer paged, in order: `size_pool`'s and
    `auto_resize`'s `saved` for such a layer. `paged` counts the grouped tensors it paged."""

    def __init__(self, counts: torch.Tensor, tokens: int, *, groups: Optional[int] = None, scales: str = "swizzled",
                 name: Optional[str] = None):
        if not isinstance(counts, torch.Tensor) or counts.dtype.is_floating_point or counts.dtype.is_complex \
                or counts.dtype == torch.bool or counts.dim() > 1 or counts.numel() == 0:
            raise ValueError(f"pagestash: te_layer(): counts must be a 0-d or 1-d integer tensor (per group, or "
                             f"their total), not {counts!r}")
        for arg, value in (("tokens", tokens), ("groups", groups)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"pagestash: te_layer(): {arg} must be an int >= 1, not {value!r}")
        if scales not in ("swizzled", "compact"):
            raise ValueError(f"pagestash: te_layer(): scales must be 'swizzled' or 'compact', not {scales!r}")
        n = counts.numel()
        groups = n if groups is None else groups
        if n not in (1, groups):
            raise ValueError(f"pagestash: te_layer(): {n} counts for {groups} groups: pass one per group, or their total")
        with torch.no_grad():
            self.counts = counts.detach().reshape(-1).to(torch.int32)
        self.tokens, self.groups, self.scales, self.name = tokens, groups, scales, name
        self.saved: List[Tuple[str, Shape]] = []
        self.paged = 0
        self.paging = None
        self._pending = None  # a quantized buffer saved before its partner: [tensor, role, packs, name]

    def __enter__(self) -> "te_layer":
        contexts = paged_contexts()
        self.paging = contexts[-1] if contexts else None
        _layers().append(self)
        return self

    def __exit__(self, *exc):
        if self in _layers():
            _layers().remove(self)
        pending, self._pending = self._pending, None
        self.paging = None
        if pending is not None:
            for packed in pending[2]:  # backward gets the tensor as autograd saved it
                packed.group = _Held(pending[0], pending[1])
            if exc[0] is None:
                raise ValueError(_refusal(pending[3], pending[0], self,
                                          f"its {_partner(pending[1])} was never saved in the layer (TE saves a "
                                          "quantized grouped tensor's columnwise_data and columnwise_scale_inv "
                                          "together)"))
        return False

    def _label(self) -> str:
        return f"te_layer {self.name!r}" if self.name else "te_layer"


class _Held:
    """What an unpack of a marked buffer that was never paged gets: the tensor autograd saved."""

    order = None

    def __init__(self, t: torch.Tensor, role: str):
        self.t, self.role = t, role

    def reload(self, strict, cuda_streams):
        return {self.role: self.t}


_state = threading.local()
_warned = weakref.WeakSet()


def _layers() -> list:
    if not hasattr(_state, "layers"):
        _state.layers = []
    return _state.layers


def _partner(role: str) -> str:
    return "columnwise_scale_inv (marker True)" if role == "data" else "columnwise_data (marker False)"


def _refusal(name: str, t: torch.Tensor, layer: te_layer, why: str) -> str:
    return (f"pagestash: {name} ({_describe(t)}, {MARKER}={bool(getattr(t, MARKER, False))}), saved in "
            f"{layer._label()}(tokens={layer.tokens}, groups={layer.groups}), fits no TransformerEngine grouped "
            f"layout: {why}. Nothing of it was paged (docs/python.md, TransformerEngine's markers)")


def pack_marked(paging, t: torch.Tensor):
    """The pack hook's part for a tensor TransformerEngine marked that is not marked yet: marks
    it (mark(), as the layer's counts and the inferred recipe) and returns None, for the hook to
    find it; returns a PackedSave for a quantized buffer saved before its partner (completed when
    the partner comes); None as well when no te_layer of this context gives counts (it passes
    through). Raises ValueError for a tensor that fits no TE layout."""
    layer = next((l for l in reversed(_layers()) if l.paging is paging), None)
    # A save inside a backward (a checkpoint's recomputation) is not paged, nor one in compiled code. (Grad mode
    # says nothing here: a custom Function's saves are packed with grad off.)
    if layer is None or torch._C._current_graph_task_id() != -1 or torch.compiler.is_compiling():
        if layer is None and paging.warn_unpaged and paging not in _warned:
            _warned.add(paging)
            warnings.warn(f"pagestash: a TransformerEngine-marked tensor ({_describe(t)}) was saved in a paged context "
                          "outside any pagestash.te_layer(counts, tokens): it passes through unpaged. Run the TE layer "
                          "inside te_layer with its counts; or pass warn_unpaged=False", UnpagedWarning, stacklevel=3)
        return None
    marker = bool(getattr(t, MARKER))
    index = len(layer.saved) + (layer._pending is not None)
    name = f"TE-marked tensor #{index} of {layer._label()}"
    if not marker and t.dtype in _ROWS:
        try:
            recipe, shape = rows_layout(t, layer.tokens, layer.counts.numel())
        except ValueError as e:
            raise ValueError(_refusal(name, t, layer, str(e))) from None
        if not t.is_contiguous():
            raise ValueError(_refusal(name, t, layer, "it is not contiguous (TE's grouped storage is)"))
        with torch.enable_grad():  # mark() pages nothing under no_grad
            paging.mark(t.view(layer.tokens, shape.hidden), layer.counts, recipe=recipe, shape=shape,
                        name=f"{name} ({recipe}, shape {tuple(shape)})")
        layer.saved.append((recipe, shape))
        layer.paged += 1
        return None
    role = "scales" if marker else "data"
    if t.dtype not in (_SCALES if marker else _DATA):
        raise ValueError(_refusal(name, t, layer, f"{t.dtype} is no dtype of TE's "
                                  f"{'columnwise scales' if marker else 'grouped data'}"))
    if not t.is_contiguous():
        raise ValueError(_refusal(name, t, layer, "it is not contiguous (TE's grouped storage is)"))
    pending = layer._pending
    if pending is not None and pending[1] == role:
        held = pending[0]
        if held.data_ptr() == t.data_ptr() and held.dtype == t.dtype and held.shape == t.shape:
            packed = PackedSave(None, role, None)  # the same buffer saved again before its partner
            pending[2].append(packed)
            return packed
        layer._pending = None
        for p in pending[2]:
            p.group = _Held(held, role)
        raise ValueError(_refusal(pending[3], held, layer, f"the next TE-marked buffer saved in the layer is another "
                                  f"{'scales' if marker else 'data'} buffer, not its {_partner(role)}"))
    if pending is None:
        packed = PackedSave(None, role, None)  # completed when its partner is saved
        layer._pending = [t, role, [packed], name]
        return packed
    layer._pending = None
    data, scales = (pending[0], t) if role == "scales" else (t, pending[0])
    try:
        recipe, shape = quantized_layout(data, scales, layer.tokens, layer.counts.numel(), layer.groups,
                                         layer.scales)
        recipe_info(recipe, shape)  # a shape the recipe refuses (tokens not a multiple of 128): now, named
    except ValueError as e:
        for p in pending[2]:
            p.group = _Held(pending[0], pending[1])
        raise ValueError(_refusal(pending[3], data, layer, f"with its scales ({_describe(scales)}): {e}")) from None
    amax = None
    if recipe.startswith("nvfp4/"):
        amax = torch.zeros(shape.groups, dtype=torch.float32, device=data.device)
    with torch.enable_grad():  # mark() pages nothing under no_grad
        paging.mark(data, layer.counts, recipe=recipe, shape=shape, scales=scales, amax=amax,
                    name=f"{pending[3]} and its {'scales' if role == 'scales' else 'data'} ({recipe}, shape "
                         f"{tuple(shape)})")
    group = paging.last_marked
    for p in pending[2]:
        p.group = group
        paging.count_save(group)
    packed = PackedSave(group, role, None)
    paging.count_save(group)
    paging.stash_behind()
    layer.saved.append((recipe, shape))
    layer.paged += 1
    return packed


register_marker(MARKER, pack_marked)  # the hook pages what TE marks (hooks.py does not import this module)
