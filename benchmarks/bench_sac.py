"""SAC (algos/sac.py) on Pendulum-v1 beside ppo.py, beside rejax's SAC (pure JAX) at the same
budget, update ratio and network sizes, and beside sbx's (Stable-Baselines in JAX) at its sizes.

    python benchmarks/bench_sac.py [--quick]    # writes results/SAC.md (about 40 minutes, 2 cores)
    python benchmarks/run.py --only sac         # the same, through run.py

(a) `sac.py` and `ppo.py` on Pendulum-v1 as typed, 16 seeds each on a held-out seed base (--seed
5000), one process each with an empty compilation cache (common.run_command): the env steps and
the seconds from launch at which every seed's training return held -200 (common.held_from), the
final training return, and the greedy and sampled evaluations (64 episodes per seed).
(b) sac.py beside rejax 0.1.3's SAC, 4 seeds of 20,000 steps each, whole-process times (a warm-up
run each, then 3 runs each alternating ours and rejax; median), each process with an empty
compilation cache; rejax's evaluation and its replay buffer's sampler timed apart.
(c) sac.py beside sbx 0.28's SAC at the RL Zoo's Pendulum-v1 settings (hidden 256, batch 256, one
gradient step a step, learning rate 1e-3): ours a seed a process and 4 seeds in one, sbx a process
a seed (one at a time, and two at a time on a core each).
The peers run in their own environment, .venv-peers (or PEERS_PYTHON), made as
benchmarks/requirements-peers.txt says; a peer not installed there is skipped with a line saying
so. CleanRL's torch sac_continuous_action.py is not run here.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import peers  # noqa: E402

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


# sbx (Stable-Baselines in JAX) at the RL Zoo's Pendulum-v1 settings (rl-baselines3-zoo
# hyperparams/sac.yml: 20,000 steps, MlpPolicy, learning rate 1e-3), the rest sbx's defaults: two
# hidden layers of 256, batch 256, one gradient step per env step from step 100, a buffer of 1e6,
# tau 0.005, gamma 0.99, the temperature learnt from 1 toward -|A|. Ours at the same sizes:
SBX_ZOO = dict(learning_rate=1e-3)
SBX_SIZES = ["--hidden-size", "256", "--learning-starts", "100"]  # beside the Pendulum-v1 preset
SEEDS_C = 4  # sbx: a process a seed; ours: a seed a process, and the 4 in one process


def rejax_settings(steps: int) -> dict:
    """REJAX for a run of `steps` env steps: a buffer of the whole run."""
    return {**REJAX, "buffer_size": steps, "fill_buffer": min(REJAX["fill_buffer"], steps // 2)}


# ----------------------------------------------------------------------------- peers' workers
def rejax_worker(config: dict) -> dict:
    """All seeds of rejax's SAC (config["algo"], default "sac"; "td3": its TD3, bench_td3.py) in
    one process (the peers' environment): its train() vmapped over the seeds and pmapped over the
    cores; then, timed apart, one evaluation of the final policy (its own: SAC's stochastic
    policy, TD3's deterministic one; and, for the greedy column, SAC's mean action, TD3's own),
    config["episodes"] episodes each, and (config["time_sampler"], default on) its replay
    buffer's sampler alone, as often as the run calls it, beside a uniform draw of the same size.
    config["env"] (default Pendulum-v1): a gymnax id, or brax/<name> through rejax's own Brax
    wrapper (rejax.compat, positional backend) whose `done` is Brax's, the task's end or the
    1000-step limit: under gymnax 1.0, whose step also asks is_truncated (state.time, which a
    Brax state lacks), that check answers False, so the one `done` of the 5-value step is the
    transitions' of the gymnax rejax 0.1 was written for. config["settings"]: rejax's, else
    rejax_settings(steps)."""
    import jax

    jax.config.update("jax_num_cpu_devices", REJAX_DEVICES)
    import gymnax
    import jax.numpy as jnp
    from rejax import get_algo
    from rejax.buffers import ReplayBuffer
    from rejax.evaluate import evaluate

    def greedy_act(algo, ts):  # SAC's squashed mean action (its act samples); TD3's own act
        if config.get("algo", "sac") != "sac":
            return algo.make_act(ts)

        def act(obs, rng):
            dist = algo.actor.apply(ts.actor_ts.params, obs[None], method="_action_dist")
            actor = algo.actor
            return jnp.squeeze(actor.action_loc + jnp.tanh(dist.mean()) * actor.action_scale)
        return act

    def evaluation(ts, rng):
        steps = algo.env_params.max_steps_in_episode
        run = lambda act: evaluate(act, rng, algo.env, algo.env_params, config["episodes"],
                                   steps)[1]
        return run(algo.make_act(ts)), run(greedy_act(algo, ts))

    def timed(fn, *args):
        """(compile s, run s, result) of pmap(vmap(fn)) over the seeds' layout."""
        t0 = time.perf_counter()
        compiled = jax.pmap(jax.vmap(fn), devices=devices).lower(*args).compile()
        compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
        result = jax.block_until_ready(compiled(*args))
        return compile_s, time.perf_counter() - t0, result

    env_id = config.get("env", "Pendulum-v1")
    if env_id.startswith("brax/"):
        from rejax.compat import create
        env, env_params = create(env_id, backend="positional")
        env.is_truncated = lambda state, params: jnp.zeros((), bool)  # Brax's done has the limit
    else:
        env, env_params = gymnax.make(env_id)
    settings = config.get("settings") or rejax_settings(config["steps"])
    if "hidden_layer_sizes" in settings:  # (JSON's list; rejax's TD3 fixes its sizes at 64, 64)
        settings["hidden_layer_sizes"] = tuple(settings["hidden_layer_sizes"])
    algo = get_algo(config.get("algo", "sac")).create(
        env=peers.FiveValueStep(env), env_params=env_params, total_timesteps=config["steps"],
        eval_freq=config["steps"], skip_initial_evaluation=True, **settings)
    algo = algo.replace(eval_callback=lambda algo, ts, rng: jnp.zeros(()))  # evaluated apart
    devices = jax.local_devices()[:REJAX_DEVICES]
    keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["seeds"])
    keys = keys.reshape(len(devices), -1, *keys.shape[1:])
    compile_s, run_s, (ts, _) = timed(algo.train, keys)
    eval_compile_s, eval_s, (sampled, greedy) = timed(evaluation, ts, keys)
    # [devices, seeds per device, episodes] -> per seed, the mean return
    per_seed = lambda x: np.asarray(x).reshape(config["seeds"], -1).mean(-1).tolist()
    result = {"compile_s": compile_s, "run_s": run_s, "eval_compile_s": eval_compile_s,
              "eval_s": eval_s, "sampled": per_seed(sampled), "greedy": per_seed(greedy)}
    if not config.get("time_sampler", True):
        return result

    # Its sampler: a draw without replacement weighted by p over every slot of the buffer, once a
    # gradient step, and the run computes one every env step (a cond that vmap makes a select).
    buffer = ReplayBuffer.empty(settings["buffer_size"], env.observation_space(env_params),
                                env.action_space(env_params)).replace(full=True)
    draws = config["steps"] // settings["num_envs"] * settings["num_epochs"]

    def draw_loop(sample):
        def loop(key):
            def body(key, _):
                key, sub = jax.random.split(key)
                return key, sum(leaf.sum() for leaf in jax.tree.leaves(sample(sub)))
            return jax.lax.scan(body, key, None, length=draws)[1].sum()
        return loop

    batch = settings["batch_size"]
    rejax_draws = draw_loop(lambda key: buffer.sample(batch, key))
    uniform = lambda key: jax.tree.map(  # noqa: E731
        lambda a: a[jax.random.randint(key, (batch,), 0, buffer.size)], buffer.data)
    sampler_s = timed(rejax_draws, keys)[1]
    uniform_s = timed(draw_loop(uniform), keys)[1]
    return {**result, "sampler_s": sampler_s, "uniform_s": uniform_s, "draws": draws}


def sbx_worker(config: dict) -> dict:
    """One seed of sbx's SAC (the peers' environment) on gymnasium's Pendulum-v1 at the Zoo's
    settings, pinned to one core where config["core"] says; then, timed apart, its final policy
    on config["episodes"] episodes, by the mean action and by sampled ones."""
    if config["core"] is not None:  # before jax starts its threads: they inherit it
        os.sched_setaffinity(0, {config["core"]})
    from sbx import SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    t0 = time.perf_counter()
    model = SAC("MlpPolicy", make_vec_env("Pendulum-v1", n_envs=1, seed=config["seed"]),
                seed=config["seed"], verbose=0, **SBX_ZOO)
    record = peers.episode_recorder()
    model.learn(total_timesteps=config["steps"], callback=record)
    learn_s, t0 = time.perf_counter() - t0, time.perf_counter()
    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=config["seed"] + 10**6)
    evals = {label: float(np.mean(evaluate_policy(
        model, eval_env, n_eval_episodes=config["episodes"], deterministic=greedy,
        return_episode_rewards=True)[0])) for label, greedy in (("greedy", True),
                                                                 ("sampled", False))}
    return {"learn_s": learn_s, "eval_s": time.perf_counter() - t0,
            "final": peers.final_return(record.episodes, config["steps"]), **evals}


