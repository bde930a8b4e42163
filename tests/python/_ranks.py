"""Runs a function on several spawned ranks (Gloo over a file), for the tests that agree
flags across ranks."""

import torch


def run_ranks(rank_fn, world, init_file):
    """rank_fn(rank, world, init_file, results) in `world` spawned processes, each putting
    one tuple into `results`; returns the tuples sorted (by rank first)."""
    results = torch.multiprocessing.get_context("spawn").SimpleQueue()
    torch.multiprocessing.start_processes(rank_fn, args=(world, init_file, results), nprocs=world,
                                          start_method="spawn")
    return sorted(results.get() for _ in range(world))
