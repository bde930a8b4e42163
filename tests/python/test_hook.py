"""paged_saved_tensors on CPU tensors: the MoE example trained with and without paging."""

import gc
import warnings

import pytest
import torch

import moe_example as moe
import pagestash as ps
from _ranks import run_ranks

E, H, F, TOKENS, STEPS = 8, 128, 256, 192, 4
CAPACITY = 2 * TOKENS // E


def models():
    return moe.GroupedMLP(E, H, F, seed=7), moe.GroupedMLP(E, H, F, seed=7)


def batches():
    return moe.dirichlet_batches(STEPS, TOKENS, E, H, torch.bfloat16, "cpu", seed=3)


def pool_for(factor, page_bytes=4096):
    most = max(moe.live_fraction(b, E, CAPACITY) for b in batches()) * E * CAPACITY * (H + 2 * F) * 2
    # Not strict: the documented sync-free loop (decide, rerun) handles an overflow.
    return ps.PagePool(device_pages=int(factor * most / page_bytes) + 3 * E, page_bytes=page_bytes, strict=False)


def opts(a, b):
    return torch.optim.SGD(a.parameters(), lr=0.05), torch.optim.SGD(b.parameters(), lr=0.05)


def test_gradients_bit_identical_and_activation_bytes_reduced_by_the_live_fraction():
    eager_model, paged_model = models()
    eager_opt, paged_opt = opts(eager_model, paged_model)
    pool = pool_for(1.0)
    print(f"\n{'step':>4} {'live':>6} {'eager held':>11} {'paged held':>11} {'buffers':>9} {'pages':>9} {'pages/buffers':>13}")
    for i, batch in enumerate(batches()):
        eager = moe.step(eager_model, eager_opt, [batch], CAPACITY)
        paged = moe.step(paged_model, paged_opt, [batch], CAPACITY, pool)
        assert paged["how"] == "paged"
        for a, b in zip(eager["grads"], paged["grads"]):
            assert torch.equal(a, b)  # bit for bit
        assert paged["loss"] == eager["loss"]
        live = moe.live_fraction(batch, E, CAPACITY)
        buffers, pages = paged["marked"]
        print(f"{i:>4} {live:>6.3f} {eager['held']:>11} {paged['held']:>11} {buffers:>9} {pages:>9} "
              f"{pages / buffers:>13.3f}")
        # The three marked activations are all that changed: their buffers were replaced by
        # pages holding the live rows (each stash rounded up to whole pages).
        assert paged["held"] == eager["held"] - buffers + pages
        assert live * buffers <= pages <= live * buffers + 3 * pool.page_bytes
        assert live < 0.6  # Dirichlet(1) counts with capacity twice the mean
        # After each step every page is back and no flag is raised.
        stats = pool.stats()
        assert stats["device_pages_free"] == pool.device_pages and stats["live_bytes"] == 0
        assert not any(stats["flags"].values())
    for a, b in zip(eager_model.parameters(), paged_model.parameters()):
        assert torch.equal(a, b)
    assert pool.stats()["stashes"] == 3 * STEPS


def test_a_too_small_pool_raises_overflow_and_the_step_reruns_with_the_same_result():
    eager_model, paged_model = models()
    eager_opt, paged_opt = opts(eager_model, paged_model)
    pool = pool_for(0.25)
    hows = []
    for batch in batches():
        eager = moe.step(eager_model, eager_opt, [batch], CAPACITY)
        paged = moe.step(paged_model, paged_opt, [batch], CAPACITY, pool)
        hows.append(paged["how"])
        for a, b in zip(eager["grads"], paged["grads"]):
            assert torch.equal(a, b)
    assert "rerun" in hows
    for a, b in zip(eager_model.parameters(), paged_model.parameters()):
        assert torch.equal(a, b)


def test_unmarked_tensors_pass_through_untouched_and_unneeded_stashes_return_their_pages():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(2, 8, 16).to(torch.bfloat16)
    counts = torch.tensor([3, 8], dtype=torch.int32)
    y = torch.randn(4, 16)
    with pytest.warns(ps.UnpagedWarning, match=r"^pagestash: expert input was marked but autograd never saved it"):
        with ps.paged_saved_tensors(pool) as paging:
            marked = paging.mark(x.clone(), counts, name="expert input")
            node = (y @ w).grad_fn
            out = (y @ w).sum() + (marked.float() * 2).sum()
    assert node._saved_self is y  # passed through: the very tensor
    assert paging.paged_tensors == 0 and paging.passed_tensors >= 1  # `marked` itself was never saved
    out.backward()
    assert torch.equal(w.grad, y.sum(0, keepdim=True).t().expand(16, 16))
    with ps.paged_saved_tensors(pool) as paging:
        z = paging.mark(x.clone().requires_grad_(), counts)
        loss = (z * z).sum()  # saves z (twice): one stash
    assert paging.paged_tensors == 2 and pool.pages_in_use() > 0
    del loss  # no backward: the stash's pages come back when autograd lets go
    gc.collect()
    assert pool.pages_in_use() == 0 and not any(pool.flag_dict().values())


