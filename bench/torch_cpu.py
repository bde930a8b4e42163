"""The package's ops on CPU tensors (the host executor): GB/s of a stash and of a reload, lossless
and each compression, side by side on the same tensor. GB/s = 2 x the BF16 live bytes / s (every
live byte read once and written once), so a compressed row and its lossless row compare by time.

    python bench/torch_cpu.py [--tokens 64 512 2048] [--threads N] [--repeats 7]
    python bench/torch_cpu.py --call-cost [--calls 20000]


A `bf16/capacity` tensor at DeepSeek-V3's hidden (7168), 8 experts of `tokens` tokens each, capacity
twice that; the best of `repeats` runs; the ops run on `torch.get_num_threads()` threads (set by
--threads), one for each MiB of the stream at most.

--call-cost: the host cost of one call, us per op: a stash and a reload of a record with every count
zero (no live row: the op is only its call), through the torch op (torch.ops.pagestash.stash/reload,
the record's arguments made once) and through Record.stash/reload, beside torch.index_select of no
rows of the same tensor (torch's own cost of an op call). Best and median of `calls` calls, each
timed alone; for bf16/capacity (the registry's 3rd recipe) and nvfp4/capacity/swizzled (its last:
data, scales and amax).
"""
import argparse
import time

import torch

import pagestash as ps

GROUPS, HIDDEN = 8, 7168


def rates(rec, x, counts, out, repeats):
    stash, reload = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        rec.stash(x, counts)
        t1 = time.perf_counter()
        rec.reload(out)
        t2 = time.perf_counter()
        stash.append(t1 - t0)
        reload.append(t2 - t1)
    return min(stash), min(reload)


def best_median(f, calls):
    """(best us, median us) of `calls` calls of f, each timed alone."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0] * 1e6, times[len(times) // 2] * 1e6


def call_cost(args):
    from pagestash._ops import ops
    pool = ps.PagePool(device_pages=64)
    print(f"threads {torch.get_num_threads()}; us per call, best / median of {args.calls}; every count zero")
    print("| recipe | call | best us | median us |")
    print("| --- | --- | --- | --- |")
    for recipe, shape in [("bf16/capacity", ps.Shape(GROUPS, 128, HIDDEN)),
                          ("nvfp4/capacity/swizzled", ps.Shape(GROUPS, 128, HIDDEN))]:
        info = ps.recipe_info(recipe, shape)
        if recipe.startswith("bf16"):
            data = torch.zeros(shape.groups, shape.tokens, shape.hidden, dtype=torch.bfloat16)
        else:
            data = torch.zeros(info["data_bytes"], dtype=torch.uint8)
        scales = torch.zeros(info["scales_bytes"], dtype=torch.uint8) if info["scales_bytes"] else None
        amax = torch.zeros(info["amax_bytes"] // 4, dtype=torch.float32) if info["amax_bytes"] else None
        counts = torch.zeros(shape.groups, dtype=torch.int32)
        rec = pool.record(recipe, shape)
        a = rec._args()
        rows = data.view(-1, data.shape[-1]) if data.dim() > 1 else data.view(-1, 1)
        none = torch.zeros(0, dtype=torch.int64)
        def op_stash():
            ops.stash(*a, data, counts, scales, amax, compression="lossless")

        def op_reload():
            ops.reload(*a, data, scales, amax, False, True, compression="lossless")

        # Alternate so that every reload follows a stash (a reload of nothing poisons: another path).
        s_times, r_times = [], []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            op_stash()
            t1 = time.perf_counter()
            op_reload()
            t2 = time.perf_counter()
            s_times.append(t1 - t0)
            r_times.append(t2 - t1)
        rs_times, rr_times = [], []
        for _ in range(args.calls // 4):
            t0 = time.perf_counter()
            rec.stash(data, counts, scales, amax, check=False)
            t1 = time.perf_counter()
            rec.reload(data, scales, amax, check=False)
            t2 = time.perf_counter()
            rs_times.append(t1 - t0)
            rr_times.append(t2 - t1)
        pool.end_step()
        pool.reset()
        for name, times in [("torch op stash", s_times), ("torch op reload", r_times),
                            ("Record.stash", rs_times), ("Record.reload", rr_times)]:
            times.sort()
            print(f"| {recipe} | {name} | {times[0] * 1e6:.2f} | {times[len(times) // 2] * 1e6:.2f} |")
        best, median = best_median(lambda: torch.index_select(rows, 0, none), args.calls)
        print(f"| {recipe} | torch.index_select, no rows | {best:.2f} | {median:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--call-cost", action="store_true", help="the host cost of a call (no live rows)")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.call_cost:
        return call_cost(args)
    torch.manual_seed(0)
    print(f"threads {torch.get_num_threads()}; GB/s = 2 x BF16 live bytes / s; x = this time / lossless time")
    print("| tokens | live MiB | compression | stash GB/s | x | reload GB/s | x |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tokens in args.tokens:
        capacity = 2 * tokens
        counts = torch.full((GROUPS,), tokens, dtype=torch.int32)
        x = torch.randn(GROUPS, capacity, HIDDEN).to(torch.bfloat16)
        out = torch.empty_like(x)
        live = GROUPS * tokens * HIDDEN * 2
        pool = ps.PagePool(device_pages=2 * live // 65536 + 64)
        lossless = None
        for compression in ["lossless"] + [c for c in ps.COMPRESSIONS if c != "lossless"]:
            rec = pool.record("bf16/capacity", ps.Shape(GROUPS, capacity, HIDDEN), compression=compression)
            stash, reload = rates(rec, x, counts, out, args.repeats)
            lossless = lossless or (stash, reload)
            print(f"| {tokens} | {live / 2**20:.0f} | {compression} | {2 * live / stash / 1e9:.1f} | "
                  f"{stash / lossless[0]:.1f} | {2 * live / reload / 1e9:.1f} | {reload / lossless[1]:.1f} |")


if __name__ == "__main__":
    main()
