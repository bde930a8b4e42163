"""The step: gradient accumulation over microbatches, with the whole step rerun when paging
fails in any of them. The oracle is plain eager PyTorch running the same microbatches in the
same order (gradients accumulate in backward order, so they must match bit for bit)."""

import pytest
import torch

import pagestash as ps
from _ranks import run_ranks

E, C, H, F = 4, 64, 64, 128


class Experts(torch.nn.Module):
    """bmm -> SiLU -> bmm over capacity-padded [E, C, H] buffers, each activation marked."""

    def __init__(self, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.nn.Parameter((torch.randn(E, H, F, generator=g) * H**-0.5).to(torch.bfloat16))
        self.w2 = torch.nn.Parameter((torch.randn(E, F, H, generator=g) * F**-0.5).to(torch.bfloat16))

    def forward(self, x, counts, paging=None):
        mark = (lambda t: t) if paging is None else (lambda t: paging.mark(t, counts))
        h = mark(torch.bmm(mark(x), self.w1))
        return torch.bmm(mark(torch.nn.functional.silu(h)), self.w2).float().square().mean()


def microbatches(seed=5, n=3):
    """Random non-zero inputs; the second microbatch's experts are the fullest."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        counts = torch.randint(C // 4 if i == 1 else 1, C // 2 if i != 1 else C + 1, (E,), generator=g,
                               dtype=torch.int32)
        x = torch.randn(E, C, H, generator=g).to(torch.bfloat16)
        for e in range(E):  # rows past an expert's count are dead: as a dispatch leaves them
            x[e, counts[e]:] = 0
        out.append((x, counts))
    return out


def eager_grads(model, batch, order):
    model.zero_grad(set_to_none=True)
    losses = {}
    for kind, i in order:
        if kind == "f":
            losses[i] = model(*batch[i])
        else:
            losses.pop(i).backward()
    return [p.grad.clone() for p in model.parameters()]


def step_fn(model, batch, order, seen=None):
    """The step as run_step takes it: forwards in step.paging(), backwards outside, in `order`."""

    def run(step):
        if seen is not None:
            seen.append(step.paged)
        losses = {}
        for kind, i in order:
            if kind == "f":
                with step.paging() as paging:
                    losses[i] = model(*batch[i], paging=paging)
            else:
                losses.pop(i).backward()

    return run


LIFO = [("f", 0), ("b", 0), ("f", 1), ("b", 1), ("f", 2), ("b", 2)]
ONE_F_ONE_B = [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("b", 2)]


def pages_of(batch, i, page_bytes=4096):
    """The pages microbatch i's stashes take (measured on a large pool)."""
    pool = ps.PagePool(device_pages=4096, page_bytes=page_bytes)
    with ps.paged_saved_tensors(pool) as paging:
        loss = Experts()(*batch[i], paging=paging)
    pages = pool.pages_in_use()
    loss.backward()
    return pages


@pytest.mark.parametrize("order", [LIFO, ONE_F_ONE_B], ids=["lifo", "1f1b"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "sync-free"])
def test_an_overflow_in_the_second_microbatch_reruns_the_whole_step_bit_identically(order, strict):
    batch = microbatches()
    p0, p1 = pages_of(batch, 0), pages_of(batch, 1)
    assert p1 > p0
    pool = ps.PagePool(device_pages=p0, page_bytes=4096, strict=strict)  # microbatch 0 fits, 1 does not
    eager, paged = Experts(), Experts()
    want = eager_grads(eager, batch, order)
    seen = []
    assert ps.run_step(pool, step_fn(paged, batch, order, seen), paged) == "rerun"
    assert seen == [True, False]  # the paged run, then the unpaged rerun
    for a, p in zip(want, paged.parameters()):
        assert torch.equal(a, p.grad)
    # The pool is clean for the next step, which is paged when it fits.
    assert pool.pages_in_use() == 0 and not any(pool.flag_dict().values())
    small = [batch[0], batch[0], batch[2]]
    want = eager_grads(eager, small, LIFO)
    assert ps.run_step(pool, step_fn(paged, small, LIFO), paged) == "paged"
    for a, p in zip(want, paged.parameters()):
        assert torch.equal(a, p.grad)


def test_strict_mode_says_what_the_gradients_hold_when_it_raises():
    batch = microbatches()
    pool = ps.PagePool(device_pages=pages_of(batch, 0), page_bytes=4096)
    model = Experts()
    pool.begin_step()
    for i in (0, 1):
        with ps.paged_saved_tensors(pool) as paging:
            loss = model(*batch[i], paging=paging)
        if i == 0:
            loss.backward()
    with pytest.raises(ps.PagingError, match=r"2 paged context\(s\) ran in this step, and the gradients "
                                             r"hold the backward of every microbatch that finished .*run_step"):
        loss.backward()


# Two paged branches: when backward reloads one, autograd has already queued the other's node,
# which holds the hook. A raise in the middle of backward left it queued until the thread's next
# backward; with none, torch freed it after Python had shut down: SIGSEGV at exit (issue 55).
STRICT_FAILURE_AT_EXIT = """
import sys, torch, pagestash as ps
g = torch.Generator().manual_seed(0)
w1, w2 = (torch.randn(4, 64, 64, generator=g).bfloat16().requires_grad_() for _ in range(2))
pool = ps.PagePool(4, page_bytes=4096)  # a CPU pool: strict
counts = torch.full((4,), 32, dtype=torch.int32)
with ps.paged_saved_tensors(pool) as paging:
    a = paging.mark(torch.randn(4, 32, 64, generator=g).bfloat16(), counts)
    b = paging.mark(torch.randn(4, 32, 64, generator=g).bfloat16(), counts)  # no room
    loss = torch.bmm(a, w1).float().sum() + torch.bmm(b, w2).float().sum()
if sys.argv[1] == "uncaught":
    loss.backward()
try:
    loss.backward()
except ps.PagingError as e:
    print("caught", e.flags, pool.pages_in_use())
"""


@pytest.mark.parametrize("mode", ["caught", "uncaught"])
def test_a_strict_failure_in_backward_leaves_nothing_that_crashes_at_exit(mode):
    """The strict raise comes at the end of the backward, once autograd has run every node of it:
    no node holding the hook is left queued, and the interpreter exits as usual (it was SIGSEGV,
    exit 139, caught or not)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STRICT_FAILURE_AT_EXIT, mode], capture_output=True, text=True,
                          timeout=300)
    if mode == "caught":
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "caught ['overflow'] 0\n"  # every reload ran: every page back
    else:
        assert done.returncode == 1, done.stderr[-2000:]
        assert "pagestash.errors.PagingError: pagestash: paging failed at the reload of" in done.stderr


def test_a_strict_failure_raises_at_the_end_of_its_backward_which_returns_every_page():
    """The first failure's PagingError, raised once backward has run every node: the reloads after
    it poison (NaN gradients, never finite wrong ones) and return their pages."""
    batch = microbatches()
    pool = ps.PagePool(device_pages=pages_of(batch, 0) - 1, page_bytes=4096)  # microbatch 0 does not fit
    model = Experts()
    pool.begin_step()
    with ps.paged_saved_tensors(pool) as paging:
        loss = model(*batch[0], paging=paging)
    assert pool.pages_in_use() > 0
    with pytest.raises(ps.PagingError, match=r"paging failed at the reload of marked tensor #\d .*\(overflow") as e:
        loss.backward()
    assert e.value.flags == ["overflow"] and e.value.decision == "rerun_without_paging"
    assert pool.pages_in_use() == 0 and pool.flag_dict()["unbalanced"] == 0
    assert all(p.grad is not None for p in model.parameters())  # backward ran to its end
    assert model.w2.grad.isnan().all()  # from the SiLU output that found no room: poisoned
    pool.end_step()
    assert pool.decide() == "rerun_without_paging"


def test_an_open_step_refuses_the_pools_own_decide_and_reset():
    pool = ps.PagePool(device_pages=64, page_bytes=4096)
    step = ps.PagedStep(pool)
    with pytest.raises(RuntimeError, match=r"pool.decide\(\) inside an open step"):
        pool.decide()
    with pytest.raises(RuntimeError, match=r"pool.reset\(\) inside an open step"):
        pool.reset()
    with pytest.raises(RuntimeError, match="already has an open step"):
        ps.PagedStep(pool)
    assert step.finish() == "keep" and not step.must_rerun
    with pytest.raises(RuntimeError, match="this step is finished"):
        step.paging()
    assert pool.decide() == "keep"  # closed: the pool's own again


def test_a_misuse_reruns_with_a_warning_naming_the_flag():
    batch = microbatches()
    x, counts = batch[0]
    bad = [(x, torch.tensor([C + 1, 1, 1, 1], dtype=torch.int32))] + batch[1:]  # more rows than the capacity
    pool = ps.PagePool(device_pages=4096, page_bytes=4096, strict=False)
    eager, paged = Experts(), Experts()
    want = eager_grads(eager, [(x, bad[0][1].clamp(max=C))] + batch[1:], LIFO)

    def run(step):
        for i, (xi, ci) in enumerate(bad):
            with step.paging() as paging:
                loss = paged(xi, ci.clamp(max=C) if not step.paged else ci, paging=paging)
            loss.backward()

    with pytest.warns(ps.PagingWarning, match="bad_counts"):
        assert ps.run_step(pool, run, paged) == "rerun"
    for a, p in zip(want, paged.parameters()):
        assert torch.equal(a, p.grad)



def test_the_step_as_docs_python_md_shows_it():
    (x0, counts0), (x1, counts1), (x2, counts2) = microbatches()
    pool = ps.PagePool(device_pages=pages_of(microbatches(), 0), page_bytes=4096, strict=False)
    model, eager = Experts(), Experts()
    want = eager_grads(eager, microbatches(), ONE_F_ONE_B)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # [step]
    def microbatches_of_the_step(step):  # one optimizer step: three microbatches, 1F1B order
        with step.paging() as paging:  # each microbatch's forward in its own context
            loss0 = model(x0, counts0, paging=paging)
        with step.paging() as paging:
            loss1 = model(x1, counts1, paging=paging)
        loss0.backward()  # backward outside the contexts, gradients accumulating
        with step.paging() as paging:
            loss2 = model(x2, counts2, paging=paging)
        loss1.backward()
        loss2.backward()

    how = ps.run_step(pool, microbatches_of_the_step, opt)  # 'paged', or 'rerun': failed, rerun unpaged
    assert how == "rerun"  # this pool holds microbatch 0 alone: microbatch 1's stashes found no room
    opt.step()
    # [step]
    assert all(torch.equal(a, p) for a, p in zip(want, (p.grad for p in model.parameters())))


def _rank(rank, world, init_file, results):
    """One rank's step: its own pool (rank 1's holds microbatch 0 alone), the flags agreed
    inside run_step because torch.distributed is initialised."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    batch = microbatches(seed=5)
    pool = ps.PagePool(device_pages=pages_of(batch, 0) if rank == 1 else 4096, page_bytes=4096, strict=False)
    eager, paged = Experts(), Experts()
    want = eager_grads(eager, batch, ONE_F_ONE_B)
    how = ps.run_step(pool, step_fn(paged, batch, ONE_F_ONE_B), paged)
    same = all(torch.equal(a, p.grad) for a, p in zip(want, paged.parameters()))
    results.put((rank, how, same))
    torch.distributed.destroy_process_group()


def test_every_rank_reruns_when_one_fails(tmp_path):
    got = run_ranks(_rank, 3, tmp_path / "init")
    assert got == [(0, "rerun", True), (1, "rerun", True), (2, "rerun", True)]


def test_deciding_alone_then_agreed_is_not_a_misuse():
    """decide(), agree(), decide() again with no paged work between: the same step."""
    batch = microbatches()
    pool = ps.PagePool(device_pages=pages_of(batch, 0), page_bytes=4096, strict=False)
    model = Experts()
    pool.begin_step()
    with ps.paged_saved_tensors(pool) as paging:
        loss = model(*batch[0], paging=paging)
    loss.backward()
    assert pool.decide() == "keep"
    pool.flags[ps.FLAG_NAMES.index("overflow")] = 1  # what agree() brings from another rank
    assert pool.decide() == "rerun_without_paging"
