#!/usr/bin/env python3
"""What a compressed stash does to training: a small MoE stack trained on the CPU.

A compressed stash keeps a BF16 activation saved for backward in FP8 instead, so backward
sees dequantize(quantize(x)) where it would have seen x (docs/compression.md). This script
models that in pure PyTorch with `fake_compress(x, encoding)` and measures, for each
encoding (`mxfp8`, `mxfp8_e5m2`, `fp8_1x128`):

- the training loss of a 2-block MoE stack (model dim 256, 8 experts, top-2, expert MLP
  d -> 4d -> d) on a fixed teacher-regression task, against a lossless baseline with the
  same seed and data, for two uses of compression:
  * `wgrad`: only the expert inputs, through `CompressedLinearInput` (the first expert
    Linear's weight gradient reads the dequantized input; its input gradient reads W only);
  * `hooks`: every BF16 saved tensor of the expert MLP whose last dimension is a multiple of
    the block (expert input, GELU input, second Linear's input), through
    `torch.autograd.graph.saved_tensors_hooks` (pack = fake_compress, unpack = identity);
- every 10 steps, at the baseline's weights and on the baseline's batch, the relative error
  ||g_c - g_ref|| / ||g_ref|| of each parameter tensor's gradient with compression against
  the lossless one.

It writes DIR/compression-training.png (loss curves, log y; loss against the lossless run;
gradient error over steps) and DIR/compression-training.json, and prints a markdown table. `--self-check` instead checks
`fake_compress` element by element against a slow scalar re-implementation (exact rational
arithmetic) on a few hundred blocks of each encoding, zeros, subnormals, values near the
BF16 maximum and NaN/Inf blocks included, and exits non-zero on a mismatch.

Run:

    python3 scripts/compression_study.py [--steps N] [--out DIR] [--self-check]

Seeds are fixed and the run is deterministic for a given machine and thread count
(`--threads`, 1 by default). Eight runs of 100 steps (the default: the brief's 300 did not fit
its 3-minute budget on a shared 2-core machine) take about 3 to 4 minutes on one core.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from fractions import Fraction

import torch
import torch.nn as nn
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# fake_compress: quantize along the last dimension, dequantize, back to BF16
# --------------------------------------------------------------------------------------------

ENCODINGS = {
    # name: (block, element dtype, element max, emax of the element format)
    "mxfp8": (32, torch.float8_e4m3fn, 448.0, 8),
    "mxfp8_e5m2": (32, torch.float8_e5m2, 57344.0, 15),
    "fp8_1x128": (128, torch.float8_e4m3fn, 448.0, None),
}
FLT_MAX = torch.finfo(torch.float32).max


def _pow2(e):
    """2^e as FP32 for an integer tensor e in [-149, 127], built from its bits (exact)."""
    e = e.to(torch.int32)
    normal = (e + 127).clamp(min=1) << 23  # e >= -126
    subnormal = torch.ones_like(e) << (e + 149).clamp(0, 22)  # e in [-149, -127]
    return torch.where(e >= -126, normal, subnormal).view(torch.float32)


def fake_compress(x, encoding):
    """dequantize(quantize(x)) for a BF16 tensor x, blocks along its last dimension.

    `encoding` is one of ENCODINGS (docs/compression.md gives the rounding rules). Returns a
    new BF16 tensor of x's shape. Raises ValueError for another dtype or encoding, or when the
    last dimension is not a multiple of the encoding's block.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"fake_compress: unknown encoding {encoding!r} (one of {sorted(ENCODINGS)})")
    block, fp8, fmax, emax = ENCODINGS[encoding]
    if x.dtype != torch.bfloat16:
        raise ValueError(f"fake_compress: x must be bfloat16, not {x.dtype}")
    if x.dim() == 0 or x.shape[-1] % block != 0:
        hidden = x.shape[-1] if x.dim() else "none (a scalar)"
        raise ValueError(
            f"fake_compress: the last (hidden) dimension, {hidden}, is not a multiple of the {encoding} block ({block})"
        )
    xb = x.reshape(-1, block).float()
    amax = xb.abs().amax(dim=1, keepdim=True)
    nonfinite = (~torch.isfinite(xb)).any(dim=1, keepdim=True)
    amax = torch.where(nonfinite, torch.zeros_like(amax), amax)
    if emax is not None:  # MX: power-of-two (E8M0) scale
        _, ex = torch.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1): floor(log2(amax)) = ex - 1
        e = torch.where(amax == 0, torch.full_like(ex, -127), (ex - 1 - emax).clamp(-127, 127))
        code = (xb * _pow2(-e)).clamp(-fmax, fmax).to(fp8)
        deq = code.float() * _pow2(e)
    else:  # 1x128: FP32 scale 448 / amax
        scale = torch.where(amax == 0, torch.ones_like(amax), (fmax / amax).clamp(max=FLT_MAX))
        code = (xb * scale).clamp(-fmax, fmax).to(fp8)
        scale_inv = 1.0 / scale
        deq = code.float() * scale_inv
    deq = torch.where(nonfinite, torch.full_like(deq, float("nan")), deq)
    return deq.to(torch.bfloat16).reshape(x.shape)


