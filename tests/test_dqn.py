"""DQN: the Double DQN and the plain targets against a hand computation, the target network's
copies and Polyak steps at their interval only, a time limit stored as no termination with its
final observation, the loss's gradient on the online parameters alone, the epsilon schedule and
rule, --anneal-lr's schedule over exactly the run's gradient steps, CartPole-v1 learnt, and bad
input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dqn
from conftest import (
    assert_anneals_linearly,
    assert_learns,
    assert_usage_error,
    help_text,
    validated,
)
from runner import envs, flags, sweep

# One table, judged as the other files' (conftest.learning_verdict: the seeds' median final return,
# k of them at a floor, the rise from the first 10% of updates to the last). CartPole-v1's preset
# at 200k steps (not 500k: epsilon falls over the first 100k), 2 seeds; random play scores about
# 22. Seed bases 1 (the suite's), 100, 200, 2026-12-02, Intel Xeon, 2 devices (python
# benchmarks/learning_rows.py --rows dqn:cartpole --bases 1 100 200): medians 275.1, 254.4,
# 378.4, worst seed 249.4 (margins: 54 on the median, 149 on the floor; the preset's learning
# rate annealed over these 200k steps, its buffer of 50,000 a quarter of them).
LEARNING = {
    "cartpole": dict(args=dict(env_id="CartPole-v1", total_timesteps=200_000), budget=200_000,
                     seeds=2, median=200.0, most=(2, 100.0), rise=150.0),
}
TINY = dict(num_envs=2, num_steps=1, train_frequency=1, batch_size=2, buffer_size=8,
            learning_starts=0, hidden_sizes=(8,), track=False)


def hp_of(args):
    return {k: jnp.float32(v) for k, v in flags.grid(args)[0].items()}


def test_targets_match_a_hand_computation():
    """A batch of 3: Double DQN takes the online network's argmax at s' and the target network's
    value of it; DQN the target network's max; a terminated step its reward alone."""
    reward, terminated = np.float32([1.0, -0.5, 2.0]), np.float32([0.0, 0.0, 1.0])
    online = np.float32([[1.0, 3.0, 2.0], [0.5, 0.1, 0.9], [4.0, 0.0, 0.0]])
    target = np.float32([[5.0, 2.0, 7.0], [1.0, 6.0, 3.0], [9.0, 9.0, 9.0]])
    gamma = 0.9
    double = dqn.td_target(reward, terminated, online, target, gamma, double=True)
    plain = dqn.td_target(reward, terminated, online, target, gamma, double=False)
    # online argmax: actions 1, 2, 0 -> target values 2, 3, (terminal); target max: 7, 6
    np.testing.assert_allclose(double, [1.0 + 0.9 * 2.0, -0.5 + 0.9 * 3.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(plain, [1.0 + 0.9 * 7.0, -0.5 + 0.9 * 6.0, 2.0], rtol=1e-6)


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_the_target_network_moves_at_its_interval_only(tau):
    """2 envs, a gradient step after every step of them, the target's interval 4 env steps: after
    steps 2, 4 and 6 of the envs the target moves a step tau toward the online parameters (a
    copy at tau 1), and between them it stays as it was, while the online parameters move every
    step."""
    args = validated(dqn, **TINY, total_timesteps=2 * 6, target_update_interval=4, tau=(tau,))
    train = sweep.build_train(args)
    hp = hp_of(args)
    update = jax.jit(train.update)
    state = train.init(jax.random.PRNGKey(0), hp)
    for step in range(1, 7):
        before = state
        state, _ = update(hp, state)
        moved = jax.tree.map(lambda t, o: (1 - tau) * t + tau * o, before.target_params,
                             state.params)
        expected = moved if step % 2 == 0 else before.target_params
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                     state.target_params, expected)
        assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before.params),
                                                            jax.tree.leaves(state.params)))


def test_a_time_limit_is_stored_as_no_termination_with_its_final_observation(monkeypatch):
    """CartPole-v1 cut after 3 steps, 2 envs, 5 steps: the truncated step (step 2) is stored with
    terminated 0 (a time limit is no end: its target bootstraps) and, as next_obs, the
    observation that step led to (the env's own step from the stored observation and action),
    not the next episode's first, which step 3 starts from; the other steps chain."""
    from gymnax.environments.classic_control.cartpole import EnvState

    make = envs.make_env

    def cut_after_3(args):
        env, env_params = make(args)
        return env, env_params.replace(max_steps_in_episode=3)

    monkeypatch.setattr(envs, "make_env", cut_after_3)
    args = validated(dqn, **{**TINY, "num_steps": 5, "buffer_size": 10, "learning_starts": 100},
                     total_timesteps=10)
    train = sweep.build_train(args)
    hp = hp_of(args)
    state = jax.jit(train.update)(hp, train.init(jax.random.PRNGKey(0), hp))[0]
    buf = jax.tree.map(np.asarray, state.buffer)  # [envs, slots, ...]: slot t holds step t
    assert (buf.terminated == 0).all()  # (CartPole cannot fall in 3 steps from its start)
    for t in (0, 1, 3):
        np.testing.assert_array_equal(buf.next_obs[:, t], buf.obs[:, t + 1])
    env, env_params = cut_after_3(args)
    for e in range(2):
        x, x_dot, theta, theta_dot = buf.obs[e, 2]
        cart = EnvState(x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=0)
        final = env.step_env(jax.random.PRNGKey(0), cart, buf.action[e, 2], env_params)[0]
        np.testing.assert_allclose(buf.next_obs[e, 2], final, rtol=1e-5, atol=1e-6)
        assert np.abs(buf.next_obs[e, 2] - buf.obs[e, 3]).max() > 1e-3  # a fresh start follows


