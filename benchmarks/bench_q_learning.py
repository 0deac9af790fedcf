"""Speed of algos/q_learning.py: agent-steps per second after compile for 1 to 65536 agents, peak
memory, and a plain-numpy per-step loop of the same algorithm as the baseline.

Every agent count of the speed and memory tables runs in its own process (common.run_worker), so
its compile time and peak memory are its own; the small-loop comparison (rates only) measures
1 and 30 agents in one process per XLA setting. A process gets 2 host devices, one per core: a
workload of N >= 2 agents runs as 2 seeds (one per device) of N/2 agents, so the rate is the
aggregate over both cores.

    python benchmarks/bench_q_learning.py [--quick]
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SCRIPT = Path(__file__).resolve()
TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
AGENT_COUNTS = (1, 30, 1024, 8192, 65536)


# ----------------------------------------------------------------------------- workers
VARIANTS = {  # the file's implementation choices, each undone in turn (implementation_table)
    "file": ("the file as it is", {}),
    "one_block": ("all agents as one block (no cache blocking)", {"BLOCK_BYTES": 2 ** 62}),
    "ynn": ("XLA's YNNPACK fusion on (XLA's default)", {"COMPILER_OPTIONS": {}}),
}


def jax_workload(config: dict) -> dict:
    """For each agent count of config["agents"] in turn (with the file's settings of VARIANTS
    config["variants"][i], default "file"): compile the whole run once, then time
    config["repeats"] runs of it after a warm-up run (the steady state)."""
    if not config["small_loops"]:  # XLA's own default, set here, stops the file raising it
        os.environ["XLA_FLAGS"] += (" --xla_backend_extra_options="
                                    "xla_cpu_small_while_loop_byte_threshold=1024")
    ql = common.import_algo("q_learning")
    import dataclasses

    import jax

    results, settings = [], {k: getattr(ql, k) for k in ("BLOCK_BYTES", "COMPILER_OPTIONS")}
    variants = config.get("variants") or ["file"] * len(config["agents"])
    for agents, variant in zip(config["agents"], variants):
        for name, value in {**settings, **VARIANTS[variant][1]}.items():
            setattr(ql, name, value)  # read by make_train and the compile below
        size = sizes(agents, config["budget"], config["num_steps"])
        seeds = 2 if agents >= 2 else 1
        args = dataclasses.replace(
            ql.Args(track=False), num_agents=agents // seeds, num_seeds=seeds,
            total_timesteps=size, num_steps=config["num_steps"])
        keys = jax.random.split(jax.random.PRNGKey(0), seeds).reshape(seeds, 1, 2)
        hp = {k: jax.numpy.full((seeds, 1), getattr(args, k)[0]) for k in ql.HPARAMS}
        t0 = time.perf_counter()
        compiled = jax.pmap(jax.vmap(ql.make_train(args)), devices=jax.local_devices()[:seeds]) \
            .lower(keys, hp).compile(ql.COMPILER_OPTIONS)
        compile_s = time.perf_counter() - t0
        last = {}

        def call():
            last["state"], last["metrics"] = jax.block_until_ready(compiled(keys, hp))

        _, steady = common.time_calls(call, config["repeats"])
        total = agents * size
        results.append({
            "agents": agents, "variant": variant, "steps": size, "compile_s": compile_s,
            "rate": total / float(np.median(steady)), "best": total / min(steady), "seeds": seeds,
            "greedy_optimal": float(np.asarray(last["metrics"]["stats/greedy_optimal"])[
                :, :, -1].mean())})
    return {"results": results}


def numpy_workload(config: dict) -> dict:
    """The same algorithm on the same GridWorld as a plain per-step numpy loop (one agent)."""
    ql = common.import_algo("q_learning")
    args = ql.Args()
    (lr0,), (gamma,), (start_e,), (end_e,) = (args.learning_rate, args.gamma, args.start_e,
                                             args.end_e)
    index = lambda cell: int(np.ravel_multi_index(cell, args.grid_size))  # the file's numbering
    start, goal = index(args.start), index(args.goal)
    next_cells = ql.grid_moves(*args.grid_size, ql.MOVES, [index(w) for w in args.walls])
    rng = np.random.default_rng(0)
    q = np.zeros(next_cells.shape)
    visited = np.zeros(next_cells.shape, bool)
    steps, explore_steps = config["steps"], args.exploration_fraction * config["steps"]
    cell, time_in_episode = start, 0
    t0 = time.perf_counter()
    for t in range(steps):
        epsilon = start_e + (end_e - start_e) * min(t / explore_steps, 1.0)
        lr = lr0 * (1 - t / steps)
        row = q[cell]
        if rng.random() < epsilon:
            action = rng.integers(4)
        else:  # greedy, ties broken at random
            best = np.flatnonzero(row == row.max())
            action = best[rng.integers(len(best))]
        move = rng.integers(4) if rng.random() < args.slip else action
        next_cell = next_cells[cell, move]
        terminated = next_cell == goal
        time_in_episode += 1
        target = float(terminated) + gamma * (0.0 if terminated else q[next_cell].max())
        q[cell, action] += lr * (target - q[cell, action])
        visited[cell, action] = True
        if terminated or time_in_episode >= args.max_episode_steps:
            cell, time_in_episode = start, 0
        else:
            cell = next_cell
    run_s = time.perf_counter() - t0
    return {"rate": steps / run_s, "run_s": run_s}


def worker(config: dict) -> dict:
    return numpy_workload(config) if config["kind"] == "numpy" else jax_workload(config)


# ----------------------------------------------------------------------------- table
REPEATS = 3  # timed runs after the warm-up: the steady-state rate moves by a few percent
BUDGET, SMALL_BUDGET = 2e7, 4e6  # agent-steps per timed run; SMALL_BUDGET below 1024 agents


def sizes(agents: int, budget: float, num_steps: int) -> int:
    """Steps per agent for about `budget` agent-steps, in whole updates of num_steps steps."""
    return int(max(1, budget // agents // num_steps) * num_steps)


def jax_run(agents, budget, num_steps=1_000, repeats=REPEATS, small_loops=True,
            variants=None) -> list:
    """One process: the workloads of jax_workload for these agent counts."""
    return common.run_worker(SCRIPT, {
        "kind": "jax", "agents": list(agents), "budget": budget, "num_steps": num_steps,
        "repeats": repeats, "small_loops": small_loops, "variants": variants}, env=TWO_DEVICES)


def run(quick: bool) -> str:
    rows, rates = [], {}
    numpy_steps = 20_000 if quick else 100_000
    base = common.run_worker(SCRIPT, {"kind": "numpy", "steps": numpy_steps})
    rows.append(["plain numpy loop (baseline)", 1, f"{numpy_steps:,}", "n/a", base["rate"] / 1e6,
                 "n/a", base["peak_rss_mib"]])
    small, large, num_steps = (1e6, 1e6, 100) if quick else (SMALL_BUDGET, BUDGET, 1_000)
    # --quick: both agent counts in one process (its peak memory then covers both)
    for counts in [(1, 1024)] if quick else [(n,) for n in AGENT_COUNTS]:
        process = jax_run(counts, large if counts[0] >= 1024 else small, num_steps)
        rates.update({r["agents"]: r["rate"] for r in process["results"]})
        for result in process["results"]:
            agents = result["agents"]
            layout = f"{result['seeds']} x {agents // result['seeds']}"
            rows.append([f"q_learning.py, {layout}", agents, f"{result['steps']:,}",
                         result["compile_s"], result["rate"] / 1e6, result["best"] / 1e6,
                         process["peak_rss_mib"]])
    headers = ["workload (devices x agents per device)", "agents", "steps per agent", "compile s",
               "M agent-steps/s (median)", "M agent-steps/s (best)", "peak RSS MiB"]
    plot = save_plot(rates, base["rate"])
    parts = [
        "## Tabular Q-learning: agent-steps per second",
        common.md_table(headers, rows),
        f"Default 6x6 GridWorld maze, updates of {num_steps} steps; one process per row, "
        f"{REPEATS} timed runs after a compile and a warm-up run, about {small:.0e} agent-steps "
        f"each below 1024 agents, {large:.0e} from 1024 on. "
        f"Speedup over the numpy loop: {rates[1] / base['rate']:.0f}x for 1 agent, "
        f"{max(rates.values()) / base['rate']:,.0f}x at best. Reference (from the issue, same "
        f"machine, not rerun here): the seed article's vmapped JAX Q-learning (RPegoud/jax_rl) "
        f"runs 0.10 M steps/s for 1 agent and 0.39 M for 30, with 13.7 GiB peak memory (it "
        f"keeps every step's Q-table).",
        f"![q_learning agent-steps per second]({plot.name})",
    ]
    if not quick:
        parts += [memory_table(), small_loops_table(), implementation_table()]
    return "\n\n".join(parts)


def memory_table() -> str:
    """Peak memory does not grow with the number of steps: the same 8192 agents for 1x and 8x."""
    rows = []
    agents = 8192
    for steps in (2_000, 16_000):
        process = jax_run([agents], agents * steps, repeats=1)
        rows.append([agents, f"{steps:,}", f"{agents * steps:,}",
                     process["results"][0]["rate"] / 1e6, process["peak_rss_mib"]])
    return "Peak memory against the number of steps (one process per row):\n\n" + \
        common.md_table(["agents", "steps per agent", "agent-steps", "M agent-steps/s",
                         "peak RSS MiB"], rows)


def small_loops_table() -> str:
    """What the file's small-loop setting buys: XLA's default runs each op of a small loop body as a
    separate call; with it, one agent's whole step loop is compiled as one native loop."""
    rows, budget = [], 5e5
    for small_loops in (False, True):  # one process each: XLA reads the limit at start-up
        for result in jax_run((1, 30), budget, 100, small_loops=small_loops)["results"]:
            rows.append([result["agents"], "raised to 100 kB" if small_loops
                         else "XLA default (1 kB)", result["rate"] / 1e6])
    return (f"XLA:CPU small-while-loop limit (the file raises it on import), {budget:.0e} "
            f"agent-steps in updates of 100 steps, median of {REPEATS} after a warm-up, one "
            "process per limit. Only a single agent's loop qualifies: with more, the table "
            "write is a scatter, which XLA keeps out of such loops.\n\n"
            + common.md_table(["agents", "limit", "M agent-steps/s (median)"],
                              sorted(rows, key=lambda r: r[0])))


