"""paged_saved_tensors in a training loop, on CPU tensors: reload prefetch (`prefetch=N`),
the stashes whose backward runs next kept unpaged (`skip_next=K`) and torch.utils.checkpoint,
over several layers and microbatches in lifo and 1F1B orders, against eager PyTorch bit for
bit. A recorder stands in for the side stream: a prefetched reload runs only when an unpack
waits on its event (or a later one), into poisoned buffers, so that a missing or wrong wait
shows in the gradients."""

import warnings

import pytest
import torch

import pagestash as ps
from pagestash import hooks

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and ps.with_cuda),
    reason="SKIPPED: no CUDA device (or pagestash built without CUDA): the side stream's test needs a GPU")

E, C, H, F, LAYERS, MICROBATCHES = 4, 16, 32, 64, 3, 4
ORDERS = {
    "lifo": [(d, m) for m in range(MICROBATCHES) for d in "fb"],
    # 1F1B with two microbatches in flight: forward mb1 before backward mb0, and so on.
    "1f1b": [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("f", 3), ("b", 2), ("b", 3)],
}


class Experts(torch.nn.Module):
    """LAYERS expert layers (bmm, SiLU, bmm) on [experts, capacity, hidden] buffers; each
    layer's input, first GEMM output and SiLU are marked: 3 marked tensors a layer, saved once each
    and needed in backward in reverse order."""

    def __init__(self, seed=7):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        w = lambda *s: torch.nn.Parameter((torch.randn(*s, generator=g) * s[-2] ** -0.5).to(torch.bfloat16))
        self.w1 = torch.nn.ParameterList([w(E, H, F) for _ in range(LAYERS)])
        self.w2 = torch.nn.ParameterList([w(E, F, H) for _ in range(LAYERS)])

    def layer(self, i, x, mark):
        h = mark(torch.bmm(x, self.w1[i]), f"h{i}")
        a = mark(torch.nn.functional.silu(h), f"a{i}")
        return torch.bmm(a, self.w2[i])

    def forward(self, x, counts, paging=None, checkpoint=None, compiled=None):
        def mark(t, name):
            return t if paging is None else paging.mark(t, counts, name=name)

        for i in range(LAYERS):
            x = mark(x, f"x{i}")
            if checkpoint is not None:
                x = torch.utils.checkpoint.checkpoint(self.layer, i, x, mark, use_reentrant=checkpoint)
            elif compiled is not None:
                x = compiled(x, self.w1[i], self.w2[i])
            else:
                x = self.layer(i, x, mark)
        return x


def microbatches(seed=3, device="cpu"):
    """Random non-zero live rows (dead rows zero, as a dispatch leaves them), random counts."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(MICROBATCHES):
        counts = torch.randint(0, C + 1, (E,), generator=g, dtype=torch.int32)
        live = (torch.arange(C)[None, :] < counts[:, None]).unsqueeze(-1)
        x = torch.where(live, torch.randn(E, C, H, generator=g), 0).to(torch.bfloat16)
        target = torch.randn(E, C, H, generator=g).to(torch.bfloat16)
        # x requires grad: a reentrant checkpoint needs an input that does
        out.append((x.to(device).requires_grad_(), counts.to(device), target.to(device)))
    return out


class SideStream:
    """The hook's stream calls (hooks._NoCudaStreams), recorded. A prefetched reload is queued
    and runs when an unpack waits on its event or a later one (a stream runs in order); its
    new buffers are poisoned when issued."""

    def __init__(self, capturing=False):
        self.log, self.queue, self.serial, self._capturing = [], [], 0, capturing

    def capturing(self):
        return self._capturing

    def issue(self, reload, outputs, inputs, name):
        for t in outputs:
            t.view(torch.uint8).fill_(0x5A)
        self.serial += 1
        event = (name, self.serial)
        ptrs = {t.untyped_storage().data_ptr() for t in (*outputs, *inputs)}
        self.log.append(("issue", name, event, {t.untyped_storage().data_ptr() for t in outputs}, ptrs,
                         inputs[0].untyped_storage().data_ptr()))
        self.queue.append((event, reload))
        return event

    def wait(self, event, name):
        self.log.append(("wait", name, event))
        events = [e for e, _ in self.queue]
        assert event in events, f"{name}: waited on an event that is not pending"
        done, self.queue = self.queue[:events.index(event) + 1], self.queue[events.index(event) + 1:]
        for _, reload in done:
            reload()

    def drain(self):
        for _, reload in self.queue:
            reload()
        self.queue = []


class Logged(ps.paged_saved_tensors):
    """Logs each unpack of a paged tensor (its name, the storage backward gets) in the side stream's log."""

    def _unpack(self, packed):
        t = super()._unpack(packed)
        if isinstance(packed, hooks._Packed) and hasattr(self._cuda_streams, "log"):
            self._cuda_streams.log.append(("unpack", packed.group.name, t.untyped_storage().data_ptr(),
                                      packed.group.skipped))
        return t


