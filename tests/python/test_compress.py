"""The compressed stash from Python (compression=): reloads bit for bit against a torch oracle written
here from docs/layouts.md "Compressed stash", opcheck with a compression, the errors, and a module
trained through the hook with compression="mxfp8" (close gradients) and "lossless" (identical ones)."""

import pytest
import torch

import moe_example as moe
import pagestash as ps

SEED = 4321
LOSSY = [c for c in ps.COMPRESSIONS if c != "lossless"]
#: The recipes that take a compression, from the extension's table (bf16 and fp16, each placement).
COMPRESSIBLE = [r["name"] for r in ps._C.recipe_table() if r["compressible"]]
HIDDEN = 256  # a multiple of every block (32, 128)


# ---- The oracle: the rules of docs/layouts.md "Compressed stash", in torch --------------------------------------

#: compression -> (code dtype, largest finite code, emax (MXFP8) or None (FP8 1x128), block)
FORMATS = {
    "mxfp8": (torch.float8_e4m3fn, 448.0, 8, 32),
    "mxfp8_e5m2": (torch.float8_e5m2, 57344.0, 15, 32),
    "fp8_1x128": (torch.float8_e4m3fn, 448.0, None, 128),
}


def saturating(v: torch.Tensor, dtype, largest: float) -> torch.Tensor:
    """FP8 codes of fp32 `v`, nearest even, saturating: torch's cast rounds to nearest even but
    overflows to NaN or infinity, so clamp first (anything past the largest code rounds to it)."""
    return v.clamp(-largest, largest).to(dtype)


def round_trip(x: torch.Tensor, compression: str) -> torch.Tensor:
    """dequantize(quantize(x)) for rows `x` (bf16 or fp16, the last dimension a multiple of the block)."""
    code_dtype, largest, emax, block = FORMATS[compression]
    v = x.float().reshape(-1, block)  # exact
    amax = v.abs().amax(dim=1, keepdim=True)
    bad = ~torch.isfinite(v).all(dim=1, keepdim=True)
    if emax is not None:  # MXFP8: X = 2^e, e = floor(log2(amax)) - emax in [-127, 127]; amax 0: -127
        _, exponent = torch.frexp(amax.double())  # amax = m 2^exponent, m in [0.5, 1)
        e = (exponent.to(torch.int64) - 1 - emax).clamp(-127, 127)
        e = torch.where(amax == 0, torch.full_like(e, -127), e)
        power = torch.pow(2.0, e.double())
        codes = saturating((v.double() / power).float(), code_dtype, largest)  # v 2^-e exact in fp32 where it counts
        deq = (codes.double() * power).float()  # exact: the codes' bits scaled by a power of two
    else:  # FP8 1x128: scale = 448 / amax in fp32, capped at FLT_MAX, 1 for amax 0; 1 / scale stored
        flt_max = torch.finfo(torch.float32).max
        scale = (torch.tensor(448.0) / amax).clamp(max=flt_max)
        scale = torch.where(amax == 0, torch.ones_like(scale), scale)
        codes = saturating(v * scale, code_dtype, largest)
        deq = codes.float() * (1.0 / scale)
    deq = torch.where(bad, torch.full_like(deq, float("nan")), deq)
    return deq.to(x.dtype).reshape(x.shape)


def test_oracle_on_values_worked_by_hand():
    """The oracle itself, on blocks whose result follows from the rules by hand."""
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    x[0, 0], x[0, 1], x[0, 2] = 1.0, 3.0, 0.01  # MXFP8 E4M3: amax 3, e = 1 - 8 = -7; 0.01 * 128 = 1.28 -> 1.25
    x[1, 0] = float("inf")
    y = round_trip(x, "mxfp8")
    assert y[0, :3].tolist() == [1.0, 3.0, 1.25 / 128]
    assert torch.isnan(y[1, :32]).all() and (y[1, 32:] == 0).all()
    z = round_trip(x, "fp8_1x128")  # scale 448 / 3: 1 -> 149.3, in E4M3 144 -> 144 * 3 / 448 = 0.964 -> 0.96484375
    assert z[0, 0] == 0.96484375 and z[0, 1] == 3.0 and torch.isnan(z[1]).all()


# ---- Data with every kind of block ------------------------------------------------------------------------------

#: The kind of each 32-value run, so that the 128-value blocks of FP8 1x128 are finite (the first two of each three)
#: and not finite (the third: any bits, a NaN, an infinity).
KINDS = [1, 2, 3, 4, 5, 3, 4, 2, 0, 6, 7, 3]


