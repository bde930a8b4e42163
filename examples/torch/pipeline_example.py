"""Pipeline parallelism with PyTorch's engine (torch.distributed.pipelining) and pagestash:
an MoE model of 8 layers split into stages over Gloo ranks on the CPU (a CUDA pool and NCCL
the same way on GPUs), each stage's capacity buffers paged, a pool sized per rank from the
engine's own order, and a step that overflows on any rank rerun on every rank.

    python examples/torch/pipeline_example.py [--ranks 2] [--schedule Interleaved1F1B] [--steps 4]
"""

import argparse
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

import pagestash as ps

EXPERTS, HIDDEN, CAPACITY, TOKENS, LAYERS = 8, 64, 32, 64, 8


class MoELayer(torch.nn.Module):
    def __init__(self, g):
        super().__init__()
        self.router = torch.nn.Parameter(torch.randn(HIDDEN, EXPERTS, generator=g) * HIDDEN**-0.5)
        self.w = torch.nn.Parameter((torch.randn(EXPERTS, HIDDEN, HIDDEN, generator=g) * HIDDEN**-0.5).bfloat16())

    def forward(self, x):
        probs = torch.softmax(x @ self.router, dim=-1)
        weight, expert = probs.max(-1)
        onehot = torch.nn.functional.one_hot(expert, EXPERTS)
        slot = (onehot.cumsum(0) * onehot).sum(1) - 1
        kept = (slot < CAPACITY).nonzero().squeeze(1)
        counts = onehot.sum(0).clamp(max=CAPACITY).to(torch.int32)
        buf = x.new_zeros(EXPERTS, CAPACITY, HIDDEN, dtype=torch.bfloat16)
        buf = buf.index_put((expert[kept], slot[kept]), x[kept].bfloat16())
        # [mark]
        buf = ps.mark(buf, counts)  # paged in the stage's paged context; as it is elsewhere
        # [mark]
        y = torch.bmm(buf, self.w)[expert[kept], slot[kept]].float() * weight[kept, None]
        return x + torch.zeros_like(x).index_add(0, kept, y)


def rank_main(rank, world, init_file, args):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    g = torch.Generator().manual_seed(0)
    layers = [MoELayer(g) for _ in range(LAYERS)]
    v = 1 if args.schedule in ("GPipe", "1F1B") else 2
    n = world * v
    per = LAYERS // n
    idx = [rank + world * k for k in range(v)]
    modules = [torch.nn.Sequential(*layers[i * per:(i + 1) * per]) for i in idx]
    stages = [PipelineStage(m, i, n, torch.device("cpu")) for m, i in zip(modules, idx)]
    cls = getattr(schedules, "Schedule" + args.schedule)
    schedule = cls(stages[0] if v == 1 else stages, n_microbatches=args.microbatches,
                   loss_fn=torch.nn.functional.mse_loss)
    opt = torch.optim.AdamW([p for m in modules for p in m.parameters()], lr=1e-3)
    # [pipeline]
    order = ps.pipeline_schedule(schedule, rank, per)  # this rank's stashes and reloads, the engine's order
    sizing = ps.size_pool([("bf16/capacity", ps.Shape(EXPERTS, CAPACITY, HIDDEN))], schedule=order,
                          tokens=TOKENS, top_k=1, page_bytes=16 << 10, overflow=0.01)
    pool = ps.PagePool(sizing.device_pages, page_bytes=sizing.page_bytes)
    paging = ps.PipelinePaging(pool, schedule)  # a paged context per stage forward of a step
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(args.microbatches * TOKENS, HIDDEN, generator=g)
        target = torch.randn(args.microbatches * TOKENS, HIDDEN, generator=g)
        inputs = (x,) if 0 in idx else ()
        last = dict(target=target, losses=[]) if n - 1 in idx else {}
        how = paging.run_step(*inputs, zero_grad=opt, **last)  # 'paged', or 'rerun' on every rank
        opt.step()
    # [pipeline]
        if rank == 0:
            print(f"step {step}: {how}")
    print(f"rank {rank}: pool of {pool.device_pages} pages ({sizing.alive_stashes} stashes at the peak of "
          f"{args.schedule}), {pool.totals['reruns']} reruns, {pool.pages_held()} pages held")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--schedule", default="Interleaved1F1B",
                        choices=["GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"])
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        torch.multiprocessing.start_processes(rank_main, args=(args.ranks, os.path.join(d, "init"), args),
                                              nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
