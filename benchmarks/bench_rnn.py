"""Recurrent PPO on tasks that need memory: ppo_rnn.py as typed beside ppo.py as typed, on a
held-out seed base (--seed 5000: the presets were chosen on seeds 1, 1000 and 2000), and on
CartPole-v1 fully observed, which ppo_rnn.py must still solve.

    python benchmarks/bench_rnn.py [--quick]    # writes results/RNN.md (about 5 minutes, 2 cores)

Each command runs in its own process with an empty compilation cache (whole-process time: what a
user waits, compile included). Score: each run's final policy on --eval-episodes (64) fresh
episodes, by its most likely actions (greedy) and by sampled ones; CI: percentile bootstrap over
the seeds. MemoryChain-bsuite (gymnax's bsuite port, memory_length 5): a bit shown at an
episode's first steps decides the sign of the reward at its end; without memory a policy can
only guess (expected return 0). ppo.py has no --mask-velocity: its rows for the masked tasks are
empty, and its fully observed CartPole-v1 row is the reference."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BASE = 5000
# (task, its flags, the files that take them, what the done-when asks of ppo_rnn.py or None)
TASKS = [
    ("MemoryChain-bsuite", ["--env-id", "MemoryChain-bsuite"], ("ppo_rnn", "ppo"),
     "greedy evaluation mean >= 0.8"),
    ("CartPole-v1 without velocities", ["--mask-velocity"], ("ppo_rnn",), None),
    ("Pendulum-v1 without velocities", ["--env-id", "Pendulum-v1", "--mask-velocity"],
     ("ppo_rnn",), None),
    ("CartPole-v1", [], ("ppo_rnn", "ppo"), "final training return 500 on every seed"),
]
QUICK_FLAGS = ["--total-timesteps", "8192", "--num-seeds", "2", "--eval-episodes", "4"]


def worker(config: dict) -> dict:
    """One command as typed: per seed its final training return and evaluation returns, the
    resolved flags that set the run's size, and the timing."""
    with tempfile.TemporaryDirectory() as cache:
        kept = common.run_as_typed(config["file"], [*config["flags"], "--no-track",
                                                    "--compile-cache-dir", cache])
    args, timing = kept["args"], kept["timing"]
    return {"final": common.runner_module("reports").final_returns(kept["metrics"]).tolist(),
            "greedy": kept["evals"]["eval/episodic_return_greedy"].tolist(),
            "sampled": kept["evals"]["eval/episodic_return_sampled"].tolist(),
            "steps": args.total_timesteps, "seeds": args.num_seeds,
            "compile_s": timing["compile_s"], "run_s": timing["run_s"]}


def run(quick: bool = False) -> str:
    load_start, rows, verdicts = common.load_average(), [], []
    extra = QUICK_FLAGS if quick else []
    for task, flags, files, target in TASKS:
        for name in ("ppo_rnn", "ppo"):
            typed = [*flags, "--seed", str(BASE), *extra]
            command = " ".join([f"{name}.py", *typed])
            if name not in files:
                rows.append([task, f"{name}.py (no such flag)", "", "", "", "", ""])
                continue
            r = common.run_worker(Path(__file__), {"file": name, "flags": typed}, as_user=True)
            rows.append([task, f"`{command}`", f"{r['seeds']} x {r['steps']:,}",
                         common.with_ci(r["greedy"]), common.with_ci(r["sampled"]),
                         " ".join(f"{x:.4g}" for x in r["final"]),
                         f"{r['process_s']:.0f} ({r['compile_s']:.0f} + {r['run_s']:.0f})"])
            if name == "ppo_rnn" and target:
                met = (np.mean(r["greedy"]) >= 0.8 if target.startswith("greedy")
                       else min(r["final"]) >= 499.5)
                verdicts.append(f"{task}: {target}: {'met' if met else 'not met'}")
    return "\n\n".join([
        "## Recurrent PPO: ppo_rnn.py beside ppo.py on tasks that need memory",
        f"Each command as typed with `--seed {BASE}` (held out: the presets were tuned on "
        "seeds 1, 1000 and 2000), in its own process with an empty compilation cache. "
        "Evaluation: 64 fresh episodes per seed, greedy and sampled; mean over the seeds [95% "
        "bootstrap CI]. Final: the mean training return over the last 5% of updates, per seed. "
        "Whole process s: (compile + training) inside it. Load average at the start: "
        f"{load_start}; at the end: "
        f"{common.load_average()}" + (". Quick: the pipeline, not the algorithm." if quick
                                       else "."),
        common.md_table(["task", "command", "seeds x steps", "evaluation, greedy",
                         "evaluation, sampled", "final training return per seed",
                         "whole process s (compile + run)"], rows),
        "Done when (issue 42): " + "; ".join(verdicts) + "."])


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true",
                            help="4 updates of 2 seeds per command: the pipeline")
        report = common.machine_header() + "\n\n" + run(parser.parse_args().quick)
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        (common.RESULTS / "RNN.md").write_text(report + "\n")
        print(report)