# --------------------------------------------------------------------------------------------
# Self-check: a scalar re-implementation with exact rational arithmetic
# --------------------------------------------------------------------------------------------


def _round_binary(v, man_bits, emin, max_finite, on_overflow):
    """Round the Fraction v to a binary format (man_bits stored bits, min normal exponent emin,
    subnormals below it) to nearest, ties to even. Overflow ('inf' or 'sat') past max_finite."""
    if v == 0:
        return Fraction(0)
    sign = -1 if v < 0 else 1
    a = abs(v)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if a < Fraction(2) ** e:
        e -= 1
    elif a >= Fraction(2) ** (e + 1):
        e += 1
    q = max(e, emin) - man_bits  # the quantum at a's exponent
    r = Fraction(round(a / Fraction(2) ** q)) * Fraction(2) ** q  # Fraction rounds half to even
    if r > max_finite:
        if on_overflow == "inf":
            return sign * Fraction(10**60)  # marker: overflow (not reachable in valid cases)
        r = Fraction(max_finite)
    return sign * r


def _f32(v):
    return _round_binary(v, 23, -126, Fraction(FLT_MAX), "inf")


def _bf16(v):
    return _round_binary(v, 7, -126, Fraction(torch.finfo(torch.bfloat16).max), "inf")


def _ref_block(xs, encoding):
    """Slow per-element reference for one block of Python floats; returns Python floats."""
    block, fp8, fmax, emax = ENCODINGS[encoding]
    if any(math.isnan(x) or math.isinf(x) for x in xs):
        return [float("nan")] * len(xs)
    if fp8 == torch.float8_e4m3fn:
        elem = dict(man_bits=3, emin=-6, max_finite=Fraction(448), on_overflow="sat")
    else:
        elem = dict(man_bits=2, emin=-14, max_finite=Fraction(57344), on_overflow="sat")
    amax = max(abs(x) for x in xs)
    out = []
    if emax is not None:
        if amax == 0:
            e = -127
        else:
            e = min(127, max(-127, math.frexp(amax)[1] - 1 - emax))
        for x in xs:
            v = _f32(Fraction(x) * Fraction(2) ** (-e))
            v = max(-Fraction(fmax), min(Fraction(fmax), v))
            code = _round_binary(v, **elem)
            out.append(math.copysign(float(_bf16(_f32(code * Fraction(2) ** e))), x))
    else:
        if amax == 0:
            scale = Fraction(1)
        else:
            scale = _f32(Fraction(448) / Fraction(amax))
            if scale > Fraction(FLT_MAX):
                scale = Fraction(FLT_MAX)
        scale_inv = _f32(1 / scale)
        for x in xs:
            v = _f32(Fraction(x) * scale)
            v = max(-Fraction(fmax), min(Fraction(fmax), v))
            code = _round_binary(v, **elem)
            out.append(math.copysign(float(_bf16(_f32(code * scale_inv))), x))
    return out


