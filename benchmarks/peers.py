"""Reference PPO implementations beside ours: same machine, same env-step budget, same number of
seeds (`python benchmarks/run.py --peers`, or `python benchmarks/peers.py [--quick]`).

Peers run in their own environment, found at .venv-peers/ or named by the PEERS_PYTHON variable:

    python3.12 -m venv .venv-peers
    .venv-peers/bin/pip install -r requirements.txt -r benchmarks/requirements-peers.txt

A peer that is not installed is skipped with a line saying so. Per environment, 8 seeds of each
implementation use the whole machine (2 cores); the figure is the time from the launch of the
first process until every seed's score held the threshold (the same sustained rule for all:
its mean over a trailing 5% of its points at or above it from then to the end, common.held_from):
- ours: `ppo.py --num-seeds 8` as typed (the commands table's processes, cold and warm cache);
- rejax PPO (pure JAX): its tuned gymnax configuration (configs/gymnax/*.yaml in its repository),
  on the gymnax env seen through the 5-value step rejax 0.1 expects; its train() vmapped over 4
  seeds and pmapped over the 2 cores, one process; score: its own evaluation (16 episodes of the
  stochastic policy) at 20 points of the run (Pendulum-v1: 15, its updates of 10,000 steps
  setting the spacing);
- Stable-Baselines3 PPO (PyTorch): RL-Zoo's tuned hyperparameters; two processes with one torch
  thread each (one per core), each training 4 seeds in turn; score: the mean return of the
  episodes finished in a rollout (as ours: in an update).
Final return: the mean episode return over the last 5% of the budget (rejax: its last evaluation).
SB3 trains a seed in ~60 s (CartPole-v1) and ~100 s (Pendulum-v1) on one core, so 8 seeds of
both on 2 cores take ~11 minutes; with rejax and ours, --peers added 12 minutes (716 s) to the
full run of 2026-11-26.
"""
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SEEDS = 8
ENVS = {"CartPole-v1": "ppo", "Pendulum-v1": "ppo_pendulum"}  # env -> our command (its budget)
BUDGET = 300_000  # env steps per seed: our defaults for both
QUICK_BUDGET, QUICK_SEEDS = 16_384, 2
# RL-Zoo's tuned PPO settings (rl-baselines3-zoo hyperparams/ppo.yml) as it states them: its
# `lin_x` is a linear schedule from x to 0 over the run (SB3 calls it with the progress remaining,
# 1 to 0; the Zoo's n_timesteps is 1e5, the schedule here spans our budget).
linear = lambda x: lambda progress_remaining: progress_remaining * x  # noqa: E731
SB3_ZOO = {
    "CartPole-v1": dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3),
                        clip_range=linear(0.2)),  # lin_0.001, lin_0.2
    "Pendulum-v1": dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
                        ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True,
                        sde_sample_freq=4),
}
REJAX = {  # rejax's tuned gymnax PPO settings (configs/gymnax/{cartpole,pendulum}.yaml)
    "CartPole-v1": dict(agent_kwargs={"activation": "tanh"}, num_envs=5, num_steps=100,
                        num_epochs=5, num_minibatches=5, learning_rate=0.00075,
                        max_grad_norm=0.5, gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
                        ent_coef=0.01, vf_coef=0.5),
    "Pendulum-v1": dict(agent_kwargs={"activation": "swish"}, num_envs=100, num_steps=100,
                        num_epochs=10, num_minibatches=10, learning_rate=0.001,
                        max_grad_norm=10, gamma=0.995, gae_lambda=0.95, clip_eps=0.2,
                        ent_coef=0.0, vf_coef=0.5, normalize_observations=True),
}
REJAX_EVALS, REJAX_EVAL_EPISODES, REJAX_DEVICES = 20, 16, 2


# ----------------------------------------------------------------------------- workers
class FiveValueStep:
    """A gymnax 1.0 env seen through the pre-1.0 5-value step rejax 0.1 expects (one `done`:
    terminated or truncated, so a time limit ends the episode as a termination does)."""

    def __init__(self, env):
        self.env = env

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, params)
        return obs, state, reward, terminated | truncated, info

    def __getattr__(self, name):  # only reached for what the wrapper does not define
        if name == "env" or name.startswith("__"):  # (deepcopy's hooks: the wrapper's own)
            raise AttributeError(name)
        return getattr(self.env, name)


