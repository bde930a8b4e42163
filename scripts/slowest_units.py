#!/usr/bin/env python3
"""The slowest compile units of CMake/Ninja build folders, from Ninja's own log (.ninja_log).

    scripts/slowest_units.py [-n 10] FOLDER...

Prints a table: seconds, build folder, object. Each object's last build counts (a rebuilt
object's earlier times are gone from the run), and only objects (.o), not links or archives.
"""
import argparse
import os
import sys


def units(folder):
    log = os.path.join(folder, ".ninja_log")
    if not os.path.exists(log):
        return {}
    last = {}
    with open(log) as f:
        for line in f:
            if line.startswith("#"):
                continue
            start, end, _mtime, output = line.split("\t")[:4]
            if output.endswith(".o"):
                last[output] = (int(end) - int(start)) / 1000.0
    return last


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=10, help="rows (default 10)")
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args()
    rows, total = [], 0.0
    for folder in args.folders:
        for output, seconds in units(folder).items():
            rows.append((seconds, folder, output))
            total += seconds
    rows.sort(reverse=True)
    print(f"The {min(args.n, len(rows))} slowest of {len(rows)} compile units ({total:.0f} s of compiling in all):")
    print(f"{'seconds':>8}  {'build':<16} object")
    for seconds, folder, output in rows[: args.n]:
        name = output.replace("CMakeFiles/", "").replace(".dir/", "/")
        print(f"{seconds:8.1f}  {folder:<16} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
