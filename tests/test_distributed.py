"""--distributed on one machine, checked on q_learning.py (the runner is the same for every file:
algos/runner/): a sweep as 2 processes on 127.0.0.1 with 1 host device
each, against the same sweep in one process with 2 devices. Both put the same runs on each device,
and process 0 writes exactly the numbers of the single-process run, its summary table too (with
--pbt: its population steps too, every process holding the gathered one); process 1 writes
nothing."""
import os
import re
import signal
import socket
import subprocess
import sys

import flax.serialization
import numpy as np
import pytest

import ppo
import q_learning as ql
from conftest import ALGOS, read_scalars, validated
from runner import devices, evaluation, files, flags, reports, sweep

SWEEP = {  # module -> Args of a 2-configuration x 2-seed sweep that trains in seconds
    ql: dict(num_agents=2, num_steps=10, total_timesteps=40, learning_rate=(0.1, 0.5),
             num_seeds=2),
}
# module -> (metric, tensorboard tag)
METRIC = {ql: ("stats/q_error", "stats/q_error")}
ids = lambda m: m.__name__


def command_line(fields):  # Args fields -> flags; a () value is a flag alone
    return [arg for k, v in fields.items()
            for arg in (f"--{k.replace('_', '-')}", *map(str, v if isinstance(v, tuple) else [v]))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, tmp_path, fields, port, *flags):
    """The 2 processes of a run of `fields`, on 1 host device each."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    return [subprocess.Popen(
        [sys.executable, str(ALGOS / f"{module.__name__}.py"), *command_line(fields), *flags,
         "--log-dir", str(tmp_path), "--coordinator-address", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", str(process_id)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for process_id in range(2)]


def written(module, run_dir, args):
    """[configs, seeds, updates] of METRIC[module] as process 0 wrote it to tensorboard."""
    config_dir = lambda config: run_dir / f"learning_rate={config['learning_rate']:g}"
    return np.float32([[[v for _, v in read_scalars(config_dir(c) / f"seed_{k}", METRIC[module][1])]
                        for k in range(args.num_seeds)] for c in flags.grid(args)])


@pytest.mark.parametrize("module", SWEEP, ids=ids)
def test_two_processes_write_what_one_computes(module, tmp_path):
    procs = start(module, tmp_path, {**SWEEP[module], "distributed": (), "pbt": ()}, free_port())
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, err0[-2000:] + err1[-2000:]
    assert re.search(r"(?<!\d)2 device\(s\)", out0), out0  # process 0 reports all devices
    assert "final return" not in out1 and "steps " not in out1, out1  # process 1 stays silent

    args = validated(module, track=False, pbt=True, **SWEEP[module])
    _, metrics, timing = sweep.run(args)  # conftest's 2 devices: the same runs on each device
    (run_dir,) = tmp_path.glob("*__*")  # one run directory, process 0's
    values = written(module, run_dir, args)
    np.testing.assert_array_equal(values, metrics[METRIC[module][0]])
    runs = {k: v.reshape(-1, v.shape[-1]) for k, v in metrics.items()}  # [runs, updates]
    table = reports.summary(args, runs, timing).splitlines()[:-1]
    assert all(row in out0.splitlines() for row in table), (table, out0)
    assert any(line.startswith("population by lineage, best first") for line in table)


def test_one_run_over_two_processes_writes_what_one_process_computes(tmp_path):
    """One ppo run split over 2 processes of 1 device each (its envs, its gradients averaged over
    gloo) writes the very numbers of the same run over the 2 devices of one process; its saved
    model, played as --load-model plays it (on one device), scores what the end of training
    printed."""
    fields = dict(num_seeds=1, num_envs=8, num_steps=16, num_minibatches=2,
                  total_timesteps=8 * 16 * 3, hidden_size=16, eval_episodes=4)
    procs = start(ppo, tmp_path, {**fields, "distributed": (), "save_model": ()}, free_port())
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, err0[-2000:] + err1[-2000:]
    assert "2 device(s) (2 a run)" in out0, out0
    args = validated(ppo, track=False, **fields)
    _, metrics, timing = sweep.run(args)
    assert timing["span"] == 2
    (run_dir,) = tmp_path.glob("*__*")
    for key, tag in [("loss/value", "losses/value"), ("episode_return", "charts/episodic_return")]:
        written = dict(read_scalars(run_dir / "seed_0", tag))
        ours = {int(step): np.float32(value) for step, value in
                zip(metrics["env_steps"][0], metrics[key][0]) if np.isfinite(value)}
        assert written == ours, (key, written, ours)
    saved = flax.serialization.msgpack_restore((run_dir / "model.msgpack").read_bytes())
    played = evaluation.evaluator(args)(files.load_model(args, saved))
    for tag, values in played.items():
        assert f"{tag} per seed (4 episodes): {values[0]:.4g}" in out0, (tag, values, out0)


def test_a_signal_to_one_process_stops_them_all_and_they_resume(tmp_path):
    """Ctrl-C to process 1 alone (SIGINT): both processes stop after the same segment, exit 130,
    and process 0 writes the checkpoint of that segment and says how to continue; resumed with
    the same flags they end with exactly the numbers of the uninterrupted run (q_learning: the
    same on every layout). (A kill -9 resumes alike: test_long_runs.py, one process.)"""
    fields = dict(num_agents=64, num_steps=1000, total_timesteps=1000 * 200, num_seeds=2,
                  learning_rate=(0.1, 0.5))
    procs = start(ql, tmp_path, fields, free_port())
    next(line for line in procs[0].stdout if "] steps " in line)  # the first segment is done
    procs[1].send_signal(signal.SIGINT)
    (out0, err0), (out1, err1) = (p.communicate(timeout=120) for p in procs)
    assert [p.returncode for p in procs] == [130, 130], err0[-2000:] + err1[-2000:]
    assert "continue with: python" in out0 and "Traceback" not in err0 + err1
    (run_dir,) = tmp_path.glob("*__*")
    assert len(read_scalars(run_dir / "learning_rate=0.1" / "seed_0", "stats/q_error")) \
        == 20 * (1 + out0.count("] steps "))  # the segments process 0 reported, 20 updates each
    procs = start(ql, tmp_path, fields, free_port(), "--resume", str(run_dir))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    args = validated(ql, track=False, **fields)
    np.testing.assert_array_equal(written(ql, run_dir, args), sweep.run(args)[1]["stats/q_error"])


def test_runs_that_do_not_split_over_the_processes(tmp_path):
    """1 configuration x 3 seeds of 3 agents cannot be split over 2 processes, neither by runs nor
    by agents (the address flags imply --distributed): both say so in one line, exit 2 and write
    nothing."""
    fields = {**SWEEP[ql], "learning_rate": (0.1,), "num_seeds": 3, "num_agents": 3}
    for proc in start(ql, tmp_path, fields, free_port()):
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(lines) == 1, err[-2000:]
        assert "do not split over 2 processes" in lines[0]
    assert not any(tmp_path.glob("*__*"))


@pytest.mark.parametrize("process_id, message", [
    (1, "nothing answered"),  # no process 0
    (0, "0 of the 1 other processes joined"),  # process 0 whose peers never come
])
def test_a_missing_process_is_one_line_after_the_timeout(process_id, message, monkeypatch):
    """A one-line error once JOIN_TIMEOUT_S has passed, instead of a hang or JAX's abort
    (checked in-process with a 2 s timeout; nothing else listens on the port)."""
    monkeypatch.setattr(devices, "JOIN_TIMEOUT_S", 2)
    args = flags.args_class(ppo)(coordinator_address=f"127.0.0.1:{free_port()}",
                                 num_processes=2, process_id=process_id)
    with pytest.raises(flags.ArgError, match=f"{message} within 2 s"):
        devices.start_processes(args)
