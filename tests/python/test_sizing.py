"""Sizing a pool from the run itself: the cumulative counters (steps, overflowed steps,
reruns) that survive reset(), the overflow-rate warning against the sizing's target, observing
the counts of whole steps (PagePool.observe) and planning from them, resize, and what the
pool saves against eager (PoolSizing.saved_bytes, PoolCostWarning)."""

import math
import warnings

import pytest
import torch

import moe_example as moe
import pagestash as ps

SEED = 2718
EXPERTS, HIDDEN, PAGE = 8, 64, 1024
SAVED_SHAPE = ps.Shape(EXPERTS, 20, HIDDEN)  # capacity 20: capacity factor 1.25 for 128 tokens
TOKENS = 128


def run_step(pool, step_counts, source):
    """One step of stashes as the hook makes them (a record per stash), every one discarded
    (backward), then end_step() and decide(); on an overflow, reset() and count_rerun() (the
    rerun itself needs no pool). Returns the decision."""
    records = []
    for counts in step_counts:
        rec = pool.record("bf16/capacity", SAVED_SHAPE)
        rec.stash(source, counts, check=False)
        records.append(rec)
    for rec in reversed(records):
        rec.discard(check=False)
    pool.end_step()
    decision = pool.decide()
    if decision != "keep":
        pool.reset()
        pool.count_rerun()
    return decision


def source_tensor(gen):
    return torch.randn(SAVED_SHAPE.groups, SAVED_SHAPE.tokens, SAVED_SHAPE.hidden, generator=gen).to(torch.bfloat16)


def full_counts():
    return torch.full((EXPERTS,), SAVED_SHAPE.tokens, dtype=torch.int32)


def overflow_warnings(record):
    return [w for w in record if issubclass(w.category, ps.OverflowRateWarning)]


def test_counters_survive_reset_and_count_overflowed_steps_and_reruns():
    """A pool of 40 pages (40 KiB) and steps of two stashes: full ones (2 x 20 KiB live plus the
    second record's: more than the pool) overflow, light ones (a few rows) fit. The
    device's `overflows` counter is cleared by each reset; the cumulative ones are not."""
    gen = torch.Generator().manual_seed(SEED)
    source = source_tensor(gen)
    pool = ps.PagePool(device_pages=40, page_bytes=PAGE, strict=False)
    heavy = torch.rand(12, generator=gen) < 0.5
    heavy[0], heavy[1] = True, False  # both kinds
    for h in heavy.tolist():
        step = [full_counts() if h else torch.randint(0, 3, (EXPERTS,), generator=gen, dtype=torch.int32)
                for _ in range(3)]
        assert run_step(pool, step, source) == ("rerun_without_paging" if h else "keep")
    streak = len(heavy) - max(i + 1 for i, h in enumerate(heavy.tolist()) if not h)  # the heavy steps at the end
    expected = dict(steps=12, overflowed_steps=int(heavy.sum()), reruns=int(heavy.sum()), unpaged_streak=streak)
    assert pool.totals == expected
    stats = pool.stats()
    assert {k: stats[k] for k in expected} == expected
    pool.reset()
    stats = pool.stats()
    assert stats["overflows"] == 0 and stats["stashes"] == 0  # the device's counters: cleared
    assert {k: stats[k] for k in expected} == expected  # the cumulative ones: kept


def test_the_overflow_rate_warning_fires_once_for_a_pool_overflowing_far_above_its_plan():
    """A pool sized at 1e-3 that overflows every step warns at the third step (the first
    whose count the target rate gives with probability below 1e-6), and only once."""
    gen = torch.Generator().manual_seed(SEED)
    source = source_tensor(gen)
    pool = ps.PagePool(device_pages=8, page_bytes=PAGE, strict=False, overflow_target=1e-3)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            run_step(pool, [full_counts()], source)
        assert not overflow_warnings(seen)  # 2 of 2 at 1e-3: 1e-6 exactly, not below
        run_step(pool, [full_counts()], source)
        assert len(overflow_warnings(seen)) == 1
        message = str(overflow_warnings(seen)[0].message)
        assert "3 of the 3 steps since this pool was sized overflowed (100.0%) against the target 0.001" in message
        assert "pool.observe(steps)" in message and "pool.resize(sizing)" in message
        for _ in range(20):
            run_step(pool, [full_counts()], source)
        assert len(overflow_warnings(seen)) == 1  # once per sizing
    assert pool.totals == dict(steps=23, overflowed_steps=23, reruns=23, unpaged_streak=23)


