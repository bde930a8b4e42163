"""TransformerEngine's paged-stash markers (pagestash.te_layer, python/pagestash/te.py): what TE's grouped
layers mark (`grouped_tensor_scale_inv`) is paged with no mark() call, its layout inferred as TE lays out
its grouped storage. TE cannot be imported here, so `_te_storage.py` builds the storage as TE does (its
shapes, dtypes, paddings and marks, written from TE's sources) and reads it back where TE's kernels read
it; a stand-in for TE's grouped linear saves it for backward, whose weight gradient reads it. Gradients
are compared bit for bit with the unpaged run, reloads byte for byte on the live bytes, in lifo and 1F1B
orders, strict and not. A test with the real transformer_engine.pytorch.GroupedLinear runs where TE is
importable."""

import contextlib
import importlib.util
import warnings

import pytest
import torch

import _te_storage as te_st
import pagestash as ps

PAGE = 4096
LAYERS, MICROBATCHES = 2, 4
ORDERS = {
    "lifo": [(d, m) for m in range(MICROBATCHES) for d in "fb"],
    "1f1b": [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("f", 3), ("b", 2), ("b", 3)],
}
# TE grouped storage: (format, tokens, hidden, TE groups, swizzled scales) and the recipe it is paged as.
CASES = {
    "bf16": (("bf16", 256, 64, 4, True), "bf16/packed"),
    "mxfp8": (("mxfp8", 512, 128, 4, True), "mxfp8/packed/swizzled"),  # TE's grouped kernels
    "mxfp8_compact": (("mxfp8", 512, 128, 4, False), "mxfp8/packed/compact"),
    "mxfp8_one_group": (("mxfp8", 256, 160, 1, True), "mxfp8/capacity/swizzled"),  # TE quantizes it whole
    "nvfp4": (("nvfp4", 512, 128, 4, True), "nvfp4/packed/swizzled"),
    "nvfp4_one_group": (("nvfp4", 256, 160, 1, True), "nvfp4/capacity/swizzled"),  # [hidden, tokens / 2]
    "nvfp4_one_group_compact": (("nvfp4", 256, 160, 1, False), "nvfp4/capacity/compact"),
}


def random_counts(fmt, tokens, groups, g):
    """Live tokens per TE group: TE's grouped kernels need multiples of 128 of quantized groups; one
    group (or unquantized rows) any count."""
    if groups == 1:
        return [int(torch.randint(1, tokens, (1,), generator=g))]
    unit = 1 if fmt == "bf16" else 128
    counts = [0] * groups
    for _ in range(int(torch.randint(1, tokens // unit, (1,), generator=g))):  # at least one token left dead
        counts[int(torch.randint(0, groups, (1,), generator=g))] += unit
    return counts


class GroupedLinear(torch.autograd.Function):
    """A stand-in for TE's grouped linear as its backward sees it: forward quantizes x [tokens, hidden]
    into TE's grouped storage (te_st.make: marked as mark_grouped_tensor marks it), computes each group's
    rows times its weight, and saves the storage (TE's prepare_for_saving order) and the weights; the
    weight gradient reads x back from the saved storage where TE's kernels read it."""

    @staticmethod
    def forward(ctx, x, w, spec, counts):
        fmt, tokens, hidden, groups, swizzled = spec
        st = te_st.make(fmt, tokens, hidden, counts, groups, swizzled, x=x)
        ctx.save_for_backward(*st.saved(), w)
        ctx.st = te_st.Storage(fmt, tokens, hidden, list(counts), groups, swizzled)  # the geometry, no buffers
        return GroupedLinear.matmul(ctx.st, st.read(), w)

    @staticmethod
    def matmul(st, x, w):
        y = torch.zeros(st.tokens, w.shape[-1])
        for g, (start, m) in enumerate(zip(st.starts, st.counts)):
            y[start:start + m] = x[start:start + m] @ w[g]
        return y

    @staticmethod
    def backward(ctx, gy):
        *storage, w = ctx.saved_tensors
        st = ctx.st
        x = st.read(storage[0], storage[1] if len(storage) > 1 else None)
        gw, gx = torch.zeros_like(w), torch.zeros(st.tokens, st.hidden)
        for g, (start, m) in enumerate(zip(st.starts, st.counts)):
            gw[g] = x[start:start + m].T @ gy[start:start + m]
            gx[start:start + m] = gy[start:start + m] @ w[g].T
        return gx, gw, None, None


def batches(case, seed=5):
    (fmt, tokens, hidden, groups, _), _ = CASES[case]
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(tokens, hidden, generator=g).requires_grad_(), random_counts(fmt, tokens, groups, g),
             torch.randn(tokens, hidden, generator=g)) for _ in range(MICROBATCHES)]


def weights(case, seed=9):
    (_, _, hidden, groups, _), _ = CASES[case]
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(groups, hidden, hidden, generator=g) * hidden ** -0.5) for _ in range(LAYERS)]


