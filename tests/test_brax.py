"""Brax's physics tasks behind gymnax's interface (--env-id brax/<name>, the runner's envs module):
checked against Brax itself; a time limit is a truncation (the files bootstrap through it from
info["final_observation"]), a fall a termination; the files that take continuous actions train on
one; bad input is one line before anything compiles."""
import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import ppo
import ppo_rnn
import sac
import vpg
from conftest import assert_usage_error, validated
from runner import envs, evaluation, files, flags, sweep

pytestmark = pytest.mark.usefixtures("quicker_compiles")  # (conftest: LLVM -O0)

T = 100  # steps of a rollout
BACKEND = "spring"  # the adapter's tests: any backend (spring compiles fastest); ppo: positional


def env_of(env_id, steps=None):
    """(env, env_params, Brax's own task) of env_id, its episodes cut after `steps`."""
    import brax.envs

    env, env_params = envs.make_env(flags.args_class(ppo)(env_id=env_id, brax_backend=BACKEND))
    if steps:
        env_params = env_params.replace(max_steps_in_episode=steps)
    return env, env_params, brax.envs.get_environment(env_id[len("brax/"):], backend=BACKEND)


@partial(jax.jit, static_argnums=0)  # one program for the tests below (env_params an argument)
def rollout(env, env_params, actions, key):
    """Steps of one env under actions [T, A] from a reset by key: per step (obs, reward,
    terminated, truncated, final_observation, the state's episode time after it)."""
    def step(carry, x):
        obs, state = carry
        action, k = x
        obs, state, reward, terminated, truncated, info = env.step(k, state, action, env_params)
        return (obs, state), (obs, reward, terminated, truncated, info["final_observation"],
                              state.time)

    start = env.reset(key, env_params)
    keys = jax.random.split(jax.random.fold_in(key, 1), len(actions))
    return jax.lax.scan(step, start, (actions, keys))[1]


def test_a_time_limit_truncates_and_the_next_episode_starts_afresh():
    """An inverted pendulum held still stands for 5 steps: at the limit (5 steps here) truncated,
    not terminated; the final observation is Brax's own after those steps, the returned one a
    fresh start's (the reset by the step's key), and the episode's time starts again."""
    env, env_params, task = env_of("brax/inverted_pendulum", steps=5)
    key, actions = jax.random.PRNGKey(3), jnp.zeros((T, 1))
    obs, reward, terminated, truncated, final, time = jax.device_get(
        rollout(env, env_params, actions, key))
    assert not terminated[:7].any() and truncated[:7].tolist() == [0, 0, 0, 0, 1, 0, 0]
    assert time[:7].tolist() == [1, 2, 3, 4, 0, 1, 2]

    def brax_step(state, action):
        state = task.step(state, action)
        return state, (state.obs, state.reward)

    brax_reset = jax.jit(task.reset)  # the adapter's reset is Brax's, by the same key
    brax_obs, brax_reward = jax.jit(partial(jax.lax.scan, brax_step))(brax_reset(key),
                                                                       actions[:5])[1]
    np.testing.assert_allclose(final[:5], brax_obs, rtol=1e-5, atol=1e-5)  # Brax's own steps
    np.testing.assert_allclose(reward[:5], brax_reward, rtol=1e-5, atol=1e-5)
    assert np.abs(final[4] - obs[4]).max() > 1e-2  # the reset is another observation
    step_key = jax.random.split(jax.random.fold_in(key, 1), T)[4]  # gymnax resets by its split
    fresh = brax_reset(jax.random.split(step_key)[1]).obs
    np.testing.assert_allclose(obs[4], fresh, rtol=1e-6, atol=1e-6)


def test_a_pendulum_that_falls_is_terminated_before_the_limit():
    """Full force on the cart: the pole falls within a few dozen steps. That step is terminated
    (Brax's done), not truncated; steps before it are neither; the next episode starts afresh."""
    env, env_params, _ = env_of("brax/inverted_pendulum")
    _, _, terminated, truncated, _, time = jax.device_get(
        rollout(env, env_params, jnp.ones((T, 1)), jax.random.PRNGKey(0)))
    first = int(np.argmax(terminated))
    assert terminated[first] and 0 < first < T and not truncated[:first + 1].any()
    assert time[first] == 0 and time[first - 1] == first


