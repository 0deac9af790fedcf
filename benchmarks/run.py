"""Reproduce the benchmark tables (benchmarks/results/; the README's results at a glance quote
them, each row naming its file), with one command.

    python benchmarks/run.py            # the full run: about 39 minutes on 2 cores (below)
    python benchmarks/run.py --peers    # and rejax / SB3 beside ours (about 19 minutes more;
                                        # their own environment: see benchmarks/peers.py)
    python benchmarks/run.py --quick    # the pipeline on tiny budgets, under a minute
    python benchmarks/run.py --only commands,q_learning
    python benchmarks/run.py --only envs  # every gymnax env, PPO and VPG beside a random policy
    python benchmarks/run.py --only long_runs  # segments vs one program, checkpoints, live
                                               # tensorboard (about 10 minutes)
    python benchmarks/run.py --only minatar    # ppo.py's MinAtar presets on five games beside
                                               # the published PPO returns (46 minutes)
    python benchmarks/run.py --only pbt        # --pbt on held-out seed bases (46 minutes)
    python benchmarks/run.py --only devices    # one seed over 1 and 2 devices, 2 processes
    python benchmarks/run.py --only rnn        # ppo_rnn.py beside ppo.py on memory tasks
    python benchmarks/run.py --only sac        # sac.py beside ppo.py, rejax and sbx (~38 min)
    python benchmarks/run.py --only td3        # td3.py, and as DDPG, beside sac.py, rejax and
                                               # CleanRL (~15 min)
    python benchmarks/run.py --only dqn        # dqn.py on held-out seeds, beside rejax (13 min)
    python benchmarks/run.py --only brax       # the CPU-sized Brax presets on held-out seeds,
                                               # ppo.py beside PureJaxRL on hopper (97
                                               # minutes measured, BRAX.md; hopper and walker2d
                                               # are 8 x 5M steps each)

Writes RESULTS.md (all tables, machine header and load averages first, the time of every section
last) and the PNGs into --out (default benchmarks/results/). Run it alone on the machine: numbers
from a loaded machine go in no table.
Every workload runs in its own process (common.run_worker). The envs section (well over an hour
on 2 cores), the long_runs section (about 10 minutes: it would break the budget below) and the
minatar section (46 minutes measured, MINATAR.md) run only when --only names them,
and write ENVS.md, LONG_RUNS.md and MINATAR.md, never RESULTS.md.

Time budget of the full run on 2 cores, in seconds (estimated from measurements on a quiet
machine; RESULTS.md ends with each section's real time):

    section     processes  est. s  what, and where the estimate comes from
    commands        11      300    5 commands x 8 seeds, cold and warm: ppo.py 17 + 14 s, Pendulum
                                   ~50 + 45 s (16 envs x 256 steps x 10 epochs), vpg.py ~30 s,
                                   VPG Pendulum ~35 s, q_learning ~10 s; ppo.py's implementation
                                   choices undone (3 programs x (a warm-up run + 3 timed runs) of
                                   ~7 s, + compiles) ~110 s
    robustness       6      660    6 commands x 64 seeds (4 of them: 287 s together; ppo ~70 s;
                                   ppo.py --num-envs 2048 ~4.5 s per seed: ~300 s)
    q_learning      11      150    a process per agent count: ~6 s start and compile + 4 runs;
                                   the numpy baselines (one process, 4 runs each, a run: the
                                   loop ~0.5 s, vectorised 1024 and 8192 agents ~3 s) ~25 s;
                                   memory 2 x 8 s;
                                   small loops 2 x 12 s; implementation 25 s
    is_eval          8      230    is_eval.py as typed ~100 s, in-sample sweep ~60 s, speed ~70 s
    total           36     1340    the full run of 2026-11-26 measured 1320 s (commands 245,
                                   robustness 672, q_learning 89, is_eval 314); that of
                                   2026-11-27, 2265 s on a host whose numpy baselines ran 25%
                                   slower (commands 299, robustness 1451: pqn.py's 64 seeds,
                                   which joined the table since, 672 s of it, q_learning 113,
                                   is_eval 402); that of 2026-11-28, 2345 s (commands 310,
                                   robustness 1526, pqn 725 of it, q_learning 117, is_eval 392;
                                   --peers 1117 s more)
    minatar         14     2744    optional (--only minatar), outside the total, measured on
                                   2026-12-07 on MINATAR.md's 2-core AMD EPYC: ppo.py's 5 games x
                                   4 seeds (Breakout on 3 seed bases), 71-151 s each but Seaquest
                                   (399 s: its CNN run trains at 16k steps/s, the others at
                                   46-198k); pqn.py beside them 153-504 s each (1443 s); the
                                   CNN's speed, then Acrobot 13 s and MountainCar 42 s

Cold and warm: "cold" figures come from an empty compilation cache (the process compiles), "warm"
ones from the cache the cold run of the same command filled; every robustness sweep and the
is_eval.py run are cold. Nothing is trained twice: the robustness sweeps are the learning
curves, the commands table's PPO processes are the peers table's "ours". Steady-state rates are
medians of 3 after a warm-up (the commands table's rows are single runs, cold and warm: what a
user's first and second run take). JAX caches only programs whose compile took 1 s or more
(jax_persistent_cache_min_compile_time_secs): a warm row whose program compiled faster compiled
again, and says so.
"""
import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTIONS = {  # selector -> module (in the order of RESULTS.md)
    "commands": "bench_cli",
    "robustness": "robustness",
    "q_learning": "bench_q_learning",
    "is_eval": "bench_is_eval",
    "envs": "bench_envs",
    "long_runs": "bench_long_runs",
    "minatar": "bench_minatar",
    "pbt": "bench_pbt",
    "devices": "bench_devices",
    "rnn": "bench_rnn",
    "sac": "bench_sac",
    "td3": "bench_td3",
    "dqn": "bench_dqn",
    "brax": "bench_brax",
    "peers": "peers",  # with --peers, after the others (its own requirements)
}
ALL = ("commands", "robustness", "q_learning", "is_eval")  # the default run
QUICK_COST = {"commands": 2, "robustness": 3, "q_learning": 1, "is_eval": 4}  # relative, --quick
# run only when --only names them: <NAME>.md
OPTIONAL = ("envs", "long_runs", "minatar", "pbt", "devices", "rnn", "sac", "td3", "dqn", "brax")
FAILED = []  # sections that raised: reported in their place, then the run exits non-zero


