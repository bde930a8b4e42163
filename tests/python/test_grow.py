"""A pool with a reserve: grow and shrink between steps (records, tensors and addresses kept),
their bad inputs, what memory() counts, and the automatic mode on a training loop whose
router drifts: one of this rank's experts grows hot after some steps (as a hot expert may
appear late in training under expert parallelism), and the rank's rows double."""

import logging
import re
import sys
import warnings

import pytest

try:
    import resource
except ImportError:  # not on Windows
    resource = None
import torch

import pagestash as ps

PAGE = 4096
SHAPE = ps.Shape(2, 32, 64)  # bf16/capacity: a row of 128 bytes


def stash(pool, counts, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(SHAPE.groups, SHAPE.tokens, SHAPE.hidden, generator=g).bfloat16()
    record = pool.record("bf16/capacity", SHAPE)
    record.stash(data, torch.tensor(counts, dtype=torch.int32), check=False)
    return record, data


def reloaded(record, data, counts):
    out = torch.full_like(data, float("nan"))
    record.reload(out, check=False)
    return all(torch.equal(out[g, :n], data[g, :n]) for g, n in enumerate(counts))


def test_grow_gives_pages_and_keeps_every_address_and_record():
    pool = ps.PagePool(2, page_bytes=PAGE, reserve_bytes=40 * PAGE)
    assert pool.growable and pool.device_reserve == 40 and pool.device_pages == 2
    arena = (pool.device_arena.data_ptr(), pool.control.data_ptr())
    held, data = stash(pool, [16, 24], seed=1)  # 5 KiB: both pages
    assert pool.pages_in_use() == 2
    second, more = stash(pool, [32, 32], seed=2)  # no room: overflow
    assert pool.flag_dict()["overflow"] == 1 and second.status()["state"] == "overflowed"
    second.discard(check=False)
    pool.reset()  # the held record is stale now; the pool's pages stay its own
    pool.grow(12)
    assert pool.device_pages == 12 and pool.stats()["device_pages_free"] == 12
    assert (pool.device_arena.data_ptr(), pool.control.data_ptr()) == arena  # nothing moved
    for seed in range(3):
        record, data = stash(pool, [32, 32], seed=seed)  # 2 pages
        assert reloaded(record, data, [32, 32])
    keep = [stash(pool, [32, 32], seed=10 + i) for i in range(6)]  # every page the pool has now
    assert pool.pages_in_use() == 12 and not any(pool.flag_dict().values())
    assert all(reloaded(r, d, [32, 32]) for r, d in keep)
    assert pool.resizes == [dict(step=0, old=(2, 0), new=(12, 0), why="grow() called")]


def test_shrink_needs_every_page_back_and_gives_memory_back():
    pool = ps.PagePool(600, page_bytes=PAGE, reserve_bytes=1200 * PAGE)  # 2.3 MiB, then 4.7: whole 2 MiB granules
    two_mib = 2 << 20
    assert pool.memory()["device_bytes"] == 2 * two_mib and pool.memory()["allocator"] == "pagestash"
    pool.grow(1100)
    assert pool.memory()["device_bytes"] == 3 * two_mib
    assert pool.memory()["device_reserved_bytes"] == 3 * two_mib  # 1200 pages: 4.7 MiB in granules
    record, data = stash(pool, [32, 32], seed=3)
    with pytest.raises(ValueError, match="records hold pages"):
        pool.shrink(100)
    assert pool.device_pages == 1100 and pool.stats()["device_pages_free"] == 1098  # nothing changed
    assert reloaded(record, data, [32, 32])
    pool.end_step()
    pool.shrink(100)
    assert pool.device_pages == 100 and pool.memory()["device_bytes"] == two_mib
    assert pool.stats()["device_pages_free"] == 100 and pool.stats()["device_pages"] == 100
    record, data = stash(pool, [32, 32], seed=4)  # the pages kept still hold data
    assert reloaded(record, data, [32, 32])


def test_bad_resizes_are_refused_and_change_nothing():
    fixed = ps.PagePool(4, page_bytes=PAGE)
    with pytest.raises(ValueError, match="no reserve"):
        fixed.grow(8)
    assert fixed.memory()["allocator"] == "pytorch" and fixed.memory()["device_bytes"] == 4 * PAGE
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=8 * PAGE)
    for call, pages in ((pool.grow, 9), (pool.grow, 3), (pool.shrink, 5), (pool.shrink, -1)):
        with pytest.raises(ValueError, match="reserve"):
            call(pages)
    with pytest.raises(ValueError, match="not a number of pages"):
        pool.grow(6.5)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="reserve_bytes"):
            ps.PagePool(4, page_bytes=PAGE, reserve_bytes=bad)
    with pytest.raises(ValueError, match="reserve"):  # a reserve below the pages
        ps.PagePool(4, page_bytes=PAGE, reserve_bytes=2 * PAGE)
    step = ps.PagedStep(pool)
    with pytest.raises(RuntimeError, match="inside an open step"):
        pool.grow(8)
    step.abandon()
    assert pool.device_pages == 4 and pool.stats()["device_pages_free"] == 4 and pool.resizes == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SKIPPED: RLIMIT_DATA limits mappings on Linux")
