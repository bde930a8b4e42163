"""paged_saved_tensors: a saved_tensors_hooks context that pages marked activations.

Inside the context, a tensor marked with `mark()` (its recipe, shape and device counts) is
stashed into the pool when autograd saves it, and reloaded when backward needs it; every
other saved tensor passes through untouched. The counts are read on the device: nothing
synchronises. A stash that finds no room raises the pool's overflow flag instead of copying;
check `pool.decide()` after backward (before the optimizer step), and on
'rerun_without_paging' reset the pool and run the step again without the context.
"""

import weakref

import torch

from .pool import Shape


def count_activation(storages, t):
    """Adds t's storage to `storages` (data pointer -> bytes) unless t is a parameter (a
    leaf that requires grad): how the example and the tests count the activation bytes
    autograd holds."""
    if not (t.is_leaf and t.requires_grad):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()


class _Group:
    """The buffers of one grouped tensor (data, and scales and amax for quantized recipes),
    stashed together the first time autograd saves one of them and reloaded together the
    first time backward needs one."""

    def __init__(self, pool, recipe, shape, counts, buffers, zero_tail):
        self.pool, self.recipe, self.shape, self.zero_tail = pool, recipe, shape, zero_tail
        self.counts = counts
        self.buffers = buffers  # role -> tensor, until stashed
        self.meta = {role: (t.shape, t.dtype, t.device) for role, t in buffers.items()}
        self.record = None
        self.reloaded = None

    def stash(self):
        if self.record is not None:
            return
        with torch.no_grad():
            self.record = self.pool.record(self.recipe, self.shape)
            b = self.buffers
            self.record.stash(b["data"].detach(), self.counts, b.get("scales"), b.get("amax"))
        self.buffers = None  # the pages hold them now: let the caller's tensors go
        self.counts = None   # the record copied the counts

    def reload(self):
        if self.reloaded is None:
            with torch.no_grad():
                out = {role: torch.empty(shape, dtype=dtype, device=device)
                       for role, (shape, dtype, device) in self.meta.items()}
                self.record.reload(out["data"], out.get("scales"), out.get("amax"), zero_tail=self.zero_tail)
            self.reloaded = out
            self.record = None  # its pages are back in the pool
        return self.reloaded

    def __del__(self):
        # Stashed but never needed (no backward): return the pages.
        if self.record is not None and self.reloaded is None:
            try:
                self.record.discard()
            except Exception:  # interpreter shutdown
                pass


class _Packed:
    """What autograd holds for a paged tensor between forward and backward."""

    __slots__ = ("group", "role")

    def __init__(self, group, role):
        self.group, self.role = group, role


class paged_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """A context in which marked tensors are paged while autograd holds them.

        with paged_saved_tensors(pool) as paging:
            x = paging.mark(x, "bf16/capacity", Shape(capacity, hidden, experts), counts)
            y = layer(x)          # autograd saves x: stashed into the pool
        y.sum().backward()        # backward needs x: reloaded (dead rows zeroed)
    """

    def __init__(self, pool, zero_tail=True):
        self.pool = pool
        self.zero_tail = zero_tail
        self._marked = {}  # id(tensor) -> (weakref to it, group, role)
        self.paged_tensors = 0  # tensors autograd saved that were paged
        self.passed_tensors = 0  # and that passed through
        self._passed_storages = {}
        self.paged_bytes = 0  # bytes of the buffers paged (their full, capacity-padded size)
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        super().__enter__()
        return self

    def __exit__(self, *exc):
        # Only autograd holds the groups from here on: one it lets go of without needing
        # (no backward) returns its pages.
        self._marked = {}
        return super().__exit__(*exc)

    def mark(self, data, recipe, shape, counts, scales=None, amax=None):
        """Marks `data` (with its `scales` and `amax`, for MXFP8 and NVFP4) as one grouped
        tensor of `recipe` and `shape` whose live rows `counts` gives (int32, one per group,
        on the pool's device). Returns `data`. The buffers are checked when stashed."""
        if not isinstance(shape, Shape):
            shape = Shape(*shape)
        buffers = {"data": data}
        if scales is not None:
            buffers["scales"] = scales
        if amax is not None:
            buffers["amax"] = amax
        group = _Group(self.pool, recipe, shape, counts, buffers, self.zero_tail)
        for role, t in buffers.items():
            self._marked[id(t)] = (weakref.ref(t), group, role)
        return data

    def _pack(self, t):
        entry = self._marked.get(id(t))
        if entry is None or entry[0]() is not t:
            self.passed_tensors += 1
            count_activation(self._passed_storages, t)
            return t
        _, group, role = entry
        if group.record is None:
            self.paged_bytes += sum(b.numel() * b.element_size() for b in group.buffers.values())
        group.stash()
        self.paged_tensors += 1
        return _Packed(group, role)

    @property
    def passed_bytes(self):
        """Bytes of the activations that passed through (each storage once; no parameters)."""
        return sum(self._passed_storages.values())

    def _unpack(self, packed):
        if isinstance(packed, _Packed):
            return packed.group.reload()[packed.role]
        return packed
