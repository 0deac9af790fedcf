"""Seed robustness of the default commands, and the sweeps their defaults were chosen from.

    python benchmarks/robustness.py [--seeds 64] [--only ppo,ppo_2048] [--candidates] [--quick]
    python benchmarks/run.py --only robustness

For each default command a user types (common.COMMANDS), ONE process running it as typed with
--num-seeds 64 (one sweep) and an empty compilation cache: the fraction of seeds whose final score
reaches the threshold, the worst seed, the IQM and the mean with 95% bootstrap CIs over the seeds,
and the time to solve, whole-process from launch until every seed's score held the threshold (cold
cache; common.held_from: its trailing mean at or above it from then to the end). The score is the
final return (mean episode return over the last 5% of updates); for q_learning, the final
greedy_optimal (1.0: solved). The same sweeps give the learning curves (PPO against VPG per
environment, mean and 95% CI band over the seeds): nothing is trained twice. With --candidates, the
grid of CANDIDATES around the defaults is trained instead, as one hyperparameter sweep per
command: the table that justifies a default.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# name -> the grid swept around the defaults (the README's PPO section quotes its outcome)
CANDIDATES = {
    "ppo": ["--learning-rate", "2e-3", "2.5e-3", "3.5e-3", "--ent-coef", "0", "0.01",
            "--clip-coef", "0.1", "0.2"],
    "ppo_2048": ["--clip-coef", "0.1", "0.2"],
    "ppo_pendulum": ["--learning-rate", "1e-3", "2e-3", "3e-3", "--clip-coef", "0.2", "0.3"],
    "vpg_pendulum": ["--learning-rate", "2.5e-3", "5e-3", "1e-2"],
}
# The learning-curve panels: environment -> the commands drawn in it
PANELS = {"CartPole-v1": ("ppo", "vpg", "pqn"), "Pendulum-v1": ("ppo_pendulum", "vpg_pendulum")}
QUICK = {"ppo": ["--total-timesteps", "16384"]}  # --quick: these commands, tiny budgets


NO_EVALUATION = "none: greedy_optimal is exact"


def solved_by(reach_s) -> str:
    """'41.2' (every seed reached the threshold by then), or how many did and the last of them."""
    solve_s, reached = common.solve_time(reach_s)
    if solve_s is not None:
        return f"{solve_s:.1f}"
    last = max((t for t in reach_s if t is not None), default=None)
    return f"{reached}/{len(reach_s)} reached" + (f" (last at {last:.1f})" if last else "")


def rows_for(name: str, result: dict, threshold: float, candidates: bool) -> list:
    rows, configs = [], result["configs"]
    varied = [k for k in configs[0] if len({c[k] for c in configs}) > 1]
    for c, (config, final, reach_s) in enumerate(zip(configs, result["final"],
                                                      result["reach_s"])):
        final = np.asarray(final)
        row = [f"`{result['command']}`", f"{result['total_timesteps']:,}", len(final),
               f"{threshold:g}", f"{np.sum(final >= threshold)}/{len(final)}",
               f"{final.min():.4g}", common.with_ci(final, common.iqm),
               common.with_ci(final),
               *[common.with_ci(result["evals"][kind][c]) if result["evals"] else NO_EVALUATION
                 for kind in ("sampled", "greedy")], solved_by(reach_s)]
        if candidates:
            row.insert(1, ", ".join(f"{k} {config[k]:g}" for k in varied))
        else:
            row += [f"{result['process_s']:.1f}", f"{result['compile_s']:.1f}",
                    f"{result['sps']:,.0f}"]
        rows.append(row)
    return sorted(rows, key=lambda r: -int(r[5].split("/")[0])) if candidates else rows


def plot_curves(results: dict) -> Path | None:
    """One panel per environment of PANELS: mean score over the seeds with its 95% CI band."""
    panels = {env: [n for n in names if n in results] for env, names in PANELS.items()}
    panels = {env: names for env, names in panels.items() if names}
    if not panels:
        return None
    fig, axes = common.new_figure(6 * len(panels), 4, len(panels))
    for ax, (env_id, names) in zip(axes, panels.items()):
        for name in names:
            r = results[name]
            curves = np.array(r["curves"][0], dtype=np.float64)  # None -> NaN
            label = f"{common.COMMANDS[name][0].upper()} ({len(curves)} seeds)"
            common.plot_band(ax, r["curve_steps"], curves, label)
        thresholds = {}  # threshold -> the algorithms held to it
        for name in names:
            thresholds.setdefault(common.COMMANDS[name][2], []).append(
                common.COMMANDS[name][0].upper())
        for style, (threshold, algos) in zip((":", "--"), thresholds.items()):
            ax.axhline(threshold, color="gray", ls=style, lw=1,
                       label=f"threshold {threshold:g} ({', '.join(algos)})")
        ax.set_xlabel("environment steps per seed")
        ax.set_ylabel("episode return (mean of the episodes finished)")
        ax.set_title(f"{env_id}: mean over seeds, 95% bootstrap CI")
        ax.legend(loc="best")
    return common.save_figure(fig, "learning_curves.png")


def run(quick: bool = False, names=None, seeds: int | None = None,
        candidates: bool = False, seed_base: int | None = None) -> str:
    """seed_base: every command's --seed (default: the files' own, 1, on which the presets were
    picked); another base gives held-out seeds, never used by a preset search."""
    names = list(names or (QUICK if quick else common.COMMANDS))
    seeds = seeds or (2 if quick else 64)
    rows, results = [], {}
    for name in names:
        file, flags, threshold = common.COMMANDS[name]
        flags = [*flags, "--num-seeds", str(seeds), *(QUICK.get(name, []) if quick else []),
                 *(CANDIDATES.get(name, []) if candidates else []),
                 *(["--seed", str(seed_base)] if seed_base is not None else [])]
        t0 = time.time()
        with tempfile.TemporaryDirectory() as cache:  # empty: the process compiles (cold)
            results[name] = result = common.run_command(file, flags, threshold, cache)
        print(f"  robustness {name}: {time.time() - t0:.0f} s", flush=True)
        rows += rows_for(name, result, threshold, candidates)
    headers = ["command", "steps per seed", "seeds", "threshold", "final score >= threshold",
               "worst seed", "IQM [95% CI]", "mean [95% CI]",
               "evaluation, sampled actions: mean [95% CI]",
               "evaluation, greedy actions: mean [95% CI]",
               "every seed reached the threshold by (s, whole process, cold cache)"]
    if candidates:
        headers.insert(1, "configuration")
    else:
        headers += ["whole process s", "compile s", "steps/s (all seeds)"]
    held_out = "" if seed_base is None else (
        f", held out: --seed {seed_base}, a seed base no preset search nor test used")
    if candidates:
        title = (f"## Sweeps around the defaults ({seeds} seeds per configuration, one sweep per "
                 f"command{held_out})")
        how = "Each command with its grid of CANDIDATES, one process, an empty compilation cache."
    else:
        title = (f"## Seed robustness of the default commands ({seeds} seeds, one sweep "
                 f"each{held_out})")
        how = "Each command as typed, one process, an empty compilation cache."
    text = [title,
            how + " Final score: the "
            "mean episode return over the last 5% of updates (q_learning: the final "
            "greedy_optimal, the fraction of states whose greedy action is optimal, averaged "
            "over the agents of a seed). Thresholds: CartPole-v1 475, Pendulum-v1 -250, "
            "q_learning 1.0. Evaluation: each seed's final policy on the file's default 64 "
            "fresh episodes, sampled and most likely actions (q_learning has none: its "
            "greedy_optimal is exact, against Q*). CIs: percentile bootstrap over seeds. "
            "Reached by: from the process's launch to the end of the update from which the last "
            "seed's score held the threshold: its mean over a trailing 5% of updates at or above "
            "it from then to the end (one lucky update does not count).",
            common.md_table(headers, rows)]
    plot = None if candidates else plot_curves(results)
    if plot:
        text.append(f"![learning curves, PPO and VPG]({plot.name})")
    return "\n\n".join(text)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="default 64 (--quick: 2)")
    parser.add_argument("--only", default=None,
                        help=f"comma list out of {','.join(common.COMMANDS)}")
    parser.add_argument("--candidates", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed-base", type=int, default=None,
                        help="every command's --seed: held-out seeds (default: the files' 1)")
    opts = parser.parse_args()
    started = time.time()
    print(common.machine_header() + "\n")
    print(run(opts.quick, opts.only.split(",") if opts.only else None, opts.seeds,
              opts.candidates, opts.seed_base))
    print(f"\n(total {time.time() - started:.0f} s)")