def episode_recorder():
    """A Stable-Baselines3 callback (SB3 and sbx) keeping every finished episode (env step,
    return) in `episodes` and, per rollout, (time, env steps, mean return of its episodes or None)
    in `points`. SB3 is imported here: only the peers' environment has it."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Record(BaseCallback):
        def _on_training_start(self):
            self.rollout, self.episodes, self.points = [], [], []

        def _on_step(self):
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.rollout.append(info["episode"]["r"])
                    self.episodes.append((self.num_timesteps, info["episode"]["r"]))
            return True

        def _on_rollout_end(self):
            mean = float(np.mean(self.rollout)) if self.rollout else None
            self.points.append((time.time(), self.num_timesteps, mean))
            self.rollout = []

    return Record()


def final_return(episodes: list, steps: int) -> float:
    """The mean return of the episodes that ended in the last 5% of a run of `steps` env steps
    (the last episode's if none did), as ours counts its final training return."""
    tail = [r for t, r in episodes if t >= 0.95 * steps]
    return float(np.mean(tail or [episodes[-1][1]]))


def sb3_worker(config):
    """SB3 PPO on config["seeds"], one after the other in this process: per seed, (time, steps,
    mean return of the episodes finished) per rollout, and the final return."""
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    results = []
    for seed in config["seeds"]:
        kwargs = dict(SB3_ZOO[config["env_id"]])
        env = make_vec_env(config["env_id"], n_envs=kwargs.pop("n_envs"), seed=seed)
        model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
        record = episode_recorder()
        t0 = time.perf_counter()
        model.learn(total_timesteps=config["steps"], callback=record)
        results.append({"points": record.points, "learn_s": time.perf_counter() - t0,
                        "final": final_return(record.episodes, config["steps"])})
    return {"seeds": results}


def rejax_worker(config):
    """All seeds of rejax PPO in one process: pmap over the cores x vmap over seeds."""
    import jax

    jax.config.update("jax_num_cpu_devices", REJAX_DEVICES)
    import gymnax
    from rejax import PPO
    from rejax.evaluate import evaluate

    def eval_callback(algo, ts, rng):
        return evaluate(algo.make_act(ts), rng, algo.env, algo.env_params, REJAX_EVAL_EPISODES,
                        algo.env_params.max_steps_in_episode)

    env, env_params = gymnax.make(config["env_id"])
    settings = REJAX[config["env_id"]]
    batch = settings["num_envs"] * settings["num_steps"]  # an evaluation every whole updates
    eval_freq = batch * max(1, round(config["steps"] / REJAX_EVALS / batch))
    algo = PPO.create(env=FiveValueStep(env), env_params=env_params,
                      total_timesteps=config["steps"], eval_freq=eval_freq,
                      skip_initial_evaluation=True, **settings)
    algo = algo.replace(eval_callback=eval_callback)
    devices = jax.local_devices()[:REJAX_DEVICES]
    keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["seeds"])
    keys = keys.reshape(len(devices), -1, *keys.shape[1:])
    t0 = time.perf_counter()
    compiled = jax.pmap(jax.vmap(algo.train), devices=devices).lower(keys).compile()
    compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    _, (_, returns) = jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - t0
    returns = np.asarray(returns)  # [devices, seeds per device, evaluations, episodes]
    curve = returns.reshape(config["seeds"], returns.shape[2], -1).mean(-1)
    return {"compile_s": compile_s, "run_s": run_s, "returned_at": time.time(),
            "curve": curve.tolist(), "final": curve[:, -1].tolist(),
            "steps": returns.shape[2] * eval_freq}


def worker(config):
    return {"sb3": sb3_worker, "rejax": rejax_worker}[config["peer"]](config)


# ----------------------------------------------------------------------------- running them
def peers_python():
    explicit = os.environ.get("PEERS_PYTHON")
    default = common.ROOT / ".venv-peers" / "bin" / "python"
    return explicit or (str(default) if default.exists() else None)


def installed(python, module):
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


