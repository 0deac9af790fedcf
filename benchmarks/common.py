"""Helpers every benchmark script shares: machine header, markdown tables, IQM and bootstrap CIs,
the worker protocol that measures one workload in its own process (so compile time and peak memory
belong to that workload alone), and the default commands a user types, run as typed.

    python benchmarks/common.py --worker JSON   # one command as typed (what run_command starts)
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGOS = ROOT / "algos"
RESULTS = ROOT / "benchmarks" / "results"
if "--quick" in sys.argv:  # numbers that check the pipeline: never over the committed results
    RESULTS = RESULTS / "quick"
# The default commands a user types (the README's first examples), their flags, and the threshold
# each one's score is held to: the final return (the mean episode return over the last 5% of
# updates) for PPO and VPG, the final stats/greedy_optimal for q_learning (1.0: every agent's
# greedy action is optimal in every state).
COMMANDS = {
    "ppo": ("ppo", [], 475.0),
    "ppo_2048": ("ppo", ["--num-envs", "2048"], 475.0),
    "ppo_pendulum": ("ppo", ["--env-id", "Pendulum-v1"], -250.0),
    "vpg": ("vpg", [], 475.0),
    "vpg_pendulum": ("vpg", ["--env-id", "Pendulum-v1"], -250.0),
    "q_learning": ("q_learning", [], 1.0),
    "pqn": ("pqn", [], 475.0),  # its training return explores (epsilon 0.2): see its evaluation
}
CURVE_BINS = 100  # learning curves leave a worker as per-seed means over this many bins of updates


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


def code_version() -> str:
    """The commit the numbers come from, "+ uncommitted changes" where the tree differs from it."""
    def git(*words):
        return subprocess.run(["git", *words], cwd=ROOT, capture_output=True, text=True).stdout
    commit = git("rev-parse", "--short", "HEAD").strip() or "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--", "algos", "benchmarks", "requirements.txt",
                  ":(exclude)benchmarks/results")  # (the tables being written are not the code)
    return commit + (" + uncommitted changes" if changed else "")


def produced_by(command: str, mode: str = "full") -> list[str]:
    """A results file's first lines: the machine, and the command, mode, date and commit."""
    return [machine_header(),
            f"Produced by `{command}` ({mode}), {time.strftime('%Y-%m-%d')}, commit "
            f"{code_version()}."]


def write_part(script: str, option: str, name: str, part, description: str) -> None:
    """The command line of a part a benchmark script also runs alone (`python
    benchmarks/SCRIPT --OPTION [--quick]`): part(quick) -> its text, written with its header
    and the load at its start and end into results/NAME (results/quick/NAME with --quick)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(f"--{option}", action="store_true", help=f"the part alone, into "
                        f"results/{name} (the rest: benchmarks/run.py)")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: the pipeline")
    opts = parser.parse_args()
    if not getattr(opts, option):
        parser.error(f"--{option}: the one part this command runs alone (the rest: "
                     "benchmarks/run.py)")
    out = RESULTS / ("quick" if opts.quick else "") / name
    out.parent.mkdir(parents=True, exist_ok=True)
    command = f"python benchmarks/{script} --{option}{' --quick' if opts.quick else ''}"
    header = produced_by(command, "quick" if opts.quick else "full")  # the code run
    load_start = load_average()
    body = part(opts.quick)
    out.write_text("\n\n".join([
        *header, f"Load average (1, 5, 15 min) at the start: {load_start}.", *body,
        f"Load average at the end: {load_average()}."]) + "\n")
    print(f"wrote {out}")


def load_average() -> str:
    """The 1, 5 and 15 minute load averages: a number above ~0.3 means something else ran."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


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
    """Interquartile mean (Agarwal et al. 2021): the runner's (reports.iqm), which every table
    uses."""
    return runner_module("reports").iqm(x)


def bootstrap_ci(x, stat=np.mean):
    """Percentile-bootstrap 95% CI of `stat` over the runs in x: the runner's (reports), with its
    settings (5,000 resamples), as the training summary prints it."""
    return runner_module("reports").bootstrap_ci(x, stat)


def with_ci(x, stat=np.mean, spec: str = ".4g") -> str:
    """'stat [low, high]': the statistic over the seeds in x with its 95% bootstrap CI."""
    lo, hi = bootstrap_ci(x, stat=stat)
    return f"{stat(np.asarray(x, dtype=np.float64)):{spec}} [{lo:{spec}}, {hi:{spec}}]"


