"""The compiled extension and the fake implementations of torch.ops.pagestash.

The ops mutate only their arguments (the pool's and the record's memory, and reload's
destination) and return nothing, so their fake implementations, which torch.compile traces
with, do nothing. The state lives in the tensors, never in the extension: an op is a
function of its arguments, which is what functionalization and opcheck assume.
"""

import torch

from . import _C  # noqa: F401  (registers torch.ops.pagestash)

ops = torch.ops.pagestash


@torch.library.register_fake("pagestash::stash")
def _stash_fake(control, device_arena, host_arena, record, recipe, page_bytes, max_tokens, hidden, groups, data,
                scales, amax, counts):
    return None


@torch.library.register_fake("pagestash::reload")
def _reload_fake(control, device_arena, host_arena, record, recipe, page_bytes, max_tokens, hidden, groups, data,
                 scales, amax, zero_tail=False):
    return None


@torch.library.register_fake("pagestash::discard")
def _discard_fake(control, device_arena, host_arena, record, recipe, page_bytes, max_tokens, hidden, groups):
    return None


@torch.library.register_fake("pagestash::reset")
def _reset_fake(control, device_arena, host_arena, page_bytes):
    return None


@torch.library.register_fake("pagestash::report")
def _report_fake(control, device_arena, host_arena, page_bytes, out):
    return None
