"""The search behind dqn.py's CartPole-v1 preset, recorded in benchmarks/results/DQN_SEARCH.md.

    python benchmarks/search_dqn.py [--quick]      # about 15 minutes on 2 cores; alone

PureJaxRL's configuration (a buffer of 10,000, Adam 2.5e-4 constant) left the greedy policy under
475 at the end of 500k steps on some seeds. Each command here sweeps the learning rate of one
(buffer, annealing) pair: `python algos/dqn.py --seed BASE --num-seeds 4 --eval-episodes 64 FLAGS`
in one process with an empty compilation cache (bench_sac.ours), on the tuning bases 1, 100
and 200 (the held-out base 5000 judges the chosen preset: DQN.md (a)). Per configuration and
base: each seed's greedy evaluation (64 episodes), how many are at 475 or more, the final
training return's mean; then each configuration's count over the three bases.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sac  # noqa: E402
import common  # noqa: E402

BASES, SEEDS, THRESHOLD = (1, 100, 200), 4, 475.0
SEARCH = [["--buffer-size", "10000", "--anneal-lr", "False",
           "--learning-rate", "1e-4", "2.5e-4", "5e-4"],
          ["--buffer-size", "10000", "--anneal-lr", "True",
           "--learning-rate", "2.5e-4", "5e-4", "1e-3"],
          ["--buffer-size", "50000", "--anneal-lr", "True", "--learning-rate", "2.5e-4", "5e-4"]]
QUICK_FLAGS = ["--total-timesteps", "16000", "--learning-starts", "1000"]


def rows(flags: list[str], base: int, quick: bool) -> list[list]:
    """One row per learning rate the command sweeps: (configuration, base, greedy per seed,
    seeds at the threshold, final training return, whole process s)."""
    typed = ["--seed", str(base), "--num-seeds", str(2 if quick else SEEDS), "--eval-episodes",
             "4" if quick else "64", *flags, *(QUICK_FLAGS if quick else [])]
    r = bench_sac.ours("dqn", typed, THRESHOLD)
    fixed = " ".join(flags[:4])
    out = []
    for c, config in enumerate(r["configs"]):
        greedy = np.asarray(r["evals"]["greedy"][c], np.float64)
        out.append([f"{fixed} --learning-rate {config['learning_rate']:g}", base,
                    " ".join(f"{x:.1f}" for x in greedy), int((greedy >= THRESHOLD).sum()),
                    f"{np.mean(r['final'][c]):.1f}", f"{r['process_s']:.0f}"])
    print(f"  search_dqn: {' '.join(typed)} done", flush=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 2 seeds: the pipeline")
    opts = parser.parse_args()
    command = "python benchmarks/search_dqn.py" + (" --quick" if opts.quick else "")
    header = common.produced_by(command, "quick" if opts.quick else "full")
    load_start = common.load_average()
    table = [row for flags in SEARCH for base in BASES for row in rows(flags, base, opts.quick)]
    totals = {}
    for row in table:
        reached, seeds = totals.get(row[0], (0, 0))
        totals[row[0]] = (reached + row[3], seeds + len(row[2].split()))
    out = common.RESULTS / "DQN_SEARCH.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n\n".join([
        "# dqn.py's CartPole-v1 preset (search_dqn.py)", *header,
        __doc__.split("\n\n")[2].strip(),
        f"Load average (1, 5, 15 min) at the start: {load_start}.",
        common.md_table(["configuration (beside the preset)", "seed base",
                         "greedy evaluation per seed", f"seeds >= {THRESHOLD:g}",
                         "final training return, mean", "whole process s (the command)"], table),
        common.md_table(["configuration", f"seeds greedy >= {THRESHOLD:g}, bases "
                         + ", ".join(map(str, BASES))],
                        [[k, f"{a} of {n}"] for k, (a, n) in totals.items()]),
        f"Load average at the end: {common.load_average()}."]) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