def bootstrap_band(curves, n_boot: int = 1000, level: float = 0.95, seed: int = 0):
    """Per column of curves [seeds, points]: the mean over seeds (NaN ignored) and its
    percentile-bootstrap CI, resampling whole seeds."""
    curves = np.asarray(curves, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(curves), size=(n_boot, len(curves)))
    means = np.nanmean(curves[idx], axis=1)  # [n_boot, points]
    a = (1.0 - level) / 2.0
    return (np.nanmean(curves, axis=0), np.nanquantile(means, a, axis=0),
            np.nanquantile(means, 1.0 - a, axis=0))


# ----------------------------------------------------------------------------- figures
def plot_band(ax, steps, curves, label: str) -> None:
    """The mean curve over seeds with its 95% bootstrap band, drawn through the finite bins only:
    a bin in which no seed finished an episode is NaN, and a line stops at every NaN (Freeway's
    2,500-step episodes end together, so most of its bins are NaN and no two finite ones meet)."""
    mean, lo, hi = bootstrap_band(curves)
    finite = np.isfinite(mean)
    steps = np.asarray(steps)[finite]
    ax.plot(steps, mean[finite], marker="." if finite.sum() < len(finite) // 2 else None,
            label=label)
    ax.fill_between(steps, lo[finite], hi[finite], alpha=0.25)


def new_figure(width: float, height: float, panels: int = 1):
    """A matplotlib Figure (no pyplot: no GUI backend, no global figure to close) and its row of
    `panels` axes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="tight")
    return fig, fig.subplots(1, panels, squeeze=False)[0]


def save_figure(fig, name: str) -> Path:
    """Write the figure as RESULTS/name; returns its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / name, dpi=100)
    return RESULTS / name


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
DEVICE_SETTINGS = ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")  # what a file reads to choose its devices


def user_env() -> dict:
    """This process's environment without the device settings: a command started with it picks
    its devices as a user's command would."""
    return {k: v for k, v in os.environ.items() if k not in DEVICE_SETTINGS}


def run_worker(script: Path, config: dict, timeout: float = 3600, env: dict | None = None,
               python: str | None = None, as_user: bool = False) -> dict:
    """Run `python script --worker JSON` in a fresh process; its last stdout line is a JSON dict.

    A fresh process per workload gives each its own compile time, its own whole-process wall time
    and its own peak memory. The result gains `process_s` (the process's wall time, from launch)
    and `launched_at` (time.time() at launch). as_user: without the device settings of this
    process's environment, so the workload picks its devices as a user's command would."""
    full_env = {**(user_env() if as_user else os.environ), **(env or {})}
    launched_at, t0 = time.time(), time.perf_counter()
    proc = subprocess.run(
        [python or sys.executable, str(script), "--worker", json.dumps(config)],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} worker {config} failed:\n{proc.stderr[-3000:]}\n"
                           f"exit status {proc.returncode}")  # (negative: killed by that signal)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.setdefault("process_s", wall)
    result["launched_at"] = launched_at
    return result


def worker_entry(fn) -> bool:
    """If this process was started by `run_worker`, run `fn(config)` and print its JSON result."""
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        result = fn(json.loads(sys.argv[2]))
        result["peak_rss_mib"] = peak_rss_mib()
        print(json.dumps(result))
        return True
    return False