def binomial_tail(n, k, p):
    """P(X >= k) for X ~ Binomial(n, p), summed exactly: the oracle for the warning's bound."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize("every, warns_at", [(5, 100), (3, 36), (10, None), (20, None)])
def test_the_warning_needs_a_rate_twice_the_plan_and_a_tiny_binomial_tail(every, warns_at):
    """Planned 0.05: a step in 5 overflowing (0.2) warns once the tail is below 1e-6; a step in
    10 (0.1, twice the sizing) or in 20 never does. Where it warns, the exact binomial tail is
    below 1e-6 (the Chernoff bound is above it) and one step earlier it was not flagged."""
    gen = torch.Generator().manual_seed(SEED)
    source = source_tensor(gen)
    pool = ps.PagePool(device_pages=8, page_bytes=PAGE, strict=False, overflow_target=0.05)
    light = [torch.ones(EXPERTS, dtype=torch.int32)]
    warned_at = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, 301):
            run_step(pool, [full_counts()] if step % every == 0 else light, source)
            if overflow_warnings(seen) and warned_at is None:
                warned_at = step
    assert warned_at == warns_at
    if warns_at is not None:
        k = warns_at // every
        assert binomial_tail(warns_at, k, 0.05) < 1e-6 and k / warns_at > 0.1
        assert len(overflow_warnings(seen)) == 1


def dirichlet_router(gen, steps, stashes, concentration):
    """Whole steps of a correlated router: per step, an expert popularity from
    Dirichlet(concentration) shared by all its stashes (layers x microbatches), and each stash
    routing TOKENS tokens by it; counts capped at the capacity."""
    out = []
    for _ in range(steps):
        gamma = torch.distributions.Gamma(torch.full((EXPERTS,), concentration), 1.0).sample()
        probs = gamma / gamma.sum()
        step = []
        for _ in range(stashes):
            expert = torch.multinomial(probs, TOKENS, replacement=True, generator=gen)
            step.append(torch.bincount(expert, minlength=EXPERTS).clamp(max=SAVED_SHAPE.tokens).to(torch.int32))
        out.append(step)
    return out


def test_observe_records_exactly_the_stashes_counts_in_whole_steps():
    """2 layers x 2 microbatches, each layer saving two tensors of one counts tensor: a
    count vector per (layer, microbatch), in stash order, for the observed steps only; a step
    that overflows is recorded too; counts rewritten in place later (a router reusing its
    buffer, or the caller) do not change what was recorded: the copies are the pool's."""
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    source = source_tensor(gen)
    wide = torch.randn(EXPERTS, SAVED_SHAPE.tokens, 2 * HIDDEN, generator=gen).to(torch.bfloat16)
    steps = dirichlet_router(gen, 5, 4, 1.0)
    steps[1] = [full_counts() for _ in range(4)]  # 240 pages: overflows the pool below
    pool = ps.PagePool(device_pages=160, page_bytes=PAGE, strict=False)
    with pytest.raises(ValueError, match=r"no observed step: call pool.observe\(steps\)"):
        pool.observed_counts()
    pool.observe(steps=3)
    decisions = []
    reused = torch.empty(EXPERTS, dtype=torch.int32)  # steps 1 and 2 route into one counts buffer, in place
    for i, step in enumerate(steps):
        records = []
        for counts in step:
            if i in (1, 2):
                counts = reused.copy_(counts)
            for data in (source, wide):  # a layer's two tensors share its counts
                rec = pool.record(like=data, counts=counts)
                rec.stash(data, counts)
                records.append(rec)
        for rec in reversed(records):
            rec.discard(check=False)
        pool.end_step()
        decisions.append(pool.decide())
        pool.reset()
    assert decisions[1] == "rerun_without_paging" and decisions[0] == "keep"
    assert pool.observing == 0
    observed = pool.observed_counts()
    assert observed.dtype == torch.int32 and observed.device == pool.device
    assert torch.equal(observed, torch.stack([torch.stack(s) for s in steps[:3]]))
    for step in steps:  # the caller may change its counts later: the pool copied them
        for counts in step:
            counts.fill_(-1)
    assert torch.equal(observed, pool.observed_counts())
    assert pool.observed_counts().min() >= 0


