"""Long runs: the command line trains in segments of one compiled program, writes tensorboard
events and a checkpoint after each, and --resume continues a killed (kill -9) or interrupted
(Ctrl-C) run to exactly what the uninterrupted run computes. The runner is the same for every
file (algos/runner/): the kill and Ctrl-C stop q_learning's 2-configuration sweep run as a user
would (its compile is the shortest), and its --resume runs here, through the same main() (a
resume in processes of its own: test_distributed.py); ppo's state (optimiser, normalisation
statistics) goes through a checkpoint in this process."""
import dataclasses
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import flax.serialization
import jax
import numpy as np
import pytest

import ppo
import q_learning as ql
import vpg
from conftest import (
    ALGOS,
    assert_usage_error,
    read_scalars,
    run_main,
    run_script,
    validated,
)
from runner import cli, files, flags, reports, sweep

# module -> Args of a run of 10 segments that take long enough (a few tenths of a second each on
# 2 cores) for a kill sent after the second one to land before the end: a 2-configuration sweep.
RUNS = {ql: dict(num_agents=64, num_steps=1000, total_timesteps=1000 * 200, num_seeds=2,
                 learning_rate=(0.1, 0.5))}
TAGS = {ql: "stats/q_error"}  # tag -> metric below
METRIC = {"stats/q_error": "stats/q_error"}
ids = lambda m: m.__name__


def command_line(module, pbt=False):
    return [arg for k, v in RUNS[module].items()
            for arg in (f"--{k.replace('_', '-')}", *(v if isinstance(v, tuple) else [v]))] + (
        ["--pbt"] if pbt else [])


def start_then_signal(module, log_dir, sig, after, pbt=False):
    """Start the script on RUNS[module] (with --pbt) and send `sig` once `after` progress lines
    are out; returns (return code, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, str(ALGOS / f"{module.__name__}.py"),
                             *map(str, command_line(module, pbt)), "--save-model", "--log-dir",
                             str(log_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if sum("] steps " in x for x in lines) == after:
            proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(lines) + out, err


@pytest.fixture(autouse=True)
def signal_handlers():
    """main() in this process installs its SIGINT and SIGTERM handlers: put pytest's back."""
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


@pytest.fixture(scope="module")
def reference():
    """(module, pbt) -> (args, final state, metrics, summary lines but the timing line) of the
    uninterrupted run, in this process (the same 2 devices as the scripts)."""
    cache = {}

    def get(module, pbt=False):
        if (module, pbt) not in cache:
            args = validated(module, track=False, pbt=pbt, **RUNS[module])
            state, metrics, timing = sweep.run(args)
            runs = jax.tree.map(lambda x: x.reshape(-1, x.shape[-1]), metrics)  # [runs, updates]
            text = reports.summary(args, runs, timing)
            cache[module, pbt] = (args, state, metrics, text.splitlines()[:-1])
        return cache[module, pbt]

    return get


def assert_same_as_uninterrupted(module, run_dir, out, reference, pbt=False):
    """The run directory and the final output of a resumed run hold what the uninterrupted run
    computes, bit for bit: every update's metric in tensorboard (each step once), the models and
    the summary (with --pbt: the population, its hyperparameters and schedule)."""
    args, state, metrics, summary = reference(module, pbt)
    assert [line for line in summary if line in out.splitlines()] == summary, out
    configs = flags.grid(args)
    for c, (_, config_dir) in enumerate(files.config_dirs(run_dir, args)):
        config_dir = Path(config_dir)
        pick = (lambda x: x[c]) if len(configs) > 1 else (lambda x: x)
        for k in range(args.num_seeds):
            points = read_scalars(config_dir / f"seed_{k}", TAGS[module])
            steps = [int(s) for s, _ in points]
            assert steps == [int(s) for s in pick(metrics["env_steps"])[k]], k
            np.testing.assert_array_equal(np.float32([v for _, v in points]),
                                          pick(metrics[METRIC[TAGS[module]]])[k])
        saved = flax.serialization.msgpack_restore((config_dir / "model.msgpack").read_bytes())
        mine = (pick(state.agents.q), saved["q"]) if module is ql else (
            jax.tree.map(pick, state.params), saved["params"])
        jax.tree.map(np.testing.assert_array_equal, *mine)


