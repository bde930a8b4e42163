"""pagestash.size_pool (the C++ sizer, pagestash/sizing.hpp): its pages against the package's
own stashes, reproducibility, its errors, and its overflow probability against real stashes."""

import pytest
import torch

import pagestash as ps
from test_ops import buffers_for

SEED = 4321

# Many pools here are sized that save little on purpose (test_sizing.py tests the warning).
pytestmark = pytest.mark.filterwarnings("ignore::pagestash.PoolCostWarning")


def layer_shape(recipe, groups=4):
    """A shape the sizer takes for the recipe: 2 token granules per expert (a multiple of
    the count alignment), the packed buffer holding `groups` experts at that capacity."""
    info = ps.recipe_info(recipe, ps.Shape(groups, 0, 64))
    align = max(info["granule"], info["count_alignment"])
    capacity = 2 * align
    return ps.Shape(groups, groups * capacity if info["packed"] else capacity, 64), capacity, info["count_alignment"]


def stashed_pages(pool, saved, counts, gen):
    """Pages the package's stashes of `counts` take, one record per (recipe, shape)."""
    pages = 0
    for recipe, shape in saved:
        data, scales, amax, _ = buffers_for(recipe, shape, gen)
        rec = pool.record(recipe, shape)
        rec.stash(data, counts, scales, amax)
        status = rec.status()
        assert status["state"] == "stashed", status
        pages += status["pages"]
    return pages