def run_processes(name: str, flags: list[str], processes: int, devices: int,
                  cache: str) -> tuple[list[str], float]:
    """`python algos/<name>.py FLAGS --no-track` as `processes` processes of `devices` devices
    each (several: --distributed on 127.0.0.1, one core each by taskset: unpinned, each process's
    XLA threads spread over every core and they oversubscribe them, a q_learning sweep took 120 s
    instead of 58 s), its run directory in a temporary folder: (each process's stdout, seconds
    until every one exited). A process that fails raises RuntimeError with its error output."""
    env = {**user_env(), "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    if processes > 1:
        with socket.socket() as s:  # a free port for the coordinator
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        flags = [*flags, "--distributed", "--coordinator-address", f"127.0.0.1:{port}",
                 "--num-processes", str(processes)]
    pin = lambda i: ["taskset", "-c", str(i)] if processes > 1 and shutil.which("taskset") else []
    with tempfile.TemporaryDirectory() as log_dir:  # the run directory: process 0's checkpoints
        command = [sys.executable, str(ALGOS / f"{name}.py"), *flags, "--no-track",
                   "--compile-cache-dir", cache, "--log-dir", log_dir]
        rank = lambda i: ["--process-id", str(i)] if processes > 1 else []
        t0 = time.perf_counter()
        procs = [subprocess.Popen(pin(i) + command + rank(i), env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for i in range(processes)]
        outs = [proc.communicate(timeout=1800) for proc in procs]
        seconds = time.perf_counter() - t0
    for proc, (_, err) in zip(procs, outs):
        if proc.returncode:
            raise RuntimeError(f"{name} x{processes}: exit {proc.returncode}: {err[-2000:]}")
    return [out for out, _ in outs], seconds


def import_algo(name: str, folder: Path = ALGOS):
    """Import folder/<name>.py (default algos/) as a module (the files are scripts, not a
    package)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return __import__(name)


def runner_module(name: str = "", folder: Path = ALGOS):
    """The runner's module `name` (folder/runner/<name>.py; "": the package), the one beside the
    training files of folder (default algos/), which they run with. A process holds one runner:
    one imported from another folder is an error, not a measurement of the wrong code."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    module = importlib.import_module("runner" + (f".{name}" if name else ""))
    if Path(module.__file__).resolve().parent != (Path(folder) / "runner").resolve():
        raise RuntimeError(f"the training files of {folder} run with {folder}/runner/; this "
                           f"process imported {module.__file__}")
    return module


def own_runner(algo) -> bool:
    """Whether a file carries its own runner (its main()): is_eval.py, or a training file of
    before algos/runner/ (taken from git); the others are run by the runner beside them."""
    return hasattr(algo, "main")


UNWRAPPED = {}  # (module, name) -> the function run_as_typed wraps there, as it was


def wrap(module, name: str, wrapper):
    """module.name = wrapper(the original): wrapped once, however many runs a process makes."""
    setattr(module, name, wrapper(UNWRAPPED.setdefault((module, name), getattr(module, name))))


# ----------------------------------------------------------------------------- commands as typed
def run_as_typed(name: str, flags: list[str], folder: Path = ALGOS) -> dict:
    """In this process: `python algos/<name>.py FLAGS --log-dir TMP`, the file's command line (the
    runner's main on the file; a file with its own runner: its main()), its run directory,
    checkpoints included, in a temporary directory removed afterwards. Keeps the args, metrics
    and timing of the last segment that segments() yielded (the runner's, or the file's own), and
    when it came (time.time(): `returned_at`); a file without segments() (is_eval.py, ppo.py
    before the segmented runs) has its run() wrapped instead. folder: default algos/."""
    import jax

    algo = import_algo(name, folder)
    kept = {"algo": algo}
    keep = lambda args, metrics, timing: kept.update(  # noqa: E731
        args=args, metrics=jax.device_get(metrics), timing=timing, returned_at=time.time())

    def kept_segments(inner):
        def segments(args, *a, **k):
            for state, metrics, timing in inner(args, *a, **k):
                keep(args, metrics, timing)
                yield state, metrics, timing
        return segments

    def kept_run(inner):
        def run(args, *a, **k):
            state, metrics, timing = inner(args, *a, **k)
            keep(args, metrics, timing)
            return state, metrics, timing
        return run

    def kept_evals(inner):
        def summary(args, metrics, timing, evals={}):
            kept["evals"] = {k: np.asarray(v) for k, v in evals.items()}
            return inner(args, metrics, timing, evals)
        return summary

    if not own_runner(algo):  # the runner beside it trains it, and prints its summary
        wrap(runner_module("sweep", folder), "segments", kept_segments)
        wrap(runner_module("reports", folder), "summary", kept_evals)
        main = lambda: runner_module("cli", folder).main(algo)  # noqa: E731
    else:  # its own segments or run, and summary
        wrap(algo, *(("segments", kept_segments) if hasattr(algo, "segments")
                     else ("run", kept_run)))
        if hasattr(algo, "evaluator"):  # the end-of-training evaluation, as the summary gets it
            wrap(algo, "summary", kept_evals)
        main = algo.main
    with tempfile.TemporaryDirectory() as log_dir:
        sys.argv = [str(Path(folder) / f"{name}.py"), *flags, "--log-dir", log_dir]
        main()
    return kept


def held_from(score, threshold: float, window: float = 0.05):
    """score [..., points] -> per row, the first point from which the mean score over the trailing
    `window` of the points (NaN: no episode finished, ignored) stays at or above the threshold to
    the end, or -1: a sustained rule, one lucky point does not count (at the last point that mean
    is the final return). Every implementation's "reached by" uses it."""
    score = np.asarray(score, np.float64)
    n = score.shape[-1]
    w = max(1, round(n * window))
    valid = np.isfinite(score)
    sums, counts = np.cumsum(np.where(valid, score, 0.0), -1), np.cumsum(valid, -1)
    back = lambda c: np.concatenate([np.zeros((*c.shape[:-1], w)), c], -1)[..., :n]  # c[t - w]
    count = counts - back(counts)
    ok = (count > 0) & (sums - back(sums) >= threshold * np.maximum(count, 1))
    held = np.flip(np.logical_and.accumulate(np.flip(ok, -1), -1), -1)
    return np.where(held.any(-1), held.argmax(-1), -1)


def reach_fraction(score, threshold: float):
    """score [..., updates] -> the fraction of the run done at the end of the update from which
    the score held the threshold (held_from), 0 where it never did."""
    first = held_from(score, threshold)
    return np.where(first >= 0, first + 1, 0) / np.shape(score)[-1]


def command_worker(config: dict) -> dict:
    """One command as typed, then per configuration and seed: the final score, the fraction of the
    run after which the score first reached the threshold (None: never), and the learning curve
    (mean score over each of CURVE_BINS bins of updates)."""
    kept = run_as_typed(config["file"], config["flags"])
    args, metrics, timing = kept["args"], kept["metrics"], kept["timing"]
    configs = runner_module("flags").grid(args)
    lead = (len(configs), args.num_seeds)
    metrics = {k: np.asarray(v, dtype=np.float64).reshape(*lead, -1) for k, v in metrics.items()}
    key = "stats/greedy_optimal" if "stats/greedy_optimal" in metrics else "episode_return"
    score = metrics[key]
    if key == "episode_return":
        final = np.stack([runner_module("reports").final_returns({key: s}) for s in score])
    else:
        final = score[..., -1]
    updates = score.shape[-1]
    bins = np.array_split(np.arange(updates), min(CURVE_BINS, updates))
    with np.errstate(all="ignore"):  # a bin in which no episode finished is NaN
        curves = np.stack([np.nanmean(score[..., b], axis=-1) for b in bins], axis=-1)
    steps = metrics["env_steps"][0, 0]
    # The evaluation's mean return per configuration and seed: "greedy" and "sampled" ({} if none).
    evals = {k.rsplit("_", 1)[-1]: np.asarray(v, np.float64).reshape(lead).tolist()
             for k, v in kept.get("evals", {}).items()}
    return {
        "configs": configs, "final": final.tolist(), "evals": evals,
        "eval_episodes": getattr(args, "eval_episodes", 0),
        "reach_fraction": reach_fraction(score, config["threshold"]).tolist(),
        "curve_steps": [float(steps[b[-1]]) for b in bins],
        "curves": [[[None if np.isnan(v) else v for v in seed] for seed in c] for c in curves],
        "score": key, "num_seeds": args.num_seeds, "total_timesteps": args.total_timesteps,
        "compile_s": timing["compile_s"], "cached": bool(timing["cached"]),
        "run_s": timing["run_s"], "sps": timing["sps"], "devices": timing["devices"],
        "returned_at": kept["returned_at"],
    }


def run_command(name: str, flags: list[str], threshold: float, cache_dir: str,
                timeout: float = 3600) -> dict:
    """`python algos/<name>.py FLAGS --no-track --compile-cache-dir CACHE_DIR` in a fresh process
    (and --log-dir in a temporary directory: run_as_typed), on the devices the file picks
    itself. Adds, per configuration and seed, `reach_s`: seconds from the process's launch to the
    end of the update in which the seed first reached the threshold (updates taken as equally
    long), None if it never did. timeout: seconds before the process is killed (TimeoutExpired)."""
    r = run_worker(Path(__file__), {"file": name, "threshold": threshold, "flags": [
        *flags, "--no-track", "--compile-cache-dir", cache_dir]}, timeout=timeout, as_user=True)
    run_start = r["returned_at"] - r["run_s"] - r["launched_at"]
    r["reach_s"] = [[run_start + f * r["run_s"] if f else None for f in c]
                    for c in r["reach_fraction"]]
    r["command"] = " ".join([f"{name}.py", *flags])
    return r


def solve_time(reach_s: list) -> tuple[float | None, int]:
    """(seconds until every seed had reached the threshold or None, how many seeds reached it)."""
    reached = [t for t in reach_s if t is not None]
    return (max(reached) if len(reached) == len(reach_s) else None), len(reached)


if __name__ == "__main__":
    worker_entry(command_worker)