@pytest.mark.parametrize("module", [ql], ids=ids)
def test_killed_pbt_run_resumes_to_the_uninterrupted_result(module, tmp_path, reference, capsys):
    """kill -9 after the second segment's checkpoint of a --pbt run (its population stepped
    after each segment): the event files already hold the curves so far (tensorboard shows a run
    live), and --resume finishes the run as if nothing happened, its population too. The
    uninterrupted run is another process's: the same command gives the same population."""
    code, out, _ = start_then_signal(module, tmp_path, signal.SIGKILL, after=2, pbt=True)
    assert code == -signal.SIGKILL, f"the run ended before the kill: {out}"
    (run_dir,) = tmp_path.iterdir()
    seed_dir = next(run_dir.glob("**/seed_0"))
    written = [s for s, _ in read_scalars(seed_dir, TAGS[module])]
    total = RUNS[module]["total_timesteps"] * RUNS[module].get("num_agents", 1)
    assert written and max(written) < total, written  # some curve, not all of it
    out = run_main(module, ["--resume", run_dir, "--save-model"], capsys)  # (in this process)
    assert "population by lineage, best first" in out
    assert_same_as_uninterrupted(module, run_dir, out, reference, pbt=True)
    # Tensorboard: a member's hyperparameters at every update; the copies of the population's 9
    # steps (at most one each, a quarter of its 4 runs, where a better run was there to copy), at
    # the step of the segment's end, those of the uninterrupted run.
    seed_dirs = sorted(run_dir.glob("*/seed_*"))
    assert all(len(read_scalars(d, "hp/learning_rate")) == 200 for d in seed_dirs)
    copies = [p for d in seed_dirs for p in read_scalars(d, "pbt/copied_from")]
    expected = np.isfinite(reference(module, True)[2]["pbt/copied_from"]).sum()
    assert 0 < len(copies) == expected <= 9 and all(v in (0, 1, 2, 3) for _, v in copies), copies


@pytest.mark.parametrize("module, sig, code", [(ql, signal.SIGINT, 130),
                                               (ql, signal.SIGTERM, 143)], ids=["int", "term"])
def test_a_signal_stops_after_the_segment_and_resumes(module, sig, code, tmp_path, reference,
                                                      capsys):
    """Ctrl-C (SIGINT), or the SIGTERM a scheduler sends before it preempts a job: the segment
    finishes, its checkpoint is written, one line says how to resume, exit 128 + the signal; the
    resumed run ends where the uninterrupted one does."""
    returncode, out, err = start_then_signal(module, tmp_path, sig, after=1)
    (run_dir,) = tmp_path.iterdir()
    script = f"{module.__name__}.py"
    assert returncode == code, err[-3000:]
    assert f"continue with: python {ALGOS / script} --resume {run_dir}" in out
    assert "stopping at the end of this segment" in err and "Traceback" not in err
    assert (run_dir / "checkpoint.msgpack").is_file()
    out = run_main(module, ["--resume", run_dir, "--save-model"], capsys)  # (in this process)
    assert_same_as_uninterrupted(module, run_dir, out, reference)


def test_a_signal_in_the_last_segment_lets_the_run_finish(tmp_path, reference):
    """SIGTERM once the last segment runs (after the 9th of 10 progress lines): its checkpoint
    would hold every update, which --resume refuses as finished, so the run finishes instead,
    exit 0: its models, summary and events those of the uninterrupted run."""
    returncode, out, err = start_then_signal(ql, tmp_path, signal.SIGTERM, after=9)
    (run_dir,) = tmp_path.iterdir()
    assert returncode == 0 and "continue with" not in out, (returncode, out, err[-3000:])
    assert_same_as_uninterrupted(ql, run_dir, out, reference)


