#!/usr/bin/env python3
"""Draws pagestash_size's curve: per-step overflow probability against pool size, with its
Wilson interval, the planned pool and the warm-up x factor pools.

    python3 plot_sizing.py sizing.json sizing.png

Without matplotlib it says so and exits 0 (the plot is optional)."""

import json
import sys


def main(src, dst):
    try:
        import matplotlib
    except ImportError:
        print("plot_sizing.py: matplotlib is not installed; no plot (pip install matplotlib)", file=sys.stderr)
        return 0
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(src) as f:
        sizing = json.load(f)
    mib = sizing["page_bytes"] / 2**20
    floor = 0.5 / sizing["samples"]  # a probability of 0 drawn on the log axis
    curve = sizing["curve"]
    x = [c["pages"] * mib for c in curve]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.fill_between(x, [max(c["ci"][0], floor) for c in curve], [max(c["ci"][1], floor) for c in curve],
                    alpha=0.25, label="95% interval")
    ax.plot(x, [max(c["overflow"], floor) for c in curve], marker=".", label="P(step overflows)")
    ax.axhline(sizing["overflow"], color="grey", linestyle=":", label=f"target {sizing['overflow']:g}")
    ax.axvline(sizing["pages"] * mib, color="black", label=f"planned: {sizing['pages'] * mib:.0f} MiB")
    styles = ["--", "-.", (0, (1, 1)), (0, (5, 1, 1, 1)), (0, (3, 3))]
    for w, style in zip(sizing["warmup"], styles * (1 + len(sizing["warmup"]) // len(styles))):
        ax.axvline(w["median_pages"] * mib, color="tab:red", linestyle=style,
                   label=f"warm-up x {w['factor']:g}: {w['median_pages'] * mib:.0f} MiB")
    ax.set_yscale("log")
    ax.set_xlabel("pool size (MiB)")
    ax.set_ylabel("per-step overflow probability")
    ax.set_title(f"{sizing['recipe']}, {sizing['experts']} experts, hidden {sizing['hidden']}, {sizing['schedule']} "
                 f"({sizing['alive_stashes']} stashes)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst)
    print(f"plot_sizing.py: wrote {dst}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