def check_stream_order(log, prefetch):
    """Each prefetch's buffers and the tensors it reads are record_streamed; the first unpack
    of a prefetched marked tensor comes after a wait on its own event, and gets the prefetch's
    buffers; no more than `prefetch` reloads are waiting at any time. Returns the names
    prefetched, in order, and the most waiting at once."""
    issued, waited, pending, most = {}, set(), set(), 0
    for entry in log:
        if entry[0] == "issue":
            _, name, event, outputs, streamed, record = entry
            assert name not in issued and outputs <= streamed and record in streamed
            issued[name] = (event, outputs)
            pending.add(name)
            most = max(most, len(pending))
        elif entry[0] == "wait":
            _, name, event = entry
            assert issued[name][0] == event and name not in waited  # its own event, once
            waited.add(name)
            pending.discard(name)
        elif entry[1] in issued:
            _, name, ptr, _ = entry
            assert name in waited and ptr in issued[name][1]
    assert most <= prefetch
    return list(issued), most


def train(order, pool=None, prefetch=0, skip_next=0, capturing=False, cuda_streams=SideStream, device="cpu", **forward):
    """The microbatches' forwards and backwards in `order`, each forward in its own context
    when there is a pool (its streams made by `cuda_streams`, None: the hook's own); the
    accumulated gradients and the contexts."""
    torch.manual_seed(0)
    model, data, contexts, losses = Experts().to(device), microbatches(device=device), {}, {}
    for direction, m in ORDERS[order]:
        x, counts, target = data[m]
        if direction == "b":
            losses.pop(m).backward()
        elif pool is None:
            losses[m] = (model(x, counts, **forward).float() * target).sum()
        else:
            with Logged(pool, prefetch=prefetch, skip_next=skip_next) as paging:
                if cuda_streams is not None:
                    paging._cuda_streams = cuda_streams(capturing)
                losses[m] = (model(x, counts, paging, **forward).float() * target).sum()
            contexts[m] = paging
    return [p.grad for p in model.parameters()], contexts


@pytest.mark.parametrize("skip_next", [0, 1, 2])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
@pytest.mark.parametrize("order", ["lifo", "1f1b"])
def test_prefetch_and_skip_next_give_eager_gradients_bit_for_bit(order, prefetch, skip_next):
    eager, _ = train(order)
    pool = ps.PagePool(device_pages=256, page_bytes=4096)
    paged, contexts = train(order, pool, prefetch, skip_next)
    for a, b in zip(eager, paged):
        assert torch.equal(a, b)
    stashes = 3 * LAYERS - skip_next
    for paging in contexts.values():
        log = paging._cuda_streams.log
        issued, most = check_stream_order(log, prefetch)
        # Backward goes in reverse order of stashing: every stash but the first one backward
        # needs is prefetched, in that order, `prefetch` ahead (the unpack of a skipped
        # tensor prefetches the last stashes).
        backward = [f"{n}{i}" for i in reversed(range(LAYERS)) for n in "ahx"][skip_next:]
        assert issued == ([] if prefetch == 0 else backward[skip_next == 0:]) and most == prefetch
        assert paging.skipped_tensors == skip_next and paging.paged_tensors == stashes
        skipped = [e[1] for e in log if e[0] == "unpack" and e[3]]
        assert skipped == [f"a{LAYERS - 1}", f"h{LAYERS - 1}"][:skip_next]  # the last saved, never paged
    stats = pool.stats()
    assert stats["stashes"] == stats["reloads"] == MICROBATCHES * stashes
    assert pool.pages_in_use() == 0 and not any(stats["flags"].values())