def special_rows(rows: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """rows x HIDDEN values, each 32-value run one kind: any bits (NaN and infinity included), zeros,
    subnormals, values around 2^k over the type's whole range, the largest finite value among others,
    and a single NaN or infinity among normal values."""
    finfo = torch.finfo(dtype)
    runs = rows * HIDDEN // 32
    out = torch.empty(runs, 32, dtype=dtype)
    exponents = torch.arange(int(torch.log2(torch.tensor(finfo.smallest_normal)).item()) - 10,
                             int(torch.log2(torch.tensor(finfo.max)).item()))
    for i in range(runs):
        kind = KINDS[i % len(KINDS)]
        if kind == 0:  # any bits
            out[i] = torch.randint(-(1 << 15), 1 << 15, (32,), generator=gen, dtype=torch.int16).view(dtype)
        elif kind == 1:
            out[i] = 0
        elif kind == 2:  # subnormals (exponent field 0), both signs
            mantissa = (1 << 7) if dtype == torch.bfloat16 else (1 << 10)
            bits = torch.randint(0, mantissa, (32,), generator=gen, dtype=torch.int16)
            sign = torch.randint(0, 2, (32,), generator=gen, dtype=torch.int16) << 15
            out[i] = (bits | sign).view(dtype)
        elif kind in (3, 4):  # around 2^k, k anywhere in the range
            k = exponents[torch.randint(0, len(exponents), (1,), generator=gen)].item()
            out[i] = (torch.randn(32, generator=gen, dtype=torch.float64) * 2.0 ** k).to(dtype)
        elif kind == 5:  # the largest value among others
            k = exponents[torch.randint(0, len(exponents), (1,), generator=gen)].item()
            out[i] = (torch.randn(32, generator=gen, dtype=torch.float64) * 2.0 ** k).to(dtype)
            out[i, torch.randint(0, 32, (1,), generator=gen)] = -finfo.max if i % 24 < 12 else finfo.max
        else:  # one NaN (kind 6) or infinity (kind 7) among normal values
            out[i] = torch.randn(32, generator=gen).to(dtype)
            out[i, torch.randint(0, 32, (1,), generator=gen)] = float("nan") if kind == 6 else -float("inf")
    return out.reshape(rows, HIDDEN)


def shape_for(recipe: str) -> ps.Shape:
    """3 groups of up to 48 tokens (more than a page each, compressed), in whole granules."""
    granule = ps.recipe_info(recipe, ps.Shape(3, 0, HIDDEN))["granule"]
    tokens = (3 if "packed" in recipe else 1) * 48
    return ps.Shape(3, -(-tokens // granule) * granule, HIDDEN)


def counts_for(recipe: str, shape: ps.Shape) -> torch.Tensor:
    align = ps.recipe_info(recipe, shape)["count_alignment"]
    if "packed" in recipe:  # the groups back to back, some rows dead at the end
        per = shape.tokens // shape.groups // align * align
        return torch.tensor([per, per - 11 * align, 0], dtype=torch.int32)
    return torch.tensor([shape.tokens, shape.tokens - 11 * align, 0], dtype=torch.int32)


def live_rows(recipe: str, shape: ps.Shape, counts: torch.Tensor) -> torch.Tensor:
    """A bool per row of the data buffer: whether it is a live row."""
    live = torch.zeros(shape.groups * shape.tokens if "capacity" in recipe else shape.tokens, dtype=torch.bool)
    if "capacity" in recipe:
        for g, n in enumerate(counts.tolist()):
            live[g * shape.tokens:g * shape.tokens + n] = True
    else:
        live[:int(counts.sum())] = True
    return live


NAN_BITS = 0x7FFF  # what the reload writes over a block that was not finite, in BF16 and FP16


@pytest.mark.parametrize("compression", LOSSY)
@pytest.mark.parametrize("recipe", COMPRESSIBLE)
def test_reload_is_the_oracle_round_trip_bit_for_bit(recipe, compression):
    assert {r.split("/")[0] for r in COMPRESSIBLE} == {"bf16", "fp16"}
    dtype = ps.FAMILIES[recipe.split("/")[0]]["data"]
    gen = torch.Generator().manual_seed(SEED)
    shape = shape_for(recipe)
    counts = counts_for(recipe, shape)
    live = live_rows(recipe, shape, counts)
    data = special_rows(len(live), dtype, gen)
    if "capacity" in recipe:
        data = data.view(shape.groups, shape.tokens, HIDDEN)
    pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=False)
    rec = pool.record(recipe, shape, compression=compression)
    assert rec.compression == compression
    rec.stash(data, counts)
    assert rec.status()["state"] == "stashed"
    out = torch.full_like(data, 7.0)
    rec.reload(out, zero_tail=True)
    assert not any(pool.stats()["flags"].values())
    got, want = out.reshape(-1, HIDDEN)[live], round_trip(data.reshape(-1, HIDDEN)[live], compression)
    nan = torch.isnan(want)
    assert nan.any() and (~nan).any()
    assert torch.equal(torch.isnan(got), nan)
    assert (got[nan].view(torch.int16) == NAN_BITS).all()
    differ = got[~nan].view(torch.int16) != want[~nan].view(torch.int16)
    assert not differ.any(), f"{int(differ.sum())} of {differ.numel()} values differ from the oracle"
    assert (out.reshape(-1, HIDDEN)[~live] == 0).all()  # zero_tail
    assert not torch.equal(got[~nan], data.reshape(-1, HIDDEN)[live][~nan])  # lossy indeed


@pytest.mark.parametrize("compression", ["lossless"] + LOSSY)
def test_a_cpu_stash_of_several_mib_on_several_threads_is_the_one_thread_stash(compression):
    """A CPU pool's ops take a thread for each MiB of the stream (up to torch.get_num_threads()): a
    stash of 6 MiB of random bf16 values on 3 threads writes the pages and the reload of one
    thread, byte for byte, and the reload is the oracle's round trip."""
    gen = torch.Generator().manual_seed(SEED + 7)
    shape = ps.Shape(4, 512, 2048)  # 4 experts, capacity 512, hidden 2048: 8 MiB, 6 of them live
    counts = torch.tensor([512, 384, 256, 384], dtype=torch.int32)
    data = torch.randn(shape.groups, shape.tokens, shape.hidden, generator=gen).to(torch.bfloat16)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            pool = ps.PagePool(device_pages=128, strict=True)
            pool.state[1].zero_()  # the pages no stash writes: equal too
            rec = pool.record("bf16/capacity", shape, compression=compression)
            rec.stash(data, counts)
            pages = pool.state[1].clone()
            out = torch.full_like(data, 7.0)
            rec.reload(out, zero_tail=True)
            runs.append((pages, out))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1].view(torch.int16), runs[1][1].view(torch.int16))
    live = (torch.arange(shape.tokens)[None, :] < counts[:, None])
    got = runs[1][1][live]
    want = data[live] if compression == "lossless" else round_trip(data[live], compression)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert (runs[1][1][~live] == 0).all()


