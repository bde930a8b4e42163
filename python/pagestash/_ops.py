"""The compiled extension and the fake implementations of torch.ops.pagestash.

Every op takes the pool's state first (control, device_arena, host_arena, page_bytes: see
PagePool.state), then, for stash, reload and discard, the record's memory, its recipe and
its shape as [groups, tokens, hidden]; keyword arguments by these names work too:

    stash(control, device_arena, host_arena, page_bytes, record, recipe, shape, data, counts,
          scales=None, amax=None, compression='lossless')
    reload(control, device_arena, host_arena, page_bytes, record, recipe, shape, data,
           scales=None, amax=None, zero_tail=False, poison=True, compression='lossless')
    discard(control, device_arena, host_arena, page_bytes, record, recipe, shape, compression='lossless')

`compression` is the record's (PagePool.record's `compression`: 'lossless', or a lossy format of
pagestash.COMPRESSIONS), the one it was made with.
    reset(control, device_arena, host_arena, page_bytes)
    end_step(control, device_arena, host_arena, page_bytes)
    report(control, device_arena, host_arena, page_bytes, out)

The ops mutate only their arguments (the pool's and the record's memory, and reload's
destination) and return nothing, so their fake implementations, which torch.compile traces
with, do nothing (they refuse a meta tensor beside a real pool, which would reach them too).
An op reads the pool's state from its tensors only, and keeps nothing between calls: it is a
function of its arguments, which is what functionalization and opcheck assume. Who owns the
memory behind the tensors is the pool's memory (memory.py): PyTorch's allocator for a fixed
pool, the extension's ReservedPool for a pool with a reserve (its tensors keep it alive);
the ops see the same three tensors either way.
"""

import torch

from . import _C  # noqa: F401  (registers torch.ops.pagestash)

ops = torch.ops.pagestash


def _no_meta_beside_a_real_pool(control, **tensors):
    """A meta tensor among real ones sends the op to its fake implementation (the Meta
    kernel), which does nothing: refuse it rather than page nothing silently. Tracing
    (torch.compile's fake tensors keep their real devices) and an all-meta call pass."""
    if control.device.type == "meta":
        return
    for name, t in tensors.items():
        if t is not None and t.device.type == "meta":
            raise ValueError(f"pagestash: {name} is a meta tensor (it holds no data) and the pool is on "
                             f"{control.device}: the op would do nothing. Pass {name} on {control.device}")


@torch.library.register_fake("pagestash::stash")
def _stash_fake(control, device_arena, host_arena, page_bytes, record, recipe, shape, data, counts, scales=None,
                amax=None, compression="lossless"):
    _no_meta_beside_a_real_pool(control, device_arena=device_arena, host_arena=host_arena, record=record, data=data,
                                counts=counts, scales=scales, amax=amax)


@torch.library.register_fake("pagestash::reload")
def _reload_fake(control, device_arena, host_arena, page_bytes, record, recipe, shape, data, scales=None, amax=None,
                 zero_tail=False, poison=True, compression="lossless"):
    _no_meta_beside_a_real_pool(control, device_arena=device_arena, host_arena=host_arena, record=record, data=data,
                                scales=scales, amax=amax)


@torch.library.register_fake("pagestash::discard")
def _discard_fake(control, device_arena, host_arena, page_bytes, record, recipe, shape, compression="lossless"):
    _no_meta_beside_a_real_pool(control, device_arena=device_arena, host_arena=host_arena, record=record)


@torch.library.register_fake("pagestash::reset")
def _reset_fake(control, device_arena, host_arena, page_bytes):
    return None


@torch.library.register_fake("pagestash::end_step")
def _end_step_fake(control, device_arena, host_arena, page_bytes):
    return None


@torch.library.register_fake("pagestash::report")
def _report_fake(control, device_arena, host_arena, page_bytes, out):
    _no_meta_beside_a_real_pool(control, device_arena=device_arena, host_arena=host_arena, out=out)


_DOCS = {
    "stash": "Moves the live bytes of (data, scales) into pages of the pool and keeps amax in the record; counts "
             "(int32, one per group) is read where the op runs. A stash that finds no room raises the pool's "
             "overflow flag instead of copying.",
    "reload": "Copies the record's stashed bytes into (data, scales, amax) and returns its pages; with zero_tail, "
              "the paged buffers' bytes outside the live rows are cleared. A reload that does not restore (the "
              "record's stash failed, a double or stale reload, a refused launch) fills data, scales and amax with "
              "poison (every byte 0xFF: NaN) unless poison=False.",
    "discard": "Returns the record's pages without copying.",
    "reset": "Frees every page and clears the flags and counters; records stashed before become stale.",
    "end_step": "At the end of a step: counts the pages still held (pages_held_at_step_end) and raises the "
                "unbalanced flag when there are any (a record neither reloaded nor discarded).",
    "report": ("Writes the pool's flags and counters into out (uint8, pagestash._C.report_bytes()) "
               "in CUDA stream order."),
}
for _name, _doc in _DOCS.items():
    getattr(ops, _name).__doc__ = f"torch.ops.pagestash.{_name}: {_doc} (Arguments: see pagestash._ops.)"
