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