def forward(case, w, x, counts, total=False):
    """The model: LAYERS TE grouped layers, each in te_layer with its counts (per group, or their total);
    outside a paged context te_layer does nothing."""
    (fmt, tokens, hidden, groups, swizzled), _ = CASES[case]
    spec = (fmt, tokens, hidden, groups, swizzled)
    layers = []
    for i in range(LAYERS):
        device_counts = torch.tensor([sum(counts)] if total else counts, dtype=torch.int32)  # the layer's routing
        # [te_layer]
        with ps.te_layer(device_counts, tokens=tokens, groups=groups, scales="swizzled" if swizzled else "compact",
                         name=f"experts.{i}") as layer:
            x = GroupedLinear.apply(x, w[i], spec, counts)  # TE saves what it marked: paged, no mark()
        # [te_layer]
        layers.append(layer)
    return x, layers


def train(case, order, pool=None, total=False, **hook_options):
    w = weights(case)
    data = batches(case)
    losses, contexts = {}, []
    for d, m in ORDERS[order]:
        x, counts, target = data[m]
        if d == "f":
            paged = ps.paged_saved_tensors(pool, **hook_options) if pool is not None else contextlib.nullcontext()
            with paged as paging:
                y, layers = forward(case, w, x, counts, total)
                losses[m] = (y * target).sum()
            contexts.append((paging, layers))
        else:
            losses[m].backward()
    return [p.grad for p in w] + [x.grad for x, _, _ in data], contexts


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("case", CASES)
def test_te_marked_storage_is_paged_with_gradients_bit_for_bit(case, order, strict):
    eager, _ = train(case, order)
    pool = ps.PagePool(device_pages=512, page_bytes=PAGE, strict=strict)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing marked is left unpaged
        paged, contexts = train(case, order, pool)
    for a, b in zip(eager, paged):
        assert torch.equal(a, b)
    (fmt, tokens, hidden, groups, _), recipe = CASES[case]
    for paging, layers in contexts:
        assert paging.paged_tensors == LAYERS * (1 if fmt == "bf16" else 2)  # data, and its scales
        for layer in layers:
            assert layer.paged == 1
            assert layer.saved == [(recipe, ps.Shape(groups, tokens, hidden) if groups > 1 else
                                    ps.Shape(1, tokens, hidden))]
    assert pool.check() is None
    assert pool.pages_in_use() == 0


def test_a_total_count_pages_the_same_grouped_storage():
    """Megatron's MoE layer has the total device count: with groups= it pages what per-group counts do."""
    eager, _ = train("nvfp4", "1f1b")
    pool = ps.PagePool(device_pages=512, page_bytes=PAGE)
    paged, contexts = train("nvfp4", "1f1b", pool, total=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, paged))
    assert contexts[0][1][0].saved == [("nvfp4/packed/swizzled", ps.Shape(1, 512, 128))]


class Saves(torch.autograd.Function):
    """Saves the given buffers for backward and hands what backward got to `got`."""

    @staticmethod
    def forward(ctx, x, got, *buffers):
        ctx.save_for_backward(*buffers)
        ctx.got = got
        return x.clone()

    @staticmethod
    def backward(ctx, gy):
        ctx.got.extend(t.clone() for t in ctx.saved_tensors)
        return gy, None, *([None] * len(ctx.saved_tensors))


