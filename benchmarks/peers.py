"""Reference implementations beside ours, same machine, same env-step budget (`run.py --peers`).

Peers run in their own environment (benchmarks/requirements-peers.txt), found at .venv-peers/
or named by the PEERS_PYTHON environment variable; a peer that is not installed is skipped with
a line saying so. Stable-Baselines3 PPO uses the RL-Zoo hyper-parameters for each task; rejax PPO
its defaults, on gymnax envs adapted to the 5-value step its package expects."""
import time

PROCESS_START = time.time()

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BUDGET = {"CartPole-v1": 300_000, "Pendulum-v1": 300_000}
SB3_ZOO = {  # RL-Zoo's tuned PPO settings
    "CartPole-v1": dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                        n_epochs=20, ent_coef=0.0, learning_rate=1e-3, clip_range=0.2),
    "Pendulum-v1": dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10,
                        ent_coef=0.0, learning_rate=1e-3, clip_range=0.2, use_sde=True,
                        sde_sample_freq=4),
}


def sb3_worker(env_id, steps, seed):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    kwargs = dict(SB3_ZOO[env_id])
    env = make_vec_env(env_id, n_envs=kwargs.pop("n_envs"), seed=seed)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
    t0 = time.time()
    model.learn(total_timesteps=steps)
    returns = [ep["r"] for ep in model.ep_info_buffer]
    return {"run_s": time.time() - t0, "final": float(np.mean(returns[-20:]))}


def rejax_worker(env_id, steps, seed):
    import gymnax
    import jax
    from rejax import PPO

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

    env, env_params = gymnax.make(env_id)
    algo = PPO.create(env=FiveValueStep(env), env_params=env_params, total_timesteps=steps,
                      eval_freq=steps)
    train = jax.jit(algo.train)
    t0 = time.time()
    _, (_, returns) = jax.block_until_ready(train(jax.random.PRNGKey(seed)))
    return {"run_s": time.time() - t0, "final": float(np.asarray(returns)[-1].mean())}


def worker(config):
    fn = {"sb3": sb3_worker, "rejax": rejax_worker}[config["peer"]]
    result = fn(config["env_id"], config["steps"], config["seed"])
    result["whole_process_s"] = time.time() - PROCESS_START
    return result


def peers_python():
    explicit = os.environ.get("PEERS_PYTHON")
    default = common.ROOT / ".venv-peers" / "bin" / "python"
    return explicit or (str(default) if default.exists() else None)


def installed(python, module):
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def run(quick: bool, selected=("ppo",)) -> str:
    python = peers_python()
    lines, rows, ours = [], [], {}
    for env_id, budget in BUDGET.items():
        steps = 10_000 if quick else budget
        r = common.run_worker(Path(__file__).with_name("bench_rl.py"), {
            "algo": "ppo", "args": {"env_id": env_id, "num_seeds": 1, "total_timesteps": steps}})
        ours[env_id] = r["whole_process_s"]
        rows.append(["ours PPO", env_id, 1, f"{r['total_steps']:,}", f"{r['final'][0]:.1f}",
                     f"{r['run_s']:.1f}", f"{r['whole_process_s']:.1f}", "1.0"])
    for peer, module in [("sb3", "stable_baselines3"), ("rejax", "rejax")]:
        if python is None or not installed(python, module):
            lines.append(f"- skipped {peer}: `{module}` is not installed in the peers environment "
                         "(see benchmarks/requirements-peers.txt).")
            continue
        for env_id, budget in BUDGET.items():
            steps = 10_000 if quick else budget
            try:
                r = common.run_worker(Path(__file__), {"peer": peer, "env_id": env_id,
                                                       "steps": steps, "seed": 1},
                                      env={"PYTHONPATH": ""}, python=python)
            except RuntimeError as e:
                lines.append(f"- {peer} on {env_id} failed: {str(e).splitlines()[-1]}")
                continue
            rows.append([f"{peer} PPO", env_id, 1, f"{steps:,}", f"{r['final']:.1f}",
                         f"{r['run_s']:.1f}", f"{r['whole_process_s']:.1f}",
                         f"{r['whole_process_s'] / ours[env_id]:.1f}"])
    headers = ["implementation", "env", "seeds", "steps/seed", "final return", "train s",
               "whole process s", "whole process vs ours"]
    text = ("### Reference implementations (1 seed each, same budget)\n\n"
            "Final return: ours and rejax as in the tables above (rejax: its last evaluation); "
            "SB3: mean of its last 20 training episodes. Train s excludes our compile but "
            "includes rejax's (its first jitted call); whole process counts everything from "
            "interpreter start.")
    if rows:
        text += "\n\n" + common.md_table(headers, rows)
    return text + ("\n\n" + "\n".join(lines) if lines else "")


if __name__ == "__main__":
    if not common.worker_entry(worker):
        print(run(quick="--quick" in sys.argv))
