#!/usr/bin/env python3
"""The shape of the compiled stash kernels, read from the instantiation library (no GPU).

For every operation kernel (stash, reload, discard of every layout x traits instantiated)
and the reset kernel, per architecture in the library:
  - stack frame 0 bytes, no spills (no STL/LDL in the SASS), at most 64 registers;
  - the copy loop moves 128-bit vectors: a 128-bit global load and store (LDG.E.128, STG.E.128),
    with at least loads_in_flight of those loads issued before a store (stash/policy.hpp);
  - the unaligned paths keep loads_in_flight vectors in flight too (loads_in_flight below):
    a reload kernel's scatter has at least loads_in_flight 128-bit loads issued when the
    first of them is read by anything but a 128-bit store (an unaligned one goes to shifts
    and narrow stores); a stash kernel's gather has at least WORDS_PER_VECTOR x
    loads_in_flight 4-byte evict-first loads (LDG.E.EF, the buffer's words) issued before
    the first instruction that reads one of them (the table shows words / 4);
  - a stash kernel's staged mover of short lines (copy_tile_staged), where the policy has the
    kernels stage (StashPolicy::staged), has at least staged_loads 128-bit evict-first loads
    (its chunks) issued before the first instruction that reads one;
  - no integer division (I2F.U32.RP, the start of its reciprocal) inside a per-vector copy loop
    (an innermost loop with a 128-bit global load or store), with and without --use_fast_math:
    locate() and value_at() find a line by a multiply-high (issue 54);
  - no L1 invalidation (CCTL.IVALL, what an acquire load or fence at device scope compiles
    to) inside a spin loop (a backward branch whose body sleeps, NANOSLEEP): a waiter polls
    relaxed and fences once after; and at most MAX_CCTL_IVALL of them in the kernel;
  - no block barrier (BAR.SYNC) between the verdict and the first data load: a stash or reload
    kernel has a spin loop (the verdict's wait) with a path to an evict-first vector or word
    load that passes no BAR.SYNC (issue 53; the arrival's and the locks' waits end at one);
  - a lossless stash kernel looks ahead (stash/look_ahead.hpp): it has the L2 bulk prefetch (cp.async.bulk.prefetch.L2:
    UBLKPF.L2 or BLKPF.L2) that its other blocks' warps issue before the verdict (issue 53);
  - a programmatic launch's order (execution/cuda.cuh): an operation kernel waits for the kernel before it
    (griddepcontrol.wait: ACQBULK) before its first global memory access and first branch, and lets the next one start
    (griddepcontrol.launch_dependents: PREEXIT);
  - no sequentially consistent fence (MEMBAR.SC.GPU, what __threadfence() and fence.sc.gpu
    compile to) in an operation kernel: the launch protocol releases with release stores and
    acq_rel read-modify-writes, and acquires with acquire fences (MEMBAR.ALL.GPU at most;
    docs/design.md, "Memory ordering"), issue 53;
  - with --fast-math OBJ (kernels compiled with --use_fast_math): each of OBJ's kernels keeps
    the rules above on registers, stack, spills and fences, and has the float arithmetic (FMUL, FADD, FFMA, FCHK, MUFU with their modifiers, and every .FTZ
    instruction, counted) of the same kernel in the library, so the flags a user compiles
    the header-only library with change none of it (a flushing FMUL.FTZ or an approximate
    MUFU.RCP division in the codec would).
Prints a table (kernel, registers, stack, local loads/stores, shared memory, resident
blocks per SM at the policies' threads per block, L1 invalidations) and exits 1 if any kernel breaks a rule.

cuobjdump and nvdisasm come from PyPI (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm;
scripts/install-deps installs them) or the toolkit.
"""
import argparse
import collections
import concurrent.futures
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

POLICY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "pagestash", "stash",
                      "policy.hpp")


def policy_values(name):
    """The values the policies of stash/policy.hpp give the constant `name`."""
    with open(POLICY) as f:
        values = {int(v) for v in re.findall(rf"static constexpr [\w:]+ {name} = (\d+);", f.read())}
    if not values:
        sys.exit(f"check_kernels: no {name} in {POLICY}")
    return values


MAX_REGISTERS = 64
# 4-byte loads per 16-byte vector: the gather's words in flight, counted in vectors.
WORDS_PER_VECTOR = 4
MIN_LOADS_IN_FLIGHT = min(policy_values("loads_in_flight"))  # the copy loop's, at the least
# The staged mover of short lines (copy_tile_staged): its 128-bit chunk loads a lane has in flight before it reads one.
MIN_STAGED_LOADS = min(policy_values("staged_loads"))
with open(POLICY) as _f:  # whether the kernels stage at all (StashPolicy::staged; off: no staged loads to count)
    STAGED = re.search(r"static constexpr bool staged = true;", _f.read()) is not None
