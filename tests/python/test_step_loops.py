"""The loops users write around a step, each with paging failing in no microbatch, in the
first, a middle, the last, or several: every one ends bit-identical to the same loop run
eagerly, or is refused with an error that says what to do; none ends with finite, wrong
gradients. What a step is comes from the user (run_step, PagedStep, or begin_step() ...
decide()), never from an optimizer: skipped optimizer steps, hand-written updates and
several optimizers change nothing."""

import pytest
import torch

import pagestash as ps
from test_step import Experts, microbatches

STEPS = 3
FAILURES = {"none": (), "first": (0,), "middle": (1,), "last": (2,), "first two": (0, 1), "all": (0, 1, 2)}


def overflow(pool):
    """What a stash that finds no room does to the pool: the overflow flag goes up, and every
    stash after it in the step does nothing (their reloads poison: NaN gradients)."""
    pool.flags[ps.FLAG_NAMES.index("overflow")] = 1


def batches(steps=STEPS):
    return [microbatches(seed=11 + s) for s in range(steps)]


def forward(model, x, counts, paging, pool, fail):
    if paging is not None and fail:
        overflow(pool)
    return model(x, counts, paging=paging)


def same(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def finite_grads(model):
    return all(p.grad is None or bool(p.grad.isfinite().all()) for p in model.parameters())


# ---- run_step: the step is run_step's -----------------------------------------------------------


def run_step_loop(model, pool, data, failures, update, zero_grad, skip=()):
    """Each step through run_step, then `update` unless the step is in `skip` (as GradScaler
    skips an optimizer step on inf gradients): failures[s] lists the microbatches of step s
    whose stashes find no room."""
    for s, batch in enumerate(data):
        def microbatches_of(step, s=s, batch=batch):
            for i, (x, counts) in enumerate(batch):
                with step.paging() as paging:
                    loss = forward(model, x, counts, paging if step.paged else None, pool, i in failures[s])
                loss.backward()

        ps.run_step(pool, microbatches_of, zero_grad(model))
        if s not in skip:
            update(model)


def sgd(lr=0.5):
    def update(model):
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return update


LOOPS = {
    # A GradScaler-style step skipped on inf gradients: no optimizer step at all in step 0.
    "skipped optimizer step": dict(update=lambda m: m.opt.step(), zero_grad=lambda m: m.opt, skip=(0,)),
    # A hand-written update: no optimizer anywhere.
    "hand-written SGD": dict(update=sgd(), zero_grad=lambda m: m),
    # Two optimizers, one per weight, each stepping.
    "two optimizers": dict(update=lambda m: (m.opt.step(), m.opt2.step()),
                           zero_grad=lambda m: (lambda: (m.opt.zero_grad(set_to_none=True),
                                                         m.opt2.zero_grad(set_to_none=True)))),
}


def with_optimizers(model, loop):
    if loop == "two optimizers":
        model.opt = torch.optim.SGD([model.w1], lr=0.5)
        model.opt2 = torch.optim.Adam([model.w2], lr=0.01)
    else:
        model.opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model


@pytest.mark.parametrize("strict", [False, True], ids=["sync-free", "strict"])
@pytest.mark.parametrize("where", list(FAILURES))
@pytest.mark.parametrize("loop", list(LOOPS))
def test_run_step_loops_match_eager(loop, where, strict):
    """Three steps through run_step: a step that keeps, one that fails where `where` says (its
    whole step reruns unpaged), and one that keeps again. The parameters after the last step
    equal the same loop's without paging, bit for bit."""
    options = LOOPS[loop]
    data = batches()
    failures = [(), FAILURES[where], ()]
    eager, paged = with_optimizers(Experts(), loop), with_optimizers(Experts(), loop)
    run_step_loop(eager, None, data, failures, options["update"], options["zero_grad"], options.get("skip", ()))
    pool = ps.PagePool(device_pages=4096, page_bytes=4096, strict=strict)
    run_step_loop(paged, pool, data, failures, options["update"], options["zero_grad"], options.get("skip", ()))
    assert same(paged, eager)
    assert pool.totals == dict(steps=STEPS, overflowed_steps=int(bool(failures[1])), reruns=int(bool(failures[1])),
                               unpaged_streak=0)
    assert pool.pages_in_use() == 0


# ---- A loop of one's own: begin_step() ... decide() ----------------------------------------------


def own_loop(model, pool, data, failures):
    """The documented loop without run_step: begin_step(), the microbatches, end_step() and
    one decide(); on a rerun decision, reset, zero and rerun the whole step unpaged."""
    for s, batch in enumerate(data):
        model.opt.zero_grad(set_to_none=True)
        if pool is not None:
            pool.begin_step()
        for i, (x, counts) in enumerate(batch):
            if pool is None:
                loss = model(x, counts)
            else:
                with ps.paged_saved_tensors(pool) as paging:
                    loss = forward(model, x, counts, paging, pool, i in failures[s])
            loss.backward()
        if pool is not None:
            pool.end_step()
            if pool.decide() != "keep":
                pool.reset()
                model.opt.zero_grad(set_to_none=True)
                for x, counts in batch:
                    model(x, counts).backward()
        model.opt.step()


@pytest.mark.parametrize("where", list(FAILURES))
def test_a_loop_of_ones_own_that_decides_once_per_step_matches_eager(where):
    data = batches()
    failures = [(), FAILURES[where], ()]
    eager, paged = with_optimizers(Experts(), "own"), with_optimizers(Experts(), "own")
    own_loop(eager, None, data, failures)
    pool = ps.PagePool(device_pages=4096, page_bytes=4096, strict=False)
    own_loop(paged, pool, data, failures)
    assert same(paged, eager)


def strict_1f1b_loop(model, pool, data, failed_after):
    """1F1B by hand (forward i, then backward i - 1) on a strict pool, the losses kept by the loop
    until the step is decided: the step's stashes run out of room after microbatch `failed_after[s]`
    of step s stashed, the next backward raises and the loop catches it. Returns each step's flags
    at decide() and its decision."""
    seen = []
    for s, batch in enumerate(data):
        model.opt.zero_grad(set_to_none=True)
        pool.begin_step()
        losses = []
        try:
            for i, (x, counts) in enumerate(batch):
                with ps.paged_saved_tensors(pool) as paging:
                    losses.append(model(x, counts, paging=paging))
                if i == failed_after[s]:
                    overflow(pool)
                if i:
                    losses[i - 1].backward()
            losses[-1].backward()
        except ps.PagingError:
            pass
        pool.end_step()
        flags = [n for n, v in pool.flag_dict().items() if v]
        seen.append((flags, pool.decide()))
        losses.clear()  # what the error cut short: its pages back before the reset
        if seen[-1][1] != "keep":
            pool.reset()
            model.opt.zero_grad(set_to_none=True)
            for x, counts in batch:
                model(x, counts).backward()
        model.opt.step()
    return seen


def test_a_strict_loop_of_ones_own_that_catches_the_error_decides_to_rerun():
    """The PagingError cuts the step short: microbatch 1's backward never runs, so its pages are
    still held at end_step (unbalanced). That is the error's consequence, not a bug: decide() says
    'rerun_without_paging', the error's decision (it said 'report_error'), and the loop matches eager."""
    data = batches()
    eager, paged = with_optimizers(Experts(), "own"), with_optimizers(Experts(), "own")
    own_loop(eager, None, data, [(), (), ()])
    pool = ps.PagePool(device_pages=4096, page_bytes=4096)  # a CPU pool: strict
    seen = strict_1f1b_loop(paged, pool, data, failed_after=[None, 1, None])
    assert seen == [([], "keep"), (["overflow", "error", "unbalanced"], "rerun_without_paging"), ([], "keep")]
    assert same(paged, eager) and pool.totals["overflowed_steps"] == 1 and pool.pages_in_use() == 0


# ---- Deciding per microbatch: refused ------------------------------------------------------------


def per_microbatch_loop(model, pool, batch, failures, begin):
    """The misuse: decide() after each microbatch, and on a rerun decision zero the gradients
    and rerun that microbatch alone (the earlier ones' gradients are lost)."""
    model.opt.zero_grad(set_to_none=True)
    if begin:
        pool.begin_step()
    for i, (x, counts) in enumerate(batch):
        with ps.paged_saved_tensors(pool) as paging:
            loss = forward(model, x, counts, paging, pool, i in failures)
        loss.backward()
        pool.end_step()
        if pool.decide() != "keep":
            pool.reset()
            model.opt.zero_grad(set_to_none=True)
            model(x, counts).backward()
    model.opt.step()


@pytest.mark.parametrize("begin", [True, False], ids=["begin_step", "no begin_step"])
@pytest.mark.parametrize("where", list(FAILURES))
def test_deciding_per_microbatch_is_refused_whatever_fails(where, begin):
    """Refused at once, on the first step, failure or not: with begin_step() at the second
    microbatch's context (after the step's decide), without it at the first decide()."""
    data = batches(1)[0]
    pool = ps.PagePool(device_pages=4096, page_bytes=4096, strict=False)
    model = with_optimizers(Experts(), "own")
    before = [p.detach().clone() for p in model.parameters()]
    match = (r"a paged context after this step's decide\(\): deciding per microbatch is refused" if begin else
             r"pool.decide\(\) outside a step: .* Call pool.begin_step\(\) before each optimizer step's first")
    with pytest.raises(RuntimeError, match=match):
        per_microbatch_loop(model, pool, data, FAILURES[where], begin)
    # Refused before any optimizer step: the parameters are as they were.
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert finite_grads(model) or FAILURES[where]  # a refused paged run may hold its own poisoned gradients


def test_a_second_decide_with_nothing_paged_between_decides_the_same_step():
    """decide(), agree() (here: another rank's flag), decide() again: one step, counted once,
    with the later decision."""
    pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=False)
    pool.begin_step()
    assert pool.decide() == "keep"
    overflow(pool)
    assert pool.decide() == "rerun_without_paging"
    assert pool.totals == dict(steps=1, overflowed_steps=1, reruns=0, unpaged_streak=1)
    pool.reset()
    pool.begin_step()
    assert pool.decide() == "keep" and pool.totals["steps"] == 2 and pool.totals["overflowed_steps"] == 1


def test_an_unpaged_rerun_by_hand_leaves_the_pool_free_for_the_next_step():
    """PagedStep(pool, paged=False), as docs/python.md writes the rerun by hand: no finish()
    needed, and the next PagedStep(pool) opens."""
    pool = ps.PagePool(device_pages=64, page_bytes=4096, strict=False)
    step = ps.PagedStep(pool)
    overflow(pool)
    assert step.finish() == "rerun_without_paging"
    pool.reset()
    rerun = ps.PagedStep(pool, paged=False)
    with rerun.paging() as paging:
        assert paging.mark(torch.ones(2), torch.ones(1, dtype=torch.int32)) is not None
    assert ps.PagedStep(pool).finish() == "keep"
