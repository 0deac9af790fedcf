"""Long runs (issue 18): what training in segments costs against one program, how long a
checkpoint takes to write and how big it is, and whether tensorboard shows a run while it goes.

    python benchmarks/bench_long_runs.py [--repeats 3] [--quick]
    python benchmarks/run.py --only long_runs [--quick]    # writes LONG_RUNS.md

Segments against one program: `ppo.py --num-seeds 8` and `ppo.py --num-envs 2048` (the file's 4
seeds), each run as typed in a fresh process (common.run_as_typed: tensorboard on, --log-dir in a
temporary directory) with a warm compilation cache, as three programs: the file as typed (its
default segments, tensorboard events and a checkpoint after each), the same with
`--num-segments 1`, and ppo.py before the segments, which ran the whole run as one program
(`git show cf6e13e:algos/ppo.py`, written to a temporary folder at run time: never committed).
Each program runs once to fill the cache, then --repeats times, the three alternating; medians.
Whole process: launch to exit. Run: from the end of the compile to the end of the last write of
the results (the last checkpoint; before the segments: the tensorboard events, written after
the run). Checkpoints: every write_checkpoint call timed in the process, the file's size.

Live tensorboard: `ppo.py --num-envs 2048 --num-seeds 8` as a subprocess (cold: the run that
fills an empty cache, then warm), its event files read while it runs (with tensorboard's own
reader, which stops at a record still being written) until they hold a scalar: when, against
the whole process's time (target: before half of it).

Not part of the default `benchmarks/run.py` run: about 10 minutes on a quiet 2-core machine
(26 processes, `ppo.py --num-envs 2048` most of the time), past the full run's 25-minute budget."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BEFORE = "cf6e13e"  # the last commit whose ppo.py ran the whole run as one program
COMMANDS = {"ppo.py --num-seeds 8": ["--num-seeds", "8"], "ppo.py --num-envs 2048": [
    "--num-envs", "2048"]}
QUICK = {"ppo.py --num-seeds 8": ["--total-timesteps", "40960"],  # 20 updates of 2048 steps
         "ppo.py --num-envs 2048": ["--total-timesteps", "131072"]}  # 4 updates of 32768
PROGRAMS = {  # name -> (label, folder of ppo.py: None for the one taken from git, extra flags)
    "segments": ("the file as typed (default segments)", common.ALGOS, []),
    "one_segment": ("`--num-segments 1`", common.ALGOS, ["--num-segments", "1"]),
    "single_program": (f"before the segments ({BEFORE}: one program)", None, []),
}
LIVE = ["--num-envs", "2048", "--num-seeds", "8"]
LIVE_QUICK = ["--total-timesteps", "131072"]
POLL_S = 0.1  # how often the event files are read while the live run goes
WRITES = ("write_checkpoint", "write_tensorboard")  # functions timed where the file has them


# ----------------------------------------------------------------------------- worker
def worker(config: dict) -> dict:
    """ppo.py (config["folder"]) as typed with config["flags"] in this process; every write of
    its results timed (checkpoints, tensorboard events), the checkpoint's size in bytes."""
    algo = common.import_algo("ppo", Path(config["folder"]))
    writes = {name: [] for name in (*WRITES, "tensorboard")}  # name -> [(start, end)]
    size = {"bytes": 0}

    def timed(name, fn):
        def call(*a, **k):
            start = time.time()
            out = fn(*a, **k)
            writes[name].append((start, time.time()))
            if name == "write_checkpoint":
                size["bytes"] = os.path.getsize(os.path.join(a[0], "checkpoint.msgpack"))
            return out
        return call

    # Where the writes are: the file's own (before algos/runner/), or the runner's modules
    places = [algo] if common.own_runner(algo) else [
        common.runner_module(name, Path(config["folder"])) for name in ("files", "events")]
    for place in places:
        for name in WRITES:
            if hasattr(place, name):
                setattr(place, name, timed(name, getattr(place, name)))
        if hasattr(place, "Tensorboard"):  # the segmented file appends events after each segment
            place.Tensorboard.write = timed("tensorboard", place.Tensorboard.write)
    kept = common.run_as_typed("ppo", config["flags"], Path(config["folder"]))
    timing = kept["timing"]
    ends = [end for spans in writes.values() for _, end in spans]
    run_start = kept["returned_at"] - timing["run_s"]
    return {"compile_s": timing["compile_s"], "cached": bool(timing["cached"]),
            "run_s": max([kept["returned_at"], *ends]) - run_start,
            "checkpoint_s": [end - start for start, end in writes["write_checkpoint"]],
            "tensorboard_s": sum(end - start for name in ("tensorboard", "write_tensorboard")
                                 for start, end in writes[name]),
            "checkpoint_bytes": size["bytes"]}


