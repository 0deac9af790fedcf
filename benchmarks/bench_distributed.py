"""Weak scaling of --distributed on this machine: one sweep as 1 process x 2 devices and as
2 processes x 1 device (127.0.0.1, gloo collectives), whole-process wall time as a user types it.

    python benchmarks/bench_distributed.py [--repeats 3] [--only ppo,q_learning] [--quick]
                                # every sweep, not --quick: writes results/distributed.md

Both layouts put the same runs on each device, so they compute the same numbers; the difference is
the price of the distributed path (two interpreters, joining, gathering the results to process 0).
Each measurement starts with a warm compilation cache of its own layout, so compile time is the
same small cost on both sides; the cold compile is what both pay on the first run. Every command
runs as typed, but with --no-track and --log-dir in a temporary directory: process 0 still
gathers every segment's state and writes a checkpoint after it, a cost of the distributed path.
Target (issue 19): 2 processes x 1 core within 10% of 1 process x 2 devices. Duration on a quiet
2-core machine: about 3 minutes for ppo, 8 for q_learning (2 layouts x (1 + repeats) runs)."""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# file -> flags of a sweep (16 runs: 2 configurations x 8 seeds)
SWEEPS = {
    "ppo": ["--learning-rate", "2.5e-3", "1e-3", "--num-seeds", "8"],
    "q_learning": ["--learning-rate", "0.1", "0.2", "--num-seeds", "8", "--num-agents", "1024"],
}
QUICK = {"ppo": ["--total-timesteps", "20480"], "q_learning": ["--total-timesteps", "2000"]}


def one_layout(name: str, flags: list[str], processes: int, cache: str) -> float:
    """Whole-process seconds until every process of the layout has exited."""
    return common.run_processes(name, flags, processes, 2 // processes, cache)[1]


def run(repeats: int, quick: bool, names=tuple(SWEEPS)) -> str:
    rows = []
    for name in names:
        flags = SWEEPS[name] + (QUICK[name] if quick else [])
        times = {}
        for processes in (1, 2):
            with tempfile.TemporaryDirectory() as cache:
                one_layout(name, flags, processes, cache)  # fills this layout's cache
                times[processes] = [one_layout(name, flags, processes, cache)
                                    for _ in range(repeats)]
        one, two = statistics.median(times[1]), statistics.median(times[2])
        print(f"  {name}: 1 process {one:.1f} s, 2 processes {two:.1f} s", flush=True)
        rows.append([f"`{name}.py {' '.join(flags)}`", f"{one:.1f}", f"{two:.1f}",
                     f"{100 * (two / one - 1):+.0f}%",
                     " / ".join(f"{t:.1f}" for t in times[1] + times[2])])
    headers = ["sweep", "1 process x 2 devices s", "2 processes x 1 device s", "overhead",
               "every run (1 process, then 2)"]
    return (f"### --distributed on one machine: weak scaling (medians of {repeats}, warm cache)"
            "\n\n" + common.md_table(headers, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(SWEEPS),
                        help=f"comma list out of {','.join(SWEEPS)}")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the script")
    opts = parser.parse_args()
    names = [name for name in opts.only.split(",") if name]
    if set(names) - set(SWEEPS):
        parser.error(f"--only: choose from {', '.join(SWEEPS)}")
    command = "python benchmarks/bench_distributed.py" + "".join(
        f" {a}" for a in sys.argv[1:])
    load_start = common.load_average()
    table = run(opts.repeats, opts.quick, names)
    report = "\n\n".join([*common.produced_by(command, "quick" if opts.quick else "full"),
                           f"Load average (1, 5, 15 min) at the start: {load_start}; at the "
                           f"end: {common.load_average()}.", table])
    if not opts.quick and set(names) == set(SWEEPS):  # (a part of it prints, writes nothing)
        (common.RESULTS / "distributed.md").write_text(report + "\n")
    print(report)
