"""Population-based training beside the fixed grid it starts from: ppo.py on Breakout-MinAtar
(its MLP preset), a learning-rate grid that straddles the preset's 5e-3, 4 rates x 4 seeds, the
same steps, once as a fixed sweep and once with --pbt, on two seed bases; and a task where PBT is
hard: CartPole-v1 with --num-envs 2048 (episodes of 500 steps, 80 steps of each env between two
steps of the population: many windows without an ended episode; every good run ties at 500).

    python benchmarks/bench_pbt.py [--quick]
    python benchmarks/run.py --only pbt            # writes PBT.md (about 20 minutes on 2 cores)

Each is the command a user types, in its own process with an empty compilation cache (whole-
process time: what a user waits, compile included). Score: each run's final policy on
--eval-episodes fresh episodes with sampled actions (the published protocol of MINATAR.md). The
fixed grid reports each configuration's mean over its 4 seeds; PBT its population's mean over
all 16 runs and its top member's (the run ranked first by its final training return). Target:
the population's mean at least the best fixed configuration's, the PBT process within 5% of the
fixed one's wall time. The plot draws every member's learning rate against env steps."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

GAME, RATES, SEEDS = "Breakout-MinAtar", (1e-3, 2.5e-3, 5e-3, 1e-2), 4
STEPS, BASES = 2_000_000, (1, 2)
QUICK_STEPS, QUICK_RATES, QUICK_SEEDS = 3 * 64 * 128, (2.5e-3, 5e-3), 2
# The hard task: its flags, bases, and the rates (its preset's 2.5e-3 among them)
HARD = ["--env-id", "CartPole-v1", "--num-envs", "2048"]
HARD_RATES, HARD_BASES, HARD_QUICK_STEPS = (1e-3, 2.5e-3, 5e-3, 1e-2), (1,), 3 * 2048 * 16


def worker(config: dict) -> dict:
    """One command as typed: per run its sampled and greedy evaluation, final training return,
    and learning rate in force at each update (--pbt: its schedule), and the timing."""
    with tempfile.TemporaryDirectory() as cache:
        kept = common.run_as_typed("ppo", [*config["flags"], "--no-track",
                                           "--compile-cache-dir", cache])
    algo, metrics, timing = kept["algo"], kept["metrics"], kept["timing"]
    rates = metrics.get("hp/learning_rate", metrics["charts/learning_rate"])
    copies = int(np.isfinite(metrics.get("pbt/copied_from", np.zeros(0))).sum())
    return {"sampled": kept["evals"]["eval/episodic_return_sampled"].tolist(), "copies": copies,
            "final": algo.final_returns(metrics).tolist(), "rates": rates.tolist(),
            "steps": metrics["env_steps"][0].tolist(), "run_s": timing["run_s"],
            "compile_s": timing["compile_s"]}


def grid_beside_pbt(flags: list[str], rates, seeds: int, base: int, quick: bool):
    """The fixed grid, then --pbt, as typed: (table rows, the PBT run's (steps, rates))."""
    flags = [*flags, "--learning-rate", *map(str, rates), "--num-seeds", str(seeds),
             "--seed", str(base)]
    fixed = common.run_worker(Path(__file__), {"flags": flags}, as_user=True)
    pbt = common.run_worker(Path(__file__), {"flags": [*flags, "--pbt"]}, as_user=True)
    sampled = np.reshape(fixed["sampled"], (len(rates), seeds))
    best = int(np.argmax(sampled.mean(1)))
    rows = [[base, f"fixed, lr {rate:g}", common.with_ci(sampled[c]),
             " ".join(f"{x:.4g}" for x in np.reshape(fixed["final"], sampled.shape)[c]), ""]
            for c, rate in enumerate(rates)]
    population = np.asarray(pbt["sampled"])
    met = population.mean() >= sampled[best].mean()
    overhead = pbt["process_s"] / fixed["process_s"] - 1
    rows.append([base, f"PBT population (all {population.size} runs; {pbt['copies']} copies)",
                 common.with_ci(population), " ".join(f"{x:.4g}" for x in pbt["final"]),
                 f"{'met' if met else 'not met'}: {population.mean():.4g} vs the best fixed "
                 f"(lr {rates[best]:g}) {sampled[best].mean():.4g}; wall {pbt['process_s']:.0f}"
                 f" s vs {fixed['process_s']:.0f} s ({overhead:+.1%}: "
                 f"{'met' if overhead <= 0.05 else 'not met'})"])
    return rows, (pbt["steps"], np.asarray(pbt["rates"])), pbt


def run(quick: bool = False) -> str:
    rates, seeds = (QUICK_RATES, QUICK_SEEDS) if quick else (RATES, SEEDS)
    steps = QUICK_STEPS if quick else STEPS
    load_start, rows, schedules = common.load_average(), [], {}
    for base in BASES:
        game = ["--env-id", GAME, "--total-timesteps", str(steps)]
        more, schedules[f"{GAME}, seed base {base}"], _ = grid_beside_pbt(game, rates, seeds, base,
                                                                          quick)
        rows += more
    hard_rows = []
    for base in HARD_BASES:
        hard = HARD + (["--total-timesteps", str(HARD_QUICK_STEPS)] if quick else [])
        more, schedules[f"CartPole-v1, 2048 envs, seed base {base}"], pbt = grid_beside_pbt(
            hard, QUICK_RATES if quick else HARD_RATES, seeds, base, quick)
        ends = min(pbt["final"])
        more[-1][-1] += (f"; every member ends at 500: {'met' if ends >= 499.5 else 'not met'} "
                         f"(lowest {ends:.4g})")
        hard_rows += more
    fig, axes = common.new_figure(6 * len(schedules), 4, len(schedules))
    for ax, (title, (x, lr)) in zip(axes, schedules.items()):
        for run_rates in lr:
            ax.plot(x, run_rates, lw=1)
        ax.set(yscale="log", xlabel="environment steps per run", ylabel="learning rate in force",
               title=f"{title}: --pbt's learning rates")
    plot = common.save_figure(fig, "pbt_schedules.png")
    command = (f"python algos/ppo.py --env-id {GAME} --learning-rate {' '.join(map(str, rates))} "
               f"--num-seeds {seeds} --seed BASE --total-timesteps {steps} [--pbt]")
    hard_command = (f"python algos/ppo.py {' '.join(HARD)} --learning-rate "
                    f"{' '.join(map(str, QUICK_RATES if quick else HARD_RATES))} --num-seeds "
                    f"{seeds} --seed BASE [--pbt]")
    headers = ["seed base", "runs", "evaluation, sampled: mean [95% CI]",
               "final training return per run", "target"]
    return "\n\n".join([
        "## Population-based training: ppo.py --pbt beside its fixed grid",
        f"`{command}`, each in its own process with an empty compilation cache. --pbt steps the "
        "population after every segment (10): runs ranked by their mean return since the last "
        "step (a run without an ended episode sits the step out), ties at random; each of the "
        "bottom quarter copies a member of the top quarter if it is strictly better, and "
        "multiplies its learning rate by 0.8 or 1.25; every run then goes on with a key of its "
        "own. Score: the final policy's sampled evaluation (64 episodes a run); CI: percentile "
        "bootstrap over the runs. Target: the population's mean at least the best fixed "
        "configuration's, and its process within 5% of the fixed grid's wall time. Load average "
        f"at the start: {load_start}; at the end: {common.load_average()}"
        + (". Quick: the pipeline, not the algorithm." if quick else "."),
        common.md_table(headers, rows),
        f"A task where PBT is hard: `{hard_command}`. An env's episode lasts 500 steps, a "
        "segment 80 steps of each env: a run whose envs all hold the pole ends no episode in "
        "some windows, and every run that solves it ties at 500. Target: as above, and every "
        "member of the population ends at 500.",
        common.md_table(headers, hard_rows),
        f"![learning-rate schedules of the PBT runs]({plot.name})"])


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true", help="3 updates, 2 rates x 2 seeds")
        print(common.machine_header() + "\n\n" + run(parser.parse_args().quick))
