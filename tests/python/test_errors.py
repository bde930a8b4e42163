"""Nothing silent (issue 33, section 2): errors that name the argument and the fix, the
operation that first raised a flag, copies of pools and records, and the hook's misuses
(mark outside the block, counts changed after mark, autocast, no_grad, partial views)."""

import copy
import warnings

import pytest
import torch

import pagestash as ps

SEED = 33
E, C, H = 2, 32, 64


def data(gen, shape=(E, C, H), dtype=torch.bfloat16):
    return torch.randn(*shape, generator=gen).to(dtype)


def counts_of(*c):
    return torch.tensor(c, dtype=torch.int32)


def untouched(pool):
    stats = pool.stats()
    return stats["device_pages_free"] == pool.device_pages and stats["stashes"] == 0 and not any(
        stats["flags"].values())


# ---- Errors that speak PyTorch -----------------------------------------------------------

class TestArgumentErrors:
    def setup_method(self):
        self.gen = torch.Generator().manual_seed(SEED)
        self.pool = ps.PagePool(device_pages=16, page_bytes=4096)
        self.rec = self.pool.record("bf16/capacity", ps.Shape(E, C, H))
        self.x = data(self.gen)
        self.counts = counts_of(5, 9)

    def test_meta_data_or_counts_beside_a_cpu_pool_are_refused(self):
        # The dispatcher sends a call with a meta tensor to the fake kernel: it was a silent no-op.
        with pytest.raises(ValueError, match="data is a meta tensor .* the pool is on cpu: the op would do nothing. "
                                             "Pass data on cpu"):
            self.rec.stash(self.x.to("meta"), self.counts)
        with pytest.raises(ValueError, match="counts is a meta tensor"):
            self.rec.stash(self.x, self.counts.to("meta"))
        assert untouched(self.pool) and self.rec.status()["state"] == "empty"
        self.rec.stash(self.x, self.counts)
        with pytest.raises(ValueError, match="data is a meta tensor"):
            self.rec.reload(torch.empty_like(self.x, device="meta"))
        with pytest.raises(ValueError, match="out is a meta tensor"):
            ps.ops.report(*self.pool.state, torch.empty(ps._C.report_bytes(), dtype=torch.uint8, device="meta"))
        assert self.rec.status()["state"] == "stashed"

    def test_misaligned_data_names_the_tensor_and_the_fix(self):
        raw = torch.empty(self.x.numel() + 1, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=r"^pagestash: data must be 16-byte aligned \(the ops copy 16-byte "
                                             r"vectors\), but its data_ptr\(\) % 16 = 2 \(storage_offset\(\) = 1\): pass "
                                             r"data.clone\(\)"):
            self.rec.stash(raw[1:].view(E, C, H), self.counts)
        shape = ps.Shape(E, 128, 64)
        rec = self.pool.record("mxfp8/capacity/swizzled", shape)
        info = ps.recipe_info("mxfp8/capacity/swizzled", shape)
        scales = torch.empty(info["scales_bytes"] + 4, dtype=torch.uint8)[4:]
        with pytest.raises(ValueError, match=r"^pagestash: scales must be 16-byte aligned .* pass scales.clone\(\)"):
            rec.stash(torch.zeros(info["data_bytes"], dtype=torch.uint8), self.counts, scales)
        assert untouched(self.pool)

    def test_a_shape_the_recipe_refuses_names_the_shape_entry_and_the_fix(self):
        cases = [
            ("mxfp8/packed/swizzled", ps.Shape(2, 48, 64),
             r"shape \[2, 48, 64\] does not fit recipe 'mxfp8/packed/swizzled': shape\[1\] \(tokens\) = 48 must be a "
             r"multiple of 128 \(the recipe's token granule for this hidden\): pad .* to 128 tokens"),
            ("nvfp4/capacity/swizzled", ps.Shape(2, 128, 40),
             r"shape\[2\] \(hidden\) = 40 must be a multiple of 16 for this recipe: pad hidden to 48"),
            ("plain", ps.Shape(2, 16, 64), r"recipe 'plain': shape\[0\] \(groups\) = 2 must be 1"),
            ("bf16/capacity", ps.Shape(0, 16, 64), r"shape\[0\] \(groups\) = 0 must be in \[1, 2\^31\)"),
            ("bf16/packed", ps.Shape(2, -1, 64), r"shape\[1\] \(tokens\) = -1 is negative"),
        ]
        for recipe, shape, match in cases:
            for call in (lambda: self.pool.record(recipe, shape), lambda: ps.recipe_info(recipe, shape),
                         lambda: ps.ops.discard(*self.pool.state, self.rec.memory, recipe, list(shape))):
                with pytest.raises(ValueError, match="^pagestash: .*" + match) as e:
                    call()
                assert "GroupedView" not in str(e.value)  # the library's words for C++ users, not PyTorch's

    def test_dtypes_print_as_torch_spells_them(self):
        with pytest.raises(ValueError, match=r"must be torch.bfloat16 \(or torch.uint8 bytes\), not "
                                             r"torch.float8_e4m3fnuz$"):
            self.rec.stash(self.x.to(torch.float8_e4m3fnuz), self.counts)
        with pytest.raises(ValueError, match=r"counts must be torch.int32, not torch.uint16$"):
            self.rec.stash(self.x, self.counts.to(torch.uint16))


