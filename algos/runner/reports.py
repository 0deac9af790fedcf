"""What a run reports: a progress line after each segment, each run's final return, the summary at
the end (a configuration's seeds, a sweep's rows with intervals, or the population by lineage)."""
import dataclasses

import jax
import numpy as np
from scipy.stats import trim_mean

from . import devices, flags


def final_returns(metrics, fraction=0.05):
    """Per run: mean episode_return over the last `fraction` of updates (NaNs ignored); where no
    episode ended in them (Brax's 1000-step episodes all cut at once, none falling), the last
    update's in which some did; NaN if none ever did."""
    returns = np.asarray(metrics["episode_return"])
    window = returns[..., -max(1, round(returns.shape[-1] * fraction)):]
    ended = np.isfinite(window).any(-1)
    mean = np.nanmean(np.where(ended[..., None], window, 0.0), axis=-1)  # (0: not taken below)
    last = returns.shape[-1] - 1 - np.argmax(np.isfinite(returns)[..., ::-1], axis=-1)
    return np.where(ended, mean, np.take_along_axis(returns, last[..., None], -1)[..., 0])


def progress(args, metrics, timing) -> str:
    """After each segment: steps, the return of the segment's episodes, the SHOWN metrics, speed."""
    returns, steps = metrics["episode_return"][:, timing["first"]:], metrics["env_steps"][0]
    finished = np.isfinite(returns).any(1)
    line = [f"return {np.mean([np.nanmean(r) for r in returns[finished]]):8.4g} (episodes of "
            f"{finished.sum()} of {len(returns)} runs)" if finished.any()
            else "no episode finished yet"]
    line += [f"{k} {form.format(np.mean(metrics[k][:, -1]))}"
             for k, form in args.algorithm.SHOWN.items()]
    total = steps[-1] / len(steps) * timing["num_updates"]
    return (f"[{args.exp_name}] steps {steps[-1]:>12,.0f} / {total:,.0f}  {' '.join(line)}  "
            f"SPS {timing['sps']:,.0f}")


def iqm(x) -> float:
    """Interquartile mean (Agarwal et al. 2021): the mean of the middle half of the values."""
    return float(trim_mean(np.asarray(x, dtype=np.float64).ravel(), 0.25))


