#!/usr/bin/env python3
"""Runs Clang's thread-safety analysis over drover's locking code.

drover's members say which mutex guards them (GUARDED_BY, REQUIRES: common/mutex.h), and
the analysis turns every access without that mutex held into an error. The build that
`make test` runs is GCC's, which ignores the annotations, so this test parses with clang++
(-fsyntax-only, no code generated) every translation unit of the build that takes a
drover::Mutex (choose_units: every annotated piece of locking code once).

First it parses a small canary with a known unguarded write and requires the analysis to
report it, so that a Clang that ignores the annotations (or macros that expand to nothing)
fails here instead of passing everything.

    thread_safety_check.py BUILD_DIR [--jobs N]

Exit 0 when every unit is clean, 1 when the analysis reports something (printed), 77 when
clang++ is missing (`deploy/install-deps.sh test` installs it).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]

CANARY = """
#include "common/mutex.h"
class Canary {
 public:
  void Unguarded() { value_ = 1; }
 private:
  drover::Mutex mu_;
  int value_ GUARDED_BY(mu_) = 0;
};
"""


def clang_command(entry, clang):
    """The entry's compile command, for clang++ and syntax only."""
    args = entry.get("arguments") or shlex.split(entry["command"])
    out = [clang]
    skip = False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c" or a == "-w":  # -w would silence the analysis too
            continue
        out.append(a)
    return out + FLAGS


def includes_of(path, cache):
    if path not in cache:
        try:
            text = open(path, encoding="utf-8", errors="replace").read()
        except OSError:
            text = ""
        cache[path] = re.findall(r'#include "([^"]+)"', text)
    return cache[path]


def choose_units(sources, source_dir):
    """The units to analyse, each annotated piece of code once: every .cc that includes
    common/mutex.h itself; for every header that does, the .cc of the same name, or for a
    header without one (a header-only fake), the first unit that includes it. Units that
    only use an annotated class from outside hold none of its locking code."""
    cache = {}
    annotated = {"common/mutex.h"}
    for f in sources:  # headers of the same name as a unit
        h = f[:-3] + ".h"
        if os.path.exists(h) and "common/mutex.h" in includes_of(h, cache):
            annotated.add(os.path.relpath(h, source_dir))
    for root, _, files in os.walk(source_dir):  # header-only classes
        if "/build" in root or "/.git" in root:
            continue
        for name in files:
            full = os.path.join(root, name)
            if name.endswith(".h") and "common/mutex.h" in includes_of(full, cache):
                annotated.add(os.path.relpath(full, source_dir))
    chosen, covered = [], set()
    for f in sorted(sources):
        own = os.path.relpath(f[:-3] + ".h", source_dir)
        incs = set(includes_of(f, cache))
        if "common/mutex.h" in incs or own in annotated:
            chosen.append(f)
            covered.add(own)
    for h in sorted(annotated - covered - {"common/mutex.h"}):
        user = next((f for f in sorted(sources) if h in includes_of(f, cache)), None)
        if user is not None and user not in chosen:
            chosen.append(user)
    return chosen


def run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()

    clang = shutil.which("clang++")
    if clang is None:
        print("thread-safety check skipped: clang++ is not installed "
              "(deploy/install-deps.sh test installs it)")
        return 77
    source_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    db = os.path.join(args.build_dir, "compile_commands.json")
    try:
        entries = json.load(open(db))
    except (OSError, ValueError) as e:
        print(f"thread-safety check: cannot read {db}: {e}")
        return 1

    by_file = {}
    for e in entries:
        f = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if f.startswith(source_dir + os.sep) and f.endswith(".cc"):
            by_file.setdefault(f, e)
    units = {f: by_file[f] for f in choose_units(list(by_file), source_dir)}
    if not units:
        print(f"thread-safety check: no unit in {db} includes common/mutex.h")
        return 1

    # The canary, with the flags of a real unit: the analysis must see its unguarded write.
    sample = next(iter(units.values()))
    with tempfile.TemporaryDirectory() as tmp:
        canary = os.path.join(tmp, "canary.cc")
        with open(canary, "w") as f:
            f.write(CANARY)
        cmd = [a for a in clang_command(sample, clang) if a != sample["file"]
               and os.path.realpath(os.path.join(sample["directory"], a)) !=
               os.path.realpath(os.path.join(sample["directory"], sample["file"]))]
        rc, out = run(cmd + [canary], sample["directory"])
        if rc == 0 or "requires holding mutex 'mu_'" not in out:
            print("thread-safety check: the analysis did not report the canary's unguarded "
                  "write, so it is not running:\n" + out)
            return 1

    failures = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run, clang_command(e, clang), e["directory"]): f
                   for f, e in sorted(units.items())}
        for fut in concurrent.futures.as_completed(futures):
            rc, out = fut.result()
            if rc != 0:
                failures.append((futures[fut], out))
    for f, out in sorted(failures):
        print(f"==== {os.path.relpath(f, source_dir)}\n{out}")
    print(f"thread-safety check: {len(units)} units, {len(failures)} with findings")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
