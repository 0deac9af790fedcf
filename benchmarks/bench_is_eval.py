"""Off-policy evaluation (algos/is_eval.py): speed and accuracy.

Speed: episodes per second for every estimator together (OIS, WIS, PDIS, WPDIS, DR, WDR and the ESS;
no bootstrap) at N = 100k episodes, H = 100 steps, in one jitted call, against the two baselines it
replaces, run on the same data: the per-episode Python loop over episode objects and a vectorised
numpy implementation (also timed on OIS, PDIS and WPDIS alone, the issue's 0.39M episodes/s
reference); and the bootstrap-t and t intervals (1000 resamples) on their own. Every workload runs
in its own process (common.run_worker): one warm-up call (the compile, for JAX), then the median of
several.

Accuracy: the GridWorld sweep against the exact V^pi for n = 10 ... 10000 episodes, 2000 datasets
per n (`python algos/is_eval.py --num-datasets 2000`: coverage of a 95% interval has a standard
error of 0.005), in its own process with an empty compilation cache: bias, standard deviation,
MSE and the coverage of every estimator's 95% bootstrap-t and t intervals (oracle DR: the exact
Q^pi), the betting lower bound (its mean, how often it holds) and interval (coverage, width); the
whole-process time of `python algos/is_eval.py` as typed (500 datasets), cold; and the DR/WDR bias
with Q-hat cross-fitted (--folds 2, the default) against Q-hat fitted on the episodes it scores
(--folds 1). The MSE-vs-n plot is saved under benchmarks/results/.

    python benchmarks/bench_is_eval.py [--quick]
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SCRIPT = Path(__file__).resolve()
GAMMA = 0.99


# ----------------------------------------------------------------------------- data
def make_data(n: int, horizon: int, seed: int = 0) -> dict:
    """Logged episodes of random lengths (at least H/2), float32, as [N, H] arrays for is_eval."""
    rng = np.random.default_rng(seed)
    f32 = lambda: rng.standard_normal((n, horizon), dtype=np.float32)  # noqa: E731
    lengths = rng.integers(horizon // 2, horizon + 1, n)
    mask = np.arange(horizon)[None] < lengths[:, None]
    blp = np.log(0.2 + 0.8 * rng.random((n, horizon), dtype=np.float32))
    tlp = np.minimum(blp + 0.1 * f32(), 0.0)  # a log-probability: at most 0
    return dict(tlp=tlp, blp=blp, rewards=f32(), mask=mask, q_hat=f32(), v_hat=f32())


# ----------------------------------------------------------------------------- baselines
def numpy_three(d, gamma=GAMMA) -> dict:
    """Vectorised numpy, OIS, PDIS and WPDIS only (the issue's reference measurement)."""
    mask = d["mask"]
    w = np.cumprod(np.where(mask, np.exp(d["tlp"] - d["blp"]), 1.0), axis=1)
    r = np.where(mask, d["rewards"], 0.0) * gamma ** np.arange(mask.shape[1])
    return {"ois": np.mean(w[:, -1] * r.sum(1)), "pdis": np.mean((w * r).sum(1)),
            "wpdis": np.sum((w * r).sum(0) / w.sum(0))}


def numpy_all(d, gamma=GAMMA) -> dict:
    """Vectorised numpy, every estimator and the ESS, direct products of ratios."""
    mask = d["mask"]
    n, horizon = mask.shape
    w = np.cumprod(np.where(mask, np.exp(d["tlp"] - d["blp"]), 1.0), axis=1)
    w_prev = np.concatenate([np.ones((n, 1), w.dtype), w[:, :-1]], axis=1)
    disc = gamma ** np.arange(horizon)
    r = np.where(mask, d["rewards"], 0.0)
    rq, v = np.where(mask, d["rewards"] - d["q_hat"], 0.0), np.where(mask, d["v_hat"], 0.0)
    ret, W = (r * disc).sum(1), w[:, -1]
    s, s_prev = w.sum(0), w_prev.sum(0)
    return {
        "ois": np.mean(W * ret), "wis": np.sum(W * ret) / W.sum(), "pdis": np.mean((w * r) @ disc),
        "wpdis": disc @ ((w * r).sum(0) / s), "ess": W.sum() ** 2 / (W**2).sum(),
        "dr": np.mean((w * rq + w_prev * v) @ disc),
        "wdr": disc @ ((w * rq).sum(0) / s + (w_prev * v).sum(0) / s_prev),
    }


def to_episode_objects(d) -> list:
    """The array-of-structs layout the loop baseline starts from: one object per episode, its arrays
    cut to its own length."""
    from types import SimpleNamespace

    lengths = d["mask"].sum(1)
    keys = ("tlp", "blp", "rewards", "q_hat", "v_hat")
    return [SimpleNamespace(**{k: d[k][i, :length] for k in keys})
            for i, length in enumerate(lengths)]


def python_loop(episodes, horizon: int, gamma=GAMMA) -> dict:
    """The per-episode Python loop this file replaces: numpy inside each episode, the episodes one
    at a time; per-step sums over episodes for the weighted per-decision estimators."""
    n = len(episodes)
    disc = gamma ** np.arange(horizon)
    s, s_prev, wr, wrq, wv = (np.zeros(horizon) for _ in range(5))
    ois = wis_num = wis_den = w2 = pdis = dr = 0.0
    for ep in episodes:
        length = len(ep.rewards)
        w = np.cumprod(np.exp(ep.tlp - ep.blp))
        w_prev = np.concatenate([[1.0], w[:-1]])
        ret = ep.rewards @ disc[:length]
        ois += w[-1] * ret
        wis_num, wis_den, w2 = wis_num + w[-1] * ret, wis_den + w[-1], w2 + w[-1] ** 2
        pdis += (w * ep.rewards) @ disc[:length]
        dr += (w * (ep.rewards - ep.q_hat) + w_prev * ep.v_hat) @ disc[:length]
        s[:length] += w
        s[length:] += w[-1]  # an ended episode keeps its weight in the per-step normalisation
        s_prev[:length] += w_prev
        s_prev[length:] += w[-1]
        wr[:length] += w * ep.rewards
        wrq[:length] += w * (ep.rewards - ep.q_hat)
        wv[:length] += w_prev * ep.v_hat
    return {"ois": ois / n, "wis": wis_num / wis_den, "pdis": pdis / n, "wpdis": disc @ (wr / s),
            "ess": wis_den**2 / w2, "dr": dr / n, "wdr": disc @ (wrq / s + wv / s_prev)}


# ----------------------------------------------------------------------------- workers
def worker(config: dict) -> dict:
    """One workload in this process: {'first_s', 'median_s', 'episodes_per_s', 'max_rel_diff'}."""
    if config["kind"] == "sweep":
        return sweep_worker(config)
    kind, n, horizon, repeats = config["kind"], config["n"], config["horizon"], config["repeats"]
    d = make_data(n, horizon)
    if kind == "python_loop":
        episodes = to_episode_objects(d)
        fn = lambda: python_loop(episodes, horizon)  # noqa: E731
    elif kind == "numpy_three":
        fn = lambda: numpy_three(d)  # noqa: E731
    elif kind == "numpy_all":
        fn = lambda: numpy_all(d)  # noqa: E731
    else:
        import jax

        is_eval = common.import_algo("is_eval")
        arrays = (jax.device_put(d[k]) for k in ("rewards", "blp", "mask"))
        episodes = is_eval.Episodes(None, None, *arrays)
        tlp, q_hat, v_hat = (jax.device_put(d[k]) for k in ("tlp", "q_hat", "v_hat"))
        if kind == "jax_all":
            fn = lambda: is_eval.estimate(episodes, tlp, GAMMA, q_hat, v_hat)  # noqa: E731
        else:  # jax_bootstrap: per-episode rows and config["resamples"] resamples, one jitted call
            boot = jax.jit(lambda key, *data: is_eval.bootstrap_intervals(
                key, is_eval.episode_rows(*data), GAMMA, config["resamples"]))
            data = (episodes, tlp, GAMMA, q_hat, v_hat)
            fn = lambda: jax.block_until_ready(boot(jax.random.PRNGKey(0), *data))  # noqa: E731
    first, steady = common.time_calls(fn, repeats)
    rss = common.peak_rss_mib()  # before the float64 reference below adds its own arrays
    out = fn()
    out = out[0] if kind == "jax_bootstrap" else out  # (estimates, bootstrap-t, t intervals)
    reference = numpy_all({k: v.astype(np.float64) if v.dtype == np.float32 else v
                           for k, v in d.items()})
    diff = max((abs(float(out[k]) - reference[k]) / max(abs(reference[k]), 1e-12) for k in out
                if k in reference and np.ndim(out[k]) == 0), default=float("nan"))
    median = float(np.median(steady))
    return {"first_s": first, "median_s": median, "episodes_per_s": n / median,
            "best_episodes_per_s": n / min(steady), "max_rel_diff": diff, "timed_rss_mib": rss}


def plot_mse(stats: dict, sizes, path: str):
    """MSE against n on log-log axes, one line per estimator (oracle DR included), with a 1/n
    guide."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure to close
    fig = Figure(figsize=(6, 4.5), layout="tight")
    ax = fig.subplots()
    for name, s in stats.items():
        if "mse" in s:
            ax.plot(sizes, s["mse"], marker="o", label=name.upper())
    ax.plot(sizes, [stats["ois"]["mse"][0] * sizes[0] / n for n in sizes], "k:", label="1/n")
    ax.set(xscale="log", yscale="log", xlabel="episodes n", ylabel="MSE against the exact V^pi",
           title="Off-policy estimators on the GridWorld")
    ax.legend()
    fig.savefig(path, dpi=120)


def sweep_worker(config: dict) -> dict:
    """`python algos/is_eval.py FLAGS` as typed; then bias, variance, MSE and coverage per
    estimator and n of its GridWorld sweep."""
    kept = common.run_as_typed("is_eval", config["flags"])
    is_eval, args = kept["algo"], kept["args"]
    value = float(is_eval.gridworld_problem(args).value)
    stats = is_eval.sweep_stats(kept["metrics"], value)
    if config.get("plot"):
        plot_mse(stats, args.dataset_sizes, config["plot"])
    return {"value": value, "timing": kept["timing"], "sizes": list(args.dataset_sizes),
            "datasets": args.num_datasets, "stats": {
                name: {k: [float(x) for x in v] for k, v in s.items()}
                for name, s in stats.items()}}


# ----------------------------------------------------------------------------- tables
SPEED = [  # (kind, what it computes)
    ("python_loop", "all + ESS"),
    ("numpy_three", "OIS, PDIS, WPDIS"),
    ("numpy_all", "all + ESS"),
    ("jax_all", "all + ESS"),
    ("jax_bootstrap", "bootstrap-t and t 95% CIs of all"),
]
NAMES = {"python_loop": "Python loop over episode objects", "numpy_three": "numpy, vectorised",
         "numpy_all": "numpy, vectorised", "jax_all": "is_eval.estimate (JAX, jitted)",
         "jax_bootstrap": "is_eval.bootstrap_intervals (JAX, jitted)"}


# The sweep of 2000 datasets per n (the file's other defaults: folds 2, n = 10 ... 10^4, 1000
# resamples), the command as typed (500 datasets: its time), and the sweep with Q-hat fitted
# in-sample: its bias and MSE only, so 2 bootstrap resamples (coverage unused).
SWEEP, TYPED = ["--num-datasets", "2000"], []
IN_SAMPLE = ["--folds", "1", "--num-bootstrap", "2", "--num-datasets", "2000"]
QUICK_SWEEP = ["--dataset-sizes", "10", "100", "--num-datasets", "20", "--num-episodes", "200",
               "--num-bootstrap", "100"]


def run_sweep(flags: list[str], plot: Path | None = None) -> dict:
    """One process: is_eval.py as typed, with an empty compilation cache (cold)."""
    with tempfile.TemporaryDirectory() as cache:
        return common.run_worker(SCRIPT, {"kind": "sweep", "plot": plot and str(plot), "flags": [
            *flags, "--no-track", "--compile-cache-dir", cache]}, as_user=True)


def run(quick: bool) -> str:
    n, horizon = (20_000, 100) if quick else (100_000, 100)
    resamples = 200 if quick else 1000
    results = {}
    for kind, _ in SPEED:
        if quick and kind not in ("numpy_all", "jax_all"):
            continue
        config = {"kind": kind, "n": n, "horizon": horizon, "resamples": resamples,
                  "repeats": 3 if kind in ("python_loop", "jax_bootstrap") else 5}
        if kind == "python_loop" and not quick:
            config["n"] = 20_000  # the loop's time is linear in N; measured on a fifth of it
        results[kind] = common.run_worker(SCRIPT, config)
    numpy_rate = results["numpy_all"]["episodes_per_s"]
    rows = []
    for kind, what in SPEED:
        if kind not in results:
            continue
        r = results[kind]
        n_used = 20_000 if kind == "python_loop" else n
        label = NAMES[kind] + (f" ({resamples} resamples)" if kind == "jax_bootstrap" else "")
        rows.append([label, what, f"{n_used:,} x {horizon}", f"{r['first_s']:.2f}",
                     f"{r['median_s'] * 1e3:.1f}", f"{r['episodes_per_s'] / 1e6:.3f}M",
                     f"{r['best_episodes_per_s'] / 1e6:.3f}M",
                     f"{r['episodes_per_s'] / numpy_rate:.2f}x", f"{r['max_rel_diff']:.1e}",
                     f"{r['timed_rss_mib']:.0f}"])
    speed = common.md_table(
        ["implementation", "estimators", "episodes x H", "first call s", "median ms",
         "episodes/s (median)", "episodes/s (best)", "median vs numpy (all)",
         "max rel. diff vs float64", "peak RSS MiB"], rows)

    common.RESULTS.mkdir(parents=True, exist_ok=True)
    plot = common.RESULTS / "is_eval_mse_vs_n.png"
    sweep = run_sweep(QUICK_SWEEP if quick else SWEEP, plot)
    sizes, datasets = sweep["sizes"], sweep["datasets"]
    stats = sweep["stats"]
    rows = [[name.upper(), size, f"{s['bias'][j]:+.4f}", f"{np.sqrt(s['variance'][j]):.4f}",
             f"{s['mse'][j]:.3g}", f"{s['coverage'][j]:.3f}", f"{s['t_coverage'][j]:.3f}"]
            for name, s in stats.items() if "mse" in s for j, size in enumerate(sizes)]
    accuracy = common.md_table(["estimator", "n", "bias", "std", "MSE", "95% bootstrap-t coverage",
                                "95% t coverage"], rows)
    bet = stats["betting"]
    betting = common.md_table(
        ["n", "lower bound: mean", "lower bound - V^pi", "it holds", "interval: coverage",
         "mean width"],
        [[size, f"{bet['lower'][j]:+.4f}", f"{bet['lower'][j] - sweep['value']:+.4f}",
          f"{bet['holds'][j]:.3f}", f"{bet['coverage'][j]:.3f}", f"{bet['width'][j]:.4f}"]
         for j, size in enumerate(sizes)])
    timing = sweep["timing"]
    se = np.sqrt(0.95 * 0.05 / datasets)
    command = f"is_eval.py {' '.join(QUICK_SWEEP if quick else SWEEP)}".strip()
    typed = None if quick else run_sweep(TYPED)
    parts = [
        "## Off-policy evaluation (is_eval.py): speed and accuracy",
        f"### is_eval: episodes per second, N = {n:,}, H = {horizon} (median of several calls "
        "after a warm-up)",
        speed,
        f"### is_eval: GridWorld sweep, exact V^pi = {sweep['value']:.4f}, {datasets} datasets per "
        f"n",
        f"`{command}`, one process, cold compilation cache: whole process "
        f"{sweep['process_s']:.1f} s (the sweep: compile {timing['compile_s']:.1f} s, run "
        f"{timing['run_s']:.1f} s)." + ("" if typed is None else
                                        " `is_eval.py` as typed (500 datasets): whole process "
                                        f"{typed['process_s']:.1f} s (compile "
                                        f"{typed['timing']['compile_s']:.1f} s, run "
                                        f"{typed['timing']['run_s']:.1f} s)."),
        accuracy,
        f"Coverage of a 95% interval over {datasets} datasets has a binomial standard error of "
        f"{se:.3f}. ORACLE_DR: DR with the exact Q^pi instead of the fitted Q-hat. The betting "
        "bounds (delta = 0.05), valid for every n:",
        betting,
        f"![is_eval MSE against n]({plot.name})",
    ]
    if not quick:
        in_sample = run_sweep(IN_SAMPLE)
        both = {1: in_sample, 2: sweep}
        rows = [[name.upper(), size] + [f"{both[f]['stats'][name][stat][j]:{spec}}"
                                        for f in (1, 2) for stat, spec in (("bias", "+.4f"),
                                                                           ("mse", ".3g"))]
                for name in ("dr", "wdr") for j, size in enumerate(sizes)]
        parts += [
            "### is_eval: DR and WDR, Q-hat fitted on the episodes it scores vs cross-fitted",
            f"`is_eval.py {' '.join(IN_SAMPLE)}` (whole process {in_sample['process_s']:.1f} s) "
            "against the sweep above (`--folds 2`, the default), on the same datasets.",
            common.md_table(["estimator", "n", "bias, in-sample Q-hat", "MSE, in-sample",
                             "bias, cross-fitted (2 folds)", "MSE, cross-fitted"], rows)]
    return "\n\n".join(parts)


if __name__ == "__main__":
    if not common.worker_entry(worker):
        started = time.perf_counter()
        print(common.machine_header())
        print()
        print(run(quick="--quick" in sys.argv))
        print(f"\n(benchmark wall time {time.perf_counter() - started:.0f} s)")