def test_observe_with_the_hook_gives_one_vector_per_layer_and_eager_bytes_match_the_plan():
    """The example's block under paged_saved_tensors: three marks of one counts tensor are one
    count vector, the router's counts; a sizing from the observed steps counts exactly the
    bytes the hook paged as what eager holds, and saved_bytes = full_bytes - the pool's bytes."""
    E, H, F, tokens = 8, 64, 128, 128
    capacity = 2 * tokens // E
    model = moe.GroupedMLP(E, H, F, seed=5)
    batches = moe.dirichlet_batches(4, tokens, E, H, torch.bfloat16, "cpu", seed=9)
    pool = ps.PagePool(device_pages=256, page_bytes=PAGE, strict=False)
    pool.observe(steps=4)
    paged = []
    for batch in batches:
        pool.begin_step()
        with ps.paged_saved_tensors(pool) as paging:
            loss = moe.loss_of(model, batch, capacity, paging)
        loss.backward()
        paged.append(paging.paged_bytes)
        pool.end_step()
        assert pool.decide() == "keep"
    expected = torch.stack([torch.bincount(b[2], minlength=E).clamp(max=capacity).to(torch.int32) for b in batches])
    assert torch.equal(pool.observed_counts(), expected.unsqueeze(1))  # [steps, 1 layer x 1 microbatch, experts]
    saved = [("bf16/capacity", ps.Shape(E, capacity, H)), ("bf16/capacity", ps.Shape(E, capacity, F)),
             ("bf16/capacity", ps.Shape(E, capacity, F))]
    sizing = ps.size_pool(saved, counts=pool.observed_counts(), layers=1, microbatches=1, overflow=0.2,
                        page_bytes=PAGE, samples=2000)
    assert paged == [sizing.full_bytes] * 4 == [E * capacity * (H + 2 * F) * 2] * 4
    assert sizing.device_bytes == sizing.device_pages * PAGE
    assert sizing.saved_bytes == sizing.full_bytes - sizing.device_pages * PAGE
    assert sizing.saved_fraction == pytest.approx(sizing.saved_bytes / sizing.full_bytes)
    # A step takes each tensor's live rows rounded up to pages; the sizing, a quantile of the
    # observed steps, lies between the smallest and the largest.
    pages = [sum(math.ceil(int(c.sum()) * 2 * width / PAGE) for width in (H, F, F)) for c in expected]
    assert min(pages) <= sizing.device_pages <= max(pages)