def test_a_reserve_beyond_memory_and_a_grow_out_of_memory_are_refused_and_change_nothing():
    with pytest.raises(ValueError, match="more than the host's memory"):
        ps.PagePool(4, page_bytes=1 << 20, reserve_bytes=1 << 50)
    pool = ps.PagePool(4, page_bytes=65536, reserve_bytes=1 << 30)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    data = int(re.search(r"VmData:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) << 10
    resource.setrlimit(resource.RLIMIT_DATA, (data + (64 << 20), hard))  # room for 64 MiB more
    try:
        with pytest.raises(RuntimeError, match="out of host memory"):
            pool.grow(4096)  # 256 MiB
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
    assert pool.device_pages == 4 and pool.memory()["device_bytes"] == 2 << 20 and pool.resizes == []
    assert pool.stats()["device_pages_free"] == 4 and pool.stats()["device_pages"] == 4
    pool.grow(4096)
    assert pool.stats()["device_pages_free"] == 4096


def test_a_pool_with_a_reserve_resizes_to_a_sizing_in_place_and_copies_as_one():
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=64 * PAGE, host_reserve_bytes=8 * PAGE)
    sizing = ps.size_pool([("bf16/capacity", ps.Shape(2, 256, 64))], counts=[[8, 8]], layers=3, microbatches=1,
                          page_bytes=PAGE, samples=10)
    record, data = stash(pool, [8, 8], seed=5)
    record.discard()
    pool.end_step()
    pool.resize(sizing)
    assert pool.device_pages == sizing.device_pages == 3 and pool.device_reserve == 64
    fresh, data = stash(pool, [8, 8], seed=6)  # made before the resize: still this pool's
    assert reloaded(fresh, data, [8, 8])
    pool.grow(20, 3)
    assert pool.stats()["host_pages_free"] == 3 and pool.config == dict(
        page_bytes=PAGE, device_pages=20, host_pages=3, reserve_bytes=64 * PAGE, host_reserve_bytes=8 * PAGE)
    import copy
    twin = copy.deepcopy(pool)
    assert twin.config == pool.config and twin.growable and twin.memory()["allocator"] == "pagestash"


# ---- The automatic mode on a drifting router ---------------------------------------------

E_ALL, E, H, F, TOKENS, TOP_K = 16, 8, 64, 128, 96, 2
CAPACITY = TOKENS  # dropless: a hot expert may take every token


class LocalExperts(torch.nn.Module):
    """One rank's experts 0..E-1 of E_ALL: tokens routed elsewhere are other ranks' work."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.router = torch.nn.Parameter(torch.randn(H, E_ALL, generator=g) * H**-0.5)
        self.w_up = torch.nn.Parameter((torch.randn(E, H, F, generator=g) * H**-0.5).to(torch.bfloat16))
        self.w_down = torch.nn.Parameter((torch.randn(E, F, H, generator=g) * F**-0.5).to(torch.bfloat16))

    def forward(self, x, paging=None):
        probs = torch.softmax(x @ self.router, dim=-1)
        weight, expert = probs.topk(TOP_K, dim=-1)
        local = expert.flatten() < E
        token = torch.arange(x.shape[0]).repeat_interleave(TOP_K)[local]
        e = expert.flatten()[local]
        onehot = torch.nn.functional.one_hot(e, E)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        counts = onehot.sum(0).to(torch.int32)
        mark = (lambda t: t) if paging is None else (lambda t: paging.mark(t, counts))
        buf = mark(x.new_zeros(E, CAPACITY, H, dtype=torch.bfloat16).index_put((e, slot), x[token].bfloat16()))
        act = mark(torch.nn.functional.gelu(torch.bmm(buf, self.w_up)))
        y = torch.bmm(act, self.w_down)[e, slot].float() * weight.flatten()[local, None]
        return x.new_zeros(x.shape).index_add(0, token, y)


SAVED = [("bf16/capacity", ps.Shape(E, CAPACITY, H)), ("bf16/capacity", ps.Shape(E, CAPACITY, F))]


def drifting_data(steps, microbatches, drift_at):
    """From step `drift_at` on, the tokens lean towards expert 0 and this rank's other experts:
    expert 0 takes nearly every token, and twice the rows are this rank's."""
    g = torch.Generator().manual_seed(3)
    router = LocalExperts().router.detach()
    hot, local = router[:, 0], router[:, :E].mean(1) - router[:, E:].mean(1)
    lean = 4 * hot / hot.norm() + 4 * local / local.norm()
    return [[(torch.randn(TOKENS, H, generator=g) + (lean if s >= drift_at else 0), torch.randn(TOKENS, H,
             generator=g)) for _ in range(microbatches)] for s in range(steps)]


def run(model, batch, step=None):
    """Two microbatches in flight (1F1B on two stages' first one)."""
    order = [("f", 0)] + [x for i in range(1, len(batch)) for x in (("f", i), ("b", i - 1))] + [("b", len(batch) - 1)]
    losses = {}
    for kind, i in order:
        x, target = batch[i]
        if kind == "b":
            losses.pop(i).backward()
        elif step is None:
            losses[i] = torch.nn.functional.mse_loss(model(x), target)
        else:
            with step.paging() as paging:
                losses[i] = torch.nn.functional.mse_loss(model(x, paging), target)


def local_rows(batches):
    model = LocalExperts()
    return [sum(int((model.router.detach().T @ x.T).T.topk(TOP_K, dim=-1).indices.lt(E).sum()) for x, _ in b)
            for b in batches]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "sync-free"])
