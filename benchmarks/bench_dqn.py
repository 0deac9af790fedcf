"""DQN (algos/dqn.py) on CartPole-v1 on held-out seeds, and beside rejax's DQN.

    python benchmarks/run.py --only dqn         # writes results/DQN.md (about 20 minutes, 2 cores)

(a) dqn.py as typed on CartPole-v1 (its preset: 500k steps a seed), 8 seeds on the held-out seed
base 5000, one process with an empty compilation cache (bench_sac.ours): env steps and seconds
until every seed held 475, the final training return, the greedy and the epsilon-greedy
evaluations (64 episodes a seed).
(b) dqn.py beside rejax 0.1.3's DQN at dqn.py's preset in rejax's terms, 4 seeds x 500k steps:
rejax fixes its network at 64-64, so ours runs with --hidden-sizes 64 64 here. Whole process
times (a warm-up run each, then 2 runs each alternating ours and rejax; medians), each process
with an empty compilation cache; rejax in the peers' environment (.venv-peers or PEERS_PYTHON)
through bench_sac.py's worker, skipped with a line where it is not installed.
Not here yet: PureJaxRL's dqn.py (it needs flashbax), sbx's DQN, Acrobot-v1 and the MinAtar
games.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sac  # noqa: E402
import common  # noqa: E402

BASE, THRESHOLD = 5000, 475.0  # the held-out seed base; CartPole-v1 counts 475 as solved
SEEDS_A, SEEDS_B, REPEATS, STEPS = 8, 4, 2, 500_000
EVAL_EPISODES, QUICK_SEEDS, QUICK_EVAL_EPISODES, QUICK_STEPS = 64, 2, 4, 20_000
# dqn.py's CartPole-v1 preset in rejax 0.1.3's terms: 8 envs, a gradient step after each step of
# them (num_epochs 1), buffer 10,000, batch 128, 10,000 steps of uniform actions first, Adam 2.5e-4,
# gamma 0.99, the target copied every 500 env steps (polyak 0), epsilon 1 -> 0.05 over half the
# run, Double DQN's target, relu. Its loss is half the squared error (ours: the squared error).
REJAX = dict(num_envs=8, num_epochs=1, buffer_size=10_000, fill_buffer=10_000, batch_size=128,
             learning_rate=2.5e-4, gamma=0.99, target_update_freq=500, polyak=0.0,
             eps_start=1.0, eps_end=0.05, exploration_fraction=0.5, ddqn=True,
             agent="QNetwork", agent_kwargs={"activation": "relu"})


def part_a(quick: bool) -> list[str]:
    flags = ["--seed", str(BASE), "--num-seeds", str(QUICK_SEEDS if quick else SEEDS_A),
             "--eval-episodes", str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES),
             *(["--total-timesteps", str(QUICK_STEPS)] if quick else [])]
    r = bench_sac.ours("dqn", flags, THRESHOLD)
    print("  dqn (a): done", flush=True)
    headers = ["command", "seeds x steps", "env steps per seed until every seed held 475",
               "s from launch until every seed held 475", "whole process s (compile + run)",
               "final training return, mean [95% CI]", "worst seed", "evaluation, greedy",
               "evaluation, epsilon-greedy", "seeds greedy >= 475"]
    return ["### (a) dqn.py as typed, held-out seeds",
            f"Command: `python algos/dqn.py {' '.join(flags)} --no-track --compile-cache-dir "
            "EMPTY_TEMP_DIR` (run as typed by common.run_command). Held 475: the first update "
            "from which the mean training return over a trailing 5% of the updates stays at or "
            "above 475 to the end (common.held_from), the latest over the seeds; the training "
            "return is of the epsilon-greedy envs (epsilon 0.05 from mid-run). Final training "
            "return: the mean episode return over the last 5% of updates, mean over the seeds "
            "[95% bootstrap CI]. Evaluation: fresh episodes per seed, greedy in Q and "
            "epsilon-greedy at the final epsilon.",
            common.md_table(headers, [bench_sac.row_a("dqn", r, THRESHOLD)])]


def part_b(quick: bool) -> list[str]:
    seeds, steps = (QUICK_SEEDS, QUICK_STEPS) if quick else (SEEDS_B, STEPS)
    episodes, repeats = (QUICK_EVAL_EPISODES, 1) if quick else (EVAL_EPISODES, REPEATS)
    flags = ["--hidden-sizes", "64", "64", "--seed", str(BASE), "--num-seeds", str(seeds),
             "--eval-episodes", str(episodes), "--total-timesteps", str(steps)]
    settings = dict(REJAX, fill_buffer=min(REJAX["fill_buffer"], steps // 2))
    text = ["### (b) dqn.py beside rejax's DQN",
            f"{seeds} seeds x {steps:,} env steps each. Ours: `python algos/dqn.py "
            f"{' '.join(flags)} --no-track --compile-cache-dir EMPTY_TEMP_DIR`, the seeds over "
            "the 2 cores. rejax 0.1.3: `rejax.get_algo('dqn').create(env=..., **settings)` on "
            "gymnax's CartPole-v1, `algo.train` vmapped over the seeds and pmapped over the 2 "
            "cores, one process: " + ", ".join(f"{k}={v}" for k, v in settings.items())
            + f" (its network: 64-64, fixed); one evaluation of {episodes} episodes after "
            f"training, timed apart. Whole process: launch to exit, median of {repeats} runs "
            "each after a warm-up run each, alternating, each with an empty compilation cache."]
    config = {"peer": "rejax", "algo": "dqn", "env": "CartPole-v1", "settings": settings,
              "steps": steps, "seeds": seeds, "seed": BASE, "episodes": episodes,
              "time_sampler": False}
    skipped, rows = bench_sac.beside_rejax("dqn", flags, config, repeats, THRESHOLD)
    return text + skipped + [common.md_table(
        ["implementation", "whole process s, median (runs; warm-up)",
         "training: compile + run s (median)", "evaluation, greedy", "seeds greedy >= 475"],
        rows),
        "Greedy: ours argmax Q; rejax's own act, epsilon-greedy at 0.005 (its make_act). Of the "
        "last timed run of each, mean over the seeds [95% bootstrap CI]. Settings that do not "
        "match: rejax's target stops at every episode end (one `done`: CartPole-v1's 500-step "
        "limit taken as terminal), ours bootstraps through the limit; its buffer draws each "
        "batch without replacement, weighted over every slot (SAC.md (b) times that sampler), "
        "ours uniform indices into the filled slots; its loss is half the squared error."]


def run(quick: bool = False) -> str:
    load_start = common.load_average()
    text = [*part_a(quick), *part_b(quick)]
    return "\n\n".join([
        "## DQN: dqn.py on held-out seeds, beside rejax's DQN, on CartPole-v1",
        f"Load average (1, 5, 15 min) at the start: {load_start}.", *text,
        f"Load average at the end: {common.load_average()}."])