def worker(config: dict) -> dict:
    return {"rejax": rejax_worker, "sbx": sbx_worker}[config["peer"]](config)


# ----------------------------------------------------------------------------- running them
def ours(name: str, flags: list[str], threshold: float = THRESHOLD,
         timeout: float = 3600) -> dict:
    """`python algos/<name>.py FLAGS --no-track` in its own process, an empty compilation
    cache; each seed's time to `threshold` (common.run_command), killed after `timeout` s."""
    with tempfile.TemporaryDirectory() as cache:
        return common.run_command(name, flags, threshold, cache, timeout)


def row_a(name: str, r: dict, threshold: float = THRESHOLD) -> list:
    """A row of (a)'s table (and of TD3.md's and DQN.md's) from ours' result."""
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
            f"{int((greedy >= threshold).sum())}/{len(greedy)}"]


def beside_rejax(name: str, flags: list[str], config: dict, repeats: int,
                 threshold: float = THRESHOLD) -> tuple[list[str], list[list]]:
    """`python algos/<name>.py FLAGS` and rejax's worker on `config` (TD3.md (b), DQN.md (b)),
    alternating, each with an empty compilation cache: a warm-up run each, then `repeats` runs
    each. -> (a line saying rejax was skipped, if it is not installed; the table's rows: name,
    whole process s (median; runs; warm-up), training compile + run s (medians), the greedy
    evaluation of the last run [95% CI], its seeds at the threshold)."""
    python = peers.peers_python()
    skipped = []
    if python is None or not peers.installed(python, "rejax"):
        skipped.append("- skipped rejax: `rejax` is not installed in the peers environment "
                       "(.venv-peers or PEERS_PYTHON; see benchmarks/requirements-peers.txt).")
    runs = {f"{name}.py": [], "rejax": []}
    for i in range(repeats + 1):  # the first of each: the warm-up, not counted
        runs[f"{name}.py"].append(ours(name, flags, threshold))
        if not skipped:
            runs["rejax"].append(common.run_worker(Path(__file__), config, env=peers.PEER_ENV,
                                                   python=python, as_user=True))
        print(f"  {name} beside rejax, round {i}: done", flush=True)
    rows = []
    for label, done in runs.items():
        if not done:
            continue
        greedy = done[-1]["greedy"] if label == "rejax" else done[-1]["evals"]["greedy"][0]
        rows.append([label, *timing_cells(done), common.with_ci(greedy, spec=".1f"),
                     f"{int((np.asarray(greedy) >= threshold).sum())}/{len(greedy)}"])
    return skipped, rows