def _self_check_data(seed=1):
    """[rows, 512] BF16 rows of distinct kinds; 512 = 16 MX blocks or 4 1x128 blocks a row."""
    g = torch.Generator().manual_seed(seed)
    h = 512
    rows = []

    def add(t):
        rows.append(t.reshape(-1, h).to(torch.bfloat16))

    add(torch.randn(8, h, generator=g))  # plain Gaussian
    add(torch.randn(4, h, generator=g) * torch.exp(torch.randn(4, h, generator=g) * 8))  # wide dynamic range
    # random finite BF16 bit patterns (all exponents, subnormals included)
    bits = torch.randint(0, 1 << 16, (6, h), generator=g, dtype=torch.int32)
    bits = torch.where((bits & 0x7F80) == 0x7F80, bits & ~0x4000, bits)  # no Inf/NaN
    add(bits.to(torch.int16).view(torch.bfloat16).float())
    add(torch.zeros(1, h))  # zero blocks
    neg0 = torch.zeros(1, h)
    neg0[0, ::2] = -0.0
    add(neg0)
    sub = torch.randint(-127, 128, (2, h), generator=g, dtype=torch.int32)  # BF16 subnormals only
    add(torch.where(sub < 0, 0x8000 | (-sub), sub).to(torch.int16).view(torch.bfloat16).float())
    big = torch.finfo(torch.bfloat16).max
    add(big * (1 - torch.rand(2, h, generator=g) * 0.01) * torch.sign(torch.randn(2, h, generator=g)))  # near max
    tiny_in_big = torch.randn(1, h, generator=g) * 1e-6  # underflow to signed zero next to a large value
    tiny_in_big[0, ::32] = 1000.0
    add(tiny_in_big)
    ties = torch.randint(-300, 300, (2, h), generator=g).float() * 0.5  # many exact E4M3 ties
    add(ties)
    specials = torch.randn(2, h, generator=g)
    specials[0, 3] = float("nan")  # one NaN block
    specials[0, 200] = float("inf")  # one Inf block
    specials[1, 300] = float("-inf")
    add(specials)
    return torch.cat(rows)