@pytest.mark.parametrize("compression", LOSSY)
def test_compressed_record_pages_about_half(compression):
    """The record's stream (and so its pages) is the compressed one: about 0.52 of the lossless stream."""
    shape = ps.Shape(4, 512, 1024)
    data = torch.randn(4, 512, 1024).to(torch.bfloat16)
    counts = torch.tensor([512, 300, 100, 0], dtype=torch.int32)
    pool = ps.PagePool(device_pages=1024, page_bytes=4096, strict=False)
    streams = {}
    for c in ("lossless", compression):
        rec = pool.record("bf16/capacity", shape, compression=c)
        rec.stash(data, counts)
        streams[c] = rec.status()
        rec.discard()
    ratio = streams[compression]["stream_bytes"] / streams["lossless"]["stream_bytes"]
    assert 0.51 < ratio < 0.53, ratio
    assert streams[compression]["pages"] < 0.53 * streams["lossless"]["pages"]


# ---- opcheck ----------------------------------------------------------------------------------------------------

def opcheck_args(op, compression):
    pool = ps.PagePool(device_pages=16, page_bytes=1024, strict=False)
    recipe, shape = "bf16/capacity", ps.Shape(2, 32, 128)
    data = torch.randn(2, 32, 128).to(torch.bfloat16)
    counts = torch.tensor([20, 3], dtype=torch.int32)
    rec = pool.record(recipe, shape, compression=compression)
    if op != "stash":
        rec.stash(data, counts)
    base = (*pool.state, rec.memory, recipe, list(shape))
    if op == "stash":
        return base + (data, counts)
    if op == "reload":
        return base + (torch.zeros_like(data),)
    return base


