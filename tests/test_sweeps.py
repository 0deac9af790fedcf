"""Hyperparameter sweeps (ppo.py, vpg.py): every combination of the float flags' values trains in
one compiled program, and configuration k of a sweep computes what a single run of k computes."""
import dataclasses
import warnings

import numpy as np
import pytest

import ppo
from conftest import assert_usage_error

TINY = dict(env_id="CartPole-v1", num_envs=4, num_steps=16, num_minibatches=2,
            total_timesteps=4 * 16 * 3, num_seeds=2, track=False)
SWEEP = dict(learning_rate=(1e-3, 5e-3), gamma=(0.9, 0.99))


@pytest.mark.parametrize("module", [ppo], ids=lambda m: m.__name__)  # the runner of all three
def test_sweep_configuration_equals_its_single_run(module):
    """A 2 x 2 grid x 2 seeds on 2 devices, then every configuration alone: the same seed keys,
    so the first update agrees to 1e-5 (another layout may round differently by an ulp) and the
    final returns are the same."""
    args = module.validate(module.Args(**TINY, **SWEEP))
    configs = module.grid(args)
    assert [(c["learning_rate"], c["gamma"]) for c in configs] == [
        (1e-3, 0.9), (1e-3, 0.99), (5e-3, 0.9), (5e-3, 0.99)]  # the first flag varies slowest
    _, sweep, timing = module.run(args)
    assert timing["devices"] == 2 and sweep["episode_return"].shape == (4, 2, 3)
    for c, config in enumerate(configs):  # one program for all: the values are traced
        one = dataclasses.replace(args, **{k: (v,) for k, v in config.items()})
        _, single, _ = module.run(one)
        for key in single:
            np.testing.assert_allclose(sweep[key][c, :, 0], single[key][:, 0], rtol=1e-5,
                                       atol=1e-6, err_msg=f"{config} {key}")
        np.testing.assert_allclose(module.final_returns({k: v[c] for k, v in sweep.items()}),
                                   module.final_returns(single), rtol=1e-5, err_msg=str(config))
    # The values are traced, not baked in: different configurations give different losses.
    losses = np.asarray(sweep["loss/value"])[:, 0, -1]
    assert len(set(losses.tolist())) == 4, losses


def test_summary_rows_best_first():
    args = ppo.validate(ppo.Args(**TINY, learning_rate=(1e-3, 2e-3, 3e-3), ent_coef=(0.0, 0.01)))
    finals = np.array([[10.0, 12.0], [50.0, 52.0], [30.0, 30.0],
                       [90.0, 80.0], [20.0, 20.0], [70.0, 71.0]])
    metrics = {"episode_return": np.repeat(finals.reshape(12, 1), 3, axis=1),  # [runs, updates]
               "env_steps": np.tile([64, 128, 192], (12, 1))}
    timing = dict(devices=2, span=1, compile_s=1.0, cached=False, run_s=2.0, sps=3.0)
    lines = ppo.summary(args, metrics, timing).splitlines()
    assert lines[0].startswith("ppo on CartPole-v1: 6 configurations x 2 seeds x")
    assert lines[1].startswith("flags: total_timesteps=192 num_envs=4 ")  # resolved; not swept
    assert "learning_rate" not in lines[1] and " vf_coef=0.5 " in lines[1]
    assert lines[2].split(" | ")[:2] == ["learning_rate", "ent_coef"]
    rows = [line.split(" | ") for line in lines[3:9]]
    assert [(r[0], r[1]) for r in rows] == [("0.002", "0.01"), ("0.003", "0.01"),
                                            ("0.001", "0.01"), ("0.002", "0"),
                                            ("0.003", "0"), ("0.001", "0")]
    assert rows[0][2].startswith("85 [80, 90]") and rows[0][4] == "80"


def test_final_return_is_the_last_episodes_where_none_ended_at_the_end():
    """A run's final return: the mean over the last 5% of updates (here the last 2 of 40) of
    those that ended episodes; where none did (a Brax task whose 1000-step episodes are all cut
    at once, none falling), the last update's that did; NaN where no episode ever ended. No
    warning either way."""
    returns = np.full((3, 40), np.nan)
    returns[0, [10, 38]] = 5.0, 7.0  # one update of the window
    returns[1, [9, 19, 29]] = 1.0, 2.0, 3.0  # none in the window
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        finals = ppo.final_returns({"episode_return": returns})
    np.testing.assert_array_equal(finals, [7.0, 3.0, np.nan])


@pytest.mark.parametrize("script, flags, flag", [
    ("ppo.py", ["--num-envs", "4", "8"], "--num-envs"),
    ("ppo.py", ["--update-epochs", "2", "4"], "--update-epochs"),
    ("vpg.py", ["--total-timesteps", "1000", "2000"], "--total-timesteps"),
    ("ppo.py", ["--learning-rate", "1e-3", "-1e-3"], "--learning-rate"),
    ("vpg.py", ["--gamma", "0.9", "1.5"], "--gamma"),
    # one configuration twice (its folder, events and model would be shared)
    ("ppo.py", ["--learning-rate", "2.5e-3", "1e-3", "0.0025"], "--learning-rate"),
    ("sac.py", ["--gamma", "0.99", "0.9900000001"], "--gamma"),
])
def test_one_value_flags_refused_before_compiling(script, flags, flag, tmp_path):
    assert_usage_error(script, flags, flag, tmp_path)