def self_check():
    x = _self_check_data()
    failures = 0
    t0 = time.time()
    for enc, (block, *_rest) in ENCODINGS.items():
        got = fake_compress(x, enc)
        xb = x.float().reshape(-1, block).tolist()
        gb = got.float().reshape(-1, block)
        gbits = got.view(torch.int16).reshape(-1, block)
        bad_blocks = 0
        nan_blocks = 0
        for i, xs in enumerate(xb):
            ref = _ref_block(xs, enc)
            if math.isnan(ref[0]):
                nan_blocks += 1
                ok = bool(torch.isnan(gb[i]).all())
            else:
                ref_bits = torch.tensor(ref, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
                ok = bool((ref_bits == gbits[i]).all())
            if not ok:
                bad_blocks += 1
                if bad_blocks <= 3:
                    print(f"  MISMATCH {enc} block {i}: x={xs[:8]}... got={gb[i, :8].tolist()}... ref={ref[:8]}...")
        n = len(xb)
        print(f"{enc:>11}: {n} blocks of {block} ({nan_blocks} NaN/Inf), {n - bad_blocks} bit-identical to the scalar reference"
              + ("" if bad_blocks == 0 else f", {bad_blocks} MISMATCHED"))
        failures += bad_blocks
    # argument checks
    for bad, what in (
        (lambda: fake_compress(torch.zeros(4, 48, dtype=torch.bfloat16), "mxfp8"), "hidden 48"),
        (lambda: fake_compress(torch.zeros(4, 64, dtype=torch.bfloat16), "fp8_1x128"), "hidden 64"),
        (lambda: fake_compress(torch.zeros(4, 128), "mxfp8"), "float32"),
        (lambda: fake_compress(torch.zeros(4, 128, dtype=torch.bfloat16), "nvfp4"), "unknown encoding"),
    ):
        try:
            bad()
            print(f"  MISSING ValueError: {what}")
            failures += 1
        except ValueError as err:
            print(f"ValueError as expected ({what}): {err}")
    print(f"self-check {'passed' if failures == 0 else 'FAILED'} in {time.time() - t0:.1f} s")
    return failures == 0


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class CompressedLinearInput(torch.autograd.Function):
    """y = x @ W^T + b for a BF16 x (FP32 math, FP32 master W), saving fake_compress(x, encoding)
    for backward (x itself when encoding is None). Only the weight gradient reads the saved x;
    the input gradient reads W, so compression leaves it unchanged."""

    @staticmethod
    def forward(ctx, x, weight, bias, encoding):
        saved = x if encoding is None else fake_compress(x, encoding)
        ctx.save_for_backward(saved, weight)
        return torch.addmm(bias, x.float(), weight.t())

    @staticmethod
    def backward(ctx, grad_y):
        saved, weight = ctx.saved_tensors
        grad_x = (grad_y @ weight).to(saved.dtype)
        grad_w = grad_y.t() @ saved.float()
        return grad_x, grad_w, grad_y.sum(0), None


class Expert(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.fc1 = nn.Linear(d, f)
        self.fc2 = nn.Linear(f, d)

    def forward(self, x_bf16, wgrad_encoding):
        # BF16 activations between the GEMMs (FP32 accumulation, FP32 master weights)
        h = CompressedLinearInput.apply(x_bf16, self.fc1.weight, self.fc1.bias, wgrad_encoding).to(torch.bfloat16)
        a = F.gelu(h)  # saves h, its input (BF16)
        return CompressedLinearInput.apply(a, self.fc2.weight, self.fc2.bias, None)  # saves a (BF16)


class MoEBlock(nn.Module):
    def __init__(self, d, experts, top_k):
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(Expert(d, 4 * d) for _ in range(experts))
        self.norm = nn.LayerNorm(d)
        self.top_k = top_k

    def forward(self, h, mode):
        logits = self.router(h)  # router / gating: FP32, never compressed
        probs = logits.softmax(-1)
        top_p, top_i = probs.topk(self.top_k, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True)
        # Switch-style load-balancing term (fraction routed x mean probability)
        frac = F.one_hot(top_i, probs.shape[-1]).float().sum((0, 1)) / top_i.numel()
        aux = probs.shape[-1] * (frac * probs.mean(0)).sum()
        out = torch.zeros_like(h)
        variant, encoding = mode
        for e, expert in enumerate(self.experts):  # grouped loop over experts
            tok, slot = (top_i == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            x_e = h[tok].to(torch.bfloat16)  # expert input in BF16
            if variant == "hooks":
                with torch.autograd.graph.saved_tensors_hooks(_compress_pack(encoding), _identity):
                    y_e = expert(x_e, None)
            else:
                y_e = expert(x_e, encoding if variant == "wgrad" else None)
            out = out.index_add(0, tok, y_e * gates[tok, slot, None])
        return self.norm(h + out), aux


def _identity(t):
    return t


def _compress_pack(encoding):
    block = ENCODINGS[encoding][0]

    def pack(t):
        if t.dtype == torch.bfloat16 and t.dim() >= 2 and t.shape[-1] % block == 0:
            return fake_compress(t, encoding)
        return t

    return pack


class MoEStack(nn.Module):
    def __init__(self, d=256, experts=8, top_k=2, blocks=2):
        super().__init__()
        self.blocks = nn.ModuleList(MoEBlock(d, experts, top_k) for _ in range(blocks))
        self.head = nn.Linear(d, d)

    def forward(self, x, mode=("none", None)):
        aux = 0.0
        h = x
        for b in self.blocks:
            h, a = b(h, mode)
            aux = aux + a
        return self.head(h), aux


# --------------------------------------------------------------------------------------------
# The task and the study
# --------------------------------------------------------------------------------------------

AUX_COEF = 0.01


class Teacher:
    """A fixed random network y = W3 tanh(W2 gelu(W1 x)), outputs of unit variance."""

    def __init__(self, d, seed):
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(2 * d, d, generator=g) / math.sqrt(d)
        self.w2 = torch.randn(2 * d, 2 * d, generator=g) * 1.5 / math.sqrt(2 * d)
        self.w3 = torch.randn(d, 2 * d, generator=g) / math.sqrt(2 * d)
        y = self(torch.randn(4096, d, generator=g))
        self.scale = 1 / y.std().item()

    def __call__(self, x):
        y = torch.tanh(F.gelu(x @ self.w1.t()) @ self.w2.t()) @ self.w3.t()
        return y * getattr(self, "scale", 1.0)


def batch(step, tokens, d, teacher, seed):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(tokens, d, generator=g)
    return x, teacher(x)


def loss_fn(model, x, y, mode):
    pred, aux = model(x, mode)
    mse = F.mse_loss(pred, y)
    return mse, mse + AUX_COEF * aux


def train(args, mode, teacher, eval_set, init_seed, grad_modes=()):
    """Train from a fixed init; returns per-step losses, final eval loss and, for grad_modes,
    the relative gradient errors at this run's weights every 10 steps."""
    torch.manual_seed(init_seed)
    model = MoEStack(args.dim, args.experts, 2, args.blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    names = [n for n, _ in model.named_parameters()]
    params = list(model.parameters())
    losses = []
    grad_err = {m: [] for m in grad_modes}  # mode -> list of (step, {param: rel err})
    for step in range(args.steps):
        x, y = batch(step, args.tokens, args.dim, teacher, args.seed)
        if grad_modes and step % 10 == 0:
            for m in grad_modes:  # the compressed gradient at these weights, this batch
                _, total = loss_fn(model, x, y, m)
                g_c = torch.autograd.grad(total, params, allow_unused=True)
                grad_err[m].append((step, g_c))
        mse, total = loss_fn(model, x, y, mode)
        opt.zero_grad(set_to_none=True)
        total.backward()
        if grad_modes and step % 10 == 0:
            for m in grad_modes:
                g_c = grad_err[m][-1][1]
                errs = {}
                for n, p, gc in zip(names, params, g_c):
                    ref = p.grad
                    gc = torch.zeros_like(ref) if gc is None else gc
                    errs[n] = ((gc - ref).norm() / ref.norm().clamp(min=1e-30)).item()
                grad_err[m][-1] = (step, errs)
        opt.step()
        losses.append(mse.item())
    with torch.no_grad():
        ex, ey = eval_set
        eval_loss = F.mse_loss(model(ex)[0], ey).item()
    return losses, eval_loss, grad_err


def mode_name(mode):
    return "lossless" if mode[0] == "none" else f"{mode[1]} ({mode[0]})"


def run_study(args):
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()
    teacher = Teacher(args.dim, args.seed + 1)
    g = torch.Generator().manual_seed(args.seed + 2)
    ex = torch.randn(args.eval_tokens, args.dim, generator=g)
    eval_set = (ex, teacher(ex))
    encs = list(ENCODINGS)
    modes = [(v, e) for v in ("wgrad", "hooks") for e in encs]

    results = {}
    t0 = time.time()
    base_losses, base_eval, grad_err = train(args, ("none", None), teacher, eval_set, args.seed, grad_modes=modes)
    results["lossless"] = dict(losses=base_losses, eval_loss=base_eval, seconds=time.time() - t0)
    print(f"lossless: eval {base_eval:.5f} ({time.time() - t0:.1f} s, gradient checks included)", file=sys.stderr)
    for m in modes:
        t0 = time.time()
        losses, ev, _ = train(args, m, teacher, eval_set, args.seed)
        results[mode_name(m)] = dict(losses=losses, eval_loss=ev, seconds=time.time() - t0, mode=list(m))
        print(f"{mode_name(m)}: eval {ev:.5f} ({time.time() - t0:.1f} s)", file=sys.stderr)
    if not args.no_seed_reference:
        t0 = time.time()
        losses, ev, _ = train(args, ("none", None), teacher, eval_set, args.seed + 100)
        results["lossless, other init seed"] = dict(losses=losses, eval_loss=ev, seconds=time.time() - t0)
        print(f"lossless, other init seed: eval {ev:.5f} ({time.time() - t0:.1f} s)", file=sys.stderr)

    tail = min(10, args.steps)
    base_tail = statistics.fmean(base_losses[-tail:])
    summary = {}
    for name, r in results.items():
        tl = statistics.fmean(r["losses"][-tail:])
        s = dict(
            final_train_loss=tl,
            final_eval_loss=r["eval_loss"],
            train_loss_diff_vs_lossless=tl - base_tail,
            eval_loss_diff_vs_lossless=r["eval_loss"] - base_eval,
            eval_loss_rel_diff_vs_lossless=(r["eval_loss"] - base_eval) / base_eval,
        )
        m = tuple(r["mode"]) if "mode" in r else None
        if m in grad_err:
            per_step = grad_err[m]
            affected = sorted({n for _, errs in per_step for n, v in errs.items() if v > 0})
            vals = [v for _, errs in per_step for n, v in errs.items() if n in affected]
            w1 = [v for _, errs in per_step for n, v in errs.items() if n.endswith("fc1.weight")]
            s["grad_rel_err"] = dict(
                parameters_affected=len(affected),
                parameters_total=len(per_step[0][1]),
                median=statistics.median(vals) if vals else 0.0,
                max=max(vals) if vals else 0.0,
                median_fc1_weight=statistics.median(w1),
                max_fc1_weight=max(w1),
                checks=len(per_step),
                per_check_median=[[st, statistics.median([errs[n] for n in affected]) if affected else 0.0]
                                  for st, errs in per_step],
                per_check_max=[[st, max(errs.values())] for st, errs in per_step],
            )
        summary[name] = s

    elapsed = time.time() - t_start
    config = dict(
        dim=args.dim, experts=args.experts, top_k=2, expert_hidden=4 * args.dim, blocks=args.blocks,
        tokens_per_batch=args.tokens, steps=args.steps, optimizer="AdamW", lr=args.lr, weight_decay=0.01,
        aux_loss_coef=AUX_COEF, seed=args.seed, threads=args.threads, eval_tokens=args.eval_tokens,
        final_train_loss="mean task MSE of the last %d steps" % tail, torch=torch.__version__,
    )
    out = dict(config=config, runtime_seconds=elapsed, results=summary,
               losses={k: v["losses"] for k, v in results.items()})
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compression-training.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    plot(args, results, summary, os.path.join(args.out, "compression-training.png"))
    print_table(summary, elapsed)
    return out


def plot(args, results, summary, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax3, ax2) = plt.subplots(1, 3, figsize=(18, 4.8))
    colors = {"mxfp8": "tab:blue", "mxfp8_e5m2": "tab:red", "fp8_1x128": "tab:green"}
    for name, r in results.items():
        m = r.get("mode")
        if m is None:
            style = dict(color="black", lw=2.0) if name == "lossless" else dict(color="gray", lw=1.0, ls=":")
        else:
            style = dict(color=colors[m[1]], lw=1.0, ls="-" if m[0] == "wgrad" else "--")
        ax1.plot(range(len(r["losses"])), r["losses"], label=name, **style)
        if name != "lossless":
            rel = [100 * (a / b - 1) for a, b in zip(r["losses"], results["lossless"]["losses"])]
            ax3.plot(range(len(rel)), rel, label=name, **style)
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("task MSE (train batch)")
    ax1.set_title("Training loss")
    ax1.legend(fontsize=8)
    ax3.axhline(0, color="black", lw=0.8)
    ax3.set_xlabel("step")
    ax3.set_ylabel("loss / lossless loss - 1 (%)")
    ax3.set_title("Training loss against the lossless run (same batch)")
    for name, s in summary.items():
        if "grad_rel_err" not in s:
            continue
        m = results[name]["mode"]
        pts = s["grad_rel_err"]["per_check_max"]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[m[1]],
                 ls="-" if m[0] == "wgrad" else "--", marker="o", ms=3, lw=1.0, label=name + ", max")
        pts = s["grad_rel_err"]["per_check_median"]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[m[1]],
                 ls="-" if m[0] == "wgrad" else "--", marker="x", ms=3, lw=0.6, alpha=0.6, label=name + ", median")
    ax2.set_yscale("log")
    ax2.set_xlabel("step (lossless run's weights and batch)")
    ax2.set_ylabel("||g_c - g_ref|| / ||g_ref||")
    ax2.set_title("Gradient error per parameter tensor (affected tensors)")
    ax2.legend(fontsize=6, ncol=2)
    fig.suptitle(f"Compressed stash, MoE d={args.dim}, {args.experts} experts top-2, {args.blocks} blocks, "
                 f"{args.tokens} tokens/step, {args.steps} steps (CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(summary, elapsed):
    print("| run | final train MSE | final eval MSE | eval vs lossless | grad rel. err median | grad rel. err max | tensors affected |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, s in summary.items():
        ge = s.get("grad_rel_err")
        g = (f"{ge['median']:.2e} | {ge['max']:.2e} | {ge['parameters_affected']} of {ge['parameters_total']}"
             if ge else "- | - | -")
        print(f"| {name} | {s['final_train_loss']:.5f} | {s['final_eval_loss']:.5f} | "
              f"{s['eval_loss_rel_diff_vs_lossless'] * 100:+.2f}% | {g} |")
    print(f"\nruntime {elapsed:.0f} s")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100, help="training steps per run (100)")
    p.add_argument("--out", default="docs", help="output folder for the PNG and JSON (docs)")
    p.add_argument("--self-check", action="store_true", help="check fake_compress against the scalar reference and exit")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: two threads on 2 cores busy with other work ran 30x slower)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", type=int, default=256, help="model dim (256)")
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--blocks", type=int, default=2, help="MoE blocks (2)")
    p.add_argument("--tokens", type=int, default=512, help="tokens per batch (512)")
    p.add_argument("--eval-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--no-seed-reference", action="store_true",
                   help="skip the lossless run from another init seed (the seed-to-seed reference)")
    args = p.parse_args()
    if args.self_check:
        torch.set_num_threads(args.threads)
        sys.exit(0 if self_check() else 1)
    run_study(args)


if __name__ == "__main__":
    main()