def test_a_second_signal_stops_at_once(tmp_path):
    """Ctrl-C, then Ctrl-C again 0.5 s later while the segment runs (segments of ~2 s here: at
    200k steps a segment, one could end before the second signal): the default handler is back,
    the process dies of the signal at once, with no checkpoint after the first segment's and no
    line saying how to continue."""
    longer = ["--num-agents", 64, "--num-steps", 1000, "--total-timesteps", 1000 * 10000,
              "--num-seeds", 2, "--num-segments", 10, "--log-dir", tmp_path]
    proc = subprocess.Popen([sys.executable, str(ALGOS / "q_learning.py"), *map(str, longer)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "] steps " in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, out, err[-2000:])
    assert "continue with" not in out and "] steps " not in out


def test_a_full_disk_is_one_line_and_the_last_checkpoint_resumes(tmp_path, reference, capsys):
    """The third checkpoint write fails with ENOSPC (os.fsync raising it, as a full disk does):
    one line naming the file and the cause, exit 74, no temporary file left; the second
    checkpoint is intact and --resume finishes the run as if nothing happened."""
    real_fsync, calls = os.fsync, []

    def full_after_two(fd):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    argv = ["q_learning.py", *map(str, command_line(ql)), "--save-model", "--log-dir",
            str(tmp_path)]
    with mock.patch.object(sys, "argv", argv), mock.patch.object(os, "fsync", full_after_two), \
            pytest.raises(SystemExit) as exit_info:
        cli.main(ql)
    (run_dir,) = tmp_path.iterdir()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 74 and len(err) == 1, err
    assert err[0].startswith(f"error: cannot write {run_dir / 'checkpoint.msgpack'}: No space")
    assert [p.name for p in run_dir.iterdir() if p.is_file()] == ["checkpoint.msgpack"]
    with mock.patch.object(sys, "argv", ["q_learning.py", "--resume", str(run_dir),
                                         "--save-model"]):
        cli.main(ql)
    assert_same_as_uninterrupted(ql, run_dir, capsys.readouterr().out, reference)


@pytest.mark.parametrize("writer", [ppo, vpg, ql], ids=ids)
def test_a_checkpoint_of_another_file_or_format_is_refused(writer, tmp_path):
    """A checkpoint says which file wrote it and its format: each other file refuses it, and so
    does the file itself when the format is another, in one line, exit 2, nothing compiled."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = validated(writer, track=False)
    metrics = {"env_steps": np.zeros((args.num_seeds, 1), np.int32)}
    files.write_checkpoint(str(run_dir), args, {}, metrics, 5)
    for other in {ppo, vpg, ql} - {writer}:
        assert_usage_error(f"{other.__name__}.py", ["--resume", run_dir],
                           f"written by {writer.__name__}.py", tmp_path)
    with mock.patch.object(files, "FORMAT", files.FORMAT + 1):
        assert_usage_error(f"{writer.__name__}.py", ["--resume", run_dir], "format", tmp_path)


def test_a_run_too_big_for_memory_is_refused_before_its_first_call(tmp_path, capsys):
    """--num-envs 20,000,000 on one seed: XLA's estimate of the compiled programs' memory is far
    above what this machine has; one line naming the size flags, exit 2, no update run and no
    run directory left."""
    argv = ["ppo.py", "--num-envs", "20000000", "--num-seeds", "1", "--log-dir", str(tmp_path)]
    calls = []
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_info, \
            mock.patch.object(reports, "progress", lambda *a: calls.append(a) or ""):
        cli.main(ppo)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert "GiB" in err[0] and "--num-envs, --num-steps, --num-seeds" in err[0], err
    assert not calls and not any(tmp_path.iterdir())


def test_importing_after_jax_started():
    """A user's session that already ran JAX can import the files (none changes JAX's settings on
    import; the runner's main() sets the device count)."""
    proc = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.ones(2).block_until_ready()"
                           "; import ppo, vpg, q_learning"], cwd=ALGOS, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


TINY = dict(env_id="CartPole-v1", num_envs=8, num_steps=32, num_minibatches=2, update_epochs=1,
            hidden_size=16, total_timesteps=8 * 32 * 53, num_seeds=2, track=False)


