"""PPO and VPG on every gymnax environment they handle, beside a uniform random policy.

    python benchmarks/bench_envs.py [--quick]
    python benchmarks/run.py --only envs [--quick]

Every registered gymnax env with a Discrete or Box action space, with each file's default flags
(hidden 64; observations of any rank flattened) at a fixed budget per family: classic control,
bsuite and misc 500k steps x 4 seeds, MinAtar 1M x 2 seeds (the 2-core CPU runs MinAtar at a few
thousand steps per second). One table: where each algorithm works at that budget, and where it does
not. Not part of the default `benchmarks/run.py` run: on 2 cores it takes well over an hour.
--quick runs one env per family on a tiny budget, to check the pipeline. Each workload runs in its
own process (PPO and VPG: the command as typed, common.run_command); an env that cannot be built or
trained shows its error instead."""
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ALGOS = ("ppo", "vpg")
# family -> (env-steps per seed, seeds); an env's family is its id's suffix (none: classic control)
BUDGETS = {"classic control": (500_000, 4), "bsuite": (500_000, 4), "misc": (500_000, 4),
           "MinAtar": (1_000_000, 2)}
QUICK_BUDGET = (8_192, 2)
QUICK_ENVS = ("CartPole-v1", "Catch-bsuite", "Breakout-MinAtar", "FrozenLake-misc")
RANDOM_ENVS, RANDOM_STEPS = 64, 5_000  # the random policy: 64 envs x up to 5k steps each


def family(env_id: str) -> str:
    suffix = env_id.rsplit("-", 1)[-1]
    return {"MinAtar": "MinAtar", "bsuite": "bsuite", "misc": "misc"}.get(suffix,
                                                                          "classic control")


def random_returns(env_id: str, seed: int = 0) -> dict:
    """Mean undiscounted return of the episodes a uniform random policy finishes in RANDOM_ENVS
    envs x min(RANDOM_STEPS, 2 x the episode step limit) steps (NaN if none finishes)."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, env_params = gymnax.make(env_id)
    limit = int(getattr(env_params, "max_steps_in_episode", RANDOM_STEPS))
    steps = min(RANDOM_STEPS, 2 * limit)
    space = env.action_space(env_params)

    def step(carry, key):
        env_state, episode_return, total, count = carry
        k_act, k_env = jax.random.split(key)
        actions = jax.vmap(space.sample)(jax.random.split(k_act, RANDOM_ENVS))
        _, env_state, reward, terminated, truncated, _ = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(jax.random.split(k_env, RANDOM_ENVS), env_state,
                                               actions, env_params)
        done = jnp.logical_or(terminated, truncated)
        episode_return = episode_return + reward
        total = total + (episode_return * done).sum()
        count = count + done.sum(dtype=jnp.int32)
        return (env_state, jnp.where(done, 0.0, episode_return), total, count), None

    @jax.jit
    def rollout(key):
        k_reset, k_steps = jax.random.split(key)
        _, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, RANDOM_ENVS), env_params)
        carry = (env_state, jnp.zeros(RANDOM_ENVS), jnp.zeros(()), jnp.zeros((), jnp.int32))
        (_, _, total, count), _ = jax.lax.scan(step, carry, jax.random.split(k_steps, steps))
        return total, count

    total, count = rollout(jax.random.PRNGKey(seed))
    return {"mean": float(total / count) if count > 0 else float("nan"), "episodes": int(count)}


def worker(config):
    """A random-policy evaluation (the training sweeps are commands as typed: common)."""
    return random_returns(config["env_id"])


def handled_envs() -> list:
    """Every registered gymnax env whose action space is Discrete or Box, and the error of those
    that cannot be built here (MNISTBandit-bsuite downloads MNIST)."""
    import gymnax
    from gymnax.environments import spaces

    envs = []
    for env_id in sorted(gymnax.registered_envs):
        try:
            env, env_params = gymnax.make(env_id)
        except Exception as e:  # any failure to build is reported in the table, not raised
            envs.append((env_id, f"cannot build: {type(e).__name__}"))
            continue
        if isinstance(env.action_space(env_params), (spaces.Discrete, spaces.Box)):
            envs.append((env_id, None))
    return envs


def cell(result, total_steps) -> str:
    """A final return, the worst seed, and the steps it was reached in (per seed)."""
    if isinstance(result, str):
        return result
    final = np.asarray(result["final"][0], dtype=np.float64)
    if np.all(np.isnan(final)):
        return f"no episode finished ({total_steps:,} steps)"
    return f"{np.nanmean(final):.1f} (worst {np.nanmin(final):.1f})"


def run(quick: bool) -> str:
    rows = []
    script = Path(__file__)
    for env_id, error in handled_envs():
        if quick and env_id not in QUICK_ENVS:
            continue
        fam = family(env_id)
        budget, seeds = QUICK_BUDGET if quick else BUDGETS[fam]
        if error:
            rows.append([env_id, fam, f"{budget:,} x {seeds}", error, error, error])
            continue
        print(f"  {env_id} ({fam}): random, {', '.join(ALGOS)} ...", flush=True)
        results = {}
        for algo in ("random", *ALGOS):
            flags = ["--env-id", env_id, "--num-seeds", str(seeds), "--total-timesteps",
                     str(budget)]
            try:
                if algo == "random":
                    results[algo] = common.run_worker(script, {"env_id": env_id})
                else:
                    with tempfile.TemporaryDirectory() as cache:
                        results[algo] = common.run_command(algo, flags, np.inf, cache)
            except RuntimeError as e:
                last = str(e).strip().splitlines()[-1][:80]
                print(str(e)[-2000:], file=sys.stderr)
                results[algo] = f"failed: {last}"
        rand = results["random"]
        rows.append([env_id, fam, f"{budget:,} x {seeds}",
                     rand if isinstance(rand, str) else f"{rand['mean']:.1f}",
                     *[cell(results[a], budget) for a in ALGOS]])
    headers = ["env", "family", "budget (steps/seed x seeds)", "random policy",
               "PPO final return", "VPG final return"]
    budgets = (f"quick: {QUICK_BUDGET[0]:,} steps x {QUICK_BUDGET[1]} seeds, one env per family; "
               "numbers that check the pipeline, not the algorithms" if quick
               else "; ".join(f"{fam} {b:,} steps x {s} seeds" for fam, (b, s) in BUDGETS.items()))
    note = (f"Each file's default flags at a fixed budget per family ({budgets}). Final return = "
            "mean episode return over the last 5% of updates, mean over the seeds (worst seed in "
            f"brackets). Random policy: uniform actions, {RANDOM_ENVS} envs x "
            f"min({RANDOM_STEPS:,}, 2 x episode limit) steps, mean over the finished episodes.")
    return ("## Every gymnax environment: PPO and VPG beside a random policy\n\n" + note + "\n\n"
            + common.md_table(headers, rows))


if __name__ == "__main__":
    if not common.worker_entry(worker):
        print(common.machine_header() + "\n\n" + run(quick="--quick" in sys.argv))
