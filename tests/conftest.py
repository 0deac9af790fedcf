"""Shared test setup and helpers.

Two host CPU devices (so every run exercises the multi-device path), a temporary compilation
cache (the user's own is never touched), algos/ on sys.path, and the helpers the per-algorithm
test files share: running a script as a user would, checking a usage error, and
reading tensorboard scalars back."""
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Must happen before jax is imported anywhere in the test process (and is inherited by the
# scripts the tests start): 2 host devices, and a compilation cache that lives as long as this
# test session, shared by its tests. The scripts' --compile-cache-dir defaults to this variable.
_DEVICES_FLAG = "--xla_force_host_platform_device_count=2"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES_FLAG).strip()
# And LLVM -O0 for every program compiled without options of its own: the tests' own jits and the
# evaluators, not the files' training programs (their COMPILER_OPTIONS win, so a learning row
# trains as sized): test_sac.py and test_is_eval.py, alone, 108 s -> 84 s.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("MUJOCO_GL", "egl")  # Brax's drawings headless (read when mujoco loads)
# pytest-xdist's workers inherit the variable from the controller, so they share its cache.
if "JAXRL_TEST_CACHE" not in os.environ:
    _CACHE = tempfile.TemporaryDirectory(prefix="jax-cache-")
    os.environ["JAXRL_TEST_CACHE"] = _CACHE.name
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ["JAXRL_TEST_CACHE"]
# Every program, not only those that compiled in a second or more (JAX's default): the tests and
# the scripts they start compile many of the same small programs.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# Python's collector walks the whole heap every ~70,000 allocations; a test worker keeps every
# program it traced, so each walk is long (measured on test_sac, test_is_eval and test_ppo: 5.0 s
# of collections a worker, 1.5 s with these thresholds). Results do not depend on it.
gc.set_threshold(20_000, 10, 10)

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
# The commit whose ppo.py still carried its own copy of the runner: the checkpoint and the model it
# writes must resume and load on today's (pre_runner_checkpoint, pre_runner_model below).
PRE_RUNNER = "e6f17f4"
if str(ALGOS) not in sys.path:
    sys.path.insert(0, str(ALGOS))


def run_script(script, *flags, cwd=None, timeout=300, env=None):
    """Run `algos/<script>` (or a path) as a user would, on 2 host devices (XLA_FLAGS) and the
    session's temporary compilation cache, or in `env`; returns the CompletedProcess."""
    path = Path(script) if Path(script).is_absolute() else ALGOS / script
    return subprocess.run(
        [sys.executable, str(path), *map(str, flags)], cwd=cwd or ROOT,
        env=dict(os.environ) if env is None else env, capture_output=True, text=True,
        timeout=timeout,
    )


def run_main(module, argv, capsys):
    """The script's command line (the runner's main on the module) in this process on argv; what
    it printed."""
    from unittest import mock

    from runner import cli
    with mock.patch.object(sys, "argv", [f"{module.__name__}.py", *map(str, argv)]):
        module.main() if hasattr(module, "main") else cli.main(module)  # (is_eval.py: its own)
    return capsys.readouterr().out


def help_text(module, capsys):
    """What `python <module>.py --help` prints, as one line of words (the box drawing dropped),
    after checking that it names every flag: main() in-process, without ~4 s of imports."""

    from runner import flags
    with pytest.raises(SystemExit) as exit_info:
        run_main(module, ["--help"], capsys)
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())
    Args = getattr(module, "Args", None) or flags.args_class(module)  # (is_eval.py: its own)
    for name in offered(Args):
        assert flags.flag(name) in text, name
    return text


def offered(Args) -> list:
    """The flags of an Args class that its command line offers (not tyro.conf.Suppress'ed)."""
    import dataclasses
    import typing

    import tyro
    return [f.name for f in dataclasses.fields(Args)
            if tyro.conf.Suppress not in typing.get_args(f.type)[1:]]


