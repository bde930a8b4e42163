#!/usr/bin/env python3
"""Plots GB/s against live size for every kernel and baseline of a stash_bench JSON file
(stash_bench --benchmark_out=bench.json --benchmark_out_format=json), one panel per recipe.

    python3 bench/plot.py bench.json docs/benchmarks-gpu.png "H200, 2026-11-29, abc1234"
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst, title):
    with open(src) as f:
        runs = json.load(f)["benchmarks"]
    # name = kernel/recipe/<N>MiB[/manual_time]
    series = defaultdict(lambda: defaultdict(list))
    for run in runs:
        parts = run["name"].split("/")
        if len(parts) < 3 or "GB/s" not in run or not parts[2].endswith("MiB"):
            continue
        kernel, recipe, size = parts[0], parts[1], int(parts[2][:-3])
        series[recipe][kernel].append((size, run["GB/s"]))
    recipes = sorted(series)
    fig, axes = plt.subplots(1, len(recipes), figsize=(4 * len(recipes), 3.6), squeeze=False)
    for ax, recipe in zip(axes[0], recipes):
        for kernel, points in sorted(series[recipe].items()):
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=kernel)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("live MiB")
        ax.set_title(recipe)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GB/s (read + written)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: plot.py bench.json out.png title")
    main(*sys.argv[1:])