# ---- The operation that first raised a flag --------------------------------------------

def test_paging_error_names_the_operation_that_first_raised_the_flag():
    gen = torch.Generator().manual_seed(SEED)
    x = data(gen)
    pool = ps.PagePool(device_pages=3, page_bytes=4096)  # a CPU pool reads its flags after every operation
    a = pool.record("bf16/capacity", ps.Shape(E, C, H))
    b = pool.record("bf16/capacity", ps.Shape(E, C, H))
    a.name = "expert input"
    a.stash(x, counts_of(32, 32), check=False)  # 2 pages
    b.stash(x, counts_of(32, 32), check=False)  # 2 more: no room
    with pytest.raises(ps.PagingError, match=r"paging failed at the reload of expert input \(overflow: .*\); first "
                                             r"raised by the stash of a bf16/capacity record \(2, 32, 64\); "
                                             r"decision 'rerun_without_paging'") as e:
        a.reload(torch.empty_like(x))  # the flags are sticky: a's reload sees b's overflow
    assert e.value.first == "the stash of a bf16/capacity record (2, 32, 64)"
    with pytest.raises(ps.PagingError, match="first raised by the stash of a bf16/capacity record"):
        pool.check()
    # After a reset the next failure is found afresh.
    pool.reset()
    a.stash(x, counts_of(8, 8))
    with pytest.raises(ps.PagingError, match=r"at the reload of expert input \(not_stashed: .*\); decision") as e:
        a.reload(torch.empty_like(x))
        a.reload(torch.empty_like(x))
    assert e.value.first == "the reload of expert input"
    # Flags raised by no operation of this pool (a raw op, a write to the flags).
    pool.reset()
    pool.flags[0] = 1
    with pytest.raises(ps.PagingError, match="first raised by no operation of this pool since its flags were last "
                                             r"read clean \(a raw torch.ops.pagestash op, or a write to pool.flags\)"):
        pool.check()


def test_the_hook_names_the_stash_that_overflowed_at_the_reload_that_finds_it():
    gen = torch.Generator().manual_seed(SEED)
    w = data(gen, (E, H, H)).requires_grad_()
    pool = ps.PagePool(device_pages=1, page_bytes=4096)
    with ps.paged_saved_tensors(pool) as paging:
        a = paging.mark(data(gen), counts_of(32, 32), name="first")  # 2 pages: no room
        h = torch.bmm(a, w)
        b = paging.mark(data(gen), counts_of(8, 8), name="second")  # 1 page
        loss = (torch.bmm(b, w) + h).sum()
    # Backward reloads `second` first (the later node): its reload finds the overflow that
    # the stash of `first` raised (the flags are sticky).
    with pytest.raises(ps.PagingError, match=r"at the reload of second \(overflow: .*\); first raised by the stash "
                                             "of first; decision"):
        loss.backward()