PEER_ENV = {"PYTHONPATH": "", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_rejax(python, env_id, steps, seeds, threshold):
    r = common.run_worker(Path(__file__), {"peer": "rejax", "env_id": env_id, "steps": steps,
                                           "seeds": seeds, "seed": 0},
                          env=PEER_ENV, python=python, as_user=True)
    run_start = r["returned_at"] - r["run_s"]
    curves = np.asarray(r["curve"], np.float64)
    reach = [run_start + (first + 1) / curves.shape[1] * r["run_s"] - r["launched_at"]
             if first >= 0 else None for first in common.held_from(curves, threshold)]
    return {"final": r["final"], "reach_s": reach, "wall_s": r["process_s"], "steps": r["steps"],
            "note": f"one process, compile {r['compile_s']:.1f} s, run {r['run_s']:.1f} s"}


def run_sb3(python, env_id, steps, seeds, threshold):
    start = time.time()
    with ThreadPoolExecutor(max_workers=2) as pool:  # two processes at a time: one per core
        results = [seed for process in pool.map(lambda first: common.run_worker(
            Path(__file__), {"peer": "sb3", "env_id": env_id, "steps": steps,
                             "seeds": list(range(first, seeds, 2))},
            env=PEER_ENV, python=python)["seeds"], range(2)) for seed in process]
    wall = time.time() - start
    reach = []
    for r in results:  # the same sustained rule over its rollouts' mean returns
        first = common.held_from([np.nan if m is None else m for _, _, m in r["points"]], threshold)
        reach.append(r["points"][first][0] - start if first >= 0 else None)
    per_seed = np.median([r["learn_s"] for r in results])
    return {"final": [r["final"] for r in results], "reach_s": reach, "wall_s": wall,
            "note": f"2 processes (one per core) of {seeds // 2} seeds in turn; one seed "
                    f"trains in {per_seed:.0f} s (median)"}


def ours(env_id, quick):
    """Our PPO on env_id, cold and warm: the commands table's processes when run.py ran it."""
    import bench_cli

    name = ENVS[env_id]
    flags = (["--num-seeds", str(QUICK_SEEDS), "--total-timesteps", str(QUICK_BUDGET)] if quick
             else ["--num-seeds", str(SEEDS)])
    last = bench_cli.LAST.get(name)
    if not last or last["cold"]["num_seeds"] != (QUICK_SEEDS if quick else SEEDS):
        last = bench_cli.measure(name, flags)
    return {label: {"final": r["final"][0], "reach_s": r["reach_s"][0], "wall_s": r["process_s"],
                    "note": f"`{r['command']}`, compile {r['compile_s']:.1f} s"
                            + (" (cache)" if r["cached"] else "") + f", run {r['run_s']:.1f} s"}
            for label, r in last.items()}


def run(quick: bool = False) -> str:
    python = peers_python()
    steps, seeds = (QUICK_BUDGET, QUICK_SEEDS) if quick else (BUDGET, SEEDS)
    lines, rows, bars = [], [], {}
    available = []
    for peer, module in [("rejax", "rejax"), ("SB3", "stable_baselines3")]:
        if python is None or not installed(python, module):
            lines.append(f"- skipped {peer}: `{module}` is not installed in the peers environment "
                         "(see benchmarks/requirements-peers.txt).")
        else:
            available.append(peer)
    for env_id, name in ENVS.items():
        threshold = common.COMMANDS[name][2]
        results = {f"ours, {label} cache": r for label, r in ours(env_id, quick).items()}
        for peer in available:
            t0 = time.time()
            try:
                fn = run_rejax if peer == "rejax" else run_sb3
                results[peer] = fn(python, env_id, steps, seeds, threshold)
            except RuntimeError as e:
                lines.append(f"- {peer} on {env_id} failed: {str(e).strip().splitlines()[-1]}")
            print(f"  peers {peer} {env_id}: {time.time() - t0:.0f} s", flush=True)
        base = {label: common.solve_time(results[f"ours, {label} cache"]["reach_s"])[0]
                for label in ("cold", "warm")}
        for label, r in results.items():
            final = np.asarray(r["final"], dtype=np.float64)
            solve_s, reached = common.solve_time(r["reach_s"])
            median = np.median([t if t is not None else np.inf for t in r["reach_s"]])
            ratios = [f"{solve_s / base[k]:.1f}x" if solve_s and base[k] else "n/a"
                      for k in ("cold", "warm")]
            rows.append([label, env_id, len(final), f"{r.get('steps', steps):,}",
                         f"{threshold:g}",
                         common.with_ci(final, spec=".1f"), f"{final.min():.1f}",
                         f"{median:.1f}" if np.isfinite(median) else "not reached",
                         f"{solve_s:.1f}" if solve_s else f"{reached}/{len(final)} reached",
                         *ratios, f"{r['wall_s']:.1f}", r["note"]])
            bars[(env_id, label)] = (solve_s, r["wall_s"], reached, len(final))
    headers = ["implementation", "env", "seeds", "steps/seed", "threshold",
               "final return, mean [95% CI]", "worst seed", "median seed reached it by (s)",
               "every seed reached it by (s)", "every seed: vs ours cold",
               "every seed: vs ours warm", "wall s (all seeds)", "how it ran"]
    text = [f"## Reference implementations: PPO, {seeds} seeds each, {steps:,} steps per seed",
            "Each implementation's seeds use the whole machine, 2 cores: ours and rejax one "
            "process (pmap over the cores x vmap over the seeds), SB3 two processes (one torch "
            "thread each) training their seeds in turn. Reached by: seconds from the launch of "
            "the first process until a seed's score held the threshold (common.held_from; the "
            "median seed, and every seed), so these compare whole-machine times to solve all "
            "seeds. "
            "Scores: ours, the mean return of the episodes finished in an update; SB3, in a "
            "rollout; rejax, its own evaluation (16 episodes of the stochastic policy at 20 "
            "points of the run; 15 on Pendulum-v1, whose updates of 10,000 steps set the "
            "spacing). Final return: the mean episode return over the last 5% of the "
            "budget (rejax: its last evaluation). Settings: ours, the defaults; rejax, its tuned "
            "gymnax configuration (configs/gymnax in its repository); SB3, RL-Zoo's tuned "
            "hyperparameters, its linear schedules included. Ratios: every-seed time over ours "
            "(cold or warm cache). rejax on Pendulum-v1: its PPO has one `done` and never "
            "bootstraps through a time limit (GAE multiplies by 1 - done), the semantics of "
            "gymnax before 1.0 that the 5-value step we hand it reproduces, so the wrapper does "
            "not change what it computes; its tuned pendulum.yaml is a 150k-step configuration "
            "with 10,000-step batches (15 updates; 30 in this budget), which is what its row "
            "measures."]
    if rows:
        text.append(common.md_table(headers, rows))
        plot = plot_bars(bars)
        text.append(f"![time to solve, ours against the peers]({plot.name})")
    return "\n\n".join(text + (["\n".join(lines)] if lines else []))


def plot_bars(bars: dict) -> Path:
    """Seconds until every seed reached the threshold, per environment and implementation; a
    hatched bar is the whole run's time where not every seed reached it."""
    envs = list(dict.fromkeys(env for env, _ in bars))
    labels = list(dict.fromkeys(label for _, label in bars))
    fig, (ax,) = common.new_figure(7, 4)
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        for j, env_id in enumerate(envs):
            if (env_id, label) not in bars:
                continue
            solve_s, wall_s, reached, seeds = bars[(env_id, label)]
            x = j + (i - (len(labels) - 1) / 2) * width
            ax.bar(x, solve_s or wall_s, width, color=f"C{i}", hatch=None if solve_s else "//",
                   label=label if j == 0 else None, edgecolor="black", linewidth=0.5)
            ax.text(x, solve_s or wall_s, f"{solve_s:.0f}" if solve_s else f"{reached}/{seeds}",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(envs)), envs)
    ax.set_yscale("log")
    heights = [solve_s or wall_s for solve_s, wall_s, _, _ in bars.values()]
    ax.set_ylim(min(heights) / 2, max(heights) * 8)  # headroom for the legend
    ticks = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
             if min(heights) / 2 <= t <= max(heights) * 2]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylabel("seconds until every seed reached the threshold")
    ax.set_title("PPO, time to solve all seeds (hatched: not all reached; whole run shown)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncols=len(labels))
    return common.save_figure(fig, "peers_time_to_solve.png")


if __name__ == "__main__":
    if not common.worker_entry(worker):
        print(run(quick="--quick" in sys.argv))
