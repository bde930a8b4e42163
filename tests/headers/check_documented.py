#!/usr/bin/env python3
"""Every function of the public namespace (pagestash and its public sub-namespaces; detail and reference/ apart) is
named in the docs: a public function is a documented one. The functions public today that no doc names yet are listed
below, to be documented or moved into namespace detail, and the list only shrinks (a listed name that a doc now
names, or that is gone, fails too, so that the list is kept exact).

Usage: check_documented.py SOURCE_ROOT"""
import pathlib
import re
import sys

NOT_DOCUMENTED_YET = {
    "check_pool_and_record", "check_reload", "code_tile", "compressed_stream_bytes", "count_fits", "device_blocks",
    "draw_step", "free_host", "host_alignment", "launch_blocks", "max_work_items", "model_shape_names",
    "prefetch_dead_lines", "prefetches_dead_lines", "quantile_value", "resolve_coded_tile",
    "state_after_stash", "tile_op", "tile_shift_for", "to_float", "vector_observer",
    "walk_step", "with_stash_policy",
}

# A declaration at namespace scope starts in column 0: specifiers, a return type, the name, "(".
DECLARATION = re.compile(r"^(?:(?:inline|constexpr|static|PAGESTASH_HOST_DEVICE|__global__|\[\[nodiscard\]\])\s+)*"
                         r"[A-Za-z_][\w:<>, ]*?[\s*&]+([a-z_][a-z_0-9]*)\(")


def public_functions(include):
    found = {}
    for header in sorted(include.rglob("*")):
        if header.suffix not in (".hpp", ".cuh") or "reference" in header.relative_to(include).parts:
            continue
        inside_detail = 0
        for number, line in enumerate(header.read_text().splitlines(), 1):
            if re.match(r"^namespace detail \{", line):
                inside_detail += 1
            elif re.match(r"^\}\s*// namespace detail", line):
                inside_detail -= 1
            elif not inside_detail and (m := DECLARATION.match(line)) and not line.startswith(("return", "else")):
                found.setdefault(m.group(1), f"{header.relative_to(include.parent)}:{number}")
        if inside_detail != 0:
            sys.exit(f"{header}: 'namespace detail {{' and '}}  // namespace detail' do not pair up")
    return found


def main():
    root = pathlib.Path(sys.argv[1])
    functions = public_functions(root / "include" / "pagestash")
    docs = "\n".join(p.read_text() for p in sorted((root / "docs").glob("*.md")))
    named = {name for name in functions if re.search(rf"\b{name}\b", docs)}
    errors = [f"  {functions[n]}: {n} is public but no doc in docs/ names it (document it, or move it into detail)"
              for n in sorted(set(functions) - named - NOT_DOCUMENTED_YET)]
    errors += [f"  {n}: listed as not documented yet, but "
               + ("a doc names it" if n in named else "it is no longer a public function") + ": take it off the list"
               for n in sorted(NOT_DOCUMENTED_YET & (named | (NOT_DOCUMENTED_YET - set(functions))))]
    if errors:
        sys.exit("the public functions and the docs disagree:\n" + "\n".join(errors))
    print(f"{len(functions)} public functions, {len(functions) - len(NOT_DOCUMENTED_YET)} named in docs/, "
          f"{len(NOT_DOCUMENTED_YET)} not documented yet")


if __name__ == "__main__":
    main()