def test_a_quantized_tensor_saved_as_three_buffers_is_stashed_once_and_each_buffer_comes_back():
    """NVFP4: data, scales and amax saved by a custom autograd function are one stash, and
    backward gets each buffer back in its role (live bytes, dead ones zeroed; amax exact)."""
    from test_ops import buffers_for

    recipe, shape = "nvfp4/capacity/swizzled", ps.Shape(3, 128, 64)
    gen = torch.Generator().manual_seed(11)
    data, scales, amax, counts = buffers_for(recipe, shape, gen)
    expected_pool = ps.PagePool(device_pages=64, page_bytes=1024)
    rec = expected_pool.record(recipe, shape)
    rec.stash(data, counts, scales, amax)
    expected = [torch.full_like(data, 1), torch.full_like(scales, 1), torch.zeros_like(amax)]
    rec.reload(*expected, zero_tail=True)

    seen = []

    class UsesQuantized(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w, q_data, q_scales, q_amax):
            ctx.save_for_backward(q_data, q_scales, q_amax)
            return w * 2

        @staticmethod
        def backward(ctx, g):
            seen.append([t.clone() for t in ctx.saved_tensors])
            return g * 2, None, None, None

    pool = ps.PagePool(device_pages=64, page_bytes=1024)
    w = torch.ones(4, requires_grad=True)
    with ps.paged_saved_tensors(pool) as paging:
        q = [data.clone(), scales.clone(), amax.clone()]
        paging.mark(q[0], counts, recipe=recipe, shape=shape, scales=q[1], amax=q[2])
        out = UsesQuantized.apply(w, *q).sum()
    assert paging.paged_tensors == 3 and pool.stats()["stashes"] == 1
    out.backward()
    assert len(seen) == 1
    for got, want in zip(seen[0], expected):
        assert torch.equal(got, want)
    assert torch.equal(seen[0][2], amax)
    assert pool.pages_in_use() == 0


def test_the_hook_as_docs_python_md_shows_it():
    gen = torch.Generator().manual_seed(5)
    experts, capacity, hidden = 4, 16, 32
    x = torch.randn(40, hidden, generator=gen).to(torch.bfloat16)
    expert = torch.randint(0, experts, (40,), generator=gen)
    counts = torch.bincount(expert, minlength=experts).clamp(max=capacity).to(torch.int32)
    w1 = torch.randn(experts, hidden, hidden, generator=gen).to(torch.bfloat16).requires_grad_()
    pool = ps.PagePool(device_pages=16, page_bytes=4096)

    def dispatch(x):
        buf = x.new_zeros(experts, capacity, hidden)
        for e in range(experts):
            rows = x[expert == e][:capacity]
            buf[e, : len(rows)] = rows
        return buf

    # [hook]
    with ps.paged_saved_tensors(pool) as paging:  # zero_tail=True by default
        buf = dispatch(x)  # [experts, capacity, hidden]
        paging.mark(buf, counts)  # bf16 [experts, capacity, hidden]: recipe and shape inferred
        h = torch.bmm(buf, w1)  # autograd saves buf: stashed into the pool
        loss = torch.nn.functional.silu(h).sum()
    loss.backward()  # backward needs buf: reloaded
    # [hook]
    assert paging.paged_tensors == 1 and pool.stats()["reloads"] == 1
    reference = w1.grad.clone()
    w1.grad = None
    torch.nn.functional.silu(torch.bmm(dispatch(x), w1)).sum().backward()
    assert torch.equal(w1.grad, reference)