def bootstrap_ci(x, stat=np.mean):
    """95% percentile-bootstrap confidence interval of `stat` over the runs in x (5000 draws)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    picks = np.random.default_rng(0).integers(0, len(x), size=(5000, len(x)))
    stats = [stat(x[p]) for p in picks]
    return tuple(float(q) for q in np.quantile(stats, [0.025, 0.975]))


def final_scores(args, metrics, evals={}) -> dict:
    """Per run: the final training return, each SHOWN metric at the last update, evals as given."""
    return {"episode_return": final_returns(metrics),
            **{k: np.asarray(metrics[k])[:, -1] for k in args.algorithm.SHOWN}, **evals}


def summary(args, metrics, timing, evals={}) -> str:
    """metrics [runs, updates], evals {tag: [runs]}: a configuration's seeds, or a sweep's rows;
    with --pbt, the final population by lineage."""
    algorithm, configs = args.algorithm, flags.grid(args)
    shown = {**dict.fromkeys(evals, "{:.4g}"), **algorithm.SHOWN}
    by_config = lambda x: np.asarray(x).reshape(len(configs), args.num_seeds)
    finals = {k: by_config(v) for k, v in final_scores(args, metrics, evals).items()}
    sweep = f"{len(configs)} configurations x " if len(configs) > 1 else ""
    varied = flags.swept(args)
    resolved = {f.name: getattr(args, f.name) for f in dataclasses.fields(algorithm.Hyperparams)
                if f.name != "env_id" and f.name not in varied}
    lines = [f"{args.exp_name} on {args.env_id}: {sweep}{args.num_seeds} seeds x "
             f"{metrics['env_steps'][0, -1]:,.0f} steps",  # then the flags as resolved, but swept
             "flags: " + " ".join(f"{k}={v[0] if k in algorithm.HPARAMS else v}"
                                  for k, v in resolved.items())]
    per_run = f" ({timing['span']} a run)" if timing["span"] > 1 else ""
    if timing["span"] == 1 and timing["devices"] < jax.device_count():  # devices left idle
        per_run = f" (a run on each: {devices.why_not_split(args, 2) or '--devices-per-run 1'})"
    timing_line = (f"{timing['devices']} device(s){per_run}  compile {timing['compile_s']:.1f} s"
                   f"{' (cache)' if timing['cached'] else ''}  run {timing['run_s']:.1f} s  |  "
                   f"{timing['sps']:,.0f} steps/s")
    returns = finals["episode_return"]
    if args.pbt:
        lines += population_lines(args, metrics, evals)
    elif len(configs) == 1:
        lines.append("final return per seed (last 5% of updates): "
                     + " ".join(f"{r:.4g}" for r in returns[0]))
        for k, form in shown.items():
            what = "last update" if k in algorithm.SHOWN else f"{args.eval_episodes} episodes"
            values = " ".join(form.format(x) for x in finals[k][0])
            lines.append(f"{k} per seed ({what}): {values}")
        timing_line = f"mean {np.mean(returns):.4g}  min {np.min(returns):.4g}  |  {timing_line}"
    else:
        lines.append(" | ".join([*varied, "final return mean [95% CI over seeds]", "IQM", "worst",
                                 *shown]))
        for c in np.argsort(-finals[algorithm.SCORE].mean(1), kind="stable"):
            x, ci = returns[c], bootstrap_ci(returns[c])  # over this configuration's seeds
            lines.append(" | ".join(
                [f"{configs[c][k]:g}" for k in varied]
                + [f"{x.mean():.4g} [{ci[0]:.4g}, {ci[1]:.4g}]", f"{iqm(x):.4g}", f"{x.min():.4g}"]
                + [form.format(finals[k][c].mean()) for k, form in shown.items()]))
    return "\n".join(lines + [timing_line])


def lineages(args, metrics, evals={}):
    """--pbt: (metrics [runs, updates] along each final run's lineage, the run each descends from,
    its final SCORE, the runs best first). A copy (pbt/copied_from, at a segment's last update)
    hands its source's state on: up to it, the lineage is the source's."""
    copied_from = np.asarray(metrics["pbt/copied_from"])
    slot, path = np.arange(len(copied_from)), np.zeros(copied_from.shape, int)
    for i in reversed(range(copied_from.shape[1])):
        source = copied_from[slot, i]
        slot = np.where(np.isfinite(source), source, slot).astype(int)
        path[:, i] = slot
    along = {k: np.take_along_axis(np.asarray(v), path, 0) for k, v in metrics.items()}
    score = final_scores(args, along, evals)[args.algorithm.SCORE]
    return along, path[:, 0], score, np.argsort(-score, kind="stable")


def population_lines(args, metrics, evals) -> list:
    """--pbt: the final runs best first by SCORE, each with the run its lineage descends from
    (configuration and seed), its evaluations and final swept values; how many lineages are
    left; the schedule of the best lineage's swept values."""
    along, roots, score, order = lineages(args, metrics, evals)
    steps, varied = metrics["env_steps"][0], flags.swept(args)
    lines = [f"population by lineage, best first: run | descends from | {args.algorithm.SCORE} | "
             + " | ".join([*evals, *varied])]
    lines += [" | ".join([str(r), f"run {roots[r]} ({run_name(args, roots[r])})",
                          f"{score[r]:.4g}", *(f"{evals[k][r]:.4g}" for k in evals),
                          *(f"{along[f'hp/{k}'][r, -1]:.4g}" for k in varied)]) for r in order]
    lines.append(f"lineages left: {len(set(roots))} of {len(roots)} runs descend from "
                 + ", ".join(f"run {r}" for r in sorted(set(roots))))
    for k in varied:
        schedule = along[f"hp/{k}"][order[0]]
        changes = [0, *np.flatnonzero(np.diff(schedule)) + 1]  # where a new value holds
        lines.append(f"run {order[0]}'s lineage, {k}: " + ", ".join(
            f"{schedule[i]:.4g} from step {steps[i] - steps[0]:,.0f}" for i in changes))
    return lines


def run_name(args, run: int) -> str:
    """A run of the sweep by its swept values and seed: "learning_rate 0.001, seed 0"."""
    config = flags.grid(args)[run // args.num_seeds]
    return ", ".join([*(f"{k} {config[k]:g}" for k in flags.swept(args)),
                      f"seed {run % args.num_seeds}"])


def pbt_record(args, metrics) -> list:
    """--pbt: per run, the hyperparameters in force at its end and the run its lineage descends
    from (what its folder and saved model record: not the values it started with)."""
    roots = lineages(args, metrics)[1]
    return [{"hyperparameters": {k: float(metrics[f"hp/{k}"][r, -1])
                                 for k in args.algorithm.HPARAMS},
             "descends_from": f"run {roots[r]} ({run_name(args, roots[r])})"}
            for r in range(len(roots))]