def test_auto_resize_grows_at_the_drift_reruns_only_there_and_matches_eager(strict, caplog):
    steps, microbatches, drift_at = 10, 3, 5
    batches = drifting_data(steps, microbatches, drift_at)
    rows = local_rows(batches)
    assert min(rows[drift_at:]) > 1.8 * max(rows[:drift_at])  # the drift: more of the step's tokens are local
    models = [LocalExperts() for _ in range(3)]  # eager, the pool that grows, a fixed pool
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    pool = ps.PagePool(8, page_bytes=PAGE, reserve_bytes=4096 * PAGE, strict=strict)
    pool.auto_resize(SAVED, window=4, schedule="1f1b:2", layers=1, microbatches=microbatches)
    fixed = None
    hows, fixed_hows, pages = [], [], []
    caplog.set_level(logging.INFO, logger="pagestash")
    for s, batch in enumerate(batches):
        if s == drift_at:  # the size the growing pool reached before the drift, fixed
            fixed = ps.PagePool(pool.device_pages, page_bytes=PAGE, strict=strict)
        opts[0].zero_grad(set_to_none=True)
        run(models[0], batch)
        opts[0].step()
        hows.append(ps.run_step(pool, lambda step: run(models[1], batch, step), opts[1]))
        opts[1].step()
        pages.append(pool.device_pages)
        how = ps.run_step(fixed, lambda step: run(models[2], batch, step), opts[2])  # None: eager
        opts[2].step()
        if fixed is not None:
            fixed_hows.append(how)
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            assert torch.equal(a, b), f"step {s} ({hows[-1]}): parameters differ from eager"
        assert pool.pages_in_use() == 0
    grew = [r["step"] - 1 for r in pool.resizes]  # the step whose decision grew it
    reran = [s for s, how in enumerate(hows) if how == "rerun"]
    assert reran == grew, (hows, pool.resizes)
    assert drift_at in grew and 0 in grew  # the first step (8 pages are few), then the drift
    assert not [s for s in reran if s > drift_at + 1], hows  # none after it settled
    assert pages[drift_at] > pages[drift_at - 1] and pool.device_pages < pool.device_reserve
    assert fixed_hows == ["rerun"] * (steps - drift_at), fixed_hows  # a fixed pool overflows every later step
    for a, c in zip(models[0].parameters(), models[2].parameters()):
        assert torch.equal(a, c)
    grown = [r for r in caplog.records if "grew" in r.getMessage()]
    assert len(grown) == len(grew) and all(r.levelno == logging.WARNING for r in grown)
    assert "observed steps need" in pool.resizes[-1]["why"]