def _rank(rank, world, init_file, results):
    """One rank of the trainer's decision: its own pool (rank 1's too small), the flags
    all-reduced with MAX, the same decision everywhere."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    pool = ps.PagePool(device_pages=2 if rank == 1 else 64, page_bytes=4096, strict=False)
    rec = pool.record("bf16/capacity", ps.Shape(2, 64, 128))
    x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    rec.stash(x, torch.tensor([64, 40], dtype=torch.int32))
    alone = pool.decide(alone=True)  # what this rank alone would decide (decide() refuses without agree())
    pool.agree()  # all-reduces the flags with MAX, in place in the pool
    first = None
    try:
        pool.check()
    except ps.PagingError as e:  # which operation raised the flags, on this rank
        first = e.first
    results.put((rank, alone, pool.decide(), rec.status()["state"], first))
    torch.distributed.destroy_process_group()


def test_ranks_agree_by_all_reducing_the_flags(tmp_path):
    got = run_ranks(_rank, 3, tmp_path / "init")
    assert [alone for _, alone, _, _, _ in got] == ["keep", "rerun_without_paging", "keep"]
    assert all(agreed == "rerun_without_paging" for _, _, agreed, _, _ in got)
    assert [state for _, _, _, state, _ in got] == ["stashed", "overflowed", "stashed"]
    agreed = "agree() (the flags of every rank)"
    assert [first for *_, first in got] == [agreed, "the stash of a bf16/capacity record (2, 64, 128)", agreed]


class MixedExperts(torch.nn.Module):
    """An MoE expert block on [experts, capacity, hidden] buffers written the ways real
    models are: `x @ w` (3D@3D), `einsum`, an `nn.Linear` over the buffer and `F.linear`.
    Autograd saves views and reshapes of the marked buffers, not the buffers themselves."""

    def __init__(self, experts, hidden, ffn, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=g) * s[-2] ** -0.5).to(torch.bfloat16))
        self.up, self.gate = w(experts, hidden, ffn), w(experts, hidden, ffn)
        self.down = torch.nn.Linear(ffn, hidden, bias=False, dtype=torch.bfloat16)
        with torch.no_grad():
            self.down.weight.copy_(w(hidden, ffn))
        self.out = w(hidden, hidden)

    def forward(self, buf, counts, paging=None):
        mark = (lambda t: t) if paging is None else (lambda t: paging.mark(t, counts))
        # [views]
        buf = mark(buf)  # [experts, capacity, hidden]
        u = mark(buf @ self.up)  # autograd saves a view of buf: paged
        g = mark(torch.einsum("ech,ehf->ecf", buf, self.gate))
        a = mark(torch.nn.functional.silu(g) * u)
        d = mark(self.down(a))  # nn.Linear saves a's [experts * capacity, ffn] reshape: paged
        return torch.nn.functional.linear(d, self.out)
        # [views]


def test_views_that_autograd_saves_are_paged_with_bit_identical_gradients():
    E, C, H, F = 4, 32, 64, 96
    gen = torch.Generator().manual_seed(21)
    counts = torch.tensor([32, 3, 17, 0], dtype=torch.int32)
    live = (torch.arange(C)[None, :] < counts[:, None]).unsqueeze(-1)
    buf = torch.where(live, torch.randn(E, C, H, generator=gen), 0).to(torch.bfloat16)
    target = torch.where(live, torch.randn(E, C, H, generator=gen), 0).to(torch.bfloat16)

    def run(pool=None):
        model = MixedExperts(E, H, F, seed=4)
        if pool is None:
            with moe.SavedBytes() as saved:
                loss = ((model(buf.clone(), counts) - target) * live).square().sum()
            held, paging = saved.nbytes, None
        else:
            with ps.paged_saved_tensors(pool) as paging:
                loss = ((model(buf.clone(), counts, paging) - target) * live).square().sum()
            held = paging.passed_bytes + pool.pages_in_use() * pool.page_bytes
        loss.backward()
        return [p.grad for p in model.parameters()], held, paging

    eager_grads, eager_held, _ = run()
    pool = ps.PagePool(device_pages=64, page_bytes=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ps.UnpagedWarning)  # every mark is paged
        paged_grads, paged_held, paging = run(pool)
    for a, b in zip(eager_grads, paged_grads):
        assert torch.equal(a, b)
    assert paging.paged_tensors >= 6 and pool.stats()["stashes"] == 5 and pool.pages_in_use() == 0
    fraction = counts.sum().item() / (E * C)
    pages = paged_held - paging.passed_bytes
    assert paged_held == eager_held - paging.paged_bytes + pages
    assert fraction * paging.paged_bytes <= pages <= fraction * paging.paged_bytes + 5 * pool.page_bytes


class TestStrict:
    """Strict mode (a CPU pool's default) raises PagingError naming the flag at the first
    reload after the problem; pool.check() raises the same."""

    E, C, H = 2, 32, 64

    def forward(self, pool, counts):
        gen = torch.Generator().manual_seed(8)
        w = torch.randn(self.E, self.H, self.H, generator=gen).to(torch.bfloat16).requires_grad_()
        x = torch.randn(self.E, self.C, self.H, generator=gen).to(torch.bfloat16)
        with ps.paged_saved_tensors(pool) as paging:
            loss = torch.bmm(paging.mark(x, counts), w).sum()
        return loss

    def raises(self, flag, pool, loss):
        with pytest.raises(ps.PagingError, match=rf"paging failed at the reload of .*\({flag}: ") as e:
            loss.backward()
        assert flag in e.value.flags
        with pytest.raises(ps.PagingError, match=flag):
            pool.check()

    def test_overflow(self):
        pool = ps.PagePool(device_pages=1, page_bytes=4096)
        self.raises("overflow", pool, self.forward(pool, torch.tensor([32, 32], dtype=torch.int32)))

    def test_bad_counts(self):
        pool = ps.PagePool(device_pages=16, page_bytes=4096)
        for bad in ([33, 1], [-1, 1]):
            pool.reset()
            self.raises("bad_counts", pool, self.forward(pool, torch.tensor(bad, dtype=torch.int32)))

    def test_stale(self):
        pool = ps.PagePool(device_pages=16, page_bytes=4096)
        loss = self.forward(pool, torch.tensor([5, 6], dtype=torch.int32))
        pool.reset()  # between a microbatch's forward and its backward
        self.raises("stale", pool, loss)

    def test_double_reload(self):
        pool = ps.PagePool(device_pages=16, page_bytes=4096)
        x = torch.randn(self.E, self.C, self.H).to(torch.bfloat16)
        rec = pool.record(like=x, counts=torch.tensor([5, 6], dtype=torch.int32))
        rec.stash(x, torch.tensor([5, 6], dtype=torch.int32))
        rec.reload(torch.empty_like(x))
        with pytest.raises(ps.PagingError, match="not_stashed: a reload of a record that holds no pages"):
            rec.reload(torch.empty_like(x))

    def test_as_docs_python_md_shows_it(self):
        gen = torch.Generator().manual_seed(3)
        x = torch.randn(2, 32, 64, generator=gen).to(torch.bfloat16)
        w = torch.randn(2, 64, 64, generator=gen).to(torch.bfloat16).requires_grad_()
        counts = torch.tensor([32, 32], dtype=torch.int32)
        raised = None
        # [strict]
        pool = ps.PagePool(device_pages=1, page_bytes=4096)  # a CPU pool: strict by default
        with ps.paged_saved_tensors(pool) as paging:
            loss = torch.bmm(paging.mark(x, counts), w).sum()  # the stash finds no room
        try:
            loss.backward()  # the first reload raises
        except ps.PagingError as e:
            assert e.flags == ["overflow"] and e.decision == "rerun_without_paging"
            # [strict]
            raised = e
        assert raised is not None

    def test_not_strict_without_decide_gives_nan_gradients_not_finite_wrong_ones(self):
        """A failed reload poisons what backward reads: every gradient that depends on it is
        NaN, so a loop that forgets decide() cannot go on with plausible wrong gradients."""
        pool = ps.PagePool(device_pages=1, page_bytes=4096, strict=False)
        pool.begin_step()
        gen = torch.Generator().manual_seed(8)
        w = torch.randn(self.E, self.H, self.H, generator=gen).to(torch.bfloat16).requires_grad_()
        x = torch.randn(self.E, self.C, self.H, generator=gen).to(torch.bfloat16)
        counts = torch.tensor([32, 32], dtype=torch.int32)
        with ps.paged_saved_tensors(pool) as paging:
            torch.bmm(paging.mark(x, counts), w).sum().backward()  # the stash overflows
        assert pool.flag_dict()["overflow"] == 1
        assert bool(w.grad.isnan().all())
        # Off, the flags are the only sign: the gradients are whatever the buffer held.
        pool.reset()
        w.grad = None
        with ps.paged_saved_tensors(pool, poison=False) as paging:
            torch.bmm(paging.mark(x, counts), w).sum().backward()
        assert pool.decide() == "rerun_without_paging" and w.grad is not None

    def test_not_strict_leaves_it_to_the_loop(self):
        pool = ps.PagePool(device_pages=1, page_bytes=4096, strict=False)
        pool.begin_step()
        self.forward(pool, torch.tensor([32, 32], dtype=torch.int32)).backward()  # no exception: sync-free
        assert pool.decide() == "rerun_without_paging"
        with pytest.raises(ps.PagingError, match="overflow"):
            pool.check()


def test_mark_inside_torch_compile_warns():
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    counts = torch.tensor([5, 6], dtype=torch.int32)
    w = torch.randn(2, 64, 64).to(torch.bfloat16).requires_grad_()
    with ps.paged_saved_tensors(pool) as paging:

        @torch.compile(backend="eager")
        def layer(x):
            return torch.bmm(paging.mark(x, counts), w).sum()

        with pytest.warns(ps.UnpagedWarning, match="inside a torch.compile'd region pages nothing"):
            loss = layer(torch.randn(2, 32, 64).to(torch.bfloat16))
    loss.backward()
    assert paging.paged_tensors == 0 and pool.pages_in_use() == 0
