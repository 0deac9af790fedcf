"""TD3 (algos/td3.py) on Pendulum-v1 beside sac.py on the same budget, and DDPG by td3.py's flags.

    python benchmarks/run.py --only td3         # writes results/TD3.md (about 7 minutes, 2 cores)

(a) td3.py as typed, td3.py with DDPG's flags (--num-critics 1 --policy-noise 0
--policy-frequency 1) and sac.py as typed on Pendulum-v1, 20,000 steps a seed (both files'
presets), 16 seeds each on the held-out seed base 5000 (as SAC.md's), one process each with an
empty compilation cache (bench_sac.ours): the columns of SAC.md's (a).
Not here yet: CleanRL's, sbx's and rejax's TD3 beside it, and the Brax pendulums beside sac.py.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sac  # noqa: E402
import common  # noqa: E402

SEEDS, EVAL_EPISODES, QUICK_SEEDS, QUICK_EVAL_EPISODES = 16, 64, 2, 4
DDPG = ["--num-critics", "1", "--policy-noise", "0", "--policy-frequency", "1"]
ROWS = {"td3.py": ("td3", []), "td3.py as DDPG": ("td3", DDPG), "sac.py": ("sac", [])}


def run(quick: bool = False) -> str:
    load_start, rows, commands = common.load_average(), [], []
    for label, (name, extra) in ROWS.items():
        flags = ["--env-id", "Pendulum-v1", "--seed", str(bench_sac.BASE), "--eval-episodes",
                 str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES), "--num-seeds",
                 str(QUICK_SEEDS if quick else SEEDS), *extra]
        if quick:
            flags += ["--total-timesteps", "2000"]
        commands.append(f"python algos/{name}.py {' '.join(flags)} --no-track "
                        "--compile-cache-dir EMPTY_TEMP_DIR")
        rows.append(bench_sac.row_a(name, bench_sac.ours(name, flags)))
        print(f"  td3 (a) {label}: done", flush=True)
    headers = ["command", "seeds x steps", "env steps per seed until every seed held -200",
               "s from launch until every seed held -200", "whole process s (compile + run)",
               "final training return, mean [95% CI]", "worst seed",
               "evaluation, greedy", "evaluation, sampled", "seeds greedy >= -200"]
    return "\n\n".join([
        "## TD3: td3.py, and as DDPG, beside sac.py on Pendulum-v1",
        f"Load average (1, 5, 15 min) at the start: {load_start}.",
        "Commands, each in its own process (run as typed by common.run_command):\n\n"
        + "\n".join(f"    {c}" for c in commands),
        "Columns as SAC.md's (a) (bench_sac.row_a): held -200 is the first update from which the "
        "mean training return over a trailing 5% of the updates stays at or above -200 to the "
        "end, the latest over the seeds; final training return: the mean episode return over "
        "the last 5% of updates, mean over the seeds [95% bootstrap CI]; evaluation: "
        f"{QUICK_EVAL_EPISODES if quick else EVAL_EPISODES} fresh episodes per seed, by the "
        "policy's action (greedy) and with the file's exploration (sampled).",
        common.md_table(headers, rows), f"Load average at the end: {common.load_average()}."])