# ----------------------------------------------------------------------------- measurements
def program_before(folder: str) -> str:
    """Write ppo.py as it was at BEFORE into folder/ppo.py (from git); returns folder."""
    proc = subprocess.run(["git", "show", f"{BEFORE}:algos/ppo.py"], cwd=common.ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"git show {BEFORE}:algos/ppo.py failed (a git checkout with the "
                           f"project's history is needed): {proc.stderr.strip()}")
    (Path(folder) / "ppo.py").write_text(proc.stdout)
    return folder


def segments_table(repeats: int, quick: bool) -> tuple[str, str]:
    """The table of the three programs, and the checkpoints' table."""
    rows, checkpoint_rows = [], []
    with tempfile.TemporaryDirectory() as before:
        folders = {k: str(folder or program_before(before)) for k, (_, folder, _) in
                   PROGRAMS.items()}
        for command, flags in COMMANDS.items():
            flags = [*flags, *(QUICK[command] if quick else [])]
            runs = {k: [] for k in PROGRAMS}
            with tempfile.TemporaryDirectory() as cache:
                measure = lambda k: common.run_worker(  # noqa: E731
                    Path(__file__), {"folder": folders[k], "flags": [
                        *flags, *PROGRAMS[k][2], "--compile-cache-dir", cache]}, as_user=True)
                for k in PROGRAMS:  # fills the cache: every timed run is warm
                    measure(k)
                for _ in range(repeats):
                    for k in PROGRAMS:
                        runs[k].append(measure(k))
            print(f"  long runs {command}: " + ", ".join(
                f"{k} {statistics.median(r['process_s'] for r in runs[k]):.1f} s"
                for k in PROGRAMS), flush=True)
            median = {k: {field: statistics.median(r[field] for r in runs[k])
                          for field in ("process_s", "run_s")} for k in PROGRAMS}
            base = median["single_program"]
            typed = " ".join(["ppo.py", *flags])
            for k, (label, _, _) in PROGRAMS.items():
                segments = len(runs[k][0]["checkpoint_s"]) or 1
                rows.append([f"`{typed}`", label, segments, f"{median[k]['process_s']:.2f}",
                             f"{median[k]['run_s']:.2f}",
                             f"{100 * (median[k]['process_s'] / base['process_s'] - 1):+.1f}%",
                             f"{100 * (median[k]['run_s'] / base['run_s'] - 1):+.1f}%",
                             " / ".join(f"{r['process_s']:.1f}" for r in runs[k]),
                             "yes" if all(r["cached"] for r in runs[k]) else "no"])
            typed_runs = runs["segments"]
            writes = [s for r in typed_runs for s in r["checkpoint_s"]]
            total = statistics.median(sum(r["checkpoint_s"]) for r in typed_runs)
            checkpoint_rows.append([
                f"`{typed}`", len(typed_runs[0]["checkpoint_s"]),
                f"{typed_runs[-1]['checkpoint_bytes'] / 2**20:.2f}",
                f"{1e3 * statistics.median(writes):.1f}", f"{1e3 * max(writes):.1f}",
                f"{total:.2f}", f"{100 * total / median['segments']['run_s']:.1f}%",
                f"{statistics.median(r['tensorboard_s'] for r in typed_runs):.2f}"])
    table = common.md_table(
        ["command", "program", "segments", "whole process s", "run s",
         "whole process vs one program", "run vs one program", "every run (whole process s)",
         "warm cache"], rows)
    checkpoints = common.md_table(
        ["command (as typed)", "checkpoints per run", "size MiB", "one write ms (median)",
         "slowest write ms", "all writes s per run", "share of run", "tensorboard writes s"],
        checkpoint_rows)
    return table, checkpoints


