"""Misuse that once passed silently or said nothing useful: a record reached through the raw ops
as another recipe, compression or shape (the record_mismatch flag, on every executor), counts
changed behind autograd's back after mark(), a pool pickled, nested saved-tensor hooks, and
bad arguments to mark()."""

import copy
import io
import pickle

import pytest
import torch

import pagestash as ps
from test_ops import SEED, buffers_for

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available() or not ps.with_cuda, reason="no CUDA device (or a build without CUDA)"))]

S = ps.Shape(2, 64, 128)
# (what the record was made for) -> (what the raw op says): recipe, compression, shape. Same
# bytes where they can be (bf16 and fp16), other bytes too (the record's size then differs).
MISMATCHES = {
    "bf16 record as fp16": (("bf16/capacity", "lossless", S), ("fp16/capacity", "lossless", S)),
    "mxfp8 record as mxfp8_e5m2": (("bf16/capacity", "mxfp8", S), ("bf16/capacity", "mxfp8_e5m2", S)),
    "mxfp8 record as lossless": (("bf16/capacity", "mxfp8", S), ("bf16/capacity", "lossless", S)),
    "lossless record as fp8_1x128": (("bf16/capacity", "lossless", S), ("bf16/capacity", "fp8_1x128", S)),
    "taller shape": (("bf16/capacity", "lossless", S), ("bf16/capacity", "lossless", ps.Shape(2, 128, 128))),
    "more groups, same bytes": (("bf16/capacity", "lossless", S), ("bf16/capacity", "lossless", ps.Shape(4, 32, 128))),
    "nvfp4 as mxfp8 (quantized)": (("nvfp4/capacity/swizzled", "lossless", ps.Shape(2, 128, 128)),
                                   ("mxfp8/capacity/swizzled", "lossless", ps.Shape(2, 128, 128))),
}


