"""Paging what TransformerEngine marks: an MoE block whose grouped layers save TE's grouped storage,
trained for a few steps with and without paging, with no mark() call.

TE's grouped layers (its fused grouped MLP, `mark_grouped_tensor` in transformer_engine/pytorch/utils.py)
set `grouped_tensor_scale_inv` on the storage they save for backward. All the model does for
pagestash is run each TE layer inside `pagestash.te_layer(counts, tokens=...)` with the layer's
device counts (per expert) and the rows of its grouped buffers: inside a paged context what TE
marked is paged as the recipe its layout is; outside one (the unpaged rerun, the eager twin) it
does nothing.

Without TE (CI builds none: its torch package builds from source against CUDA), the block is a
stand-in that saves and marks what TE's grouped MLP saves of an unquantized run: its input as
flat BF16 grouped storage and the first GEMM's output `[tokens, ffn]`. With `--te` (TE installed,
a GPU) the block is transformer_engine.pytorch.GroupedLinear, SiLU, GroupedLinear: whatever that
TE version marks is paged, the rest passes through.

    python examples/torch/te_example.py [--te] [--steps 4] [--pool-factor 0.3]
"""

import argparse

import torch

import pagestash as ps

try:
    from transformer_engine.pytorch.utils import mark_grouped_tensor
except ImportError:  # TE's convention, as its mark_grouped_tensor applies it to an unquantized tensor
    def mark_grouped_tensor(*tensors):
        for t in tensors:
            t.grouped_tensor_scale_inv = False


class StandInGroupedMLP(torch.autograd.Function):
    """experts x (hidden -> ffn -> hidden), SiLU, over tokens packed expert after expert in buffers
    of `tokens` rows; saves (and marks) TE's grouped storage of its input and the first GEMM's
    output. (TE's kernels read the counts on the device; this stand-in reads them on the host.)"""

    @staticmethod
    def forward(ctx, x, w1, w2, counts):
        rows = [0] + torch.cumsum(counts, 0).tolist()
        x_storage = x.detach().reshape(-1).clone()  # TE's unquantized grouped storage: flat, [tokens * hidden]
        h = torch.zeros(x.shape[0], w1.shape[-1], dtype=x.dtype, device=x.device)
        y = torch.zeros_like(x)
        for e in range(w1.shape[0]):
            r = slice(rows[e], rows[e + 1])
            h[r] = x[r] @ w1[e]
            y[r] = torch.nn.functional.silu(h[r]) @ w2[e]
        mark_grouped_tensor(x_storage, h)
        ctx.save_for_backward(x_storage, h, w1, w2)
        ctx.rows = rows
        return y

    @staticmethod
    def backward(ctx, gy):
        x_storage, h, w1, w2 = ctx.saved_tensors
        x = x_storage.view(h.shape[0], -1)
        gx, gw1, gw2 = torch.zeros_like(x), torch.zeros_like(w1), torch.zeros_like(w2)
        for e in range(w1.shape[0]):
            r = slice(ctx.rows[e], ctx.rows[e + 1])
            a = torch.nn.functional.silu(h[r])
            gw2[e] = a.T @ gy[r]
            ga = gy[r] @ w2[e].T
            s = torch.sigmoid(h[r].float())
            gh = (ga.float() * s * (1 + h[r].float() * (1 - s))).to(h.dtype)
            gw1[e] = x[r].T @ gh
            gx[r] = gh @ w1[e].T
        return gx, gw1, gw2, None


class Block(torch.nn.Module):
    def __init__(self, experts, hidden, ffn, te=False, device="cpu", seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=g) * s[-2] ** -0.5).to(torch.bfloat16).to(device))
        self.te = te
        if te:
            import transformer_engine.pytorch as tep
            self.fc1 = tep.GroupedLinear(experts, hidden, ffn, bias=False, params_dtype=torch.bfloat16, device=device)
            self.fc2 = tep.GroupedLinear(experts, ffn, hidden, bias=False, params_dtype=torch.bfloat16, device=device)
        else:
            self.w1, self.w2 = w(experts, hidden, ffn), w(experts, ffn, hidden)

    def forward(self, x, counts):
        # The one line for pagestash: the layer's device counts, and the rows of TE's grouped buffers.
        with ps.te_layer(counts, tokens=x.shape[0]):
            if self.te:
                splits = counts.tolist()
                return self.fc2(torch.nn.functional.silu(self.fc1(x, splits)), splits)
            return StandInGroupedMLP.apply(x, self.w1, self.w2, counts)


def batches(steps, microbatches, rows, experts, hidden, device, seed=0):
    """Per microbatch: tokens packed expert after expert in `rows` rows (Dirichlet(1) routing of 30% to 70%
    as many tokens, the rest of the buffer dead), the counts (int32, on the device) and a target."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps * microbatches):
        probs = -torch.log(torch.rand(experts, generator=g))
        tokens = int(rows * (0.3 + 0.4 * float(torch.rand(1, generator=g))))
        counts = torch.bincount(torch.multinomial(probs / probs.sum(), tokens, replacement=True, generator=g),
                                minlength=experts).to(torch.int32)
        x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
        x[int(counts.sum()):] = 0
        out.append((x.to(device), counts.to(device), torch.randn(rows, hidden, generator=g).to(device)))
    return [out[s * microbatches:(s + 1) * microbatches] for s in range(steps)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--te", action="store_true", help="transformer_engine.pytorch.GroupedLinear (TE and a GPU)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--rows", type=int, default=512, help="rows of the grouped buffers (Megatron: max_num_tokens)")
    ap.add_argument("--pool-factor", type=float, default=1.0, help="pool size / what one microbatch marks")
    args = ap.parse_args()
    device = "cuda" if args.te else "cpu"
    paged_model = Block(args.experts, args.hidden, args.ffn, args.te, device)
    eager_model = Block(args.experts, args.hidden, args.ffn, args.te, device)
    eager_model.load_state_dict(paged_model.state_dict())
    page = 4096
    marked = args.rows * (args.hidden + args.ffn) * 2  # what a microbatch's layer marks: its input and first output
    pool = ps.PagePool(max(1, int(args.pool_factor * marked / page)), page_bytes=page, device=device)
    print(f"pool: {pool.device_pages} pages of {page} B; a microbatch marks {marked} B")
    print("step  live    how  paged  passed  marked bytes  page bytes held  grads")
    for step, data in enumerate(batches(args.steps, args.microbatches, args.rows, args.experts, args.hidden, device)):
        contexts, held = [], []

        def microbatches(s, model):
            for x, counts, target in data:
                with s.paging() as paging:
                    loss = (model(x, counts).float() * target).sum()
                contexts.append(paging)
                held.append(pool.pages_held() if isinstance(paging, ps.paged_saved_tensors) else 0)
                loss.backward()

        how = ps.run_step(pool, lambda s: microbatches(s, paged_model), paged_model)
        ps.run_step(None, lambda s: microbatches(s, eager_model), eager_model)
        same = all(torch.equal(a.grad, b.grad) for a, b in zip(paged_model.parameters(), eager_model.parameters()))
        first = next(c for c in contexts if isinstance(c, ps.paged_saved_tensors))
        live = float(data[0][1].sum()) / args.rows
        print(f"{step:4d}  {live:.2f}  {how:>5}  {first.paged_tensors:5d}  {first.passed_tensors:6d}  "
              f"{first.paged_bytes:12d}  {held[0] * page:15d}  {'bit-identical' if same else 'DIFFERENT'}")
        assert same


if __name__ == "__main__":
    main()
