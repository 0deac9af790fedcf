"""The commands a user types, as typed: whole-process time and time to solve, cold and warm cache.

    python benchmarks/bench_cli.py [--quick]
    python benchmarks/run.py --only commands

Each command runs as `python algos/<file> ... --num-seeds 8 --no-track` in a fresh process
(common.run_command: the file's own main() on that command line), on the devices the file
chooses itself (one per core). "cold": an empty compilation-cache directory, so the process
compiles; "warm": the same directory again, filled by the cold run (a user's second run). Time to
solve: from the process's launch until every seed's per-update score had reached the command's
threshold (common.COMMANDS). One process per row: a single measurement each, not a median.

Also the cost of the in-jit progress callbacks: `ppo.py --num-seeds 8` trained twice with them and
twice without in one process (the second compile of each comes from the cache)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SEEDS = 8
NAMES = ("ppo", "ppo_pendulum", "vpg", "vpg_pendulum", "q_learning")  # of common.COMMANDS
QUICK = {"q_learning": ["--num-seeds", "2", "--total-timesteps", "2000"]}
PROGRESS = ("ppo", ["--num-seeds", str(SEEDS)], 2)  # command, flags, runs of each; not --quick
LAST = {}  # name -> {"cold": result, "warm": result} of the latest run() (peers.py reads it)


def progress_worker(config: dict) -> dict:
    """Run one command config["runs"] times with the progress callbacks, then as many times
    without (every jax.debug.callback made a no-op before tracing): the run_s of each."""
    import jax

    flags = [*config["flags"], "--no-track", "--compile-cache-dir", config["cache"]]
    times = {}
    for label in ("with", "without"):
        if label == "without":
            jax.debug.callback = lambda *a, **k: None
        times[label] = [common.run_as_typed(config["file"], flags)["timing"]["run_s"]
                        for _ in range(config["runs"])]
    return times


def progress_overhead() -> str:
    file, flags, runs = PROGRESS
    with tempfile.TemporaryDirectory() as cache:
        r = common.run_worker(Path(__file__), {"file": file, "flags": flags, "cache": cache,
                                               "runs": runs}, as_user=True)
    a, b = float(np.median(r["with"])), float(np.median(r["without"]))
    return (f"Progress callbacks (`{file}.py {' '.join(flags)}`, {runs} runs with them and "
            f"{runs} without, one process): run {a:.2f} s with, {b:.2f} s without (medians): "
            f"overhead {100 * (a - b) / b:+.1f}%.")


def row(result: dict, label: str, threshold: float) -> list:
    final = np.asarray(result["final"][0])
    solve_s, reached = common.solve_time(result["reach_s"][0])
    return [f"`{result['command']}`", label, result["devices"], f"{result['process_s']:.1f}",
            f"{result['compile_s']:.1f}" + (" (cache)" if result["cached"] else ""),
            f"{result['run_s']:.1f}", f"{result['sps']:,.0f}",
            f"{solve_s:.1f}" if solve_s is not None else f"{reached}/{len(final)} reached",
            common.with_ci(final), f"{final.min():.4g}"]


def measure(name: str, extra_flags: list[str]) -> dict:
    """common.COMMANDS[name] + extra_flags, cold then warm: {"cold": result, "warm": result}."""
    file, flags, threshold = common.COMMANDS[name]
    with tempfile.TemporaryDirectory() as cache:
        LAST[name] = {label: common.run_command(file, [*flags, *extra_flags], threshold, cache)
                      for label in ("cold", "warm")}  # in this order: cold fills the cache
    print(f"  commands {name}: " + ", ".join(
        f"{label} {r['process_s']:.0f} s" for label, r in LAST[name].items()), flush=True)
    return LAST[name]


def run(quick: bool = False) -> str:
    rows = []
    for name in QUICK if quick else NAMES:
        result = measure(name, QUICK[name] if quick else ["--num-seeds", str(SEEDS)])
        rows += [row(result[label], label, common.COMMANDS[name][2]) for label in result]
    headers = ["command", "cache", "devices", "whole process s", "compile s", "run s",
               "steps/s (all seeds)", "every seed reached the threshold by (s, whole process)",
               "final score, mean [95% CI]", "worst seed"]
    return "\n\n".join([
        "## The commands as typed: whole-process time and time to solve, cold and warm cache",
        "`python algos/<file> ... --no-track`, one fresh process per row (a single "
        "measurement each, not a median), on the devices the "
        "file picks (one per core). cold: an empty compilation cache; warm: the cache the cold "
        "run filled (a second run of the same command). Whole process: from launch to exit. "
        "Thresholds and scores as in the robustness table (CartPole-v1 475; Pendulum-v1 -250 "
        "PPO, -1020 VPG; q_learning greedy_optimal 1.0).",
        common.md_table(headers, rows),
        *([] if quick else [progress_overhead()]),
    ])


if __name__ == "__main__":
    if not common.worker_entry(progress_worker):
        print(common.machine_header(), f"load average {common.load_average()}\n", sep="; ")
        print(run(quick="--quick" in sys.argv))
