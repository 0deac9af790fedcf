"""Speed of algos/q_learning.py: agent-steps per second after compile for 1 to 65536 agents, peak
memory, and two numpy baselines of the same algorithm on the same GridWorld: a Python loop of
scalar steps on one agent, and a loop whose every iteration steps all agents at once as numpy
arrays (vectorised), at the agent counts and steps per agent of q_learning.py's rows.

Every agent count of the speed and memory tables runs in its own process (common.run_worker), so
its compile time and peak memory are its own (the numpy baselines share one); the small-loop
comparison (rates only) measures 1 and 30 agents in one process per XLA setting. A process gets 2
host devices, one per core: a workload of N >= 2 agents runs as 2 seeds (one per device) of N/2
agents, so the rate is the aggregate over both cores. numpy runs on one core.

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

    flags, sweep = common.runner_module("flags"), common.runner_module("sweep")
    results, settings = [], {k: getattr(ql, k) for k in ("BLOCK_BYTES", "COMPILER_OPTIONS")}
    variants = config.get("variants") or ["file"] * len(config["agents"])
    for agents, variant in zip(config["agents"], variants):
        for name, value in {**settings, **VARIANTS[variant][1]}.items():
            setattr(ql, name, value)  # the file's own, read by make_train and the compile below
        size = sizes(agents, config["budget"], config["num_steps"])
        seeds = 2 if agents >= 2 else 1
        args = dataclasses.replace(
            flags.args_class(ql)(track=False), num_agents=agents // seeds, num_seeds=seeds,
            total_timesteps=size, num_steps=config["num_steps"])
        keys = jax.random.split(jax.random.PRNGKey(0), seeds).reshape(seeds, 1, 2)
        hp = {k: jax.numpy.full((seeds, 1), getattr(args, k)[0]) for k in ql.HPARAMS}
        t0 = time.perf_counter()
        compiled = jax.pmap(jax.vmap(sweep.build_train(args)),
                            devices=jax.local_devices()[:seeds]) \
            .lower(keys, hp).compile(args.algorithm.COMPILER_OPTIONS)
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


class NumpyGrid:
    """The file's GridWorld and hyperparameters (its Args) as numpy arrays, for the numpy
    baselines: next_cell [S, A] (q_learning.grid_moves), start and goal cell indices, and what
    greedy_optimal is measured against (Q* by the file's value iteration, the scored states)."""

    def __init__(self, ql, args):
        index = lambda cell: int(np.ravel_multi_index(cell, args.grid_size))  # the file's numbering
        self.args, self.start, self.goal = args, index(args.start), index(args.goal)
        self.next_cell = ql.grid_moves(*args.grid_size, ql.MOVES, [index(w) for w in args.walls])
        (self.lr, ), (self.gamma, ), (self.start_e, ), (self.end_e, ) = (
            args.learning_rate, args.gamma, args.start_e, args.end_e)
        model = ql.gridworld_env(args).model
        self.q_star = np.asarray(ql.value_iteration(model.P, model.R, model.terminal, self.gamma))
        self.scored = ql.model_reachable(model) & ~model.terminal
        self.optimal_tol = ql.OPTIMAL_TOL

    def schedule(self, t: int, steps: int) -> tuple[float, float]:
        """(epsilon, learning rate) at step t of `steps`, as the file anneals them."""
        a = self.args
        epsilon = self.start_e + (self.end_e - self.start_e) * min(
            t / (a.exploration_fraction * steps), 1.0)
        return epsilon, self.lr * (1 - t / steps if a.anneal_lr else 1)

    def greedy_optimal(self, q) -> float:
        """The file's stats/greedy_optimal of tables q [agents, S, A]: the fraction of scored
        states where every greedy action is optimal (within OPTIMAL_TOL of Q*), mean over agents."""
        optimal = self.q_star >= self.q_star.max(-1, keepdims=True) - self.optimal_tol
        greedy = q == q.max(-1, keepdims=True)
        correct = ~(greedy & ~optimal).any(-1) & self.scored
        return float((correct.sum(-1) / self.scored.sum()).mean())


def numpy_loop(grid: NumpyGrid, steps: int, seed: int = 0):
    """One agent, a Python loop of scalar steps, as the file takes them: epsilon-greedy (one
    uniform u: u < epsilon explores and u / epsilon picks the action; else greedy, ties broken
    at random), the GridWorld's move (a slip picks a random one), Watkins' update (no bootstrap
    from the goal, a bootstrap through the time limit), a reset at the goal or the limit.
    float32 tables, as the file's. It draws the random numbers numpy_vectorised draws for one
    agent, so the two agree on one agent (tests/test_benchmarks.py). Returns q [1, S, A]."""
    a, rng = grid.args, np.random.default_rng(seed)
    num_actions = grid.next_cell.shape[1]
    q = np.zeros(grid.next_cell.shape, np.float32)
    visited = np.zeros(grid.next_cell.shape, bool)
    cell, time_in_episode = grid.start, 0
    for t in range(steps):
        epsilon, lr = grid.schedule(t, steps)
        u = rng.random(num_actions + 2, dtype=np.float32)  # ties, explore, slip
        row = q[cell]
        if u[num_actions] < epsilon:
            action = min(int(u[num_actions] * (num_actions / epsilon)), num_actions - 1)
        else:  # greedy, ties broken at random
            best = np.flatnonzero(row == row.max())
            action = best[np.argmax(u[best])]
        move = action
        if u[num_actions + 1] < a.slip:
            move = min(int(u[num_actions + 1] * (num_actions / a.slip)), num_actions - 1)
        next_cell = grid.next_cell[cell, move]
        terminated = next_cell == grid.goal
        time_in_episode += 1
        bootstrap = np.float32(0.0) if terminated else q[next_cell].max()
        q[cell, action] += lr * (terminated + grid.gamma * bootstrap - q[cell, action])
        visited[cell, action] = True
        if terminated or time_in_episode >= a.max_episode_steps:
            cell, time_in_episode = grid.start, 0
        else:
            cell = next_cell
    return q[None]


def numpy_vectorised(grid: NumpyGrid, agents: int, steps: int, seed: int = 0):
    """`agents` independent agents as numpy arrays, one step of all of them per iteration of a
    Python loop over steps: numpy_loop's algorithm, on every agent at once. Returns q
    [agents, S, A]."""
    a, rng = grid.args, np.random.default_rng(seed)
    num_cells, num_actions = grid.next_cell.shape
    q = np.zeros((agents * num_cells, num_actions), np.float32)  # agent i's rows: i * S + s
    flat = q.reshape(-1)  # a view: entry (i * S + s) * A + a
    visited = np.zeros(flat.shape, bool)
    first_row = np.arange(agents) * num_cells
    cell = np.full(agents, grid.start)
    time_in_episode = np.zeros(agents, np.int64)
    for t in range(steps):
        epsilon, lr = grid.schedule(t, steps)
        u = rng.random((agents, num_actions + 2), dtype=np.float32)  # ties, explore, slip
        rows = q[first_row + cell]  # [agents, A]
        greedy = np.where(rows == rows.max(1, keepdims=True), u[:, :num_actions], -1).argmax(1)
        explore, scale = u[:, num_actions], num_actions / epsilon if epsilon > 0 else 0.0
        action = np.where(explore < epsilon, np.minimum(
            (explore * scale).astype(np.int64), num_actions - 1), greedy)
        move = action
        if a.slip > 0:
            slip = u[:, num_actions + 1]
            move = np.where(slip < a.slip, np.minimum(
                (slip * (num_actions / a.slip)).astype(np.int64), num_actions - 1), action)
        next_cell = grid.next_cell[cell, move]
        terminated = next_cell == grid.goal
        time_in_episode += 1
        target = terminated + grid.gamma * np.where(
            terminated, 0.0, q[first_row + next_cell].max(1))
        entry = (first_row + cell) * num_actions + action
        flat[entry] += lr * (target - flat[entry])
        visited[entry] = True
        done = terminated | (time_in_episode >= a.max_episode_steps)
        cell = np.where(done, grid.start, next_cell)
        time_in_episode = np.where(done, 0, time_in_episode)
    return q.reshape(agents, num_cells, num_actions)


def numpy_workload(config: dict) -> dict:
    """The numpy baselines on the file's default GridWorld, for each [agents, steps] of
    config["workloads"] in turn: agents == 1, numpy_loop; more, numpy_vectorised. Each is
    timed config["repeats"] times after a warm-up run (each run trains from scratch, same seed);
    greedy_optimal is the last run's."""
    ql = common.import_algo("q_learning")
    grid = NumpyGrid(ql, common.runner_module("flags").args_class(ql)())
    results = []
    for agents, steps in config["workloads"]:
        train = (lambda: numpy_loop(grid, steps)) if agents == 1 else (
            lambda: numpy_vectorised(grid, agents, steps))
        last = {}
        _, steady = common.time_calls(lambda: last.update(q=train()), config["repeats"])
        results.append({"agents": agents, "steps": steps, "rate": agents * steps / float(
            np.median(steady)), "best": agents * steps / min(steady),
            "greedy_optimal": grid.greedy_optimal(last["q"])})
    return {"results": results}


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


NUMPY_LOOP = "numpy loop, one agent (baseline, 1 core)"
NUMPY_VECTORISED = "numpy vectorised, every agent's step per iteration (baseline, 1 core)"


def run(quick: bool) -> str:
    rows, rates = [], {}
    small, large, num_steps = (1e6, 1e6, 100) if quick else (SMALL_BUDGET, BUDGET, 1_000)
    counts = [(1, 1024)] if quick else [(n,) for n in AGENT_COUNTS]
    # The numpy baselines: the scalar loop on one agent, and the vectorised one at the shapes
    # (agents, steps per agent) of q_learning.py's rows it is compared with; one process.
    vectorised = (1024,) if quick else (1024, 8192)
    workloads = [(1, 5_000 if quick else 100_000)] + [
        (n, sizes(n, large if n >= 1024 else small, num_steps)) for n in vectorised]
    numpy = common.run_worker(SCRIPT, {"kind": "numpy", "workloads": workloads,
                                       "repeats": REPEATS})
    numpy_rates = {r["agents"]: r["rate"] for r in numpy["results"]}
    for r in numpy["results"]:
        rows.append([NUMPY_LOOP if r["agents"] == 1 else NUMPY_VECTORISED, r["agents"],
                     f"{r['steps']:,}", "n/a", r["rate"] / 1e6, r["best"] / 1e6,
                     f"{r['greedy_optimal']:.3f}", numpy["peak_rss_mib"]])
    # --quick: both agent counts in one process (its peak memory then covers both)
    for process_counts in counts:
        process = jax_run(process_counts, large if process_counts[0] >= 1024 else small,
                          num_steps)
        rates.update({r["agents"]: r["rate"] for r in process["results"]})
        for result in process["results"]:
            agents = result["agents"]
            layout = f"{result['seeds']} x {agents // result['seeds']}"
            rows.append([f"q_learning.py, {layout}", agents, f"{result['steps']:,}",
                         result["compile_s"], result["rate"] / 1e6, result["best"] / 1e6,
                         f"{result['greedy_optimal']:.3f}", process["peak_rss_mib"]])
    headers = ["workload (q_learning.py: devices x agents per device)", "agents",
               "steps per agent", "compile s", "M agent-steps/s (median)",
               "M agent-steps/s (best)", "greedy-optimal at the end", "peak RSS MiB"]
    plot = save_plot(rates, numpy_rates)
    speedups = "; ".join(
        f"{rates[n] / numpy_rates[n]:,.0f}x at {n} agent{'s' if n > 1 else ''} (numpy "
        f"{'loop' if n == 1 else 'vectorised'})" for n in numpy_rates)
    parts = [
        "## Tabular Q-learning: agent-steps per second",
        common.md_table(headers, rows),
        f"Default 6x6 GridWorld maze, updates of {num_steps} steps; one process per row of "
        f"q_learning.py{' (--quick: one for both)' if quick else ''}, one for the numpy rows; "
        f"each row: {REPEATS} timed runs after a warm-up "
        f"run (and, for q_learning.py, a compile), about {small:.0e} agent-steps each below 1024 "
        f"agents, {large:.0e} from 1024 on. The numpy baselines run the same algorithm on the "
        "same GridWorld (epsilon-greedy with random tie-breaks, Watkins' update, the same "
        "epsilon and learning-rate schedules) in one Python loop over steps: the loop takes one "
        "agent's step per iteration, the vectorised one every agent's at once, as numpy arrays. "
        "numpy runs on one core; q_learning.py's rate is the sum over its devices, one per core. "
        "Greedy-optimal at the end: the final stats/greedy_optimal (the fraction of reachable "
        "states whose greedy action is optimal, against Q* by value iteration), mean over the "
        "agents, after the row's steps per agent: rows of the same shape agree when the "
        "algorithms do (too few steps per agent leave it near 0; the file's default is 200,000). "
        f"Speed of q_learning.py over numpy at the same number of agents (the loop's row takes "
        f"fewer steps per agent): {speedups}. "
        "Reference (from the issue, same machine, not rerun here): the seed article's vmapped "
        "JAX Q-learning (RPegoud/jax_rl) runs 0.10 M steps/s for 1 agent and 0.39 M for 30, "
        "with 13.7 GiB peak memory (it keeps every step's Q-table).",
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


def save_plot(rates: dict, numpy_rates: dict):
    fig, (ax,) = common.new_figure(6, 4)
    agents = sorted(rates)
    ax.loglog(agents, [rates[n] for n in agents], "o-", label="q_learning.py (2 cores)")
    vectorised = sorted(n for n in numpy_rates if n > 1)
    ax.loglog(vectorised, [numpy_rates[n] for n in vectorised], "s--",
              label="numpy vectorised (1 core)")
    ax.axhline(numpy_rates[1], color="gray", ls=":", label="numpy loop, 1 agent (1 core)")
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