def assert_usage_error(script, flags, flag, tmp_path):
    """Bad input: exit status 2 and a one-line error naming `flag`, with nothing compiled and no
    run directory written. Runs the script's own main() in-process (the same code path as the
    command line, without paying ~5 s of imports per case); see test_*_cli_usage_error_exit_code
    for the real process."""
    import contextlib
    import importlib
    import io
    from unittest import mock

    import jax
    import pytest

    module = importlib.import_module(Path(script).stem)
    # The program that must not start: make_train (the runner's segments, run), or is_eval's
    # per-dataset trial (it trains none).
    trains = hasattr(module, "make_train")
    entry = "make_train" if trains else "make_gridworld_trial"
    # Building a gymnax env compiles a few one-op jits; the training program must not compile.
    compiles = []

    def listener(event, duration, fun_name="", **kwargs):
        # The runner's programs compile as "jit(init)" and "jit(one_segment)"; a jitted train as
        # "jit(train)"; pmap(f) (is_eval.py's sweep) as "jit(_fun)".
        if event.endswith("backend_compile_duration") and any(
                word in fun_name for word in ("_fun", "pmap", "train", "jit(init)", "one_segment")):
            compiles.append(fun_name)

    def must_not_run(*args, **kwargs):
        raise AssertionError("training started before the bad input was reported")

    jax.monitoring.register_event_duration_secs_listener(listener)
    stderr = io.StringIO()
    argv = [script, *map(str, flags), *([] if "--log-dir" in flags else
                                        ["--log-dir", str(tmp_path / "runs")])]
    from runner import cli, sweep
    try:
        with mock.patch.object(sys, "argv", argv), contextlib.redirect_stderr(stderr), \
                mock.patch.object(module, entry, must_not_run), \
                mock.patch.object(sweep, "run", must_not_run), \
                mock.patch.object(sweep, "segments", must_not_run), \
                pytest.raises(SystemExit) as exit_info:
            cli.main(module) if trains else module.main()
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
    assert exit_info.value.code == 2, (exit_info.value.code, stderr.getvalue())
    assert len(lines) == 1 and flag in lines[0], stderr.getvalue()
    assert not compiles, compiles
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def quicker_compiles(monkeypatch):
    """The files' programs compiled at LLVM -O0, not their COMPILER_OPTIONS' -O1 (a Brax task's
    training program: 12 s -> 7.7 s; test_many_devices.py alone: 111 s -> 100 s), for the
    modules that use it (pytestmark), whose tests compare runs compiled alike: the rounding
    differs from -O1's, not what is computed. Never for a learning row (sized at -O1) nor a
    comparison with a script's own process. The runner's default, and a file's own options."""
    import runner
    level_0 = lambda options: {**options, "xla_backend_optimization_level": 0}
    monkeypatch.setitem(runner.CONTRACT, "COMPILER_OPTIONS",
                        level_0(runner.CONTRACT["COMPILER_OPTIONS"]))
    for name in ("ppo", "vpg", "pqn", "ppo_rnn", "sac", "q_learning"):
        if hasattr(sys.modules.get(name), "COMPILER_OPTIONS"):
            monkeypatch.setattr(sys.modules[name], "COMPILER_OPTIONS",
                                level_0(sys.modules[name].COMPILER_OPTIONS))


def assert_anneals_linearly(tx, learning_rate, steps: int):
    """On a constant gradient (Adam's step is then exactly its learning rate) the k-th step of
    the optax transformation tx is learning_rate (1 - k / steps), and the one after the last 0."""
    import jax.numpy as jnp
    import numpy as np

    params = {"w": jnp.zeros(())}
    opt_state, sizes = tx.init(params), []
    for _ in range(steps + 1):
        updates, opt_state = tx.update({"w": jnp.ones(())}, opt_state, params)
        sizes.append(-float(updates["w"]))
    expected = float(learning_rate) * (1 - np.arange(steps + 1) / steps)
    np.testing.assert_allclose(sizes, expected, rtol=1e-5, atol=1e-9)


def validated(module, **flags):
    """The runner's Args of `module` with these flags, checked and resolved (flags.validate)."""
    from runner import flags as runner_flags
    return runner_flags.validate(runner_flags.args_class(module)(**flags))


