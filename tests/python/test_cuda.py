"""The same ops on CUDA tensors (the CUDA executor on PyTorch's current stream), checked
against the host executor's results byte for byte. Skipped without a GPU; scripts/gpu-check
runs them on a machine with one (and torch)."""

import pytest
import torch

import moe_example as moe
import pagestash as ps
from test_ops import RELOAD_FAILURES, SEED, buffers_for, check_poisoned, failed_reload, shape_of

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and ps.with_cuda),
    reason="SKIPPED: no CUDA device (or pagestash built without CUDA): the CUDA executor's tests need a GPU")


def round_trip(device, recipe, data, scales, amax, counts, zero_tail):
    shape = shape_of(recipe)
    pool = ps.PagePool(device_pages=64, page_bytes=4096, device=device)
    rec = pool.record(recipe, shape)
    to = (lambda t: None if t is None else t.to(device))
    rec.stash(to(data), to(counts), to(scales), to(amax))
    out = [to(torch.full_like(data, 0x5A)), to(None if scales is None else torch.full_like(scales, 0x5A)),
           to(None if amax is None else torch.zeros_like(amax))]
    rec.reload(*out, zero_tail=zero_tail)
    stats = pool.stats()
    assert stats["device_pages_free"] == pool.device_pages and not any(stats["flags"].values())
    return [None if t is None else t.cpu() for t in out]


@pytest.mark.parametrize("zero_tail", [False, True])
@pytest.mark.parametrize("recipe", ps.recipes())
def test_cuda_matches_the_host_executor(recipe, zero_tail):
    gen = torch.Generator().manual_seed(SEED)
    data, scales, amax, counts = buffers_for(recipe, shape_of(recipe), gen)
    host = round_trip("cpu", recipe, data, scales, amax, counts, zero_tail)
    cuda = round_trip("cuda", recipe, data, scales, amax, counts, zero_tail)
    for h, c in zip(host, cuda):
        assert (h is None) == (c is None)
        if h is not None:
            assert torch.equal(h, c)


@pytest.mark.parametrize("failure", RELOAD_FAILURES)
@pytest.mark.parametrize("recipe", ps.recipes())
def test_cuda_a_reload_that_does_not_restore_poisons_its_destination_in_the_launch(recipe, failure):
    """The kernel's blocks fill the destination with the poison (NaN for floats, 0xFF bytes),
    as the host executor does; poison=False leaves it as it was."""
    before, after = failed_reload("cuda", recipe, failure, poison=True)
    check_poisoned(recipe, before, after)
    host_before, host_after = failed_reload("cpu", recipe, failure, poison=True)
    for h, c in zip(host_after, after):
        assert (h is None and c is None) or torch.equal(h.view(torch.uint8), c.view(torch.uint8))
    before, after = failed_reload("cuda", recipe, failure, poison=False)
    for b, a in zip(before, after):
        assert (b is None and a is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_cuda_not_strict_without_decide_gives_nan_gradients():
    pool = ps.PagePool(device_pages=1, page_bytes=4096, device="cuda")  # not strict: CUDA's default
    pool.begin_step()
    gen = torch.Generator().manual_seed(8)
    w = torch.randn(2, 64, 64, generator=gen).to(torch.bfloat16).cuda().requires_grad_()
    x = torch.randn(2, 32, 64, generator=gen).to(torch.bfloat16).cuda()
    counts = torch.tensor([32, 32], dtype=torch.int32).cuda()
    with ps.paged_saved_tensors(pool) as paging:
        torch.bmm(paging.mark(x, counts), w).sum().backward()  # the stash overflows
    assert bool(w.grad.isnan().all()) and pool.decide() == "rerun_without_paging"


def test_cuda_moe_gradients_bit_identical_and_report_without_sync():
    E, H, F, T = 8, 128, 256, 192
    capacity = 2 * T // E
    batches = moe.dirichlet_batches(3, T, E, H, torch.bfloat16, "cuda", seed=3)
    eager_model = moe.GroupedMLP(E, H, F, seed=7).cuda()
    paged_model = moe.GroupedMLP(E, H, F, seed=7).cuda()
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.05)
    paged_opt = torch.optim.SGD(paged_model.parameters(), lr=0.05)
    pool = ps.PagePool(device_pages=256, page_bytes=4096, device="cuda")
    for batch in batches:
        eager = moe.step(eager_model, eager_opt, [batch], capacity)
        paged = moe.step(paged_model, paged_opt, [batch], capacity, pool)
        assert paged["how"] == "paged"
        for a, b in zip(eager["grads"], paged["grads"]):
            assert torch.equal(a, b)
    out = torch.empty(ps._C.report_bytes(), dtype=torch.uint8, device="cuda")
    pool.report(out)  # enqueued on the current stream
    report = ps.decode_report(out.cpu())
    assert report["stashes"] == 9 and report["reloads"] == 9 and report["decision"] == "keep"


def test_cuda_end_step_flags_a_leaked_record_without_a_sync():
    pool = ps.PagePool(device_pages=32, page_bytes=4096, device="cuda")
    x = torch.randn(4, 64, 128, device="cuda").to(torch.float16)
    counts = torch.tensor([64, 0, 30, 5], dtype=torch.int32, device="cuda")
    a, b = (pool.record("fp16/capacity", ps.Shape(4, 64, 128)) for _ in range(2))
    a.stash(x, counts)
    b.stash(x, counts)
    a.reload(torch.empty_like(x))
    pool.end_step()  # enqueued: b still holds its pages
    report = ps.decode_report(pool.report().cpu())
    assert report["flags"]["unbalanced"] == 1 and report["pages_held_at_step_end"] == b.status()["pages"] > 0
    b.discard()
    pool.end_step()
    assert ps.decode_report(pool.report().cpu())["pages_held_at_step_end"] == 0


