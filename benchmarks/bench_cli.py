"""The commands a user types, timed as whole processes: cold and warm compilation cache.

    python benchmarks/bench_cli.py [--quick] [--repeats 3]

Each command runs as `python algos/<file> ... --no-track` in a fresh process, on the devices the
file chooses itself (one per core). "cold": an empty cache directory, so the process compiles;
"warm": the same directory again, filled by the cold run. Whole-process time counts everything
from interpreter start; compile, run and steps/s are read from the command's summary line.
Medians over --repeats runs."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

COMMANDS = [  # (file, flags); --quick shortens the budgets
    ("ppo.py", ["--num-seeds", "8"]),
    ("ppo.py", ["--num-envs", "2048"]),
    ("q_learning.py", ["--num-agents", "8192"]),
]
QUICK = {"ppo.py": ["--total-timesteps", "65536"], "q_learning.py": ["--total-timesteps", "2000"]}
SUMMARY = re.compile(r"(\d+) device\(s\)\s+compile ([\d.]+) s( \(cache\))?\s+run ([\d.]+) s"
                     r"\s+\|\s+([\d,]+) (?:agent-)?steps/s")


def once(script, flags, cache):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(common.ALGOS / script), *flags, "--no-track",
                           "--compile-cache-dir", cache], capture_output=True, text=True,
                          cwd=common.ROOT, env=env)
    wall = time.perf_counter() - t0
    match = SUMMARY.search(proc.stdout)
    if proc.returncode != 0 or not match:
        raise RuntimeError(f"{script} {flags}: {proc.stderr[-2000:]}")
    lines = proc.stdout.splitlines()
    finals = next((line.split(": ")[1] for line in lines if line.startswith("final return")), "")
    return {"wall": wall, "devices": int(match[1]), "compile": float(match[2]),
            "cached": bool(match[3]), "run": float(match[4]),
            "sps": float(match[5].replace(",", "")), "finals": finals}


def run(quick: bool, repeats: int) -> str:
    rows = []
    for script, flags in COMMANDS:
        flags = flags + (QUICK[script] if quick else [])
        with tempfile.TemporaryDirectory() as cache:
            cold = [once(script, flags, cache)]  # fills the cache
            warm = [once(script, flags, cache) for _ in range(repeats)]
            with tempfile.TemporaryDirectory() as empty:  # more cold runs, each its own cache
                cold += [once(script, flags, os.path.join(empty, str(i)))
                         for i in range(repeats - 1)]
        for label, runs in [("cold", cold), ("warm", warm)]:
            med = {k: float(np.median([r[k] for r in runs]))
                   for k in ("wall", "compile", "run", "sps")}
            rows.append([f"`{script} {' '.join(flags)}`", label, runs[0]["devices"],
                         f"{med['wall']:.1f}", f"{med['compile']:.1f}"
                         + (" (cache)" if all(r["cached"] for r in runs) else ""),
                         f"{med['run']:.1f}", f"{med['sps']:,.0f}", runs[-1]["finals"][:60]])
            print(rows[-1], flush=True)
    load = os.getloadavg()
    headers = ["command", "cache", "devices", "whole process s", "compile s", "run s",
               "steps/s", "final return per seed (last run)"]
    return (f"### Commands as typed: whole-process time, cold and warm compilation cache\n\n"
            f"{common.machine_header()}; load average at the end "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n\nMedians of {repeats} runs each.\n\n"
            + common.md_table(headers, rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    print(f"load average at the start: {os.getloadavg()}")
    print(run(opts.quick, opts.repeats))
