"""A training loop as a user writes one, checked against eager PyTorch: RMSNorm, an fp32
softmax router with top-2 and a load-balancing aux loss, permutation into capacity-padded
[experts, capacity, hidden] buffers, SwiGLU experts, AdamW, and gradient accumulation over
microbatches in 1F1B order. Some steps' pools are too small: those steps rerun unpaged.
After every step the parameters must equal eager's bit for bit, and the pool must be clean."""

import pytest
import torch

import pagestash as ps

E, H, F, TOKENS, TOP_K = 8, 64, 128, 96, 2
CAPACITY = 32  # capacity factor 8/6 x 2 top-k: some tokens dropped when routing is uneven


class MoE(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.counts_seen = []  # every forward's counts, for the observation test
        self.norm = torch.nn.Parameter(torch.ones(H))
        self.router = torch.nn.Parameter(torch.randn(H, E, generator=g) * H**-0.5)
        self.w_gate = torch.nn.Parameter((torch.randn(E, H, F, generator=g) * H**-0.5).to(torch.bfloat16))
        self.w_up = torch.nn.Parameter((torch.randn(E, H, F, generator=g) * H**-0.5).to(torch.bfloat16))
        self.w_down = torch.nn.Parameter((torch.randn(E, F, H, generator=g) * F**-0.5).to(torch.bfloat16))

    def forward(self, x, paging=None):
        h = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.norm
        probs = torch.softmax(h @ self.router, dim=-1)  # fp32 router
        weight, expert = probs.topk(TOP_K, dim=-1)
        onehot = torch.nn.functional.one_hot(expert.flatten(), E)  # [tokens * top_k, E]
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        kept = slot < CAPACITY
        counts = onehot.sum(0).clamp(max=CAPACITY).to(torch.int32)
        self.counts_seen.append(counts)
        aux = E * (onehot.float().mean(0) * probs.mean(0)).sum()  # load balancing
        e, s = expert.flatten()[kept], slot[kept]
        token = torch.arange(x.shape[0]).repeat_interleave(TOP_K)[kept]
        mark = (lambda t: t) if paging is None else (lambda t: paging.mark(t, counts))
        buf = mark(h.new_zeros(E, CAPACITY, H, dtype=torch.bfloat16).index_put((e, s), h[token].bfloat16()))
        gate = mark(torch.bmm(buf, self.w_gate))
        up = mark(torch.bmm(buf, self.w_up))
        act = mark(torch.nn.functional.silu(gate) * up)
        y = torch.bmm(act, self.w_down)[e, s].float() * weight.flatten()[kept, None]
        out = h.new_zeros(x.shape).index_add(0, token, y)
        return out, aux


def data(steps, microbatches, seed):
    g = torch.Generator().manual_seed(seed)
    skew = torch.linspace(0, 1.5, H)  # uneven routing: some experts overfill
    return [[(torch.randn(TOKENS, H, generator=g) + skew, torch.randn(TOKENS, H, generator=g))
             for _ in range(microbatches)] for _ in range(steps)]


def one_f_one_b(n):
    """Forward of microbatch i+1 before the backward of i (two in flight)."""
    order = [("f", 0)]
    for i in range(1, n):
        order += [("f", i), ("b", i - 1)]
    return order + [("b", n - 1)]


def run(model, batch, step=None):
    losses = {}
    for kind, i in one_f_one_b(len(batch)):
        x, target = batch[i]
        if kind == "f":
            if step is None:
                out, aux = model(x)
            else:
                with step.paging() as paging:
                    out, aux = model(x, paging)
            losses[i] = torch.nn.functional.mse_loss(out, target) + 0.01 * aux
        else:
            losses.pop(i).backward()


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "sync-free"])
@pytest.mark.parametrize("prefetch,skip_next,factor", [(0, 0, 1.1), (2, 1, 0.8)])
def test_adamw_with_gradient_accumulation_matches_eager_through_reruns(strict, prefetch, skip_next, factor):
    steps, microbatches = 6, 3
    batches = data(steps, microbatches, seed=11)
    eager, paged = MoE(), MoE()
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    paged_opt = torch.optim.AdamW(paged.parameters(), lr=1e-2)
    # Two microbatches of four stashes each alive at once (three with skip_next=1); a pool
    # near one microbatch's worst case fits some steps and not others.
    page_bytes = 4096
    per_microbatch = E * CAPACITY * (H + 3 * F) * 2 // page_bytes
    pool = ps.PagePool(device_pages=int(factor * per_microbatch), page_bytes=page_bytes, strict=strict)
    hows = []
    for batch in batches:
        eager_opt.zero_grad(set_to_none=True)
        run(eager, batch)
        eager_opt.step()
        hows.append(ps.run_step(pool, lambda step: run(paged, batch, step), paged_opt, prefetch=prefetch,
                                skip_next=skip_next))
        paged_opt.step()
        for a, b in zip(eager.parameters(), paged.parameters()):
            assert torch.equal(a, b), f"step {len(hows)} ({hows[-1]}): parameters differ"
        assert pool.pages_in_use() == 0 and not any(pool.flag_dict().values())
    assert "paged" in hows and "rerun" in hows, hows
    assert pool.totals["steps"] == hows.count("paged") + hows.count("rerun")
    assert pool.totals["reruns"] == hows.count("rerun")


def test_observing_through_reruns_records_every_step_whole():
    """A strict pool raises in the middle of backward: while it observes, run_step runs the
    paged step to its end, so the failed steps' counts are recorded whole, in order."""
    steps, microbatches = 6, 3
    batches = data(steps, microbatches, seed=11)
    eager, paged = MoE(), MoE()
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    paged_opt = torch.optim.AdamW(paged.parameters(), lr=1e-2)
    per_microbatch = E * CAPACITY * (H + 3 * F) * 2 // 4096
    pool = ps.PagePool(device_pages=int(1.1 * per_microbatch), page_bytes=4096)  # strict: a CPU pool's default
    pool.observe(steps)
    hows = []
    for batch in batches:
        eager_opt.zero_grad(set_to_none=True)
        eager.counts_seen.clear()
        run(eager, batch)
        eager_opt.step()
        # The stashes of a step: microbatch by microbatch in forward order (1F1B keeps it).
        want = torch.stack(eager.counts_seen)
        hows.append(ps.run_step(pool, lambda step: run(paged, batch, step), paged_opt))
        paged_opt.step()
        assert torch.equal(pool.observed_counts()[-1], want)
        for a, b in zip(eager.parameters(), paged.parameters()):
            assert torch.equal(a, b)
    assert "rerun" in hows and pool.observed_counts().shape == (steps, microbatches, E)
    assert pool.observing == 0 and pool.totals["overflowed_steps"] == hows.count("rerun")
