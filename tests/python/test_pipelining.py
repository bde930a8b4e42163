"""Pipeline parallelism with PyTorch's own engine (torch.distributed.pipelining), over Gloo on
the CPU with 2 and 4 spawned ranks: an 8-layer MoE split into stages, every schedule class
the engine offers, paged through PipelinePaging and checked against the same pipeline
unpaged, bit for bit; an overflow on one rank reruns the step on every rank (strict and
not); deciding without agreement is an error; the sizer's stashes held at the peak, from the
engine's own order (pipeline_schedule), equal the pool's, rank by rank."""

import datetime
import tempfile

import pytest
import torch

import pagestash as ps
from _ranks import run_ranks

pytest.importorskip("numpy", reason="SKIPPED: torch.distributed.pipelining needs numpy")
S = pytest.importorskip("torch.distributed.pipelining.schedules")
from torch.distributed.pipelining import PipelineStage  # noqa: E402

E, H, C, T, LAYERS = 4, 16, 8, 8, 8  # experts, hidden, capacity, tokens per microbatch, layers
PAGE = 1024  # a layer's stash (at most E x C rows of 32 bytes) takes one page
SAVED = [("bf16/capacity", ps.Shape(E, C, H))]

#: name -> (class, stages per rank, V-shaped)
SCHEDULES = {"GPipe": (S.ScheduleGPipe, 1, False), "1F1B": (S.Schedule1F1B, 1, False),
             "Interleaved1F1B": (S.ScheduleInterleaved1F1B, 2, False), "LoopedBFS": (S.ScheduleLoopedBFS, 2, False),
             "InterleavedZeroBubble": (S.ScheduleInterleavedZeroBubble, 2, False),
             "ZBVZeroBubble": (S.ScheduleZBVZeroBubble, 2, True), "DualPipeV": (S.ScheduleDualPipeV, 2, True)}


class Layer(torch.nn.Module):
    """A top-1 MoE layer whose capacity buffer is marked (pagestash.mark: paged in a stage's
    paged context, as it is elsewhere)."""

    def __init__(self, g):
        super().__init__()
        self.router = torch.nn.Parameter(torch.randn(H, E, generator=g))
        self.w = torch.nn.Parameter((torch.randn(E, H, H, generator=g) * H**-0.5).bfloat16())
        self.seen = []  # counts of each paged forward

    def forward(self, x):
        probs = torch.softmax(x @ self.router, dim=-1)
        weight, e = probs.max(-1)
        onehot = torch.nn.functional.one_hot(e, E)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        kept = (slot < C).nonzero().squeeze(1)
        counts = onehot.sum(0).clamp(max=C).to(torch.int32)
        buf = x.new_zeros(E, C, H, dtype=torch.bfloat16).index_put((e[kept], slot[kept]), x[kept].bfloat16())
        if ps.hooks._contexts():  # a paged forward (not the engine's shape probe)
            self.seen.append(counts)
        y = torch.bmm(ps.mark(buf, counts), self.w)[e[kept], slot[kept]].float() * weight[kept, None]
        return x + torch.zeros_like(x).index_add(0, kept, y)


def stage_indices(name, world, rank):
    _, v, v_shape = SCHEDULES[name]
    return [rank, 2 * world - 1 - rank] if v_shape else [rank + world * k for k in range(v)]


def build(name, world, rank, microbatches):
    """This rank's stages of a fresh 8-layer model (the same on every rank and every build)."""
    cls, v, _ = SCHEDULES[name]
    g = torch.Generator().manual_seed(0)
    layers = [Layer(g) for _ in range(LAYERS)]
    n = world * v
    per = LAYERS // n
    idx = stage_indices(name, world, rank)
    mods = [torch.nn.Sequential(*layers[i * per:(i + 1) * per]) for i in idx]
    stages = [PipelineStage(m, i, n, torch.device("cpu")) for m, i in zip(mods, idx)]
    loss = lambda out, target: torch.nn.functional.mse_loss(out, target)  # noqa: E731
    schedule = cls(stages[0] if v == 1 else stages, n_microbatches=microbatches, loss_fn=loss)
    params = [p for m in mods for p in m.parameters()]
    return schedule, idx, n, per, params, mods


def step_args(idx, n, microbatches, seed=1):
    g = torch.Generator().manual_seed(seed)
    x, target = torch.randn(microbatches * T, H, generator=g), torch.randn(microbatches * T, H, generator=g)
    args = (x,) if 0 in idx else ()
    kwargs = dict(target=target, losses=[]) if n - 1 in idx else {}
    return args, kwargs


def zero(params):
    def clear():
        for p in params:
            p.grad = None
    return clear


def one_case(name, microbatches, world, rank, pages=256, strict=None, observe=False):
    """The step unpaged and paged on fresh, equal models: (how, grads equal, pages held after,
    the pool's peak, the sizer's peak from the engine's order, observed rows in order)."""
    plain, idx, n, per, plain_params, _ = build(name, world, rank, microbatches)
    args, kwargs = step_args(idx, n, microbatches)
    plain.step(*args, **kwargs)
    schedule, idx, n, per, params, mods = build(name, world, rank, microbatches)
    pool = ps.PagePool(pages, page_bytes=PAGE, strict=strict)
    if observe:
        pool.observe(1)
    paging = ps.PipelinePaging(pool, schedule)
    args, kwargs = step_args(idx, n, microbatches)
    how = paging.run_step(*args, zero_grad=zero(params), **kwargs)
    same = all(torch.equal(a.grad, b.grad) for a, b in zip(plain_params, params))
    sized = ps.size_pool(SAVED, counts=[[1] * E], samples=10, page_bytes=PAGE,
                         schedule=ps.pipeline_schedule(schedule, rank, per)).alive_stashes
    in_order = None
    if observe:  # the rows by (microbatch, layer), the rank's layers stage by stage
        layers = [layer for m in mods for layer in m]
        want = torch.stack([layer.seen[mb] for mb in range(microbatches) for layer in layers])
        in_order = torch.equal(pool.observed_counts()[0], want)
    return how, same, pool.pages_in_use(), pool.stats()["peak_pages_held"], sized, in_order, weights_pending(schedule, rank)


