"""The search behind ppo.py's Breakout-MinAtar preset on many seeds (issue 72), recorded in
benchmarks/results/BREAKOUT_SEARCH.md.

    python benchmarks/search_breakout.py [--skip N] [--quick]

The MLP preset of MINATAR_SEARCH.md (chosen on 4 seeds of bases 1 and 2) left one seed of four
near 7 on the held-out base 1000. A seed that stalls is rare, so each row here is a sweep over 8
seeds: `python algos/ppo.py --env-id Breakout-MinAtar --seed BASE --num-seeds 8 FLAGS` in one
process with an empty compilation cache (common.run_command), several configurations swept at
once. Per configuration and base: each seed's final training return (the mean episode return over
its last 5% of updates), their mean and worst, the seeds below half the published return (28, at
10M steps: bench_minatar.PUBLISHED) and the base's two 4-seed groups whose mean is below it (the
target, issue 72: every seed >= 14 and each 4-seed base's mean >= 28). The bases (11 to 14) are
neither the first search's (1, 2) nor the held-out bases that judge the preset (1000, 2000,
3000, MINATAR.md). Each finished command's rows are appended at once: a stopped search keeps them.
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

GAME = "Breakout-MinAtar"
SEEDS = 8
# (flags beside --env-id, --seed and --num-seeds; seed base), in the order run.
SEARCH = [(["--ent-coef", "0.02", "0.03", "0.05"], 12),
          (["--ent-coef", "0.01", "0.02", "--learning-rate", "0.005", "0.0025"], 11),
          (["--ent-coef", "0.01", "0.05", "0.1"], 13),
          (["--ent-coef", "0.02", "0.05"], 14)]
QUICK_FLAGS = ["--total-timesteps", str(3 * 64 * 128)]
HEADERS = ["configuration (beside the preset)", "seed base", "final training return per seed",
           "mean", "worst", "seeds < 14", "4-seed groups with mean < 28",
           "evaluation, sampled: mean", "whole process s (all configurations)",
           "steps/s (training, all)"]


def rows(flags: list[str], base: int, quick: bool) -> list[list]:
    """One row per configuration that the command sweeps."""
    seeds = 2 if quick else SEEDS
    with tempfile.TemporaryDirectory() as cache:
        r = common.run_command("ppo", ["--env-id", GAME, "--seed", str(base), "--num-seeds",
                                       str(seeds), *flags, *(QUICK_FLAGS if quick else [])],
                               np.inf, cache)
    published = bench_minatar.PUBLISHED[GAME]
    swept = [k for k in r["configs"][0] if len({c[k] for c in r["configs"]}) > 1]
    out = []
    for c, config in enumerate(r["configs"]):
        final = np.asarray(r["final"][c], dtype=np.float64)
        groups = final[: len(final) // 4 * 4].reshape(-1, 4).mean(axis=1)
        out.append([", ".join(f"--{k.replace('_', '-')} {config[k]:g}" for k in swept), base,
                    " ".join(f"{x:.1f}" for x in final), f"{final.mean():.2f}",
                    f"{final.min():.1f}", int(np.sum(~(final >= published / 2))),
                    f"{int(np.sum(~(groups >= published)))} of {len(groups)}",
                    f"{np.mean(r['evals']['sampled'][c]):.2f}", f"{r['process_s']:.0f}",
                    f"{r['sps']:,.0f}"])
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip", type=int, default=0, help="commands to skip (a resumed search)")
    parser.add_argument("--quick", action="store_true", help="3 updates x 2 seeds per command")
    opts = parser.parse_args()
    out = common.RESULTS / "BREAKOUT_SEARCH.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/search_breakout.py" + (" --quick" if opts.quick else "")
    if not opts.skip:
        out.write_text("# Breakout-MinAtar's preset on 8 seeds a base (search_breakout.py)\n\n"
                       + "\n".join(common.produced_by(command, "quick" if opts.quick else "full"))
                       + f"\n\n{__doc__.split(chr(10) + chr(10))[2].strip()}\n\n")
    with open(out, "a") as f:
        f.write(f"Started {time.strftime('%Y-%m-%d %H:%M')} (commands {opts.skip + 1} to "
                f"{len(SEARCH)}), load average {common.load_average()}\n\n"
                + common.md_table(HEADERS, []) + "\n")
    for flags, base in SEARCH[opts.skip:]:
        lines = common.md_table(HEADERS, rows(flags, base, opts.quick)).splitlines()[2:]
        with open(out, "a") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)
    with open(out, "a") as f:
        f.write(f"\nLoad average at the end: {common.load_average()}\n")


if __name__ == "__main__":
    main()