def test_cuda_end_step_joins_the_streams_that_reloaded():
    # A reload on a side stream, still running when end_step is enqueued on the current
    # stream: joined through `cuda_streams`, it is counted as done (no spurious `unbalanced`).
    pool = ps.PagePool(device_pages=64, page_bytes=4096, device="cuda")
    x = torch.randn(4, 64, 1024, device="cuda").to(torch.float16)
    counts = torch.tensor([64, 17, 30, 5], dtype=torch.int32, device="cuda")
    rec = pool.record("fp16/capacity", ps.Shape(4, 64, 1024))
    rec.stash(x, counts)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    out = torch.empty_like(x)
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # keeps the side stream busy past end_step's enqueue
        rec.reload(out)
    pool.end_step(cuda_streams=[side])
    report = ps.decode_report(pool.report().cpu())
    assert report["flags"]["unbalanced"] == 0 and report["pages_held_at_step_end"] == 0
    assert torch.equal(out[0, :64], x[0, :64])


def test_cuda_pool_memory_is_pytorchs_and_tensors_elsewhere_are_refused():
    before = torch.cuda.memory_allocated()
    pool = ps.PagePool(device_pages=32, page_bytes=65536, device="cuda")
    assert torch.cuda.memory_allocated() - before >= pool.control.numel() + pool.device_arena.numel()
    rec = pool.record("bf16/capacity", ps.Shape(2, 32, 64))
    x = torch.zeros(2, 32, 64, dtype=torch.bfloat16)
    counts = torch.tensor([3, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="is on cpu, the pool on cuda"):
        rec.stash(x, counts.cuda())
    with pytest.raises(ValueError, match="counts is on cpu"):
        rec.stash(x.cuda(), counts)
    assert rec.status()["state"] == "empty"


def test_cuda_another_pools_record_does_nothing_and_raises_foreign_record():
    """On a CUDA pool the host cannot read the ids without a sync: the op checks them on the
    device, does nothing, and raises the foreign_record flag (strict mode then raises)."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 64, 128, generator=gen).to(torch.bfloat16).cuda()
    counts = torch.tensor([64, 40], dtype=torch.int32).cuda()
    mine = ps.PagePool(device_pages=64, page_bytes=4096, device="cuda")
    rec = mine.record(like=x, counts=counts)
    rec.stash(x, counts)
    for pages in (64, 4):
        other = ps.PagePool(device_pages=pages, page_bytes=4096, device="cuda")
        ps.ops.reload(*other.state, rec.memory, rec.recipe, list(rec.shape), torch.empty_like(x))
        ps.ops.discard(*other.state, rec.memory, rec.recipe, list(rec.shape))
        stats = other.stats()
        assert stats["device_pages_free"] == pages and stats["reloads"] == 0
        assert stats["flags"]["foreign_record"] == 1 and other.decide() == "report_error"
        with pytest.raises(ps.PagingError, match="foreign_record"):
            other.check()
    out = torch.zeros_like(x)
    rec.reload(out, zero_tail=True)
    assert mine.decide() == "keep" and torch.equal(out[0], x[0]) and torch.equal(out[1, :40], x[1, :40])


def test_cuda_strict_is_opt_in():
    pool = ps.PagePool(device_pages=1, page_bytes=4096, device="cuda")
    assert not pool.strict
    strict = ps.PagePool(device_pages=1, page_bytes=4096, device="cuda", strict=True)
    x = torch.randn(2, 64, 128).to(torch.bfloat16).cuda()
    counts = torch.tensor([64, 64], dtype=torch.int32).cuda()
    with pytest.raises(ps.PagingError, match="overflow"):
        strict.record(like=x, counts=counts).stash(x, counts)


def test_cuda_paging_error_names_the_operations_since_the_flags_were_last_read():
    """A CUDA pool reads its flags only when asked: PagingError names the range of
    operations since they were last read clean, or the operation itself when it was checked."""
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(SEED)).to(torch.bfloat16).cuda()
    counts = torch.tensor([32, 32], dtype=torch.int32).cuda()
    pool = ps.PagePool(device_pages=3, page_bytes=4096, device="cuda")  # not strict
    a, b = (pool.record("bf16/capacity", ps.Shape(2, 32, 64)) for _ in range(2))
    a.name, b.name = "a", "b"
    assert pool.decide() == "keep"  # read clean
    a.stash(x, counts)  # 2 pages
    b.stash(x, counts)  # no room
    a.reload(torch.empty_like(x))
    with pytest.raises(ps.PagingError, match=r"first raised by one of the 3 operations from the stash of a to the "
                                             r"reload of a \(a CUDA pool reads its flags only when asked"):
        pool.check()
    pool.reset()
    a.stash(x, counts, check=True)
    with pytest.raises(ps.PagingError, match=r"paging failed at the stash of b \(overflow: ") as e:
        b.stash(x, counts, check=True)
    assert e.value.first == "the stash of b"
    with pytest.raises(ValueError, match=r"data is a meta tensor \(it holds no data\) and the pool is on cuda:0"):
        a.reload(torch.empty_like(x, device="meta"))