def test_auto_resize_shrinks_after_the_tail_falls():
    steps, microbatches = 8, 2
    # Hot first, then cold: the pool grown for the hot steps shrinks after `shrink_after` cold ones.
    batches = list(reversed(drifting_data(steps, microbatches, drift_at=4)))
    model = LocalExperts()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=1024 * PAGE)
    policy = pool.auto_resize(SAVED, window=2, shrink_after=3, schedule="1f1b:2", layers=1,
                              microbatches=microbatches)
    assert isinstance(policy, ps.AutoResize)
    for batch in batches:
        ps.run_step(pool, lambda step: run(model, batch, step), opt)
        opt.step()
    kinds = [(r["step"], r["new"][0] > r["old"][0]) for r in pool.resizes]
    assert kinds[0] == (1, True) and any(not up for _, up in kinds), pool.resizes
    shrunk = [r for r in pool.resizes if r["new"][0] < r["old"][0]]
    assert shrunk[0]["step"] >= 4 + 3 and "3 steps kept" in shrunk[0]["why"]
    assert pool.pages_in_use() == 0 and pool.totals["reruns"] == 1


def test_auto_resize_bad_arguments():
    with pytest.raises(ValueError, match="reserve"):
        ps.PagePool(4, page_bytes=PAGE).auto_resize(SAVED)
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=64 * PAGE)
    for bad, match in ((dict(window=0), "window"), (dict(overflow=2.0), "overflow"),
                       (dict(counts=[[1]]), "sets size_pool's counts"), (dict(layerz=2), "layerz")):
        with pytest.raises(ValueError, match=match):
            pool.auto_resize(SAVED, **bad)
    pool.auto_resize(SAVED)
    with pytest.raises(ValueError, match="observes this pool's steps already"):
        pool.observe(2)
    assert pool.auto_resize(None) is None and pool.observing == 0


def test_auto_resize_checks_its_arguments_where_they_are_given():
    """A recipe, a schedule or a sizing argument the sizer refuses, and a headroom below 1, raise at
    auto_resize(), not at the first step that overflows (where the step was left unrerun, its
    gradients NaN); the policy before stays."""
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=64 * PAGE)
    policy = pool.auto_resize(SAVED, schedule="1f1b:2", layers=1, microbatches=2)
    bad_recipe = [("bf16/nope", ps.Shape(E, CAPACITY, H))]
    for saved, bad, match in ((bad_recipe, {}, r"^pagestash: auto_resize: unknown recipe 'bf16/nope'"),
                              (SAVED, dict(schedule="zzz"), r"^pagestash: auto_resize: .*unknown schedule 'zzz'"),
                              (SAVED, dict(headroom=0.5), r"headroom = 0.5 must be at least 1"),
                              (SAVED, dict(samples=0), r"samples must be at least 1"),
                              (SAVED, dict(overflow="1e-3"), r"overflow = '1e-3' must be a probability"),
                              (SAVED, dict(microbatches=2), r"a step of the schedule 2 \(1 layers x 2 microbatches\)"),
                              ([("bf16/capacity", ps.Shape(E, 100, H))] + SAVED, {}, "capacit")):
        with pytest.raises(ValueError, match=match):
            pool.auto_resize(saved, **bad)
        assert pool._auto is policy
    pool.auto_resize(SAVED, headroom=1)


