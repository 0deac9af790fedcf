"""Shared test setup and helpers.

Two host CPU devices (so every run exercises the pmap path), algos/ on sys.path, and the helpers
the per-algorithm test files share: running a script as a user would, checking a usage error, and
reading tensorboard scalars back."""
import os
import subprocess
import sys
from pathlib import Path

# Must happen before jax is imported anywhere in the test process.
_DEVICES_FLAG = "--xla_force_host_platform_device_count=2"
if _DEVICES_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICES_FLAG).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
if str(ALGOS) not in sys.path:
    sys.path.insert(0, str(ALGOS))


def run_script(script, *flags, cwd=None, timeout=300):
    """Run `algos/<script>` (or a path) as a user would, on 2 host devices; returns CompletedProcess."""
    path = Path(script) if Path(script).is_absolute() else ALGOS / script
    return subprocess.run(
        [sys.executable, str(path), *map(str, flags)],
        cwd=cwd or ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=timeout,
    )


def assert_usage_error(script, flags, flag, tmp_path):
    """Bad input: exit status 2, a one-line error naming `flag`, nothing written, nothing compiled."""
    proc = run_script(script, *flags, "--log-dir", tmp_path / "runs", cwd=tmp_path, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert flag in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()


def read_scalars(run_dir, tag):
    """[(step, value), ...] of one scalar tag in the event files under `run_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags()["scalars"]:
        return []
    return [(e.step, e.value) for e in acc.Scalars(tag)]
