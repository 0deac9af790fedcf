"""PPO and VPG benchmarks: speed and time-to-solve per batch size, and final returns with CIs.

    python benchmarks/bench_rl.py [--quick] [--only ppo,vpg]

Every workload runs in its own process (common.run_worker), so its compile time, whole-process
time and peak memory are its own. Time to threshold is whole-process: from the interpreter's
start (before jax is imported) to the end of the first update whose mean return over the seeds
reaches the threshold, placing that update inside the run assuming equal-length updates."""
import time

PROCESS_START = time.time()  # before jax is imported: "whole process" time starts here

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

# The speed table: PPO's default config per num_envs (budget and rollout derived from it).
SPEED = [("CartPole-v1", n, 475.0) for n in (4, 64, 512, 2048)] + [("Pendulum-v1", None, -200.0)]
# The returns table: both algorithms at the same env-step budget per environment.
RETURNS = {"CartPole-v1": 1_000_000, "Acrobot-v1": 1_000_000, "Pendulum-v1": 300_000}
SEEDS = 8


def worker(config):
    """One training sweep in this process; returns timings, final returns and the mean curve."""
    algo = common.import_algo(config["algo"])
    args = algo.validate(algo.Args(track=False, **config["args"]))
    if config.get("no_progress"):
        import jax
        jax.debug.callback = lambda *a, **k: None  # a program without the progress callbacks
    run_start = time.time()
    _, metrics, timing = algo.run(args)
    returns = np.asarray(metrics["episode_return"])
    steps = np.asarray(metrics["env_steps"][0])
    mean_curve = np.nanmean(returns, axis=0)
    reached = np.flatnonzero(mean_curve >= config.get("threshold", np.inf))
    time_to_threshold = None
    if reached.size:
        fraction = (reached[0] + 1) / len(steps)
        time_to_threshold = ((run_start - PROCESS_START) + timing["compile_s"]
                             + fraction * timing["run_s"])
    every = max(1, len(steps) // 200)
    return {
        "compile_s": timing["compile_s"], "run_s": timing["run_s"], "sps": timing["sps"],
        "final": algo.final_returns(metrics).tolist(), "total_steps": int(steps[-1]),
        "time_to_threshold_s": time_to_threshold,
        "steps_to_threshold": int(steps[reached[0]]) if reached.size else None,
        "curve_steps": steps[::every].tolist(),
        "curve": [[None if np.isnan(v) else float(v) for v in seed[::every]] for seed in returns],
        "whole_process_s": time.time() - PROCESS_START,
        "num_envs": args.num_envs, "num_steps": args.num_steps,
    }


def speed_table(algos, quick):
    rows = []
    repeats = 1 if quick else 3
    for algo in algos:
        for env_id, num_envs, threshold in SPEED:
            if quick and num_envs not in (4, 64):
                continue
            cfg_args = {"env_id": env_id, "num_seeds": 2 if quick else SEEDS}
            if num_envs:
                cfg_args["num_envs"] = num_envs
            if quick:
                cfg_args["total_timesteps"] = 16_384
            config = {"algo": algo, "args": cfg_args, "threshold": threshold}
            results = [common.run_worker(Path(__file__), config) for _ in range(repeats)]
            med = lambda key: float(np.median([r[key] for r in results]))
            reach = [r["time_to_threshold_s"] for r in results]
            reach_s = float(np.median(reach)) if all(x is not None for x in reach) else None
            r0 = results[0]
            rows.append([
                algo, env_id, r0["num_envs"], r0["num_steps"], cfg_args["num_seeds"],
                f"{r0['total_steps']:,}", f"{med('sps'):,.0f}", f"{med('compile_s'):.1f}",
                f"{np.mean(r0['final']):.1f} (min {np.min(r0['final']):.1f})",
                f"{reach_s:.1f} s" if reach_s is not None else f"not reached ({threshold:g})",
                f"{med('whole_process_s'):.1f}", f"{med('peak_rss_mib'):,.0f}",
            ])
    headers = ["algo", "env", "num_envs", "num_steps", "seeds", "steps/seed", "steps/s (all seeds)",
               "compile s", "final return (mean, min seed)", "whole-process time to threshold",
               "whole process s", "peak MiB"]
    note = (f"Median of {repeats} process(es) per row. Threshold: 475 for CartPole-v1, -200 for "
            "Pendulum-v1 (mean over the seeds of one update's finished episodes).")
    return "### Speed and time to solve\n\n" + note + "\n\n" + common.md_table(headers, rows)


def progress_overhead(quick):
    """Cost of the in-jit progress callbacks: the same program with and without them."""
    base = {"algo": "ppo", "args": {"env_id": "CartPole-v1", "num_seeds": 2 if quick else SEEDS,
                                    "total_timesteps": 65_536 if quick else 300_000}}
    repeats = 1 if quick else 3
    with_cb = [common.run_worker(Path(__file__), base)["run_s"] for _ in range(repeats)]
    without = [common.run_worker(Path(__file__), {**base, "no_progress": True})["run_s"]
               for _ in range(repeats)]
    a, b = float(np.median(with_cb)), float(np.median(without))
    return (f"Progress callbacks (PPO, CartPole-v1, {base['args']['num_seeds']} seeds x "
            f"{base['args']['total_timesteps']:,} steps): run {a:.2f} s with, {b:.2f} s without "
            f"(median of {repeats}): overhead {100 * (a - b) / b:+.1f}%.")


def returns_table(algos, quick):
    rows, curves = [], {}
    for env_id, budget in RETURNS.items():
        for algo in algos:
            seeds = 2 if quick else SEEDS
            config = {"algo": algo, "args": {"env_id": env_id, "num_seeds": seeds,
                                             "total_timesteps": 16_384 if quick else budget}}
            r = common.run_worker(Path(__file__), config)
            final = np.asarray(r["final"])
            lo, hi = common.bootstrap_ci(final)
            ilo, ihi = common.bootstrap_ci(final, stat=common.iqm)
            rows.append([algo, env_id, seeds, f"{r['total_steps']:,}", f"{final.mean():.1f}",
                         f"[{lo:.1f}, {hi:.1f}]", f"{common.iqm(final):.1f}",
                         f"[{ilo:.1f}, {ihi:.1f}]", f"{final.min():.1f}",
                         f"{r['whole_process_s']:.1f}"])
            curves[(algo, env_id)] = r
    headers = ["algo", "env", "seeds", "steps/seed", "final return mean", "95% CI",
               "IQM", "IQM 95% CI", "worst seed", "whole process s"]
    text = ("### Final returns, same budget per environment\n\nFinal return = mean episode return "
            "over the last 5% of updates, per seed; CIs by percentile bootstrap over seeds "
            "(IQM as in Agarwal et al. 2021).\n\n" + common.md_table(headers, rows))
    for env_id in RETURNS:
        path = plot_curves(env_id, {a: curves[(a, env_id)] for a in algos})
        text += f"\n\n![{env_id} learning curves]({path.name})"
    return text


def plot_curves(env_id, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for algo, r in results.items():
        curve = np.array([[np.nan if v is None else v for v in seed] for seed in r["curve"]])
        steps = np.asarray(r["curve_steps"])
        mean = np.nanmean(curve, axis=0)
        cis = np.array([common.bootstrap_ci(col[~np.isnan(col)], n_boot=500)
                        if np.sum(~np.isnan(col)) > 1 else (np.nan, np.nan) for col in curve.T])
        ax.plot(steps, mean, label=f"{algo} ({curve.shape[0]} seeds)")
        ax.fill_between(steps, cis[:, 0], cis[:, 1], alpha=0.25)
    ax.set_xlabel("environment steps per seed")
    ax.set_ylabel("episode return")
    ax.set_title(f"{env_id}: mean and 95% bootstrap CI over seeds")
    ax.legend()
    fig.tight_layout()
    common.RESULTS.mkdir(parents=True, exist_ok=True)
    path = common.RESULTS / f"curves_{env_id}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def run(quick: bool, algos=("ppo", "vpg")) -> str:
    algos = [a for a in algos if (common.ALGOS / f"{a}.py").exists()]
    parts = ["## PPO and VPG", speed_table(["ppo"] if "ppo" in algos else algos, quick)]
    if "ppo" in algos:
        parts.append(progress_overhead(quick))
    parts.append(returns_table(algos, quick))
    return "\n\n".join(parts)


if __name__ == "__main__":
    if not common.worker_entry(worker):
        print(common.machine_header() + "\n\n" + run(quick="--quick" in sys.argv))