@pytest.mark.parametrize("compression", LOSSY)
@pytest.mark.parametrize("op", ["stash", "reload", "discard"])
def test_opcheck_with_compression(op, compression):
    torch.library.opcheck(getattr(torch.ops.pagestash, op).default, opcheck_args(op, compression),
                          {"compression": compression})


# ---- Errors, before anything runs -------------------------------------------------------------------------------

def test_compressions_come_from_the_extension():
    assert ps.COMPRESSIONS == ("lossless", "mxfp8", "mxfp8_e5m2", "fp8_1x128")
    assert COMPRESSIBLE == ["bf16/packed", "bf16/capacity", "fp16/packed", "fp16/capacity"]


def test_unknown_compression_names_the_known_ones():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    known = r"\(known: lossless, mxfp8, mxfp8_e5m2, fp8_1x128\)"
    with pytest.raises(ValueError, match="unknown compression 'mxfp4' " + known):
        pool.record("bf16/capacity", ps.Shape(2, 32, 128), compression="mxfp4")
    with pytest.raises(ValueError, match="unknown compression 'fp8' " + known):
        ps.paged_saved_tensors(pool, compression="fp8")
    rec = pool.record("bf16/capacity", ps.Shape(2, 32, 128))
    with pytest.raises(ValueError, match="unknown compression 'MXFP8' " + known):  # the op's own check
        torch.ops.pagestash.discard(*rec._args(), compression="MXFP8")


@pytest.mark.parametrize("recipe", ["fp32/capacity", "mxfp8/capacity/swizzled", "nvfp4/packed/compact",
                                    "mxfp8_e5m2/packed_padded/compact", "plain"])
def test_a_recipe_that_is_not_bf16_or_fp16_is_refused(recipe):
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    shape = ps.Shape(1, 256, 128)
    with pytest.raises(ValueError, match=f"compression 'mxfp8' needs a bf16 or fp16 recipe, not '{recipe}'"):
        pool.record(recipe, shape, compression="mxfp8")
    assert pool.stats()["device_pages_free"] == pool.device_pages


@pytest.mark.parametrize("compression, block", [("mxfp8", 32), ("mxfp8_e5m2", 32), ("fp8_1x128", 128)])
def test_hidden_not_a_multiple_of_the_block_is_refused(compression, block):
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    hidden = block + 8  # a multiple of bf16's 8
    with pytest.raises(ValueError, match=rf"shape\[2\] \(hidden\) = {hidden} must be a multiple of {block} \(the "
                                         rf"block of compression '{compression}'\): pad hidden to {2 * block}"):
        pool.record("bf16/capacity", ps.Shape(2, 32, hidden), compression=compression)
    pool.record("bf16/capacity", ps.Shape(2, 32, hidden))  # lossless takes it


@pytest.mark.parametrize("compression, block", [("mxfp8", 32), ("fp8_1x128", 128)])
def test_the_op_and_the_sizer_refuse_a_partial_block_in_one_wording(compression, block):
    hidden = block + 8
    said = f"= {hidden} must be a multiple of {block} (the block of compression '{compression}'): pad hidden to {2 * block}"
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    with pytest.raises(ValueError) as op:
        pool.record("bf16/capacity", ps.Shape(2, 32, hidden), compression=compression)
    with pytest.raises(ValueError) as sizer:
        ps.size_pool([("bf16/capacity", ps.Shape(2, 32, hidden), compression)], tokens=32, samples=10)
    assert said in str(op.value) and said in str(sizer.value), (str(op.value), str(sizer.value))


def test_mark_refuses_what_its_compression_cannot_take():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    counts = torch.tensor([1, 2], dtype=torch.int32)
    with ps.paged_saved_tensors(pool, compression="mxfp8", warn_unpaged=False) as paging:  # marks, no layer
        with pytest.raises(ValueError, match="compression 'mxfp8' needs a bf16 or fp16 recipe, not 'fp32/capacity'"):
            paging.mark(torch.zeros(2, 32, 64), counts)
        with pytest.raises(ValueError, match="must be a multiple of 128"):
            paging.mark(torch.zeros(2, 32, 64, dtype=torch.bfloat16), counts, compression="fp8_1x128")
        with pytest.raises(ValueError, match="unknown compression 'e4m3'"):
            paging.mark(torch.zeros(2, 32, 64, dtype=torch.bfloat16), counts, compression="e4m3")
        paging.mark(torch.zeros(2, 32, 64), counts, compression="lossless")  # per tensor, over the context's
        paging.mark(torch.zeros(2, 32, 64, dtype=torch.bfloat16), counts)
    assert pool.stats()["device_pages_free"] == pool.device_pages