def test_a_wrong_guess_stays_correct():
    """Stashed a, b, c; backward needs a first (saved again by the last node), then c, b: the
    prefetch from a finds nothing before it, c reloads in place, and b, prefetched from c,
    waits in its buffers until backward needs it."""
    g = torch.Generator().manual_seed(9)
    counts = torch.tensor([16, 5, 0, 9], dtype=torch.int32)
    live = (torch.arange(C)[None, :] < counts[:, None]).unsqueeze(-1)
    xs = [torch.where(live, torch.randn(E, C, H, generator=g), 0).to(torch.bfloat16) for _ in range(3)]
    ws = [torch.randn(E, H, H, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(4)]

    def run(paging=None):
        for w in ws:
            w.grad = None
        a, b, c = (x.clone() if paging is None else paging.mark(x.clone(), counts, name=n) for x, n in zip(xs, "abc"))
        loss = sum(torch.bmm(t, w).float().sum() for t, w in zip((a, b, c, a), ws))
        return loss

    run().backward()
    eager = [w.grad.clone() for w in ws]
    for prefetch in (1, 2):
        pool = ps.PagePool(device_pages=64, page_bytes=4096)
        with Logged(pool, prefetch=prefetch) as paging:
            paging._cuda_streams = SideStream()
            loss = run(paging)
        loss.backward()
        paging._cuda_streams.drain()
        for want, w in zip(eager, ws):
            assert torch.equal(want, w.grad)
        unpacked = [e[1] for e in paging._cuda_streams.log if e[0] == "unpack"]
        assert unpacked[:3] == ["a", "c", "b"]
        assert check_stream_order(paging._cuda_streams.log, prefetch) == (["b"], 1)  # from c
        assert pool.pages_in_use() == 0 and pool.stats()["reloads"] == 3


def test_prefetch_is_refused_under_graph_capture():
    pool = ps.PagePool(device_pages=256, page_bytes=4096)
    with pytest.raises(RuntimeError, match=r"paged_saved_tensors\(prefetch=1\) reloads on a side CUDA stream, which "
                                           r"this CUDA graph capture would not join: pass prefetch=0"):
        train("lifo", pool, prefetch=1, capturing=True)
    eager, _ = train("lifo")
    paged, _ = train("lifo", ps.PagePool(device_pages=256, page_bytes=4096), prefetch=0, capturing=True)
    assert all(torch.equal(a, b) for a, b in zip(eager, paged))


def test_bad_arguments_are_refused():
    pool = ps.PagePool(device_pages=8, page_bytes=4096)
    for kwargs in ({"prefetch": -1}, {"skip_next": 1.5}, {"prefetch": True}):
        match = rf"paged_saved_tensors: {next(iter(kwargs))} must be an int >= 0 \(marked tensors\), not"
        with pytest.raises(ValueError, match=match):
            ps.paged_saved_tensors(pool, **kwargs)


def test_a_marked_tensor_changed_in_place_before_its_lazy_stash_raises():
    pool = ps.PagePool(device_pages=64, page_bytes=4096)
    counts = torch.tensor([16, 5, 0, 9], dtype=torch.int32)
    w = torch.randn(E, H, H).to(torch.bfloat16).requires_grad_()
    with pytest.raises(RuntimeError, match=r"pagestash: x was changed in place after autograd saved it and before "
                                           r"it was stashed \(skip_next"):
        with ps.paged_saved_tensors(pool, skip_next=1) as paging:
            x = paging.mark(torch.randn(E, C, H).to(torch.bfloat16), counts, name="x")
            y = paging.mark(torch.bmm(x, w), counts, name="y")  # saves x: held (skip_next=1)
            x.mul_(2)  # what autograd saved is gone
            torch.bmm(y, w)  # saves y: x is stashed now
    # Kept unpaged (the last one), changed before backward: backward refuses it, as eager does.
    with ps.paged_saved_tensors(pool, skip_next=1) as paging:
        x = paging.mark(torch.randn(E, C, H).to(torch.bfloat16), counts, name="x")
        loss = torch.bmm(x, w).sum()
    x.mul_(2)
    with pytest.raises(RuntimeError, match=r"pagestash: x was changed in place after autograd saved it \(kept unpaged"):
        loss.backward()
    assert paging.skipped_tensors == 1 and pool.pages_in_use() == 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_experts_are_recomputed_not_paged(reentrant):
    """torch.utils.checkpoint around each layer, marks inside it: they page nothing (and do
    not warn: checkpoint frees those tensors and recomputes them in backward, where they are
    not paged either), and the gradients are eager checkpoint's bit for bit. Each layer's
    input, marked outside, is what checkpoint saves (with save_for_backward, in both modes):
    paged, and reloaded before the recomputation."""
    for order in ORDERS:
        eager, _ = train(order, checkpoint=reentrant)
        pool = ps.PagePool(device_pages=256, page_bytes=4096)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ps.UnpagedWarning)
            paged, contexts = train(order, pool, prefetch=1, checkpoint=reentrant)
        for a, b in zip(eager, paged):
            assert torch.equal(a, b)
        for paging in contexts.values():
            assert paging.paged_tensors == LAYERS and not paging._groups  # the recomputation marked nothing
            prefetched = [e[1] for e in paging._cuda_streams.log if e[0] == "issue"]
            assert prefetched == [f"x{i}" for i in reversed(range(LAYERS - 1))]  # one ahead of each reload
        stats = pool.stats()
        assert stats["stashes"] == stats["reloads"] == MICROBATCHES * LAYERS
        assert pool.pages_in_use() == 0


