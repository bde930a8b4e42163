"""Record.stash and Record.reload under torch.compile (CPU tensors): traced through the ops'
fake implementations, with and without fullgraph, bit-identical to eager."""

import inspect

import pytest
import torch

import pagestash as ps
from test_ops import SEED, buffers_for, shape_of


def round_trip(rec, data, counts, scales, amax, poison):
    """Stashes (data, scales, amax), reloads them into buffers poisoned with `poison` (dead
    bytes stay poison), and returns the reloaded buffers and a result computed from them."""
    rec.stash(data, counts, scales, amax)
    out = [torch.full_like(data, poison), None if scales is None else torch.full_like(scales, poison),
           None if amax is None else torch.full_like(amax, -1.0)]
    rec.reload(*out)
    return out, out[0].view(torch.uint8).to(torch.int32).sum()


@pytest.mark.parametrize("fullgraph", [True, False])
@pytest.mark.parametrize("recipe", ["bf16/capacity", "mxfp8/packed/swizzled", "nvfp4/capacity/compact"])
def test_record_stash_and_reload_under_torch_compile_match_eager(recipe, fullgraph):
    """The same round trip eager and compiled (its own pool and record), from random data:
    every reloaded byte and the result are the same; the pool's pages all come back. With
    fullgraph=True the record does not check (a strict check reads the flags on the host);
    without, the pool is strict and the check runs between two graphs."""
    gen = torch.Generator().manual_seed(SEED)
    shape = shape_of(recipe)
    data, scales, amax, counts = buffers_for(recipe, shape, gen)
    results = []
    for compiled in (False, True):
        pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=not fullgraph)
        rec = pool.record(recipe, shape)
        step = torch.compile(round_trip, backend="aot_eager", fullgraph=fullgraph) if compiled else round_trip
        results.append(step(rec, data, counts, scales, amax, 0x5A))
        assert rec.status()["state"] == "reloaded"
        assert pool.stats()["device_pages_free"] == pool.device_pages
        pool.check()
    torch._dynamo.reset()
    (want, want_sum), (got, got_sum) = results
    assert bool((want[0].view(torch.uint8) != 0x5A).any()), "the round trip reloaded nothing"
    for w, g in zip(want, got):
        assert (w is None) == (g is None)
        if w is not None:
            assert torch.equal(g.view(torch.uint8), w.view(torch.uint8))
    assert torch.equal(got_sum, want_sum)


def test_strict_check_under_fullgraph_says_what_to_do():
    """A strict record's check reads the flags on the host: under fullgraph=True the graph
    break names the fix (torch versions whose graph_break takes a message)."""
    if "msg" not in inspect.signature(torch._dynamo.graph_break).parameters:
        pytest.skip("this torch's graph_break takes no message")
    pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=True)
    rec = pool.record("bf16/capacity", ps.Shape(2, 32, 64))
    x = torch.randn(2, 32, 64, generator=torch.Generator().manual_seed(SEED)).to(torch.bfloat16)
    counts = torch.tensor([32, 5], dtype=torch.int32)
    step = torch.compile(lambda: rec.stash(x, counts), backend="aot_eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"inside torch.compile\(fullgraph=True\), pass check=False"):
        step()
    torch._dynamo.reset()


def paged_bmm(rec, shape):
    """An autograd.Function whose forward stashes x into `rec` and whose backward reloads it
    (the Record API inside traced code), computing x @ w."""

    class PagedBmm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, counts):
            rec.stash(x, counts, check=False)
            ctx.save_for_backward(w)
            return torch.bmm(x, w)

        @staticmethod
        def backward(ctx, grad):
            (w,) = ctx.saved_tensors
            x = torch.zeros(tuple(shape), dtype=grad.dtype)
            rec.reload(x, check=False)
            return torch.bmm(grad, w.transpose(1, 2)), torch.bmm(x.transpose(1, 2), grad), None

    return PagedBmm.apply


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_record_inside_an_autograd_function_under_fullgraph(backend):
    """torch.compile(fullgraph=True) over a module whose autograd.Function stashes in forward
    and reloads in backward: no graph break (the Record changes no Python state in traced
    code), and the gradients equal eager's bit for bit (dead rows reload as zeros, as they are)."""
    shape = ps.Shape(2, 32, 64)
    gen = torch.Generator().manual_seed(SEED)
    counts = torch.tensor([32, 7], dtype=torch.int32)
    x = torch.randn(*shape, generator=gen)
    x[1, 7:] = 0
    w0 = torch.randn(2, 64, 16, generator=gen)
    results = []
    for compiled in (False, True):
        pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=False)
        rec = pool.record("bf16/capacity", shape)
        w = w0.to(torch.bfloat16).requires_grad_()
        f = paged_bmm(rec, shape)

        def step(x, w, counts):
            return f(x, w, counts).float().square().sum()

        run = torch.compile(step, backend=backend, fullgraph=True) if compiled else step
        run(x.to(torch.bfloat16), w, counts).backward()
        results.append(w.grad)
        assert rec.status()["state"] == "reloaded" and pool.pages_in_use() == 0
        pool.check()
    torch._dynamo.reset()
    assert torch.equal(results[0], results[1])
