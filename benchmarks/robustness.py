"""Seed robustness of the default commands, and the sweeps their defaults were chosen from.

    python benchmarks/robustness.py [--seeds 64] [--only ppo,ppo_2048] [--candidates]

For each default command a user types (`ppo.py`, `ppo.py --num-envs 2048`, ...), one sweep of
--seeds seeds in one process: the fraction of seeds whose final score reaches the threshold, the
worst seed, the IQM with a 95% bootstrap CI. The score is the final return (mean episode return
over the last 5% of updates); for q_learning, the final greedy_optimal (the fraction of states
whose greedy action is optimal: 1.0 is solved). With --candidates, the grid of CANDIDATES around
the defaults is trained instead, as one hyperparameter sweep: the table that justifies a default.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# name -> (algorithm file, flags as Args fields, threshold on the final score)
COMMANDS = {
    "ppo": ("ppo", {}, 475.0),
    "ppo_2048": ("ppo", {"num_envs": 2048}, 475.0),
    "ppo_pendulum": ("ppo", {"env_id": "Pendulum-v1"}, -250.0),
    "vpg": ("vpg", {}, 475.0),
    "vpg_pendulum": ("vpg", {"env_id": "Pendulum-v1"}, -900.0),
    "q_learning": ("q_learning", {}, 1.0),
}
# name -> the grid swept around the defaults (measured: see the README's robustness section)
CANDIDATES = {
    "ppo": {"learning_rate": (2e-3, 2.5e-3, 3.5e-3), "ent_coef": (0.0, 0.01),
            "clip_coef": (0.1, 0.2)},
    "ppo_2048": {"clip_coef": (0.1, 0.2)},
}
HEADERS = ["command", "configuration", "steps per seed", "seeds", "reach threshold",
           "worst seed", "IQM [95% CI]"]


def worker(config):
    """One sweep in this process: per configuration, the final score of every seed."""
    algo = common.import_algo(config["algo"])
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in config["args"].items()}
    args = algo.validate(algo.Args(track=False, num_seeds=config["seeds"], **fields))
    _, metrics, timing = algo.run(args)
    configs = algo.grid(args)
    metrics = {k: np.asarray(v).reshape(len(configs), config["seeds"], -1)
               for k, v in metrics.items()}
    if config["algo"] == "q_learning":
        scores = metrics["stats/greedy_optimal"][..., -1]
    else:
        scores = np.stack([algo.final_returns({"episode_return": r})
                           for r in metrics["episode_return"]])
    return {"configs": configs, "scores": scores.tolist(), "run_s": timing["run_s"],
            "total_steps": int(args.total_timesteps)}


def rows_for(name, result, threshold):
    rows = []
    for config, scores in zip(result["configs"], np.asarray(result["scores"])):
        lo, hi = common.bootstrap_ci(scores, stat=common.iqm, n_boot=2000)
        label = ", ".join(f"{k} {v:g}" for k, v in config.items())
        rows.append([name, label, f"{result['total_steps']:,}", len(scores),
                     f"{np.sum(scores >= threshold)}/{len(scores)}", f"{scores.min():.3g}",
                     f"{common.iqm(scores):.4g} [{lo:.4g}, {hi:.4g}]"])
    return sorted(rows, key=lambda r: -int(r[4].split("/")[0]))


def run(names, seeds: int, candidates: bool) -> str:
    rows, t0 = [], time.time()
    for name in names:
        algo, flags, threshold = COMMANDS[name]
        grid = CANDIDATES.get(name, {}) if candidates else {}
        result = common.run_worker(Path(__file__), {"algo": algo, "seeds": seeds,
                                                    "args": {**flags, **grid}})
        rows += rows_for(name, result, threshold)
        print(common.md_table(HEADERS, rows_for(name, result, threshold)), flush=True)
    return (f"### Seed robustness ({seeds} seeds per configuration, one sweep per command)\n\n"
            f"{common.machine_header()}\n\n" + common.md_table(HEADERS, rows)
            + f"\n\n(total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--seeds", type=int, default=64)
        parser.add_argument("--only", default=",".join(COMMANDS))
        parser.add_argument("--candidates", action="store_true")
        opts = parser.parse_args()
        print(run(opts.only.split(","), opts.seeds, opts.candidates))
