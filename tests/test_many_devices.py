"""One run over several devices (the runner's mesh axis "batch"): its envs split over them, its
gradients and every statistic of its batch averaged over all of them. One update on 2 devices is
the update on 1 (the same env keys, the same minibatches), in every file; runs spanning devices
several to a device are each the run alone; the parameters stay bitwise the same on every device;
bad layouts are one line before anything compiles. (Two processes of 1 device each, and their model
played on 1 device: test_distributed.py; a 1-seed run that solves CartPole-v1 over 2 devices:
test_ppo.py; a checkpoint of a run over 2 devices resumed: test_long_runs.py; q_learning's agents
split: test_devices_and_cache.py.)"""
import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import dqn
import ppo
import ppo_rnn
import pqn
import q_learning as ql
import vpg
from conftest import assert_usage_error, validated
from runner import devices, sweep

pytestmark = pytest.mark.usefixtures("quicker_compiles")  # (conftest: LLVM -O0)

# One update of 8 envs x 32 steps in 2 minibatches x 2 epochs: CartPole-v1's random episodes
# (about 22 steps) end in it, so episode_return is finite in what is compared.
ONE_UPDATE = dict(num_seeds=1, num_envs=8, num_steps=32, num_minibatches=2, update_epochs=2,
                  total_timesteps=8 * 32, hidden_size=16, eval_episodes=0, track=False,
                  env_id="CartPole-v1")
NORMALIZED = dict(normalize_obs=True, normalize_reward=True)
MODULES = {"ppo": (ppo, NORMALIZED), "vpg": (vpg, NORMALIZED), "pqn": (pqn, {}),
           "ppo_rnn": (ppo_rnn, NORMALIZED)}
# q_learning: 64 agents that slip, 100 steps an update (its episodes end within one).
QL_UPDATE = dict(num_seeds=1, num_agents=64, num_steps=100, total_timesteps=100, slip=0.2,
                 track=False)
# dqn: a gradient step after each of 32 steps of 8 envs, from a buffer of 8 slots an env
DQN_UPDATE = dict(num_seeds=1, num_envs=8, num_steps=32, total_timesteps=8 * 32, train_frequency=1,
                  learning_starts=0, buffer_size=64, batch_size=16, hidden_sizes=(16,),
                  target_update_interval=64, eval_episodes=0, track=False)


def assert_same_run(one, two, rtol=1e-5, atol=1e-6):
    """(state, metrics) of the same runs on two layouts: equal to float32 rounding, episode
    returns finite."""
    (one_state, one), (two_state, two) = one, two
    assert set(one) == set(two) and np.isfinite(one["episode_return"]).all(), one
    for key in one:
        np.testing.assert_allclose(two[key], one[key], rtol=rtol, atol=atol, err_msg=key)
    # The whole state: parameters, optimiser state, statistics, env states (joined from devices)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 two_state, one_state)


def layouts(module, args, *num_devices):
    """(state, metrics) of sweep.run(args) on each device count, and each run's span."""
    results = [sweep.run(args, num_devices=n) for n in num_devices]
    return [(state, metrics) for state, metrics, _ in results], [t["span"] for *_, t in results]


@pytest.mark.parametrize("name", ["vpg", "pqn", "q_learning", "dqn"])  # ppo, ppo_rnn: the next
def test_one_update_over_two_devices_is_the_update_on_one(name):
    """2 minibatches x 2 epochs: a run's minibatches hold the same samples on any layout (each
    block of envs shuffled by a key of its own; q_learning: each agent's draws by its own key;
    dqn: each env's share of a batch drawn by its own key from its own slots),
    its statistics (observation and return normalisation, advantages) over all its envs: one
    update on 2 devices is the update on 1 to float32 rounding, parameters, optimiser state and
    metrics. (Before: each device shuffled its share with the run's key; on 2 devices, another
    set of samples per minibatch.)"""
    if name == "q_learning":
        module, args = ql, validated(ql, **QL_UPDATE)
    elif name == "dqn":
        module, args = dqn, validated(dqn, **DQN_UPDATE)
    else:
        module, own = MODULES[name]
        args = validated(module, **ONE_UPDATE, **own)
    (one, two), spans = layouts(module, args, 1, 2)
    assert spans == [1, 2] and one[1]["env_steps"].shape == (1, 1)
    assert_same_run(one, two)


