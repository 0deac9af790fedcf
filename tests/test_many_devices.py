"""One run over several devices (the runner's mesh axis "batch"): its envs split over them, its
gradients and every statistic of its batch averaged over all of them. One update on 2 devices is
the update on 1 with the same env keys; the parameters stay bitwise the same on every device; bad
layouts are one line before anything compiles. (Two processes of 1 device each, and their model
played on 1 device: test_distributed.py; a 1-seed run that solves CartPole-v1 over 2 devices:
test_ppo.py; a checkpoint of a run over 2 devices resumed: test_long_runs.py; q_learning's agents
split: test_devices_and_cache.py.)"""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import ppo
import vpg
from conftest import assert_usage_error

ONE_UPDATE = dict(num_seeds=1, num_envs=8, num_steps=16, num_minibatches=1, update_epochs=1,
                  total_timesteps=8 * 16, hidden_size=16, eval_episodes=0, track=False)


@pytest.mark.parametrize("module, flags", [
    (ppo, dict(env_id="Pendulum-v1", normalize_obs=True, normalize_reward=True)),
    (vpg, dict(env_id="CartPole-v1"))], ids=["ppo", "vpg"])
def test_one_update_over_two_devices_is_the_update_on_one(module, flags):
    """One minibatch and one epoch: the 2-device update takes the same gradient step on the same
    rollout (each env's keys are its own whatever the layout) as the 1-device one, its statistics
    (observation and return normalisation, advantages) over all 8 envs; params and metrics agree
    to float32 rounding. ppo runs Pendulum-v1 with both normalisations on; vpg its one policy step
    on the whole batch. (pqn.py's reductions are the same helpers; its exploration keys too.)"""
    args = module.validate(module.Args(**ONE_UPDATE, **flags))
    one_state, one, one_timing = module.run(args, num_devices=1)
    two_state, two, two_timing = module.run(args, num_devices=2)
    assert (one_timing["span"], two_timing["span"]) == (1, 2)
    assert set(one) == set(two) and one["env_steps"].shape == (1, 1)
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 two_state.params, one_state.params)
    # The whole state, env states included (their [envs, ...] leaves joined from both devices).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 two_state, one_state)


def test_parameters_stay_bitwise_the_same_on_every_device():
    """Each device's own copy of the run's parameters, optimiser state and statistics, after three
    updates of 4 minibatches x 2 epochs with both normalisations on: bit for bit the same (the
    runner keeps one copy of what is the same on every device: it must be)."""
    args = ppo.validate(ppo.Args(**{**ONE_UPDATE, "num_minibatches": 4, "update_epochs": 2},
                                 env_id="Pendulum-v1", normalize_obs=True, normalize_reward=True))
    train = ppo.make_train(args, "batch")
    hp = {k: np.float32([getattr(args, k)[0]]) for k in ppo.HPARAMS}
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("runs", "batch"))

    def each_device(keys, hp):  # three updates of one run; every device's copy, stacked
        state = jax.vmap(train.init)(keys, hp)
        state = jax.lax.fori_loop(0, 3, lambda _, s: jax.vmap(train.update)(hp, s)[0], state)
        return jax.tree.map(lambda x: x[None], (state.params, state.opt_state, state.obs_stats,
                                                state.return_stats, state.key))

    copies = jax.jit(jax.shard_map(each_device, mesh=mesh, in_specs=P("runs"),
                                   out_specs=P("batch"), check_vma=False))(
        jax.random.split(jax.random.PRNGKey(0), 1), hp)
    for leaf in jax.tree.leaves(jax.device_get(copies)):
        np.testing.assert_array_equal(leaf[0], leaf[1])
    assert any(np.any(leaf[0] != 0) for leaf in jax.tree.leaves(copies[2]))  # stats moved


@pytest.mark.parametrize("flags, message", [
    (["--devices-per-run", 3], "do not split over 1 processes x 2 devices with "
                               "--devices-per-run 3"),
    (["--num-seeds", 1, "--num-envs", 3, "--devices-per-run", 2],
     "--devices-per-run 2: --num-envs 3 does not split into 2 equal shares"),
    # A device's share must itself be a run: 2 envs x 8 steps do not make 4 minibatches of 32.
    (["--num-seeds", 1, "--num-envs", 4, "--num-steps", 8, "--num-minibatches", 32,
      "--devices-per-run", 2], "a device's share of a run: --num-minibatches 32 must divide")])
def test_bad_layouts_are_one_line_before_compiling(flags, message, tmp_path):
    assert_usage_error("ppo.py", flags, message, tmp_path)
