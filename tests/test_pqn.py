"""PQN: Q(lambda) targets against a plain float64 loop, one-step TD at lambda 0, their inputs
bootstrapping through truncation, the epsilon schedule (alone and as the updates carry it), and
CartPole-v1 learnt as typed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pqn
from conftest import assert_truncation_bootstraps_from_final_observation, validated
from runner import devices, envs, evaluation, sweep


def test_learns_cartpole_as_typed():
    """`python algos/pqn.py --num-seeds 2` (CartPole-v1, its preset; 2 seeds for the suite's
    time, 64 held-out ones in benchmarks/results/PQN.md): the greedy policy, argmax Q, reaches
    ppo's floor over 64 fresh episodes a seed (mean >= 475, every seed >= 450); the behaviour
    policy explores at epsilon 0.2 to the end, so it is not held to that floor, but its training
    return must rise by 150 or more from the first 10% of updates to the last. (Measured on seed
    bases 1, 100, 200, 2 seeds each, 2026-11-27, Intel Xeon: greedy 500 on each of the 6 seeds,
    training returns 443 to 494, rises 405 to 436: margins 25 and 255.)"""
    args = validated(pqn, num_seeds=2, track=False)
    assert args.total_timesteps <= 500_000
    state, metrics, _ = sweep.run(args)
    greedy = evaluation.evaluator(args)(state)["eval/episodic_return_greedy"]
    assert greedy.mean() >= 475 and greedy.min() >= 450, greedy
    returns = np.asarray(metrics["episode_return"])
    tenth = returns.shape[1] // 10
    assert np.nanmean(returns[:, -tenth:]) - np.nanmean(returns[:, :tenth]) >= 150


def q_lambda_reference(rewards, next_q_max, terminated, truncated, gamma, lam):
    """Q(lambda) returns one env and one step at a time, in float64, case by case: a terminated
    step ends at its reward, a truncated one bootstraps from its final observation's max Q, and
    any other mixes that with the next step's return (after the rollout: its last max Q)."""
    T, N = rewards.shape
    returns = np.zeros((T, N))
    for n in range(N):
        following = next_q_max[-1, n]
        for t in reversed(range(T)):
            if terminated[t, n]:
                following = rewards[t, n]
            elif truncated[t, n]:
                following = rewards[t, n] + gamma * next_q_max[t, n]
            else:
                following = rewards[t, n] + gamma * (
                    (1 - lam) * next_q_max[t, n] + lam * following)
            returns[t, n] = following
    return returns


def random_rollout(seed, T=64, N=5):
    """Rewards, next_q_max, terminated, truncated [T, N]: about 10% of steps end an episode each
    way, and one step both terminates and truncates."""
    rng = np.random.default_rng(seed)
    rewards, next_q_max = rng.normal(size=(T, N)), rng.normal(size=(T, N)) * 3
    terminated = rng.random((T, N)) < 0.1
    truncated = (rng.random((T, N)) < 0.1) & ~terminated
    terminated[5, 0] = truncated[5, 0] = True
    return rewards, next_q_max, terminated, truncated


@pytest.mark.parametrize("seed, gamma, lam", [(0, 0.99, 0.95), (1, 0.9, 0.65), (2, 0.97, 1.0),
                                              (3, 0.5, 0.3)])
def test_q_lambda_targets_match_plain_loop(seed, gamma, lam):
    rollout = random_rollout(seed)
    targets = pqn.q_lambda_targets(*(jnp.asarray(x, jnp.float32) for x in rollout), gamma, lam)
    np.testing.assert_allclose(targets, q_lambda_reference(*rollout, gamma, lam),
                               rtol=1e-5, atol=1e-5)


def test_q_lambda_zero_is_one_step_td():
    rewards, next_q_max, terminated, truncated = (jnp.asarray(x, jnp.float32)
                                                  for x in random_rollout(4))
    targets = pqn.q_lambda_targets(rewards, next_q_max, terminated, truncated, 0.99, 0.0)
    # Jitted, as the scan's body is: XLA fuses r + c * M into one multiply-add (one rounding), so
    # op-by-op evaluation can differ in the last bit (it does on 27% of these entries on CPU).
    one_step = jax.jit(lambda r, m, term: r + 0.99 * (1 - term) * m)
    np.testing.assert_array_equal(targets, one_step(rewards, next_q_max, terminated))