@pytest.mark.filterwarnings("ignore::pagestash.PoolCostWarning")  # capacity factor 1.25: it does
def test_sizing_from_observed_steps_of_a_correlated_router_holds_the_planned_rate():
    """A router more balanced than the docs' old guess and correlated (Dirichlet(2) popularity
    shared by a step's 2 layers x 2 microbatches, capacity factor 1.25): a pool sized at 5%
    from 150 observed whole steps overflows at about that rate on 300 fresh steps, and does not
    warn; the guess, independent Dirichlet(1) stashes at 1e-3, overflows a hundred times as
    often as sized and warns."""
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    source = source_tensor(gen)
    saved = [("bf16/capacity", SAVED_SHAPE)]
    layout = dict(layers=2, microbatches=2, page_bytes=PAGE)
    # [guessed_plan]
    guessed = ps.size_pool(saved, tokens=TOKENS, top_k=1, alpha=1.0,  # a router model: Dirichlet(1), top-1
                           layers=2, microbatches=2, overflow=1e-3, page_bytes=PAGE, seed=1)
    # [guessed_plan]
    pool = guessed.pool()
    pool.observe(steps=150)
    with pytest.warns(ps.OverflowRateWarning):  # the guess is wrong already while observing
        for step in dirichlet_router(gen, 150, 4, 2.0):
            run_step(pool, step, source)
    sizing = ps.size_pool(saved, counts=pool.observed_counts(), overflow=0.05, seed=1, **layout)
    assert sizing.device_pages > guessed.device_pages
    sized = ps.PagePool(1, page_bytes=PAGE, strict=False)
    sized.resize(sizing)
    assert (sized.device_pages, sized.overflow_target) == (sizing.device_pages, sizing.overflow) == (sizing.device_pages, 0.05)
    guess = guessed.pool(strict=False)
    fresh = dirichlet_router(gen, 300, 4, 2.0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in fresh:
            run_step(sized, step, source)
        assert not overflow_warnings(seen)
        for step in fresh:
            run_step(guess, step, source)
        assert len(overflow_warnings(seen)) == 1
    print(f"\nguessed alpha=1 at 1e-3: {guess.device_pages} pages, {guess.overflowed_steps}/300 overflowed; "
          f"observed steps at 0.05: {sized.device_pages} pages, {sized.overflowed_steps}/300")
    assert 0.01 * 300 <= sized.overflowed_steps <= 0.05 * 300 * 2.5  # 15 expected; 9 seen
    assert guess.overflowed_steps >= 0.1 * 300  # 0.3 sized; 46 seen
    assert sized.totals == dict(steps=300, overflowed_steps=sized.overflowed_steps, reruns=sized.overflowed_steps,
                                unpaged_streak=sized.unpaged_streak)


def test_a_pool_that_costs_more_than_it_saves_warns_and_one_that_pays_does_not():
    """Balanced routing at capacity factor 1.25 fills most rows: the pool takes more than it
    saves (PoolCostWarning, with the numbers); the example's uneven router at capacity factor
    2 leaves half the rows empty: no warning."""
    gen = torch.Generator().manual_seed(SEED)
    saved = [("bf16/capacity", SAVED_SHAPE)]
    layout = dict(layers=2, microbatches=2, page_bytes=PAGE, overflow=0.05)
    balanced = [[c.tolist() for c in step] for step in dirichlet_router(gen, 50, 4, 50.0)]
    with pytest.warns(ps.PoolCostWarning, match=r"costs more than it saves: its 0\.\d\d MiB on the device save"):
        sizing = ps.size_pool(saved, counts=balanced, **layout)
    assert sizing.device_bytes > sizing.saved_bytes > 0
    wide = [("bf16/capacity", ps.Shape(EXPERTS, 32, HIDDEN))]  # capacity factor 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", ps.PoolCostWarning)
        sizing = ps.size_pool(wide, tokens=TOKENS, top_k=1, alpha=1.0, **layout)
    assert sizing.device_bytes < sizing.saved_bytes


@pytest.mark.filterwarnings("ignore::pagestash.PoolCostWarning", "ignore::pagestash.OverflowRateWarning")
def test_resize_between_steps_keeps_the_counters_and_refuses_while_records_hold_pages():
    gen = torch.Generator().manual_seed(SEED)
    source = source_tensor(gen)
    pool = ps.PagePool(device_pages=8, page_bytes=PAGE, strict=False, overflow_target=1e-3)
    for _ in range(3):
        run_step(pool, [full_counts()], source)
    old = pool.record("bf16/capacity", SAVED_SHAPE)
    old.stash(source, torch.ones(EXPERTS, dtype=torch.int32))
    sizing = ps.size_pool([("bf16/capacity", SAVED_SHAPE)], counts=[full_counts().tolist()], layers=2,
                        microbatches=1, page_bytes=PAGE, samples=16)
    with pytest.raises(ValueError, match="between steps: records still hold 1 pages"):
        pool.resize(sizing)
    old.discard()
    pool.resize(sizing)
    assert (pool.device_pages, pool.overflow_target) == (sizing.device_pages, 1e-3) and sizing.device_pages > 8
    assert pool.totals == dict(steps=3, overflowed_steps=3, reruns=3, unpaged_streak=3)
    with pytest.raises(ValueError, match="another pool"):
        old.discard()  # a record of the old memory
    assert run_step(pool, [full_counts()], source) == "keep"
    with pytest.raises(ValueError, match="takes a PoolSizing"):
        pool.resize(64)


@pytest.mark.parametrize("call, message", [
    (lambda: ps.PagePool(8, overflow_target=1.5), r"overflow_target = 1.5 must be a probability in \(0, 1\)"),
    (lambda: ps.PagePool(8, overflow_target=0.0), "overflow_target = 0.0"),
    (lambda: ps.PagePool(8).observe(0), r"observe\(steps\): steps = 0 must be a positive integer"),
    (lambda: ps.PagePool(8).observe(2.5), "steps = 2.5"),
])
def test_bad_arguments_raise_value_error_saying_what(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_observed_steps_of_different_shapes_are_refused_naming_the_step():
    gen = torch.Generator().manual_seed(SEED)
    source = source_tensor(gen)
    pool = ps.PagePool(device_pages=64, page_bytes=PAGE, strict=False)
    pool.observe(steps=2)
    run_step(pool, [torch.ones(EXPERTS, dtype=torch.int32)] * 1, source)
    run_step(pool, [torch.ones(EXPERTS, dtype=torch.int32), torch.ones(EXPERTS, dtype=torch.int32)], source)
    with pytest.raises(ValueError, match="observed step 1 holds 2 count vectors of 8 experts, step 0 1 of 8"):
        pool.observed_counts()


def train_step(model, opt, batch, capacity, pool):
    """The sync-free loop with the pool's step bookkeeping: end_step() closes the step (and an
    observed one), decide() counts it, count_rerun() counts a rerun."""
    # [sized_step]
    opt.zero_grad(set_to_none=True)
    pool.begin_step()  # the step begins: decide() ends it
    with ps.paged_saved_tensors(pool) as paging:
        loss = moe.loss_of(model, batch, capacity, paging)
    loss.backward()
    pool.end_step()  # after the step's last reload: closes it (and an observed step)
    if pool.decide() != "keep":  # counts the step (pool.totals); warns when far above the sizing's rate
        pool.reset()
        pool.count_rerun()
        opt.zero_grad(set_to_none=True)
        moe.loss_of(model, batch, capacity).backward()  # the step without paging
    opt.step()
    # [sized_step]


def test_sizing_the_example_block_from_its_own_run_as_docs_python_md_shows_it():
    """The docs' loop: 32 observed steps of examples/torch/moe_example.py's block (16 experts),
    a sizing at 5% from them, the pool resized, 16 more steps; the parameters are bit-identical to eager
    training's, the observed counts are the router's, and the resized pool does not warn."""
    experts, tokens, hidden, ffn = 16, 256, 128, 256  # examples/torch/moe_example.py's block, 16 experts
    capacity = 2 * tokens // experts
    model, twin = moe.GroupedMLP(experts, hidden, ffn, seed=1), moe.GroupedMLP(experts, hidden, ffn, seed=1)
    opt, twin_opt = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(twin.parameters(), lr=0.05)
    batches = moe.dirichlet_batches(48, tokens, experts, hidden, torch.bfloat16, "cpu", seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ps.OverflowRateWarning)
        warnings.simplefilter("error", ps.PoolCostWarning)
        # [size_from_run]
        saved = [("bf16/capacity", ps.Shape(experts, capacity, hidden)),  # what the block marks: its input,
                 ("bf16/capacity", ps.Shape(experts, capacity, ffn)),  # the first GEMM's output
                 ("bf16/capacity", ps.Shape(experts, capacity, ffn))]  # and its SiLU
        pool = ps.PagePool(device_pages=160, page_bytes=4096, strict=False)  # a first pool (here: the tensors' full size)
        pool.observe(steps=32)  # records the counts of the next 32 whole steps, on the device: no sync
        for batch in batches[:32]:
            train_step(model, opt, batch, capacity, pool)
        sizing = ps.size_pool(saved, counts=pool.observed_counts(),  # [32 steps, layers x microbatches, experts]
                            layers=1, microbatches=1, overflow=0.05, page_bytes=4096, seed=1)
        print(sizing)
        pool.reallocate(sizing)  # between steps: the size it found, and its target for the overflow-rate warning
        for batch in batches[32:]:
            train_step(model, opt, batch, capacity, pool)
        print(pool.totals)
        # [size_from_run]
    router = torch.stack([torch.bincount(b[2], minlength=experts).clamp(max=capacity) for b in batches[:32]])
    assert torch.equal(pool.observed_counts(), router.to(torch.int32).unsqueeze(1))
    full = experts * capacity * (hidden + 2 * ffn) * 2 // 4096  # 160: the first pool
    routed = tokens * (hidden + 2 * ffn) * 2 // 4096  # 80: every token's rows
    assert pool.device_pages == sizing.device_pages <= routed < full and pool.overflow_target == 0.05
    assert pool.totals["steps"] == 48 and pool.totals["reruns"] == pool.totals["overflowed_steps"]
    assert sizing.saved_bytes >= sizing.device_bytes  # capacity factor 2: at most half the rows live
    for batch in batches:
        twin_opt.zero_grad(set_to_none=True)
        moe.loss_of(twin, batch, capacity).backward()
        twin_opt.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


@pytest.mark.skipif(not (torch.cuda.is_available() and ps.with_cuda),
                    reason="SKIPPED: no CUDA device (or pagestash built without CUDA): observing on a CUDA pool needs a GPU")
@pytest.mark.filterwarnings("ignore::pagestash.PoolCostWarning")
def test_cuda_observe_records_without_a_sync_and_resize_makes_old_records_foreign():
    """On a CUDA pool, the stashes, their observation and end_step() run under torch's sync
    debug mode set to error; the observed counts are the router's. After resize(sizing), a record
    of the old memory is another pool's: its stash raises the foreign_record flag."""
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    source = source_tensor(gen).cuda()
    steps = dirichlet_router(gen, 3, 4, 2.0)
    on_device = [[c.cuda() for c in step] for step in steps]
    pool = ps.PagePool(device_pages=128, page_bytes=PAGE, device="cuda")
    old = pool.record("bf16/capacity", SAVED_SHAPE)
    torch.cuda.synchronize()
    pool.observe(steps=3)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in on_device:
            records = []
            for counts in step:
                rec = pool.record("bf16/capacity", SAVED_SHAPE)
                rec.stash(source, counts)
                records.append(rec)
            for rec in reversed(records):
                rec.discard()
            pool.end_step()
        observed = pool.observed_counts()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert observed.device.type == "cuda"
    assert torch.equal(observed.cpu(), torch.stack([torch.stack(s) for s in steps]))
    assert pool.decide() == "keep"
    sizing = ps.size_pool([("bf16/capacity", SAVED_SHAPE)], counts=observed, layers=2, microbatches=2, page_bytes=PAGE,
                        samples=100)
    pool.resize(sizing)
    assert pool.device_pages == sizing.device_pages and pool.totals["steps"] == 1
    old.stash(source, on_device[0][0])  # made for the memory before the resize
    assert pool.flag_dict()["foreign_record"] == 1
    assert pool.decide() == "report_error"