def reloaded(st, counts, pool, **layer):
    """The buffers of `st` as backward gets them from a paged context."""
    x, got = torch.zeros(4, requires_grad=True), []
    with ps.paged_saved_tensors(pool) as paging:
        with ps.te_layer(torch.tensor(counts, dtype=torch.int32), tokens=st.tokens, groups=st.groups, **layer):
            y = Saves.apply(x, got, *st.saved())
    y.sum().backward()
    assert paging.paged_tensors == 2
    return got


def megatron_reload(t, num_tokens, max_num_tokens):
    """Megatron-LM's paged stash (megatron/core/transformer/moe/paged_stash.py, on_save_for_backward): a
    marked tensor is `max_num_tokens` rows (scales: max_num_tokens // 32) of numel / rows elements, of which
    the first `num_tokens` (scales: num_tokens // 32) are live: a prefix. What its reload restores."""
    scales = getattr(t, te_st.MARKER)
    rows, live = (max_num_tokens // 32, num_tokens // 32) if scales else (max_num_tokens, num_tokens)
    hidden = t.numel() // rows
    out = torch.zeros_like(t)
    out[:live * hidden] = t[:live * hidden]
    return out


def test_nvfp4_reload_is_byte_exact_where_a_prefix_of_tokens_loses_bytes():
    """NVFP4 grouped storage of one group (TE's shared expert, or a layer of one local expert): the
    columnwise data is [hidden, tokens / 2], so a token's bytes are one per hidden row, and the swizzled
    scales are 128 x 4 tiles over [ru(hidden, 128), tokens / 16]. pagestash restores every live byte; a
    prefix-of-tokens reading (Megatron's rule) of the same tensor loses most of them."""
    n, tokens = 100, 256
    st = te_st.make("nvfp4", tokens, 160, [n], groups=1, swizzled=True, seed=3)
    live_data, live_scales = st.live_bytes()
    data, scales, amax = reloaded(st, [n], ps.PagePool(device_pages=64, page_bytes=PAGE))
    assert torch.equal(data[live_data], st.data[live_data]) and torch.equal(scales[live_scales], st.scales[live_scales])
    assert torch.equal(amax, st.amax)  # TE's amax: not marked, kept by autograd as TE keeps it
    assert torch.equal(st.read(data, scales), st.read())
    # The prefix reading of the same buffers:
    prefix_data, prefix_scales = megatron_reload(st.data, n, tokens), megatron_reload(st.scales, n, tokens)
    lost_data = live_data & (prefix_data != st.data)
    lost_scales = live_scales & (prefix_scales != st.scales)
    assert lost_data.sum() > live_data.sum() // 2 and lost_scales.sum() > 0
    assert not torch.equal(st.read(prefix_data, prefix_scales), st.read())


@pytest.mark.parametrize("case", ["mxfp8", "mxfp8_one_group", "nvfp4", "nvfp4_one_group_compact", "bf16"])
def test_reloads_are_byte_exact_on_the_live_bytes(case):
    (fmt, tokens, hidden, groups, swizzled), _ = CASES[case]
    counts = random_counts(fmt, tokens, groups, torch.Generator().manual_seed(11))
    st = te_st.make(fmt, tokens, hidden, counts, groups, swizzled, seed=4)
    pool = ps.PagePool(device_pages=128, page_bytes=PAGE)
    x, got = torch.zeros(4, requires_grad=True), []
    with ps.paged_saved_tensors(pool):
        with ps.te_layer(torch.tensor(counts, dtype=torch.int32), tokens=tokens, groups=groups,
                         scales="swizzled" if swizzled else "compact"):
            y = Saves.apply(x, got, *st.saved())
    held = pool.pages_in_use()
    y.sum().backward()
    live_data, live_scales = st.live_bytes()
    assert 0 < held * PAGE < st.data.numel() * st.data.element_size()  # paged, and fewer bytes than the buffer
    raw = lambda t: t.reshape(-1).view(torch.uint8)
    assert torch.equal(raw(got[0])[live_data], raw(st.data)[live_data])
    if st.scales is not None:
        assert torch.equal(got[1][live_scales], st.scales[live_scales])


def test_outside_te_layer_and_unmarked_tensors_pass_through():
    st = te_st.make("mxfp8", 512, 128, [128, 0, 128, 0], seed=1)
    plain = torch.randn(512, 128)
    pool = ps.PagePool(device_pages=64, page_bytes=PAGE)
    got, got_plain = [], []
    with pytest.warns(ps.UnpagedWarning, match="outside any pagestash.te_layer"):
        with ps.paged_saved_tensors(pool) as paging:
            y = Saves.apply(torch.zeros(4, requires_grad=True), got, *st.saved())
    with ps.paged_saved_tensors(pool) as unmarked:
        with ps.te_layer(torch.tensor([128, 0, 128, 0], dtype=torch.int32), tokens=512):
            y2 = Saves.apply(torch.zeros(4, requires_grad=True), got_plain, plain)
    assert paging.paged_tensors == 0 and paging.passed_tensors == 2 and unmarked.passed_tensors == 1
    assert pool.pages_in_use() == 0
    (y + y2).sum().backward()
    assert torch.equal(got[0], st.data) and torch.equal(got[1], st.scales) and torch.equal(got_plain[0], plain)


def refused(*tensors, counts=(128, 0, 128, 0), tokens=512, **layer):
    pool = ps.PagePool(device_pages=64, page_bytes=PAGE)
    with pytest.raises(ValueError) as e:
        with ps.paged_saved_tensors(pool):
            with ps.te_layer(torch.tensor(counts, dtype=torch.int32), tokens=tokens, **layer):
                Saves.apply(torch.zeros(4, requires_grad=True), [], *tensors)
    assert pool.pages_in_use() == 0
    return str(e.value)


def test_marked_tensors_that_fit_no_layout_are_refused_by_name():
    st = te_st.make("mxfp8", 512, 128, [128, 0, 128, 0], seed=1)
    odd = torch.randn(512 * 128 + 8).to(torch.bfloat16)
    te_st.mark_grouped_tensor(odd)
    message = refused(odd)
    assert "TE-marked tensor #0 of te_layer" in message and "torch.bfloat16, shape [65544]" in message
    assert "fits no TransformerEngine grouped layout" in message and "tokens = 512" in message
    # Scales of another size than TE's for either format: neither MXFP8 nor NVFP4.
    short = st.scales[:-512].clone()
    te_st.mark_grouped_tensor(st.data.clone(), short)
    message = refused(st.data, short)
    assert "mxfp8: hidden 128 has 2048 scale bytes, not 1536" in message and "nvfp4: hidden 256" in message
    # A marked dtype TE never saves, and a quantized buffer whose partner never comes.
    wide = torch.zeros(512, 4, dtype=torch.float64)
    te_st.mark_grouped_tensor(wide)
    assert "torch.float64 is no dtype of TE's grouped data" in refused(wide)
    assert "its columnwise_scale_inv (marker True) was never saved" in refused(st.data)
    # Tokens that are not the buffers' rows, and a grouped NVFP4 hidden TE's grouped kernels do not take.
    assert "fits no TE layout" in refused(st.data, st.scales, tokens=384)
    nv = te_st.make("nvfp4", 512, 160, [128, 0, 128, 0], seed=1)
    assert "need hidden a multiple of 128, not 160" in refused(*nv.saved()[:2])
    with pytest.raises(ValueError, match="4 counts for 2 groups"):
        ps.te_layer(torch.zeros(4, dtype=torch.int32), tokens=8, groups=2)


def test_the_step_sizer_and_auto_resize_know_te_marked_tensors():
    """run_step pages them; observe() records each layer's counts once (its marks share them); size_pool
    takes te_layer's saved list; auto_resize grows a pool too small for them, bit for bit."""
    case = "nvfp4"
    data = batches(case)
    w_paged, w_eager = weights(case), weights(case)
    saved = []

    def step(w):
        def microbatches(s):
            for x, counts, target in data[:2]:
                with s.paging():
                    y, layers = forward(case, w, x.detach(), counts)
                    loss = (y * target).sum()
                loss.backward()
                saved[:] = saved or [l.saved[0] for l in layers[:1]]
        return microbatches

    pool = ps.PagePool(256, page_bytes=PAGE)
    pool.observe(steps=2)
    for _ in range(2):
        ps.run_step(pool, step(w_paged), lambda: [setattr(p, "grad", None) for p in w_paged])
        ps.run_step(None, step(w_eager), lambda: [setattr(p, "grad", None) for p in w_eager])
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(w_paged, w_eager))
    counts = pool.observed_counts()
    assert counts.shape == (2, 2 * LAYERS, 4)
    assert saved == [("nvfp4/packed/swizzled", ps.Shape(4, 512, 128))]
    sizing = ps.size_pool(saved, counts=counts, layers=LAYERS, microbatches=2, overflow=0.05, page_bytes=PAGE,
                          samples=500)
    assert sizing.device_pages > 2
    pool = ps.PagePool(2, page_bytes=PAGE, reserve_bytes=512 * PAGE)
    pool.auto_resize(saved, window=2, layers=LAYERS, microbatches=2, samples=500)
    how = ps.run_step(pool, step(w_paged), lambda: [setattr(p, "grad", None) for p in w_paged])
    ps.run_step(None, step(w_eager), lambda: [setattr(p, "grad", None) for p in w_eager])
    assert how == "rerun" and pool.device_pages > 2  # it overflowed, reran, grew
    assert ps.run_step(pool, step(w_paged), lambda: [setattr(p, "grad", None) for p in w_paged]) == "paged"
    ps.run_step(None, step(w_eager), lambda: [setattr(p, "grad", None) for p in w_eager])
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(w_paged, w_eager))


