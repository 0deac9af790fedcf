"""One run over several devices (issue 41): one seed of ppo.py on 1 device, on the 2 devices of one
process (its envs split, gradients averaged: the default when there are fewer runs than devices),
and over 2 processes of 1 device each (--distributed on 127.0.0.1, gloo), as a user types it.

    python benchmarks/bench_devices.py [--repeats 3] [--quick]
    python benchmarks/run.py --only devices        # writes DEVICES.md (about 10 minutes, 2 cores)

Each layout first fills a compilation cache of its own (not timed), then runs `repeats` times,
the layouts taking turns; medians. Training steps/s is the run's own (the summary's, compile
excluded); the process time is a user's wait, compile from the warm cache included. Target: on
CartPole-v1 --num-envs 2048 the 2-device run at least 1.3x the 1-device one's steps/s, and it
still ends at 500."""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

WORKLOADS = {  # name -> ppo.py flags of one seed
    "CartPole-v1, 2048 envs": ["--num-seeds", "1", "--num-envs", "2048"],
    "Breakout-MinAtar (its preset)": ["--num-seeds", "1", "--env-id", "Breakout-MinAtar"],
}
QUICK = ["--total-timesteps", "200000"]
LAYOUTS = {  # name -> (processes, devices per process)
    "1 device": (1, 1), "1 process x 2 devices": (1, 2), "2 processes x 1 device": (2, 1)}


def one_run(flags: list[str], layout: str, cache: str) -> dict:
    """The command in the layout; process 0's summary: steps/s, final return, evaluations, and the
    seconds until every process exited."""
    outs, process_s = common.run_processes("ppo", flags, *LAYOUTS[layout], cache)
    number = lambda pattern: float(re.search(pattern, outs[0]).group(1).replace(",", ""))
    return {"sps": number(r"\|\s+([\d,]+) steps/s"), "process_s": process_s,
            "final": number(r"final return per seed \(last 5% of updates\): (\S+)"),
            "greedy": number(r"eval/episodic_return_greedy per seed \(\d+ episodes\): (\S+)"),
            "sampled": number(r"eval/episodic_return_sampled per seed \(\d+ episodes\): (\S+)"),
            "devices": re.search(r"(\d+ device\(s\)[^|]*?)  compile", outs[0]).group(1)}


def run(quick: bool = False, repeats: int = 3) -> str:
    load_start, rows = common.load_average(), []
    for workload, flags in WORKLOADS.items():
        flags = flags + (QUICK if quick else [])
        runs = {layout: [] for layout in LAYOUTS}
        with tempfile.TemporaryDirectory() as caches:
            for layout in LAYOUTS:  # each layout's cache filled once, untimed
                one_run(flags, layout, f"{caches}/{layout}")
            for _ in range(repeats):
                for layout in LAYOUTS:
                    runs[layout].append(one_run(flags, layout, f"{caches}/{layout}"))
        base = statistics.median(r["sps"] for r in runs["1 device"])
        for layout, results in runs.items():
            sps = statistics.median(r["sps"] for r in results)
            median = lambda key: statistics.median(r[key] for r in results)
            print(f"  {workload}, {layout}: {sps:,.0f} steps/s", flush=True)
            rows.append([workload, layout, results[0]["devices"], f"{sps:,.0f}",
                         f"{sps / base:.2f}x", f"{median('process_s'):.1f}",
                         f"{median('final'):.4g}", f"{median('greedy'):.4g}",
                         f"{median('sampled'):.4g}",
                         " / ".join(f"{r['sps'] / 1000:,.0f}k" for r in results)])
    headers = ["workload (ppo.py, 1 seed)", "layout", "summary says", "training steps/s",
               "vs 1 device", "process s", "final return", "greedy eval", "sampled eval",
               "every run's steps/s"]
    return "\n\n".join([
        "## One run over several devices",
        f"`python algos/ppo.py --num-seeds 1 --num-envs 2048` and `python algos/ppo.py "
        f"--num-seeds 1 --env-id Breakout-MinAtar`{' (quick: 200k steps)' if quick else ''}, "
        f"each layout from a warm compilation cache of its own, {repeats} runs taking turns, "
        "medians (the returns: each run's, median over the runs; 64 evaluation episodes). The "
        "layouts: XLA_FLAGS=--xla_force_host_platform_device_count=1 (1 device), the default on "
        "this host (2 devices: the seed's envs split over them, its gradients and batch "
        "statistics averaged at every step), and --distributed over 2 processes of 1 device each, "
        "one per core (taskset). Load average at the start: "
        f"{load_start}; at the end: {common.load_average()}.",
        common.md_table(headers, rows)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="200k steps: checks the script")
    opts = parser.parse_args()
    print(common.machine_header() + "\n\n" + run(opts.quick, opts.repeats))
