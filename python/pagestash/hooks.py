"""paged_saved_tensors: a saved_tensors_hooks context that pages marked activations.

Inside the context, a tensor marked with `mark()` (its counts, and its recipe and shape,
inferred from the tensor where they can be) is stashed into the pool when autograd first
saves it, or any tensor over the same bytes (a view or reshape of it, as `x @ w`,
`nn.Linear` and `einsum` save), and reloaded when backward first needs it; every other saved
tensor passes through untouched. The counts are read on the device: nothing synchronises.

Failures: in strict mode (the pool's default: on for CPU pools) the first reload after a
failed stash, a reset or a misuse raises PagingError naming the flags. Otherwise use the
sync-free loop: after backward, pool.agree() across ranks, then pool.decide(), and on
'rerun_without_paging' reset the pool and run the step again without the context.
"""

from __future__ import annotations

import warnings
from typing import Dict, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .pool import PagePool
from .recipes import Shape, infer


class UnpagedWarning(UserWarning):
    """A marked tensor that autograd never saved in the context: nothing of it was paged."""


def count_activation(storages: Dict[int, int], t: torch.Tensor) -> None:
    """Adds t's storage to `storages` (data pointer -> bytes) unless t is a parameter (a
    leaf that requires grad): how the example and the tests count the activation bytes
    autograd holds."""
    if not (t.is_leaf and t.requires_grad):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()


def _is_dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill a contiguous span without gaps or overlaps, in any order of
    dimensions (a contiguous tensor, or a permutation of one)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class _Group:
    """The buffers of one grouped tensor (data, and scales and amax for quantized recipes),
    stashed together the first time autograd saves one of them and reloaded together the
    first time backward needs one."""

    def __init__(self, pool: PagePool, recipe: str, shape: Shape, counts: torch.Tensor,
                 buffers: Dict[str, torch.Tensor], zero_tail: bool, name: str, poison: bool = True):
        self.pool, self.recipe, self.shape, self.zero_tail, self.name = pool, recipe, shape, zero_tail, name
        self.poison = poison
        self.counts = counts
        self.buffers = buffers  # role -> tensor, until stashed
        self.meta = {role: (t.shape, t.dtype, t.device) for role, t in buffers.items()}
        self.record = None
        self.reloaded = None
        self.version = None  # the data's version counter when stashed

    @property
    def stashed(self) -> bool:
        return self.record is not None or self.reloaded is not None

    def stash(self) -> None:
        if self.stashed:
            return
        with torch.no_grad():
            self.record = self.pool.record(self.recipe, self.shape)
            b = self.buffers
            self.version = b["data"]._version
            self.record.stash(b["data"].detach(), self.counts, b.get("scales"), b.get("amax"), check=False)
        self.buffers = None  # the pages hold them now: let the caller's tensors go
        self.counts = None   # the record copied the counts

    def reload(self, strict: bool) -> Dict[str, torch.Tensor]:
        if self.reloaded is None:
            with torch.no_grad():
                out = {role: torch.empty(shape, dtype=dtype, device=device)
                       for role, (shape, dtype, device) in self.meta.items()}
                self.record.reload(out["data"], out.get("scales"), out.get("amax"), zero_tail=self.zero_tail,
                                   poison=self.poison, check=False)
            self.reloaded = out
            self.record = None  # its pages are back in the pool
            if strict:
                self.pool.check(f"at the reload of {self.name}")
        return self.reloaded

    def __del__(self):
        # Stashed but never needed (no backward): return the pages. Guarded: the object may
        # be half made (an exception in __init__, or a copy torch.compile made) or the
        # interpreter shutting down.
        record = getattr(self, "record", None)
        if record is not None and getattr(self, "reloaded", None) is None:
            try:
                record.discard(check=False)
            except Exception:
                pass


class _Packed:
    """What autograd holds for a paged tensor between forward and backward: its group, its
    role, and its geometry when it is a view of the marked buffer (None: the buffer itself)."""

    __slots__ = ("group", "role", "view")

    def __init__(self, group: _Group, role: str, view):
        self.group, self.role, self.view = group, role, view


