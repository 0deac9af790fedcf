"""The search behind ppo.py's per-game MinAtar presets: configurations x seed bases, each as a
command a user types, recorded in benchmarks/results/MINATAR_SEARCH.md.

    python benchmarks/search_minatar.py [--only GAME[,GAME]] [--quick]

Each row is `python algos/ppo.py --env-id GAME FLAGS --seed BASE` (4 seeds, the preset's other
values) in its own process with an empty compilation cache (common.run_command), so its time is
what a new user waits. A game's preset is the configuration that reaches the published return in
the least wall time: the time at which the 4-seed mean curve held the published return
(common.held_from, the sustained rule of every table), if the final policy's sampled evaluation
also met the target (mean >= published, every seed above half of it, bench_minatar.verdict).
The seed bases here (1, 2) are not the one MINATAR.md reports (1000): the table there is held out.
Each finished row is appended to the results file at once, so a stopped search keeps its rows.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_minatar  # noqa: E402
import common  # noqa: E402

M = 1_000_000
# The network and epochs of every row named, whatever a game's preset is now (the search chose
# them): PureJaxRL's MLP on 4 epochs, MinAtar's CNN (its torso shared by the two heads) on 4 or 2.
MLP = ["--network", "mlp", "--update-epochs", "4"]
CNN_4, CNN_2 = (["--network", "cnn", "--update-epochs", e] for e in ("4", "2"))


def steps(n: int) -> list[str]:
    return ["--total-timesteps", str(n)]


# game -> [(flags beside --env-id, seed bases)]: the configurations tried, in the order run.
SEARCH = {
    "Asterix-MinAtar": [(CNN_4 + steps(3 * M // 2), (1, 2)), (CNN_4 + steps(M), (1,)),
                        (CNN_2 + steps(3 * M // 2), (1, 2)), (CNN_2 + steps(M), (1,))],
    "Freeway-MinAtar": [(CNN_2 + steps(3 * M // 2), (1, 2)), (CNN_4 + steps(3 * M // 2), (1,))],
    "Breakout-MinAtar": [(MLP + steps(3 * M), (1,)), (CNN_2 + steps(M), (1,))],
    "SpaceInvaders-MinAtar": [(MLP + steps(3 * M), (1,)), (CNN_2 + steps(2 * M), (1,))],
    "Seaquest-MinAtar": [(MLP + steps(M), (1,)), (CNN_2 + steps(M), (1,))],
}
QUICK_FLAGS = ["--total-timesteps", str(3 * 64 * 128), "--num-seeds", "2"]
HEADERS = ["game", "flags beside --env-id", "seed base", "evaluation, sampled: mean (each seed)",
           "target", "4-seed mean held the published return from", "whole process s",
           "steps/s (training)"]


def row(game: str, flags: list[str], base: int, quick: bool) -> list:
    with tempfile.TemporaryDirectory() as cache:
        r = common.run_command("ppo", ["--env-id", game, "--seed", str(base), *flags,
                                       *(QUICK_FLAGS if quick else [])], np.inf, cache)
    evaluation, target = bench_minatar.scored(r), bench_minatar.PUBLISHED.get(game)
    held = target is not None and bench_minatar.time_to_target(r, target)
    return [game, " ".join(flags) or "(the preset)", base,
            f"{evaluation.mean():.4g} ({', '.join(f'{x:.4g}' for x in evaluation)})",
            "none published" if target is None else bench_minatar.verdict(evaluation, target),
            "none published" if target is None else "never" if not held else
            f"{held[0]:,.0f} steps, {held[1]:.0f} s", f"{r['process_s']:.0f}", f"{r['sps']:,.0f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(SEARCH), help="games, comma-separated")
    parser.add_argument("--skip", type=int, default=0, help="rows to skip (a resumed search)")
    parser.add_argument("--quick", action="store_true", help="3 updates x 2 seeds per row")
    opts = parser.parse_args()
    games = [g for g in opts.only.split(",") if g]
    if unknown := set(games) - set(SEARCH):
        parser.error(f"--only: unknown {', '.join(sorted(unknown))}")
    out = common.RESULTS / "MINATAR_SEARCH.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not opts.skip:  # a new search: a new file (--skip: a stopped one's rows go on below)
        command = f"python benchmarks/search_minatar.py --only {opts.only}" + (
            " --quick" if opts.quick else "")
        out.write_text("\n\n".join([
            "# The MinAtar preset search (benchmarks/search_minatar.py, seed bases 1 and 2)",
            *common.produced_by(command, "quick" if opts.quick else "full"),
            f"Load average (1, 5, 15 min) at the start: {common.load_average()}.",
            "Each row: `python algos/ppo.py --env-id GAME FLAGS --seed BASE`, 4 seeds, the "
            "preset's other values, its own process with an empty compilation cache."]) + "\n")
    with open(out, "a") as f:
        if opts.skip:  # (the header above is the first invocation's)
            f.write(f"\n{common.machine_header()}\n\n`python benchmarks/search_minatar.py --only "
                    f"{opts.only} --skip {opts.skip}`{' --quick' if opts.quick else ''}, started "
                    f"{time.strftime('%Y-%m-%d %H:%M')}, load average {common.load_average()}\n")
        f.write("\n" + common.md_table(HEADERS, []) + "\n")
    rows = [(game, flags, base) for game in games for flags, bases in SEARCH[game]
            for base in bases]
    for game, flags, base in rows[opts.skip:]:
        line = common.md_table(HEADERS, [row(game, flags, base, opts.quick)]).splitlines()[-1]
        with open(out, "a") as f:
            f.write(line + "\n")
        print(line, flush=True)
    with open(out, "a") as f:
        f.write(f"\nload average at the end: {common.load_average()}\n")


if __name__ == "__main__":
    main()
