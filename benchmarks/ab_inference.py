"""Two builds of the hook compared on inference cases, in alternated runs.

Build A is the tree as it is; build B is the same tree with a patch applied
(--patch) and/or other compiler flags (--cflags-b). The runs alternate
(A B A B ..., or B first with --b-first), each one bench_inference.py run
with the arguments after `--`, the hook rebuilt before it. On the lent GPU
VMs a launch-bound workload's native rate moves by up to a third within
minutes (docs/benchmarks/inference-coloc-h200.md), so two builds are only
compared over alternated runs, each case against its own run's native.

  python benchmarks/ab_inference.py OUTDIR --runs 4 [--patch FILE]
         [--cflags-b FLAGS] [--b-first] -- BENCH_INFERENCE_ARGS
  python benchmarks/ab_inference.py --summary OUTDIR...

Each run's results go to OUTDIR/<n><A|B>/ (bench_inference.py's files);
OUTDIR/ab.md has, for each case, each build's work against its run's
native, the neighbour's work and NVML's busy, as mean and range. A call
to the GPU machine has a time limit: split a comparison over several calls
and sum them up with --summary over their output folders. The tree is left
built as A, also when a SIGTERM (a `timeout`) stops the script: the run
in progress is stopped with its workloads and daemon, the patch taken out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_inference import beside, spread  # noqa: E402
from benchmarks.plot_inference import native_of, natives  # noqa: E402

BENCH = ROOT / "benchmarks" / "bench_inference.py"
Case = dict[str, Any]


def build(cflags: str | None) -> None:
    cmd = ["make", "-s", "-B", "lib", "tools"] + ([f"CFLAGS={cflags}"] if cflags else [])
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def patched(patch: Path | None, root: Path = ROOT) -> Iterator[None]:
    """The tree with `patch` applied, taken back out afterwards."""
    if patch is None:
        yield
        return
    subprocess.run(["patch", "-s", "-p1", "-i", str(patch)], cwd=root, check=True)
    try:
        yield
    finally:
        subprocess.run(["patch", "-s", "-R", "-p1", "-i", str(patch)], cwd=root, check=True)


def stop_on_sigterm() -> None:
    """SIGTERM (a `timeout` around this script) unwinds it like an
    exception, so that the tree is unpatched and rebuilt as A: killed
    outright, it once left build B's patch in the tree for the runs that
    came after it."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run_bench(argv: list[str]) -> None:
    """One benchmark run, in a process group of its own that goes with it
    if this script is stopped: its workloads and daemon must not run on
    beside what comes after."""
    proc = subprocess.Popen(argv, start_new_session=True)
    try:
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()


def order(runs: int, b_first: bool) -> list[str]:
    """The builds of each run, alternated."""
    first, second = ("B", "A") if b_first else ("A", "B")
    return [first if n % 2 == 0 else second for n in range(runs)]


def run_all(args: argparse.Namespace) -> None:
    try:
        for n, which in enumerate(order(args.runs, args.b_first), 1):
            out = args.out / f"{n}{which}"
            print(f"run {n}: build {which}", flush=True)
            with patched(args.patch if which == "B" else None):
                build(args.cflags_b if which == "B" else None)
                # A run that fails part-way keeps the cases it saved.
                run_bench([sys.executable, str(BENCH), str(out), *args.bench])
    finally:
        build(None)


def load(folders: list[Path]) -> dict[str, list[list[Case]]]:
    """Each build's runs (their cases), from OUTDIRs of this script."""
    runs: dict[str, list[list[Case]]] = {"A": [], "B": []}
    for folder in folders:
        for report in sorted(folder.glob("*[AB]/inference.json")):
            runs[report.parent.name[-1]].append(json.loads(report.read_text()))
    return runs


def summary(runs: dict[str, list[list[Case]]]) -> str:
    """A table: each case (workload, share, neighbour) of either build, with
    the build's work vs native, neighbour's work and busy over its runs."""
    figures: dict[tuple[str, Any, str], dict[str, list[tuple[float, float | None, float]]]] = {}
    for which, cases_of_runs in runs.items():
        for cases in cases_of_runs:
            ref = natives(cases)
            for case in cases:
                native = native_of(ref, case)
                if native is None or (case["share"] is None and case["neighbour"] is None):
                    continue
                key = (case["workload"], case["share"], beside(case))
                work = case["rate"] / native["rate"]
                figures.setdefault(key, {"A": [], "B": []})[which].append(
                    (work, case.get("neighbour_work"), case["busy"])
                )
    lines = [
        f"Runs: {len(runs['A'])} of A, {len(runs['B'])} of B. Mean (range) over the runs.",
        "",
        "| workload | share | neighbour | build | runs | work vs native | neighbour work | busy |",
        "| --- | ---: | --- | --- | ---: | --- | --- | --- |",
    ]
    for (name, share, next_to), by_build in figures.items():
        for which, rows in by_build.items():
            if not rows:
                continue
            theirs = [r[1] for r in rows if r[1] is not None]
            cells = [name, share or "native", next_to, which, len(rows)]
            cells += [spread([r[0] for r in rows], 2), spread(theirs, 1) if theirs else ""]
            cells += [spread([r[2] for r in rows], 1)]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    bench: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, bench = argv[:at], argv[at + 1 :]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, nargs="+")
    p.add_argument("--summary", action="store_true", help="only sum up OUTDIRs already run")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--patch", type=Path, help="build B: the tree with this patch (patch -p1)")
    p.add_argument("--cflags-b", help="build B: these CFLAGS (e.g. '-O2 -g -DNAME=VALUE')")
    p.add_argument("--b-first", action="store_true", help="start with build B")
    args = p.parse_args(argv)
    args.bench = bench
    if not args.summary:
        if len(args.out) != 1 or not bench:
            p.error("one OUTDIR, and bench_inference.py's arguments after --")
        if args.patch is None and args.cflags_b is None:
            p.error("build B needs --patch or --cflags-b")
        args.out = args.out[0]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.summary:
        print(summary(load(args.out)), end="")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.patch is not None:
        args.patch = args.patch.resolve()
    stop_on_sigterm()
    run_all(args)
    text = summary(load([args.out]))
    (args.out / "ab.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
