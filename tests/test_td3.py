"""TD3 (and DDPG by its flags): the critic target, the smoothing's and the exploration's clips
against float64 numpy, the call sites (the target networks in the target, the policy and the
targets stepped on every policy_frequency-th critic step only, counted; the policy's step leaving
the critics as the critic step made them, the critic's step leaving the policy; the Polyak step of
both targets), DDPG's single critic, the greedy and the exploring actions in the action box,
Pendulum-v1 learnt, and bad input. The replay buffer is sac.py's: test_sac.py checks it on both
files."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import td3
from conftest import assert_learns, assert_usage_error, validated
from runner import sweep

# One table, judged as the other files' (conftest.learning_verdict). Pendulum-v1 at 14k steps
# (the preset's 20k less 30%), 2 seeds in one sweep; a random policy scores about -1250.
LEARNING = {
    "pendulum": dict(args=dict(env_id="Pendulum-v1", total_timesteps=20_000), budget=20_000,
                     seeds=2, median=-300.0, most=(2, -450.0), rise=600.0),
}
TINY = dict(num_envs=2, num_steps=5, gradient_steps=1, batch_size=4, buffer_size=10,
            learning_starts=0, hidden_size=8, total_timesteps=10)


def hp_of(args):
    return {k: jnp.float32(getattr(args, k)[0]) for k in td3.HPARAMS}


def one_update(seed=0, **flags):
    """(state after init, state after one update, metrics) of a TINY run with these flags."""
    args = validated(td3, **{**TINY, **flags})
    train = sweep.build_train(args)
    hp = hp_of(args)
    start = train.init(jax.random.PRNGKey(seed), hp)
    return start, *jax.jit(train.update)(hp, start)


def test_critic_target_matches_float64():
    """The smaller of the target critics (TD3), or the one (DDPG); no bootstrap at
    termination; a truncated step is an ordinary step here (its next_obs is the true last
    observation, not the reset's)."""
    rng = np.random.default_rng(0)
    reward = rng.normal(size=64) * 3
    next_q = rng.normal(size=(2, 64)) * 5
    terminated = (rng.random(64) < 0.3).astype(np.float64)
    gamma = 0.97
    for critics in (2, 1):
        expected = np.empty(64)
        for i in range(64):  # case by case
            smallest = min(next_q[:critics, i])
            expected[i] = reward[i] if terminated[i] else reward[i] + gamma * smallest
        got = td3.critic_target(jnp.float32(reward), jnp.float32(terminated),
                                jnp.float32(next_q[:critics]), gamma)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_smoothing_noise_is_clipped_then_the_action_to_its_box():
    """perturbed on fresh random actions and noise, against float64 case by case: the noise
    clipped to [-clip, clip] half-widths, the sum to [low, high] (two dimensions, different
    boxes); clip inf (the envs' exploration) clips the sum alone."""
    rng = np.random.default_rng(1)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    action = rng.uniform(low, high, size=(256, 2))
    noise = rng.normal(scale=0.6, size=(256, 2))
    for clip in (0.5, np.inf):
        expected = np.empty_like(action)
        for i in range(256):
            for d in range(2):
                half_width = (high[d] - low[d]) / 2
                step = max(-clip, min(clip, noise[i, d])) * half_width
                expected[i, d] = max(low[d], min(high[d], action[i, d] + step))
        got = td3.perturbed(jnp.float32(action), jnp.float32(noise), clip, jnp.float32(low),
                            jnp.float32(high))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert (np.abs(noise) > 0.5).mean() > 0.3  # (the clip was exercised)


def test_the_policy_and_targets_step_on_every_policy_frequency_th_critic_step():
    """An update of 2 envs x 5 steps, a gradient step after each (learning_starts 0), the policy
    every 3rd: Adam's counts say 5 critic steps and 1 policy step, critic_steps 5; loss/actor is
    the one step's (NaN over the others is left out of the mean). (DDPG's every step: below.)"""
    _, state, metrics = one_update(policy_frequency=3)
    assert int(state.critic_steps) == 5
    assert int(state.opt_state["critic"][0].count) == 5
    assert int(state.opt_state["actor"][0].count) == 1
    assert np.isfinite(float(metrics["loss/actor"]))


def test_each_step_reaches_only_its_own_network():
    """One gradient step (1 env step, learning_starts 0) with policy_frequency 2 takes no policy
    step: the actor and both targets stay as they were, the critics move. With policy_frequency
    1 the same critic step is followed by a policy step: the critics are bit for bit those of
    the first run (the policy's loss moved no critic), the actor moved; the targets then took
    their Polyak step, (1 - tau) old + tau new, the actor's and the critics'."""
    flags = dict(num_steps=1, total_timesteps=2, tau=(0.3,))
    start, delayed, _ = one_update(policy_frequency=2, **flags)
    same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))
    assert same(delayed.params["actor"], start.params["actor"])
    assert same(delayed.targets, start.targets)
    assert not same(delayed.params["critic"], start.params["critic"])
    _, every, _ = one_update(policy_frequency=1, **flags)
    assert same(every.params["critic"], delayed.params["critic"])
    assert not same(every.params["actor"], start.params["actor"])
    expected = jax.tree.map(lambda t, o: 0.7 * t + 0.3 * o, start.targets, every.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 every.targets, expected)