# ---- Copies ------------------------------------------------------------------------------

def test_a_deep_copy_of_a_pool_is_a_new_empty_pool_with_its_own_id():
    gen = torch.Generator().manual_seed(SEED)
    x = data(gen)
    pool = ps.PagePool(device_pages=16, page_bytes=4096, host_pages=2, strict=False)
    rec = pool.record("bf16/capacity", ps.Shape(E, C, H))
    rec.stash(x, counts_of(20, 7))
    twin = copy.deepcopy(pool)
    assert twin.config == pool.config and twin.strict is False and twin.pages_in_use() == 0
    assert twin.control.data_ptr() != pool.control.data_ptr()
    # Each pool refuses the other's records (a byte copy shared the id: both accepted them).
    with pytest.raises(ValueError, match="made for another pool"):
        ps.ops.reload(*twin.state, rec.memory, rec.recipe, list(rec.shape), torch.empty_like(x))
    theirs = twin.record("bf16/capacity", ps.Shape(E, C, H))
    with pytest.raises(ValueError, match="made for another pool"):
        ps.ops.stash(*pool.state, theirs.memory, theirs.recipe, list(theirs.shape), x, counts_of(1, 1))
    assert twin.pages_in_use() == 0 and rec.status()["state"] == "stashed"
    # A shallow copy is the same pool (the same memory): it takes the original's records.
    alias = copy.copy(pool)
    out = torch.zeros_like(x)
    ps.ops.reload(*alias.state, rec.memory, rec.recipe, list(rec.shape), out, zero_tail=True)
    assert torch.equal(out[0, :20], x[0, :20]) and torch.equal(out[1, :7], x[1, :7]) and pool.pages_in_use() == 0


def test_a_deep_copy_of_a_record_is_an_empty_record_in_the_copy_of_its_pool():
    gen = torch.Generator().manual_seed(SEED)
    x = data(gen)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    rec = pool.record("bf16/capacity", ps.Shape(E, C, H))
    rec.stash(x, counts_of(20, 7))
    held = {"pool": pool, "records": [rec]}  # e.g. a module that keeps its pool and records
    twin = copy.deepcopy(held)
    rec2 = twin["records"][0]
    assert rec2.pool is twin["pool"] and rec2.pool is not pool
    assert rec2.status()["state"] == "empty" and rec2.memory.data_ptr() != rec.memory.data_ptr()
    rec2.stash(x, counts_of(3, 30))
    out = torch.zeros_like(x)
    rec2.reload(out, zero_tail=True)
    assert torch.equal(out[0, :3], x[0, :3]) and torch.equal(out[1, :30], x[1, :30]) and not out[0, 3:].any()
    assert rec.status()["state"] == "stashed" and pool.pages_in_use() > 0  # the original is untouched


# ---- The hook ----------------------------------------------------------------------------

def test_mark_outside_the_block_raises():
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    x = data(gen)
    paging = ps.paged_saved_tensors(pool)
    with pytest.raises(RuntimeError, match=r"mark\(\) outside its `with paged_saved_tensors\(pool\)` block"):
        paging.mark(x, counts_of(1, 2))  # before it entered
    with paging:
        pass
    with pytest.raises(RuntimeError, match="before it entered or after it exited"):
        paging.mark(x, counts_of(1, 2))  # after it exited: it was silently nothing
    assert untouched(pool)


def test_counts_changed_in_place_after_mark_do_not_reach_the_stash():
    """mark() copies the counts: the stash pages the rows they gave then (10 and 12), whatever
    the caller's tensor says later; backward sees those rows and zeros past them."""
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    w = data(gen, (E, H, H)).requires_grad_()
    x0 = data(gen)
    counts = counts_of(10, 12)
    with ps.paged_saved_tensors(pool) as paging:
        x = paging.mark(x0, counts, name="expert input")
        counts.clamp_(max=8)  # in place, after mark(): not what the stash uses
        y = torch.bmm(x, w)
    y.float().sum().backward()
    live = x0.clone()
    live[0, 10:], live[1, 12:] = 0, 0
    twin = w.detach().clone().requires_grad_()
    torch.bmm(live, twin).float().sum().backward()
    assert torch.equal(w.grad, twin.grad) and pool.pages_in_use() == 0