def timing_cells(done: list[dict]) -> list[str]:
    """Of alternated runs (the first a warm-up, not counted): the whole process's median with
    each timed run and the warm-up, and the medians of compile and run seconds."""
    timed = done[1:]
    median = lambda key: np.median([r[key] for r in timed])  # noqa: E731
    wall = ", ".join(f"{r['process_s']:.1f}" for r in timed)
    return [f"{median('process_s'):.1f} ({wall}; warm-up {done[0]['process_s']:.1f})",
            f"{median('compile_s'):.1f} + {median('run_s'):.1f}"]


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
            "equally long (they are: sac.py computes a gradient step during its first 1,000 "
            "steps too and discards it, vmap making its cond a select). Final training return: "
            "the mean episode return over the last 5% of updates, mean over the seeds [95% "
            "bootstrap CI]. Evaluation: "
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
            + f"; one evaluation of {episodes} episodes after training, timed apart. Whole "
            f"process: launch to exit, median of {repeats} runs each after a warm-up run each, "
            "alternating ours and rejax, each with an empty compilation cache (both compile "
            "in every process)."]
    python = peers.peers_python()
    if python is None or not peers.installed(python, "rejax"):
        have_rejax = False
        text.append("- skipped rejax: `rejax` is not installed in the peers environment "
                    "(.venv-peers or PEERS_PYTHON; see benchmarks/requirements-peers.txt).")
    else:
        have_rejax = True
    config = {"peer": "rejax", "steps": steps, "seeds": seeds, "seed": BASE,
              "episodes": episodes, "time_sampler": False}
    # The timed processes train and evaluate only; its sampler is timed in a process of its own
    # (timed in the same process, it added its seconds to rejax's whole-process time).
    theirs = lambda **extra: common.run_worker(  # noqa: E731
        Path(__file__), {**config, **extra}, env=peers.PEER_ENV, python=python, as_user=True)
    runs = {"ours": [], "rejax": []}
    for i in range(repeats + 1):  # the first of each: the warm-up, not counted
        runs["ours"].append(ours("sac", flags))
        if have_rejax:
            runs["rejax"].append(theirs())
        print(f"  sac (b) round {i}: done", flush=True)
    sampling = theirs(time_sampler=True) if have_rejax else None
    rows, sampler = [], ""
    for label, done in runs.items():
        if not done:
            continue
        timed, last = done[1:], done[-1]
        wall = [r["process_s"] for r in timed]
        times = (f"{np.median(wall):.1f} ({', '.join(f'{w:.1f}' for w in wall)}; warm-up "
                 f"{done[0]['process_s']:.1f})")
        median = lambda key: np.median([r[key] for r in timed])  # noqa: E731
        split = f"{median('compile_s'):.1f} + {median('run_s'):.1f}"
        if label == "ours":
            greedy, sampled = last["evals"]["greedy"][0], last["evals"]["sampled"][0]
            final, evaluation = common.with_ci(last["final"][0], spec=".1f"), "in the process"
        else:
            greedy, sampled, final = last["greedy"], last["sampled"], "not recorded"
            evaluation = f"{median('eval_compile_s'):.1f} + {median('eval_s'):.1f}"
            sampler = (f"rejax's sampler alone, {sampling['draws']:,} draws a seed on the same "
                       f"layout, in a process of its own: {sampling['sampler_s']:.1f} s, beside "
                       f"its {median('run_s'):.1f} s run; a uniform draw of the same batch with "
                       f"replacement (ours): {sampling['uniform_s']:.1f} s. ")
        rows.append([label, times, split, evaluation, common.with_ci(sampled, spec=".1f"),
                     common.with_ci(greedy, spec=".1f"),
                     f"{int((np.asarray(greedy) >= THRESHOLD).sum())}/{len(greedy)}", final])
    text += [common.md_table(
        ["implementation", "whole process s, median (runs; warm-up)",
         "training: compile + run s (median)", "evaluation: compile + run s (median)",
         "evaluation, sampled", "evaluation, greedy", "seeds greedy >= -200",
         "final training return, mean [95% CI]"], rows),
        "Returns: of the last timed run of each; mean over the seeds [95% bootstrap CI]. rejax's "
        "evaluation, sampled: its own (`make_act`, which samples the policy), compiled and run "
        "after training and timed apart (its training ran with an evaluation callback that "
        "returns 0); greedy: the same evaluation of the squashed mean action, added by this "
        "driver (rejax has no greedy act). Ours evaluates after training inside its process; "
        "its run s is training alone. rejax records no training return. "
        "Why rejax's run is slower: " + sampler + "Its buffer's `sample` draws each batch with "
        "`jax.random.choice(..., replace=False, p=...)` over every slot of the buffer (p zero "
        "on the unfilled ones), a cost that grows with the buffer, at every gradient step; "
        "ours draws uniform indices into the filled slots. Settings that "
        "do not match: rejax's first 1,000 steps act by its initial policy, not uniformly at "
        "random; its critic target stops at every episode end (one `done`: Pendulum-v1's "
        "200-step time limit is taken as terminal), ours bootstraps through the time limit; "
        "its policy's log std is clipped to [-10, 2], ours squashed by tanh into [-5, 2]; its "
        "minibatches are drawn without replacement, ours with; its log-probability leaves out "
        "the log-determinant of the action scale (it is that of the action in [-1, 1]; "
        "Pendulum-v1's torque is in [-2, 2]), so against the same target entropy (-|A| = -1) "
        "its temperature holds the policy's entropy, in the env's units, at -1 + log 2, ours "
        "at -1; both start the temperature at 1."]
    return text