def test_grow_shrink_and_resize_inside_an_open_step_are_refused():
    """Between begin_step() and decide() (not only inside a PagedStep), as the docs say."""
    pool = ps.PagePool(4, page_bytes=PAGE, reserve_bytes=64 * PAGE)
    sizing = ps.size_pool([("bf16/capacity", ps.Shape(2, 256, 64))], counts=[[8, 8]], layers=3, microbatches=1,
                          page_bytes=PAGE, samples=10)
    pool.begin_step()
    for call in (lambda: pool.grow(8), lambda: pool.shrink(2), lambda: pool.resize(sizing)):
        with pytest.raises(RuntimeError, match=r"inside an open step \(between begin_step\(\) and decide\(\)\)"):
            call()
    assert pool.device_pages == 4 and pool.resizes == []
    assert pool.decide() == "keep"
    pool.grow(8)
    pool.shrink(2)
    assert [r["new"] for r in pool.resizes] == [(8, 0), (2, 0)]


def test_a_pool_with_a_reserve_shrinks_to_no_pages_and_grows_again():
    """A pool may start at no pages and grow, so it may shrink to none: all its memory back."""
    pool = ps.PagePool(0, page_bytes=PAGE, reserve_bytes=64 * PAGE)
    assert pool.device_pages == 0 and pool.memory()["device_bytes"] == 0
    pool.grow(4)
    record, data = stash(pool, [32, 32], seed=7)
    assert reloaded(record, data, [32, 32])
    pool.end_step()
    pool.shrink(0)
    assert pool.device_pages == 0 and pool.memory()["device_bytes"] == 0 and pool.stats()["device_pages"] == 0
    record, data = stash(pool, [8, 8], seed=8)  # no page: an overflow
    assert pool.flag_dict()["overflow"] == 1
    record.discard(check=False)
    pool.reset()
    pool.grow(4)
    record, data = stash(pool, [32, 32], seed=9)
    assert reloaded(record, data, [32, 32]) and not any(pool.flag_dict().values())
    assert [r["new"] for r in pool.resizes] == [(4, 0), (0, 0), (4, 0)]


class Contexts:
    """What run() asks of a step: a paged context per microbatch, in a loop of one's own."""

    def __init__(self, pool, strict):
        self.pool, self.strict = pool, strict

    def paging(self):
        return ps.paged_saved_tensors(self.pool, strict=self.strict)


@pytest.mark.parametrize("strict", [None, True], ids=["pool's", "strict context"])
def test_the_strict_manual_loop_grows_under_auto_resize_like_run_step(strict):
    """The documented loop (begin_step, the microbatches, end_step, decide, a rerun by hand) on a
    CPU pool, strict by default: a context of the pool's strictness does not raise while the pool
    observes (its step runs to its end, as under run_step); one made strict raises at the end of the
    backward that finds the failure, and the loop catches it. Either way the overflowing steps decide
    'rerun_without_paging' (they said 'report_error': overflow, error, unbalanced), the pool grows
    before their rerun, and the parameters equal eager PyTorch's."""
    steps, microbatches, drift_at = 8, 3, 4
    batches = drifting_data(steps, microbatches, drift_at)
    eager, model = LocalExperts(), LocalExperts()
    eager_opt, opt = (torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (eager, model))
    pool = ps.PagePool(8, page_bytes=PAGE, reserve_bytes=4096 * PAGE)  # a CPU pool: strict
    pool.auto_resize(SAVED, window=4, schedule="1f1b:2", layers=1, microbatches=microbatches)
    decisions, raised = [], 0
    for s, batch in enumerate(batches):
        eager_opt.zero_grad(set_to_none=True)
        run(eager, batch)
        eager_opt.step()
        opt.zero_grad(set_to_none=True)
        pool.begin_step()
        try:
            run(model, batch, Contexts(pool, strict))
        except ps.PagingError:
            raised += 1
        pool.end_step()
        decisions.append(pool.decide())
        if decisions[-1] != "keep":
            pool.reset()
            pool.count_rerun()
            opt.zero_grad(set_to_none=True)
            run(model, batch)
        opt.step()
        for a, b in zip(eager.parameters(), model.parameters()):
            assert torch.equal(a, b), f"step {s} ({decisions[-1]}): parameters differ from eager"
    reran = [s for s, d in enumerate(decisions) if d != "keep"]
    assert set(decisions) == {"keep", "rerun_without_paging"}, decisions
    assert [r["step"] - 1 for r in pool.resizes] == reran and 0 in reran and drift_at in reran, (decisions, pool.resizes)
    assert raised == (len(reran) if strict else 0) and pool.pages_in_use() == 0