def test_non_contiguous_marks_are_refused():
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    with ps.paged_saved_tensors(pool) as paging:
        with pytest.raises(ValueError, match=r"mark\(\): data of .* is not contiguous \(strides \[2048, 1, 32\]\): "
                                             r"mark data.contiguous\(\)"):
            paging.mark(data(gen, (E, H, C)).transpose(1, 2), counts_of(1, 2))


def test_a_view_over_part_of_a_marked_tensor_warns_what_was_saved():
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    w = data(gen, (E, H, H)).requires_grad_()
    with pytest.warns(ps.UnpagedWarning, match=r"^pagestash: expert input was marked but autograd saved only a "
                                               r"view of shape \[2, 16, 64\], strides \[2048, 64, 1\] and dtype "
                                               r"torch.bfloat16 at element offset 0 of its storage, never all of its "
                                               "bytes: nothing of it was paged"):
        with ps.paged_saved_tensors(pool) as paging:
            x = paging.mark(data(gen), counts_of(3, 4), name="expert input")
            loss = torch.bmm(x[:, :16], w).sum()  # a per-token slice: not the marked bytes
    loss.backward()
    assert paging.paged_tensors == 0 and untouched(pool)


def test_autocast_warns_that_it_saved_its_own_copy_and_marking_the_copy_pages_it():
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(E, C, H, generator=gen)  # fp32
    w = torch.randn(E, H, H, generator=gen).requires_grad_()
    counts = counts_of(20, 9)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(ps.UnpagedWarning, match=r"autocast saved its own torch.bfloat16 copy of it \(it is "
                                                   r"torch.float32, marked under autocast to torch.bfloat16\): nothing "
                                                   r"of it was paged. Mark the copy the layer uses, "
                                                   r"paging.mark\(x.to\(torch.bfloat16\), counts\)"):
            with ps.paged_saved_tensors(pool) as paging:
                torch.bmm(paging.mark(x, counts), w).sum()
        assert paging.paged_tensors == 0
        # [autocast]
        with ps.paged_saved_tensors(pool) as paging:
            xb = paging.mark(x.to(torch.bfloat16), counts)  # what autocast would cast x to
            loss = torch.bmm(xb, w).sum()  # autocast passes a bf16 tensor through: autograd saves xb
        # [autocast]
    assert paging.paged_tensors == 1
    loss.backward()
    paged = w.grad.clone()
    w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        xb = x.to(torch.bfloat16)
        xb[0, 20:] = 0  # the dead rows the reload zeroes
        xb[1, 9:] = 0
        torch.bmm(xb, w).sum().backward()
    assert torch.equal(paged, w.grad) and pool.pages_in_use() == 0


def test_no_warning_when_autograd_saves_nothing():
    gen = torch.Generator().manual_seed(SEED)
    pool = ps.PagePool(device_pages=16, page_bytes=4096)
    w = data(gen, (E, H, H)).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an UnpagedWarning fails the test
        for mode in (torch.no_grad, torch.inference_mode):
            with mode(), ps.paged_saved_tensors(pool) as paging:
                torch.bmm(paging.mark(data(gen), counts_of(3, 4)), w)
            assert paging.paged_tensors == paging.passed_tensors == 0
    # Marked under no_grad in a context that saves other tensors: the mark is a no-op
    # (documented: nothing marked there is saved), so nothing to warn about.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with ps.paged_saved_tensors(pool) as paging:
            with torch.no_grad():
                x = paging.mark(data(gen), counts_of(3, 4))
            torch.bmm(x.clone(), w).sum()
    assert paging.paged_tensors == 0 and paging.passed_tensors > 0
    assert untouched(pool)