THREADS = max(policy_values("threads_per_block"))  # the launch's: one count in every policy
# CCTL.IVALL in a kernel's code (each acquire: arrival, verdict, lock, finish, in the steps
# the kernel inlines); none may be in a spin loop.
MAX_CCTL_IVALL = 12


# The float arithmetic a compiler flag can change (--use_fast_math: FMUL.FTZ, MUFU.RCP for a division), and every
# flushing (.FTZ) instruction; the integer code around it may be scheduled otherwise from one unit to another.
FLOAT_ARITHMETIC = re.compile(r"^(FMUL|FADD|FFMA|FCHK|MUFU)\b")

# A global memory access: a load, store, atomic or reduction on global or generic memory.
GLOBAL_ACCESS = re.compile(r"(?:^|\s)(?:LDG|STG|ATOMG|ATOM|RED|LD|ST)(?:\.|\s)")

REGISTER = re.compile(r"\bR(\d+)(\.64)?\b")


def registers(operand):
    """The registers an operand names: R4 -> [4], R4.64 (a pair, in an address) -> [4, 5]."""
    out = []
    for m in REGISTER.finditer(operand):
        r = int(m.group(1))
        out += [r, r + 1] if m.group(2) else [r]
    return out


# Opcodes whose operands are all read (no destination register).
NO_DESTINATION = ("ST", "RED", "BRA", "BSSY", "BSYNC", "BAR", "EXIT", "CALL", "RET", "WARPSYNC", "MEMBAR", "CCTL",
                  "NANOSLEEP", "YIELD", "NOP", "ERRBAR", "FENCE")


PREDICATE = re.compile(r"@!?U?P\w+\s+")
BRANCH = re.compile(r"BRA(?:\.\w+)* (?:!?U?P\w+, )?0x([0-9a-f]+)")
CONDITIONAL_BRANCH = re.compile(r"BRA(?:\.\w+)* !?U?P")


def parse(instructions):
    """(opcode, destination registers, source registers, branch target or None, taken always,
    predicated) for each instruction, in address order."""
    index = {a: i for i, (a, _) in enumerate(instructions)}
    out = []
    for _, ins in instructions:
        p = PREDICATE.match(ins)
        predicated = p is not None
        ins = ins[p.end():] if p else ins
        opcode, _, rest = ins.partition(" ")
        operands = [o.strip() for o in rest.split(",")] if rest else []
        writes = not opcode.startswith(NO_DESTINATION) and operands
        dest = registers(operands[0]) if writes else []
        if dest and opcode.startswith("LDG"):
            width = 4 if opcode.endswith(".128") else (2 if opcode.endswith(".64") else 1)
            dest = list(range(dest[0], dest[0] + width))
        sources = {r for o in (operands[1:] if writes else operands) for r in registers(o)}
        b = BRANCH.match(ins)
        target = index.get(int(b.group(1), 16)) if b else None
        always = target is not None and not predicated and not CONDITIONAL_BRANCH.match(ins)
        out.append((opcode, dest, sources, target, always, predicated))
    return out


def loads_in_flight(code, is_load, counts, steps=600):
    """The most loads (is_load(opcode)) issued and not yet read at an instruction that reads
    one of them (or writes it, unpredicated) and that counts(opcode) accepts: the loads a lane
    has in flight when it first waits on one. Along paths the code can run: from the start and from
    every branch target, `steps` instructions at most, falling through conditional branches,
    taking unconditional forward ones, ending at a backward branch or an EXIT."""
    # What each step needs, once per instruction (the walks below visit each many times).
    steps_of = []
    for opcode, dest, sources, target, always, predicated in code:
        # An unpredicated write of a load's register waits for the load too; a predicated
        # one (a default where the load was predicated off) may not run: neither.
        waited = frozenset(sources) if predicated else frozenset(sources) | frozenset(dest)
        load = tuple(dest) if dest and is_load(opcode) else None
        stop = opcode == "EXIT" or (target is not None and target <= len(steps_of) and always)
        steps_of.append((waited, counts(opcode), load, stop, target if always else None))
    starts = {0} | {c[3] for c in code if c[3] is not None}
    best = 0
    for start in starts:
        pending = []  # the registers of each load issued, not yet read
        i = start
        for _ in range(steps):
            if i >= len(steps_of):
                break
            waited, counted, load, stop, jump = steps_of[i]
            if pending:
                kept = [p for p in pending if waited.isdisjoint(p)]
                if counted and len(kept) < len(pending):
                    best = max(best, len(pending))
                pending = kept
            if load:
                pending.append(load)
            if stop:
                break
            i = jump if jump is not None and jump > i else i + 1
    return best