@pytest.mark.parametrize("loss", ["huber", "mse"])
def test_the_loss_reaches_the_online_parameters_alone(loss):
    """No gradient reaches the target network, nor, through the online network's choice of a',
    the online parameters: the gradient is that of the loss against a constant target."""
    args = validated(dqn, **TINY, total_timesteps=2, loss=loss)
    network = dqn.QNetwork(2, (8,))
    rng = np.random.default_rng(0)
    params, target_params = (network.init(jax.random.PRNGKey(k), jnp.zeros(4)) for k in (1, 2))
    batch = dqn.Transition(obs=jnp.float32(rng.normal(size=(16, 4))),
                           action=jnp.int32(rng.integers(0, 2, 16)),
                           reward=jnp.float32(rng.normal(size=16) * 3),
                           next_obs=jnp.float32(rng.normal(size=(16, 4))),
                           terminated=jnp.float32(rng.random(16) < 0.3))
    hp = hp_of(args)
    grads = jax.grad(dqn.loss_fn, argnums=(0, 1), has_aux=True)(params, target_params, network,
                                                                 hp, args, batch)[0]
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads[1]))
    target = dqn.td_target(batch.reward, batch.terminated, network.apply(params, batch.next_obs),
                           network.apply(target_params, batch.next_obs), hp["gamma"], True)
    error = {"huber": lambda q: jnp.where(jnp.abs(q - target) <= 1, 0.5 * (q - target) ** 2,
                                          jnp.abs(q - target) - 0.5),
             "mse": lambda q: (q - target) ** 2}[loss]

    def reference(params):
        q = network.apply(params, batch.obs)[jnp.arange(16), batch.action]
        return error(q).mean()

    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grads[0],
                 jax.grad(reference)(params))


def test_epsilon_schedule_and_rule():
    """Linear from start_e to end_e over decay_steps, then end_e; epsilon 0 acts greedily, 1
    uniformly (each of 3 actions about a third of 30,000 draws)."""
    schedule = [float(dqn.epsilon_schedule(t, 1.0, 0.1, 100)) for t in (0, 50, 100, 1000)]
    np.testing.assert_allclose(schedule, [1.0, 0.55, 0.1, 0.1], rtol=1e-6)
    q = jnp.float32([[0.1, 0.9, 0.3]] * 30_000)
    keys = jax.random.split(jax.random.PRNGKey(0), 30_000)
    greedy = jax.vmap(dqn.epsilon_greedy, in_axes=(0, 0, None))(keys, q, 0.0)
    uniform = jax.vmap(dqn.epsilon_greedy, in_axes=(0, 0, None))(keys, q, 1.0)
    assert (np.asarray(greedy) == 1).all()
    np.testing.assert_allclose(np.bincount(np.asarray(uniform), minlength=3) / 30_000, 1 / 3,
                               atol=0.015)


@pytest.mark.parametrize("case", LEARNING)
def test_learns(case):
    assert_learns(dqn, LEARNING[case])


def test_help_lists_every_flag_with_its_doc(capsys):
    text = help_text(dqn, capsys)
    for phrase in ["Double DQN's target", "steps of every env between two gradient steps",
                   "(default: 500 on CartPole-v1; per env: PRESETS in dqn.py)"]:
        assert phrase in text, phrase
    assert "--brax-backend" not in text


@pytest.mark.parametrize("typed, flag", [
    (["--env-id", "Pendulum-v1"], "DQN needs discrete actions"),
    (["--buffer-size", "10001"], "--buffer-size"),
    (["--batch-size", "100"], "--batch-size"),
    (["--hidden-sizes", "0"], "--hidden-sizes"),
    (["--network", "cnn"], "--network cnn needs image observations"),
    (["--tau", "0"], "--tau"),
    (["--exploration-fraction", "0"], "--exploration-fraction"),
])
def test_bad_input_is_one_line_exit_2(typed, flag, tmp_path):
    assert_usage_error("dqn.py", typed, flag, tmp_path)


@pytest.mark.parametrize("learning_starts, train_frequency", [(0, 1), (6, 2)])
def test_anneal_lr_spans_exactly_the_runs_gradient_steps(learning_starts, train_frequency):
    """--anneal-lr: make_tx's learning rate falls linearly over as many steps as the run takes
    gradient steps (every train_frequency-th step of the envs from the one reaching
    learning_starts on, counted here step by step), which the run's Adam counts: on a constant
    gradient (Adam's step then exactly lr) the k-th step is lr (1 - k / steps), the one after
    the run's last is 0."""
    args = validated(dqn, **{**TINY, "learning_starts": learning_starts,
                             "train_frequency": train_frequency},
                     total_timesteps=2 * 12, anneal_lr=True)
    hp = hp_of(args)
    train = sweep.build_train(args)
    env_steps = train.num_updates * args.num_steps  # of each env
    steps = sum(step * args.num_envs >= learning_starts and step % train_frequency == 0
                for step in range(1, env_steps + 1))
    assert 0 < steps < env_steps or (learning_starts, train_frequency) == (0, 1)
    state = jax.jit(train)(jax.random.PRNGKey(0), hp)[0]
    assert int(state.opt_state[0].count) == steps  # Adam's
    assert_anneals_linearly(dqn.make_tx(args, hp, train.num_updates), hp["learning_rate"], steps)