def test_spaces_have_the_true_bounds():
    env, env_params, task = env_of("brax/inverted_pendulum")
    space = env.action_space(env_params)
    assert space.shape == (task.action_size,) and space.low == -1 and space.high == 1
    observation = jax.eval_shape(task.reset, jax.random.PRNGKey(0)).obs  # (Brax's own
    assert env.observation_space(env_params).shape == observation.shape  # observation_size: 4 s)
    assert env_params.max_steps_in_episode == 1000


@pytest.mark.parametrize("backend", ["positional", "mjx"])
def test_ppo_over_two_devices_resumes_bit_for_bit(backend, tmp_path):
    """One run of ppo.py on brax/inverted_pendulum, its envs split over the 2 devices: a checkpoint
    after segment 2 of 4 (the Brax states inside, joined as one device holds them) resumes to the
    uninterrupted run's metrics and state, bit for bit; its episodes end (the pendulum falls).
    mjx's state holds arrays of no elements, which crashed XLA's compile over 2 devices until the
    adapter left them out. (brax/hopper after SIGTERM as a user runs it: the commit that added
    this test.)"""
    args = validated(ppo, env_id="brax/inverted_pendulum", brax_backend=backend,
                     num_seeds=1, num_envs=4, num_steps=32, num_minibatches=2,
                     update_epochs=1, hidden_size=8, total_timesteps=4 * 32 * 4,
                     num_segments=4, track=False)
    runs = list(sweep.segments(args))
    (state, metrics, timing), (final_state, final, last) = runs[1], runs[-1]
    assert last["span"] == 2 and np.isfinite(final["episode_return"]).any()
    files.write_checkpoint(str(tmp_path), args, state, metrics, timing["num_updates"], 2)
    resumed_args, checkpoint = files.read_saved(
        dataclasses.replace(args, resume=str(tmp_path)), ["--resume", str(tmp_path)])
    *_, (resumed_state, resumed, _) = sweep.segments(
        resumed_args, start=(checkpoint["state"], checkpoint["metrics"]))
    jax.tree.map(np.testing.assert_array_equal, resumed, final)
    jax.tree.map(np.testing.assert_array_equal, resumed_state, final_state)


@pytest.mark.parametrize("module", [vpg, ppo_rnn, sac], ids=lambda m: m.__name__)
def test_every_continuous_file_trains_on_a_brax_task(module, tmp_path):
    """A short run on brax/inverted_pendulum (ppo.py: the test above), --brax-backend spring:
    its episodes end (the pendulum falls) and are reported, through the runner's whole path; vpg's
    policy plays the evaluation episodes, greedy and sampled, and one drawn by MuJoCo (a frame a
    step of the greedy episode, until the pendulum falls)."""
    small = dict(num_envs=4, hidden_size=8, num_steps=64, total_timesteps=4 * 64 * 2)
    if module is sac:
        small.update(num_steps=16, total_timesteps=4 * 16 * 4, learning_starts=32,
                     buffer_size=256, batch_size=16)
    if module is ppo_rnn:
        small["num_minibatches"] = 2
    args = validated(module, env_id="brax/inverted_pendulum", brax_backend=BACKEND,
                     num_seeds=2, eval_episodes=2, track=False, **small)
    state, metrics, _ = sweep.run(args)
    assert np.isfinite(metrics["episode_return"]).any(1).all(), metrics["episode_return"]
    if module is vpg:
        evals = evaluation.evaluator(args)(state)
        assert all(np.isfinite(v).all() and (v != 0).all() for v in evals.values()), evals
        gif = evaluation.capture_gif(str(tmp_path / "episode.gif"), args, state)
        with Image.open(gif) as image:
            assert 2 <= image.n_frames < 1000 and image.size == (320, 240)
            frames = []
            for i in (0, image.n_frames - 1):
                image.seek(i)
                frames.append(np.asarray(image.convert("RGB"), np.float32))
        assert np.abs(frames[0] - frames[1]).mean() > 0.1  # the pendulum moved


@pytest.mark.parametrize("script, flags, message", [
    ("ppo.py", ["--env-id", "brax/hoper"], "Brax has no such env; it has "),
    ("pqn.py", ["--env-id", "brax/hopper"], "pqn.py runs no Brax task"),
    ("ppo.py", ["--brax-backend", "spring"], "--brax-backend is for Brax's envs"),
])
def test_bad_input_is_one_line_before_compiling(script, flags, message, tmp_path):
    assert_usage_error(script, flags, message, tmp_path)