def part_c(quick: bool) -> list[str]:
    steps = QUICK_STEPS["sac"] if quick else STEPS_B
    seeds, repeats = (QUICK_SEEDS, 1) if quick else (SEEDS_C, REPEATS)
    episodes = QUICK_EVAL_EPISODES if quick else EVAL_EPISODES
    flags = ["--env-id", "Pendulum-v1", *SBX_SIZES, "--eval-episodes", str(episodes)]
    if quick:
        flags += ["--total-timesteps", str(steps)]
    seed_flags = lambda seed, n: ["--seed", str(seed), "--num-seeds", str(n)]  # noqa: E731
    text = ["### (c) sac.py beside sbx's SAC at sbx's sizes",
            f"{steps:,} env steps a seed on Pendulum-v1, two hidden layers of 256, batch 256, one "
            "gradient step per env step from step 100, learning rate 1e-3 (the RL Zoo's "
            "Pendulum-v1 setting; the rest sbx's defaults, which match ours: tau 0.005, gamma "
            "0.99, the temperature learnt from 1 toward -|A|). Ours: `python algos/sac.py "
            + " ".join(flags) + " --seed S --num-seeds N --no-track` (an empty compilation "
            f"cache each), {repeats} processes of 1 seed (S = {BASE}, {BASE + 1}, ...) one "
            f"after the other, and {seeds} seeds in one process. sbx 0.28 (`sbx.SAC('MlpPolicy', "
            "make_vec_env('Pendulum-v1', n_envs=1, seed=S), learning_rate=1e-3, seed=S)`, "
            "gymnasium's Pendulum-v1: the same dynamics), a process a seed: "
            f"{repeats} one after the other (JAX's threads on both cores), and {seeds} two at "
            "a time, each pinned to a core. Per seed: the whole machine's seconds for the "
            "row's seeds over their number. Evaluation: the final policy on "
            f"{episodes} fresh episodes, by the mean action (greedy) and sampled; mean over "
            "the row's seeds [95% CI]."]
    python = peers.peers_python()
    if python is None or not peers.installed(python, "sbx"):
        return text + ["- skipped sbx: `sbx` is not installed in the peers environment "
                       "(.venv-peers or PEERS_PYTHON; see benchmarks/requirements-peers.txt)."]
    sbx = lambda seed, core: common.run_worker(  # noqa: E731
        Path(__file__), {"peer": "sbx", "steps": steps, "seed": seed, "core": core,
                         "episodes": episodes}, env=peers.PEER_ENV, python=python)
    singles = {"ours": [], "sbx": []}
    for i in range(repeats):  # taking turns
        singles["ours"].append(ours("sac", [*flags, *seed_flags(BASE + i, 1)]))
        singles["sbx"].append(sbx(BASE + i, None))
        print(f"  sac (c) round {i}: done", flush=True)
    together = ours("sac", [*flags, *seed_flags(BASE, seeds)])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2) as pool:  # one process per core
        paired = list(pool.map(lambda i: sbx(BASE + i, i % 2), range(seeds)))
    paired_s = time.perf_counter() - t0
    print("  sac (c) together: done", flush=True)

    def ours_row(layout, runs, per_seed):
        greedy = [r["evals"]["greedy"][0][i] for r in runs for i in range(r["num_seeds"])]
        sampled = [r["evals"]["sampled"][0][i] for r in runs for i in range(r["num_seeds"])]
        final = [f for r in runs for f in r["final"][0]]
        train = np.median([r["compile_s"] + r["run_s"] for r in runs])
        return ["ours", layout, len(final), ", ".join(f"{r['process_s']:.1f}" for r in runs),
                f"{per_seed:.1f}", f"{train:.1f}", "in the process",
                common.with_ci(greedy, spec=".1f"), common.with_ci(sampled, spec=".1f"),
                common.with_ci(final, spec=".1f")]

    def sbx_row(layout, runs, per_seed):
        pick = lambda key: [r[key] for r in runs]  # noqa: E731
        return ["sbx", layout, len(runs), ", ".join(f"{w:.1f}" for w in pick("process_s")),
                f"{per_seed:.1f}", f"{np.median(pick('learn_s')):.1f}",
                f"{np.median(pick('eval_s')):.1f}", common.with_ci(pick("greedy"), spec=".1f"),
                common.with_ci(pick("sampled"), spec=".1f"),
                common.with_ci(pick("final"), spec=".1f")]

    one_at_a_time = "a process a seed, one at a time"
    rows = [ours_row(one_at_a_time, singles["ours"],
                     np.median([r["process_s"] for r in singles["ours"]])),
            ours_row(f"{seeds} seeds in one process", [together], together["process_s"] / seeds),
            sbx_row(one_at_a_time, singles["sbx"],
                    np.median([r["process_s"] for r in singles["sbx"]])),
            sbx_row("a process a seed, two at a time (a core each)", paired, paired_s / seeds)]
    return text + [common.md_table(
        ["implementation", "layout", "seeds", "whole process s (each)", "per seed s",
         "training s, median (ours: compile + run; sbx: learn(), its compiles inside)",
         "evaluation s, median", "evaluation, greedy", "evaluation, sampled",
         "final training return"], rows),
        "Per seed: one at a time, the median process; together, the wall time of all the row's "
        "seeds over their number. Final training return: the mean return of the episodes that "
        "ended in the last 5% of the steps (sbx: its Monitor's episodes), mean over the seeds "
        "[95% CI]. sbx steps gymnasium's env in Python and calls its jitted networks once a "
        "step from Python; ours runs the whole run, env included, as one XLA program."]


def run(quick: bool = False) -> str:
    load_start = common.load_average()
    text = [*part_a(quick), *part_b(quick), *part_c(quick)]
    return "\n\n".join([
        "## SAC: sac.py beside ppo.py, rejax's SAC and sbx's on Pendulum-v1",
        "benchmarks/bench_sac.py (`python benchmarks/bench_sac.py" + (" --quick" if quick else "")
        + "`, or `python benchmarks/run.py --only sac`). Load average (1, 5, 15 min) at the "
        f"start: {load_start}" + (". Quick: tiny budgets, the pipeline, not the algorithms."
                                  if quick else "."),
        *text, f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true",
                            help="2 seeds x 2,000 steps (ppo.py: 8,192): the pipeline")
        report = common.machine_header() + "\n\n" + run(parser.parse_args().quick)
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        (common.RESULTS / "SAC.md").write_text(report + "\n")
        print(report)
