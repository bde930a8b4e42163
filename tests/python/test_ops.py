"""torch.ops.pagestash on CPU tensors (the host executor): round trips for every recipe
against independent oracles, pool invariants, errors, and torch.library.opcheck."""

import pytest
import torch

import pagestash as ps

SEED = 1234


def make_pool(pages=64, page_bytes=4096, host_pages=0, strict=False):
    """Not strict: most tests read the flags themselves."""
    return ps.PagePool(device_pages=pages, page_bytes=page_bytes, host_pages=host_pages, strict=strict)


def random_bytes(n, gen):
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)


def buffers_for(recipe, shape, gen):
    """Random non-zero buffers of the recipe's sizes (raw bytes), and counts that fit."""
    info = ps.recipe_info(recipe, shape)
    data = random_bytes(info["data_bytes"], gen)
    family = ps.FAMILIES[recipe.split("/")[0]]
    if family["scales"] is None:  # rows of tokens, as raw bytes (plain: hidden bytes a row)
        row = 1 if family["data"] is None else torch.empty(0, dtype=family["data"]).element_size()
        data = data.view(-1, shape.hidden * row)
    scales = random_bytes(info["scales_bytes"], gen) if info["scales_bytes"] else None
    amax = torch.rand(shape.groups, generator=gen) + 0.5 if info["amax_bytes"] else None
    align = info["count_alignment"]
    if info["packed"]:
        cuts = torch.randint(0, shape.tokens // align + 1, (shape.groups - 1,), generator=gen).sort().values * align
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([shape.tokens // align * align])])
        counts = (edges[1:] - edges[:-1]).to(torch.int32)
        counts[-1] = counts[-1] // 2 // align * align  # not every row live
    else:
        counts = (torch.randint(0, shape.tokens // align + 1, (shape.groups,), generator=gen) * align).to(torch.int32)
    return data, scales, amax, counts


SHAPES = {"plain": ps.Shape(1, 256, 96)}


def shape_of(recipe):
    """A small shape the recipe accepts: 2 granules a group (capacity) or 4 in all (packed)."""
    if recipe in SHAPES:
        return SHAPES[recipe]
    granule = ps.recipe_info(recipe, ps.Shape(3, 0, 64))["granule"]
    return ps.Shape(3, (4 if "packed" in recipe else 2) * granule, 64)


@pytest.mark.parametrize("recipe", ps.recipes())
def test_round_trip_every_recipe(recipe):
    """Two stashes of the same source reloaded into two destinations poisoned differently:
    every byte is the source's in both (live) or each destination's poison (dead); the live
    bytes are as many as the record says; with zero_tail the dead bytes are 0."""
    gen = torch.Generator().manual_seed(SEED)
    shape = shape_of(recipe)
    pool = make_pool()
    data, scales, amax, counts = buffers_for(recipe, shape, gen)
    results = []
    for poison in (0x5A, 0xA5):
        rec = pool.record(recipe, shape)
        rec.stash(data, counts, scales, amax)
        status = rec.status()
        assert status["state"] == "stashed", status
        out = [torch.full_like(data, poison), None if scales is None else torch.full_like(scales, poison),
               None if amax is None else torch.full_like(amax, -1.0)]
        rec.reload(*out)
        assert rec.status()["state"] == "reloaded"
        results.append((out, status))
        stats = pool.stats()
        assert stats["device_pages_free"] == pool.device_pages and stats["live_bytes"] == 0
        assert not any(stats["flags"].values())
    live = 0
    dead_of = {}
    pairs = [("data", data, results[0][0][0], results[1][0][0])]
    if scales is not None:
        pairs.append(("scales", scales, results[0][0][1], results[1][0][1]))
    for role, src, a, b in pairs:
        dead = (a == 0x5A) & (b == 0xA5)
        assert bool((dead | ((a == src) & (b == src))).all()), f"a {role} byte is neither the source's nor the poison"
        live += int((~dead).sum())
        dead_of[role] = dead
    assert 0 < live == results[0][1]["live_bytes"]
    if amax is not None:
        assert torch.equal(results[0][0][2], amax)  # kept in the record, restored bit for bit
    # zero_tail writes the live bytes and clears the dead ones.
    rec = pool.record(recipe, shape)
    rec.stash(data, counts, scales, amax)
    out = [torch.full_like(data, 0x77), None if scales is None else torch.full_like(scales, 0x77),
           None if amax is None else torch.zeros_like(amax)]
    rec.reload(*out, zero_tail=True)
    assert torch.equal(out[0], torch.where(dead_of["data"], torch.zeros_like(data), data))
    if scales is not None:
        assert torch.equal(out[1], torch.where(dead_of["scales"], torch.zeros_like(scales), scales))


# What the poison (every byte 0xFF) reads as: NaN in every floating-point format of a
# recipe's buffers; NVFP4's E2M1 data has no NaN, its E4M3 scales and FP32 amax do.
POISON_NAN = {
    "bf16": {"data": torch.bfloat16}, "fp16": {"data": torch.float16}, "fp32": {"data": torch.float32},
    "mxfp8": {"data": torch.float8_e4m3fn, "scales": torch.float8_e8m0fnu},
    "mxfp8_e5m2": {"data": torch.float8_e5m2, "scales": torch.float8_e8m0fnu},
    "nvfp4": {"scales": torch.float8_e4m3fn, "amax": torch.float32},
}
RELOAD_FAILURES = ("overflowed", "failed", "not_stashed", "stale")


def failed_reload(device, recipe, failure, poison):
    """A reload of a `recipe` record that does not restore (`failure`: its stash overflowed,
    its stash's counts failed, it was never stashed, or stashed before a reset) into
    destinations of random bytes, on `device`. Returns the destinations before and after."""
    gen = torch.Generator().manual_seed(SEED)
    shape = shape_of(recipe)
    data, scales, amax, counts = buffers_for(recipe, shape, gen)
    info = ps.recipe_info(recipe, shape)
    if failure == "overflowed":  # every count full: more than one page of 256 bytes
        full = shape.tokens // info["count_alignment"] * info["count_alignment"]
        counts = torch.tensor([full] + [0 if info["packed"] else full] * (shape.groups - 1), dtype=torch.int32)
    if failure == "failed":  # one count beyond what the view holds
        counts = counts.clone()
        counts[0] = shape.tokens + info["count_alignment"]
    pool = ps.PagePool(device_pages=1 if failure == "overflowed" else 1024, page_bytes=256, device=device, strict=False)
    rec = pool.record(recipe, shape)
    to = (lambda t: None if t is None else t.to(device))
    if failure != "not_stashed":
        rec.stash(to(data), to(counts), to(scales), to(amax))
        assert rec.status()["state"] == ("stashed" if failure == "stale" else failure)
    if failure == "stale":
        pool.reset()
    before = [t if t is None else random_bytes(t.numel() * t.element_size(), gen).view(t.dtype).view(t.shape)
              for t in (data, scales, amax)]
    after = [to(t if t is None else t.clone()) for t in before]
    rec.reload(*after, zero_tail=True, poison=poison)
    assert rec.status()["state"] != "reloaded"
    return before, [t if t is None else t.cpu() for t in after]


def check_poisoned(recipe, before, after):
    """Every byte of every buffer 0xFF, and NaN in each float format the recipe stores."""
    for role, b, a in zip(("data", "scales", "amax"), before, after):
        assert (b is None) == (a is None)
        if a is None:
            continue
        assert bool((a.view(torch.uint8) == 0xFF).all()), f"{recipe}: a {role} byte is not the poison"
        dtype = POISON_NAN.get(recipe.split("/")[0], {}).get(role)
        if dtype is not None:
            assert bool(a.view(torch.uint8).view(dtype).float().isnan().all()), f"{recipe}: {role} is not NaN"


@pytest.mark.parametrize("failure", RELOAD_FAILURES)
@pytest.mark.parametrize("recipe", ps.recipes())
def test_a_reload_that_does_not_restore_poisons_its_destination(recipe, failure):
    """NaN for floats, 0xFF bytes for quantized and raw data; poison=False leaves the
    destination as it was, for those who check the flags."""
    before, after = failed_reload("cpu", recipe, failure, poison=True)
    check_poisoned(recipe, before, after)
    before, after = failed_reload("cpu", recipe, failure, poison=False)
    for b, a in zip(before, after):
        assert (b is None and a is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_the_raw_op_poisons_unless_told_not_to():
    gen = torch.Generator().manual_seed(SEED)
    pool = make_pool()
    rec = pool.record("bf16/capacity", ps.Shape(2, 32, 64))
    out = torch.randn(2, 32, 64, generator=gen).to(torch.bfloat16)
    kept = out.clone()
    torch.ops.pagestash.reload(*pool.state, rec.memory, rec.recipe, [2, 32, 64], out, poison=False)  # never stashed
    assert torch.equal(out, kept)
    torch.ops.pagestash.reload(*pool.state, rec.memory, rec.recipe, [2, 32, 64], out)
    assert bool(out.isnan().all())
    assert pool.flag_dict()["not_stashed"] == 1


def test_pool_and_record_as_docs_python_md_shows_them():
    gen = torch.Generator().manual_seed(SEED)
    experts, capacity, hidden, device = 4, 32, 64, "cpu"
    x = torch.randn(experts, capacity, hidden, generator=gen).to(torch.bfloat16)
    counts = torch.tensor([32, 0, 5, 17], dtype=torch.int32)
    # [pool_and_record]
    pool = ps.PagePool(device_pages=64, page_bytes=4096, device=device)  # memory from PyTorch's allocator
    shape = ps.Shape(experts, capacity, hidden)  # the tensor's own order: [experts, capacity, hidden]
    rec = pool.record("bf16/capacity", shape)
    rec.stash(x, counts)  # x: [experts, capacity, hidden]; counts: int32, on x's device
    out = torch.empty_like(x)
    rec.reload(out, zero_tail=True)  # the live rows back, the rest zeroed; the pages returned
    assert pool.check() is None  # raises PagingError when the flags say the step failed
    # [pool_and_record]
    mask = (torch.arange(capacity)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(out, torch.where(mask, x, torch.zeros_like(x)))


def test_bf16_capacity_matches_the_rows_the_counts_say():
    """The direct oracle: the first counts[g] rows of each expert, the rest zero."""
    gen = torch.Generator().manual_seed(SEED)
    E, C, H = 5, 48, 80
    x = torch.randn(E, C, H, generator=gen).to(torch.bfloat16)
    counts = torch.tensor([0, 48, 17, 1, 30], dtype=torch.int32)
    pool = make_pool(page_bytes=1024)
    rec = pool.record("bf16/capacity", ps.Shape(E, C, H))
    rec.stash(x, counts)
    x_copy = x.clone()
    x.fill_(3.0)  # the buffer may be reused once stashed
    out = torch.full_like(x, float("nan"))
    rec.reload(out, zero_tail=True)
    mask = (torch.arange(C)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(out, torch.where(mask, x_copy, torch.zeros_like(x_copy)))
    assert rec.status()["live_bytes"] == int(counts.sum()) * H * 2


def test_pool_invariants_overflow_and_reset():
    gen = torch.Generator().manual_seed(SEED)
    E, C, H = 4, 64, 128
    pool = make_pool(pages=6, page_bytes=4096)
    x = torch.randn(E, C, H, generator=gen).to(torch.float16)
    full = torch.full((E,), C, dtype=torch.int32)  # 64 KiB live: 16 pages, more than the pool
    rec = pool.record("fp16/capacity", ps.Shape(E, C, H))
    rec.stash(x, full)
    assert rec.status()["state"] == "overflowed" and rec.status()["error"] == "overflow"  # the flag's name
    assert pool.flag_dict()["overflow"] == 1 and pool.decide() == "rerun_without_paging"
    report = ps.decode_report(pool.report())
    assert report["overflows"] == 1 and report["decision"] == "rerun_without_paging"
    assert report["device_pages_free"] == 6  # nothing taken
    pool.reset()
    assert pool.decide() == "keep" and pool.stats()["generation"] == 1
    small = torch.tensor([1, 2, 0, 3], dtype=torch.int32)
    rec2 = pool.record("fp16/capacity", ps.Shape(E, C, H))
    rec2.stash(x, small)
    assert rec2.status()["state"] == "stashed"
    rec2.discard()
    assert pool.stats()["device_pages_free"] == 6
    rec2.reload(torch.empty_like(x))  # nothing to reload: misuse, reported in the flags
    assert pool.flag_dict()["not_stashed"] == 1 and pool.decide() == "report_error"
    assert rec2.status()["error"] == "not_stashed"


def test_end_step_balances_a_clean_step_and_flags_a_leaked_record():
    gen = torch.Generator().manual_seed(SEED)
    E, C, H = 4, 64, 128
    pool = make_pool(pages=32, page_bytes=4096)
    x = torch.randn(E, C, H, generator=gen).to(torch.float16)
    counts = torch.tensor([9, 0, 30, 5], dtype=torch.int32)
    a, b = (pool.record("fp16/capacity", ps.Shape(E, C, H)) for _ in range(2))
    a.stash(x, counts)
    b.stash(x, counts)
    a.reload(torch.empty_like(x))
    b.discard()
    pool.end_step()
    assert pool.stats()["pages_held_at_step_end"] == 0 and pool.decide() == "keep"

    a.stash(x, counts)
    b.stash(x, counts)
    a.reload(torch.empty_like(x))  # b is forgotten
    pool.end_step()
    held = b.status()["pages"]
    report = ps.decode_report(pool.report())
    assert held > 0 and report["pages_held_at_step_end"] == held
    assert report["flags"]["unbalanced"] == 1 and report["flags"]["error"] == 1
    assert pool.decide() == "report_error"
    with pytest.raises(ps.PagingError, match="unbalanced: at the step's end"):
        pool.check()
    with pytest.raises(ValueError, match="cuda_streams are for a CUDA pool"):
        pool.end_step(cuda_streams=[object()])


def test_flag_names_and_meanings_are_the_librarys_one_table():
    assert ps.FLAG_NAMES[:3] == ("overflow", "error", "host_spill") and len(set(ps.FLAG_NAMES)) == 11
    assert ps.FLAG_CATEGORIES["record_mismatch"] == "misuse"
    assert tuple(ps.FLAG_MEANINGS) == ps.FLAG_NAMES and all(len(m) > 10 for m in ps.FLAG_MEANINGS.values())
    assert "no room" in ps.FLAG_MEANINGS["overflow"]
    err = ps.PagingError(["stale"], "report_error")
    assert ps.FLAG_MEANINGS["stale"] in str(err)


def test_host_spill_pages():
    gen = torch.Generator().manual_seed(SEED)
    E, C, H = 2, 64, 256
    pool = make_pool(pages=2, page_bytes=4096, host_pages=16)
    x = torch.randn(E, C, H, generator=gen).to(torch.bfloat16)
    counts = torch.tensor([64, 40], dtype=torch.int32)
    rec = pool.record("bf16/capacity", ps.Shape(E, C, H))
    rec.stash(x, counts)
    status = rec.status()
    assert status["state"] == "stashed" and status["host_pages"] > 0
    out = torch.zeros_like(x)
    rec.reload(out, zero_tail=True)
    mask = (torch.arange(C)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(out, torch.where(mask, x, torch.zeros_like(x)))
    assert pool.flag_dict()["host_spill"] == 1 and pool.decide() == "keep"


class TestErrors:
    """Bad tensors are refused on the host, before anything runs, with a ValueError that
    says what is wrong; the pool is left as it was."""

    def setup_method(self):
        self.pool = make_pool()
        self.shape = ps.Shape(2, 32, 64)
        self.rec = self.pool.record("bf16/capacity", self.shape)
        self.x = torch.zeros(2, 32, 64, dtype=torch.bfloat16)
        self.counts = torch.tensor([3, 4], dtype=torch.int32)

    def refused(self, match, **kw):
        args = dict(data=self.x, counts=self.counts)
        args.update(kw)
        with pytest.raises(ValueError, match=match):
            self.rec.stash(**args)
        assert self.rec.status()["state"] == "empty"
        assert not any(self.pool.flag_dict().values())

    def test_dtype(self):
        self.refused(r"data of recipe 'bf16/capacity' must be torch.bfloat16 \(or torch.uint8 bytes\), not torch.float32",
                     data=self.x.float()[..., :32].contiguous())

    def test_size(self):
        self.refused("data has 4096 bytes; recipe 'bf16/capacity' of this shape needs 8192", data=self.x[:, :16].contiguous())

    def test_rows(self):
        # The right number of bytes, but not rows of `hidden`: refused, not paged as rows.
        self.refused("last dimension must be one token's row of 128 bytes", data=self.x.reshape(2, 64, 32))

    def test_contiguity(self):
        self.refused("must be contiguous", data=self.x.transpose(1, 2))

    def test_alignment(self):
        raw = torch.zeros(self.x.numel() + 1, dtype=torch.bfloat16)
        self.refused(r"data must be 16-byte aligned .*: pass data.clone\(\)", data=raw[1:].view(2, 32, 64))

    def test_counts(self):
        self.refused("counts must be torch.int32, not torch.int64", counts=self.counts.long())
        self.refused("counts must be 2 contiguous torch.int32", counts=torch.zeros(3, dtype=torch.int32))

    def test_unknown_recipe_and_bad_shape(self):
        with pytest.raises(ValueError, match="unknown recipe 'bf8'"):
            self.pool.record("bf8", self.shape)
        with pytest.raises(ValueError, match=r"shape\[1\] \(tokens\) = 100 must be a multiple of 128"):
            self.pool.record("nvfp4/capacity/swizzled", ps.Shape(2, 100, 64))
        with pytest.raises(ValueError, match="no recipe"):
            ps.recipe("nvfp4", placement="padded")

    def test_missing_scales(self):
        shape = ps.Shape(2, 128, 64)
        rec = self.pool.record("mxfp8/capacity/swizzled", shape)
        info = ps.recipe_info("mxfp8/capacity/swizzled", shape)
        with pytest.raises(ValueError, match="needs scales"):
            rec.stash(torch.zeros(info["data_bytes"], dtype=torch.uint8), self.counts)

    def test_record_of_another_shape(self):
        other = self.pool.record("bf16/capacity", ps.Shape(2, 1024, 64))
        other.shape = self.shape  # its memory is for the larger shape: a stash writes only into memory of its size
        with pytest.raises(ValueError, match="the record has"):
            other.stash(self.x, self.counts)
        with pytest.raises(ValueError, match="fewer than a record's header"):
            ps.ops.discard(*self.pool.state, other.memory[:64], other.recipe, list(self.shape))

    def test_bad_counts_are_reported_by_the_op(self):
        # A count beyond the capacity is only visible where the counts are (the device):
        # the stash copies nothing and raises the error flag.
        self.rec.stash(self.x, torch.tensor([3, 33], dtype=torch.int32))
        status = self.rec.status()
        assert status["state"] == "failed" and status["first_bad_group"] == 1
        assert self.pool.flag_dict()["bad_counts"] == 1


def opcheck_args(op):
    gen = torch.Generator().manual_seed(SEED)
    pool = make_pool(pages=16, page_bytes=1024)
    recipe = "nvfp4/capacity/swizzled"
    shape = ps.Shape(2, 128, 64)
    data, scales, amax, _ = buffers_for(recipe, shape, gen)
    counts = torch.tensor([40, 7], dtype=torch.int32)
    rec = pool.record(recipe, shape)
    if op != "stash":
        rec.stash(data, counts, scales, amax)
    base = (*pool.state, rec.memory, recipe, list(shape))
    if op == "stash":
        return base + (data, counts, scales, amax)
    if op == "reload":
        return base + (torch.full_like(data, 0x5A), torch.full_like(scales, 0x5A), torch.zeros_like(amax), True)
    if op == "discard":
        return base
    if op in ("reset", "end_step"):
        return pool.state
    return pool.state + (torch.zeros(pool.report().numel(), dtype=torch.uint8),)


@pytest.mark.parametrize("op", ["stash", "reload", "discard", "reset", "end_step", "report"])
def test_opcheck(op):
    torch.library.opcheck(getattr(torch.ops.pagestash, op).default, opcheck_args(op))


def test_ops_trace_under_torch_compile():
    """The fake implementations let torch.compile trace a function that stashes and reloads."""
    gen = torch.Generator().manual_seed(SEED)
    pool = make_pool()
    shape = ps.Shape(2, 32, 64)
    rec = pool.record("bf16/capacity", shape)
    x = torch.randn(2, 32, 64, generator=gen).to(torch.bfloat16)
    counts = torch.tensor([32, 5], dtype=torch.int32)

    def round_trip(x, out):
        torch.ops.pagestash.stash(*pool.state, rec.memory, rec.recipe, [2, 32, 64], x, counts)
        torch.ops.pagestash.reload(*pool.state, rec.memory, rec.recipe, [2, 32, 64], out, zero_tail=True)
        return out * 2

    out = torch.full_like(x, 9.0)
    got = torch.compile(round_trip, backend="aot_eager", fullgraph=True)(x, out)
    mask = (torch.arange(32)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(got, torch.where(mask, x, torch.zeros_like(x)) * 2)
    assert pool.stats()["device_pages_free"] == pool.device_pages


def test_another_pools_record_is_refused_and_both_pools_stay_whole():
    """A record knows its pool (an id in its header): the raw ops given another pool's state
    and this record raise ValueError on the host, for a pool of the same size and a smaller
    one, and neither pool is touched; the record still reloads in its own pool."""
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 64, 128, generator=gen).to(torch.bfloat16)
    counts = torch.tensor([64, 40], dtype=torch.int32)
    mine = make_pool(pages=64)
    rec = mine.record("bf16/capacity", ps.Shape(2, 64, 128))
    rec.stash(x, counts)
    held = mine.stats()
    for other in (make_pool(pages=64), make_pool(pages=4)):
        before = other.stats()
        args = (rec.memory, rec.recipe, list(rec.shape))
        with pytest.raises(ValueError, match="made for another pool"):
            ps.ops.reload(*other.state, *args, torch.empty_like(x))
        with pytest.raises(ValueError, match="made for another pool"):
            ps.ops.discard(*other.state, *args)
        with pytest.raises(ValueError, match="made for another pool"):
            ps.ops.stash(*other.state, *args, x, counts)
        assert other.stats() == before
    assert mine.stats() == held
    out = torch.zeros_like(x)
    rec.reload(out, zero_tail=True)
    mask = (torch.arange(64)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(out, torch.where(mask, x, torch.zeros_like(x)))


class TestInference:
    """Recipe and shape follow from the tensor where that is unambiguous; where not, a
    ValueError says what to pass."""

    def test_unquantized(self):
        counts = torch.zeros(4, dtype=torch.int32)
        for dtype, family in [(torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32")]:
            if f"{family}/capacity" not in ps.recipes():
                continue
            assert ps.infer(torch.empty(4, 32, 64, dtype=dtype), counts) == (f"{family}/capacity", ps.Shape(4, 32, 64))
            assert ps.infer(torch.empty(96, 64, dtype=dtype), counts) == (f"{family}/packed", ps.Shape(4, 96, 64))

    def test_quantized(self):
        counts = torch.zeros(2, dtype=torch.int32)
        assert ps.infer(torch.empty(2, 128, 64, dtype=torch.float8_e4m3fn), counts) == (
            "mxfp8/capacity/swizzled", ps.Shape(2, 128, 64))
        assert ps.infer(torch.empty(256, 64, dtype=torch.float8_e5m2), counts, scales="compact") == (
            "mxfp8_e5m2/packed/compact", ps.Shape(2, 256, 64))
        # NVFP4 columnwise data is transposed, two values a byte: [groups, hidden, capacity / 2].
        assert ps.infer(torch.empty(2, 64, 64, dtype=torch.float4_e2m1fn_x2), counts) == (
            "nvfp4/capacity/swizzled", ps.Shape(2, 128, 64))

    def test_what_cannot_be_inferred(self):
        counts = torch.zeros(2, dtype=torch.int32)
        with pytest.raises(ValueError, match=r"no recipe is inferred from torch.uint8 data: pass recipe="):
            ps.infer(torch.empty(2, 32, 64, dtype=torch.uint8), counts)
        with pytest.raises(ValueError, match=r"cannot infer the placement of bf16 data of shape \[2, 2, 32, 64\]"):
            ps.infer(torch.empty(2, 2, 32, 64, dtype=torch.bfloat16), counts)
        with pytest.raises(ValueError, match="NVFP4's groups are transposed one by one: pass shape="):
            ps.infer(torch.empty(64, 64, dtype=torch.float4_e2m1fn_x2), counts)
        with pytest.raises(ValueError, match="pass counts or shape="):
            ps.infer(torch.empty(64, 64, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match=r"needs recipe= and shape=, or like="):
            make_pool().record("bf16/capacity")
        with pytest.raises(ValueError, match=r"shape must be a pagestash.Shape\(groups, tokens, hidden\)"):
            make_pool().record("bf16/capacity", (2, 32, 64))

    def test_raw_op_shape(self):
        pool = make_pool()
        rec = pool.record("bf16/capacity", ps.Shape(2, 32, 64))
        with pytest.raises(ValueError, match=r"shape must be \[groups, tokens, hidden\]"):
            ps.ops.discard(*pool.state, rec.memory, rec.recipe, [32, 64])


def test_mxfp8_e5m2_and_float8_dtypes():
    """MXFP8 E5M2 in torch's own dtypes (float8_e5m2 data, float8_e8m0fnu scales) round-trips
    byte for byte; E4M3 data under an E5M2 recipe is refused naming what it expects."""
    gen = torch.Generator().manual_seed(SEED)
    recipe, shape = "mxfp8_e5m2/capacity/compact", ps.Shape(2, 128, 64)
    info = ps.recipe_info(recipe, shape)
    data = torch.randint(0, 256, (2, 128, 64), dtype=torch.uint8, generator=gen)
    scales = torch.randint(0, 256, (info["scales_bytes"],), dtype=torch.uint8, generator=gen)
    counts = torch.tensor([128, 32], dtype=torch.int32)
    pool = make_pool()
    rec = pool.record(recipe, shape)
    rec.stash(data.view(torch.float8_e5m2), counts, scales.view(torch.float8_e8m0fnu))
    out = torch.full_like(data, 0x5A)
    out_scales = torch.full_like(scales, 0x5A)
    rec.reload(out.view(torch.float8_e5m2), out_scales.view(torch.float8_e8m0fnu), zero_tail=True)
    mask = (torch.arange(128)[None, :] < counts[:, None]).unsqueeze(-1)
    assert torch.equal(out, torch.where(mask, data, torch.zeros_like(data)))
    assert pool.decide() == "keep"
    with pytest.raises(ValueError, match=r"must be torch.float8_e5m2 \(or torch.uint8 bytes\), not torch.float8_e4m3fn"):
        pool.record(recipe, shape).stash(data.view(torch.float8_e4m3fn), counts, scales)


def test_record_status_carries_every_field_of_the_cpp_record_status():
    """docs/api.md's RecordStatus, whole: the fields a launch leaves (refused_blocks,
    launch_in_flight) and the pool generation the stash saw, not only the state."""
    pool = ps.PagePool(device_pages=64, page_bytes=4096)
    x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    counts = torch.tensor([5, 9], dtype=torch.int32)
    pool.reset()
    pool.reset()  # generation 2
    rec = pool.record(like=x, counts=counts)
    rec.stash(x, counts)
    s = rec.status()
    assert set(s) == {"state", "error", "first_bad_group", "pages", "device_pages", "host_pages", "stream_bytes",
                      "live_bytes", "generation", "refused_blocks", "launch_in_flight"}
    assert s["state"] == "stashed" and s["error"] == "none" and s["generation"] == 2
    assert s["refused_blocks"] == 0 and s["launch_in_flight"] is False
    assert s["live_bytes"] == (5 + 9) * 128 * 2 and s["pages"] == s["device_pages"] + s["host_pages"] > 0