def run_section(name: str, quick: bool) -> tuple[str, float]:
    print(f"running {name} ({SECTIONS[name]}.py) ...", flush=True)
    t0 = time.time()
    try:  # a failed section is reported in its place; the others' hours are not lost with it
        text = __import__(SECTIONS[name]).run(quick)
    except Exception as e:
        FAILED.append(name)
        text = f"**The {name} section failed**: `{type(e).__name__}: {e}`"
    print(f"{text}\n\n{name}: {time.time() - t0:.0f} s", flush=True)
    return text, time.time() - t0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny budgets, sections two at a time: checks the pipeline")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"comma list out of {','.join(ALL + OPTIONAL)}")
    parser.add_argument("--peers", action="store_true",
                        help="also run rejax and SB3 PPO (benchmarks/requirements-peers.txt)")
    parser.add_argument("--out", type=Path, default=common.RESULTS,
                        help="output folder (default benchmarks/results, --quick: its quick/)")
    opts = parser.parse_args(argv)
    selected = [name.strip() for name in opts.only.split(",") if name.strip()]
    unknown = sorted(set(selected) - set(ALL + OPTIONAL))
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)} "
                     f"(choose from {', '.join(ALL + OPTIONAL)})")

    opts.out.mkdir(parents=True, exist_ok=True)
    common.RESULTS = opts.out
    t0, load_start = time.time(), common.load_average()
    mode = ("quick (tiny budgets: numbers check the pipeline, not the algorithms)" if opts.quick
            else "full")
    only = "" if opts.only == ",".join(ALL) else f" --only {opts.only}"
    command = (f"python benchmarks/run.py{' --quick' if opts.quick else ''}{only}"
               f"{' --peers' if opts.peers else ''}")
    header = common.produced_by(command, mode)
    for name in OPTIONAL:
        if name in selected:
            text, seconds = run_section(name, opts.quick)
            (opts.out / f"{name.upper()}.md").write_text("\n\n".join(
                [*header, text, f"Section time: {seconds:.0f} s."]) + "\n")
            print(text)
    chosen = [name for name in ALL if name in selected]
    if not chosen:
        if FAILED:  # an optional section alone: its failure fails the run too
            sys.exit(f"failed sections: {', '.join(FAILED)} (see {opts.out})")
        return
    # --quick: two sections at a time, the longest first (its times mean nothing); the full
    # run: one at a time.
    order = sorted(chosen, key=lambda name: -QUICK_COST[name]) if opts.quick else chosen
    with ThreadPoolExecutor(max_workers=2 if opts.quick else 1) as pool:
        done = dict(zip(order, pool.map(lambda name: run_section(name, opts.quick), order)))
    done = {name: done[name] for name in chosen}
    times = {name: seconds for name, (_, seconds) in done.items()}
    measured_s = time.time() - t0
    if opts.peers:
        done["peers"] = run_section("peers", opts.quick)
        times["peers (--peers)"] = done["peers"][1]
    rows = [[name, f"{seconds:.0f}"] for name, seconds in times.items()]
    rows.append(["**total" + (" without peers**" if opts.peers else "**"), f"**{measured_s:.0f}**"])
    if opts.peers:
        rows.append(["total with peers", f"{time.time() - t0:.0f}"])
    parts = ["# Benchmark results", *header,
             f"Load average (1, 5, 15 min) at the start: {load_start}; at the end: "
             f"{common.load_average()}.",
             *(text for text, _ in done.values()),
             "## Time of each section" + (" (sections ran two at a time)" if opts.quick else ""),
             common.md_table(["section", "seconds"], rows),
             f"Total benchmark time: {measured_s:.0f} s"
             + (f" ({time.time() - t0:.0f} s with the peers)." if opts.peers else ".")]
    report = "\n\n".join(parts) + "\n"
    # RESULTS.md holds a run of every default section; a run of some of them writes beside it.
    name = "RESULTS.md" if only == "" else f"RESULTS-{'-'.join(chosen)}.md"
    (opts.out / name).write_text(report)
    print(report)
    if FAILED:  # the tables that did run are in the report
        sys.exit(f"failed sections: {', '.join(FAILED)} (see {opts.out / name})")


if __name__ == "__main__":
    main()
