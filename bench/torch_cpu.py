"""The package's ops on CPU tensors (the host executor): GB/s of a stash and of a reload, lossless
and each compression, side by side on the same tensor. GB/s = 2 x the BF16 live bytes / s (every
live byte read once and written once), so a compressed row and its lossless row compare by time.

    python bench/torch_cpu.py [--tokens 64 512 2048] [--threads N] [--repeats 7]

A `bf16/capacity` tensor at DeepSeek-V3's hidden (7168), 8 experts of `tokens` tokens each, capacity
twice that; the best of `repeats` runs; the ops run on `torch.get_num_threads()` threads (set by
--threads), one for each MiB of the stream at most.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
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