@pytest.mark.parametrize("recipe", [r for r in ps.recipes() if r != "plain"])
def test_sized_pages_are_the_stash_pages_for_a_fixed_count_vector(recipe):
    """One measured count vector: every sampled step takes the same pages, so the sized pool
    is exactly what the package's stashes of that vector take (4 stashes: 2 layers x 2
    microbatches of a layer saving two tensors of the recipe)."""
    gen = torch.Generator().manual_seed(SEED)
    shape, capacity, align = layer_shape(recipe)
    wide = ps.Shape(shape.groups, shape.tokens, 192)
    saved = [(recipe, shape), (recipe, wide)]
    counts = (torch.randint(0, capacity // align + 1, (shape.groups,), generator=gen) * align).to(torch.int32)
    counts[0] = capacity  # one full expert, one empty
    counts[1] = 0
    sizing = ps.size_pool(saved, counts=[counts.tolist()], layers=2, microbatches=2, page_bytes=1024, samples=16)
    pool = ps.PagePool(device_pages=4096, page_bytes=1024, strict=True)
    per_layer = stashed_pages(pool, saved, counts, gen)
    assert per_layer > 0
    assert sizing.pages == sizing.device_pages == 4 * per_layer
    assert sizing.pages_interval == (sizing.pages, sizing.pages)
    assert sizing.overflow_probability == 0
    assert sizing.alive_stashes == 4 and sizing.schedule == "lifo"
    # The pool it makes holds exactly those stashes, and one page less does not.
    for pages, fits in ((sizing.pages, True), (sizing.pages - 1, False)):
        pool = ps.PagePool(device_pages=pages, page_bytes=1024, strict=False)
        for _ in range(4):
            for recipe_, shape_ in saved:
                data, scales, amax, _ = buffers_for(recipe_, shape_, gen)
                pool.record(recipe_, shape_).stash(data, counts, scales, amax)
        assert (pool.decide() == "keep") == fits, (pages, pool.flag_dict())


def test_sizing_for_the_example_block_from_a_router_model():
    experts, tokens, hidden, ffn = 8, 256, 256, 512  # examples/torch/moe_example.py's block
    capacity = 2 * tokens // experts  # capacity factor 2
    saved = [("bf16/capacity", ps.Shape(experts, capacity, hidden)),  # the dispatched input
             ("bf16/capacity", ps.Shape(experts, capacity, ffn)),  # the first GEMM's output
             ("bf16/capacity", ps.Shape(experts, capacity, ffn))]  # its SiLU
    sizing = ps.size_pool(saved, tokens=tokens, top_k=1, alpha=1.0,  # its router: Dirichlet(1), top-1
                        layers=1, microbatches=1, overflow=1e-3, page_bytes=4096, seed=1)
    print(sizing)
    pool = sizing.pool(device="cpu")  # a PagePool of sizing.device_pages pages of sizing.page_bytes
    assert pool.device_pages == sizing.device_pages == sizing.pages and pool.page_bytes == 4096
    assert sizing.pages_interval[0] <= sizing.pages <= sizing.pages_interval[1]
    assert sizing.overflow_probability <= 1e-3 and 0 < sizing.saved_fraction < 1
    assert sizing.bytes == sizing.pages * 4096 < sizing.full_bytes
    assert [p.pages for p in sizing.curve] == sorted(p.pages for p in sizing.curve)
    assert sizing.curve[0].overflow == 1 and sizing.curve[-1].overflow == 0


def test_a_fixed_seed_reproduces_the_plan():
    saved = [("mxfp8/capacity/swizzled", ps.Shape(16, 128, 256))]
    args = dict(schedule="1f1b:4", layers=2, microbatches=8, tokens=512, top_k=2, alpha=0.5, samples=2000)
    a, b = ps.size_pool(saved, seed=7, **args), ps.size_pool(saved, seed=7, **args)
    assert a == b
    assert a.alive_stashes == 2 * 4
    other = ps.size_pool(saved, seed=8, **args)
    assert other.curve != a.curve  # the samples depend on the seed


def test_counts_as_a_tensor_are_a_measured_count_model():
    saved = [("bf16/capacity", ps.Shape(4, 64, 128))]
    measured = torch.tensor([[64, 0, 10, 3], [0, 64, 64, 64], [100, 1, 2, 3]], dtype=torch.int32)
    one_stash = dict(layers=1, microbatches=1, page_bytes=4096)
    sizing = ps.size_pool(saved, counts=measured, cap_counts=True, overflow=0.01, samples=3000, **one_stash)
    assert "3 measured count vectors" in sizing.count_model
    one = ps.size_pool(saved, counts=[[0, 64, 64, 64]], samples=10, **one_stash)
    assert sizing.pages == one.pages  # the largest vector's pages; 100 is capped at the capacity 64
    with pytest.raises(ValueError, match="vector 3, expert 0: count 100 exceeds the capacity 64"):
        ps.size_pool(saved, counts=measured, page_bytes=4096, samples=10)  # refused unless capped


def test_defaults_are_the_commands():
    assert ps.sizing.DEFAULTS["layers"] == 4 and ps.sizing.DEFAULTS["microbatches"] == 8  # pagestash_size --help's
    sizing = ps.size_pool([("bf16/capacity", ps.Shape(4, 64, 128))], tokens=64, top_k=2, samples=10)
    assert sizing.alive_stashes == 4 * 8 and sizing.schedule == "lifo" and sizing.peak_moments == 1


def correlated_steps(gen, steps, stashes, experts, tokens, capacity):
    """A router whose steps are correlated: a step's load (its tokens, from a quarter to all
    of `tokens`) is shared by every stash of it, spread uniformly over the experts."""
    out = []
    for _ in range(steps):
        load = int(torch.randint(tokens // 4, tokens + 1, (1,), generator=gen))
        step = []
        for _ in range(stashes):
            picks = torch.randint(0, experts, (load,), generator=gen)
            step.append(torch.bincount(picks, minlength=experts).clamp(max=capacity).tolist())
        out.append(step)
    return out


def test_whole_steps_keep_their_correlation_and_widen_the_interval(tmp_path):
    """Measured whole steps are drawn a step at a time: a router whose load is shared by a
    step's stashes needs a larger pool than its vectors drawn independently, and the interval includes the
    file's own error (bootstrap over its steps). The same steps from a file size the same."""
    experts, tokens, capacity = 8, 64, 32
    saved = [("bf16/capacity", ps.Shape(experts, capacity, 128))]
    gen = torch.Generator().manual_seed(SEED)
    steps = correlated_steps(gen, 60, 2 * 3, experts, tokens, capacity)
    args = dict(layers=2, microbatches=3, overflow=0.2, page_bytes=1024, samples=4000)
    whole = ps.size_pool(saved, counts=steps, **args)
    flat = ps.size_pool(saved, counts=[v for step in steps for v in step], **args)
    assert "60 measured steps of 6 count vectors" in whole.count_model
    assert whole.bootstrap_replicates == 200
    assert whole.pages > flat.pages  # the correlation kept: a heavy step is heavy in every stash
    mc_low, mc_high = whole.pages_monte_carlo
    low, high = whole.pages_interval
    assert low <= mc_low <= mc_high <= high and high - low > mc_high - mc_low
    path = tmp_path / "steps.txt"
    path.write_text("".join(f"step {i}\n" + "".join(" ".join(map(str, v)) + "  # a vector\n" for v in step)
                            for i, step in enumerate(steps)))
    assert ps.size_pool(saved, counts=str(path), **args).pages == whole.pages
    with pytest.raises(ValueError, match="a measured step holds 6 count vectors, a step of the schedule 8"):
        ps.size_pool(saved, counts=steps, layers=2, microbatches=4, samples=10)


def test_correlation_raises_the_pool_and_keeps_each_stash_dirichlet():
    saved = [("bf16/capacity", ps.Shape(8, 64, 128))]
    args = dict(tokens=256, top_k=2, alpha=1.0, layers=2, microbatches=4, overflow=0.01, page_bytes=1024,
                samples=4000)
    independent = ps.size_pool(saved, **args)
    correlated = ps.size_pool(saved, correlation=0.8, **args)
    assert "correlation 0.8" in correlated.count_model
    assert correlated.pages > independent.pages
    # One stash alone does not see the correlation: the same distribution of pages.
    one = dict(args, layers=1, microbatches=1, samples=20000)
    a, b = ps.size_pool(saved, **one), ps.size_pool(saved, correlation=0.8, **one)
    assert abs(a.mean_pages - b.mean_pages) < 0.02 * a.mean_pages


@pytest.mark.parametrize("kwargs, message", [
    (dict(saved=[("bf16/nope", ps.Shape(4, 64, 128))]), "unknown recipe 'bf16/nope'"),
    (dict(saved=[("mxfp8/capacity/swizzled", ps.Shape(4, 64, 100))]), "hidden"),
    (dict(saved=[("bf16/capacity", ps.Shape(4, 64, 128)), ("bf16/capacity", ps.Shape(4, 32, 128))]),
     "share one capacity"),
    (dict(saved=[("bf16/packed", ps.Shape(3, 64, 128))]), "groups x capacity"),
    (dict(saved=[]), "saved is empty"),
    (dict(saved=[("bf16/capacity", (4, 64, 128))]), r"\(recipe, pagestash.Shape\) pairs"),
    (dict(tokens=None), "give the router"),
    (dict(counts=[[1, 2, 3]]), "3 counts|experts"),
    (dict(counts=[[1, 2, -3, 4]]), "negative"),
    (dict(counts=[[1, 2.5, 3, 4]]), r"counts\[0\]\[1\] = 2.5 is not an integer"),
    (dict(counts=[[1, 2, 3, 4.0]]), r"counts\[0\]\[3\] = 4.0 is not an integer"),
    (dict(counts=[[1, 2, 3, 65]]), "count 65 exceeds the capacity 64"),
    (dict(counts="/nonexistent/counts.txt"), "cannot open counts file"),
    (dict(counts=[[1, 2, 3, 4]], correlation=0.5), "correlation models the Dirichlet router"),
    (dict(counts=torch.ones(2, 4)), "integer"),
    (dict(schedule="zigzag"), "unknown schedule 'zigzag'"),
    (dict(schedule="1f1b:x"), "not a number"),
    (dict(schedule="1f1b:4:"), "'' is not a number"),
    (dict(schedule="list:0,0"), "list:0,0 holds no stash"),
    (dict(correlation=1.5), "correlation"),
    (dict(saved=[("bf16/capacity", ps.Shape(0, 64, 128))]), r"saved\[0\]: Shape.groups \(experts\) = 0"),
    (dict(layers=0), "layers = 0"),
    (dict(overflow=0.0), "overflow must be in"),
    (dict(overflow=1.5), "overflow must be in"),
    (dict(page_bytes=1000), "power of two"),
    (dict(samples=0), "samples"),
    (dict(top_k=9), "top_k"),
    (dict(alpha=-1.0), "alpha"),
    (dict(sampler="gibbs"), "unknown sampler"),
    (dict(capacity=65), "capacity 65 exceeds"),
    (dict(seed=-1), "seed"),
])
def test_bad_arguments_raise_value_error_saying_what(kwargs, message):
    args = dict(saved=[("bf16/capacity", ps.Shape(8, 64, 128))], tokens=256, top_k=2, samples=10)
    args.update(kwargs)
    if "counts" in kwargs:
        args.update(saved=[("bf16/capacity", ps.Shape(4, 64, 128))], tokens=None)
    if args["tokens"] is None and "counts" not in args:
        args.pop("tokens")
    saved = args.pop("saved")
    with pytest.raises(ValueError, match=message):
        ps.size_pool(saved, **args)


def example_router_counts(gen, experts, tokens, capacity):
    """examples/torch/moe_example.py's router: Dirichlet(1) popularity, each token to one
    expert, counts capped at the capacity."""
    gamma = -torch.log(torch.rand(experts, generator=gen))
    expert = torch.multinomial(gamma / gamma.sum(), tokens, replacement=True, generator=gen)
    return torch.bincount(expert, minlength=experts).clamp(max=capacity).to(torch.int32)


def test_real_stashes_overflow_the_planned_pool_about_as_often_as_planned():
    """The example's router drives real stashes (two microbatches of a layer saving two
    tensors) into a pool sized for 5% overflow and into one of the median peak's size:
    the first overflows in few steps, the second in about half."""
    experts, tokens, hidden = 8, 128, 64
    capacity = 2 * tokens // experts
    saved = [("bf16/capacity", ps.Shape(experts, capacity, hidden)), ("bf16/capacity", ps.Shape(experts, capacity, 128))]
    sizing = ps.size_pool(saved, layers=1, microbatches=2, tokens=tokens, top_k=1, alpha=1.0, sampler="per_token",
                        overflow=0.05, page_bytes=1024, samples=4000, seed=3)
    median = next(p.pages for p in sizing.curve if p.overflow <= 0.5)
    gen = torch.Generator().manual_seed(SEED)
    steps = 200
    overflowed = {sizing.device_pages: 0, median: 0}
    sources = {shape: torch.zeros(shape.groups, shape.tokens, shape.hidden, dtype=torch.bfloat16) for _, shape in saved}
    for _ in range(steps):
        counts = [example_router_counts(gen, experts, tokens, capacity) for _ in range(2)]
        for pages in overflowed:
            pool = ps.PagePool(device_pages=pages, page_bytes=1024, strict=False)
            for c in counts:
                for recipe, shape in saved:
                    pool.record(recipe, shape).stash(sources[shape], c)
            overflowed[pages] += pool.decide() != "keep"
    assert median < sizing.device_pages
    assert overflowed[sizing.device_pages] <= 0.05 * steps * 3, overflowed  # 10 expected; 30 is far out
    assert 0.25 * steps <= overflowed[median] <= 0.75 * steps, overflowed
