"""PPO: learning curves against stated thresholds, GAE against a plain loop, the seed sweep and
the CLI."""
import dataclasses
import shutil

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo
from conftest import assert_learns, assert_usage_error, read_scalars, run_script

# One table: what a correct PPO reaches, the env-step budget it gets (default flags fill the rest),
# on how many seeds. "final" = mean episode_return over the last 5% of updates; "rise" = how far
# the last 10% of updates must score above the first 10%.
LEARNING = {
    "cartpole_default": dict(args=dict(env_id="CartPole-v1"), budget=300_000, seeds=4,
                             mean=475.0, worst=450.0, rise=150.0),
    "cartpole_2048_envs": dict(args=dict(env_id="CartPole-v1", num_envs=2048), budget=2_000_000,
                               seeds=4, mean=475.0, worst=450.0, rise=150.0),
    "pendulum_default": dict(args=dict(env_id="Pendulum-v1"), budget=1_000_000, seeds=4,
                             mean=-250.0, worst=None, rise=300.0),
}


@pytest.mark.parametrize("case", LEARNING)
def test_learns(case):
    assert_learns(ppo, LEARNING[case])


def gae_reference(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE(lambda) one env and one step at a time, in float64."""
    T, N = rewards.shape
    adv = np.zeros((T, N))
    for n in range(N):
        next_adv = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, n] else gamma * next_values[t, n]
            delta = rewards[t, n] + bootstrap - values[t, n]
            if terminated[t, n] or truncated[t, n]:
                next_adv = delta
            else:
                next_adv = delta + gamma * lam * next_adv
            adv[t, n] = next_adv
    return adv, adv + values


def test_gae_matches_plain_loop():
    rng = np.random.default_rng(0)
    T, N, gamma, lam = 64, 5, 0.97, 0.9
    rewards, values, next_values = (rng.normal(size=(T, N)) for _ in range(3))
    terminated = rng.random((T, N)) < 0.1
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    truncated[5, 0] = terminated[5, 0] = True  # both at once: no bootstrap, the recursion stops
    adv, targets = ppo.compute_gae(
        *(jnp.asarray(x, jnp.float32)
          for x in (rewards, values, next_values, terminated, truncated)),
        gamma, lam)
    ref_adv, ref_targets = gae_reference(rewards, values, next_values, terminated, truncated,
                                         gamma, lam)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets, ref_targets, rtol=1e-5, atol=1e-5)


TINY = dict(env_id="CartPole-v1", num_envs=8, num_steps=32, num_minibatches=4,
            total_timesteps=8 * 32 * 12, track=False)


def test_seed_sweep_layout_and_determinism():
    args = ppo.validate(ppo.Args(num_seeds=4, **TINY))
    _, one_device, _ = ppo.run(args, num_devices=1)
    _, two_devices, _ = ppo.run(args, num_devices=2)
    _, again, _ = ppo.run(args, num_devices=2)
    for key in one_device:
        assert one_device[key].shape == (4, 12), key
        # Another layout may round differently by an ulp: the first update agrees to 1e-5.
        np.testing.assert_allclose(one_device[key][:, 0], two_devices[key][:, 0], rtol=1e-5,
                                   atol=1e-7, err_msg=key)
        np.testing.assert_array_equal(two_devices[key], again[key], err_msg=key)
    # Seeds are independent experiments: no two seeds of the sweep see the same losses.
    losses = np.asarray(two_devices["loss/value"])
    assert len({float(x) for x in losses[:, 0]}) == 4


def test_help_lists_every_flag_with_its_doc():
    proc = run_script("ppo.py", "--help")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())
    for field in dataclasses.fields(ppo.Args):
        flag = "--" + field.name.replace("_", "-")
        assert flag in text, flag
    for phrase in ["parallel environments per seed", "surrogate clipping epsilon",
                   "2048 // num_envs clipped to [16, 128]"]:
        assert phrase in text, phrase


TINY_FLAGS = ["--num-envs", 8, "--num-steps", 64, "--num-minibatches", 4,
              "--total-timesteps", 8 * 64 * 10, "--num-seeds", 2]


def test_cli_run_writes_events_and_model(tmp_path):
    proc = run_script("ppo.py", *TINY_FLAGS, "--save-model", "--log-dir", tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final return per seed" in proc.stdout
    assert proc.stdout.count("[ppo] steps") == 10  # a progress line every 10% of updates
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("CartPole-v1__ppo__1__")
    for k in range(2):
        points = read_scalars(run_dir / f"seed_{k}", "charts/episodic_return")
        steps = [s for s, _ in points]
        assert len(steps) >= 5 and steps == sorted(steps) and len(set(steps)) == len(steps)
        assert read_scalars(run_dir / f"seed_{k}", "losses/value")
    payload = flax.serialization.msgpack_restore((run_dir / "model.msgpack").read_bytes())
    params = payload["params"]
    network = ppo.ActorCritic(action_dim=2, continuous=False, hidden_size=64)
    first_seed = jax.tree.map(lambda x: x[0], params)
    dist, value = network.apply(first_seed, jnp.zeros((3, 4)))
    assert dist.logits.shape == (3, 2) and value.shape == (3,)
    assert jax.tree.leaves(params)[0].shape[0] == 2


def test_copied_file_runs_alone(tmp_path):
    shutil.copy(ppo.__file__, tmp_path / "ppo.py")
    proc = run_script(tmp_path / "ppo.py", *TINY_FLAGS, "--no-track", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "final return per seed" in proc.stdout


@pytest.mark.parametrize("flags, flag", [
    (["--num-envs", "0"], "--num-envs"),
    (["--num-seeds", "0"], "--num-seeds"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--num-envs", "10", "--num-steps", "10", "--num-minibatches", "3"], "--num-minibatches"),
    (["--learning-rate", "-0.001"], "--learning-rate"),
])
def test_bad_input_is_one_line_exit_2(flags, flag, tmp_path):
    assert_usage_error("ppo.py", flags, flag, tmp_path)


def test_cli_usage_error_exit_code(tmp_path):
    proc = run_script("ppo.py", "--num-envs", "0", "--log-dir", tmp_path / "runs", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --num-envs must be >= 1 (got 0)"
    assert not (tmp_path / "runs").exists()
