#!/usr/bin/env python3
"""What the README and docs say a command prints, checked against the command.

  check_docs.py transcripts DOC [--run NAME=PATH ...]
      Every transcript of DOC whose command is one of the NAMEs is run and compared: in a
      fenced block, a line `$ NAME ARGS  # comment` is a command (NAME runs as PATH ARGS), and
      the lines after it, up to the next command or the block's end, are what it prints on
      stdout. Trailing spaces do not count; a line `...` stands for any lines (none too); a
      line ending in ` ...` for any line that begins with what comes before it (the demo's
      GB/s columns, which are timings, are cut that way). Commands of other names are listed
      as not run; a DOC with no transcript of a NAME fails.

  check_docs.py flags PATH [--docs DOC ...] [--schedule-forms DOC]
      Every flag `PATH --help` lists (on stdout, exit 0) is named (`--flag`) in one of the
      DOCs. With --schedule-forms, every schedule form of DOC's schedule table (`lifo`,
      `1f1b:P`, `order:...`) is named in the --help text too.
"""
import os
import re
import shlex
import subprocess
import sys


def transcripts(doc):
    """(line number, command words, expected lines) of every `$ ` line in a fenced block of doc."""
    out, block, current = [], False, None
    for number, line in enumerate(open(doc).read().split("\n"), 1):
        if line.startswith("```"):
            block = not block
            current = None
            continue
        if not block:
            continue
        if line.startswith("$ "):
            current = (number, shlex.split(line[2:], comments=True), [])
            out.append(current)
        elif current is not None:
            current[2].append(line.rstrip())
    return out


def pattern(expected):
    parts = []
    for line in expected:
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif line.endswith(" ..."):
            parts.append(re.escape(line[:-4]) + r"[^\n]*\n")
        else:
            parts.append(re.escape(line) + r"\n")
    return "".join(parts)


def check_transcripts(doc, runs):
    failed, ran, skipped = 0, 0, []
    for number, words, expected in transcripts(doc):
        if not words or words[0] not in runs:
            skipped.append(f"{os.path.basename(doc)}:{number}: {' '.join(words)}")
            continue
        ran += 1
        command = [runs[words[0]]] + words[1:]
        result = subprocess.run(command, capture_output=True, text=True)
        actual = "".join(line.rstrip() + "\n" for line in result.stdout.rstrip("\n").split("\n"))
        while expected and expected[-1] == "":
            expected.pop()
        if result.returncode != 0 or not re.fullmatch(pattern(expected), actual):
            failed += 1
            print(f"{doc}:{number}: `{' '.join(words)}` (exit {result.returncode}) prints, on stdout:\n{actual}"
                  f"where the doc shows:\n" + "".join(line + "\n" for line in expected), file=sys.stderr)
            for want, got in zip(expected, actual.split("\n")):
                if want != "..." and not want.endswith(" ...") and want != got:
                    print(f"first differing line:\n  doc:  {want}\n  tool: {got}", file=sys.stderr)
                    break
    for line in skipped:
        print(f"not run (no tool given for it): {line}")
    if ran == 0:
        print(f"{doc}: no transcript of {', '.join(runs)}", file=sys.stderr)
        return 1
    print(f"{doc}: {ran - failed} of {ran} transcripts print what the doc shows")
    return 1 if failed else 0


def schedule_forms(doc):
    """The first backticked word of each row of the table whose header starts `| schedule |`."""
    forms, inside = [], False
    for line in open(doc):
        if line.startswith("| schedule |"):
            inside = True
        elif inside and line.startswith("|"):
            match = re.match(r"\| `([a-z0-9]+:?)", line)
            if match:
                forms.append(match.group(1))
        elif inside:
            break
    return forms


def check_flags(tool, docs, forms_doc):
    result = subprocess.run([tool, "--help"], capture_output=True, text=True)
    if result.returncode != 0 or not result.stdout:
        print(f"{tool} --help: exit {result.returncode}, {len(result.stdout)} characters on stdout "
              f"(expected 0, the flags on stdout); stderr: {result.stderr}", file=sys.stderr)
        return 1
    flags = sorted(set(re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9_-]*", result.stdout)))
    text = "".join(open(doc).read() for doc in docs)
    missing = [f for f in flags if not re.search(re.escape(f) + r"(?![a-z0-9_-])", text)]
    for flag in missing:
        print(f"{os.path.basename(tool)} --help lists {flag}, which none of {', '.join(docs)} names", file=sys.stderr)
    unlisted = []
    if forms_doc:
        forms = schedule_forms(forms_doc)
        if not forms:
            print(f"{forms_doc}: no schedule table", file=sys.stderr)
            return 1
        unlisted = [f for f in forms if f not in result.stdout]
        for form in unlisted:
            print(f"{forms_doc}'s schedule table has `{form}`, which {os.path.basename(tool)} --help does not list",
                  file=sys.stderr)
    if missing or unlisted:
        return 1
    print(f"{os.path.basename(tool)} --help: its {len(flags)} flags are named in the docs"
          + (f"; it lists the {len(schedule_forms(forms_doc))} schedule forms" if forms_doc else ""))
    return 0


def main(argv):
    mode, target, rest = argv[0], argv[1], argv[2:]
    options = {}
    key = None
    for word in rest:
        if word.startswith("--"):
            key = word
            options.setdefault(key, [])
        else:
            options[key].append(word)
    if mode == "transcripts":
        runs = dict(item.split("=", 1) for item in options.get("--run", []))
        return check_transcripts(target, runs)
    if mode == "flags":
        forms = options.get("--schedule-forms", [None])[0]
        return check_flags(target, options.get("--docs", []), forms)
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