def test_a_loop_that_stops_paging_warns_at_a_bounded_rate_and_counts_it(caplog):
    """A pool at its reserve overflows every step: each reruns unpaged. The loop says so: an
    UnpagedStepsWarning at the 3rd step in a row and every 10th after (the first naming the
    reserve), and pool.totals['unpaged_streak'] counts them; a kept step ends the streak. A misuse
    every step (decide(): 'report_error', which auto_resize never grows for) warns the same."""
    pool = ps.PagePool(1, page_bytes=PAGE, reserve_bytes=2 * PAGE)  # at most 2 pages; a step takes 6
    pool.auto_resize([("bf16/capacity", SHAPE)], layers=3)

    def stashes(counts, n=3):
        def step(step):
            if not step.paged:  # the rerun: nothing to page
                return
            records = [stash(pool, counts, seed=i)[0] for i in range(n)]
            for record in reversed(records):
                record.discard(check=False)
        return step

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        hows = [ps.run_step(pool, stashes([32, 32]), lambda: None) for _ in range(25)]
        streak = pool.totals["unpaged_streak"]
        assert ps.run_step(pool, stashes([4, 4], n=1), lambda: None) == "paged"  # one page: kept
        kept = pool.totals["unpaged_streak"]
        hows += [ps.run_step(pool, stashes([32, 32]), lambda: None) for _ in range(3)]
    assert hows == ["rerun"] * 28 and pool.device_pages == 2 and (streak, kept) == (25, 0)
    said = [str(w.message) for w in seen if issubclass(w.category, ps.UnpagedStepsWarning)]
    assert [re.search(r"the last (\d+) steps were all rerun without paging", m).group(1) for m in said] == \
        ["3", "13", "23", "3"], said
    assert all("at its reserve (2 device pages), so auto_resize cannot grow it: make it with a larger reserve_bytes"
               in m for m in said)
    assert pool.totals == dict(steps=29, overflowed_steps=28, reruns=28, unpaged_streak=3)
    misused = ps.PagePool(4, page_bytes=PAGE, strict=False)
    with pytest.warns(ps.UnpagedStepsWarning, match=r"the last 3 steps .* Its flags report a misuse") as seen:
        for _ in range(3):
            misused.begin_step()
            misused.flags[ps.FLAG_NAMES.index("bad_counts")] = 1
            assert misused.decide() == "report_error"
            misused.reset()
    assert misused.totals["unpaged_streak"] == 3 and len(seen) == 1


def test_a_step_auto_resize_cannot_size_is_still_rerun():
    """A sizing that fails at a step (here, a sizer that raises) grows the pool by doubling, and
    the step still reruns: it was left unrerun with NaN gradients, the ValueError out of run_step."""
    batch = drifting_data(1, 2, drift_at=0)[0]
    eager, model = LocalExperts(), LocalExperts()
    run(eager, batch)
    pool = ps.PagePool(8, page_bytes=PAGE, reserve_bytes=1024 * PAGE)
    policy = pool.auto_resize(SAVED, window=2, schedule="1f1b:2", layers=1, microbatches=2)

    def refuses(*args, **kwargs):
        raise ValueError("pagestash.size_pool: counts[0][1][0] = 200 is above the capacity 96")

    policy._size_pool = refuses
    assert ps.run_step(pool, lambda step: run(model, batch, step), model) == "rerun"
    assert pool.device_pages == 16 and "could not be sized (pagestash.size_pool: counts" in pool.resizes[-1]["why"]
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(eager.parameters(), model.parameters()))


# ---- On a GPU: a graph captured on a small pool keeps working as the pool grows --------------

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and ps.with_cuda),
    reason="SKIPPED: no CUDA device (or pagestash built without CUDA): a device pool's reserve needs a GPU")


