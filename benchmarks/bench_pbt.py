"""Population-based training on seed bases it was not tuned on: ppo.py --pbt beside the fixed
configuration a user would have chosen from the same grid, and beside the grid's median.

    python benchmarks/bench_pbt.py [--quick]
    python benchmarks/run.py --only pbt            # writes PBT.md (46 minutes measured)

A held-out trial (issue 53). First the fixed grid runs on the seed bases used while developing
(CHOICE_BASES), and the configuration with the best mean evaluation over them is chosen, as a
user tuning on their own seeds would. Then on each of 5 seed bases no run of this project used
before (HELD_OUT_BASES) the fixed grid and the --pbt population run from the same command: one
row per base with the population's mean evaluation over its members, the chosen configuration's
mean over its seeds, the grid's median (the median of its configurations' means on that base:
a configuration drawn from the grid) and the lineages left at the end. A base is one sample:
the members of a population share lineages, so the comparison is made base by base, and the
mean difference carries a bootstrap interval over the 5 bases, not over members. Tasks:
Breakout-MinAtar (its MLP preset, 2M steps, a learning-rate grid straddling the preset's 5e-3)
and CartPole-v1 with --num-envs 2048 (episodes of 500 steps: windows without an ended episode,
and every good run ties at 500).

Each is the command a user types, in its own process with an empty compilation cache (whole-
process time: what a user waits, compile included). Score: each run's final policy on
--eval-episodes fresh episodes with sampled actions (the published protocol of MINATAR.md).
Target (issue 53): on Breakout-MinAtar the population at or above the chosen configuration on at
least 4 of the 5 held-out bases, and at or above the grid's median on all 5. The plot draws every
member's learning rate against env steps on the first held-out base."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SEEDS, CHOICE_BASES, HELD_OUT_BASES = 4, (1, 2), (7001, 7002, 7003, 7004, 7005)
RATES = (1e-3, 2.5e-3, 5e-3, 1e-2)
TASKS = {  # name: (flags, steps: None, the preset's)
    "Breakout-MinAtar": (["--env-id", "Breakout-MinAtar"], 2_000_000),
    "CartPole-v1, 2048 envs": (["--env-id", "CartPole-v1", "--num-envs", "2048"], None),
}
QUICK = {"steps": {"Breakout-MinAtar": 3 * 64 * 128, "CartPole-v1, 2048 envs": 3 * 2048 * 16},
         "rates": (2.5e-3, 5e-3), "seeds": 2, "choice": (1,), "held_out": (7001,)}


def worker(config: dict) -> dict:
    """One command as typed: per run its sampled evaluation and final training return, the
    learning rate in force at each update and, with --pbt, the lineages left; the timing."""
    with tempfile.TemporaryDirectory() as cache:
        kept = common.run_as_typed("ppo", [*config["flags"], "--no-track",
                                           "--compile-cache-dir", cache])
    args, metrics, reports = kept["args"], kept["metrics"], common.runner_module("reports")
    rates = metrics.get("hp/learning_rate", metrics["charts/learning_rate"])
    roots = reports.lineages(args, metrics)[1] if args.pbt else np.arange(len(rates))
    return {"sampled": kept["evals"]["eval/episodic_return_sampled"].tolist(),
            "final": reports.final_returns(metrics).tolist(), "rates": rates.tolist(),
            "steps": metrics["env_steps"][0].tolist(), "lineages": len(set(roots.tolist())),
            "copies": int(np.isfinite(metrics.get("pbt/copied_from", np.zeros(0))).sum()),
            "run_s": kept["timing"]["run_s"], "compile_s": kept["timing"]["compile_s"]}


def command(flags, rates, seeds: int, base: int, pbt: bool) -> list[str]:
    return [*flags, "--learning-rate", *map(str, rates), "--num-seeds", str(seeds), "--seed",
            str(base), *(["--pbt"] if pbt else [])]


def run_one(flags, rates, seeds: int, base: int, pbt: bool) -> dict:
    result = common.run_worker(Path(__file__), {"flags": command(flags, rates, seeds, base, pbt)},
                               as_user=True)
    print(f"  pbt {' '.join(flags[:2])} base {base}{' --pbt' if pbt else ''}: "
          f"{result['process_s']:.0f} s", flush=True)
    return result


def trial(name: str, quick: bool) -> tuple[str, tuple]:
    """One task: the choice on CHOICE_BASES, then the held-out rows; (markdown, the first
    held-out population's (steps, rates))."""
    flags, steps = TASKS[name]
    rates, seeds, choice, held_out = RATES, SEEDS, CHOICE_BASES, HELD_OUT_BASES
    if quick:
        steps, rates, seeds, choice, held_out = (QUICK["steps"][name], QUICK["rates"],
                                                 QUICK["seeds"], QUICK["choice"],
                                                 QUICK["held_out"])
    flags = [*flags, *(["--total-timesteps", str(steps)] if steps else [])]

    def by_config(result):  # [configurations, seeds]
        return np.reshape(result["sampled"], (len(rates), seeds))

    tuning = np.mean([by_config(run_one(flags, rates, seeds, base, False)).mean(1)
                      for base in choice], axis=0)
    chosen = int(np.argmax(tuning))
    rows, differences, above_chosen, above_median, schedule = [], [], 0, 0, None
    for base in held_out:
        fixed, pbt = (run_one(flags, rates, seeds, base, p) for p in (False, True))
        means = by_config(fixed).mean(1)
        population, median = float(np.mean(pbt["sampled"])), float(np.median(means))
        above_chosen += population >= means[chosen]
        above_median += population >= median
        differences.append(population - means[chosen])
        if schedule is None:  # the first held-out base's, for the plot
            schedule = pbt["steps"], np.asarray(pbt["rates"])
        rows.append([base, common.with_ci(pbt["sampled"]), f"{pbt['lineages']} of "
                     f"{len(pbt['sampled'])} ({pbt['copies']} copies)",
                     common.with_ci(by_config(fixed)[chosen]), f"{median:.4g}",
                     " ".join(f"{x:.4g}" for x in means),
                     f"{pbt['process_s']:.0f} s vs {fixed['process_s']:.0f} s"])
        print(f"  pbt {name}: {' | '.join(map(str, rows[-1]))}", flush=True)  # (a long run's log)
    headers = ["seed base", "PBT population: mean [95% CI over members]", "lineages left",
               f"chosen fixed (lr {rates[chosen]:g}): mean [95% CI over seeds]",
               "grid's median", "each fixed configuration's mean (lr " + ", ".join(
                   f"{r:g}" for r in rates) + ")", "wall: PBT vs fixed grid"]
    low, high = common.bootstrap_ci(differences)
    verdict = (f"The population at or above the chosen configuration on {above_chosen} of "
               f"{len(held_out)} held-out bases, at or above the grid's median on {above_median} "
               f"of {len(held_out)}; population minus chosen, mean over the bases "
               f"{np.mean(differences):.4g} [95% CI over bases {low:.4g}, {high:.4g}].")
    if name == "Breakout-MinAtar":
        met = above_chosen >= min(4, len(held_out)) and above_median == len(held_out)
        verdict += f" Target (4 of 5 and 5 of 5): {'met' if met else 'not met'}."
    text = "\n\n".join([
        f"### {name}",
        f"`python algos/ppo.py {' '.join(flags)} --learning-rate {' '.join(map(str, rates))} "
        f"--num-seeds {seeds} --seed BASE [--pbt]`. Choice on bases "
        f"{', '.join(map(str, choice))}: each configuration's mean sampled evaluation " + ", ".join(
            f"lr {r:g} {x:.4g}" for r, x in zip(rates, tuning)) + f": lr {rates[chosen]:g} "
        "chosen.", common.md_table(headers, rows), verdict])
    return text, schedule


def run(quick: bool = False) -> str:
    load_start, parts, schedules = common.load_average(), [], {}
    for name in TASKS:
        text, schedules[name] = trial(name, quick)
        parts.append(text)
    fig, axes = common.new_figure(6 * len(schedules), 4, len(schedules))
    for ax, (name, (x, lr)) in zip(axes, schedules.items()):
        for run_rates in lr:
            ax.plot(x, run_rates, lw=1)
        ax.set(yscale="log", xlabel="environment steps per run", ylabel="learning rate in force",
               title=f"{name}, base {(QUICK['held_out'] if quick else HELD_OUT_BASES)[0]}")
    plot = common.save_figure(fig, "pbt_schedules.png")
    return "\n\n".join([
        "## Population-based training on held-out seed bases: ppo.py --pbt beside its grid",
        "Each command in its own process with an empty compilation cache; --pbt with its "
        "defaults (a step every tenth of the run from the second interval on, none in the last "
        "fifth; fitness the mean return of the interval's ended episodes, at least 10; the "
        "bottom quarter rounded up copies a better member of the top, then moves each swept "
        "value by x0.8 or x1.25 or, with probability 0.25, draws it log-uniform over the "
        "grid's range). Score: the final policy's sampled evaluation (64 episodes a run). "
        f"Seed bases {', '.join(map(str, HELD_OUT_BASES))} were used by no run of this project "
        f"before this table. Load average at the start: {load_start}; at the end: "
        f"{common.load_average()}" + (". Quick: the pipeline, not the algorithm." if quick
                                      else "."),
        *parts, f"![learning-rate schedules of the PBT runs]({plot.name})"])


if __name__ == "__main__":
    if not common.worker_entry(worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true", help="3 updates, 2 rates x 2 seeds")
        print(common.machine_header() + "\n\n" + run(parser.parse_args().quick))