def test_segments_change_at_most_rounding_and_compile_once():
    """One segment (the whole run in one call) against ten: the first update agrees to 1e-5
    relative and the final returns are the same; 53 updates in segments of 6 end with a segment
    of 5, and no segment after the first compiles anything (one program for all)."""
    one = sweep.run(validated(ppo, num_segments=1, **TINY))[1]
    compiles, ten = [], sweep.segments(validated(ppo, num_segments=10, **TINY))
    next(ten)
    listener = lambda event, *_, **__: "compile" in event and compiles.append(event)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        *_, (_, metrics, _) = ten
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert not compiles, compiles
    assert metrics["env_steps"].shape == (2, 53)
    np.testing.assert_array_equal(metrics["env_steps"][0], 8 * 32 * np.arange(1, 54))
    for key, values in one.items():
        np.testing.assert_allclose(metrics[key][:, 0], values[:, 0], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(reports.final_returns(metrics), reports.final_returns(one),
                               rtol=1e-5)


@pytest.mark.parametrize("seeds", [2, 1], ids=["a run per device", "a run over 2 devices"])
def test_ppo_state_resumes_from_its_checkpoint_bit_for_bit(seeds, tmp_path):
    """ppo's whole state (parameters, Adam's moments and count, normalisation statistics, env
    states, keys) through write_checkpoint and read_saved after segment 3 of 10: the
    remaining segments end exactly where the uninterrupted run does; so too with one run whose
    envs are split over the 2 devices (its checkpoint holds them as one device would)."""
    args = validated(ppo, num_segments=10, **{**TINY, "num_seeds": seeds})
    runs = list(sweep.segments(args))
    (state, metrics, timing), (final_state, final, _) = runs[2], runs[-1]
    files.write_checkpoint(str(tmp_path), args, state, metrics, timing["num_updates"])
    resumed_args, checkpoint = files.read_saved(
        dataclasses.replace(args, resume=str(tmp_path)), ["--resume", str(tmp_path)])
    assert dataclasses.replace(resumed_args, resume=None) == args
    *_, (resumed_state, resumed, _) = sweep.segments(
        resumed_args, start=(checkpoint["state"], checkpoint["metrics"]))
    jax.tree.map(np.testing.assert_array_equal, resumed, final)
    jax.tree.map(np.testing.assert_array_equal, resumed_state, final_state)


def test_bad_resume_and_log_dir_are_one_line_exit_2(tmp_path):
    """Nothing compiles, nothing is written: --resume of a missing directory, of a truncated
    checkpoint, with a flag that changes the computation, of a finished run (a checkpoint after
    the last of TINY's 53 updates: its state is never read, the refusals come first); an
    unwritable --log-dir."""
    run_dir = tmp_path / "finished"
    run_dir.mkdir()
    files.write_checkpoint(str(run_dir), validated(ppo, **TINY), {},
                           {"env_steps": np.zeros((2, 53), np.int32)}, 53)
    fields = [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items() if k != "track"]
    assert_usage_error("ppo.py", ["--resume", tmp_path / "missing"], "--resume", tmp_path)
    truncated = tmp_path / "truncated"
    shutil.copytree(run_dir, truncated)
    data = (truncated / "checkpoint.msgpack").read_bytes()
    (truncated / "checkpoint.msgpack").write_bytes(data[: len(data) // 2])
    assert_usage_error("ppo.py", ["--resume", truncated], "--resume", tmp_path)
    # however tyro lets it be typed: --flag_name, --no-flag
    for typed, name in ((["--learning-rate", "0.01"], "--learning-rate"),
                        (["--learning_rate", "0.01"], "--learning-rate"),
                        (["--no-anneal-lr"], "--anneal-lr")):
        assert_usage_error("ppo.py", ["--resume", run_dir, *typed], name, tmp_path)
    # The flags of the run itself, and those that do not change the computation, are fine, but
    # this run is finished.
    assert_usage_error("ppo.py", ["--resume", run_dir, *fields, "--track", "--save-model"],
                       "that run is finished", tmp_path)
    (tmp_path / "file").write_text("")
    assert_usage_error("ppo.py", ["--log-dir", tmp_path / "file" / "runs"], "--log-dir", tmp_path)


def test_flags_typed_anew_on_resume_in_every_spelling(tmp_path):
    """A flag that does not change the computation, typed beside --resume, wins over the saved
    value whichever way tyro takes it: --no-track, --no_track, --eval_episodes 3."""
    args = validated(ppo, **TINY)  # track=False
    files.write_checkpoint(str(tmp_path), dataclasses.replace(args, track=True), {},
                           {"env_steps": np.zeros((2, 1), np.int32)}, 53)
    for typed, track, episodes in ((["--no-track"], False, 64), (["--no_track"], False, 64),
                                   (["--eval_episodes", "3"], True, 3)):
        argv = ["--resume", str(tmp_path), *typed]
        resumed, _ = files.read_saved(flags.parse(flags.args_class(ppo), argv), argv)
        assert (resumed.track, resumed.eval_episodes) == (track, episodes), typed


def test_a_run_never_shares_its_folder(tmp_path):
    """Two runs of one env and seed started in the same second name the same folder: the second
    is refused in one line, not written beside the first (their event files mixed, the first's
    checkpoint overwritten, and a failure of either removing the folder of both)."""
    taken = tmp_path / "taken" / "CartPole-v1__ppo__1__1800000000"
    taken.mkdir(parents=True)
    (taken / "keep").write_text("the first run's")
    with mock.patch("time.time", return_value=1_800_000_000.5):
        assert_usage_error("ppo.py", ["--log-dir", taken.parent], "File exists", tmp_path)
    assert [p.name for p in taken.iterdir()] == ["keep"]


def test_a_failed_write_names_its_file_and_leaves_no_temporary_one(tmp_path):
    """write_atomic's error names the file it writes, not its temporary one, wherever it fails
    (making the temporary file, writing it, renaming it), and leaves nothing behind."""
    path = str(tmp_path / "checkpoint.msgpack")
    failures = [mock.patch("tempfile.NamedTemporaryFile", side_effect=OSError(
                    errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / "tmpabc"))),
                mock.patch("os.fsync", side_effect=OSError(errno.ENOSPC, "No space")),
                mock.patch("os.replace", side_effect=OSError(errno.EXDEV, "Cross-device"))]
    for failure in failures:
        with failure, pytest.raises(OSError) as raised:
            files.write_atomic(path, b"data")
        assert raised.value.filename == path and not list(tmp_path.iterdir())


def test_resume_keeps_the_layout_of_the_run(tmp_path):
    """A checkpoint holds the devices its run spans; --resume takes that layout again, and where
    the machine has fewer devices it is refused in one line (--devices-per-run typed chooses)."""
    args = validated(ppo, num_segments=10, **{**TINY, "num_seeds": 1})
    state, metrics, timing = next(sweep.segments(args))
    assert timing["span"] == 2
    files.write_checkpoint(str(tmp_path), args, state, metrics, timing["num_updates"], 2)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = run_script("ppo.py", "--resume", tmp_path, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == "error: --devices-per-run 2 > 1 devices", proc.stderr


def test_a_checkpoint_written_before_the_runner_moved_resumes(pre_runner_checkpoint, tmp_path,
                                                              capsys):
    """The checkpoint ppo.py writes when stopped mid-run (2 seeds, 64 updates, a segment each) as
    it was when the runner was a copy in every file (conftest.PRE_RUNNER): it resumes to the
    end, a progress line a remaining segment, the updates it holds kept as they were."""
    run_dir = tmp_path / "run"
    shutil.copytree(pre_runner_checkpoint, run_dir)
    read = lambda: flax.serialization.msgpack_restore(
        (run_dir / "checkpoint.msgpack").read_bytes()[32:])
    before = read()
    done = before["metrics"]["env_steps"].shape[1]
    assert before["num_updates"] == 64 and 0 < done < 64
    out = run_main(ppo, ["--resume", run_dir, "--eval-episodes", 0], capsys)
    assert "ppo on CartPole-v1: 2 seeds x 32,768 steps" in out
    assert out.count("[ppo] steps") == 64 - done
    after = read()["metrics"]
    assert after["env_steps"].shape == (2, 64)
    for key, values in before["metrics"].items():
        np.testing.assert_array_equal(after[key][:, :done], values, err_msg=key)
