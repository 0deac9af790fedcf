"""A terminated step does not bootstrap, end to end (issue 29, item 15), in ppo.py and vpg.py: a
short CartPole-v1 run whose episodes end both ways, terminated (the pole falls, the cart leaves the
track) and truncated (a time limit of 20 steps), checked from what the real update computes.

q_learning.py: its no-bootstrap at termination is in q_update, which test_q_learning.py checks
directly (test_q_update_terminal_and_truncated). No run can show it end to end: no agent acts from
a terminal state, so that row of Q stays 0 and max_a Q(terminal, a) is 0 whether or not the update
looks at it (a q_update that ignores `terminated` learned the same FrozenLake tables, measured).
test_frozen_lake_learns replays every agent's transitions through Watkins' update instead: the
terminated flag and the final (pre-reset) cell the file hands its update, end to end."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo
import vpg
from conftest import validated
from runner import envs, flags, sweep

EPISODE_STEPS = 20  # CartPole-v1's time limit here: the first policies' episodes end both ways
RUN = dict(env_id="CartPole-v1", num_envs=8, num_steps=32, num_minibatches=2, update_epochs=2,
           total_timesteps=8 * 32 * 2, hidden_size=16, track=False)  # 2 updates of 256 steps


def record_update(module, monkeypatch):
    """Patch `module` so that its envs truncate episodes after EPISODE_STEPS steps, and every
    update reports, as float64 numpy: compute_gae's inputs and outputs ("gae": rewards, values,
    next_values, terminated, truncated, gamma, lambda, advantages, targets; [T, N] but the two
    scalars), the observations each step's next value is taken of ("final": [N, 4] per step, the
    final observations before any auto-reset) and what each loss_fn call trains on ("loss":
    terminated, rewards, targets; [B] flattened minibatch rows)."""
    make, gae, loss_fn = envs.make_env, module.compute_gae, module.loss_fn
    value = module.ActorCritic.value
    records = {"gae": [], "loss": [], "final": []}

    def report(name, *arrays):
        jax.debug.callback(lambda *xs: records[name].append([np.asarray(x, np.float64)
                                                             for x in xs]), *arrays, ordered=True)

    def short_make(args):
        env, env_params = make(args)
        return env, env_params.replace(max_steps_in_episode=EPISODE_STEPS)

    def recording_gae(*inputs):  # make_train looks these up when it traces the update
        advantages, targets = gae(*inputs)
        report("gae", *inputs, advantages, targets)
        return advantages, targets

    def recording_value(self, obs):  # the rollout's V(final observation), step by step
        report("final", obs)
        return value(self, obs)

    def recording_loss(*args):  # (..., batch: Transition, advantages, targets)
        i = next(i for i, arg in enumerate(args) if isinstance(arg, module.Transition))
        batch, _, targets = args[i:i + 3]
        report("loss", batch.terminated, batch.reward, targets)
        return loss_fn(*args)

    monkeypatch.setattr(envs, "make_env", short_make)
    monkeypatch.setattr(module, "compute_gae", recording_gae)
    monkeypatch.setattr(module.ActorCritic, "value", recording_value)
    monkeypatch.setattr(module, "loss_fn", recording_loss)
    return records


def gae_float64(rewards, values, next_values, terminated, truncated, gamma, lam):
    """GAE(lambda) one step at a time: a terminated step's target is its reward alone (next
    value 0), a truncated one bootstraps from V(final observation); the recursion stops at both."""
    advantages, running = np.zeros_like(rewards), np.zeros_like(rewards[0])
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * np.where(terminated[t] > 0, 0.0, next_values[t]) - values[t]
        running = delta + gamma * lam * np.where((terminated[t] > 0) | (truncated[t] > 0), 0.0,
                                                 running)
        advantages[t] = running
    return advantages, advantages + values


@pytest.mark.parametrize("module", [ppo, vpg], ids=["ppo", "vpg"])
def test_terminated_steps_do_not_bootstrap(module, monkeypatch):
    """From inside the real update (make_train's train under jit, one seed):
    - the flags are the env's: a step is terminated exactly where its final observation is past
      CartPole's limits (|x| > 2.4 or |theta| > 12 degrees), so a truncation is not one;
    - compute_gae's outputs equal a float64 GAE of its inputs in which terminated steps have
      next value 0 (1e-5: float32 rounding over 32 steps of O(1) values);
    - what the loss trains on: at every terminated step the value target is the reward (1.0)
      alone, not 1 + gamma V(final observation), and compute_gae was handed exactly those steps
      as terminated;
    - and the check can fail: bootstrapping through termination would move every terminated
      step's target by gamma |V(final observation)|, measured 0.0065 to 0.2 here; at least 8
      terminated steps (measured 14 in the 2 updates) and 8 of them by more than 100x the
      tolerance, beside at least 4 truncated ones (measured 13), which must bootstrap. Copies of
      each file fail it with GAE bootstrapping through termination, with the update handing
      compute_gae (terminated or truncated) as terminated, and with every episode end handed
      to it as a truncation."""
    records = record_update(module, monkeypatch)
    args = validated(module, **RUN)
    assert not args.normalize_obs  # the final observations below are the env's own
    hp = {k: jnp.float32(v) for k, v in flags.grid(args)[0].items()}
    key = jax.random.PRNGKey(0)
    train = jax.jit(sweep.build_train(args)).lower(key, hp).compile(args.algorithm.COMPILER_OPTIONS)
    jax.block_until_ready(train(key, hp))  # compiled as the runner does (the file's options)
    assert len(records["gae"]) == 2 and len(records["loss"]) > 0, records.keys()

    x_limit, theta_limit = 2.4, 12 * 2 * np.pi / 360  # gymnax CartPole's EnvParams
    final_obs = np.stack([obs for (obs,) in records["final"]]).reshape(2, RUN["num_steps"], -1, 4)
    for (*_, terminated, _, _, _, _, _), obs in zip(records["gae"], final_obs):
        fell = (np.abs(obs[..., 0]) > x_limit) | (np.abs(obs[..., 2]) > theta_limit)
        np.testing.assert_array_equal(terminated > 0, fell)
    fallen_rows = 0
    for terminated, rewards, targets in records["loss"]:
        fell = terminated > 0
        np.testing.assert_allclose(targets[fell], rewards[fell], rtol=0, atol=1e-5)
        fallen_rows += fell.sum()

    counts = np.zeros(3, int)  # terminated steps, those the variant moves, truncated ones
    for *inputs, advantages, targets in records["gae"]:
        rewards, values, next_values, terminated, truncated, gamma, lam = inputs
        expected = gae_float64(*inputs)
        np.testing.assert_allclose(advantages, expected[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(targets, expected[1], rtol=1e-5, atol=1e-5)
        ended = terminated > 0
        bootstrapped = gae_float64(rewards, values, next_values, np.zeros_like(terminated),
                                   np.maximum(terminated, truncated), gamma, lam)
        gap = np.abs(bootstrapped[1] - expected[1])[ended]
        np.testing.assert_allclose(gap, gamma * np.abs(next_values[ended]), rtol=1e-9)
        counts += [ended.sum(), (gap > 1e-3).sum(), ((truncated > 0) & ~ended).sum()]
    terminated_steps, moved, truncated_steps = counts  # measured 14, 14, 13 (both files)
    assert terminated_steps >= 8 and moved >= 8 and truncated_steps >= 4, counts
    # The loss calls cover whole batches (an epoch's minibatches; vpg's policy step): compute_gae
    # was handed the falls as terminated, no more (a truncation passed as one), no fewer.
    rows, steps = sum(r[0].size for r in records["loss"]), sum(r[0].size for r in records["gae"])
    assert rows % steps == 0 and fallen_rows == rows // steps * terminated_steps, (
        rows, steps, fallen_rows, terminated_steps)
