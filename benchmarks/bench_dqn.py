"""DQN (algos/dqn.py) on CartPole-v1 and Acrobot-v1 on held-out seeds, beside rejax's DQN and
PureJaxRL's dqn.py.

    PUREJAXRL_DIR=DIR python benchmarks/run.py --only dqn   # writes results/DQN.md (13 minutes)

(a) dqn.py as typed on CartPole-v1 (its preset: 500k steps a seed) and Acrobot-v1 (no preset of
its own: the "discrete" one, CartPole-v1's), 8 seeds on the held-out seed base 5000, one process
each with an empty compilation cache (bench_sac.ours): env steps and seconds until every seed held
the env's threshold (THRESHOLDS), the final training return, the greedy and the epsilon-greedy
evaluations (64 episodes a seed).
(b) dqn.py beside rejax 0.1.3's DQN at dqn.py's preset in rejax's terms, 4 seeds x 500k steps, on
both envs: rejax fixes its network at 64-64 and its learning rate, so ours runs with
--hidden-sizes 64 64 --anneal-lr False here. Whole
process times (a warm-up run each, then 2 runs each alternating ours and rejax; medians), each
process with an empty compilation cache; rejax in the peers' environment (.venv-peers or
PEERS_PYTHON) through bench_sac.py's worker, skipped with a line where it is not installed.
(c) dqn.py as typed beside PureJaxRL's dqn.py (luchris429/purejaxrl, purejaxrl/dqn.py) at the
configuration of its main() (its ENV_NAME set to each env), 4 seeds x 500k steps, on both envs,
alternating as (b). PureJaxRL is not installed: its checkout comes from PUREJAXRL_DIR (skipped with
a line where it is unset); it runs in the peers' environment, which has flashbax (its replay
buffer, benchmarks/requirements-peers.txt), as its main() runs seeds (jax.jit(jax.vmap(
make_train)) over split keys, one device), with an empty stand-in for wandb where it is not
installed (main() alone calls it, disabled), jax.tree_map, which jax 0.11 dropped, as
jax.tree.map, and gymnax 1.0's 6-value step seen as the 5-value one it was written for
(purejaxrl_worker). Its greedy policy is evaluated here apart (argmax Q, 64 episodes
a seed), timed apart.
(d) dqn.py as typed on Breakout-MinAtar and SpaceInvaders-MinAtar (its MinAtar preset: 5M steps a
seed), 2 seeds on the held-out base 5000, a process each with an empty compilation cache, beside
the DQN returns Young & Tian 2019 publish for MinAtar (MINATAR_DQN). About 66 minutes; alone:
    python benchmarks/bench_dqn.py --minatar    # writes results/DQN-minatar.md
Not here: sbx's DQN (rejax's and PureJaxRL's are the peers).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sac  # noqa: E402
import common  # noqa: E402
import peers  # noqa: E402

BASE = 5000  # the held-out seed base
# What each env counts as solved: CartPole-v1 475 (gymnasium's reward_threshold), Acrobot-v1 -100
# (gymnasium's reward_threshold: the swing-up in under 100 steps)
THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}
SEEDS_A, SEEDS_B, REPEATS, STEPS = 8, 4, 2, 500_000
EVAL_EPISODES, QUICK_SEEDS, QUICK_EVAL_EPISODES, QUICK_STEPS = 64, 2, 4, 20_000
# dqn.py's CartPole-v1 preset in rejax 0.1.3's terms: 8 envs, a gradient step after each step of
# them (num_epochs 1), buffer 50,000, batch 128, 10,000 steps of uniform actions first, Adam
# 5e-4 (constant: rejax has no schedule, so ours runs with --anneal-lr False here), gamma 0.99, the
# target copied every 500 env steps (polyak 0), epsilon 1 -> 0.05 over half the run, Double DQN's
# target, relu. Its loss is half the squared error (ours: the squared error).
REJAX = dict(num_envs=8, num_epochs=1, buffer_size=50_000, fill_buffer=10_000, batch_size=128,
             learning_rate=5e-4, gamma=0.99, target_update_freq=500, polyak=0.0,
             eps_start=1.0, eps_end=0.05, exploration_fraction=0.5, ddqn=True,
             agent="QNetwork", agent_kwargs={"activation": "relu"})


def part_a(quick: bool) -> list[str]:
    rows, commands = [], []
    for env_id, threshold in THRESHOLDS.items():
        flags = [*([] if env_id == "CartPole-v1" else ["--env-id", env_id]), "--seed", str(BASE),
                 "--num-seeds", str(QUICK_SEEDS if quick else SEEDS_A), "--eval-episodes",
                 str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES),
                 *(["--total-timesteps", str(QUICK_STEPS)] if quick else [])]
        commands.append(f"python algos/dqn.py {' '.join(flags)} --no-track --compile-cache-dir "
                        "EMPTY_TEMP_DIR")
        rows.append(bench_sac.row_a("dqn", bench_sac.ours("dqn", flags, threshold), threshold))
        print(f"  dqn (a) {env_id}: done", flush=True)
    headers = ["command", "seeds x steps", "env steps per seed until every seed held the threshold",
               "s from launch until every seed held the threshold",
               "whole process s (compile + run)", "final training return, mean [95% CI]",
               "worst seed", "evaluation, greedy", "evaluation, epsilon-greedy",
               "seeds greedy at the threshold"]
    return ["### (a) dqn.py as typed, held-out seeds",
            "Commands, each in its own process (run as typed by common.run_command):\n\n"
            + "\n".join(f"    {c}" for c in commands),
            "Thresholds: " + ", ".join(f"{k} {v:g}" for k, v in THRESHOLDS.items())
            + " (gymnasium's reward_threshold). Held: the first update from which the mean "
            "training return over a trailing 5% of the updates stays at or above the threshold "
            "to the end (common.held_from), the latest over the seeds; the training return is "
            "of the epsilon-greedy envs (epsilon 0.05 from mid-run). Acrobot-v1 takes the "
            "\"discrete\" preset (CartPole-v1's). Final training return: the mean episode return "
            "over the last 5% of updates, mean over the seeds [95% bootstrap CI]. Evaluation: "
            "fresh episodes per seed, greedy in Q and epsilon-greedy at the final epsilon.",
            common.md_table(headers, rows)]


def part_b(quick: bool) -> list[str]:
    seeds, steps = (QUICK_SEEDS, QUICK_STEPS) if quick else (SEEDS_B, STEPS)
    episodes, repeats = (QUICK_EVAL_EPISODES, 1) if quick else (EVAL_EPISODES, REPEATS)
    settings = dict(REJAX, fill_buffer=min(REJAX["fill_buffer"], steps // 2))
    flags = ["--hidden-sizes", "64", "64", "--anneal-lr", "False", "--seed", str(BASE),
             "--num-seeds", str(seeds), "--eval-episodes", str(episodes), "--total-timesteps",
             str(steps)]
    text = ["### (b) dqn.py beside rejax's DQN",
            f"{seeds} seeds x {steps:,} env steps each. Ours: `python algos/dqn.py --env-id ENV "
            f"{' '.join(flags)} --no-track --compile-cache-dir EMPTY_TEMP_DIR`, the seeds over "
            "the 2 cores. rejax 0.1.3: `rejax.get_algo('dqn').create(env=..., **settings)` on "
            "gymnax's env, `algo.train` vmapped over the seeds and pmapped over the 2 cores, one "
            "process: " + ", ".join(f"{k}={v}" for k, v in settings.items())
            + f" (its network: 64-64, fixed); one evaluation of {episodes} episodes after "
            f"training, timed apart. Whole process: launch to exit, median of {repeats} runs "
            "each after a warm-up run each, alternating, each with an empty compilation cache."]
    rows, skipped = [], []
    for env_id, threshold in THRESHOLDS.items():
        config = {"peer": "rejax", "algo": "dqn", "env": env_id, "settings": settings,
                  "steps": steps, "seeds": seeds, "seed": BASE, "episodes": episodes,
                  "time_sampler": False}
        skipped, env_rows = bench_sac.beside_rejax("dqn", ["--env-id", env_id, *flags], config,
                                                   repeats, threshold)
        rows += [[env_id, *row] for row in env_rows]
    return text + skipped + [common.md_table(
        ["env", "implementation", "whole process s, median (runs; warm-up)",
         "training: compile + run s (median)", "evaluation, greedy",
         "seeds greedy at the threshold"], rows),
        "Greedy: ours argmax Q; rejax's own act, epsilon-greedy at 0.005 (its make_act). Of the "
        "last timed run of each, mean over the seeds [95% bootstrap CI]; thresholds as in (a). "
        "Settings that do not match: rejax's target stops at every episode end (one `done`: "
        "the 500-step limit taken as terminal), ours bootstraps through the limit; its buffer "
        "draws each batch without replacement, weighted over every slot (SAC.md (b) times that "
        "sampler), ours uniform indices into the filled slots; its loss is half the squared "
        "error."]


# ----------------------------------------------------------------------------- PureJaxRL
# The configuration of PureJaxRL's dqn.py main(), 4 seeds (its NUM_SEEDS: 1) on the held-out base.
PUREJAXRL = {"NUM_ENVS": 10, "BUFFER_SIZE": 10_000, "BUFFER_BATCH_SIZE": 128,
             "TOTAL_TIMESTEPS": STEPS, "EPSILON_START": 1.0, "EPSILON_FINISH": 0.05,
             "EPSILON_ANNEAL_TIME": 250_000, "TARGET_UPDATE_INTERVAL": 500, "LR": 2.5e-4,
             "LEARNING_STARTS": 10_000, "TRAINING_INTERVAL": 10, "LR_LINEAR_DECAY": False,
             "GAMMA": 0.99, "TAU": 1.0, "WANDB_MODE": "disabled"}
QUICK_PUREJAXRL = {"TOTAL_TIMESTEPS": QUICK_STEPS, "EPSILON_ANNEAL_TIME": QUICK_STEPS // 2,
                   "LEARNING_STARTS": 1_000}


def purejaxrl_worker(config: dict) -> dict:
    """PureJaxRL's dqn.py make_train(config) as its main() runs seeds (jax.jit(jax.vmap(...)) over
    jax.random.split(PRNGKey(seed), seeds), one device), then, timed apart, each seed's greedy
    policy (argmax of its QNetwork) on config["episodes"] fresh episodes. -> compile and run
    seconds, per seed the final training return (its metric "returns", each env's last ended
    episode, averaged over the envs and the last 5% of updates) and the greedy evaluation."""
    import gymnax
    import jax
    import jax.numpy as jnp

    notes = []
    folder = Path(config["dir"])
    sys.path.insert(0, str(folder / "purejaxrl" if (folder / "purejaxrl").is_dir() else folder))
    if importlib.util.find_spec("wandb") is None:
        sys.modules["wandb"] = types.ModuleType("wandb")  # main() alone calls it (disabled)
        notes.append("wandb not installed: an empty stand-in module")
    if not hasattr(jax, "tree_map"):  # dropped by jax 0.11; the same function
        jax.tree_map = jax.tree.map
        notes.append("jax.tree_map (dropped by jax 0.11) as jax.tree.map")
    module = __import__("dqn")
    log_wrapper = module.LogWrapper

    def five_value_log_wrapper(env):  # its step unpacks 5 values: gymnax 1.0's give 6
        return peers.FiveValueStep(log_wrapper(env))

    module.LogWrapper = five_value_log_wrapper
    notes.append("gymnax 1.0's 6-value step seen as the 5-value one it was written for "
                 "(peers.FiveValueStep: done is terminated or truncated)")
    run_config = {**config["config"], "ENV_NAME": config["env"]}
    train = jax.jit(jax.vmap(module.make_train(run_config)))
    keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["seeds"])
    t0 = time.perf_counter()
    compiled = train.lower(keys).compile()
    compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    out = jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - t0
    returns = np.asarray(out["metrics"]["returns"], np.float64)  # [seeds, updates]
    final = returns[:, -max(1, round(returns.shape[1] * 0.05)):].mean(1).tolist()

    env, env_params = gymnax.make(config["env"])
    network = module.QNetwork(action_dim=env.action_space(env_params).n)

    def greedy_returns(params, key):  # config["episodes"] episodes to their end or the limit
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(key, config["episodes"]), env_params)

        def step(carry, key):
            obs, state, ended, total = carry
            action = network.apply(params, obs).argmax(-1)
            obs, state, reward, terminated, truncated, _ = jax.vmap(
                env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(key, config["episodes"]), state, action, env_params)
            total = total + jnp.where(ended, 0.0, reward)
            return (obs, state, ended | terminated | truncated, total), None

        start = (obs, state, jnp.zeros(config["episodes"], bool), jnp.zeros(config["episodes"]))
        steps = jax.random.split(jax.random.fold_in(key, 1), env_params.max_steps_in_episode)
        return jax.lax.scan(step, start, steps)[0][3].mean()

    params = out["runner_state"][0].params
    t0 = time.perf_counter()
    greedy = jax.device_get(jax.jit(jax.vmap(greedy_returns))(params, keys))
    return {"compile_s": compile_s, "run_s": run_s, "eval_s": time.perf_counter() - t0,
            "final": final, "greedy": np.asarray(greedy, np.float64).tolist(), "notes": notes}


def part_c(quick: bool) -> list[str]:
    seeds = QUICK_SEEDS if quick else SEEDS_B
    episodes, repeats = (QUICK_EVAL_EPISODES, 1) if quick else (EVAL_EPISODES, REPEATS)
    settings = {**PUREJAXRL, **(QUICK_PUREJAXRL if quick else {})}
    flags = ["--seed", str(BASE), "--num-seeds", str(seeds), "--eval-episodes", str(episodes),
             *(["--total-timesteps", str(QUICK_STEPS)] if quick else [])]
    text = ["### (c) dqn.py beside PureJaxRL's dqn.py",
            f"{seeds} seeds x {settings['TOTAL_TIMESTEPS']:,} env steps each. Ours: `python "
            f"algos/dqn.py --env-id ENV {' '.join(flags)} --no-track --compile-cache-dir "
            "EMPTY_TEMP_DIR` (its preset: PureJaxRL's settings but for the differences below), "
            "the seeds over the 2 cores. PureJaxRL: purejaxrl/dqn.py's make_train on its main()'s "
            "configuration, ENV_NAME the env: " + ", ".join(f"{k}={v}" for k, v in
                                                           settings.items())
            + f", jax.jit(jax.vmap(make_train(config))) over {seeds} keys split from "
            f"PRNGKey({BASE}), one process, one device (as its main() runs; it has no pmap), "
            "in the peers' environment (flashbax). Its greedy policy (argmax Q) on "
            f"{episodes} fresh episodes a seed, evaluated after training and timed apart. Whole "
            f"process: launch to exit, median of {repeats} runs each after a warm-up run each, "
            "alternating, each with an empty compilation cache."]
    checkout, python = os.environ.get("PUREJAXRL_DIR"), peers.peers_python()
    if not checkout or python is None or not peers.installed(python, "flashbax"):
        return text + ["- skipped PureJaxRL: PUREJAXRL_DIR (a checkout of luchris429/purejaxrl) "
                       "is unset, or flashbax is not installed in the peers environment "
                       "(benchmarks/requirements-peers.txt)."]
    rows, notes = [], set()
    for env_id, threshold in THRESHOLDS.items():
        config = {"dir": checkout, "env": env_id, "config": settings, "seed": BASE,
                  "seeds": seeds, "episodes": episodes}
        ours, theirs = [], []
        for i in range(repeats + 1):  # the first of each: the warm-up, not counted
            ours.append(bench_sac.ours("dqn", ["--env-id", env_id, *flags], threshold))
            theirs.append(common.run_worker(Path(__file__), config, env=peers.PEER_ENV,
                                            python=python, as_user=True))
            notes.update(theirs[-1]["notes"])
            print(f"  dqn (c) {env_id}, round {i}: done", flush=True)
        for label, done in (("dqn.py", ours), ("PureJaxRL", theirs)):
            last = done[-1]
            greedy = last["greedy"] if label == "PureJaxRL" else last["evals"]["greedy"][0]
            final = last["final"] if label == "PureJaxRL" else last["final"][0]
            rows.append([env_id, label, *bench_sac.timing_cells(done),
                         common.with_ci(final, spec=".1f"), common.with_ci(greedy, spec=".1f"),
                         f"{int((np.asarray(greedy) >= threshold).sum())}/{len(greedy)}"])
    return text + [common.md_table(
        ["env", "implementation", "whole process s, median (runs; warm-up)",
         "training: compile + run s (median)", "final training return, mean [95% CI]",
         "evaluation, greedy", "seeds greedy at the threshold"], rows),
        "Final training return: ours the mean return of the episodes that ended in the last 5% "
        "of updates; PureJaxRL's its metric `returns` (each env's last ended episode, averaged "
        "over the envs) over its last 5% of updates; mean over the seeds [95% bootstrap CI]. "
        "Greedy: argmax Q, of the last timed run of each. PureJaxRL's whole process holds its "
        "greedy evaluation (ours: inside our process too). Settings that do not match (our "
        "preset's, algos/dqn.py): 8 envs and a gradient step after each step of them, one per "
        "8 env steps (theirs: 10 envs, one per 10 env steps); a buffer of 50,000 and Adam "
        "5e-4 annealed to 0 (theirs: 10,000 and 2.5e-4 constant); Double DQN's target "
        "(theirs: the max); their target stops at every episode end (one "
        "`done`: the 500-step limit taken as terminal), ours bootstraps through the limit; "
        "their buffer (flashbax's flat buffer) draws a batch uniformly over the filled slots, "
        "as ours. Stand-ins: " + ("; ".join(sorted(notes)) or "none") + "."]


# Young & Tian 2019's DQN at 5M frames, read off the learning curves of their repository
# (kenjyoung/MinAtar img/learning_curves.gif: the moving average of the training return over 100
# episodes, epsilon 0.1, the mean of 30 runs): Breakout about 10, Space Invaders about 43.
MINATAR_DQN = {"Breakout-MinAtar": 10.0, "SpaceInvaders-MinAtar": 43.0}
MINATAR_SOURCE = ("https://github.com/kenjyoung/MinAtar/blob/"
                  "87c2bc825e0a4171040323a8164e9ecd32d14731/img/learning_curves.gif")
MINATAR_SEEDS, MINATAR_TIMEOUT_S = 2, 3 * 3600


def part_d(quick: bool) -> list[str]:
    """(d): dqn.py's MinAtar preset beside Young & Tian's DQN returns."""
    rows, commands = [], []
    for env_id, published in MINATAR_DQN.items():
        flags = ["--env-id", env_id, "--seed", str(BASE), "--num-seeds", str(MINATAR_SEEDS),
                 "--eval-episodes", str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES),
                 *(["--total-timesteps", str(QUICK_STEPS)] if quick else [])]
        commands.append(f"python algos/dqn.py {' '.join(flags)} --no-track --compile-cache-dir "
                        "EMPTY_TEMP_DIR")
        result = bench_sac.ours("dqn", flags, published, MINATAR_TIMEOUT_S)
        rows.append([env_id, f"{published:g}", *bench_sac.row_a("dqn", result, published)])
        print(f"  dqn (d) {env_id}: done", flush=True)
    headers = ["game", "Young & Tian's DQN (5M frames)", "command", "seeds x steps",
               "env steps per seed until every seed held the published return",
               "s from launch until every seed held it", "whole process s (compile + run)",
               "final training return, mean [95% CI]", "worst seed", "evaluation, greedy",
               "evaluation, epsilon-greedy", "seeds greedy at the published return"]
    return ["### (d) dqn.py on MinAtar beside Young & Tian's DQN",
            "Commands, each in its own process (run as typed by common.run_command):\n\n"
            + "\n".join(f"    {c}" for c in commands),
            f"Published: Young & Tian 2019's DQN read off their learning curves ([{MINATAR_SOURCE}]"
            f"({MINATAR_SOURCE})): the moving average of the training return over 100 episodes "
            "at epsilon 0.1, the mean of 30 runs, at 5M frames. Their MinAtar is not gymnax's: "
            "sticky actions (0.1) and all 6 actions; their agent one env with a gradient step "
            "per step and RMSProp, ours 4 envs with a gradient step after each step of the 4 "
            "(1.25M a seed) and Adam (algos/dqn.py MINATAR). Held, final training return and "
            "evaluation as in (a); the training return is of the envs at epsilon 0.1, as theirs.",
            common.md_table(headers, rows)]


def run(quick: bool = False) -> str:
    load_start = common.load_average()
    text = [*part_a(quick), *part_b(quick), *part_c(quick)]
    return "\n\n".join([
        "## DQN: dqn.py on held-out seeds, beside rejax's DQN and PureJaxRL's, on CartPole-v1 "
        "and Acrobot-v1",
        f"Load average (1, 5, 15 min) at the start: {load_start}.", *text,
        f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__" and not common.worker_entry(purejaxrl_worker):
    common.write_part("bench_dqn.py", "minatar", "DQN-minatar.md", part_d,
                      __doc__.split("\n\n")[0])
