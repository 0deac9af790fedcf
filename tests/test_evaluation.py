"""Evaluation (the runner's, shown on ppo.py): after training, each run's final policy plays
--eval-episodes fresh episodes, greedy and sampled; --load-model plays a saved model again."""
import dataclasses
import sys
from unittest import mock

import flax.serialization
import jax
import numpy as np
import pytest

import ppo
import q_learning as ql
from conftest import assert_usage_error, read_scalars, run_main, validated
from runner import cli, evaluation, files, flags, sweep

TINY = dict(num_envs=8, num_steps=64, num_minibatches=4, total_timesteps=8 * 64 * 6,
            num_segments=3, hidden_size=16)
TINY_FLAGS = [x for k, v in TINY.items() for x in (flags.flag(k), str(v))]


def cartpole_random_returns(episodes, rng):
    """Episode returns of uniformly random actions in CartPole-v1, in float64 numpy, from the
    equations gymnax implements (Euler steps of 0.02 s; reward 1 a step; the episode ends past
    2.4 m or 12 degrees, or after 500 steps)."""
    gravity, masspole, total_mass, length, force_mag, tau = 9.8, 0.1, 1.1, 0.5, 10.0, 0.02
    x, x_dot, theta, theta_dot = rng.uniform(-0.05, 0.05, (4, episodes))
    returns, alive = np.zeros(episodes), np.ones(episodes, bool)
    for _ in range(500):
        force = np.where(rng.integers(0, 2, episodes) == 1, force_mag, -force_mag)
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (force + masspole * length * theta_dot**2 * sin) / total_mass
        theta_acc = (gravity * sin - cos * temp) / (
            length * (4 / 3 - masspole * cos**2 / total_mass))
        x_acc = temp - masspole * length * theta_acc * cos / total_mass
        x, x_dot = x + tau * x_dot, x_dot + tau * x_acc
        theta, theta_dot = theta + tau * theta_dot, theta_dot + tau * theta_acc
        returns += alive
        alive &= (np.abs(x) <= 2.4) & (np.abs(theta) <= 12 * 2 * np.pi / 360)
    return returns


def initial_state(args):
    """The state init gives one run of args (its one seed, leaves [1, ...]), as the runner's."""
    hp = {k: np.float32([v]) for k, v in flags.grid(args)[0].items()}
    return jax.vmap(sweep.build_train(args).init)(jax.random.PRNGKey(0)[None], hp)


def test_a_uniform_policy_scores_what_a_numpy_rollout_of_it_scores():
    """A policy whose logits are all 0 (the actor's last layer zeroed) samples actions uniformly:
    its sampled evaluation over 2000 episodes matches 20000 numpy episodes of random actions
    within 4 standard errors (about 22 steps an episode, std 12); its greedy one always pushes
    left, which ends every episode within a few tens of steps."""
    args = validated(ppo, num_seeds=1, eval_episodes=2000, **TINY)
    state = initial_state(args)
    last = state.params["params"]["actor"]["layers_4"]
    last.update(jax.tree.map(np.zeros_like, last))
    evals = evaluation.evaluator(args)(state)
    reference = cartpole_random_returns(20_000, np.random.default_rng(0))
    error = reference.std() * np.sqrt(1 / 2000 + 1 / 20_000)
    sampled = evals["eval/episodic_return_sampled"][0]
    assert abs(sampled - reference.mean()) < 4 * error, (sampled, reference.mean(), error)
    assert 5 <= evals["eval/episodic_return_greedy"][0] < 20


def test_eval_episodes_0_changes_nothing_else(tmp_path, capsys):
    """With --eval-episodes 0 the same run prints the same lines, but for the evaluation's two,
    and writes the same training scalars, but for eval/."""
    outs = {}
    for n in (0, 8):  # (8: the next test's evaluation program)
        out = run_main(ppo, [*TINY_FLAGS, "--num-seeds", 2, "--eval-episodes", n, "--log-dir",
                             tmp_path / str(n)], capsys)
        outs[n] = [line for line in out.splitlines() if "SPS" not in line and "compile" not in line]
    evaluation = [line for line in outs[8] if line.startswith("eval/")]
    assert [line.split(" per seed")[0] for line in evaluation] == [
        "eval/episodic_return_greedy", "eval/episodic_return_sampled"]
    assert [line for line in outs[8] if line not in evaluation] == outs[0]
    (zero,), (eight,) = ((tmp_path / str(n)).iterdir() for n in (0, 8))
    for tag in ("charts/episodic_return", "losses/value"):
        assert read_scalars(zero / "seed_1", tag) == read_scalars(eight / "seed_1", tag)
    assert not read_scalars(zero / "seed_1", "eval/episodic_return_greedy")
    assert len(read_scalars(eight / "seed_1", "eval/episodic_return_greedy")) == 1