def test_the_critics_regress_on_the_targets_at_the_smoothed_target_action():
    """critic_loss is the critics' summed squared errors against critic_target on the target
    critics at the target actor's action plus clipped noise (not the online networks'): the
    same value by hand; its gradient on the online critics alone (the targets are arguments it
    does not differentiate)."""
    start, _, _ = one_update()
    args = validated(td3, **TINY)
    rng = np.random.default_rng(2)
    params = start.params
    targets = jax.tree.map(lambda x: x + 0.1 * jnp.float32(rng.normal(size=x.shape)), params)
    actor = td3.Actor((-2.0,), (2.0,), args.hidden_size)
    critic = td3.critics(2, args.hidden_size)
    batch = td3.Transition(
        jnp.float32(rng.normal(size=(32, 3))), jnp.float32(rng.uniform(-2, 2, size=(32, 1))),
        jnp.float32(rng.normal(size=32)), jnp.float32(rng.normal(size=(32, 3))),
        jnp.float32(rng.random(32) < 0.3))
    noise = jnp.float32(rng.normal(size=(32, 1)))
    hp = hp_of(args)
    bounds = (np.float32([-2.0]), np.float32([2.0]))
    next_action = np.clip(np.asarray(actor.apply(targets["actor"], batch.next_obs))
                          + np.clip(np.asarray(noise) * 0.2, -0.5, 0.5) * 2.0, -2.0, 2.0)
    next_q = critic.apply(targets["critic"], batch.next_obs, jnp.float32(next_action))
    y = np.asarray(batch.reward) + 0.99 * (1 - np.asarray(batch.terminated)) * np.min(
        np.asarray(next_q), axis=0)
    q = np.asarray(critic.apply(params["critic"], batch.obs, batch.action))
    loss, stats = td3.critic_loss(params["critic"], targets, actor, critic, hp, batch, noise,
                                  bounds)
    np.testing.assert_allclose(float(loss), ((q - y) ** 2).mean(-1).sum(), rtol=1e-4)
    assert float(loss) == float(stats["loss/critic"])


def test_ddpg_is_one_critic_without_smoothing_or_delay():
    """--num-critics 1: the critic's parameters stacked [1, ...] and Q [1, B]; with
    --policy-noise 0 --policy-frequency 1 a policy step follows every critic step."""
    _, state, metrics = one_update(num_critics=1, policy_noise=(0.0,), policy_frequency=1)
    kernels = [x.shape[0] for x in jax.tree.leaves(state.params["critic"])]
    assert set(kernels) == {1}
    assert int(state.opt_state["actor"][0].count) == 5
    assert np.isfinite(float(metrics["loss/critic"]))


def test_greedy_and_exploring_actions_lie_in_the_box():
    """act: the greedy action is the actor's; with a key, Gaussian noise of the run's
    exploration_noise half-widths around it, clipped to [-2, 2]: at noise 0.1 (std 0.2 on
    Pendulum's box) the mean distance is 0.2 sqrt(2 / pi) away from the edges."""
    args = validated(td3, **TINY)
    train = sweep.build_train(args)
    state = train.init(jax.random.PRNGKey(0), hp_of(args))
    obs = jax.random.normal(jax.random.PRNGKey(1), (4000, 3))
    greedy, memory = train.act(state, obs, ())
    explored, _ = train.act(state, obs, (), jax.random.PRNGKey(2))
    assert memory == () and greedy.shape == explored.shape == (4000, 1)
    assert (jnp.abs(explored) <= 2.0).all()
    inside = np.abs(np.asarray(greedy)) < 1.0  # far from the edges: no clip
    distance = np.abs(np.asarray(explored - greedy))[inside].mean()
    np.testing.assert_allclose(distance, 0.2 * np.sqrt(2 / np.pi), rtol=0.05)


def test_learns_pendulum():
    assert_learns(td3, LEARNING["pendulum"])


@pytest.mark.parametrize("typed, flag", [
    (["--env-id", "CartPole-v1"], "--env-id"),
    (["--num-envs", "3", "--batch-size", "256"], "--batch-size"),
    (["--policy-noise", "-0.1"], "--policy-noise"),
    (["--noise-clip", "-1"], "--noise-clip"),
    (["--policy-frequency", "0"], "--policy-frequency"),
    (["--num-critics", "0"], "--num-critics"),
    (["--tau", "1.5"], "--tau"),
])
def test_bad_input_is_one_line_exit_2(typed, flag, tmp_path):
    assert_usage_error("td3.py", typed, flag, tmp_path)