def is_word_load(opcode):
    """A 4-byte evict-first global load: the gather's words (copy.hpp load_word)."""
    m = re.match(r"LDG\.E((?:\.[A-Z0-9]+)*)$", opcode)
    return bool(m) and ".EF" in m.group(1) and not re.search(r"\.(?:U8|S8|U16|S16|64|128)\b", m.group(1))


def is_vector_load(opcode):
    """A 128-bit evict-first global load: a stream vector on reload (copy.hpp load16)."""
    return re.match(r"LDG\.E(?:\.[A-Z]+)*\.128$", opcode) is not None and ".EF" in opcode


def barrier_free_waits(code, spin_loops, index):
    """How many spin loops a path leaves for a data load (an evict-first vector or word load: the copy's first) with no
    block barrier (BAR.SYNC) on the way. The verdict's wait is one: a non-owner block's warps leave it for their tiles
    and hand the verdict on with shuffles (issue 53); the arrival's and the locks' waits end at a barrier."""
    def successors(i):
        opcode, _, _, target, always, predicated = code[i]
        if opcode == "EXIT" and not predicated:
            return []
        if target is not None:
            return [target] if always else [target, i + 1]
        return [i + 1]

    found = 0
    for lo, hi in spin_loops:
        first, last = index[lo], index[hi]
        todo = [last + 1] + [c[3] for c in code[first:last + 1] if c[3] is not None and not first <= c[3] <= last]
        seen = set()
        while todo:
            i = todo.pop()
            if i in seen or i >= len(code) or code[i][0].startswith("BAR.SYNC"):
                continue
            seen.add(i)
            if is_vector_load(code[i][0]) or is_word_load(code[i][0]):
                found += 1
                break
            todo += successors(i)
    return found