def test_every_segment_and_a_saved_model_played_back_exactly(tmp_path, capsys):
    """--eval-every-segment writes eval/ scalars after each segment; --load-model of the run's
    model evaluates the same policies to the same numbers, bit for bit (tensorboard's float32),
    and prints them per seed. Another env, or another file, is refused in one line, exit 2."""
    run_main(ppo, [*TINY_FLAGS, "--num-seeds", 2, "--eval-episodes", 8, "--eval-every-segment",
                   "--save-model", "--log-dir", tmp_path], capsys)
    (run_dir,) = tmp_path.iterdir()
    end = {}
    for kind in ("greedy", "sampled"):
        tag = f"eval/episodic_return_{kind}"
        points = [read_scalars(run_dir / f"seed_{k}", tag) for k in range(2)]
        assert [len(p) for p in points] == [3, 3] and points[0] != points[1]
        end[tag] = np.float32([p[-1][1] for p in points])
    model = run_dir / "model.msgpack"
    out = run_main(ppo, ["--load-model", model], capsys)
    saved = flax.serialization.msgpack_restore(model.read_bytes())
    args, _ = files.read_saved(validated(ppo, load_model=str(model)), [])
    again = evaluation.evaluator(args)(files.load_model(args, saved))
    for tag, values in end.items():
        np.testing.assert_array_equal(np.float32(again[tag]), values)
        assert f"{tag} per seed (8 episodes): " + " ".join(f"{x:.4g}" for x in again[tag]) in out
    assert_usage_error("ppo.py", ["--load-model", model, "--env-id", "Acrobot-v1"], "--env-id",
                       tmp_path)
    assert_usage_error("vpg.py", ["--load-model", model], "written by ppo.py", tmp_path)
    assert_usage_error("ppo.py", ["--load-model", run_dir / "checkpoint.msgpack"],
                       "not a usable file", tmp_path)


def test_a_model_that_does_not_fit_is_refused(tmp_path, capsys):
    """A model whose network is not the one its flags build (edited after saving) is refused."""
    args = validated(ppo, num_seeds=1, **TINY)
    state = initial_state(args)
    path = files.save_model(str(tmp_path), args, state)
    saved = flax.serialization.msgpack_restore(open(path, "rb").read())
    saved["params"]["params"]["actor"]["layers_0"]["kernel"] = np.zeros((1, 4, 17), np.float32)
    with pytest.raises(flags.ArgError, match="does not fit"):
        files.load_model(dataclasses.replace(args, load_model=path), saved)
    # From the command line: one line, and no folder removed (a run's of the same second, which
    # a failed training run removes as its own: --load-model makes none)
    edited = tmp_path / "edited.msgpack"
    edited.write_bytes(flax.serialization.msgpack_serialize(saved))
    other = tmp_path / "runs" / "CartPole-v1__ppo__1__1800000000"
    other.mkdir(parents=True)
    with mock.patch("time.time", return_value=1_800_000_000.5), \
            mock.patch.object(sys, "argv", ["ppo.py", "--load-model", str(edited), "--log-dir",
                                            str(tmp_path / "runs")]), \
            pytest.raises(SystemExit) as exit_info:
        cli.main(ppo)
    assert exit_info.value.code == 2 and "does not fit" in capsys.readouterr().err
    assert other.is_dir()


def test_a_model_plays_on_fewer_devices_than_it_trained_on(tmp_path, capsys):
    """A model saved by a run over more devices than this process has (--devices-per-run 3 here,
    on 2) plays: playing takes no layout of runs over devices."""
    args = validated(ppo, num_seeds=1, devices_per_run=3, **TINY)
    state = initial_state(args)
    path = files.save_model(str(tmp_path), args, state)
    out = run_main(ppo, ["--load-model", path, "--eval-episodes", 2], capsys)
    assert "eval/episodic_return_greedy per seed (2 episodes): " in out


def test_q_learning_has_no_policy_to_play_but_plays_its_pictures(tmp_path, capsys):
    """q_learning's greedy_optimal is already exact (against Q*): no evaluation lines; its saved
    tables are played back into --plot's heat map."""
    out = run_main(ql, ["--num-seeds", 2, "--total-timesteps", 20_000, "--save-model",
                        "--log-dir", tmp_path], capsys)
    assert "eval/" not in out
    (run_dir,) = tmp_path.iterdir()
    out = run_main(ql, ["--load-model", run_dir / "model.msgpack", "--plot"], capsys)
    assert f"saved {run_dir / 'q_values.png'}" in out and "eval/" not in out


def test_a_model_written_before_the_runner_moved_plays(pre_runner_model, capsys):
    """The model ppo.py saves of its CartPole-v1 preset (2 seeds, 300k steps) as it was when the
    runner was a copy in every file (conftest.PRE_RUNNER): it loads and plays its greedy episodes
    to the end."""
    out = run_main(ppo, ["--load-model", pre_runner_model, "--eval-episodes", 16], capsys)
    (line,) = [x for x in out.splitlines() if x.startswith("eval/episodic_return_greedy per seed")]
    assert line.startswith("eval/episodic_return_greedy per seed (16 episodes): ")
    greedy = [float(x) for x in line.split(": ")[1].split()]
    assert len(greedy) == 2 and min(greedy) >= 475, line
