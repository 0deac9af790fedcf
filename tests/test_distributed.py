"""--distributed on one machine (q_learning.py; ppo.py and vpg.py do not have it yet: issue 11):
a sweep as 2 processes on 127.0.0.1 with 1 host device each, against the same sweep in one process
with 2 devices. Both put the same runs on each device, so process 0 must write exactly the numbers
of the single-process run; process 1 writes nothing."""
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import q_learning as ql
from conftest import ALGOS, read_scalars

SWEEP = {  # module -> Args of a 2-configuration x 2-seed sweep that trains in seconds
    ql: dict(num_agents=2, num_steps=10, total_timesteps=40, learning_rate=(0.1, 0.5),
             num_seeds=2),
}
METRIC = {ql: ("stats/q_error", "stats/q_error")}  # module -> (metric, tensorboard tag)


def command_line(fields):  # Args fields -> flags; a () value is a flag alone
    return [arg for k, v in fields.items()
            for arg in (f"--{k.replace('_', '-')}", *map(str, v if isinstance(v, tuple) else [v]))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(module, tmp_path, process_id, port, fields):
    """One process of a 2-process run of `fields`, on 1 host device."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    return subprocess.Popen(
        [sys.executable, str(ALGOS / f"{module.__name__}.py"), *command_line(fields),
         "--log-dir", str(tmp_path), "--coordinator-address", f"127.0.0.1:{port}",
         "--num-processes", "2", "--process-id", str(process_id)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("module", SWEEP, ids=lambda m: m.__name__)
def test_two_processes_write_what_one_computes(module, tmp_path):
    port = free_port()
    procs = [start(module, tmp_path, i, port, {**SWEEP[module], "distributed": ()})
             for i in range(2)]
    (out0, err0), (out1, err1) = (p.communicate(timeout=300) for p in procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, err0[-2000:] + err1[-2000:]
    assert re.search(r"(?<!\d)2 device\(s\)", out0), out0  # process 0 reports all devices
    assert "final return" not in out1 and "steps " not in out1, out1  # process 1 stays silent

    args = module.validate(module.Args(track=False, **SWEEP[module]))
    _, metrics, _ = module.run(args)  # conftest's 2 devices: the same runs on each device
    key, tag = METRIC[module]
    values = np.asarray(metrics[key])
    run_dirs = sorted(tmp_path.glob("*/learning_rate=*"))
    assert len(run_dirs) == 2, list(tmp_path.iterdir())
    for c, config in enumerate(module.grid(args)):
        [run_dir] = [d for d in run_dirs if d.name.endswith(f"={config['learning_rate']:g}")]
        for k in range(args.num_seeds):
            written = [v for _, v in read_scalars(run_dir / f"seed_{k}", tag)]
            np.testing.assert_array_equal(np.float32(written), values[c, k])


@pytest.mark.parametrize("module", SWEEP, ids=lambda m: m.__name__)
def test_runs_that_do_not_split_over_the_processes(module, tmp_path):
    """1 configuration x 3 seeds cannot be split over 2 processes (the address flags imply
    --distributed): both say so in one line, exit 2 and write nothing."""
    port, fields = free_port(), {**SWEEP[module], "learning_rate": (0.1,), "num_seeds": 3}
    procs = [start(module, tmp_path, i, port, fields) for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(lines) == 1, err[-2000:]
        assert "do not split over 2 processes" in lines[0]
    assert not any(tmp_path.glob("*__*"))


@pytest.mark.parametrize("module", SWEEP, ids=lambda m: m.__name__)
def test_unreachable_coordinator_is_one_line_after_the_timeout(module, monkeypatch):
    """Process 1 with no process 0: a one-line error once JOIN_TIMEOUT_S has passed, no hang
    (checked in-process with a 2 s timeout; nothing listens on the port)."""
    monkeypatch.setattr(module, "JOIN_TIMEOUT_S", 2)
    args = module.Args(distributed=True, coordinator_address=f"127.0.0.1:{free_port()}",
                       num_processes=2, process_id=1)
    with pytest.raises(module.ArgError, match="nothing answered within 2 s"):
        module.start_processes(args)
