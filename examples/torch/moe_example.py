"""A small MoE grouped-linear block trained for a few steps with and without paging.

Per-expert weights, a Dirichlet router, capacity-padded [experts, capacity, hidden] buffers
(the sync-free layout: the counts stay tensors). With `paged_saved_tensors`, the three
activations autograd saves for backward (the dispatched input, the first GEMM's output and
its SiLU) are stashed into a PagePool after forward and reloaded in backward; everything
else passes through. Each optimizer step accumulates the gradients of two microbatches;
pagestash.run_step checks the pool's flags after the step's last backward and reruns the whole
step without paging when the pool overflowed.

    python examples/torch/moe_example.py [--device cuda] [--pool-factor 0.3] [--microbatches 2]
"""

import argparse

import torch

import pagestash as ps


class GroupedMLP(torch.nn.Module):
    """experts x (hidden -> ffn -> hidden) with SiLU, on capacity-padded buffers."""

    def __init__(self, experts, hidden, ffn, dtype=torch.bfloat16, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter((torch.randn(experts, hidden, ffn, generator=g) * hidden**-0.5).to(dtype))
        self.w2 = torch.nn.Parameter((torch.randn(experts, ffn, hidden, generator=g) * ffn**-0.5).to(dtype))

    def forward(self, x, expert, capacity, paging=None):
        experts, hidden, _ = self.w1.shape
        # Each token's slot in its expert's buffer, and the counts, without leaving the device;
        # tokens beyond an expert's capacity are dropped.
        onehot = torch.nn.functional.one_hot(expert, experts)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        kept = slot < capacity
        counts = onehot.sum(0).clamp(max=capacity).to(torch.int32)
        e, s = expert[kept], slot[kept]

        def pageable(t):  # marks a [experts, capacity, n] activation: recipe and shape from the tensor
            return t if paging is None else paging.mark(t, counts)

        buf = pageable(x.new_zeros(experts, capacity, hidden).index_put((e, s), x[kept]))
        h = pageable(torch.bmm(buf, self.w1))
        a = pageable(torch.nn.functional.silu(h))
        y = torch.bmm(a, self.w2)
        out = x.new_zeros(x.shape).index_put((kept.nonzero().squeeze(1),), y[e, s])
        return out


def dirichlet_batches(steps, tokens, experts, hidden, dtype, device, seed=0):
    """Per step: tokens, their targets, and each token's expert drawn from Dirichlet(1)
    expert probabilities (very uneven counts, as fine-grained MoE routers give)."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        gamma = -torch.log(torch.rand(experts, generator=g))  # Gamma(1) = Exp(1): Dirichlet(1) after normalising
        probs = gamma / gamma.sum()
        expert = torch.multinomial(probs, tokens, replacement=True, generator=g)
        x = torch.randn(tokens, hidden, generator=g).to(dtype)
        target = torch.randn(tokens, hidden, generator=g).to(dtype)
        batches.append((x.to(device), target.to(device), expert.to(device)))
    return batches


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Counts the bytes of the activations autograd holds between forward and backward
    (each storage once; parameters excluded), passing every tensor through."""

    def __init__(self):
        self.storages = {}
        super().__init__(self._pack, lambda t: t)

    def __enter__(self):
        super().__enter__()
        return self

    def _pack(self, t):
        ps.count_activation(self.storages, t)
        return t

    @property
    def nbytes(self):
        return sum(self.storages.values())


def loss_of(model, batch, capacity, paging=None):
    x, target, expert = batch
    return torch.nn.functional.mse_loss(model(x, expert, capacity, paging), target)


def step(model, opt, microbatches, capacity, pool=None):
    """One SGD step accumulating the gradients of `microbatches`; with a pool, the marked
    activations are paged between each microbatch's forward and backward, and the whole step
    reruns without paging when paging failed in any microbatch. Returns how it ran ('eager',
    'paged', or 'rerun'), the summed loss, the gradients, and for the first microbatch: the
    activation bytes autograd held after its forward (paged: the pages in use plus what passed
    through) and, when paged, (bytes of the paged buffers, bytes of the pages that replaced
    them)."""
    seen = dict(loss=0.0)

    def run(step):  # the whole optimizer step: each microbatch's forward, then its backward
        seen["loss"] = 0.0
        for i, batch in enumerate(microbatches):
            with SavedBytes() as saved, step.paging() as paging:
                loss = loss_of(model, batch, capacity, paging)
            if i == 0:  # measuring only (the pages in use synchronise)
                seen.update(held=saved.nbytes, marked=None)
                if step.paged:
                    pages = pool.pages_held() * pool.page_bytes
                    seen.update(held=paging.passed_bytes + pages, marked=(paging.paged_bytes, pages))
            seen["loss"] += loss.item()
            loss.backward()

    # [trainer_step]
    how = ps.run_step(pool, run, opt)  # 'paged', or 'rerun': paging failed, the step reran unpaged
    # [trainer_step]
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return dict(how=how, grads=grads, **seen)


def live_fraction(batch, experts, capacity):
    _, _, expert = batch
    counts = torch.bincount(expert, minlength=experts).clamp(max=capacity)
    return counts.sum().item() / (experts * capacity)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=2, help="microbatches per step (gradient accumulation)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--capacity-factor", type=float, default=2.0)
    ap.add_argument("--pool-factor", type=float, default=1.0,
                    help="pool size as a fraction of the largest step's paged activations (try 0.3: overflow)")
    args = ap.parse_args()

    E, H, F = args.experts, args.hidden, args.ffn
    capacity = int(args.capacity_factor * args.tokens / E)
    M = args.microbatches
    drawn = dirichlet_batches(args.steps * M, args.tokens, E, H, torch.bfloat16, args.device)
    batches = [drawn[i:i + M] for i in range(0, len(drawn), M)]
    page_bytes = 4096
    live_most = max(live_fraction(b, E, capacity) for b in drawn) * E * capacity * (H + 2 * F) * 2
    # strict=False: run_step decides after the step (strict=True raises in backward, and run_step reruns).
    pool = ps.PagePool(device_pages=max(1, int(args.pool_factor * live_most / page_bytes) + 3 * E),
                       page_bytes=page_bytes, device=args.device, strict=False)
    print(f"{E} experts, hidden {H}, ffn {F}, {M} microbatches of {args.tokens} tokens, capacity {capacity}, bf16, "
          f"{args.device}; "
          f"pool {pool.device_pages} pages of {page_bytes} B")

    eager_model, paged_model = GroupedMLP(E, H, F).to(args.device), GroupedMLP(E, H, F).to(args.device)
    eager_opt = torch.optim.SGD(eager_model.parameters(), lr=0.05)
    paged_opt = torch.optim.SGD(paged_model.parameters(), lr=0.05)
    print(f"{'step':>4} {'live':>6} {'eager held':>11} {'paged held':>11} {'ratio':>6} {'buffers':>9} {'pages':>9} "
          f"{'ratio':>6} {'how':>6} {'loss':>9} grads")
    for i, batch in enumerate(batches):
        eager = step(eager_model, eager_opt, batch, capacity)
        paged = step(paged_model, paged_opt, batch, capacity, pool)
        same = all(torch.equal(a, b) for a, b in zip(eager["grads"], paged["grads"]))
        buffers, pages = paged["marked"] or (0, 0)
        print(f"{i:>4} {live_fraction(batch[0], E, capacity):>6.3f} {eager['held']:>11} {paged['held']:>11} "
              f"{paged['held'] / eager['held']:>6.3f} {buffers:>9} {pages:>9} {pages / max(buffers, 1):>6.3f} "
              f"{paged['how']:>6} {paged['loss']:>9.5f} "
              f"{'bit-identical' if same else 'DIFFER'}")
        if not same:
            raise SystemExit("gradients differ")
    print("pool:", {k: v for k, v in pool.stats().items() if k != "flags"})


if __name__ == "__main__":
    main()