def test_skip_next_and_prefetch_around_a_compiled_layer():
    """A torch.compile'd layer (aot_eager: its saved tensors are the compiled graph's),
    marks outside it, 1F1B order: bit-identical gradients, every page back."""

    def layer(x, w1, w2):
        return torch.bmm(torch.nn.functional.silu(torch.bmm(x, w1)), w2)

    compiled = torch.compile(layer, backend="aot_eager")
    eager, _ = train("1f1b", compiled=layer)
    pool = ps.PagePool(device_pages=256, page_bytes=4096)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ps.UnpagedWarning)
        paged, contexts = train("1f1b", pool, prefetch=2, skip_next=1, compiled=compiled)
    for a, b in zip(eager, paged):
        assert torch.equal(a, b)
    assert pool.pages_in_use() == 0 and not any(pool.stats()["flags"].values())
    for paging in contexts.values():  # the compiled graph saves each layer's input: the last one kept
        assert (paging.paged_tensors, paging.skipped_tensors) == (LAYERS - 1, 1)


def test_strict_and_sync_free_as_for_in_order_reloads():
    """A pool too small for the step: strict mode raises at the first reload, naming the same
    marked tensor whatever the prefetch; the sync-free loop decides to rerun."""
    raised = []
    for prefetch in (0, 1, 2):
        pool = ps.PagePool(device_pages=12, page_bytes=4096)
        with pytest.raises(ps.PagingError, match="overflow") as e:
            train("lifo", pool, prefetch, skip_next=1)
        raised.append(str(e.value))
        pool = ps.PagePool(device_pages=12, page_bytes=4096, strict=False)
        pool.begin_step()
        train("lifo", pool, prefetch, skip_next=1)
        assert pool.decide() == "rerun_without_paging"
    assert raised[0] == raised[1] == raised[2] and "at the reload of h2" in raised[0]


