"""Helpers every benchmark script shares: machine header, markdown tables, IQM and bootstrap CIs,
and the worker protocol that measures one workload in its own process (so compile time and peak
memory belong to that workload alone)."""
from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
RESULTS = ROOT / "benchmarks" / "results"


# ----------------------------------------------------------------------------- machine
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_header() -> str:
    """One markdown line naming the machine the numbers come from."""
    import jax

    gpus = [d.device_kind for d in jax.devices() if d.platform != "cpu"]
    gpu = ", ".join(gpus) if gpus else "none"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"Machine: {cpu_model()}, {cores} cores, GPU: {gpu}, "
        f"jax {jax.__version__}, Python {platform.python_version()}"
    )


# ---------------------------------------------------------------------------- tables and statistics
def md_table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            if v != v:
                return "n/a"
            return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def iqm(x) -> float:
    """Interquartile mean (Agarwal et al. 2021): the mean of the middle 50% of the values."""
    x = np.sort(np.asarray(x, dtype=np.float64).ravel())
    n = len(x)
    lo, hi = int(np.floor(0.25 * n)), int(np.ceil(0.75 * n))
    return float(x[lo:hi].mean()) if hi > lo else float(x.mean())


def bootstrap_ci(x, stat=np.mean, n_boot: int = 5000, level: float = 0.95, seed: int = 0):
    """Percentile-bootstrap confidence interval of `stat` over the runs in `x`."""
    x = np.asarray(x, dtype=np.float64).ravel()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    stats = np.array([stat(x[i]) for i in idx])
    a = (1.0 - level) / 2.0
    return float(np.quantile(stats, a)), float(np.quantile(stats, 1.0 - a))


# ----------------------------------------------------------------------------- timing and memory
def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_calls(fn, repeats: int):
    """Call `fn` once to compile/warm up, then `repeats` more times: (first_s, [steady_s])."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    steady = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        steady.append(time.perf_counter() - t0)
    return first, steady


# ----------------------------------------------------------------------------- worker protocol
def run_worker(script: Path, config: dict, timeout: float = 3600, env: dict | None = None,
               python: str | None = None) -> dict:
    """Run `python script --worker JSON` in a fresh process; its last stdout line is a JSON dict.

    A fresh process per workload gives each its own compile time, its own whole-process wall time
    and its own peak memory."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    t0 = time.perf_counter()
    proc = subprocess.run(
        [python or sys.executable, str(script), "--worker", json.dumps(config)],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} worker {config} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.setdefault("process_s", wall)
    return result


def worker_entry(fn) -> bool:
    """If this process was started by `run_worker`, run `fn(config)` and print its JSON result."""
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        result = fn(json.loads(sys.argv[2]))
        result["peak_rss_mib"] = peak_rss_mib()
        print(json.dumps(result))
        return True
    return False


def import_algo(name: str):
    """Import algos/<name>.py as a module (the files are scripts, not a package)."""
    if str(ALGOS) not in sys.path:
        sys.path.insert(0, str(ALGOS))
    return __import__(name)