def scalar_steps(log_dir: str) -> list[int]:
    """The steps of every scalar in the event files under log_dir, read as tensorboard reads them
    while they are written (a record not yet complete is left for the next read; simple values
    come out as tensors of its scalars plugin)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [event.step for path in Path(log_dir).rglob("events.out.tfevents.*")
            for event in EventFileLoader(str(path)).Load()
            if any(v.metadata.plugin_data.plugin_name == "scalars" for v in event.summary.value)]


def live_run(flags: list[str], cache: str) -> dict:
    """`python algos/ppo.py FLAGS` as a subprocess; its event files polled every POLL_S until they
    hold a scalar: when (seconds from launch), the largest step then, the whole process's time
    and the last step of the run."""
    with tempfile.TemporaryDirectory() as log_dir:
        command = [sys.executable, str(common.ALGOS / "ppo.py"), *flags, "--compile-cache-dir",
                   cache, "--log-dir", log_dir]
        with open(Path(log_dir) / "output.txt", "w") as out:  # no pipe left to fill up
            t0 = time.perf_counter()
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                    env=common.user_env(), cwd=common.ROOT)
            first = None
            while proc.poll() is None and first is None:
                steps = scalar_steps(log_dir)
                if steps:
                    first = time.perf_counter() - t0, max(steps)
                time.sleep(POLL_S)
            proc.wait()
            whole = time.perf_counter() - t0
        if proc.returncode:
            text = (Path(log_dir) / "output.txt").read_text()
            raise RuntimeError(f"{' '.join(command)}: exit {proc.returncode}: {text[-2000:]}")
        return {"first_s": first and first[0], "first_step": first and first[1],
                "whole_s": whole, "last_step": max(scalar_steps(log_dir))}


def live_table(quick: bool) -> str:
    flags = [*LIVE, *(LIVE_QUICK if quick else [])]
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for label in ("cold (compiles, fills the cache)", "warm"):
            r = live_run(flags, cache)
            seen = "never, while it ran" if r["first_s"] is None else (
                f"{r['first_s']:.1f} s ({100 * r['first_s'] / r['whole_s']:.0f}%), steps up to "
                f"{r['first_step']:,} of {r['last_step']:,}")
            rows.append([f"`ppo.py {' '.join(flags)}`", label, f"{r['whole_s']:.1f}", seen])
    return common.md_table(["command", "cache", "whole process s",
                            "first scalars in the event files (from launch)"], rows)


def run(quick: bool = False, repeats: int = 3) -> str:
    load_start = common.load_average()
    repeats = 1 if quick else repeats
    table, checkpoints = segments_table(repeats, quick)
    live = live_table(quick)
    return "\n\n".join([
        "## Long runs: segments against one program, checkpoints, live tensorboard",
        f"{common.machine_header()}. Load average (1, 5, 15 min) at the start: {load_start}; at "
        f"the end: {common.load_average()}.",
        f"Each command as typed in a fresh process (tensorboard on, --log-dir in a temporary "
        f"directory), warm compilation cache, medians of {repeats}, the programs alternating. "
        f"One program: ppo.py at {BEFORE}, before the segments (from git). Run: from the end of "
        "the compile to the end of the last write of the results (checkpoint; one program: its "
        "tensorboard events, written after the run). Target (issue 18): the file as typed "
        "within 3% of the one program, whole process and run.",
        table,
        "Checkpoints of the file as typed (write_checkpoint timed in the process: serialise, "
        "hash, write beside, fsync, rename; every write of every timed run; the run directory "
        f"under {tempfile.gettempdir()}):",
        checkpoints,
        "Live tensorboard: the event files read while the run goes, with tensorboard's own "
        f"reader, every {POLL_S} s. Target (issue 18): scalars before half of the run.",
        live,
    ])


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--quick", action="store_true", help="tiny budgets, one repeat")
        opts = parser.parse_args()
        print(run(opts.quick, opts.repeats))
