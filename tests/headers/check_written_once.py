#!/usr/bin/env python3
"""A list or rule is written once and read everywhere else (issue 56): each check below finds, in the sources, the
copies that once existed, and fails if one comes back.

  - no enum of python/csrc repeats the enumerators of an enum in include/ (the ops' Op was ps::Operation's copy);
  - the compression block rule (`hidden % ...::block`) is written once, in layouts/view.hpp (compression_refusal);
  - PAGESTASH_FOR_EACH_COMPRESSION is defined once, in layouts/compression.hpp, and Compressed<Format> checks it;
  - the executors' front doors (execution/, nccl.cuh) compare no memory spaces themselves: they call
    check_memory_space (stash/checks.hpp); and they run no step of grow's or shrink's sequence themselves
    (PoolResize::grow and ::shrink, pool/page_pool.hpp);
  - the sizer's settings are one table (PAGESTASH_SIZING_SETTINGS): the Python binding and the command name none of
    its fields by hand.

Usage: check_written_once.py SOURCE_ROOT"""
import pathlib
import re
import sys

ENUM = re.compile(r"enum\s+class\s+(\w+)\s*(?::\s*[\w:]+\s*)?\{([^}]*)\}", re.S)


def sources(root, *globs):
    for pattern in globs:
        yield from sorted(root.glob(pattern))


def enums(paths):
    found = {}
    for path in paths:
        for name, body in ENUM.findall(path.read_text()):
            body = re.sub(r"//[^\n]*", "", body)
            names = tuple(e.split("=")[0].strip() for e in body.split(",") if e.strip())
            found[(path, name)] = names
    return found


def main(root):
    failures = []
    include = list(sources(root, "include/**/*.hpp", "include/**/*.cuh"))
    csrc = list(sources(root, "python/csrc/*.hpp", "python/csrc/*.cpp", "python/csrc/*.cu"))

    library = enums(include)
    for (path, name), names in enums(csrc).items():
        for (lib_path, lib_name), lib_names in library.items():
            if names == lib_names:
                failures.append(f"{path.relative_to(root)}: enum {name} {names} copies {lib_name} of "
                                f"{lib_path.relative_to(root)}: use that one")

    rule = re.compile(r"hidden\s*%\s*[\w:]+::block\b")
    sites = [f"{p.relative_to(root)}" for p in include + csrc for _ in rule.findall(p.read_text())]
    if sites != ["include/pagestash/layouts/view.hpp"]:
        failures.append(f"the compression block rule (hidden % block) is written at {sites}: once, in "
                        "layouts/view.hpp's compression_refusal, which the others call")

    defined = [f"{p.relative_to(root)}" for p in include + csrc
               for _ in re.findall(r"#define\s+PAGESTASH_FOR_EACH_COMPRESSION\b", p.read_text())]
    compression = (root / "include/pagestash/layouts/compression.hpp").read_text()
    if defined != ["include/pagestash/layouts/compression.hpp"] or "static_assert(compression_format<" not in compression:
        failures.append(f"PAGESTASH_FOR_EACH_COMPRESSION is defined at {defined}: once, in layouts/compression.hpp, "
                        "whose Compressed<Format> checks it (compression_format)")

    front_doors = sources(root, "include/pagestash/execution/*.hpp", "include/pagestash/execution/*.cuh",
                          "include/pagestash/nccl.cuh")
    for path in front_doors:
        text = path.read_text()
        for number, line in enumerate(text.split("\n"), 1):
            if re.search(r"space\(\)\s*[!=]=|MemorySpace::\w+\s*[!=]=", line):
                failures.append(f"{path.relative_to(root)}:{number}: a memory space compared by hand: call "
                                "check_memory_space (stash/checks.hpp)")
            if re.search(r"PoolResize::(check|back|set|give_back)\b", line):
                failures.append(f"{path.relative_to(root)}:{number}: a step of grow's or shrink's sequence: call "
                                "PoolResize::grow or ::shrink (pool/page_pool.hpp)")

    sizing = (root / "include/pagestash/sizing/pool_sizing.hpp").read_text()
    table = re.search(r"#define PAGESTASH_SIZING_SETTINGS\(X\)(.*?)\n\n", sizing, re.S)
    settings = re.findall(r"X\([^,]+,\s*(\w+),", table.group(1)) if table else []
    if len(settings) < 7:
        failures.append(f"PAGESTASH_SIZING_SETTINGS has {settings}: the sizer's settings, one table")
    readers = [root / "python/csrc/sizing.hpp", root / "examples/pagestash_size/pagestash_size.cpp"]
    for path in readers:
        for name in settings:
            flag = "--" + name.replace("_", "-")
            if re.search(rf'"{name}"|"{flag}"', path.read_text()):
                failures.append(f"{path.relative_to(root)}: the setting {name} named by hand: read the table "
                                "(sizing::for_each_field on SizingSettings)")

    for failure in failures:
        print(failure, file=sys.stderr)
    print(f"{len(failures)} lists or rules written more than once")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]).resolve()))