def test_the_loop_as_docs_python_md_shows_it():
    torch.manual_seed(0)
    model, batches = Experts(), microbatches()
    pool = ps.PagePool(device_pages=256, page_bytes=4096)
    contexts, losses = [], []
    # [loop]
    for m, (x, counts, target) in enumerate(batches):  # 1F1B: forward 0, forward 1, backward 0, forward 2, ...
        with ps.paged_saved_tensors(pool, prefetch=1, skip_next=1) as paging:
            losses.append((model(x, counts, paging).float() * target).sum())
        contexts.append(paging)
        if m >= 1:
            losses[m - 1].backward()  # reloads its layers from the last, each prefetching the next
    losses[-1].backward()
    assert all(p.skipped_tensors == 1 for p in contexts)  # the last layer's SiLU: never paged
    # [loop]
    eager, _ = train("1f1b")
    assert all(torch.equal(a, p.grad) for a, p in zip(eager, model.parameters()))
    assert pool.pages_in_use() == 0


def run_step_1f1b(pool, device="cpu", **hook_options):
    """The 1F1B order through pagestash.run_step, hook options passed to every context."""
    torch.manual_seed(0)
    model, data = Experts().to(device), microbatches(device=device)

    def run(step):
        losses = {}
        for direction, m in ORDERS["1f1b"]:
            x, counts, target = data[m]
            if direction == "b":
                losses.pop(m).backward()
                continue
            with step.paging() as paging:
                losses[m] = (model(x, counts, paging).float() * target).sum()

    how = ps.run_step(pool, run, model, **hook_options)
    return how, [p.grad for p in model.parameters()]


def test_run_step_passes_prefetch_and_skip_next_to_every_microbatch():
    eager, _ = train("1f1b")
    pool = ps.PagePool(device_pages=256, page_bytes=4096)
    how, paged = run_step_1f1b(pool, prefetch=2, skip_next=1)
    assert how == "paged" and all(torch.equal(a, b) for a, b in zip(eager, paged))
    assert pool.stats()["stashes"] == MICROBATCHES * (3 * LAYERS - 1)


class SlowSide(hooks._SideCudaStreams):
    """The hook's side stream, slowed down before each prefetched reload and its buffers
    poisoned first: an unpack that did not wait on its event would read the poison."""

    def __init__(self, capturing=False):
        super().__init__(torch.device("cuda"))

    def issue(self, reload, outputs, inputs, name):
        for t in outputs:
            t.view(torch.uint8).fill_(0x5A)  # on the current stream, which the side stream waits for

        def slow():
            torch.cuda._sleep(20_000_000)
            reload()

        return super().issue(slow, outputs, inputs, name)


@needs_cuda
@pytest.mark.parametrize("order", ["lifo", "1f1b"])
def test_cuda_prefetch_on_a_side_stream(order):
    eager, _ = train(order, device="cuda")
    pool = ps.PagePool(device_pages=256, page_bytes=4096, device="cuda")
    paged, contexts = train(order, pool, prefetch=2, skip_next=1, cuda_streams=SlowSide, device="cuda")
    for a, b in zip(eager, paged):
        assert torch.equal(a, b)
    side = contexts[0].reload_cuda_streams
    assert len(side) == 1 and side[0] != torch.cuda.current_stream()
    pool.end_step(cuda_streams=side)
    report = ps.decode_report(pool.report().cpu())
    assert report["decision"] == "keep" and report["pages_held_at_step_end"] == 0
    assert report["stashes"] == report["reloads"] == MICROBATCHES * (3 * LAYERS - 1)


@needs_cuda
def test_cuda_run_step_joins_the_side_stream():
    eager, _ = train("1f1b", device="cuda")
    pool = ps.PagePool(device_pages=256, page_bytes=4096, device="cuda")
    how, paged = run_step_1f1b(pool, device="cuda", prefetch=1, skip_next=1)
    assert how == "paged" and all(torch.equal(a, b) for a, b in zip(eager, paged))
    report = ps.decode_report(pool.report().cpu())
    assert report["flags"]["unbalanced"] == 0 and report["pages_held_at_step_end"] == 0