def test_epsilon_schedule():
    """The formula at a few steps, and the epsilon that the updates carry and report: the one in
    force during each update's rollout, from the env steps done before it."""
    start, end, decay = 1.0, 0.1, 1000
    for steps in (0, 1, 250, 999, 1000, 1001, 10**6):
        expected = start + min(steps / decay, 1.0) * (end - start)
        assert abs(float(pqn.epsilon_schedule(steps, start, end, decay)) - expected) < 1e-6

    args = validated(pqn, num_envs=4, num_steps=8, num_minibatches=2, update_epochs=1,
                     hidden_size=8, total_timesteps=32 * 10,
                     exploration_fraction=0.5, start_e=(0.9,), end_e=(0.3,))
    train = sweep.build_train(args)
    hp = {k: jnp.float32(getattr(args, k)[0]) for k in pqn.HPARAMS}
    # train is init, then a scan of update: the same update jitted alone serves the --pbt check.
    init, update = jax.jit(train.init), jax.jit(train.update)
    runner, updates = init(jax.random.PRNGKey(0), hp), []
    for _ in range(train.num_updates):
        runner, metrics = update(hp, runner)
        updates.append(metrics)
    metrics = {k: np.stack([m[k] for m in updates]) for k in updates[0]}
    before = np.arange(train.num_updates) * 32  # env steps done before each update's rollout
    np.testing.assert_allclose(metrics["stats/epsilon"],
                               0.9 + np.minimum(before / 160, 1.0) * (0.3 - 0.9), atol=1e-6)
    assert float(runner.epsilon) == pytest.approx(0.3)
    # The learning rate in force at each update's first step, annealed over the 10 updates.
    np.testing.assert_allclose(metrics["charts/learning_rate"],
                               args.learning_rate[0] * (1 - np.arange(10) / 10), rtol=1e-6)
    # A --pbt step that moves start_e between two updates: the next rollout explores at the
    # schedule of the new values (not at the epsilon the state carries from the old ones).
    runner, _ = update(hp, init(jax.random.PRNGKey(0), hp))
    _, metrics = update(hp | {"start_e": jnp.float32(0.5)}, runner)
    assert float(metrics["stats/epsilon"]) == pytest.approx(0.5 + 32 / 160 * (0.3 - 0.5))


def test_truncation_bootstraps_from_the_final_observation(monkeypatch):
    """The M_t of the targets (next_q_max) is max_a Q of the observation step t led to before the
    auto-reset: on an ordinary step the next step's (max Q of its observation, by the rollout's
    parameters), on a truncated one (CartPole-v1 cut at 5 steps, which it cannot end sooner)
    that of its final observation, not of the reset one (conftest's check, max Q for V)."""
    args = validated(pqn, num_envs=8, num_steps=32, num_minibatches=2, update_epochs=1,
                     hidden_size=16, total_timesteps=8 * 32, track=False)
    env, env_params = envs.make_env(args)
    train = pqn.make_train(args, env, env_params.replace(max_steps_in_episode=5), devices.Shard())
    targets_inputs, batches = [], []
    targets, minibatches = pqn.q_lambda_targets, devices.Shard.minibatches

    def recording_targets(*inputs):  # (rewards, next_q_max, terminated, truncated, ...)
        targets_inputs.append(inputs[:4])
        return targets(*inputs)

    def recording_minibatches(shard, key, batch, count):  # batch: (obs [T, N, ...], ...)
        jax.debug.callback(lambda obs: batches.append(np.asarray(obs)), batch[0])
        return minibatches(shard, key, batch, count)

    monkeypatch.setattr(pqn, "q_lambda_targets", recording_targets)
    monkeypatch.setattr(devices.Shard, "minibatches", recording_minibatches)
    hp = {k: jnp.float32(getattr(args, k)[0]) for k in pqn.HPARAMS}
    runner = train.init(jax.random.PRNGKey(0), hp)
    train.update(hp, runner)  # not jitted: the targets' inputs are the rollout's arrays
    rewards, next_q_max, terminated, truncated = (np.asarray(x, np.float64)
                                                  for x in targets_inputs[0])
    network = pqn.QNetwork(env.action_space(env_params).n, args.hidden_size, args.network)
    q_max = np.asarray(network.apply(runner.params, batches[0]).max(-1), np.float64)
    assert_truncation_bootstraps_from_final_observation(
        [(rewards, q_max, next_q_max, terminated, truncated)])
