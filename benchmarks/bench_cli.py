"""The commands a user types, as typed: whole-process time and time to solve, cold and warm cache.

    python benchmarks/bench_cli.py [--quick]
    python benchmarks/run.py --only commands

Each command runs as `python algos/<file> ... --num-seeds 8 --no-track` in a fresh process
(common.run_command: the file's own main() on that command line), on the devices the file
chooses itself (one per core). "cold": an empty compilation-cache directory, so the process
compiles; "warm": the same directory again, filled by the cold run (a user's second run). Time to
solve: from the process's launch until every seed's per-update score had reached the command's
threshold (common.COMMANDS). One process per row: a single measurement each, not a median.

Also what ppo.py's implementation choices buy or cost (its LLVM -O1 compile, its segments: one
compiled program called once per segment, a checkpoint after each): `ppo.py --num-seeds 8` trained
twice per program, each choice undone in turn, in one process."""
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
CHOICES = ("ppo", ["--num-seeds", str(SEEDS)], 2)  # command, flags, runs of each; not --quick
PROGRAMS = {  # the file's implementation choices, each undone in turn (choices_worker)
    "file": "the file as typed (LLVM -O1, default segments, a checkpoint after each)",
    "llvm_o2": "XLA's default LLVM optimisation level instead of -O1",
    "one_segment": "`--num-segments 1`: the whole run in one call, one checkpoint at the end",
}
EXTRA_FLAGS = {"one_segment": ["--num-segments", "1"]}  # the choice as a flag of the file
LAST = {}  # name -> {"cold": result, "warm": result} of the latest run() (peers.py reads it)


def choices_worker(config: dict) -> dict:
    """One command as typed, config["runs"] times per program of PROGRAMS in turn (one
    compilation cache: each program's first run compiles, the others load it): compile_s and
    run_s of each run."""
    algo = common.import_algo(config["file"])
    options = algo.COMPILER_OPTIONS
    flags = [*config["flags"], "--no-track", "--compile-cache-dir", config["cache"]]
    out = {}
    for program in PROGRAMS:
        algo.COMPILER_OPTIONS = {} if program == "llvm_o2" else options
        timings = [common.run_as_typed(config["file"], flags + EXTRA_FLAGS.get(program, []))
                   ["timing"] for _ in range(config["runs"])]
        out[program] = {k: [t[k] for t in timings] for k in ("compile_s", "run_s")}
    return out


def choices_table() -> str:
    file, flags, runs = CHOICES
    with tempfile.TemporaryDirectory() as cache:
        r = common.run_worker(Path(__file__), {"file": file, "flags": flags, "cache": cache,
                                               "runs": runs}, as_user=True)
    compile_s = {k: r[k]["compile_s"][0] for k in PROGRAMS}  # r also holds process_s, ...
    run_s = {k: float(np.median(r[k]["run_s"])) for k in PROGRAMS}
    rows = [[label, f"{compile_s[k]:.1f}", f"{run_s[k]:.2f}",
             f"{compile_s[k] / compile_s['file']:.2f}x", f"{run_s[k] / run_s['file']:.2f}x"]
            for k, label in PROGRAMS.items()]
    return (f"`{file}.py {' '.join(flags)}`'s implementation choices, each undone in turn (one "
            f"process, {runs} runs per program: the first compiles, the next load the cache; "
            "run: median):\n\n" + common.md_table(
                ["program", "compile s (cold)", "run s", "compile vs the file",
                 "run vs the file"], rows)
            + f"\n\nSegments cost {100 * (run_s['file'] / run_s['one_segment'] - 1):+.1f}% of "
              "the run time. Both run times end when the last segment returns, before its "
              "checkpoint: the file's holds its other segments' checkpoints and the calls between "
              "them. benchmarks/bench_long_runs.py times both as whole processes, with "
              "tensorboard.")


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
        "PPO and VPG; q_learning greedy_optimal 1.0).",
        common.md_table(headers, rows),
        *([] if quick else [choices_table()]),
    ])


if __name__ == "__main__":
    if not common.worker_entry(choices_worker):
        print(common.machine_header(), f"load average {common.load_average()}\n", sep="; ")
        print(run(quick="--quick" in sys.argv))