def implementation_table() -> str:
    """What the file's cache blocking and its YNNPACK setting buy, each undone in turn."""
    workloads = [(65536, "file"), (65536, "one_block"), (8192, "file"), (8192, "ynn")]
    process = jax_run([a for a, _ in workloads], BUDGET, variants=[v for _, v in workloads])
    rows, base = [], {}
    for r in process["results"]:
        base.setdefault(r["agents"], r["rate"])  # the file's own rate comes first per count
        rows.append([r["agents"], VARIANTS[r["variant"]][0], r["rate"] / 1e6,
                     f"{base[r['agents']] / r['rate']:.2f}x"])
    return ("The file's implementation choices, each undone in turn (one process, "
            f"{BUDGET:.0e} agent-steps in updates of 1000 steps, median of {REPEATS} after a "
            "warm-up):\n\n" + common.md_table(
                ["agents", "program", "M agent-steps/s (median)", "the file's speed over this"],
                rows))


def save_plot(rates: dict, numpy_rate: float):
    fig, (ax,) = common.new_figure(6, 4)
    agents = sorted(rates)
    ax.loglog(agents, [rates[n] for n in agents], "o-", label="q_learning.py (2 cores)")
    ax.axhline(numpy_rate, color="gray", ls="--", label="plain numpy loop, 1 agent")
    ax.set_xlabel("agents")
    ax.set_ylabel("agent-steps per second")
    ax.set_title("Tabular Q-learning throughput")
    ax.legend()
    return common.save_figure(fig, "q_learning_speed.png")


if __name__ == "__main__":
    if not common.worker_entry(worker):
        print(common.machine_header())
        print()
        print(run(quick="--quick" in sys.argv))