def test_the_example_trains_bit_for_bit(monkeypatch, capsys):
    import te_example
    monkeypatch.setattr("sys.argv", ["te_example.py", "--steps", "2", "--hidden", "64", "--ffn", "128", "--rows", "256"])
    te_example.main()  # asserts bit-identical gradients itself
    out = capsys.readouterr().out
    assert out.count("bit-identical") == 2 and " paged " in out


HAVE_TE = importlib.util.find_spec("transformer_engine") is not None


@pytest.mark.skipif(not (HAVE_TE and torch.cuda.is_available() and ps.with_cuda),
                    reason="SKIPPED: TransformerEngine is not importable here (its torch package builds from source "
                           "against CUDA), or no GPU or no CUDA build of pagestash: the real GroupedLinear's test needs all")
def test_real_transformer_engine_grouped_linear():
    """transformer_engine.pytorch.GroupedLinear in a paged context within te_layer: whatever this TE marks
    is paged (what it does not mark passes through), and the gradients equal the unpaged run's bit for bit."""
    import transformer_engine.pytorch as te
    from transformer_engine.pytorch import utils as te_utils

    torch.manual_seed(0)
    groups, hidden, tokens = 4, 256, 512
    layer = te.GroupedLinear(groups, hidden, hidden, bias=False, params_dtype=torch.bfloat16).cuda()
    m_splits = [128, 0, 256, 128]
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)

    def run(pool):
        for p in layer.parameters():
            p.grad = None
        x.grad = None
        paged = ps.paged_saved_tensors(pool) if pool is not None else contextlib.nullcontext()
        with paged as paging:
            with ps.te_layer(torch.tensor(m_splits, dtype=torch.int32, device="cuda"), tokens=tokens):
                loss = (layer(x, m_splits).float() * target).sum()
        loss.backward()
        return [p.grad.clone() for p in layer.parameters()] + [x.grad.clone()], paging

    eager, _ = run(None)
    pool = ps.PagePool(device_pages=256, page_bytes=65536, device="cuda")
    paged, paging = run(pool)
    assert all(torch.equal(a, b) for a, b in zip(eager, paged))
    assert pool.check() is None
    if not hasattr(te_utils, "mark_grouped_tensor"):
        pytest.skip("SKIPPED: this TransformerEngine has no mark_grouped_tensor: its GroupedLinear marks nothing")