def weights_pending(schedule, rank):
    """The most (stage, microbatch) input backwards whose weight backward has not run: each
    holds its reloaded tensors at full size (docs/python.md, "Zero-bubble schedules")."""
    pending, most = set(), 0
    for action in schedule.pipeline_order[rank]:
        for a in (action.sub_actions or [action]) if action is not None else []:
            kind, key = a.computation_type.name, (a.stage_index, a.microbatch_index)
            if kind == "BACKWARD_INPUT":
                pending.add(key)
            elif kind == "BACKWARD_WEIGHT":
                pending.discard(key)
            most = max(most, len(pending))
    return most


def cases(world):
    if world == 2:
        return [(name, m) for name in SCHEDULES for m in (2, 3, 4, 8) if not (name == "DualPipeV" and m < 2 * world)]
    return [("GPipe", 4), ("1F1B", 4), ("1F1B", 8), ("Interleaved1F1B", 6), ("LoopedBFS", 4),
            ("InterleavedZeroBubble", 4), ("ZBVZeroBubble", 8), ("DualPipeV", 8)]


def rank_main(rank, world, init_file, results):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=60))
    out = {}
    for name, m in cases(world):
        out[(name, m)] = one_case(name, m, world, rank, observe=(m == 3 or world == 4))
    # An overflow on the last rank alone (1 page: it holds 2 stashes at once), strict and not: every rank reruns.
    for strict in (True, False):
        out[("overflow", strict)] = one_case("1F1B", 4, world, rank, pages=1 if rank == world - 1 else 256,
                                             strict=strict)
    # Deciding alone on one of several ranks: refused.
    pool = ps.PagePool(4, page_bytes=PAGE)
    pool.begin_step()
    pool.end_step()
    try:
        pool.decide()
        out["alone"] = "decided"
    except RuntimeError as e:
        out["alone"] = str(e)
    pool.agree()
    out["agreed"] = pool.decide()
    torch.distributed.destroy_process_group()
    results.put((rank, out))


@pytest.mark.parametrize("world", [2, 4])
def test_every_schedule_of_the_engine_pages_bit_identical_reruns_together_and_is_sized_from_its_order(world):
    with tempfile.NamedTemporaryFile() as f:
        ranks = run_ranks(rank_main, world, f.name + ".init")
    for rank, out in ranks:
        for (name, m) in cases(world):
            how, same, held, peak, sized, in_order, pending = out[(name, m)]
            where = f"rank {rank}, {name} with {m} microbatches"
            assert how == "paged" and same and held == 0, (where, how, same, held)
            assert peak == sized, f"{where}: the pool held {peak} stashes at once, the sizer says {sized}"
            assert in_order in (None, True), f"{where}: observed_counts() not in microbatch x layers + layer order"
            split = name in ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
            assert (pending > 0) == split or (name == "DualPipeV" and rank > 0), (where, pending)
        for strict in (True, False):
            how, same, held, _, _, _, _ = out[("overflow", strict)]
            assert how == "rerun" and same and held == 0, (rank, strict, how, same, held)
        assert "without pool.agree()" in out["alone"] and out["agreed"] == "keep"


def test_pipeline_schedule_is_the_engines_order_and_the_sizer_refuses_a_bad_one():
    class Action:
        def __init__(self, stage, kind, mb):
            self.stage_index, self.microbatch_index = stage, mb
            self.computation_type = S._ComputationType[kind]

    class Fake:
        pipeline_order = {0: [Action(0, "FORWARD", 0), Action(2, "FORWARD", 0), None, Action(2, "BACKWARD_INPUT", 0),
                              Action(2, "BACKWARD_WEIGHT", 0), Action(0, "FULL_BACKWARD", 0)]}

    assert ps.pipeline_schedule(Fake(), 0, {0: 1, 2: 2}) == "order:S0.0,S1.0,S2.0,R2.0,R1.0,R0.0"
    with pytest.raises(ValueError, match="no action order for rank 1"):
        ps.pipeline_schedule(Fake(), 1)
    for bad, match in (("order:S0.0,S0.0,R0.0", "stashed twice"), ("order:R0.0", "reloaded before its stash"),
                       ("order:S0.0", "never reloaded"), ("order:S0.x,R0.0", "is not S<layer>")):
        with pytest.raises(ValueError, match=match):
            ps.size_pool(SAVED, counts=[[1] * E], samples=10, page_bytes=PAGE, schedule=bad)


def single_rank_main(rank, world, init_file, results):
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=60))
    out = {}
    for name in ("GPipe", "Interleaved1F1B"):
        out[name] = one_case(name, 4, world, rank, pages=1, strict=True)[:3]
    torch.distributed.destroy_process_group()
    results.put((rank, out))


def test_one_rank_strict_reruns_through_the_engines_wrapped_error_and_its_kept_losses():
    """On one rank a strict pool raises in the middle of backward, inside the engine, which
    wraps the PagingError and keeps the failed run's losses: the step reruns, bit-identical."""
    with tempfile.NamedTemporaryFile() as f:
        [(_, out)] = run_ranks(single_rank_main, 1, f.name + ".init")
    for name, (how, same, held) in out.items():
        assert how == "rerun" and same and held == 0, (name, how, same, held)
