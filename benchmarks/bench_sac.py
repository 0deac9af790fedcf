"""SAC (algos/sac.py) on Pendulum-v1 beside ppo.py, and beside rejax's SAC (pure JAX) at the same
budget, update ratio and network sizes.

    python benchmarks/bench_sac.py [--quick]    # writes results/SAC.md (about 15 minutes, 2 cores)
    python benchmarks/run.py --only sac         # the same, through run.py

(a) `sac.py` and `ppo.py` on Pendulum-v1 as typed, 16 seeds each on a held-out seed base (--seed
5000), one process each with an empty compilation cache (common.run_command): the env steps and
the seconds from launch at which every seed's training return held -200 (common.held_from), the
final training return, and the greedy and sampled evaluations (64 episodes per seed).
(b) sac.py beside rejax 0.1.3's SAC, 4 seeds of 20,000 steps each, whole-process times (a warm-up
run each, then 3 runs each alternating ours and rejax; median), each process with an empty
compilation cache. rejax runs in its own environment, .venv-peers (or PEERS_PYTHON; see
benchmarks/peers.py), made with
    python3.12 -m venv .venv-peers && .venv-peers/bin/pip install -r requirements.txt rejax==0.1.3
and is skipped with a line saying so where it is not installed. CleanRL's sac_continuous_action.py
needs torch (PyPI's build is a ~6 GB CUDA download): not run here.
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
from peers import PEER_ENV, installed, peers_python  # noqa: E402

BASE, THRESHOLD = 5000, -200.0  # the held-out seed base; Pendulum-v1 counts -200 as solved
SEEDS_A, SEEDS_B, REPEATS = 16, 4, 3
EVAL_EPISODES = 64
STEPS_B = 20_000  # sac.py's Pendulum-v1 preset
QUICK_STEPS = {"sac": 2_000, "ppo": 8_192}  # ppo.py's Pendulum-v1 batch is 16 x 256 = 4,096 steps
QUICK_SEEDS, QUICK_EVAL_EPISODES = 2, 4
REJAX_DEVICES = 2  # as peers.py: pmap over the 2 cores x vmap over the seeds
# sac.py's Pendulum-v1 preset (algos/sac.py PRESETS) in rejax's terms: 1 env, 1 gradient step per
# env step (num_epochs 1 per iteration of num_envs steps), batch 256, training from step 1,000,
# Adam 1e-3 for actor, critics and temperature, gamma 0.99, tau 0.005 (polyak 0.995, every step),
# two hidden layers of 64 (relu), a buffer of the whole run (20,000), alpha from 1 (log 0, rejax's
# fixed start) toward -|A| (rejax's fixed target), no gradient clipping (rejax's default inf).
REJAX = dict(num_envs=1, num_epochs=1, batch_size=256, fill_buffer=1_000, learning_rate=1e-3,
             gamma=0.99, polyak=0.995, target_update_freq=1, hidden_layer_sizes=(64, 64),
             agent_kwargs={"activation": "relu"}, buffer_size=STEPS_B)


def rejax_settings(steps: int) -> dict:
    """REJAX for a run of `steps` env steps: a buffer of the whole run."""
    return {**REJAX, "buffer_size": steps, "fill_buffer": min(REJAX["fill_buffer"], steps // 2)}


# ----------------------------------------------------------------------------- rejax worker
def rejax_worker(config: dict) -> dict:
    """All seeds of rejax SAC in one process (the peers' environment): its train() vmapped over
    the seeds and pmapped over the cores, one evaluation at the end (its own: the stochastic
    policy; and the mean action's, for the greedy column), config["episodes"] episodes each."""
    import jax

    jax.config.update("jax_num_cpu_devices", REJAX_DEVICES)
    import gymnax
    import jax.numpy as jnp
    from rejax import get_algo
    from rejax.evaluate import evaluate

    class FiveValueStep:
        """gymnax 1.0 env seen through the pre-1.0 5-value step rejax 0.1 expects."""

        def __init__(self, env):
            self.env = env

        def step(self, key, state, action, params=None):
            obs, state, reward, terminated, truncated, info = self.env.step(
                key, state, action, params)
            return obs, state, reward, terminated | truncated, info

        def __getattr__(self, name):  # only reached for what the wrapper does not define
            if name == "env":
                raise AttributeError(name)
            return getattr(self.env, name)

    def greedy_act(algo, ts):  # the squashed mean action (rejax's act samples)
        def act(obs, rng):
            dist = algo.actor.apply(ts.actor_ts.params, obs[None], method="_action_dist")
            actor = algo.actor
            return jnp.squeeze(actor.action_loc + jnp.tanh(dist.mean()) * actor.action_scale)
        return act

    def eval_callback(algo, ts, rng):
        steps = algo.env_params.max_steps_in_episode
        run = lambda act: evaluate(act, rng, algo.env, algo.env_params, config["episodes"],
                                   steps)[1]
        return run(algo.make_act(ts)), run(greedy_act(algo, ts))

    env, env_params = gymnax.make("Pendulum-v1")
    settings = rejax_settings(config["steps"])
    algo = get_algo("sac").create(env=FiveValueStep(env), env_params=env_params,
                                  total_timesteps=config["steps"], eval_freq=config["steps"],
                                  skip_initial_evaluation=True, **settings)
    algo = algo.replace(eval_callback=eval_callback)
    devices = jax.local_devices()[:REJAX_DEVICES]
    keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["seeds"])
    keys = keys.reshape(len(devices), -1, *keys.shape[1:])
    t0 = time.perf_counter()
    compiled = jax.pmap(jax.vmap(algo.train), devices=devices).lower(keys).compile()
    compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
    _, (sampled, greedy) = jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - t0
    # [devices, seeds per device, evaluations (1), episodes] -> per seed, the mean return
    per_seed = lambda x: np.asarray(x).reshape(config["seeds"], -1).mean(-1).tolist()
    return {"compile_s": compile_s, "run_s": run_s, "sampled": per_seed(sampled),
            "greedy": per_seed(greedy)}


# ----------------------------------------------------------------------------- running them
def ours(name: str, flags: list[str]) -> dict:
    """`python algos/<name>.py FLAGS --no-track` in its own process, an empty compilation
    cache."""
    with tempfile.TemporaryDirectory() as cache:
        return common.run_command(name, flags, THRESHOLD, cache)


def row_a(name: str, r: dict) -> list:
    final = np.asarray(r["final"][0], np.float64)
    greedy = np.asarray(r["evals"]["greedy"][0], np.float64)
    sampled = np.asarray(r["evals"]["sampled"][0], np.float64)
    solve_s, reached = common.solve_time(r["reach_s"][0])
    fractions = r["reach_fraction"][0]
    steps = (f"{max(fractions) * r['total_timesteps']:,.0f}" if solve_s is not None
             else f"{reached}/{len(final)} held it")
    return [f"`{r['command']}`", f"{r['num_seeds']} x {r['total_timesteps']:,}", steps,
            f"{solve_s:.0f}" if solve_s is not None else f"{reached}/{len(final)} held it",
            f"{r['process_s']:.0f} ({r['compile_s']:.0f} + {r['run_s']:.0f})",
            common.with_ci(final, spec=".1f"), f"{final.min():.1f}",
            common.with_ci(greedy, spec=".1f"), common.with_ci(sampled, spec=".1f"),
            f"{int((greedy >= THRESHOLD).sum())}/{len(greedy)}"]


def part_a(quick: bool) -> list[str]:
    rows, commands = [], []
    for name in ("sac", "ppo"):
        flags = ["--env-id", "Pendulum-v1", "--seed", str(BASE), "--eval-episodes",
                 str(QUICK_EVAL_EPISODES if quick else EVAL_EPISODES), "--num-seeds",
                 str(QUICK_SEEDS if quick else SEEDS_A)]
        if quick:
            flags += ["--total-timesteps", str(QUICK_STEPS[name])]
        commands.append(f"python algos/{name}.py {' '.join(flags)} --no-track "
                        "--compile-cache-dir EMPTY_TEMP_DIR")
        rows.append(row_a(name, ours(name, flags)))
        print(f"  sac (a) {name}: done", flush=True)
    headers = ["command", "seeds x steps", "env steps per seed until every seed held -200",
               "s from launch until every seed held -200", "whole process s (compile + run)",
               "final training return, mean [95% CI]", "worst seed",
               "evaluation, greedy", "evaluation, sampled", "seeds greedy >= -200"]
    return ["### (a) sac.py beside ppo.py on Pendulum-v1",
            "Commands, each in its own process (run as typed by common.run_command):\n\n"
            + "\n".join(f"    {c}" for c in commands),
            "Held -200: the first update from which the mean training return over a trailing 5% "
            "of the updates stays at or above -200 to the end (common.held_from), the latest "
            "over the seeds; its seconds count from the process's launch, updates taken as "
            "equally long (sac.py's first 1,000 steps, random actions without gradient steps, "
            "are quicker than the rest). Final training return: the mean episode return over "
            "the last 5% of updates, mean over the seeds [95% bootstrap CI]. Evaluation: "
            f"{QUICK_EVAL_EPISODES if quick else EVAL_EPISODES} fresh episodes per seed, by the "
            "mean action (greedy) and by sampled ones; mean over the seeds [95% CI].",
            common.md_table(headers, rows)]


def part_b(quick: bool) -> list[str]:
    seeds, steps = (QUICK_SEEDS, QUICK_STEPS["sac"]) if quick else (SEEDS_B, STEPS_B)
    episodes = QUICK_EVAL_EPISODES if quick else EVAL_EPISODES
    repeats = 1 if quick else REPEATS
    flags = ["--seed", str(BASE), "--num-seeds", str(seeds), "--eval-episodes", str(episodes)]
    if quick:
        flags += ["--total-timesteps", str(steps)]
    command = f"python algos/sac.py {' '.join(flags)} --no-track --compile-cache-dir EMPTY_TEMP_DIR"
    text = ["### (b) sac.py beside rejax's SAC",
            f"{seeds} seeds x {steps:,} env steps each, 1 gradient step per env step. Ours: "
            f"`{command}` (Pendulum-v1, its preset: 1 env, batch 256, training from step 1,000 "
            "after uniform random actions, Adam 1e-3 for actor, critics and temperature, gamma "
            "0.99, tau 0.005, two hidden layers of 64, a buffer of the whole run, alpha from 1 "
            "toward -|A|), the seeds over the 2 cores (a CPU device each). rejax 0.1.3: "
            "`rejax.get_algo('sac').create(env=..., **settings)` on gymnax's Pendulum-v1 (seen "
            "through the 5-value step rejax 0.1 expects), `algo.train` vmapped over the seeds "
            "and pmapped over the 2 cores, one process, with the same settings: "
            + ", ".join(f"{k}={v}" for k, v in rejax_settings(steps).items())
            + f"; one evaluation at the end of {episodes} episodes. Whole "
            f"process: launch to exit, median of {repeats} runs each after a warm-up run each, "
            "alternating ours and rejax, each with an empty compilation cache (both compile "
            "in every process)."]
    python = peers_python()
    if python is None or not installed(python, "rejax"):
        have_rejax = False
        text.append("- skipped rejax: `rejax` is not installed in the peers environment "
                    "(.venv-peers or PEERS_PYTHON; see this file's docstring).")
    else:
        have_rejax = True
    config = {"steps": steps, "seeds": seeds, "seed": BASE, "episodes": episodes}
    theirs = lambda: common.run_worker(Path(__file__), config, env=PEER_ENV, python=python,
                                       as_user=True)
    runs = {"ours": [], "rejax": []}
    for i in range(repeats + 1):  # the first of each: the warm-up, not counted
        runs["ours"].append(ours("sac", flags))
        if have_rejax:
            runs["rejax"].append(theirs())
        print(f"  sac (b) round {i}: done", flush=True)
    rows = []
    for label, done in runs.items():
        if not done:
            continue
        timed, last = done[1:], done[-1]
        wall = [r["process_s"] for r in timed]
        times = (f"{np.median(wall):.1f} ({', '.join(f'{w:.1f}' for w in wall)}; warm-up "
                 f"{done[0]['process_s']:.1f})")
        split = (f"{np.median([r['compile_s'] for r in timed]):.1f} + "
                 f"{np.median([r['run_s'] for r in timed]):.1f}")
        if label == "ours":
            greedy, sampled = last["evals"]["greedy"][0], last["evals"]["sampled"][0]
            final = common.with_ci(last["final"][0], spec=".1f")
        else:
            greedy, sampled, final = last["greedy"], last["sampled"], "not recorded"
        rows.append([label, times, split, common.with_ci(sampled, spec=".1f"),
                     common.with_ci(greedy, spec=".1f"),
                     f"{int((np.asarray(greedy) >= THRESHOLD).sum())}/{len(greedy)}", final])
    text += [common.md_table(
        ["implementation", "whole process s, median (runs; warm-up)", "compile + run s (median)",
         "evaluation, sampled", "evaluation, greedy", "seeds greedy >= -200",
         "final training return, mean [95% CI]"], rows),
        "Returns: of the last timed run of each; mean over the seeds [95% bootstrap CI]. rejax's "
        "evaluation, sampled: its own (`make_act`, which samples the policy), at the end of "
        "training; greedy: the same evaluation of the squashed mean action, added by this "
        "driver (rejax has no greedy act). rejax records no training return. Settings that "
        "do not match: rejax's first 1,000 steps act by its initial policy, not uniformly at "
        "random; its critic target stops at every episode end (one `done`: Pendulum-v1's "
        "200-step time limit is taken as terminal), ours bootstraps through the time limit; "
        "its policy's log std is clipped to [-10, 2], ours squashed by tanh into [-5, 2]; its "
        "minibatches are drawn without replacement, ours with; its target entropy (-|A|) and "
        "initial temperature (1) are fixed, and equal ours. CleanRL's "
        "sac_continuous_action.py is not run here: it needs torch, whose PyPI build is a ~6 GB "
        "CUDA download."]
    return text


def run(quick: bool = False) -> str:
    load_start = common.load_average()
    text = [*part_a(quick), *part_b(quick)]
    return "\n\n".join([
        "## SAC: sac.py beside ppo.py and rejax's SAC on Pendulum-v1",
        "benchmarks/bench_sac.py (`python benchmarks/bench_sac.py" + (" --quick" if quick else "")
        + "`, or `python benchmarks/run.py --only sac`). Load average (1, 5, 15 min) at the "
        f"start: {load_start}" + (". Quick: tiny budgets, the pipeline, not the algorithms."
                                  if quick else "."),
        *text, f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__":
    if not common.worker_entry(rejax_worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true",
                            help="2 seeds x 2,000 steps (ppo.py: 8,192): the pipeline")
        report = common.machine_header() + "\n\n" + run(parser.parse_args().quick)
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        (common.RESULTS / "SAC.md").write_text(report + "\n")
        print(report)
