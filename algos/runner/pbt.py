"""Population-based training (Jaderberg et al. 2017, --pbt): between two segments the sweep's runs
are ranked on their recent episodes; the worst copy better ones and explore their swept floats."""
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import flags


def schedule(args, num_updates: int) -> tuple:
    """(the updates after which the population steps, the interval in updates): every
    --pbt-interval env steps in whole updates, from --pbt-burn-in on, none in the run's
    --pbt-last-stretch. The same whatever the population's size or --num-segments."""
    per_update = args.total_timesteps / num_updates  # (steps of an update, as the flags count)
    interval = max(1, round(args.pbt_interval / per_update))
    burn_in, last = args.pbt_burn_in / per_update, (1 - args.pbt_last_stretch) * num_updates
    return [u for u in range(interval, num_updates, interval) if burn_in <= u <= last], interval


def window_fitness(args, metrics, first: int, last: int):
    """Each run's SCORE over updates [first, last), NaN where the run ended fewer than
    --pbt-min-episodes episodes there. A metric of episodes (episode_return, episode_length) is
    their mean: each update's weighted by its count of them; another, its mean over the updates."""
    name = args.algorithm.SCORE
    score = np.asarray(metrics[name][:, first:last], np.float64)
    episodes = np.asarray(metrics["episodes"][:, first:last], np.float64)
    weight = episodes if name.startswith("episode_") else np.isfinite(score) * 1.0
    total = np.where(weight > 0, score * weight, 0.0).sum(1)  # (an update's NaN weighs nothing)
    with np.errstate(all="ignore"):
        return np.where(episodes.sum(1) >= args.pbt_min_episodes, total / weight.sum(1), np.nan)


def step(args, exploit, state, hp, metrics, done: int, num_updates: int):
    """(state, hp, copied_from) after `done` updates: `exploit` (exploit_and_explore, jitted)
    where the schedule has a step, on fitness over the interval before it; else copied_from None."""
    steps, interval = schedule(args, num_updates) if args.pbt else ([], 0)
    if done not in steps:
        return state, hp, None
    key = jax.random.fold_in(jax.random.PRNGKey(args.seed), done)  # the same on --resume
    fitness = window_fitness(args, metrics, done - interval, done)
    return jax.device_get(exploit(state, hp, fitness, key))


def exploit_and_explore(args, state, hp, fitness, key):
    """PBT's step over the population ([runs, ...] leaves, hp {flag: [runs]}, fitness [runs];
    NaN: no evidence, the run sits the step out). The others are ranked, ties at random; each of
    their bottom --pbt-fraction (of n ranked: ceil, at most n // 2, as Ray Tune's) copies the
    state and hyperparameters of a member drawn from their top as many if it is better by more
    than --pbt-margin, then explores each swept float (explore). Every run goes on with a key of
    its own (the step's, folded with its index). -> (state, hp, copied_from: -1 if not)."""
    runs, index = len(fitness), jnp.arange(len(fitness))
    k_ties, k_pick, k_runs, *k_flags = jax.random.split(key, 3 + len(args.algorithm.HPARAMS))
    ranked = jnp.isfinite(fitness)
    count = ranked.sum()
    n = jnp.minimum(jnp.ceil(args.pbt_fraction * count), count // 2).astype(jnp.int32)
    ties = jax.random.uniform(k_ties, (runs,))
    order = jnp.lexsort((ties, jnp.where(ranked, fitness, 0.0), ~ranked))  # worst first, NaN last
    rank = jnp.argsort(order)
    drawn = order[count - n + jax.random.randint(k_pick, (runs,), 0, jnp.maximum(n, 1))]
    copies = (rank < n) & (fitness[drawn] > fitness + args.pbt_margin)
    source = jnp.where(copies, drawn, index)
    hp = {k: v[source] for k, v in hp.items()}
    for k, k_flag in zip(args.algorithm.HPARAMS, k_flags):
        if k in flags.swept(args):
            hp[k] = jnp.where(copies, explore(args, k, hp[k], k_flag), hp[k])
    keys = jax.vmap(partial(jax.random.fold_in, k_runs))(index)
    state = jax.tree.map(lambda x: x[source], state)._replace(key=keys)
    return state, hp, jnp.where(copies, source, -1)


def explore(args, name: str, value, key):
    """New values [runs] of the swept float `name`: each moved by x0.8 or x1.25, or with
    probability --pbt-resample drawn anew over the grid's range (log-uniform; uniform where the
    range reaches 0); a NEAR_ONE flag on its scale 1 - x. A value its rule refuses stays."""
    k_move, k_redraw, k_draw = jax.random.split(key, 3)

    def scale(x):  # (its own inverse)
        return 1 - x if name in args.algorithm.NEAR_ONE else x

    x, values = scale(value), [scale(v) for v in getattr(args, name)]
    low, high = min(values), max(values)
    u = jax.random.uniform(k_draw, x.shape)
    drawn = low * (high / low) ** u if low > 0 else low + (high - low) * u
    moved = x * jnp.where(jax.random.bernoulli(k_move, 0.5, x.shape), 0.8, 1.25)
    new = scale(jnp.where(jax.random.bernoulli(k_redraw, args.pbt_resample, x.shape), drawn, moved))
    return jnp.where(args.algorithm.HPARAMS[name][1](new), new, value)