def find_tool(name):
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia  # namespace package of NVIDIA's PyPI wheels
        for root in nvidia.__path__:
            for path in glob.glob(os.path.join(root, "*", "bin", name)):
                return path
    except ImportError:
        pass
    sys.exit(f"check_kernels: {name} not found; run scripts/install-deps "
             f"(pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def short_name(pretty):
    """operation_kernel<Traits, Op> -> 'Op Layout<...> [traits]', compact."""
    s = re.sub(r"\b(?:pagestash|v0_1_0|detail)::", "", pretty)
    s = re.sub(r"Minifloat<(\w+)Spec>", r"\1", s)
    s = re.sub(r"MXFP8<(\w+) ?>", r"MXFP8_\1", s)
    m = re.match(r"void operation_kernel<(.*), \(Operation\)(\d)>\(", s)
    if not m:
        return s.split("(")[0].replace("void ", "")
    traits, op = m.group(1), ["stash", "reload", "discard"][int(m.group(2))]
    traits = re.sub(r"StashTraits<(.*)>$", r"\1", traits)
    traits = re.sub(r"\(Handling\)(\d)", lambda h: "DPK"[int(h.group(1))], traits)
    return f"{op:8s} {traits}"


def resident_blocks(registers, shared, arch):
    """Blocks of THREADS threads an SM holds: registers (allocated per warp in units of 256),
    threads (2048), shared memory (228 KiB, 1 KiB reserved per block), 32 blocks."""
    warps = THREADS // 32
    per_warp = -(-registers * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps) if registers else 32
    by_threads = 2048 // THREADS
    by_shared = (228 * 1024) // (shared + 1024)
    return min(by_regs, by_threads, by_shared, 32)


def analyse(cuobjdump, path):
    """{(arch, mangled): shape} of the operation and reset kernels in one object or library."""

    def lines_of(option, header):
        """(arch, function, line) for each line of cuobjdump's output under a function header."""
        text = subprocess.run([cuobjdump, option, path], capture_output=True, text=True, check=True).stdout
        arch, name = "?", None
        for line in text.splitlines():
            m = "arch = " in line and re.search(r"arch = (sm_\d+a?)", line)
            if m:
                arch = m.group(1)
            m = "Function" in line and re.search(header, line)
            if m:
                name = m.group(1)
                continue
            yield arch, name, line

    kernels = {}  # (arch, mangled) -> dict
    for arch, name, line in lines_of("--dump-resource-usage", r"^\s*Function (\S+):"):
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and name and ("operation_kernel" in name or "reset_kernel" in name or "resize_kernel" in name):
            kernels[(arch, name)] = dict(zip(("regs", "stack", "shared", "local"), map(int, m.groups())))
    if not kernels:
        return kernels  # nothing to disassemble (the format and layout kernels' objects)
    code = {}  # (arch, mangled) -> [(address, instruction)]
    for arch, name, line in lines_of("-sass", r"Function : (\S+)"):
        k = kernels.get((arch, name))
        if k is None:
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            code.setdefault((arch, name), []).append((int(m.group(1), 16), m.group(2)))
            opcode = PREDICATE.sub("", m.group(2)).split(" ")[0]
            if FLOAT_ARITHMETIC.match(opcode) or ".FTZ" in opcode:
                k.setdefault("float_ops", collections.Counter())[opcode] += 1
        k["spills"] = k.get("spills", 0) + (len(re.findall(r"\b(?:STL|LDL)\b", line)) if "STL" in line or "LDL" in line else 0)
        # Cache hints show as modifiers: LDG.E.EF.128 (evict-first), STG.E.EF.128.
        load = "LDG" in line and re.search(r"\bLDG\.E(?:\.[A-Z]+)*\.128\b", line) or None
        store = "STG" in line and re.search(r"\bSTG\.E(?:\.[A-Z]+)*\.128\b", line) or None
        k["ld128"] = k.get("ld128", False) or load is not None
        k["st128"] = k.get("st128", False) or store is not None
        # Loads in flight: the longest run of 128-bit loads before a store.
        k["run"] = k.get("run", 0) + 1 if load else (0 if store else k.get("run", 0))
        k["batch"] = max(k.get("batch", 0), k["run"])

    for key, instructions in code.items():
        k = kernels[key]
        k["membar_sc"] = sum(1 for _, ins in instructions if "MEMBAR.SC.GPU" in ins)
        # The grid dependency's wait before the first global access and the first branch, in address order: so in
        # the entry's straight line, ahead of every access on every path. And the trigger somewhere.
        first_wait = next((a for a, ins in instructions if re.search(r"\bACQBULK\b", ins)), None)
        firsts = [next((a for a, ins in instructions if pattern.search(ins)), None)
                  for pattern in (GLOBAL_ACCESS, re.compile(r"\b(?:BRA|JMP|CALL|BRX|JMX)\b"))]
        k["waits_first"] = first_wait is not None and all(f is None or first_wait < f for f in firsts)
        k["triggers"] = any(re.search(r"\bPREEXIT\b", ins) for _, ins in instructions)
        k["prefetches"] = any(re.search(r"\bU?BLKPF\.L2\b", ins) for _, ins in instructions)
        invalidations = [a for a, ins in instructions if "CCTL.IVALL" in ins]
        sleeps = [a for a, ins in instructions if "NANOSLEEP" in ins]
        exits = [a for a, ins in instructions if re.search(r"\bEXIT\b", ins)]
        # A spin loop: the innermost loop around a sleep, i.e. the shortest backward branch
        # whose range holds that sleep and no EXIT (the branches back from out-of-line code
        # after the kernel's body span an EXIT: not loops). An outer loop around a spin loop
        # (the arrival's retry when another block changed the word) runs once per change,
        # not once per poll: a fence there is not a fence per poll.
        loops = []
        for a, ins in instructions:
            b = re.search(r"\bBRA(?:\.\w+)* (?:\w+, )?0x([0-9a-f]+)", ins)
            if b and int(b.group(1), 16) <= a:
                lo = int(b.group(1), 16)
                if not any(lo <= e <= a for e in exits):
                    loops.append((lo, a))
        spin_loops = set()
        for z in sleeps:
            around = [(lo, hi) for lo, hi in loops if lo <= z <= hi]
            if around:
                spin_loops.add(min(around, key=lambda r: r[1] - r[0]))
        parsed = parse(instructions)
        k["gather"] = loads_in_flight(parsed, is_word_load, lambda op: True)
        k["scatter"] = loads_in_flight(parsed, is_vector_load, lambda op: not re.match(r"STG.*\.128$", op))
        # The staged stash: its chunk loads are read by anything (the shifts into the stage), all issued first.
        k["staged"] = loads_in_flight(parsed, is_vector_load, lambda op: True)
        # The movers' per-vector loops: the innermost loops (a backward branch with no other inside its range) that
        # move 128-bit vectors (a 128-bit global load or store). An integer division (its reciprocal's I2F.U32.RP, and
        # the IMAD.HI/correction steps after it) in one is paid per vector: none may have one.
        vector_loops = [(lo, hi) for lo, hi in loops
                        if not any((lo2, hi2) != (lo, hi) and lo <= lo2 and hi2 <= hi for lo2, hi2 in loops)
                        and any(lo <= a <= hi and re.search(r"\b(?:LDG|STG)\.E(?:\.[A-Z]+)*\.128\b", ins)
                                for a, ins in instructions)]
        k["division_in_vector_loop"] = sum(
            1 for a, ins in instructions if "I2F.U32.RP" in ins and any(lo <= a <= hi for lo, hi in vector_loops))
        k["cctl"] = len(invalidations)
        k["cctl_in_spin"] = sum(1 for c in invalidations if any(lo <= c <= hi for lo, hi in spin_loops))
        k["spin_loops"] = len(spin_loops)
        k["barrier_free_waits"] = barrier_free_waits(parsed, spin_loops, {a: i for i, (a, _) in enumerate(instructions)})

    return kernels


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("library", help="libpagestash_instantiations.a (or any cubin container)")
    parser.add_argument("--fast-math", metavar="OBJ",
                        help="kernels of the library compiled again with --use_fast_math: the same instructions")
    args = parser.parse_args()
    cuobjdump = find_tool("cuobjdump")
    os.environ["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + os.environ["PATH"]

    # An archive's objects are read and checked in parallel (one process each, as many at once
    # as there are cores): the SASS of every kernel is millions of lines.
    with tempfile.TemporaryDirectory() as scratch:
        paths = [args.library]
        if args.library.endswith(".a"):
            subprocess.run(["ar", "x", os.path.abspath(args.library)], cwd=scratch, check=True)
            paths = sorted(glob.glob(os.path.join(scratch, "*")), key=os.path.getsize, reverse=True)
        if args.fast_math:
            paths.append(args.fast_math)
        with concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            kernels, fast = {}, {}
            for path, found in zip(paths, pool.map(analyse, [cuobjdump] * len(paths), paths)):
                (fast if path == args.fast_math else kernels).update(found)

    if not kernels:
        sys.exit(f"check_kernels: no operation kernels found in {args.library}")
    keys = sorted(kernels)
    pretty = dict(zip(keys, demangle([m for _, m in keys])))
    failures = []

    def shape_failures(k, label):
        """What breaks the rules every kernel keeps, with and without --use_fast_math."""
        why = []
        if k["stack"] != 0:
            why.append(f"stack frame {k['stack']} bytes")
        if k.get("spills", 0) or k["local"]:
            why.append(f"{k.get('spills', 0)} local loads/stores (spills)")
        if k["regs"] > MAX_REGISTERS:
            why.append(f"{k['regs']} registers > {MAX_REGISTERS}")
        if k.get("membar_sc", 0) and label.startswith(("stash", "reload", "discard")):
            why.append(f"{k['membar_sc']} sequentially consistent fences (MEMBAR.SC.GPU)")
        if label.startswith(("stash", "reload", "discard")) and not k.get("waits_first", False):
            why.append("no wait for the kernel before it (ACQBULK) ahead of its first global access and branch")
        if label.startswith(("stash", "reload", "discard")) and not k.get("triggers", False):
            why.append("never lets the next kernel start (no PREEXIT)")
        if k.get("division_in_vector_loop", 0):
            why.append(f"{k['division_in_vector_loop']} integer divisions (I2F.U32.RP) in a per-vector copy loop")
        return why

    print(f"{'arch':6s} {'kernel':90s} {'regs':>4s} {'stack':>5s} {'spill':>5s} {'shared':>6s} {'blocks/SM':>9s} {'ld batch':>8s} {'unaligned':>9s} {'L1 inv':>6s} {'SC fence':>8s}  128-bit ld/st")
    for key in keys:
        k = kernels[key]
        label = short_name(pretty[key])
        is_copy = label.startswith(("stash", "reload"))  # discard and reset copy nothing
        blocks = resident_blocks(k["regs"], k["shared"], key[0])
        vectors = "yes" if k.get("ld128") and k.get("st128") else ("n/a" if not is_copy else "NO")
        # The unaligned path's loads in flight, in vectors: the gather's words / 4 (stash),
        # the scatter's 128-bit loads (reload).
        gathers, scatters = label.startswith("stash"), label.startswith("reload")
        unaligned = k.get("gather", 0) / WORDS_PER_VECTOR if gathers else (k.get("scatter", 0) if scatters else 0)
        print(f"{key[0]:6s} {label[:90]:90s} {k['regs']:4d} {k['stack']:5d} {k.get('spills', 0):5d} {k['shared']:6d} "
              f"{blocks:9d} {k.get('batch', 0):8d} {unaligned:9g} {k.get('cctl', 0):6d} {k.get('membar_sc', 0):8d}  {vectors}")
        why = shape_failures(k, label)
        if is_copy and vectors != "yes":
            why.append("no 128-bit global load and store")
        if is_copy and k.get("batch", 0) < MIN_LOADS_IN_FLIGHT:
            why.append(f"at most {k.get('batch', 0)} 128-bit loads before a store (< {MIN_LOADS_IN_FLIGHT})")
        if gathers and k.get("gather", 0) < WORDS_PER_VECTOR * MIN_LOADS_IN_FLIGHT:
            why.append(f"the gather has {k.get('gather', 0)} word loads in flight "
                       f"(< {WORDS_PER_VECTOR} x {MIN_LOADS_IN_FLIGHT} vectors)")
        if STAGED and gathers and k.get("staged", 0) < MIN_STAGED_LOADS:
            why.append(f"the staged mover has {k.get('staged', 0)} 128-bit loads in flight (< {MIN_STAGED_LOADS})")
        if scatters and k.get("scatter", 0) < MIN_LOADS_IN_FLIGHT:
            why.append(f"the scatter has {k.get('scatter', 0)} 128-bit loads in flight (< {MIN_LOADS_IN_FLIGHT})")
        if gathers and "Compressed<" not in label and not k.get("prefetches", False):
            why.append("no look-ahead: no L2 bulk prefetch (UBLKPF.L2)")
        if is_copy and not k.get("barrier_free_waits", 0):
            why.append("every path from the verdict's wait to the first data load passes a block barrier (BAR.SYNC)")
        if k.get("cctl_in_spin", 0):
            why.append(f"{k['cctl_in_spin']} L1 invalidations (CCTL.IVALL) inside a spin loop")
        if k.get("cctl", 0) > MAX_CCTL_IVALL:
            why.append(f"{k['cctl']} L1 invalidations (CCTL.IVALL) > {MAX_CCTL_IVALL}")
        if why:
            failures.append(f"{key[0]} {label}: " + ", ".join(why))
    if args.fast_math:
        if not fast:
            sys.exit(f"check_kernels: no operation kernels found in {args.fast_math}")
        for key in sorted(fast):
            if key not in kernels:
                failures.append(f"{key[0]} {key[1]}: compiled with --use_fast_math, but not in the library")
                continue
            why = shape_failures(fast[key], short_name(demangle([key[1]])[0]))
            if why:
                failures.append(f"{key[0]} {short_name(demangle([key[1]])[0])} (--use_fast_math): " + ", ".join(why))
            mine = kernels[key].get("float_ops", collections.Counter())
            theirs = fast[key].get("float_ops", collections.Counter())
            if mine != theirs:
                changed = sorted((theirs - mine) + (mine - theirs))
                failures.append(f"{key[0]} {short_name(demangle([key[1]])[0])}: compiled with --use_fast_math, other "
                                f"float instructions: {', '.join(f'{op} {theirs[op] - mine[op]:+d}' for op in changed)}")
        print(f"{len(fast)} kernels compiled with --use_fast_math, compared with the library's float arithmetic")
    spin = sum(kernels[key].get("spin_loops", 0) for key in keys)
    print(f"\n{len(keys)} kernels checked: stack 0, no spills, <= {MAX_REGISTERS} registers, no MEMBAR.SC.GPU, 128-bit copies, "
          f">= {MIN_LOADS_IN_FLIGHT} loads in flight (aligned, scattered and gathered vectors; {MIN_STAGED_LOADS} staged chunks), no division in a per-vector loop, <= {MAX_CCTL_IVALL} L1 invalidations and none in "
          f"the {spin} spin loops, a path with no block barrier from the verdict's wait to the first load, a lossless "
          f"stash's look-ahead prefetch, "
          f"the wait for the kernel before (ACQBULK) ahead of any global access and the next one's trigger (PREEXIT)")
    if failures:
        print(f"\n{len(failures)} kernels break the rules:")
        for f in failures:
            print("  " + f)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