@needs_cuda
def test_cuda_a_graph_captured_on_a_small_pool_replays_after_grow_and_shrink():
    shape = ps.Shape(2, 64, 64)  # [64, 64] live rows: 16 KiB, 4 pages
    before = torch.cuda.memory_allocated()
    pool = ps.PagePool(2, page_bytes=PAGE, device="cuda", reserve_bytes=64 * PAGE)
    assert torch.cuda.memory_allocated() == before  # the library's memory, which memory() counts
    assert pool.memory()["allocator"] == "pagestash" and pool.memory()["device_bytes"] >= 2 * PAGE
    record = pool.record("bf16/capacity", shape)
    data = torch.randn(2, 64, 64, device="cuda").bfloat16()
    out = torch.empty_like(data)
    counts = torch.tensor([8, 8], dtype=torch.int32, device="cuda")

    def step():
        record.stash(data, counts, check=False)
        record.reload(out, check=False)
        pool.end_step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    counts.copy_(torch.tensor([64, 64]))  # more than the 2 pages the pool has
    graph.replay()
    assert pool.flag_dict()["overflow"] == 1 and torch.isnan(out.float()).all()
    pool.reset()
    pool.grow(8)
    graph.replay()  # the same graph: no re-capture
    torch.cuda.synchronize()
    assert torch.equal(out, data) and not any(pool.flag_dict().values())
    assert pool.stats()["device_pages_free"] == 8 and pool.stats()["peak_pages_held"] == 4
    pool.shrink(4)  # after a balanced step
    out.zero_()
    graph.replay()
    assert torch.equal(out, data) and not any(pool.flag_dict().values())


@needs_cuda
def test_cuda_a_pool_s_spill_grows_in_registered_host_memory_and_shrinks():
    shape = ps.Shape(2, 64, 64)  # [64, 64] live rows: 16 KiB, 4 pages
    pool = ps.PagePool(1, page_bytes=PAGE, device="cuda", host_reserve_bytes=16 * PAGE)
    assert pool.growable and pool.host_arena.is_pinned()  # its first chunk registered from the start
    data = torch.randn(2, 64, 64, device="cuda").bfloat16()
    counts = torch.tensor([64, 64], dtype=torch.int32, device="cuda")
    record = pool.record("bf16/capacity", shape)
    record.stash(data, counts, check=False)
    assert pool.flag_dict()["overflow"] == 1  # one device page and no spill
    record.discard(check=False)
    pool.reset()
    for _ in range(2):  # grown, shrunk to no spill (the chunks past the first unregistered), grown again
        pool.grow(1, 8)
        out = torch.full_like(data, float("nan"))
        record.stash(data, counts, check=False)
        assert record.status()["host_pages"] == 3
        record.reload(out, check=False)
        torch.cuda.synchronize()
        assert torch.equal(out, data) and not any(pool.flag_dict().values())
        pool.end_step()
        pool.shrink(1, 0)
        assert pool.stats()["host_pages"] == 0 and pool.memory()["host_bytes"] == 2 << 20


def _two_ranks(rank, world, init_file, results):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    batch = drifting_data(1, 2, drift_at=0)[0]
    model, plain = LocalExperts(), LocalExperts()
    opt, plain_opt = torch.optim.SGD(model.parameters(), lr=1e-3), torch.optim.SGD(plain.parameters(), lr=1e-3)
    pool = ps.PagePool(256 if rank == 0 else 8, page_bytes=PAGE, reserve_bytes=1024 * PAGE)
    pool.auto_resize(SAVED, window=2, schedule="1f1b:2", layers=1, microbatches=2)
    how = ps.run_step(pool, lambda step: run(model, batch, step), opt)
    ps.run_step(None, lambda step: run(plain, batch, step), plain_opt)
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), plain.parameters()))
    results.put((rank, how, same, pool.device_pages))
    torch.distributed.destroy_process_group()


def test_auto_resize_on_several_ranks_grows_the_pool_that_overflowed_not_its_peers(tmp_path):
    from _ranks import run_ranks

    got = run_ranks(_two_ranks, 2, tmp_path / "init")
    assert [(how, same) for _, how, same, _ in got] == [("rerun", True), ("rerun", True)]  # agreed: both rerun
    assert got[0][3] == 256 and got[1][3] > 8, got  # only rank 1's pool found no room
