"""Hyperparameter sweeps (ppo.py, vpg.py): every combination of the float flags' values trains in
one compiled program, and configuration k of a sweep computes what a single run of k computes; a
copy of a file with the runner beside it runs a sweep from the command line as a user would."""
import dataclasses
import shutil
import warnings

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo
from conftest import ALGOS, assert_usage_error, read_scalars, run_script, validated
from runner import flags, reports, sweep

TINY = dict(env_id="CartPole-v1", num_envs=4, num_steps=16, num_minibatches=2,
            total_timesteps=4 * 16 * 3, num_seeds=2, track=False)
SWEEP = dict(learning_rate=(1e-3, 5e-3), gamma=(0.9, 0.99))

# The shapes of test_ppo.py's seed-sweep test: the 2-device program compiles once for both.
COPIED = dict(env_id="CartPole-v1", num_envs=8, num_steps=64, num_minibatches=4,
              total_timesteps=8 * 64 * 10, num_seeds=2, ent_coef=(0.0, 0.01))


def test_a_grid_varies_its_first_flag_slowest():
    args = validated(ppo, **TINY, **SWEEP)
    assert [(c["learning_rate"], c["gamma"]) for c in flags.grid(args)] == [
        (1e-3, 0.9), (1e-3, 0.99), (5e-3, 0.9), (5e-3, 0.99)]


def test_sweep_configuration_equals_its_single_run():
    """A 2-value sweep x 2 seeds on 2 devices (the shapes of COPIED below and of test_ppo.py's
    seed-sweep test: one program for the three), then each configuration alone: the same seed
    keys, so the first update agrees to 1e-5 (another layout may round differently by an ulp)
    and the final returns are the same."""
    args = validated(ppo, **{**COPIED, "learning_rate": (1e-3, 5e-3), "ent_coef": None},
                     track=False)
    configs = flags.grid(args)
    _, swept, timing = sweep.run(args)
    assert timing["devices"] == 2 and swept["episode_return"].shape == (2, 2, 10)
    for c, config in enumerate(configs):  # one program for all: the values are traced
        one = dataclasses.replace(args, **{k: (v,) for k, v in config.items()})
        _, single, _ = sweep.run(one)
        for key in single:
            np.testing.assert_allclose(swept[key][c, :, 0], single[key][:, 0], rtol=1e-5,
                                       atol=1e-6, err_msg=f"{config} {key}")
        np.testing.assert_allclose(reports.final_returns({k: v[c] for k, v in swept.items()}),
                                   reports.final_returns(single), rtol=1e-5, err_msg=str(config))
    # The values are traced, not baked in: different configurations give different losses.
    losses = np.asarray(swept["loss/value"])[:, 0, -1]
    assert len(set(losses.tolist())) == 2, losses


def test_summary_rows_best_first():
    args = validated(ppo, **TINY, learning_rate=(1e-3, 2e-3, 3e-3), ent_coef=(0.0, 0.01))
    finals = np.array([[10.0, 12.0], [50.0, 52.0], [30.0, 30.0],
                       [90.0, 80.0], [20.0, 20.0], [70.0, 71.0]])
    metrics = {"episode_return": np.repeat(finals.reshape(12, 1), 3, axis=1),  # [runs, updates]
               "env_steps": np.tile([64, 128, 192], (12, 1))}
    timing = dict(devices=2, span=1, compile_s=1.0, cached=False, run_s=2.0, sps=3.0)
    lines = reports.summary(args, metrics, timing).splitlines()
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
        finals = reports.final_returns({"episode_return": returns})
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


def test_a_copy_with_the_runner_beside_it_runs_a_sweep_as_in_process(tmp_path):
    """ppo.py copied as mine.py, algos/runner/ beside it, out of the repository, and a
    2-configuration sweep run as a user would: one run directory with its checkpoint, a folder per
    configuration named by its values (also in the hyperparameter text), seed_k below it, a model
    each; a progress line per segment; one summary row per configuration. The same sweep in this
    process, on the same layout, computes it bit for bit: every logged metric and the saved
    parameters."""
    shutil.copy(ALGOS / "ppo.py", tmp_path / "mine.py")
    shutil.copytree(ALGOS / "runner", tmp_path / "runner",
                    ignore=shutil.ignore_patterns("__pycache__"))
    typed = [word for k, v in COPIED.items() if k != "env_id"
             for word in (flags.flag(k), *(v if isinstance(v, tuple) else [v]))]
    proc = run_script(tmp_path / "mine.py", *typed, "--save-model", "--log-dir", tmp_path / "runs",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 configurations x 2 seeds" in proc.stdout
    assert "(episodes of 4 of 4 runs)" in proc.stdout and proc.stdout.count("[mine] steps") == 10
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("CartPole-v1__mine__1__")
    assert (run_dir / "checkpoint.msgpack").is_file()
    config_dirs = sorted(d for d in run_dir.iterdir() if d.is_dir())
    assert [d.name for d in config_dirs] == ["ent_coef=0", "ent_coef=0.01"]

    args = validated(ppo, track=False, **COPIED)
    state, metrics, _ = sweep.run(args, num_devices=2)
    for c, config_dir in enumerate(config_dirs):
        payload = flax.serialization.msgpack_restore((config_dir / "model.msgpack").read_bytes())
        jax.tree.map(np.testing.assert_array_equal, payload["params"],
                     jax.device_get(jax.tree.map(lambda x: x[c], state.params)))
        for k in range(2):
            for key, tag in [("loss/value", "losses/value"), ("stats/approx_kl", "stats/approx_kl"),
                             ("episode_return", "charts/episodic_return"),
                             ("charts/learning_rate", "charts/learning_rate")]:
                logged = dict(read_scalars(config_dir / f"seed_{k}", tag))
                ours = {int(step): np.float32(value) for step, value in
                        zip(metrics["env_steps"][c, k], metrics[key][c, k]) if np.isfinite(value)}
                assert logged and logged == ours, (c, k, key)
    network = ppo.ActorCritic(action_dim=2, continuous=False, hidden_size=64)
    dist, value = network.apply(jax.tree.map(lambda x: x[0, 0], state.params), jnp.zeros((3, 4)))
    assert dist.logits.shape == (3, 2) and value.shape == (3,)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(config_dirs[1] / "seed_0"), size_guidance={"tensors": 0})
    acc.Reload()
    text = acc.Tensors("hyperparameters")[0].tensor_proto.string_val[0].decode()
    assert "|ent_coef|(0.01,)|" in text and "|exp_name|mine|" in text
    # What the preset set (never typed) and the rules gave, resolved, in tensorboard and in the
    # summary's flags line.
    (resolved,) = [line for line in proc.stdout.splitlines() if line.startswith("flags: ")]
    for k, v in [("update_epochs", 4), ("network", "mlp"), ("activation", "tanh")]:
        assert f"|{k}|{v}|" in text and f" {k}={v} " in f"{resolved} "