class paged_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """A context in which marked tensors are paged while autograd holds them.

        with paged_saved_tensors(pool) as paging:
            x = paging.mark(x, counts)  # [experts, capacity, hidden] bf16: recipe and shape inferred
            y = layer(x)                # autograd saves x (or a view of it): stashed into the pool
        y.sum().backward()              # backward needs x: reloaded (dead rows zeroed)

    `zero_tail`: reloaded buffers have their dead rows zeroed (else they are left as
    torch.empty gives them). `poison`: a reload that does not restore fills the buffers with
    poison, NaN (Record.reload; off for those who check the flags). `strict`: raise PagingError
    at the first reload after a failure (default: the pool's `strict`, on for CPU pools). `warn_unpaged`: warn (UnpagedWarning)
    when the context ends for each mark autograd never saved.
    """

    def __init__(self, pool: PagePool, *, zero_tail: bool = True, poison: bool = True,
                 strict: Optional[bool] = None, warn_unpaged: bool = True):
        self.pool = pool
        self.zero_tail = zero_tail
        self.poison = poison
        self.strict = pool.strict if strict is None else bool(strict)
        self.warn_unpaged = warn_unpaged
        self._by_storage: Dict[int, list] = {}  # storage -> [(weak ref, group, role, geometry)]
        self._groups = []
        self.paged_tensors = 0  # tensors autograd saved that were paged
        self.passed_tensors = 0  # and that passed through
        self._passed_storages: Dict[int, int] = {}
        self.paged_bytes = 0  # bytes of the buffers paged (their full, capacity-padded size)
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "paged_saved_tensors":
        super().__enter__()
        return self

    def __exit__(self, *exc):
        # Only autograd holds the groups from here on: one it lets go of without needing
        # (no backward) returns its pages.
        unpaged = [g for g in self._groups if not g.stashed]
        self._by_storage, self._groups = {}, []
        if self.warn_unpaged and exc[0] is None:
            for g in unpaged:
                warnings.warn(f"pagestash: {g.name} was marked but autograd never saved it (nor a view of it) in this "
                              "context: nothing of it was paged. Mark the tensor the layer saves (inside a "
                              "torch.compile'd region, saved tensors are the compiled graph's own), or pass "
                              "warn_unpaged=False", UnpagedWarning, stacklevel=2)
        return super().__exit__(*exc)

    def mark(self, data: torch.Tensor, counts: torch.Tensor, *, recipe: Optional[str] = None,
             shape: Optional[Shape] = None, scales: Optional[torch.Tensor] = None,
             amax: Optional[torch.Tensor] = None, name: Optional[str] = None,
             scale_layout: str = "swizzled") -> torch.Tensor:
        """Marks `data` (with its `scales` and `amax`, for MXFP8 and NVFP4) as one grouped
        tensor whose live rows `counts` gives (int32, one per group, on the pool's device).
        `recipe` and `shape` are inferred from data where they can be (pagestash.infer);
        `name` names it in warnings and errors. Returns `data`. The buffers are checked
        when stashed."""
        if torch.compiler.is_compiling():
            warnings.warn("pagestash: mark() inside a torch.compile'd region pages nothing: mark the layer's input "
                          "outside it", UnpagedWarning, stacklevel=2)
            return data
        recipe, shape = infer(data, counts, recipe=recipe, shape=shape, scales=scale_layout)
        buffers = {"data": data}
        if scales is not None:
            buffers["scales"] = scales
        if amax is not None:
            buffers["amax"] = amax
        name = name or f"marked tensor #{len(self._groups)} ({recipe}, shape {tuple(shape)})"
        group = _Group(self.pool, recipe, shape, counts, buffers, self.zero_tail, name, self.poison)
        self._groups.append(group)
        for role, t in buffers.items():
            geometry = (t.dtype, t.storage_offset(), t.numel(), t.is_contiguous())
            entry = (StorageWeakRef(t.untyped_storage()), group, role, geometry)
            self._by_storage.setdefault(t.untyped_storage()._cdata, []).append(entry)
        return data

    def _lookup(self, t: torch.Tensor):
        """(group, role, view) when t is a marked buffer or a view over exactly its bytes."""
        if not self._by_storage or t.layout != torch.strided:
            return None
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, functional)
            return None
        for ref, group, role, (dtype, offset, numel, contiguous) in self._by_storage.get(key, ()):
            if ref.expired() or t.dtype != dtype or t.storage_offset() != offset or t.numel() != numel:
                continue
            if not (contiguous and _is_dense(t)):
                continue
            if group.stashed and t._version != group.version:
                continue  # changed in place since it was stashed: what autograd saves now is not in the pages
            marked_shape = group.meta[role][0]
            view = None if (t.is_contiguous() and t.shape == marked_shape) else (tuple(t.shape), tuple(t.stride()))
            return group, role, view
        return None

    def _pack(self, t: torch.Tensor):
        found = self._lookup(t)
        if found is None:
            self.passed_tensors += 1
            count_activation(self._passed_storages, t)
            return t
        group, role, view = found
        if not group.stashed:
            self.paged_bytes += sum(b.numel() * b.element_size() for b in group.buffers.values())
        group.stash()
        self.paged_tensors += 1
        return _Packed(group, role, view)

    @property
    def passed_bytes(self) -> int:
        """Bytes of the activations that passed through (each storage once; no parameters)."""
        return sum(self._passed_storages.values())

    def _unpack(self, packed):
        if not isinstance(packed, _Packed):
            return packed
        t = packed.group.reload(self.strict)[packed.role]
        return t if packed.view is None else t.as_strided(*packed.view)