def op_buffers(recipe, compression, shape, gen, device):
    data, scales, amax, counts = buffers_for(recipe, shape, gen)
    if compression != "lossless":  # random bytes are no bf16 values a quantizer need take: real ones
        data = torch.randn(shape.groups, shape.tokens, shape.hidden, generator=gen).to(torch.bfloat16)
    to = (lambda t: None if t is None else t.to(device))
    return to(data), to(scales), to(amax), to(counts)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_raw_op_with_another_recipe_compression_or_shape_raises_record_mismatch(case, device):
    """Through the raw ops as another kind: a reload and a discard of a stashed record each
    raise record_mismatch (misuse: decide says report_error) and change nothing; the refused
    reload poisons its destination (a taller destination is no mismatch: the reload restores
    into it); the record then reloads as its own kind, exactly. A stash into a CPU pool's
    record of another kind raises ValueError before it runs."""
    (recipe, compression, shape), (op_recipe, op_compression, op_shape) = MISMATCHES[case]
    taller = op_shape.tokens > shape.tokens and (op_recipe, op_compression) == (recipe, compression)
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=256, page_bytes=4096, device=device, strict=False)
    empty, rec = (pool.record(recipe, shape, compression=compression) for _ in range(2))
    data, scales, amax, counts = op_buffers(recipe, compression, shape, gen, device)
    rec.stash(data, counts, scales, amax)
    assert rec.status()["state"] == "stashed"
    held = pool.pages_in_use()
    other_data, other_scales, other_amax, other_counts = op_buffers(op_recipe, op_compression, op_shape, gen, device)
    stash_as_other = (lambda: ps.ops.stash(*pool.state, empty.memory, op_recipe, list(op_shape), other_data,
                                           other_counts, other_scales, other_amax, compression=op_compression))
    if device == "cpu":  # a host record's kind is read before the stash (a device record's by its reloads)
        with pytest.raises(ValueError, match="made for another kind|the record has"):
            stash_as_other()
        assert empty.status()["state"] == "empty"
    as_other = (*pool.state, rec.memory, op_recipe, list(op_shape))
    dest = torch.zeros_like(other_data)
    ps.ops.discard(*as_other, compression=op_compression)
    ps.ops.reload(*as_other, dest, None if other_scales is None else torch.zeros_like(other_scales),
                  None if other_amax is None else torch.zeros_like(other_amax), compression=op_compression)
    flags = pool.flag_dict()
    assert flags["record_mismatch"] == 1 and flags["error"] == 1, flags
    assert ps._C.decide([flags[n] for n in ps.FLAG_NAMES]) == "report_error"
    stats = pool.stats()
    if taller:  # the reload restored into the taller destination and returned the pages
        assert stats["errors"] == 1 and stats["reloads"] == 1 and pool.pages_in_use() == 0
        assert rec.status()["state"] == "reloaded"
        return
    assert bool((dest.cpu().view(torch.uint8) == 0xFF).all())  # the refused reload poisoned it
    assert stats["errors"] == 2 and stats["reloads"] == 0 and pool.pages_in_use() == held
    status = rec.status()
    assert status["state"] == "stashed" and status["error"] == "record_mismatch"
    # Its own kind still reloads it, bit for bit where the stash is lossless.
    out = [torch.zeros_like(data), None if scales is None else torch.zeros_like(scales),
           None if amax is None else torch.zeros_like(amax)]
    rec.reload(*out, zero_tail=True)
    assert rec.status()["state"] == "reloaded" and pool.pages_in_use() == 0
    if compression == "lossless" and scales is None:  # data: [groups * tokens, row bytes]
        live = (torch.arange(shape.tokens, device=device)[None, :] < counts[:, None]).reshape(-1, 1)
        assert torch.equal(out[0], torch.where(live, data, torch.zeros_like(data)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_a_raw_stash_as_another_kind_is_refused_or_writes_its_kind(case, device):
    """A raw stash as another kind into a record's memory: of another size, ValueError before it
    runs; of the same size, ValueError on a CPU pool (the host reads the header), and on a CUDA
    pool the stash writes its own kind with what it stashes: a reload as the record's earlier
    kind raises record_mismatch and poisons its destination, one as the stash's kind restores
    what it stashed."""
    (recipe, compression, shape), (op_recipe, op_compression, op_shape) = MISMATCHES[case]
    gen = torch.Generator().manual_seed(SEED + 1)
    pool = ps.PagePool(device_pages=256, page_bytes=4096, device=device, strict=False)
    rec = pool.record(recipe, shape, compression=compression)
    data, scales, amax, counts = op_buffers(op_recipe, op_compression, op_shape, gen, device)
    as_other = (*pool.state, rec.memory, op_recipe, list(op_shape))
    same_size = pool.record(op_recipe, op_shape, compression=op_compression).memory.numel() == rec.memory.numel()
    if device == "cpu" or not same_size:
        with pytest.raises(ValueError, match="made for another kind" if same_size else "the record has"):
            ps.ops.stash(*as_other, data, counts, scales, amax, compression=op_compression)
        assert rec.status()["state"] == "empty" and pool.flag_dict()["error"] == 0
        return
    ps.ops.stash(*as_other, data, counts, scales, amax, compression=op_compression)
    assert pool.flag_dict()["error"] == 0
    own, own_scales, own_amax, _ = op_buffers(recipe, compression, shape, gen, device)
    ps.ops.reload(*pool.state, rec.memory, recipe, list(shape), own, own_scales, own_amax, compression=compression)
    flags = pool.flag_dict()
    assert flags["record_mismatch"] == 1 and flags["error"] == 1, flags
    assert bool((own.cpu().view(torch.uint8) == 0xFF).all())
    out = [torch.zeros_like(data), None if scales is None else torch.zeros_like(scales),
           None if amax is None else torch.zeros_like(amax)]
    ps.ops.reload(*as_other, *out, compression=op_compression, zero_tail=True)
    assert pool.pages_in_use() == 0 and pool.stats()["reloads"] == 1
    if op_compression == "lossless" and scales is None:
        live = (torch.arange(op_shape.tokens, device=device)[None, :] < counts[:, None]).reshape(-1, 1)
        assert torch.equal(out[0], torch.where(live, data, torch.zeros_like(data)))


def test_counts_changed_through_data_after_mark_do_not_reach_the_stash():
    """mark() copies the counts: a write through .data afterwards (no version bump) changes
    nothing of what is paged, and backward matches eager on the counts marked."""
    from test_step import C, Experts, microbatches

    (x, counts), = microbatches(n=1)
    eager, paged = Experts(), Experts()
    eager(x, counts).backward()
    pool = ps.PagePool(device_pages=4096, page_bytes=4096)
    marked = counts.clone()
    with ps.paged_saved_tensors(pool) as paging:
        h = paging.mark(x, marked)
        marked.data[0] = 1  # the caller's tensor changes; the version counter does not
        marked.data[1] = C
        loss = paged(h, counts, paging=None)
    loss.backward()
    for a, b in zip(eager.parameters(), paged.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert pool.pages_in_use() == 0


def test_a_pool_refuses_to_be_pickled_or_saved_and_deepcopy_gives_a_new_one():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    for save in (pickle.dumps, lambda p: torch.save(p, io.BytesIO())):
        with pytest.raises(TypeError, match=r"a PagePool \(8 device pages of 4096 bytes on cpu\) cannot be pickled"):
            save(pool)
    rec = pool.record("bf16/capacity", ps.Shape(1, 32, 64))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(rec)  # a record holds its pool
    other = copy.deepcopy(pool)
    assert other is not pool and other.config == pool.config


def test_a_record_used_after_resize_is_another_pools():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    rec = pool.record("bf16/capacity", ps.Shape(2, 32, 64))
    pool.resize(ps.size_pool([("bf16/capacity", ps.Shape(2, 32, 64))], counts=[[3, 4]], layers=1, microbatches=1,
                             page_bytes=4096, samples=16))
    x = torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"is another pool's: it was made before pool.resize\(\)"):
        rec.stash(x, torch.tensor([3, 4], dtype=torch.int32))


def test_mark_says_what_is_wrong_with_its_arguments():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    x = torch.zeros(2, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    counts = torch.tensor([3, 4], dtype=torch.int32)
    with ps.paged_saved_tensors(pool) as paging:
        with pytest.raises(ValueError, match=r"counts must be a tensor, not a list \(torch.tensor\(counts"):
            paging.mark(x, counts.tolist())
        with pytest.raises(ValueError, match="data is a meta tensor"):
            paging.mark(x.to("meta"), counts)
        with pytest.raises(ValueError, match="counts is a meta tensor"):
            paging.mark(x, counts.to("meta"))


def test_an_inner_saved_tensor_hook_that_takes_the_saves_is_named():
    """mark(), then save_on_cpu() inside: autograd gives every save to the inner hook, so
    nothing is paged. Marked inside it, the warning names the hook; marked before it, the
    warning says what can take the saves."""
    pool = ps.PagePool(device_pages=64, page_bytes=4096)
    x = torch.randn(2, 32, 64).to(torch.bfloat16)
    w = torch.randn(2, 64, 64, requires_grad=True)
    counts = torch.tensor([32, 5], dtype=torch.int32)
    with pytest.warns(ps.UnpagedWarning, match=r"saved-tensor hook torch.autograd.graph.*, an inner context"):
        with ps.paged_saved_tensors(pool) as paging:
            with torch.autograd.graph.save_on_cpu():
                y = torch.bmm(paging.mark(x, counts), w.to(torch.bfloat16))
    y.float().sum().backward()
    with pytest.warns(ps.UnpagedWarning, match=r"saved nothing at all in this context after it: an inner saved-tensor "
                                               r"hook context \(torch.autograd.graph.save_on_cpu"):
        with ps.paged_saved_tensors(pool) as paging:
            marked = paging.mark(x, counts)
            with torch.autograd.graph.save_on_cpu():
                y = torch.bmm(marked, w.to(torch.bfloat16))
    y.float().sum().backward()
    assert pool.pages_in_use() == 0
