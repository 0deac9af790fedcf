"""Per-environment presets (ppo.py, vpg.py): what each env resolves to, a flag beating its preset,
MinAtar's CNN on batches of any leading shape and in one update of each file, a short MinAtar run
that learns, and --capture-gif."""
import dataclasses
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import ppo
import vpg
from conftest import assert_learns, assert_usage_error, validated
from runner import cli, evaluation, files, flags, sweep

# (module, env id) -> the values validate resolves, with no flag given. Rules that follow
# --num-envs: num_steps = clip(2048 // num_envs, 16, 128); minibatches of ~512 samples; budget
# max(300k, 1.5 x episode limit x num_envs).
RESOLVED = {
    (ppo, "CartPole-v1"): dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=4,
                               learning_rate=(2.5e-3,), gamma=(0.99,), clip_coef=(0.1,),
                               total_timesteps=300_000, network="mlp", hidden_size=64,
                               activation="tanh", normalize_obs=False, num_segments=10),
    (ppo, "Pendulum-v1"): dict(num_envs=16, num_steps=256, num_minibatches=8, update_epochs=10,
                               learning_rate=(1e-3,), gamma=(0.95,), clip_coef=(0.2,),
                               total_timesteps=300_000, network="mlp", normalize_obs=True,
                               normalize_reward=True),
    (ppo, "Breakout-MinAtar"): dict(num_envs=64, num_steps=128, num_minibatches=8,
                                    update_epochs=4, learning_rate=(5e-3,), gamma=(0.99,),
                                    clip_coef=(0.2,), ent_coef=(0.05,), network="mlp",
                                    hidden_size=64, activation="relu",
                                    total_timesteps=3_000_000),
    # The per-game MinAtar presets of MINATAR.md's table: the CNN where the MLP does not learn.
    **{(ppo, game): dict(network="mlp", update_epochs=4, total_timesteps=3_000_000)
       for game in ("SpaceInvaders-MinAtar",)},
    **{(ppo, game): dict(num_envs=64, num_steps=128, num_minibatches=8, network="cnn",
                         update_epochs=2, learning_rate=(5e-3,), total_timesteps=1_500_000)
       for game in ("Asterix-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar")},
    (vpg, "CartPole-v1"): dict(num_envs=32, num_steps=64, num_minibatches=4, update_epochs=4,
                               learning_rate=(2.5e-3,), total_timesteps=300_000,
                               activation="tanh"),
    (vpg, "Pendulum-v1"): dict(num_envs=8, num_steps=32, learning_rate=(2.5e-3,), gamma=(0.95,),
                               total_timesteps=1_000_000, normalize_obs=True),
}


@pytest.mark.parametrize("module, env_id", RESOLVED, ids=lambda x: getattr(x, "__name__", x))
def test_presets_resolve_before_anything_compiles(module, env_id):
    args = validated(module, env_id=env_id)
    assert {k: getattr(args, k) for k in RESOLVED[module, env_id]} == RESOLVED[module, env_id]
    assert not [f for f, v in vars(args).items() if v is None and f not in (
        "resume", "load_model", "coordinator_address", "num_processes", "process_id",
        "devices_per_run", "brax_backend", "pbt_interval", "pbt_burn_in")]  # (unset: chosen by
    # the machine; a gymnax env; no --pbt)
    assert flags.validate(args) == args  # resolving again changes nothing


@pytest.mark.parametrize("env_id, kind", [("MountainCarContinuous-v0", "box"),
                                          ("Catch-bsuite", "discrete")])
def test_an_env_without_a_preset_takes_its_action_spaces(env_id, kind):
    assert env_id not in ppo.PRESETS
    args = validated(ppo, env_id=env_id)
    assert {k: getattr(args, k) for k in ppo.PRESETS[kind]} == {
        k: (v,) if k in ppo.HPARAMS else v for k, v in ppo.PRESETS[kind].items()}


def test_a_flag_beats_its_preset():
    args = validated(ppo, env_id="Breakout-MinAtar", num_envs=16, learning_rate=(1e-3,),
                     network="cnn")
    assert (args.num_envs, args.learning_rate, args.network) == (16, (1e-3,), "cnn")
    assert (args.num_steps, args.activation) == (128, "relu")  # the rest: the preset's
    # --num-envs 2048 alone (on CartPole-v1's preset) still sets what solves it: the rules give
    # 16 steps, 32 minibatches of 1024 and 1.5 x 500 x 2048 steps.
    args = validated(ppo, num_envs=2048)
    assert (args.num_steps, args.num_minibatches, args.total_timesteps) == (16, 32, 1_536_000)