@pytest.mark.parametrize("name", ["ppo", "ppo_rnn"])
def test_several_runs_per_device_each_spanning_equal_each_run_alone(name):
    """2 seeds x 2 configurations on 2 devices, each run over both (--devices-per-run 2: 4 runs
    vmapped on each device) equal the same 4 runs on one device, 2 updates of 2 epochs (so the
    previous test's check, for ppo and ppo_rnn, several times over). ppo's minibatches are
    blocks of 2 envs (16 steps in 32 minibatches, as `--num-envs 2048` has), 2 blocks on each
    device; ppo_rnn's 2 minibatches of whole envs (its sequences are not cut)."""
    module, own = MODULES[name]
    shape = dict(num_steps=16, num_minibatches=32) if name == "ppo" else dict(num_steps=32)
    fields = {**ONE_UPDATE, **shape, "num_seeds": 2, "total_timesteps": 2 * 8 * shape["num_steps"]}
    args = validated(module, **fields, **own, learning_rate=(1e-3, 2.5e-3),
                     devices_per_run=2)
    alone = sweep.run(dataclasses.replace(args, devices_per_run=None), num_devices=1)
    spanning = sweep.run(args, num_devices=2)
    assert (alone[2]["span"], spanning[2]["span"]) == (1, 2)
    assert alone[1]["env_steps"].shape == (2, 2, 2)
    assert_same_run(alone[:2], spanning[:2])


@pytest.mark.parametrize("name", MODULES)
def test_parameters_stay_bitwise_the_same_on_every_device(name):
    """Each device's own copy of the run's parameters, optimiser state and statistics, after three
    updates of 4 minibatches x 2 epochs (ppo, vpg, ppo_rnn with both normalisations on): bit for
    bit the same (the runner keeps one copy of what is the same on every device: it must be)."""
    module, own = MODULES[name]
    args = validated(module, **{**ONE_UPDATE, "num_minibatches": 4}, **own)
    train = sweep.build_train(args, devices.Shard("batch"))
    hp = {k: np.float32([getattr(args, k)[0]]) for k in module.HPARAMS}
    mesh = Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("runs", "batch"))
    shared = [f for f in ("obs_stats", "return_stats", "params", "opt_state", "key")
              if f in module.RunnerState._fields]

    def each_device(keys, hp):  # three updates of one run; every device's copy, stacked
        state = jax.vmap(train.init)(keys, hp)
        state = jax.lax.fori_loop(0, 3, lambda _, s: jax.vmap(train.update)(hp, s)[0], state)
        return jax.tree.map(lambda x: x[None], [getattr(state, f) for f in shared])

    copies = jax.jit(jax.shard_map(each_device, mesh=mesh, in_specs=P("runs"),
                                   out_specs=P("batch"), check_vma=False))(
        jax.random.split(jax.random.PRNGKey(0), 1), hp)
    for leaf in jax.tree.leaves(jax.device_get(copies)):
        np.testing.assert_array_equal(leaf[0], leaf[1])
    if "obs_stats" in shared:
        assert any(np.any(leaf[0] != 0) for leaf in jax.tree.leaves(copies[0]))  # stats moved


@pytest.mark.parametrize("typed, message", [
    (["--devices-per-run", 3], "--devices-per-run 3 > 2 devices"),
    (["--num-seeds", 1, "--num-envs", 3, "--devices-per-run", 2],
     "--devices-per-run 2: --num-envs 3 does not split into 2 equal shares"),
    # A device's share must itself be a run: 2 envs x 8 steps do not make 4 minibatches of 32.
    (["--num-seeds", 1, "--num-envs", 4, "--num-steps", 8, "--num-minibatches", 32,
      "--devices-per-run", 2], "a device's share of a run: --num-minibatches 32 must divide")])
def test_bad_layouts_are_one_line_before_compiling(typed, message, tmp_path):
    assert_usage_error("ppo.py", typed, message, tmp_path)
