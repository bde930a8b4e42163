#!/usr/bin/env python3
"""The quick loop (`scripts/test quick`) builds every file its ctest selection reads.

Configures the quick loop's build (scripts/quick.sh: its CMake options, targets and ctest
regex) in a scratch folder, compiles nothing, and asks Ninja and ctest: every build output a
selected test names on its command line (the kernels' shape check: the instantiations'
library and the fast-math kernels' object), and the executable of every doctest target whose
discovered tests the regex selects, must be built by the quick targets (`ninja -t commands`).
A file that is not fails the check, naming the test and the target that builds it.

usage: check_quick_loop.py SOURCE_DIR SCRATCH_DIR [--quick FILE] [-- CMAKE_OPTION ...]
"""
import json
import os
import re
import shutil
import subprocess
import sys


def main(argv):
    extra = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    source, scratch = os.path.abspath(argv[0]), os.path.abspath(argv[1])
    quick = os.path.join(source, "scripts/quick.sh")
    if len(argv) > 3 and argv[2] == "--quick":
        quick = os.path.abspath(argv[3])
    out = subprocess.run(
        ["bash", "-c", 'source "$0"; printf "%s\\n" "${quick_cmake_options[@]}" --- "${quick_targets[@]}" --- '
         '"$quick_tests"', quick], check=True, capture_output=True, text=True).stdout.splitlines()
    cut = [i for i, line in enumerate(out) if line == "---"]
    options, targets, tests = out[:cut[0]], out[cut[0] + 1:cut[1]], out[cut[1] + 1]

    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run(["cmake", "-S", source, "-B", scratch, "-G", "Ninja", *options, *extra], check=True,
                   stdout=subprocess.DEVNULL)
    ninja = lambda *args: subprocess.run(["ninja", "-C", scratch, *args], check=True, capture_output=True,
                                         text=True).stdout
    # Every file the build makes (normalised absolute path -> Ninja's name for it) and who makes it.
    outputs = {}
    for line in ninja("-t", "targets", "all").splitlines():
        name = line.rsplit(": ", 1)[0]
        outputs[os.path.normpath(os.path.join(scratch, name))] = name
    built = ninja("-t", "commands", *targets)

    needed = []  # (test, file)
    selected = json.loads(subprocess.run(["ctest", "--show-only=json-v1", "-R", tests], cwd=scratch, check=True,
                                         capture_output=True, text=True).stdout)["tests"]
    for test in selected:
        for arg in test.get("command", []):
            for word in [arg] + arg.split("=")[1:]:
                path = os.path.normpath(word) if os.path.isabs(word) else None
                if path in outputs:
                    needed.append((test["name"], path))
    # doctest's tests are discovered after their executable is built: here, from the POST_BUILD commands.
    rules = open(os.path.join(scratch, "build.ninja")).read()
    for executable, prefix in re.findall(r'TEST_EXECUTABLE=(\S+).*?TEST_PREFIX=([^"]*)"', rules):
        if re.search(tests, prefix + "a test"):
            needed.append((f"{prefix}... (discovered from {os.path.basename(executable)})", os.path.normpath(executable)))
    if not selected and not needed:
        sys.exit(f"ctest -R '{tests}' selects no test in the quick build")

    missing = [(test, path) for test, path in needed if outputs[path] not in built]
    for test, path in missing:
        print(f"'{test}' reads {os.path.relpath(path, scratch)}, which the quick targets "
              f"({' '.join(targets)}) do not build", file=sys.stderr)
    if missing:
        print(f"add its target to quick_targets in {quick}", file=sys.stderr)
        return 1
    print(f"the quick targets ({' '.join(targets)}) build every file of the {len(needed)} the selected tests read")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