@pytest.mark.parametrize("module", [ppo, vpg], ids=lambda m: m.__name__)
def test_cnn_on_any_leading_shape_and_in_one_update(module):
    """MinAtar's network: one torso under both heads, with the parameters it should have; the
    torso equals a plain nn.Conv (3x3, VALID) and nn.Dense on fresh random inputs; the value of
    [T, N, 10, 10, C] observations is that of each alone; a short Breakout-MinAtar run with
    --network cnn updates it and logs finite losses."""
    import flax.linen as nn

    network = module.ActorCritic(action_dim=3, continuous=False, network="cnn")
    obs = jax.random.bernoulli(jax.random.PRNGKey(0), 0.3, (3, 5, 10, 10, 4)).astype(jnp.float32)
    params = network.init(jax.random.PRNGKey(1), obs[0])
    sizes = {name: sum(x.size for x in jax.tree.leaves(tree))
             for name, tree in params["params"].items()}
    assert sizes == {"torso": 3 * 3 * 4 * 16 + 16 + 8 * 8 * 16 * 128 + 128,
                     "actor": 128 * 3 + 3, "critic": 128 + 1}
    torso = params["params"]["torso"]

    class Reference(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(16, (3, 3), padding="VALID")(x))
            return nn.relu(nn.Dense(128)(x.reshape(*x.shape[:-3], -1)))

    conv, dense = torso["Dense_0"], torso["Dense_1"]
    reference = {"params": {"Conv_0": {"kernel": conv["kernel"].reshape(3, 3, 4, 16),
                                       "bias": conv["bias"]}, "Dense_0": dense}}
    for seed in range(3):
        x = jax.random.normal(jax.random.PRNGKey(10 + seed), (7, 10, 10, 4))
        np.testing.assert_allclose(module.MinAtarCNN().apply({"params": torso}, x),
                                   Reference().apply(reference, x), rtol=1e-5, atol=1e-5)
    values = network.apply(params, obs, method=module.ActorCritic.value)
    assert values.shape == (3, 5)
    alone = jax.vmap(jax.vmap(lambda o: network.apply(params, o[None], method="value")[0]))(obs)
    np.testing.assert_allclose(values, alone, rtol=1e-5, atol=1e-6)

    args = validated(module, env_id="Breakout-MinAtar", network="cnn", num_envs=8, num_steps=16,
                     num_minibatches=2, update_epochs=1, total_timesteps=8 * 16 * 2, num_seeds=2,
                     track=False)
    state, metrics, _ = sweep.run(args)
    for key in ("loss/policy", "loss/value", "loss/entropy"):
        assert np.all(np.isfinite(metrics[key])), key
    init = jax.vmap(network.init)(jax.random.split(jax.random.PRNGKey(2), 2), obs[0, :2])
    assert jax.tree.structure(init) == jax.tree.structure(state.params)


# What a correct PPO reaches on Breakout-MinAtar with its preset on a budget that fits the suite:
# 3.7 to 4.3 on each of 4 other seeds (--seed 7), from 0.38 in the first update; a uniform random
# policy scores 0.41 a game (benchmarks/bench_envs.py's random_returns). Judged as test_ppo.py's
# rows (conftest.learning_verdict); on seed bases 1 (the suite's), 100, 200, 2026-11-27, Intel
# Xeon (python benchmarks/learning_rows.py): [4.2, 4.2], [4.5, 4.3], [4.7, 4.1] (margins: 1.2 on
# the median, 2.1 on the floor).
LEARNING = dict(args=dict(env_id="Breakout-MinAtar", total_timesteps=8192 * 12), budget=98_304,
                seeds=2, median=3.0, most=(2, 2.0), rise=2.0)


def test_minatar_return_rises_above_the_random_policy():
    assert_learns(ppo, LEARNING)


def test_capture_gif_draws_an_episode(tmp_path, capsys):
    """MinAtar, drawn with matplotlib, from the command line: test_ppo's Breakout-MinAtar run,
    whose compiled program comes from the session's cache."""
    flags = ["--env-id", "Breakout-MinAtar", "--num-seeds", 2, "--num-envs", 8, "--num-steps", 32,
             "--num-minibatches", 2, "--update-epochs", 1, "--hidden-size", 16,
             "--total-timesteps", 8 * 32 * 4, "--no-track", "--capture-gif", "--log-dir", tmp_path]
    with mock.patch.object(sys, "argv", ["ppo.py", *map(str, flags)]):
        cli.main(ppo)
    (gif,) = tmp_path.glob("*/episode.gif")
    assert f"saved {gif}" in capsys.readouterr().out
    with Image.open(gif) as image:
        assert image.n_frames >= 2 and image.size[0] >= 100


def test_capture_gif_draws_classic_control(tmp_path):
    """CartPole-v1, drawn with pygame (pinned in the requirements): an episode of an untrained
    policy (short: gymnax draws each frame with matplotlib, ~0.4 s a frame here)."""
    args = validated(ppo, env_id="CartPole-v1", hidden_size=16, num_seeds=1)
    hp = {k: jnp.float32(v) for k, v in flags.grid(args)[0].items()}
    state = jax.tree.map(lambda x: x[None], sweep.build_train(args).init(jax.random.PRNGKey(0), hp))
    gif = evaluation.capture_gif(str(tmp_path / "episode.gif"), args, state)
    with Image.open(gif) as image:
        assert image.n_frames >= 5 and image.size[0] >= 100


def test_capture_gif_of_an_env_it_cannot_draw(tmp_path):
    """gymnax has no drawing of DeepSea: one line, exit 2, before anything compiles. (q_learning,
    whose envs are its own, offers no --capture-gif: test_layout.py.)"""
    assert_usage_error("ppo.py", ["--env-id", "DeepSea-bsuite", "--capture-gif"], "--capture-gif",
                       tmp_path)


def test_capture_gif_is_judged_on_the_saved_env(tmp_path):
    """--load-model and --resume take the saved run's env: --capture-gif is refused for the saved
    DeepSea-bsuite, though the default env typed (CartPole-v1) could be drawn."""
    import json

    import flax.serialization

    args = validated(ppo, env_id="DeepSea-bsuite", track=False)
    model = tmp_path / "model.msgpack"
    model.write_bytes(flax.serialization.msgpack_serialize(
        {"format": files.FORMAT, "file": "ppo.py", "args": json.dumps(dataclasses.asdict(args))}))
    assert_usage_error("ppo.py", ["--load-model", model, "--capture-gif"], "DeepSea", tmp_path)
    metrics = {"env_steps": np.zeros((4, 2)), "episode_return": np.zeros((4, 2))}
    files.write_checkpoint(str(tmp_path), args, {}, metrics, 5)
    assert_usage_error("ppo.py", ["--resume", tmp_path, "--capture-gif"], "DeepSea", tmp_path)
