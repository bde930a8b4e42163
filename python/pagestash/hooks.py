"""paged_saved_tensors: a saved_tensors_hooks context that pages marked activations.

Inside the context, a tensor marked with `mark()` (its counts, and its recipe and shape,
inferred from the tensor where they can be) is stashed into the pool when autograd first
saves it, or any tensor over the same bytes (a view or reshape of it, as `x @ w`,
`nn.Linear` and `einsum` save), and reloaded when backward first needs it; every other saved
tensor passes through untouched. The counts are read on the device: nothing synchronises.

Backward order: a context's marked tensors are reloaded in reverse order of stashing.
`prefetch=N` issues the reloads of the next N in that order on a side CUDA stream when backward
needs one; `skip_next=K` stashes each only once K later ones are saved, so that the last K
(whose backward runs first) are never paged. A mark under no_grad or inside a
torch.utils.checkpoint region pages nothing: checkpoint frees and recomputes it itself.

Failures: in strict mode (the pool's default: on for CPU pools, but not while the pool
observes) the first reload after a failed stash, a reset or a misuse finds the flags raised,
and its backward raises PagingError naming them once autograd has run every node of it (an
exception in the middle of a backward leaves queued nodes, holding the hook, that torch frees
after Python has shut down: SIGSEGV at exit). Otherwise the flags are read once a step, after
its last backward. Either way, the whole optimizer step reruns
without paging: pagestash.run_step (step.py) does both.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .errors import UnpagedWarning, raise_after_backward
from .pool import PagePool
from .recipes import Shape, compression_of, infer, recipe_info

#: Saved tensors that carry a framework's marker attribute, and what packs them: (attribute,
#: pack(paging, tensor)), tried in order by the pack hook for a tensor that is not marked. te.py
#: registers TransformerEngine's (register_marker): this module does not import it.
MARKERS: List[Tuple[str, Callable]] = []


def register_marker(attribute: str, pack: Callable) -> None:
    """Pages saved tensors that carry `attribute` (a framework's own marker) through `pack(paging,
    t)`: it marks t in `paging` (paged_saved_tensors.mark) and returns None, for the hook to find
    it, or returns the PackedSave that autograd keeps; None without marking lets t pass through."""
    MARKERS.append((attribute, pack))


def count_activation(storages: Dict[int, int], t: torch.Tensor) -> None:
    """Adds t's storage to `storages` (data pointer -> bytes) unless t is a parameter (a
    leaf that requires grad): how the example and the tests count the activation bytes
    autograd holds."""
    if not (t.is_leaf and t.requires_grad):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()


def _is_dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill a contiguous span without gaps or overlaps, in any order of
    dimensions (a contiguous tensor, or a permutation of one)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


class _NoCudaStreams:
    """Where prefetched reloads run for a CPU pool: there are no CUDA streams, so a reload runs
    when it is issued and there is nothing to wait for. The hook calls the same three
    methods on CUDA (_SideCudaStreams) and the tests on a recorder."""

    def capturing(self) -> bool:
        return False

    def issue(self, reload: Callable[[], None], outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
              name: str):
        reload()
        return None

    def wait(self, event, name: str) -> None:
        pass


class _SideCudaStreams(_NoCudaStreams):
    """Prefetched reloads on a side CUDA stream, one per device: each waits for the current
    stream (the stash, and the new buffers' allocation there), records an event that the
    unpack makes the current CUDA stream wait on, and record_streams every tensor it touches so
    that the caching allocator does not reuse their memory before the side CUDA stream is done."""

    _side: Dict[int, "torch.cuda.Stream"] = {}

    def __init__(self, device: torch.device):
        self.device = device

    @property
    def side(self) -> "torch.cuda.Stream":
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        if index not in self._side:
            self._side[index] = torch.cuda.Stream(index)
        return self._side[index]

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def issue(self, reload, outputs, inputs, name):
        side = self.side
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            reload()
        for t in (*outputs, *inputs):
            if t.is_cuda and t.numel():
                t.record_stream(side)
        event = torch.cuda.Event()
        event.record(side)
        return event

    def wait(self, event, name):
        torch.cuda.current_stream(self.device).wait_event(event)


class _Group:
    """The buffers of one grouped tensor (data, and scales and amax for quantized recipes),
    stashed together the first time autograd saves one of them and reloaded together the
    first time backward needs one."""

    def __init__(self, pool: PagePool, recipe: str, shape: Shape, counts: torch.Tensor,
                 buffers: Dict[str, torch.Tensor], zero_tail: bool, name: str, poison: bool = True,
                 compression: str = "lossless"):
        self.pool, self.recipe, self.shape, self.zero_tail, self.name = pool, recipe, shape, zero_tail, name
        self.compression = compression
        self.poison = poison
        # The counts as they were at mark(), copied in stream order (no sync): what the stash and
        # its reload use, whatever happens to the caller's tensor later (.data writes included).
        # The key (the caller's tensor, its version) groups a layer's marks for observe().
        with torch.no_grad():
            self.counts = counts.detach().clone()
        self.counts_key = (counts, 0 if counts.is_inference() else counts._version)
        self.buffers = buffers  # role -> tensor, until stashed
        self.meta = {role: (t.shape, t.dtype, t.device) for role, t in buffers.items()}
        self.record = None
        self.reloaded = None
        self.version = None  # the data's version counter when autograd first saved it
        self.saves = 0  # tensors autograd saved of it
        self.skipped = False  # kept unpaged (skip_next)
        self.order = None  # its place among the context's stashes
        self.event = None  # a prefetched reload's, until waited on
        self.unchecked = False  # reloaded, not yet waited on and checked
        # For the warning when it is never paged: a view over part of its bytes that autograd
        # saved instead, and the autocast dtype (autocast saves its own copy).
        self.saved_part = None
        # Another saved-tensor hook inside this context when it was marked: it takes the saves.
        self.inner_hook = None
        device = buffers["data"].device.type
        self.autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None

    @property
    def stashed(self) -> bool:
        return self.record is not None or self.reloaded is not None

    def stash(self) -> None:
        if self.stashed:
            return
        b = self.buffers
        if b["data"]._version != self.version:
            raise RuntimeError(f"pagestash: {self.name} was changed in place after autograd saved it and before it was "
                               "stashed (skip_next stashes a marked tensor once later ones are saved): autograd "
                               "needs the saved values. Change a clone of it, or pass skip_next=0")
        with torch.no_grad():
            self.record = self.pool.record(self.recipe, self.shape, compression=self.compression)
            self.record.name = self.name
            self.record.stash(b["data"].detach(), self.counts, b.get("scales"), b.get("amax"), check=False,
                              counts_key=self.counts_key)
        self.buffers = None  # the pages hold them now: let the caller's tensors go
        self.counts = self.counts_key = None  # the record copied the counts

    def issue(self, cuda_streams: Optional[_NoCudaStreams] = None) -> None:
        """Reloads the pages into new buffers (allocated on the current CUDA stream): here, or
        with `cuda_streams`, as a prefetch on their side CUDA stream, whose event reload() waits on."""
        with torch.no_grad():
            out = {role: torch.empty(shape, dtype=dtype, device=device)
                   for role, (shape, dtype, device) in self.meta.items()}
            record = self.record

            def run():
                record.reload(out["data"], out.get("scales"), out.get("amax"), zero_tail=self.zero_tail,
                              poison=self.poison, check=False)

            if cuda_streams is None:
                run()
            else:
                self.event = cuda_streams.issue(run, list(out.values()), [record.memory, *self.pool.state[:3]],
                                                self.name)
        self.reloaded = out
        self.record = None  # its pages are back in the pool (once the reload has run)
        self.unchecked = True

    def reload(self, strict: bool, cuda_streams: _NoCudaStreams) -> Dict[str, torch.Tensor]:
        """The buffers for backward: reloaded here unless a prefetch issued them (then the
        current CUDA stream waits on the prefetch's own event); in strict mode the flags are
        checked then, as for a reload here. A marked tensor never stashed (skip_next) gives back
        the tensors autograd saved."""
        if self.buffers is not None:
            self.skipped = True
            if self.buffers["data"]._version != self.version:
                raise RuntimeError(f"pagestash: {self.name} was changed in place after autograd saved it (kept "
                                   "unpaged by skip_next): backward needs the saved values")
            return self.buffers
        if self.reloaded is None:
            self.issue()
        if self.unchecked:
            if self.event is not None:
                cuda_streams.wait(self.event, self.name)
                self.event = None
            self.unchecked = False
            if strict:
                self.pool.strict_check(f"at the reload of {self.name}")
        return self.reloaded

    def __del__(self):
        # Stashed but never needed (no backward): return the pages. Guarded: the object may
        # be half made (an exception in __init__, or a copy torch.compile made) or the
        # interpreter shutting down.
        record = getattr(self, "record", None)
        if record is not None and getattr(self, "reloaded", None) is None:
            try:
                record.discard(check=False)
            except Exception:
                pass


def _hook_name(hook) -> str:
    """A saved-tensor hook as a user would recognise it: its function's module and name."""
    function = getattr(hook, "__func__", hook)
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"


def _unpaged_message(g: _Group, saved: bool = True) -> str:
    """What happened to a mark that was never paged (`saved`: whether autograd saved anything in
    the context), and what to do."""
    dtype = g.meta["data"][1]
    if g.inner_hook is not None or not saved:
        if g.inner_hook is not None:
            what = (f"autograd gave its saves to the saved-tensor hook {g.inner_hook}, an inner context "
                    "(torch.autograd.graph.save_on_cpu, another saved_tensors_hooks), not to this one")
        else:
            what = ("autograd saved nothing at all in this context after it: an inner saved-tensor hook context "
                    "(torch.autograd.graph.save_on_cpu, another saved_tensors_hooks) took the saves, or no layer "
                    "saved anything with grad on (a torch.compile'd region saves its own tensors)")
        what += (": nothing of it was paged. The innermost saved-tensor hook takes every save: mark tensors in a "
                 "context with no other hook inside it")
    elif g.saved_part is not None:
        what = (f"autograd saved only {g.saved_part}, never all of its bytes: nothing of it was paged (a marked "
                "tensor is paged whole: itself, a reshape or a permutation of it). Mark the tensor the layer saves")
    elif g.autocast is not None and g.autocast != dtype:
        what = (f"autocast saved its own {g.autocast} copy of it (it is {dtype}, marked under autocast to "
                f"{g.autocast}): nothing of it was paged. Mark the copy the layer uses, "
                f"paging.mark(x.to({g.autocast}), counts), which autocast passes through (docs/python.md, Autocast)")
    else:
        what = ("autograd never saved it (nor a view of all of its bytes) in this context: nothing of it was paged; "
                "the layer saved something else, e.g. a copy. Mark the tensor the layer saves (inside a "
                "torch.compile'd region, saved tensors are the compiled graph's own)")
    return f"pagestash: {g.name} was marked but {what}; or pass warn_unpaged=False"


class PackedSave:
    """What autograd holds for a paged tensor between forward and backward: its group, its
    role, and its geometry when it is a view of the marked buffer (None: the buffer itself)."""

    __slots__ = ("group", "role", "view")

    def __init__(self, group: Optional[_Group], role: str, view):
        self.group, self.role, self.view = group, role, view


_Packed = PackedSave  # its name before (the tests' recorder reads it)

_entered = threading.local()


def paged_contexts() -> list:
    """This thread's paged contexts, innermost last."""
    if not hasattr(_entered, "contexts"):
        _entered.contexts = []
    return _entered.contexts


_contexts = paged_contexts  # its name before (the pipeline tests read it)


def mark(data: torch.Tensor, counts: torch.Tensor, **options) -> torch.Tensor:
    """The innermost paged context's mark() on this thread (paged_saved_tensors.mark: the same
    options); outside any (an unpaged rerun, a pipeline's shape inference, eager code), `data`
    as it is. For a module whose caller opens the context, as a pipeline's stage does."""
    contexts = paged_contexts()
    return contexts[-1].mark(data, counts, **options) if contexts else data


class paged_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    """A context in which marked tensors are paged while autograd holds them.

        with paged_saved_tensors(pool) as paging:
            x = paging.mark(x, counts)  # [experts, capacity, hidden] bf16: recipe and shape inferred
            y = layer(x)                # autograd saves x (or a view of it): stashed into the pool
        y.sum().backward()              # backward needs x: reloaded (dead rows zeroed)

    `zero_tail`: reloaded buffers have their dead rows zeroed (else they are left as
    torch.empty gives them). `poison`: a reload that does not restore fills the buffers with
    poison, NaN (Record.reload; off for those who check the flags). `strict`: raise PagingError
    when a reload finds the step failed, at the end of its backward (default: the pool's `strict`,
    on for CPU pools, but off while the pool observes, as under run_step: the step runs to its end). `warn_unpaged`: warn (UnpagedWarning)
    when the context ends for each mark autograd never saved.

    `compression`: how marked tensors are paged unless their mark() says otherwise: None or
    'lossless' (byte for byte), or a lossy format of pagestash.COMPRESSIONS ('mxfp8',
    'mxfp8_e5m2', 'fp8_1x128': bf16 and fp16 marks only, about half the pages; backward then
    sees dequantize(quantize(x)), so gradients are close to, not equal to, those without paging).

    `prefetch`: when backward needs a marked tensor, the reloads of the next `prefetch` in
    backward order (the context's stashes before it) are issued on a side CUDA stream, each
    unpack waiting on its own event. `skip_next`: the last `skip_next` marked tensors
    autograd saves in the context are never paged (each is stashed once that many later
    ones are saved); their saved tensors are counted in `skipped_tensors`.
    """

    def __init__(self, pool: PagePool, *, zero_tail: bool = True, poison: bool = True,
                 strict: Optional[bool] = None, warn_unpaged: bool = True, prefetch: int = 0, skip_next: int = 0,
                 compression: Optional[str] = None):
        self.compression = compression_of(compression)  # an unknown name fails here, before anything runs
        for arg, value in (("prefetch", prefetch), ("skip_next", skip_next)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"paged_saved_tensors: {arg} must be an int >= 0 (marked tensors), not {value!r}")
        self.pool = pool
        self.zero_tail = zero_tail
        self.poison = poison
        # While the pool observes (observe(), auto_resize()), as under run_step: the step runs to its end, its counts
        # whole, and decide() reads its flags.
        self.strict = (pool.strict and not pool.observing) if strict is None else bool(strict)
        self.warn_unpaged = warn_unpaged
        self.prefetch, self.skip_next = prefetch, skip_next
        self._cuda_streams = _SideCudaStreams(pool.device) if pool.device.type == "cuda" else _NoCudaStreams()
        self._by_storage: Dict[int, list] = {}  # storage -> [(weak ref, group, role, geometry)]
        self._groups = []
        self._saved: List[_Group] = []  # saved, not yet stashed (at most skip_next once a save is done)
        self._stashes: List[weakref.ref] = []  # the stashed marked tensors in order: backward goes from the last
        self.paged_tensors = 0  # tensors autograd saved that were paged
        self.passed_tensors = 0  # and that passed through
        self.skipped_tensors = 0  # and that were marked but kept unpaged (skip_next; final when the context ends)
        self._passed_storages: Dict[int, int] = {}
        self.paged_bytes = 0  # bytes of the buffers paged (their full, capacity-padded size)
        self._active = False  # inside the with block: mark() pages only there
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "paged_saved_tensors":
        self.pool.step_log.enter_context()  # before the hooks go on: it may refuse
        super().__enter__()
        self._active = True
        paged_contexts().append(self)
        return self

    def __exit__(self, *exc):
        # Only autograd holds the groups from here on: one it lets go of without needing
        # (no backward) returns its pages.
        unpaged = [g for g in self._groups if not g.saves]
        for g in self._saved:  # the last skip_next: never paged
            g.skipped = True
            g.order = len(self._stashes)  # backward needs them first: their unpack prefetches the last stashes
            self.skipped_tensors += g.saves
        self._by_storage, self._groups, self._saved, self._active = {}, [], [], False
        if self in paged_contexts():
            paged_contexts().remove(self)
        # A mark is made with grad on (under no_grad it returns at once): when autograd saved nothing
        # at all in the context after it, another saved-tensor hook took the saves, or the layer ran
        # without grad. Either way nothing of it was paged: say so.
        saved = self.paged_tensors + self.passed_tensors + self.skipped_tensors > 0
        if self.warn_unpaged and exc[0] is None:
            for g in unpaged:
                warnings.warn(_unpaged_message(g, saved), UnpagedWarning, stacklevel=2)
        return super().__exit__(*exc)

    def mark(self, data: torch.Tensor, counts: torch.Tensor, *, recipe: Optional[str] = None,
             shape: Optional[Shape] = None, scales: Optional[torch.Tensor] = None,
             amax: Optional[torch.Tensor] = None, name: Optional[str] = None,
             scale_layout: str = "swizzled", compression: Optional[str] = None) -> torch.Tensor:
        """Marks `data` (with its `scales` and `amax`, for MXFP8 and NVFP4) as one grouped
        tensor whose live rows `counts` gives (int32, one per group, on the pool's device).
        `recipe` and `shape` are inferred from data where they can be (pagestash.infer);
        `name` names it in warnings and errors. Returns `data`. The buffers must be
        contiguous (ValueError) and are checked when stashed; the counts must not change in
        place until then. `compression` pages this one compressed (or 'lossless': not), whatever
        the context's `compression`; None: the context's. A compression the recipe or shape
        cannot take raises ValueError here. Only inside the with block: elsewhere (with grad on) it raises
        RuntimeError.

        Under no_grad or torch.utils.checkpoint it pages nothing and returns `data`:
        checkpoint saves the region's tensors itself (non-reentrant) or nothing (reentrant:
        no grad), and recomputes them in backward, where they are not paged either."""
        for what, t in (("data", data), ("counts", counts)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"pagestash: mark(): {what} must be a tensor, not a {type(t).__name__}" +
                                 (" (torch.tensor(counts, dtype=torch.int32, device=data.device))"
                                  if what == "counts" else ""))
        if torch.compiler.is_compiling():
            warnings.warn("pagestash: mark() inside a torch.compile'd region pages nothing: mark the layer's input "
                          "outside it", UnpagedWarning, stacklevel=2)
            return data
        if _checkpointed():  # before the block check: a checkpoint recomputes in backward, after the block
            return data
        if not self._active:
            raise RuntimeError("pagestash: mark() outside its `with paged_saved_tensors(pool)` block (before it "
                               "entered or after it exited) would page nothing: call it inside the block, before "
                               "the layer that saves the tensor")
        for what, t in (("data", data), ("counts", counts), ("scales", scales), ("amax", amax)):
            if t is not None and t.device.type == "meta":
                raise ValueError(f"pagestash: mark(): {what} is a meta tensor (it holds no data): nothing could be "
                                 f"paged; pass it on the pool's device ({self.pool.device})")
        recipe, shape = infer(data, counts, recipe=recipe, shape=shape, scales=scale_layout)
        compression = self.compression if compression is None else compression_of(compression)
        if compression != "lossless":
            recipe_info(recipe, shape, compression)  # refuses a recipe or shape it cannot take, now
        buffers = {"data": data}
        if scales is not None:
            buffers["scales"] = scales
        if amax is not None:
            buffers["amax"] = amax
        lossy = "" if compression == "lossless" else f", {compression}"
        name = name or f"marked tensor #{len(self._groups)} ({recipe}, shape {tuple(shape)}{lossy})"
        for role, t in buffers.items():  # the ops page contiguous buffers: refuse now, not at the save
            if not t.is_contiguous():
                raise ValueError(f"pagestash: mark(): {role} of {name} is not contiguous (strides {list(t.stride())}): "
                                 f"mark {role}.contiguous() and give that to the layer")
        group = _Group(self.pool, recipe, shape, counts, buffers, self.zero_tail, name, self.poison, compression)
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is not None and top[0] != self._pack:
            group.inner_hook = _hook_name(top[0])
        self._groups.append(group)
        for role, t in buffers.items():
            geometry = (t.dtype, t.storage_offset(), t.numel())
            entry = (StorageWeakRef(t.untyped_storage()), group, role, geometry)
            self._by_storage.setdefault(t.untyped_storage()._cdata, []).append(entry)
        return data

    def _entries(self, t: torch.Tensor):
        """The marks over t's storage: [(weak ref, group, role, geometry)]."""
        if not self._by_storage or t.layout != torch.strided:
            return ()
        try:
            key = t.untyped_storage()._cdata
        except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, functional)
            return ()
        return self._by_storage.get(key, ())

    def _lookup(self, t: torch.Tensor):
        """(group, role, view) when t is a marked buffer or a view over exactly its bytes."""
        for ref, group, role, (dtype, offset, numel) in self._entries(t):
            if ref.expired() or t.dtype != dtype or t.storage_offset() != offset or t.numel() != numel:
                continue
            if not _is_dense(t):
                continue
            if group.saves and t._version != group.version:
                continue  # changed in place since autograd first saved it: not what the group holds
            marked_shape = group.meta[role][0]
            view = None if (t.is_contiguous() and t.shape == marked_shape) else (tuple(t.shape), tuple(t.stride()))
            return group, role, view
        return None

    def _pack(self, t: torch.Tensor):
        found = self._lookup(t)
        if found is None:
            for attribute, pack in MARKERS:  # a framework marked it (te.py: TransformerEngine): paged as mark() would
                if hasattr(t, attribute):
                    packed = pack(self, t)
                    if packed is not None:
                        return packed
                    found = self._lookup(t)
                    break
        if found is None:
            for ref, group, _, _ in self._entries(t):  # a view over part of a marked tensor's bytes
                if not ref.expired() and not group.saves and group.saved_part is None:
                    group.saved_part = (f"a view of shape {list(t.shape)}, strides {list(t.stride())} and dtype "
                                        f"{t.dtype} at element offset {t.storage_offset()} of its storage")
            self.passed_tensors += 1
            count_activation(self._passed_storages, t)
            return t
        group, role, view = found
        self.count_save(group)
        self.stash_behind()
        return PackedSave(group, role, view)

    @property
    def last_marked(self) -> "_Group":
        """The grouped tensor mark() marked last in this context (te.py completes its saves)."""
        return self._groups[-1]

    def count_save(self, group: "_Group") -> None:
        """One save of a marked buffer (here, or a registered marker's): a stashed group's counts as a paged
        tensor; the first of a group not stashed yet queues it, its version kept."""
        if group.stashed:
            self.paged_tensors += 1
        elif not group.saves:
            group.version = group.buffers["data"]._version
            self._saved.append(group)
        group.saves += 1

    def stash_behind(self) -> None:
        """Stashes the saved marked tensors but the last skip_next (0: each when autograd first saves it)."""
        while len(self._saved) > self.skip_next:
            group = self._saved.pop(0)
            if group.skipped:  # backward (inside the context) already took it unpaged
                self.skipped_tensors += group.saves
                continue
            self.paged_bytes += sum(b.numel() * b.element_size() for b in group.buffers.values())
            group.stash()
            self.paged_tensors += group.saves
            group.order = len(self._stashes)
            self._stashes.append(weakref.ref(group))

    @property
    def passed_bytes(self) -> int:
        """Bytes of the activations that passed through (each storage once; no parameters)."""
        return sum(self._passed_storages.values())

    @property
    def reload_cuda_streams(self) -> list:
        """The CUDA streams prefetched reloads ran on: pass them to pool.end_step(cuda_streams=...)."""
        return [self._cuda_streams.side] if self.prefetch and isinstance(self._cuda_streams, _SideCudaStreams) else []

    def _unpack(self, packed):
        if not isinstance(packed, PackedSave):
            return packed
        group = packed.group
        try:
            t = group.reload(self.strict, self._cuda_streams)[packed.role]
            if group.order is not None:
                self._prefetch(group.order)
        except Exception as e:  # inside a backward: raised at its end, every node of it run (no queued node left)
            raise_after_backward(e)
            t = _poison(*group.meta[packed.role]) if group.reloaded is None else group.reloaded[packed.role]
        return t if packed.view is None else t.as_strided(*packed.view)

    def _prefetch(self, order: int) -> None:
        """Issues the reloads of the `prefetch` stashes before `order` (next in backward
        order) that are still in the pool. A guess that is wrong stays correct: a marked
        tensor prefetched early waits in its buffers, one needed first is reloaded in place."""
        if not self.prefetch:
            return
        if self._cuda_streams.capturing():
            raise RuntimeError(f"pagestash: paged_saved_tensors(prefetch={self.prefetch}) reloads on a side CUDA "
                               "stream, which this CUDA graph capture would not join: pass prefetch=0 to the context "
                               "whose backward is captured")
        for ref in reversed(self._stashes[max(0, order - self.prefetch):order]):
            group = ref()
            if group is not None and group.record is not None:
                group.issue(self._cuda_streams)


def _poison(shape, dtype, device) -> torch.Tensor:
    """A buffer of every byte 0xFF (NaN), as a reload that does not restore leaves it: what backward gets
    of a marked tensor whose unpack failed, until the error raises at the backward's end."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.numel():
        t.view(-1).view(torch.uint8).fill_(0xFF)
    return t


def _checkpointed() -> bool:
    """Whether a mark now is under no_grad or inside torch.utils.checkpoint: its non-reentrant forward (its
    hooks save the region's tensors) or recomputation (its hooks, or a reentrant one's
    backward), or a reentrant forward (grad off: nothing is saved)."""
    if not torch.is_grad_enabled() or torch._C._current_graph_task_id() != -1:
        return True
    top = torch._C._autograd._top_saved_tensors_default_hooks(False)
    return top is not None and getattr(top[0], "__module__", None) == "torch.utils.checkpoint"
