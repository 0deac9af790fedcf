"""TD3 (algos/td3.py) on Pendulum-v1 beside sac.py on the same budget, and DDPG by td3.py's flags.

    python benchmarks/run.py --only td3         # writes results/TD3.md (about an hour, 2 cores)

(a) td3.py as typed, td3.py with DDPG's flags (--num-critics 1 --policy-noise 0
--policy-frequency 1) and sac.py as typed on Pendulum-v1, 20,000 steps a seed (both files'
presets), 16 seeds each on the held-out seed base 5000 (as SAC.md's), one process each with an
empty compilation cache (bench_sac.ours): the columns of SAC.md's (a).
(b) td3.py beside rejax 0.1.3's TD3 at td3.py's Pendulum-v1 preset, 4 seeds x 20,000 steps: whole
process times (a warm-up run each, then 3 runs each alternating ours and rejax; medians), each
process with an empty compilation cache; rejax in the peers' environment (.venv-peers or
PEERS_PYTHON, benchmarks/requirements-peers.txt) through bench_sac.py's worker, skipped with a line
where it is not installed.
(c) td3.py beside CleanRL's td3_continuous_action_jax.py at CleanRL's network (2 x 256 relu),
batch (256) and update ratio (a critic step per env step), our Pendulum-v1 budget: CleanRL a
seed a process as its authors run it (two at a time, a core each), in its own environment:
CLEANRL_PYTHON (default .venv-cleanrl/bin/python) with CleanRL's pins where they install (Python
3.11; jax and jaxlib 0.4.13, the oldest on PyPI for 3.11, not its 0.4.8 and 0.4.7; flax 0.6.8,
optax 0.1.4, gymnasium 0.29.1, scipy < 1.13 for that jax, numpy < 2, tyro, tensorboard, torch
2.13 for its replay buffer and SummaryWriter):
    python3.11 -m venv .venv-cleanrl && .venv-cleanrl/bin/pip install torch==2.13.0 jax==0.4.13 \
        jaxlib==0.4.13 flax==0.6.8 optax==0.1.4 gymnasium==0.29.1 "scipy<1.13" "numpy<2" tyro \
        tensorboard
the script from a CleanRL checkout at CLEANRL_DIR (default .cleanrl/: `git clone
https://github.com/vwxyzjn/cleanrl .cleanrl`); skipped with a line where either is missing.
(d) td3.py beside sac.py on brax/inverted_pendulum and brax/inverted_double_pendulum, each file's
preset as typed (200,000 steps a seed for both), 8 seeds on the held-out base 5000, a process each
with an empty compilation cache: bench_brax.py's (a) columns (its rows td3:brax/... and
sac:brax/...). About 42 minutes; alone:
    python benchmarks/bench_td3.py --brax       # writes results/TD3-brax.md
Not here: sbx's TD3 (rejax's and CleanRL's are the peers).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_brax  # noqa: E402
import bench_sac  # noqa: E402
import common  # noqa: E402

SEEDS, EVAL_EPISODES, QUICK_SEEDS, QUICK_EVAL_EPISODES = 16, 64, 2, 4
DDPG = ["--num-critics", "1", "--policy-noise", "0", "--policy-frequency", "1"]
ROWS = {"td3.py": ("td3", []), "td3.py as DDPG": ("td3", DDPG), "sac.py": ("sac", [])}
STEPS_B, SEEDS_B, REPEATS, QUICK_STEPS = 20_000, 4, 3, 2_000
# td3.py's Pendulum-v1 preset in rejax 0.1.3's terms: 1 env, a critic step per env step (num_epochs
# 1), batch 256, 1,000 uniform random steps first, Adam 1e-3 for both networks, gamma 0.99, Polyak
# 0.995 each time the policy steps (target_update_freq 1: its targets move with the policy), the
# policy every 2nd critic step, relu (its layers are fixed at 64, 64: ours), a buffer of the whole
# run. Its noises are in the env's units, ours in half-widths of Pendulum's [-2, 2]: x 2.
REJAX = dict(num_envs=1, num_epochs=1, batch_size=256, fill_buffer=1_000, learning_rate=1e-3,
             gamma=0.99, polyak=0.995, target_update_freq=1, policy_delay=2,
             exploration_noise=0.2, target_noise=0.4, target_noise_clip=1.0,
             actor_kwargs={"activation": "relu"}, critic_kwargs={"activation": "relu"})


def part_b(quick: bool) -> list[str]:
    seeds, steps = (QUICK_SEEDS, QUICK_STEPS) if quick else (SEEDS_B, STEPS_B)
    episodes, repeats = (QUICK_EVAL_EPISODES, 1) if quick else (EVAL_EPISODES, REPEATS)
    flags = ["--seed", str(bench_sac.BASE), "--num-seeds", str(seeds), "--eval-episodes",
             str(episodes), *(["--total-timesteps", str(steps)] if quick else [])]
    settings = dict(REJAX, buffer_size=steps, fill_buffer=min(REJAX["fill_buffer"], steps // 2))
    text = ["### (b) td3.py beside rejax's TD3",
            f"{seeds} seeds x {steps:,} env steps each. Ours: `python algos/td3.py "
            f"{' '.join(flags)} --no-track --compile-cache-dir EMPTY_TEMP_DIR`, the seeds over "
            "the 2 cores. rejax 0.1.3: `rejax.get_algo('td3').create(env=..., **settings)` on "
            "gymnax's Pendulum-v1 (seen through the 5-value step rejax 0.1 expects), "
            "`algo.train` vmapped over the seeds and pmapped over the 2 cores, one process: "
            + ", ".join(f"{k}={v}" for k, v in settings.items())
            + f"; one evaluation of {episodes} episodes after training, timed apart. Whole "
            f"process: launch to exit, median of {repeats} runs each after a warm-up run each, "
            "alternating, each with an empty compilation cache."]
    config = {"peer": "rejax", "algo": "td3", "settings": settings, "steps": steps,
              "seeds": seeds, "seed": bench_sac.BASE, "episodes": episodes,
              "time_sampler": False}
    skipped, rows = bench_sac.beside_rejax("td3", flags, config, repeats)
    return text + skipped + [common.md_table(
        ["implementation", "whole process s, median (runs; warm-up)",
         "training: compile + run s (median)", "evaluation, greedy", "seeds greedy >= -200"],
        rows),
        "Greedy: the policy's action (rejax's own act, which adds no noise); of the last timed "
        "run of each, mean over the seeds [95% bootstrap CI]. Ours evaluates inside its process "
        "after training (its run s is training alone); rejax's evaluation is compiled and run "
        "after training, in its whole process time. Settings that do not match: rejax's first "
        "1,000 steps act uniformly as ours, but its critic target stops at every episode end "
        "(one `done`: Pendulum-v1's 200-step limit taken as terminal), ours bootstraps through "
        "the limit; its policy ascends the mean of both critics, ours the first (TD3's); its "
        "replay buffer draws each batch without replacement, weighted over every slot "
        "(SAC.md (b) times that sampler), ours uniform indices into the filled slots; its "
        "critic loss is half the squared error."]


# CleanRL's flags for our Pendulum-v1 preset: its smoothing noise and clip are in the env's units
# (its exploration noise in half-widths, as ours): ours x 2 on Pendulum's [-2, 2]. Its others at
# its defaults, ours: tau 0.005, batch 256, exploration 0.1, the policy every 2nd step.
CLEANRL_FLAGS = ["--env-id", "Pendulum-v1", "--learning-rate", "1e-3", "--learning-starts", "1000",
                 "--policy-noise", "0.4", "--noise-clip", "1.0"]
RETURN = re.compile(r"global_step=(\d+), episodic_return=\[?(-?[\d.]+)")


def cleanrl_seed(python: str, script: Path, seed: int, steps: int) -> dict:
    """One seed of CleanRL's TD3 in its own process: its whole-process seconds and its final
    training return (the mean episode return over the last 5% of its steps, as ours)."""
    with tempfile.TemporaryDirectory() as folder:  # (its runs/ and videos/ land there)
        t0 = time.perf_counter()
        proc = subprocess.run(
            [python, str(script), *CLEANRL_FLAGS, "--seed", str(seed), "--total-timesteps",
             str(steps)], cwd=folder, capture_output=True, text=True, timeout=3600,
            env={**common.user_env(), "PYTHONPATH": str(script.parents[1]),
                 "JAX_PLATFORMS": "cpu"})
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"CleanRL's TD3 failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    episodes = [(int(step), float(r)) for step, r in RETURN.findall(proc.stdout)]
    last = [r for step, r in episodes if step >= steps * 0.95] or [episodes[-1][1]]
    return {"process_s": seconds, "final": float(np.mean(last))}


def part_c(quick: bool) -> list[str]:
    seeds, steps = (QUICK_SEEDS, QUICK_STEPS) if quick else (SEEDS_B, STEPS_B)
    python = os.environ.get("CLEANRL_PYTHON", str(common.ROOT / ".venv-cleanrl/bin/python"))
    checkout = Path(os.environ.get("CLEANRL_DIR", common.ROOT / ".cleanrl"))
    script = checkout / "cleanrl" / "td3_continuous_action_jax.py"
    flags = ["--hidden-size", "256", "--seed", str(bench_sac.BASE), "--num-seeds", str(seeds),
             "--eval-episodes", str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES),
             *(["--total-timesteps", str(steps)] if quick else [])]
    text = ["### (c) td3.py beside CleanRL's TD3",
            f"{seeds} seeds x {steps:,} env steps each, at CleanRL's network (2 x 256 relu), "
            "batch 256 and a critic step per env step, lr 1e-3 and 1,000 random steps first "
            f"(our preset's). Ours: `python algos/td3.py {' '.join(flags)} --no-track "
            "--compile-cache-dir EMPTY_TEMP_DIR`, one process. CleanRL: `python "
            f"cleanrl/td3_continuous_action_jax.py {' '.join(CLEANRL_FLAGS)} --seed S "
            f"--total-timesteps {steps}` for S = {bench_sac.BASE} to "
            f"{bench_sac.BASE + seeds - 1}, a process a seed, two at a time (a core each)."]
    if not (Path(python).exists() and script.exists()):
        return text + [f"- skipped CleanRL: {python} or {script} is missing (CLEANRL_PYTHON, "
                       "CLEANRL_DIR; see this file's docstring)."]
    ours_run = bench_sac.ours("td3", flags)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:
        theirs = list(pool.map(lambda s: cleanrl_seed(python, script, s, steps),
                               range(bench_sac.BASE, bench_sac.BASE + seeds)))
    wall = time.perf_counter() - t0
    per_seed = [r["process_s"] for r in theirs]
    rows = [["td3.py", f"{ours_run['process_s']:.1f}",
             f"{ours_run['process_s'] / seeds:.1f}",
             common.with_ci(ours_run["final"][0], spec=".1f")],
            ["CleanRL", f"{wall:.1f}", f"{np.median(per_seed):.1f} (a process each: "
             + ", ".join(f"{x:.0f}" for x in per_seed) + ")",
             common.with_ci([r["final"] for r in theirs], spec=".1f")]]
    return text + [common.md_table(
        ["implementation", f"all {seeds} seeds, s (launch to exit)", "s a seed",
         "final training return, mean [95% CI]"], rows),
        "Final training return: the mean episode return over the last 5% of the steps, mean "
        "over the seeds [95% bootstrap CI] (CleanRL's from the returns it prints). CleanRL "
        "steps gymnasium's numpy Pendulum-v1 and calls its jitted updates from a Python loop, "
        "a step at a time; ours runs the whole run as one program. Settings that do not match: "
        "CleanRL's first gradient step is at step 1,001 (ours 1,000); its buffer holds 1M "
        "transitions (ours the run's 20,000: the same data); its seeds are not ours (other "
        "streams)."]


BRAX_ROWS = [f"{name}:brax/{task}" for task in ("inverted_pendulum", "inverted_double_pendulum")
             for name in ("td3", "sac")]  # bench_brax.ROWS


def part_d(quick: bool) -> list[str]:
    """(d): bench_brax.py's (a) on BRAX_ROWS, under this file's heading."""
    table = bench_brax.part_a(quick, BRAX_ROWS)[1:]  # (its own "(a)" heading left out)
    return ["### (d) td3.py beside sac.py on Brax's pendulums", *table,
            "Both files' presets on these tasks: 200,000 steps a seed, one env, a gradient step "
            "per env step, batch 256, two hidden layers of 64, 5,000 random steps first; sac.py's "
            "inverted_double_pendulum preset adds LayerNorm to its critics and anneals its "
            "learning rate (algos/sac.py BRAX)."]


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
        "## TD3: td3.py, and as DDPG, beside sac.py and rejax's TD3 on Pendulum-v1",
        f"Load average (1, 5, 15 min) at the start: {load_start}.",
        "Commands, each in its own process (run as typed by common.run_command):\n\n"
        + "\n".join(f"    {c}" for c in commands),
        "Columns as SAC.md's (a) (bench_sac.row_a): held -200 is the first update from which the "
        "mean training return over a trailing 5% of the updates stays at or above -200 to the "
        "end, the latest over the seeds; final training return: the mean episode return over "
        "the last 5% of updates, mean over the seeds [95% bootstrap CI]; evaluation: "
        f"{QUICK_EVAL_EPISODES if quick else EVAL_EPISODES} fresh episodes per seed, by the "
        "policy's action (greedy) and with the file's exploration (sampled).",
        "### (a) td3.py, and as DDPG, beside sac.py",
        common.md_table(headers, rows), *part_b(quick), *part_c(quick), *part_d(quick),
        f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__":
    common.write_part("bench_td3.py", "brax", "TD3-brax.md", part_d, __doc__.split("\n\n")[0])