# ---- A module trained through the hook --------------------------------------------------------------------------

E, H, F, TOKENS = 8, 128, 256, 192
CAPACITY = 2 * TOKENS // E
#: The largest relative error (Frobenius) of a weight gradient with compression="mxfp8" against the gradient without
#: paging; measured 0.029 to 0.031 over these steps (docs/python.md says so).
MXFP8_GRAD_ERROR = 0.04


def grads(model, batch, compression):
    """The weight gradients of one step of `model` on `batch`, paged with `compression` (None: not paged), and the
    context's pages held."""
    x, target, expert = batch
    model.zero_grad()
    pool = ps.PagePool(device_pages=512, page_bytes=4096, strict=True)
    if compression is None:
        y = model(x, expert, CAPACITY)
    else:
        with ps.paged_saved_tensors(pool, compression=compression) as paging:
            y = model(x, expert, CAPACITY, paging)
        assert paging.paged_tensors > 0
    pages = pool.pages_in_use()
    torch.nn.functional.mse_loss(y.float(), target.float()).backward()
    assert pool.pages_in_use() == 0 and not any(pool.stats()["flags"].values())
    return [p.grad.clone() for p in model.parameters()], pages


def relative_error(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_module_gradients_mxfp8_close_lossless_identical():
    model = moe.GroupedMLP(E, H, F, seed=7)
    batches = moe.dirichlet_batches(3, TOKENS, E, H, torch.bfloat16, "cpu", seed=3)
    worst = 0.0
    for batch in batches:
        eager, _ = grads(model, batch, None)
        lossless, lossless_pages = grads(model, batch, "lossless")
        mxfp8, mxfp8_pages = grads(model, batch, "mxfp8")
        for a, b in zip(eager, lossless):
            assert torch.equal(a, b)  # bit for bit
        for a, b in zip(eager, mxfp8):
            assert not torch.equal(a, b)  # lossy: the gradients change...
            error = relative_error(b, a)
            worst = max(worst, error)
            assert error < MXFP8_GRAD_ERROR  # ...a little
        assert mxfp8_pages < 0.6 * lossless_pages
    print(f"\nworst relative error of a weight gradient, mxfp8: {worst:.4f}")


# ---- Sizing ------------------------------------------------------------------------------------------------------

def test_size_pool_sizes_the_compressed_stream():
    """A layer whose tensors are paged compressed needs about 0.52 of the lossless layer's pages; every count
    vector the sizer measures is the stash's (the same measured counts for both)."""
    shape = ps.Shape(8, 256, 1024)
    counts = torch.tensor([[256, 200, 100, 50, 20, 10, 5, 0], [128, 128, 128, 64, 64, 32, 16, 8]])
    kw = dict(counts=counts, layers=2, microbatches=2, page_bytes=16384, samples=200, seed=5)
    lossless = ps.size_pool([("bf16/capacity", shape)], **kw)
    compressed = ps.size_pool([("bf16/capacity", shape, "mxfp8")], **kw)
    assert lossless.full_bytes == compressed.full_bytes  # what autograd would hold: the bf16 buffers
    assert 0.50 < compressed.device_pages / lossless.device_pages < 0.55, (compressed.device_pages,
                                                                           lossless.device_pages)
    with pytest.raises(ValueError, match="unknown compression 'mxfp9'"):
        ps.size_pool([("bf16/capacity", shape, "mxfp9")], **kw)
    with pytest.raises(ValueError, match="compression 'fp8_1x128' needs a bf16 or fp16 recipe, not 'fp32/capacity'"):
        ps.size_pool([("fp32/capacity", shape, "fp8_1x128")], **kw)
    with pytest.raises(ValueError, match="hidden = 1000 must be a multiple of 128"):
        ps.size_pool([("bf16/capacity", ps.Shape(8, 256, 1000), "fp8_1x128")], **kw)


def test_the_training_study_models_what_the_stash_reloads():
    """docs/compression.md's figures come from scripts/compression_study.py's fake_compress: bit for bit the oracle
    that every reload above matches, so the study measured what the stash does (bf16, its dtype)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "compression_study.py"
    spec = importlib.util.spec_from_file_location("compression_study", path)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    x = special_rows(48, torch.bfloat16, torch.Generator().manual_seed(SEED))
    for compression in LOSSY:
        assert torch.equal(study.fake_compress(x, compression).view(torch.int16),
                           round_trip(x, compression).view(torch.int16)), compression
