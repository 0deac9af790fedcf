"""The commands a user types, as typed: whole-process time and time to solve, cold and warm cache.

    python benchmarks/bench_cli.py [--quick]
    python benchmarks/run.py --only commands

Each command runs as `python algos/<file> ... --num-seeds 8 --no-track` in a fresh process
(common.run_command: the runner's main on the file, on that command line), on the devices the file
chooses itself (one per core). "cold": an empty compilation-cache directory, so the process
compiles; "warm": the same directory again, filled by the cold run (a user's second run). Time to
solve: from the process's launch until every seed's score held the command's threshold
(common.COMMANDS; held: its mean over a trailing 5% of updates at or above it from then to the end,
common.held_from). One process per row: a single measurement each, not a median.

JAX writes a compiled program to the cache only when its compile took at least
jax_persistent_cache_min_compile_time_secs (1 s by default, which a user's run keeps): a warm
row whose cold run wrote nothing to the cache compiled again, and its cache column says so.

Also what ppo.py's implementation choices buy or cost (its LLVM -O1 compile, its segments: one
compiled program called once per segment, a checkpoint after each): `ppo.py --num-seeds 8`, per
program a warm-up run (it compiles, filling the cache) and 3 timed runs (they load the program
from the cache), the medians of the timed runs quoted, each choice undone in turn, in one
process."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SEEDS = 8
NAMES = ("ppo", "ppo_pendulum", "vpg", "vpg_pendulum", "q_learning")  # of common.COMMANDS
QUICK = {"q_learning": ["--num-seeds", "2", "--total-timesteps", "2000"]}
CHOICES = ("ppo", ["--num-seeds", str(SEEDS)])  # command and flags; not --quick
TIMED = 3  # timed runs per program after its warm-up run
PROGRAMS = {  # the file's implementation choices, each undone in turn (choices_worker)
    "file": "the file as typed (LLVM -O1, default segments, a checkpoint after each)",
    "llvm_o2": "XLA's default LLVM optimisation level instead of -O1",
    "one_segment": "`--num-segments 1`: the whole run in one call, one checkpoint at the end",
}
EXTRA_FLAGS = {"one_segment": ["--num-segments", "1"]}  # the choice as a flag of the file
LAST = {}  # name -> {"cold": result, "warm": result} of the latest run() (peers.py reads it)


def choices_worker(config: dict) -> dict:
    """One command as typed, config["runs"] times per program of PROGRAMS in turn (one
    compilation cache: each program's first run compiles, the others load it): compile_s, run_s
    and cached of each run."""
    algo = common.import_algo(config["file"])
    # The options the runner compiles with: the file's own where it has them, else the runner's
    # default (its contract), read at every compile.
    where = vars(algo) if "COMPILER_OPTIONS" in vars(algo) else common.runner_module().CONTRACT
    options = where["COMPILER_OPTIONS"]
    flags = [*config["flags"], "--no-track", "--compile-cache-dir", config["cache"]]
    out = {}
    for program in PROGRAMS:
        where["COMPILER_OPTIONS"] = {} if program == "llvm_o2" else options
        timings = [common.run_as_typed(config["file"], flags + EXTRA_FLAGS.get(program, []))
                   ["timing"] for _ in range(config["runs"])]
        out[program] = {k: [t[k] for t in timings] for k in ("compile_s", "run_s", "cached")}
    return out


def choices_table() -> str:
    file, flags = CHOICES
    with tempfile.TemporaryDirectory() as cache:
        r = common.run_worker(Path(__file__), {"file": file, "flags": flags, "cache": cache,
                                               "runs": 1 + TIMED}, as_user=True)
    # r also holds process_s, ...; the warm-up run compiles, the timed ones load the cache
    compile_s = {k: r[k]["compile_s"][0] for k in PROGRAMS}
    loaded_s = {k: float(np.median(r[k]["compile_s"][1:])) for k in PROGRAMS}
    cached = {k: all(r[k]["cached"][1:]) for k in PROGRAMS}
    run_s = {k: float(np.median(r[k]["run_s"][1:])) for k in PROGRAMS}
    rows = [[label, f"{compile_s[k]:.1f}", f"{loaded_s[k]:.1f}" + (
        "" if cached[k] else " (not cached)"), f"{run_s[k]:.2f}",
        f"{compile_s[k] / compile_s['file']:.2f}x", f"{run_s[k] / run_s['file']:.2f}x"]
        for k, label in PROGRAMS.items()]
    return (f"`{file}.py {' '.join(flags)}`'s implementation choices, each undone in turn (one "
            f"process; per program a warm-up run, which compiles, then {TIMED} timed runs, which "
            "load the program from the cache; compile s (warm) and run s: medians of the timed "
            "runs):\n\n" + common.md_table(
                ["program", "compile s (cold)", "compile s (warm)", "run s",
                 "compile (cold) vs the file", "run vs the file"], rows)
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
            f"{result['run_s']:.3g}", f"{result['sps']:,.0f}",
            f"{solve_s:.1f}" if solve_s is not None else f"{reached}/{len(final)} reached",
            common.with_ci(final), f"{final.min():.4g}"]


WARM_NOT_CACHED = "warm, not cached: the cold run's compiles each took under 1 s"


def cache_entries(cache: str) -> int:
    """The compiled programs in a compilation-cache directory (JAX writes a file `<name>-cache`
    per program)."""
    return sum(1 for path in Path(cache).iterdir() if path.name.endswith("-cache"))


def warm_label(cold: dict, warm: dict) -> str:
    """The cache column of a warm row: "warm" if its compile loaded a program from the cache;
    else what the cold run left there (nothing: JAX caches no compile under
    jax_persistent_cache_min_compile_time_secs, 1 s by default)."""
    if warm["cached"]:
        return "warm"
    return WARM_NOT_CACHED if cold["programs_cached"] == 0 else "warm, cache not used"


def measure(name: str, extra_flags: list[str]) -> dict:
    """common.COMMANDS[name] + extra_flags, cold then warm: {"cold": result, "warm": result};
    the cold result gains programs_cached, the number of programs it wrote to the cache."""
    file, flags, threshold = common.COMMANDS[name]
    with tempfile.TemporaryDirectory() as cache:
        LAST[name] = {}
        for label in ("cold", "warm"):  # in this order: cold fills the cache
            LAST[name][label] = common.run_command(file, [*flags, *extra_flags], threshold, cache)
            LAST[name][label]["programs_cached"] = cache_entries(cache)
    print(f"  commands {name}: " + ", ".join(
        f"{label} {r['process_s']:.0f} s" for label, r in LAST[name].items()), flush=True)
    return LAST[name]


def run(quick: bool = False) -> str:
    rows = []
    for name in QUICK if quick else NAMES:
        result = measure(name, QUICK[name] if quick else ["--num-seeds", str(SEEDS)])
        rows += [row(result["cold"], "cold", common.COMMANDS[name][2]),
                 row(result["warm"], warm_label(result["cold"], result["warm"]),
                     common.COMMANDS[name][2])]
    headers = ["command", "cache", "devices", "whole process s", "compile s", "run s",
               "steps/s (all seeds)", "every seed reached the threshold by (s, whole process)",
               "final score, mean [95% CI]", "worst seed"]
    return "\n\n".join([
        "## The commands as typed: whole-process time and time to solve, cold and warm cache",
        "`python algos/<file> ... --no-track`, one fresh process per row (a single "
        "measurement each, not a median), on the devices the "
        "file picks (one per core). cold: an empty compilation cache; warm: the cache as the "
        "cold run left it (a second run of the same command). JAX caches a program only when "
        "its compile took 1 s or more (jax_persistent_cache_min_compile_time_secs, default), so "
        "a program that compiles faster is compiled again by every run: a warm row says so "
        f"(\"{WARM_NOT_CACHED}\"). compile s \"(cache)\": at least one of the run's programs "
        "was loaded from the cache. Whole process: from launch to exit. "
        "Thresholds and scores as in the robustness table (CartPole-v1 475; Pendulum-v1 -250 "
        "PPO and VPG; q_learning greedy_optimal 1.0).",
        common.md_table(headers, rows),
        *([] if quick else [choices_table()]),
    ])


def greedy_solve(files=("ppo", "pqn"), threshold: float = 475.0) -> str:
    """CartPole-v1 solved by the greedy policy: `python algos/<file> --num-seeds 8
    --eval-every-segment` as typed otherwise, cold, in a fresh process; per seed its greedy
    evaluation after each segment (64 fresh episodes), read back from its event files, and the
    time from the launch to the segment from which it held the threshold (common.held_from over
    the segments). pqn's training return explores at epsilon 0.2 to the end, so the tables' rule
    (the training return held) never holds for it; the greedy policy is the one it learns."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = []
    for file in files:
        with tempfile.TemporaryDirectory() as folder:
            launched = time.time()
            proc = subprocess.run(
                [sys.executable, str(common.ALGOS / f"{file}.py"), "--num-seeds", str(SEEDS),
                 "--eval-every-segment", "--log-dir", folder, "--compile-cache-dir", folder],
                capture_output=True, text=True, env=common.user_env(), cwd=common.ROOT)
            process_s = time.time() - launched
            if proc.returncode:
                raise RuntimeError(proc.stderr[-2000:])
            reached = []
            for seed_dir in sorted(Path(folder).glob("*/seed_*")):
                events = EventAccumulator(str(seed_dir), size_guidance={"scalars": 0})
                events.Reload()
                points = events.Scalars("eval/episodic_return_greedy")
                first = common.held_from([p.value for p in points], threshold)
                reached.append(points[first].wall_time - launched if first >= 0 else None)
        solve_s, count = common.solve_time(reached)
        rows.append([f"`{file}.py --num-seeds {SEEDS} --eval-every-segment`",
                     f"{solve_s:.1f}" if solve_s else f"{count}/{SEEDS} reached",
                     f"{count}/{SEEDS}", f"{process_s:.1f}"])
    return "\n\n".join([
        "## CartPole-v1 solved by the greedy policy (ppo.py beside pqn.py)",
        f"Each as typed with `--num-seeds {SEEDS} --eval-every-segment`, one fresh process, an "
        "empty compilation cache: after each of its 10 segments every seed's greedy policy plays "
        "64 fresh episodes (in the process's time). Solved by: from the launch to the end of the "
        f"segment from which every seed's greedy return held {threshold:g} "
        "(common.held_from over the segments). pqn's behaviour policy explores at epsilon 0.2 "
        "to the end, so its training return never holds 475: the greedy policy is what it "
        f"learns. Load average at the end: {common.load_average()}.",
        common.md_table(["command", "every seed's greedy return held 475 by (s, whole process)",
                         "seeds", "whole process s"], rows)])


if __name__ == "__main__":
    if "--greedy-solve" in sys.argv:
        print(greedy_solve())
    elif not common.worker_entry(choices_worker):
        print(common.machine_header(), f"load average {common.load_average()}\n", sep="; ")
        print(run(quick="--quick" in sys.argv))