def read_scalars(run_dir, tag):
    """[(step, value), ...] of one scalar tag in the event files under `run_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def learning_verdict(metrics, finals, spec):
    """Why one row of a learning table fails on these runs, or None where it holds: the median of
    the seeds' final returns reaches `median`, at least k of them reach `floor` (spec["most"] = (k,
    floor)), and the last 10% of updates score at least `rise` above the first 10%.
    (benchmarks/learning_rows.py sizes each row from its spread over seed bases with this.)"""
    import numpy as np

    why = []
    if np.median(finals) < spec["median"]:
        why.append(f"median {np.median(finals):.4g} < {spec['median']}")
    if spec.get("most") and (finals >= spec["most"][1]).sum() < spec["most"][0]:
        why.append(f"{(finals >= spec['most'][1]).sum()} seeds >= {spec['most'][1]}, not "
                   f"{spec['most'][0]}")
    returns = np.asarray(metrics["episode_return"]).reshape(len(finals), -1)
    tenth = max(1, returns.shape[1] // 10)
    rise = np.nanmean(returns[:, -tenth:]) - np.nanmean(returns[:, :tenth])
    if rise < spec["rise"]:
        why.append(f"rise {rise:.4g} < {spec['rise']}")
    return "; ".join(why) or None


def assert_learns(module, spec):
    """One row of a learning table: the derived budget is within `budget` and the seeds' final
    returns (mean episode_return over the last 5% of updates) meet the row's criterion
    (learning_verdict). Returns (args, final states, final returns)."""
    from runner import reports, sweep
    args = validated(module, num_seeds=spec["seeds"], track=False, **spec["args"])
    assert args.total_timesteps <= spec["budget"]
    state, metrics, _ = sweep.run(args)
    finals = reports.final_returns(metrics)
    assert finals.shape == (spec["seeds"],)
    verdict = learning_verdict(metrics, finals, spec)
    assert verdict is None, (verdict, finals)
    return args, state, finals


def record_gae_inputs_with_short_episodes(module, monkeypatch, episode_steps=5):
    """Patch the runner's make_env so that envs truncate every episode after `episode_steps` steps,
    and `module` so that every update reports what it passes to compute_gae; returns the list
    that the runs then fill, one entry per run and update: float64 numpy arrays [T, N] (rewards,
    values, next_values, terminated, truncated). In 5 steps from its start state CartPole-v1
    cannot terminate, so every episode end is a truncation whose final observation differs from
    the reset one."""
    import jax
    import numpy as np

    from runner import envs
    make, gae, calls = envs.make_env, module.compute_gae, []

    def short_make(args):
        env, env_params = make(args)
        return env, env_params.replace(max_steps_in_episode=episode_steps)

    def recording_gae(*inputs):  # make_train looks compute_gae up when it traces the update
        jax.debug.callback(lambda *xs: calls.append([np.asarray(x, np.float64) for x in xs]),
                           *inputs[:5])
        return gae(*inputs)

    monkeypatch.setattr(envs, "make_env", short_make)
    monkeypatch.setattr(module, "compute_gae", recording_gae)
    return calls


def assert_truncation_bootstraps_from_final_observation(calls):
    """next_values[t] must be V of the observation step t led to BEFORE the auto-reset. On an
    ordinary step that is the next step's observation (next_values[t] == values[t + 1]); on a
    truncated step it is the final observation, not the reset one the next step starts from.
    (Bootstrapping from info["final_observation"] replaced by the post-reset observation would
    make every truncated step equal too.)"""
    import numpy as np

    for rewards, values, next_values, terminated, truncated in calls:
        follows, reset_value = next_values[:-1], values[1:]
        cut = (truncated[:-1] > 0) & (terminated[:-1] == 0)
        ordinary = (truncated[:-1] == 0) & (terminated[:-1] == 0)
        assert cut.sum() >= 8 and ordinary.sum() >= 24, (cut.sum(), ordinary.sum())
        np.testing.assert_allclose(follows[ordinary], reset_value[ordinary], rtol=1e-6, atol=1e-6)
        # Measured on these steps: |V(final) - V(reset)| mostly 0.03 to 0.48 (ppo and vpg), once
        # 7.8e-6 (two observations of nearly equal value); 0 with the post-reset observation in
        # place of the final one (checked on a copy of each file), rounding at most: 1e-7.
        gap = np.abs(follows[cut] - reset_value[cut])
        assert np.all(gap > 1e-6) and np.median(gap) > 1e-2, gap


def pre_runner_ppo(folder: Path) -> Path:
    """ppo.py as it was at PRE_RUNNER, from this clone's history, written into `folder` (as
    ppo.py: its stem names its runs)."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{PRE_RUNNER}:algos/ppo.py"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.fail(f"commit {PRE_RUNNER} (the files before algos/runner/) is not in this "
                    f"clone's history: {shown.stderr.strip()}")
    path = folder / "ppo.py"
    path.write_text(shown.stdout)
    return path


@pytest.fixture(scope="session")
def pre_runner_checkpoint(tmp_path_factory):
    """The run directory of the pre-runner ppo.py (2 seeds x 64 updates of 8 envs x 64 steps,
    CartPole-v1, hidden 16, a segment an update) sent SIGTERM at its first progress line: it
    stops after the segment then running, its checkpoint holding some of the 64 updates."""
    import signal

    folder = tmp_path_factory.mktemp("pre_runner_checkpoint")
    proc = subprocess.Popen(
        [sys.executable, str(pre_runner_ppo(folder)), "--num-seeds", "2", "--total-timesteps",
         "32768", "--num-envs", "8", "--num-steps", "64", "--hidden-size", "16",
         "--num-segments", "64", "--devices-per-run", "1", "--no-track", "--eval-episodes", "4",
         "--log-dir", str(folder / "runs")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if "] steps" in line:  # the first segment's line: stop after the one running now
            proc.send_signal(signal.SIGTERM)
            break
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    (run_dir,) = (folder / "runs").iterdir()
    return run_dir


@pytest.fixture(scope="session")
def pre_runner_model(tmp_path_factory):
    """model.msgpack of the pre-runner ppo.py's CartPole-v1 preset, 2 seeds, 300k steps."""
    folder = tmp_path_factory.mktemp("pre_runner_model")
    proc = run_script(pre_runner_ppo(folder), "--num-seeds", 2, "--save-model", "--no-track",
                      "--eval-episodes", 0, "--log-dir", folder / "runs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (run_dir,) = (folder / "runs").iterdir()
    return run_dir / "model.msgpack"
