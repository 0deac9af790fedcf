"""Off-policy evaluation by importance sampling: OIS, WIS, PDIS, WPDIS, DR and WDR in one jitted
call, with bootstrap-t and t intervals, betting bounds valid for every n, and weight diagnostics.

Estimate V^pi = E_pi[sum_t gamma^t r_t] of a target policy pi from episodes of a behaviour policy b,
reweighting every logged step by rho_t = pi(a_t|s_t) / b(a_t|s_t): ordinary and weighted importance
sampling (OIS, WIS), per-decision IS (PDIS, Precup, Sutton & Singh 2000) and its weighted form
(WPDIS), doubly robust (DR, Jiang & Li 2016) and weighted DR (WDR, Thomas & Brunskill 2016). Their
95% studentized bootstrap-t and t intervals are approximate: they reach 95% only as n grows (the
weights are heavy-tailed; see the sweep). With every return in a known range, a lower bound and an
interval by betting (Waudby-Smith & Ramdas 2024) hold with probability >= 1 - delta for every n.
Episodes are [N, H] arrays padded with a mask (`Episodes`); ratio products are sums of logs, each
step's weights divided by their largest before exponentiating: no overflow, no NaN. NaN or
infinite data are refused.

The default experiment: the 4x4 GridWorld below, its exact V^pi by backward induction, every
estimator on 1000 episodes of a more exploratory behaviour policy, then bias, variance, MSE and
coverage over 500 datasets for each n = 10 ... 10000. DR and WDR use a Q-hat fitted on the data,
cross-fitted (Kallus & Uehara 2020) over --folds folds; "oracle DR" the exact Q^pi.

    python algos/is_eval.py --help
    python algos/is_eval.py                                      # GridWorld table + sweep
    python algos/is_eval.py --dataset episodes.npz --gamma 0.99 --return-range 0 1
    python algos/is_eval.py --target-model runs/<run>/model.msgpack --horizon 100

Expect: exact V^pi = 0.2472; OIS, PDIS unbiased, MSE falling as 1/n, DR and WDR the smallest; over
2000 datasets, bootstrap-t coverage 0.935-0.953 at n >= 1000, 0.898-0.964 at n = 100; the betting
bound holds in 99% of datasets, its mean -0.14 at n = 1000 and +0.12 at 10^4 (V^pi = 0.247)."""

# ============================================================================ imports
import dataclasses
import json
import math
import os
import sys
import threading
import time
from functools import partial
from typing import NamedTuple, Optional

import jax

# Before any JAX operation: one CPU device per core (unless chosen), for the sweep's pmap to use.
if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
        and jax.config.jax_num_cpu_devices < 0):
    jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)

import flax.linen as nn
import flax.serialization
import jax.numpy as jnp
import numpy as np
import scipy.stats  # a dependency of jax itself
import tyro
from jax.experimental.compilation_cache import compilation_cache

# gymnax is imported where --target-model needs it: importing it takes seconds, nothing else does.
# GPUs multiply float32 matrices in TF32 (a 10-bit mantissa) unless told otherwise: every product
# here that sums weights or values goes through `dot`.
dot = partial(jnp.matmul, precision=jax.lax.Precision.HIGHEST)


# ============================================================================ 1. arguments
@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """base seed: the table's dataset uses PRNGKey(seed), dataset k of the sweep its k-th split"""
    num_datasets: int = 500
    """independent datasets per size n in the sweep (this file's --num-seeds; pmapped over cores)"""
    track: bool = True
    """write tensorboard event files (scalars and result tables) under --log-dir"""
    log_dir: str = "runs"
    """root directory of the tensorboard runs"""
    compile_cache_dir: str = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                            os.path.expanduser("~/.cache/jax"))
    """persistent compilation cache, so a rerun skips most of the compile ("" turns it off)"""

    gamma: float = 0.95
    """discount factor of the value being estimated, in [0, 1]"""
    horizon: Optional[int] = None
    """episode horizon H (default: 20 on the GridWorld, the env's step limit with --target-model)"""
    num_episodes: int = 1000
    """episodes n in the dataset of the printed table"""
    dataset_sizes: tuple[int, ...] = (10, 100, 1000, 10000)
    """dataset sizes n of the sweep"""
    num_bootstrap: int = 1000
    """bootstrap resamples for the table's confidence intervals, and every dataset's in the sweep"""
    delta: float = 0.05
    """the betting lower bound and interval each hold with probability >= 1 - delta"""
    return_range: Optional[tuple[float, float]] = None
    """LOW HIGH: every episode's discounted return lies in [LOW, HIGH]; the betting bounds need it
    (--dataset, --target-model; the GridWorld's range is computed exactly from its MDP)"""

    slip: float = 0.2
    """GridWorld: probability that a move goes in a uniformly random direction instead"""
    target_temperature: float = 0.02
    """GridWorld: the target policy is softmax(Q* / target_temperature)"""
    behaviour_temperature: float = 0.1
    """GridWorld: the behaviour policy is softmax(Q* / behaviour_temperature), more exploratory"""
    folds: int = 2
    """GridWorld: DR and WDR score each of this many folds of a dataset with the Q-hat fitted on the
    other folds (cross-fitting; 1: fitted on the very episodes it scores, which biases DR)"""

    dataset: Optional[str] = None
    """evaluate the episodes in this .npz file instead: [N, H] arrays obs (or [N, H, ...]), actions,
    rewards, behaviour_log_prob, mask, target_log_prob; for DR and WDR q_hat and v_hat"""
    target_model: Optional[str] = None
    """evaluate the policy in this model.msgpack (algos/ppo.py --save-model) on its discrete gymnax
    env instead, from episodes of (1 - epsilon) * policy + epsilon * uniform"""
    model_seed: int = 0
    """--target-model: which of the saved seeds' policies to evaluate"""
    epsilon: float = 0.3
    """--target-model: weight of the uniform policy in the behaviour mixture, in [0, 1]"""
    num_mc_episodes: int = 20_000
    """--target-model: on-policy Monte Carlo episodes for the ground truth"""


class ArgError(ValueError):
    """A flag broke a rule: reported as one line with exit status 2, before anything compiles."""


def validate(args: Args) -> Args:
    """Check every flag before anything compiles (--dataset, --target-model: when loaded)."""
    rules = [  # (fields, rule, holds for a value)
        (("gamma", "slip", "epsilon"), "must be in [0, 1]", lambda v: 0 <= v <= 1),
        (("num_episodes", "num_datasets", "horizon", "num_mc_episodes"), "must be >= 1",
         lambda v: v is None or v >= 1),
        (("dataset_sizes",), "must be one or more sizes n >= 1", lambda v: min(v, default=0) >= 1),
        (("num_bootstrap",), "must be >= 2 resamples", lambda v: v >= 2),
        (("target_temperature", "behaviour_temperature"), "must be > 0", lambda v: v > 0),
        (("delta",), "must be in (0, 1)", lambda v: 0 < v < 1),
        (("return_range",), "must be LOW HIGH with LOW < HIGH", lambda v: v is None or v[0] < v[1]),
        (("folds",), "must be between 1 and the smallest of --dataset-sizes and --num-episodes",
         lambda v: 1 <= v <= min((*args.dataset_sizes, args.num_episodes))),
    ]
    for name, rule, holds in ((name, *rule) for names, *rule in rules for name in names):
        if not holds(getattr(args, name)):
            raise ArgError(f"--{name.replace('_', '-')} {rule} (got {getattr(args, name)})")
    if args.dataset is not None and args.target_model is not None:
        raise ArgError("--dataset and --target-model are two different experiments: give one")
    return args


# ============================================================================ 2. environment
# A GridWorld with slip as a tabular MDP: transition tensor P[s, a, s'], the reward for entering
# each cell, absorbing terminal cells. 'S' start, 'G' goal (+1, ends), 'P' pit (-1, ends), '.' free;
# every other step costs 0.04 (Russell & Norvig's GridWorld): rewards come at every step.
GRID = ("S...", ".P.P", "....", "P..G")  # rows, top to bottom
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left as (row, column) steps
CELL_REWARD = {"G": 1.0, "P": -1.0, ".": -0.04, "S": -0.04}
GRID_HORIZON = 20


class TabularMDP(NamedTuple):
    P: jax.Array  # [S, A, S] transition probabilities
    R: jax.Array  # [S, A] expected reward of a step (0 in terminal cells)
    reward: jax.Array  # [S] the reward for entering a cell
    terminal: jax.Array  # [S] bool: entering it ends the episode
    start: int


def gridworld(slip: float) -> TabularMDP:
    """The GridWorld above; with probability `slip` a move goes in a uniformly random direction."""
    rows, cols, cells = len(GRID), len(GRID[0]), "".join(GRID)
    row, col = jnp.divmod(jnp.arange(rows * cols), cols)
    moves = jnp.array(MOVES)
    dest_row = jnp.clip(row[:, None] + moves[:, 0], 0, rows - 1)  # walls keep you in place
    dest_col = jnp.clip(col[:, None] + moves[:, 1], 0, cols - 1)
    intended = jax.nn.one_hot(dest_row * cols + dest_col, rows * cols)  # [S, A, S]
    P = (1.0 - slip) * intended + slip * intended.mean(axis=1, keepdims=True)
    terminal = jnp.array([c in "GP" for c in cells])
    P = jnp.where(terminal[:, None, None], jnp.eye(rows * cols)[:, None, :], P)  # absorbing
    reward = jnp.array([CELL_REWARD[c] for c in cells])
    R = jnp.where(terminal[:, None], 0.0, dot(P, reward))
    return TabularMDP(P, R, reward, terminal, cells.index("S"))


def q_values(P, R, gamma, horizon: int, policy=None):
    """Q_t(s, a), t = 0..H-1, of an H-step episode by backward induction, under `policy` ([S, A])
    or, if None, the optimal one: exact for the truncated problem the logged episodes come from."""
    def backward(v_next, _):
        q = R + gamma * dot(P, v_next)
        v = q.max(-1) if policy is None else (policy * q).sum(-1)
        return v, q
    _, q = jax.lax.scan(backward, jnp.zeros(P.shape[0]), None, length=horizon, reverse=True)
    return q  # [H, S, A]


def return_range(mdp: TabularMDP, gamma, horizon: int):
    """[lowest, highest] discounted return of an H-step episode from the start, over every action
    and every possible next cell: the exact range the betting bounds need."""
    possible = mdp.P > 0
    entering = jnp.where(mdp.terminal[:, None, None], 0.0, mdp.reward)  # [S, 1, S]
    def backward(v, _):  # v [2, S]: the lowest and highest return from each cell
        after = jnp.where(possible, entering + gamma * v[:, None, None, :], jnp.nan)
        return jnp.stack([jnp.nanmin(after[0], (1, 2)), jnp.nanmax(after[1], (1, 2))]), None
    v, _ = jax.lax.scan(backward, jnp.zeros((2, mdp.P.shape[0])), None, length=horizon)
    return v[:, mdp.start]


class Problem(NamedTuple):
    mdp: TabularMDP
    target: jax.Array  # [S, A] pi(a|s)
    behaviour: jax.Array  # [S, A] b(a|s)
    value: jax.Array  # exact V^pi(start) of the target
    behaviour_value: jax.Array  # exact V^b(start): what every estimator would return on-policy
    returns: jax.Array  # [2] the lowest and highest discounted return an episode can have


def gridworld_problem(args: Args) -> Problem:
    """The MDP, the two softmax policies of the optimal Q, their exact values, the return range."""
    return _gridworld_problem(args.slip, args.gamma, args.target_temperature,
                              args.behaviour_temperature, args.horizon or GRID_HORIZON)


@partial(jax.jit, static_argnums=4)
def _gridworld_problem(slip, gamma, target_temperature, behaviour_temperature, horizon: int):
    mdp = gridworld(slip)
    q_star = q_values(mdp.P, mdp.R, gamma, horizon)[0]
    target = jax.nn.softmax(q_star / target_temperature, axis=-1)
    behaviour = jax.nn.softmax(q_star / behaviour_temperature, axis=-1)
    def value(policy):
        return dot(policy[mdp.start], q_values(mdp.P, mdp.R, gamma, horizon, policy)[0, mdp.start])
    return Problem(mdp, target, behaviour, value(target), value(behaviour),
                   return_range(mdp, gamma, horizon))


class Episodes(NamedTuple):
    """Logged episodes as a struct of arrays padded to a horizon H. Steps where mask is False are
    padding and contribute nothing: ratio 1, reward 0. Each episode's mask is a prefix of ones."""

    obs: jax.Array  # [N, H, ...]
    actions: jax.Array  # [N, H]
    rewards: jax.Array  # [N, H]
    behaviour_log_prob: jax.Array  # [N, H] log b(a_t | s_t) of the logged action
    mask: jax.Array  # [N, H] bool: a real step, not padding


def collect(key, mdp: TabularMDP, behaviour, target, num_episodes: int, horizon: int):
    """`num_episodes` GridWorld episodes of the behaviour policy, and the target's log-probabilities
    of the logged actions (a vmapped scan; after the end the state stays put, mask False)."""
    log_b, log_pi = jnp.log(behaviour), jnp.log(target)
    cdf_b, cdf_P = jnp.cumsum(behaviour, -1), jnp.cumsum(mdp.P, -1)
    def draw(cdf, u):
        return jnp.minimum(jnp.sum(cdf < u), cdf.shape[0] - 1)
    def episode(key):
        def step(carry, u):
            s, alive = carry
            a = draw(cdf_b[s], u[0])
            s_next = draw(cdf_P[s, a], u[1])
            logged = (s, a, mdp.reward[s_next], log_b[s, a], alive, log_pi[s, a])
            return (jnp.where(alive, s_next, s), alive & ~mdp.terminal[s_next]), logged
        carry = (jnp.asarray(mdp.start), jnp.asarray(True))
        uniforms = jax.random.uniform(key, (horizon, 2))
        _, (*logged, log_pi_logged) = jax.lax.scan(step, carry, uniforms)
        return Episodes(*logged), log_pi_logged
    return jax.vmap(episode)(jax.random.split(key, num_episodes))


def fit_q_hat(episodes: Episodes, target, gamma, use):
    """Q-hat [H, S, A] of the target in the maximum-likelihood model (transition counts, mean
    rewards; unvisited state-actions: no successor, reward 0) of the episodes where `use` [N]."""
    s, a, m = episodes.obs, episodes.actions, (episodes.mask & use[:, None]).astype(jnp.float32)
    counts = jnp.zeros(target.shape).at[s, a]
    visits, reward_sum = counts.add(m), counts.add(m * episodes.rewards)
    moves = jnp.zeros((*target.shape, target.shape[0]))
    moves = moves.at[s[:, :-1], a[:, :-1], s[:, 1:]].add(m[:, :-1])
    P_hat = moves / jnp.maximum(moves.sum(-1, keepdims=True), 1.0)
    return q_values(P_hat, reward_sum / jnp.maximum(visits, 1.0), gamma, s.shape[1], target)


def fold_of(n: int, folds: int) -> np.ndarray:
    return np.arange(n) * folds // n  # contiguous blocks whose sizes differ by at most one


def cross_fit(episodes: Episodes, target, gamma, folds: int):
    """(Q-hats [folds, H, S, A], Q-hat and V-hat = E_pi Q-hat at every logged step, [N, H] each):
    every episode scored with the model fitted on the other folds (Kallus & Uehara 2020), since a
    model fitted on the very episodes it scores makes DR biased. folds = 1 fits on every episode."""
    fold = jnp.asarray(fold_of(episodes.mask.shape[0], folds))
    q = jax.vmap(lambda k: fit_q_hat(episodes, target, gamma, (fold != k) | (folds == 1)))(
        jnp.arange(folds))
    t, f = jnp.arange(q.shape[1]), fold[:, None]
    return q, q[f, t, episodes.obs, episodes.actions], (q * target).sum(-1)[f, t, episodes.obs]


# ---------------------------------------------------------------------------- --target-model
# A policy saved by algos/ppo.py --save-model: its actor MLP on flattened observations, laid out
# as ppo.py's (its parameters load as they are), and ppo.py's observation normalisation.
class TargetModel(NamedTuple):
    env_id: str
    actor: dict  # one seed's "actor" parameters of ppo.py's ActorCritic: Dense layers 0, 2 and 4
    obs_mean: np.ndarray
    obs_var: np.ndarray
    normalize_obs: bool
    max_steps: int  # the env's episode limit: the default horizon
    activation: str  # of the MLP's hidden layers


def load_target_model(args: Args) -> TargetModel:
    """Read --target-model (ppo.py's payload: args as JSON, params, obs_mean, obs_var, each with a
    leading seed axis) and keep seed --model-seed. ArgError if it cannot be evaluated here."""
    path, k = args.target_model, args.model_seed
    try:
        with open(path, "rb") as f:
            payload = flax.serialization.msgpack_restore(f.read())
        saved = json.loads(payload["args"])
        env_id, actor = saved["env_id"], payload["params"]["params"]["actor"]
        obs_mean, obs_var = np.asarray(payload["obs_mean"]), np.asarray(payload["obs_var"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArgError(f"--target-model: cannot read {path!r} as a model saved by ppo.py ({e!r})")
    import gymnax
    env, env_params = gymnax.make(env_id)
    network = saved.get("network", "mlp")  # (models saved before presets are MLPs)
    if network != "mlp" or not hasattr(env.action_space(env_params), "n"):  # n: Discrete's
        raise ArgError(f"--target-model: {path} holds a {network} policy of {env_id}; this file "
                       "rebuilds ppo.py's MLP policies of discrete actions only")
    if not 0 <= k < obs_mean.shape[0]:
        raise ArgError(f"--model-seed must be in [0, {obs_mean.shape[0]}) for {path} (got {k})")
    return TargetModel(env_id, jax.tree.map(lambda x: np.asarray(x)[k], actor), obs_mean[k],
                       obs_var[k], bool(saved["normalize_obs"]), env_params.max_steps_in_episode,
                       saved.get("activation", "tanh"))


def collect_gymnax(key, model: TargetModel, epsilon, num_episodes: int, horizon: int):
    """Episodes of b = (1 - epsilon) pi + epsilon uniform on the model's gymnax env (vmapped scan
    over steps, masked after the first termination or truncation), and log pi of logged actions."""
    import gymnax
    env, env_params = gymnax.make(model.env_id)
    num_actions, hidden = env.action_space(env_params).n, model.actor["layers_0"]["bias"].shape[-1]
    act = getattr(nn, model.activation)
    network = nn.Sequential([nn.Dense(hidden), act, nn.Dense(hidden), act, nn.Dense(num_actions)])
    def step(carry, key):
        obs, state, alive = carry
        key_action, key_env = jax.random.split(key)
        x = obs.reshape(-1) if not model.normalize_obs else jnp.clip(
            (obs.reshape(-1) - model.obs_mean) / jnp.sqrt(model.obs_var + 1e-8), -10.0, 10.0)
        log_pi = jax.nn.log_softmax(network.apply({"params": model.actor}, x))
        log_b = jnp.log((1.0 - epsilon) * jnp.exp(log_pi) + epsilon / num_actions)
        a = jax.random.categorical(key_action, log_b)
        next_obs, state, reward, terminated, truncated, _ = env.step(key_env, state, a, env_params)
        logged = (obs, a, reward.astype(jnp.float32), log_b[a], alive, log_pi[a])
        return (next_obs, state, alive & ~(terminated | truncated)), logged
    def episode(key):
        key_reset, key_steps = jax.random.split(key)
        carry = (*env.reset(key_reset, env_params), jnp.asarray(True))
        _, (*logged, log_pi) = jax.lax.scan(step, carry, jax.random.split(key_steps, horizon))
        return Episodes(*logged), log_pi
    return jax.vmap(episode)(jax.random.split(key, num_episodes))


# ============================================================================ 3. estimators
# This file's network section. `_episode_terms` is one episode, vmapped: log w_{0:t}, the running
# sum of log rho (padded steps: rho = 1, r = 0), and the values the weights multiply. Each step's
# weights are divided by their largest over episodes (the "shift") before they are exponentiated.
# `estimators` sums CHUNK episodes at a time, then rescales each block by exp(its shift - the
# largest); `episode_rows` keeps every episode's terms, for the bootstrap and the betting bounds.
CHUNK = 4096  # a block's arrays stay in cache, yet are big enough for XLA to split over 2 cores
ESTIMATORS = ("ois", "wis", "pdis", "wpdis", "dr", "wdr")
MEANS = ("ois", "pdis", "dr")  # averages of one term per episode; the others are ratios of sums
LOG_PROB_SLACK = 1e-6  # a log-probability may exceed 0 by float rounding (p = 1 + a few ulp)
BET_CAP = 0.5  # the betting bounds stake at most this fraction of the capital on one episode


class Sums(NamedTuple):
    """Sums over episodes of the shifted weights w~_{i,t} = w_{i,0:t} / exp(shift_t) times the terms
    of the estimators (from `episode_rows`, each episode's own term): `from_sums` of these."""

    shift: jax.Array  # [H] log of what step t's weights were divided by (-inf: all weights are 0)
    w: jax.Array  # [H] sum_i w~_{i,t}
    w_reward: jax.Array  # [H] sum_i w~_{i,t} r_{i,t}
    w_return: jax.Array  # [] sum_i w~_{i,H-1} G_i, with G_i = sum_t gamma^t r_{i,t}
    w_squared: jax.Array  # [H] sum_i w~_{i,t}^2
    w_residual: Optional[jax.Array]  # [H] sum_i w~_{i,t} (r_{i,t} - Q-hat_{i,t})  (DR, WDR only)
    w_value: Optional[jax.Array]  # [H] sum_i w~_{i,t-1} V-hat_{i,t}, step t-1's shift (DR, WDR)
    invalid: jax.Array  # [] invalid steps (`_episode_terms`): the estimates then mean nothing


def log_discounts(gamma, horizon: int, dtype=jnp.float32):
    """t log(gamma) for t = 0..H-1 (0 at t = 0, also for gamma = 0): gamma^t itself underflows
    float32 (gamma = 0.9 at t ~ 830) where the weights it multiplies may still be huge."""
    t = jnp.arange(horizon, dtype=dtype)
    return jnp.where(t > 0, t * jnp.log(jnp.asarray(gamma, dtype)), 0.0)


def _episode_terms(target_log_prob, behaviour_log_prob, rewards, mask, q_hat, v_hat, gamma):
    """One episode ([H] arrays): log w_{0:t} (-inf from the first logged action the target never
    takes), the masked rewards, r - Q-hat and V-hat, its discounted return, and its invalid steps
    (`check_episodes` names them; real ones after padding, a behaviour probability 0, ...)."""
    mask = mask.astype(bool)
    steps = jnp.arange(rewards.shape[0])
    log_rho = jnp.where(mask, target_log_prob - behaviour_log_prob, 0.0)
    never = log_rho == -jnp.inf
    first_never = jnp.min(jnp.where(never, steps, steps.shape[0]))
    log_w = jnp.where(steps >= first_never, -jnp.inf, jnp.cumsum(jnp.where(never, 0.0, log_rho)))
    r = jnp.where(mask, rewards, 0.0)
    ret = dot(jnp.exp(log_discounts(gamma, steps.shape[0], r.dtype)), r)
    unusable = (jnp.maximum(target_log_prob, behaviour_log_prob) > LOG_PROB_SLACK) | ~jnp.isfinite(
        rewards if q_hat is None else rewards + q_hat + v_hat)  # finite if every term is
    invalid = jnp.sum(~(log_rho < jnp.inf) | (mask & unusable)) + jnp.sum(mask[1:] & ~mask[:-1])
    if q_hat is None:
        return log_w, r, None, None, ret, invalid
    return log_w, r, jnp.where(mask, r - q_hat, 0.0), jnp.where(mask, v_hat, 0.0), ret, invalid


def _finite(shift):  # every weight is 0: nothing to divide by
    return jnp.where(shift > -jnp.inf, shift, 0.0)


def episode_rows(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None) -> Sums:
    """Pure and jittable: every episode's own term of every sum, as [N, ...] rows, and the shift
    [H], the per-step largest log-weight. `weighted_sums` of them: the data's or a resample's."""
    per_episode = jax.vmap(_episode_terms, in_axes=(0, 0, 0, 0, 0, 0, None))
    log_w, r, dr, v_hat, ret, invalid = per_episode(
        target_log_prob, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, q_hat, v_hat,
        gamma)
    shift = log_w.max(0)
    w = jnp.exp(log_w - _finite(shift))
    w_prev = jnp.concatenate([jnp.ones_like(w[:, :1]), w[:, :-1]], axis=1)
    return Sums(shift=shift, w=w, w_reward=w * r, w_return=w[:, -1] * ret, w_squared=w**2,
                w_residual=None if dr is None else w * dr, invalid=invalid,
                w_value=None if v_hat is None else w_prev * v_hat)


def weighted_sums(rows: Sums, counts=None) -> Sums:
    """The sums over episodes, each row counted `counts` times ([N]; None: once)."""
    total = (lambda x: x.sum(0)) if counts is None else (lambda x: dot(counts, x))
    return jax.tree.map(total, rows._replace(shift=None))._replace(shift=rows.shift)


def _times_exp(log_scale, x):
    """x * exp(log_scale) without inf * 0: a sum of shifted weights, scaled back."""
    return jnp.sign(x) * jnp.exp(log_scale + jnp.log(jnp.abs(x)))


def _ratio(x, y):
    """x / y, and 0 where every weight is 0 (y == 0): the weighted estimators' defined value."""
    return jnp.where(y > 0, x / jnp.where(y > 0, y, 1.0), 0.0)


def from_sums(s: Sums, n: int, gamma) -> dict:
    """Every estimate from the sums over n episodes; leading batch axes are kept."""
    log_discount = log_discounts(gamma, s.shift.shape[0], s.w.dtype)
    discount = jnp.exp(log_discount)
    out = {
        "ois": _times_exp(s.shift[-1], s.w_return) / n,
        "wis": _ratio(s.w_return, s.w[..., -1]),
        "pdis": _times_exp(s.shift + log_discount, s.w_reward).sum(-1) / n,
        "wpdis": (discount * _ratio(s.w_reward, s.w)).sum(-1),
    }
    if s.w_residual is not None:
        prev_shift = jnp.concatenate([jnp.zeros_like(s.shift[:1]), s.shift[:-1]])
        prev_w = jnp.concatenate([jnp.full_like(s.w[..., :1], n), s.w[..., :-1]], axis=-1)
        out["dr"] = (_times_exp(s.shift + log_discount, s.w_residual)
                     + _times_exp(prev_shift + log_discount, s.w_value)).sum(-1) / n
        out["wdr"] = (discount * (_ratio(s.w_residual, s.w) + _ratio(s.w_value, prev_w))).sum(-1)
    return out


def weight_stats(s: Sums, n: int) -> dict:
    """The effective sample size (sum w)^2 / sum w^2 of the trajectory weights and of each step's
    (`ess_step` [H]), the largest normalised trajectory weight (1 / sum_i w~: the largest w~ is 1)
    and the mean trajectory weight with its SE: expected 1, far from it means wrong b(a|s)."""
    mean = _times_exp(s.shift[-1], s.w[-1]) / n
    square = _times_exp(2.0 * s.shift[-1], s.w_squared[-1]) / n
    ess = _ratio(s.w**2, s.w_squared)
    return {"ess": ess[-1], "ess_step": ess, "max_weight": _ratio(1.0, s.w[-1]),
            "mean_weight": mean,
            "mean_weight_se": jnp.sqrt(jnp.maximum(square - mean**2, 0.0) / max(n - 1, 1))}


@jax.jit
def estimators(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None):
    """Pure and jittable: ({name: estimate} and the `weight_stats`, the number of invalid steps: the
    estimates mean nothing unless it is 0); DR and WDR when q_hat and v_hat ([N, H]) are given."""
    data = (episodes._replace(obs=None, actions=None), target_log_prob, q_hat, v_hat)
    n = episodes.rewards.shape[0]
    size = min(n, CHUNK)  # the last block is padded with copies of an episode, counted 0 times
    index = jnp.arange(n + -n % size).reshape(-1, size)
    def block(i):
        part = jax.tree.map(lambda x: x[jnp.minimum(i, n - 1)], data)
        rows = episode_rows(part[0], part[1], gamma, *part[2:])
        return weighted_sums(rows, (i < n).astype(rows.w.dtype))
    blocks = jax.lax.map(block, index)  # Sums [blocks, ...], each block with its own shift
    shift = blocks.shift.max(0)
    f = jnp.where(blocks.shift > -jnp.inf, jnp.exp(blocks.shift - shift), 0.0)
    f_prev = jnp.concatenate([jnp.ones_like(f[:, :1]), f[:, :-1]], 1)  # w~_{t-1}: t-1's shift
    scale = {"w": f, "w_reward": f, "w_return": f[:, -1], "w_squared": f**2, "w_residual": f,
             "w_value": f_prev}
    sums = Sums(shift=shift, invalid=blocks.invalid.sum(), **{
        k: None if getattr(blocks, k) is None else (getattr(blocks, k) * x).sum(0)
        for k, x in scale.items()})
    return from_sums(sums, n, gamma) | weight_stats(sums, n), sums.invalid


def resample_counts(key, n: int, batch: int, folds: int = 1):
    """[batch, n]: the draws of each episode in `batch` resamples, each drawing with replacement
    from every fold (`fold_of`) as many as it holds. A draw hashes a counter with two seeds from
    `key` (murmur3's finaliser, twice), modulo the fold's size: 4.7x faster than randint's."""
    fold = fold_of(n, folds)
    start, size = np.searchsorted(fold, fold), np.bincount(fold)[fold].astype(np.uint32)
    def mix(x):
        x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
        x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
        return x ^ (x >> 16)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    counter = jnp.arange(batch * n, dtype=jnp.uint32).reshape(batch, n)
    draws = start + mix(mix(counter ^ seed[0]) + seed[1]) % size
    return jnp.zeros((batch, n)).at[jnp.arange(batch)[:, None], draws].add(1.0)


def per_episode_estimates(rows: Sums, gamma) -> dict:
    """Every estimator on each episode alone ([N] each): the terms that OIS, PDIS and DR average."""
    alone = jax.vmap(lambda row: from_sums(row._replace(shift=rows.shift), 1, gamma))
    return alone(rows._replace(shift=None))


def bootstrap_intervals(key, rows: Sums, gamma, num_resamples: int = 1000, level: float = 0.95,
                        folds: int = 1, extra: Optional[dict] = None):
    """Pure and jittable: (estimates, bootstrap-t intervals, t-intervals), {name: ...} each, of
    every estimator and of the mean of each `extra` {name: [N] terms}, from `episode_rows`. The
    t-interval is estimate -+ t_{n-1} SE, SE^2 = sum_i c_i psi_i^2 / (n (n - 1)), c_i = 1, with
    psi_i = n d estimate / d c_i the influence of episode i counted c_i times (the delta method's:
    each estimate is a function of sums over episodes, of degree 0 in c). The studentized
    bootstrap-t (Efron & Tibshirani 1993, 12.5) takes the (B + 1) q order statistics of T* =
    (estimate* - estimate) / SE* instead, over `num_resamples` resamples (c: `resample_counts`),
    each with its own SE: it follows skewed weights, with no jackknife acceleration (BCa's, set by
    one or two episodes at the terms' kurtosis of 1e3 to 1e5). Both are approximate: their coverage
    nears `level` as n grows."""
    n, dtype, batch = rows.w.shape[0], rows.w.dtype, min(num_resamples, 100)
    rows = rows._replace(w_squared=None)  # the estimates do not need it
    terms = {k: x for k, x in per_episode_estimates(rows, gamma).items() if k in MEANS}
    terms |= extra or {}

    def estimates(counts):  # of the episodes counted `counts` times: of degree 0 in the counts
        total = counts.sum()
        ratios = from_sums(weighted_sums(rows, counts), total, gamma)
        return {k: v for k, v in ratios.items() if k not in terms} | {
            k: dot(counts, x) / total for k, x in terms.items()}

    def statistics(counts):  # the estimates and their SEs, psi_i = n d estimate / d counts_i
        est = estimates(counts)
        grads = {k: jax.grad(lambda c, k=k: estimates(c)[k])(counts) for k in est}
        return est, {k: jnp.sqrt(n * dot(counts, g**2) / max(n - 1, 1)) for k, g in grads.items()}

    est, se = statistics(jnp.ones(n, dtype))
    def resample_batch(key):
        return jax.vmap(statistics)(resample_counts(key, n, batch, folds).astype(dtype))
    boot, boot_se = jax.lax.map(resample_batch, jax.random.split(key, -(-num_resamples // batch)))
    tail, b = (1.0 - level) / 2.0, num_resamples
    order = jnp.array([min(math.ceil((b + 1) * (1 - tail)), b), max(math.floor((b + 1) * tail), 1)])
    t_quantile = float(scipy.stats.t.ppf(1.0 - tail, max(n - 1, 1)))
    bootstrap_t, t_interval = {}, {}
    for k in est:  # T*'s upper and lower quantiles give the lower and upper ends
        diff = (boot[k] - est[k]).reshape(-1)[:b]
        t = jnp.sort(jnp.where(diff == 0, 0.0, diff / boot_se[k].reshape(-1)[:b]))[order - 1]
        bootstrap_t[k] = est[k] - jnp.where(se[k] > 0, t * se[k], 0.0)
        t_interval[k] = est[k] + jnp.array([-t_quantile, t_quantile]) * se[k]
    return est, bootstrap_t, t_interval


def _betting_lower_bound(log_x, delta, iterations: int = 30):
    """A lower bound on E X, X >= 0 (N draws, as log X_i in order), holding with probability
    >= 1 - delta for every N (Waudby-Smith & Ramdas 2024; Karampatziakis, Mineiro & Ramdas 2021).
    Staking l_i(m) of one's capital on X_i > m turns 1 into K(m) = prod_i (1 + l_i(m) (X_i - m)), a
    non-negative martingale if E X = m: P(K(m) >= 1 / delta) <= delta (Ville). l_i(m) = min(sqrt(2
    log(1 / delta) / (N s^2)), BET_CAP / m), s^2 the draws' variance before i: K falls as m grows,
    and bisection finds log K(m) = log(1 / delta), rounded down."""
    n, x, threshold = log_x.shape[0], jnp.exp(log_x), jnp.log(1.0 / delta)
    seen = jnp.arange(2, n + 2, dtype=x.dtype)  # after a first draw of mean 1/2, variance 1/4
    var = (0.25 + jnp.cumsum((x - (0.5 + jnp.cumsum(x)) / seen) ** 2)) / seen
    var = jnp.concatenate([jnp.full((1,), 0.25, x.dtype), var[:-1]])
    bet = jnp.nan_to_num(jnp.sqrt(2.0 * threshold / (n * var)), nan=0.0)  # X = inf: bet nothing
    def halve(_, bracket):  # log K(low) >= threshold > log K(high)
        m = bracket.mean()
        stake = jnp.minimum(bet, BET_CAP / m)
        capital = jnp.sum(jnp.logaddexp(jnp.log1p(-stake * m), jnp.log(stake) + log_x))
        return jnp.where(capital >= threshold, bracket.at[0].set(m), bracket.at[1].set(m))
    return jax.lax.fori_loop(0, iterations, halve, jnp.array([0.0, 1.0], x.dtype))[0]


def betting_bounds(rows: Sums, low, high, delta):
    """Pure and jittable, from `episode_rows`: (a lower bound on V^pi, an interval), each holding
    with probability >= 1 - delta for every n if every return G lies in [low, high] and b(a|s) > 0
    wherever pi(a|s) > 0: W (G - low) and W (high - G) are >= 0 with means V^pi - low and high -
    V^pi; the bound is the first's at delta, the interval both at delta / 2. No weight truncated."""
    span, w = high - low, rows.w[:, -1]
    def bound(x, delta):  # x = W (G - low) or W (high - G), shifted
        log_x = _finite(rows.shift[-1]) + jnp.log(jnp.maximum(x, 0.0) / span)
        return span * _betting_lower_bound(log_x, delta)
    x, y = rows.w_return - low * w, high * w - rows.w_return
    return low + bound(x, delta), jnp.stack([low + bound(x, delta / 2), high - bound(y, delta / 2)])


def assess(key, rows: Sums, gamma, num_resamples: int, delta, returns=None, folds: int = 1,
           extra: Optional[dict] = None) -> dict:
    """Pure and jittable, from `episode_rows`: {"estimate/" name: the estimate, "stats/" name: the
    `weight_stats`, "bootstrap_t/", "t/" name: [low, high]} of every estimator and `extra` mean,
    and with `returns` = (low, high) the betting bounds, "betting/lower" and "betting/interval"."""
    n, sums = rows.w.shape[0], weighted_sums(rows)
    parts = bootstrap_intervals(key, rows, gamma, num_resamples, folds=folds, extra=extra)
    out = {f"{kind}/{k}": v for kind, d in zip(("estimate", "bootstrap_t", "t"), parts)
           for k, v in d.items()} | {f"stats/{k}": v for k, v in weight_stats(sums, n).items()}
    if returns is not None:
        out["betting/lower"], out["betting/interval"] = betting_bounds(rows, *returns, delta)
    return out


def check_episodes(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None, *,
                   values: bool = False):
    """ValueError for input the estimators cannot take: shapes, gamma, Q-hat without V-hat; with
    `values` (on the host) a mask not a prefix of ones and, at real steps, a non-finite reward,
    obs, Q-hat or V-hat, a log-probability NaN or above 0, a behaviour log-probability of -inf."""
    shape = tuple(np.shape(episodes.rewards))
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError("rewards must be [N, H] with N >= 1 episodes and H >= 1 steps "
                         f"(got shape {shape})")
    arrays = dict(episodes._asdict(), target_log_prob=target_log_prob, q_hat=q_hat, v_hat=v_hat)
    for name, x in arrays.items():
        if x is not None and (np.shape(x)[:2] != shape or (name != "obs" and np.ndim(x) != 2)):
            raise ValueError(f"{name} has shape {np.shape(x)} but rewards has {shape}; every array "
                             "must be [N, H] (obs [N, H, ...])")
    if (q_hat is None) != (v_hat is None):
        raise ValueError("give both q_hat and v_hat (for DR and WDR) or neither")
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] (got {gamma})")
    if not values:
        return
    mask = np.asarray(episodes.mask).astype(bool)
    for i, t in np.argwhere(mask[:, 1:] & ~mask[:, :-1])[:1]:
        raise ValueError(f"episode {i}: mask is False at step {t} but True at step {t + 1}; an "
                         "episode's real steps come first, its padding after (a prefix of ones)")
    for name, x in arrays.items():  # at the real steps: padding may hold anything
        if x is None or name in ("actions", "mask"):
            continue
        x = np.asarray(x, np.float64).reshape(*shape, -1)
        bad, rule = ~np.isfinite(x), "every real step's value must be finite"
        if name.endswith("log_prob"):  # -inf: probability 0, which no logged action has under b
            bad = np.isnan(x) | (x > LOG_PROB_SLACK) | ((x == -np.inf) & name.startswith("b"))
            rule = ("a log-probability is at most 0 (a probability at most 1), and the behaviour "
                    "policy's of a logged action above -inf (its importance ratio is undefined)")
        for i, t in np.argwhere(mask & bad.any(-1))[:1]:
            raise ValueError(f"episode {i}, step {t}: {name} is {x[i, t][bad[i, t]][0]}; {rule}")


def estimate(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None) -> dict:
    """Every estimator on your data in one jitted call: 'ois', 'wis', 'pdis', 'wpdis', with q_hat
    (Q-hat at the logged actions) and v_hat (V-hat at the logged states) 'dr' and 'wdr', and the
    `weight_stats`. ValueError for any input `check_episodes` rejects, naming episode and step."""
    check_episodes(episodes, target_log_prob, gamma, q_hat, v_hat)
    used = episodes._replace(obs=None, actions=None)  # not needed: not sent to the device
    out, invalid = estimators(used, target_log_prob, gamma, q_hat, v_hat)
    if int(invalid):
        check_episodes(episodes, target_log_prob, gamma, q_hat, v_hat, values=True)
    return out


# ============================================================================ 4. the experiment
# The experiment's programs are many small kernels: LLVM at -O1 compiles them faster than XLA's
# default, as fast a program (seen on the sweep, not timed in RESULTS.md); `estimate` keeps XLA's.
FAST_COMPILE = {"xla_backend_optimization_level": 1}


def make_gridworld_trial(args: Args):
    """trial(key) -> (Q-hats [folds, H, S, A], metrics), pure and jittable: a GridWorld dataset of
    max(dataset_sizes) episodes drawn from `key`, whose first n for each n give `assess`'s metrics
    [len(dataset_sizes), ...] of every estimator (DR, WDR cross-fitted) and of "oracle_dr", DR with
    the exact Q^pi: with no Q-hat error, what is left of a miss is the interval's."""
    sizes, horizon = tuple(args.dataset_sizes), args.horizon or GRID_HORIZON
    def trial(key):
        problem = gridworld_problem(args)
        q_exact = q_values(problem.mdp.P, problem.mdp.R, args.gamma, horizon, problem.target)
        v_exact, steps = (q_exact * problem.target).sum(-1), jnp.arange(horizon)
        key_data, key_boot = jax.random.split(key)
        episodes, target_log_prob = collect(key_data, problem.mdp, problem.behaviour,
                                            problem.target, max(sizes), horizon)
        results = []
        for n in sizes:
            data, log_prob = jax.tree.map(lambda x: x[:n], (episodes, target_log_prob))
            q_tables, q_hat, v_hat = cross_fit(data, problem.target, args.gamma, args.folds)
            exact = episode_rows(data, log_prob, args.gamma, q_exact[steps, data.obs, data.actions],
                                 v_exact[steps, data.obs])
            oracle = {"oracle_dr": per_episode_estimates(exact, args.gamma)["dr"]}
            rows = episode_rows(data, log_prob, args.gamma, q_hat, v_hat)
            results.append(assess(jax.random.fold_in(key_boot, n), rows, args.gamma,
                                  args.num_bootstrap, args.delta, problem.returns, args.folds,
                                  oracle))
        metrics = {k: jnp.stack([r[k] for r in results]) for k in results[0]}
        jax.debug.callback(PROGRESS, metrics["estimate/wis"][-1])
        return q_tables, metrics
    return trial


# ============================================================================ 5. dataset sweep
CACHE_HITS = []  # of the persistent cache: counted around a compile, to say where it came from
jax.monitoring.register_event_listener(lambda e, **_: e.endswith("hits") and CACHE_HITS.append(e))


def run(args: Args, num_devices: Optional[int] = None):
    """All args.num_datasets datasets: pmap over the most local devices (at most num_devices) that
    divide them, one dataset after another on each (vmapped 10 at a time: 50% slower, out of cache).
    Dataset k: k-th split of PRNGKey(args.seed). Returns (Q-hats, metrics, timing)."""
    num, limit = args.num_datasets, num_devices or jax.local_device_count()
    devices = jax.local_devices()[: max(d for d in range(1, limit + 1) if num % d == 0)]
    per_device = num // len(devices)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), (len(devices), per_device))
    sweep = jax.pmap(partial(jax.lax.map, make_gridworld_trial(args)), devices=devices)
    t0 = time.perf_counter()
    lowered = sweep.lower(keys)
    hits = len(CACHE_HITS)  # a hit from here on is the sweep's
    compiled = lowered.compile(compiler_options=FAST_COMPILE)
    compile_s, cached = time.perf_counter() - t0, len(CACHE_HITS) > hits
    PROGRESS.start(args)
    state, metrics = jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - PROGRESS.t_start
    state, metrics = jax.tree.map(lambda x: x.reshape(num, *x.shape[2:]), (state, metrics))
    timing = {"compile_s": compile_s, "run_s": run_s, "devices": len(devices), "cached": cached}
    return state, metrics, timing | {"episodes_per_s": num * max(args.dataset_sizes) / run_s}


def sweep_stats(metrics, value) -> dict:
    """Across datasets, at every n: each estimator's bias, variance, MSE and how often its
    bootstrap-t and t intervals cover V^pi; the betting bound's mean and how often it holds, the
    betting interval's coverage and mean width."""
    m = {k: np.asarray(v, np.float64) for k, v in metrics.items()}  # [datasets, sizes, ...]
    covers = lambda ci: ((ci[..., 0] <= value) & (value <= ci[..., 1])).mean(0)
    stats = {}
    for name in (*ESTIMATORS, "oracle_dr"):
        err, ci = m[f"estimate/{name}"] - value, (m[f"bootstrap_t/{name}"], m[f"t/{name}"])
        stats[name] = {"bias": err.mean(0), "variance": err.var(0), "mse": (err**2).mean(0),
                       "coverage": covers(ci[0]), "t_coverage": covers(ci[1])}
    lower, interval = m["betting/lower"], m["betting/interval"]
    stats["betting"] = {"lower": lower.mean(0), "holds": (lower <= value).mean(0), "coverage":
                        covers(interval), "width": (interval[..., 1] - interval[..., 0]).mean(0)}
    return stats


# ============================================================================ 6. logging and output
class Progress:
    """Host side of the in-jit progress callback, once per finished dataset: a line every 10% of the
    sweep (silent until `start`, e.g. when a trial is called directly)."""
    args, lock = None, threading.Lock()  # callbacks arrive on one thread per device

    def start(self, args: Args):
        self.args, self.wis, self.t_start = args, [], time.perf_counter()

    def __call__(self, wis):
        if self.args is None:
            return
        with self.lock:  # append, count and print as one: no line printed twice, none skipped
            self.wis.append(float(wis))
            done, total, n = len(self.wis), self.args.num_datasets, max(self.args.dataset_sizes)
            if done * 10 // total > (done - 1) * 10 // total:
                rate = done * n / max(time.perf_counter() - self.t_start, 1e-9)
                print(f"[{self.args.exp_name}] datasets {done:>5} / {total}  WIS at n = {n}: "
                      f"{np.mean(self.wis):.4f} (mean)  {rate:,.0f} episodes/s", flush=True)


PROGRESS = Progress()


def run_dir_for(args: Args, env_id: str) -> str:
    return os.path.join(args.log_dir, f"{env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")


def markdown_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def report(m: dict, n: int, args: Args, value=None) -> str:
    """From `assess`'s metrics: the table (estimator | estimate | 95% bootstrap-t and t intervals |
    error against `value`, when known), the weight diagnostics, a warning when they say the
    estimates cannot be trusted, and the betting bounds if there are any."""
    m = {k: np.asarray(v, np.float64) for k, v in m.items()}
    rows = [[name.upper(), f"{m[f'estimate/{name}']:.4f}"]
            + ["[{:.4f}, {:.4f}]".format(*m[f"{kind}/{name}"]) for kind in ("bootstrap_t", "t")]
            + ([] if value is None else [f"{m[f'estimate/{name}'] - value:+.4f}"])
            for name in (*ESTIMATORS, "oracle_dr") if f"t/{name}" in m]
    headers = ["estimator", "estimate", "95% CI (bootstrap-t)", "95% CI (t)"]
    headers += ["error"] * (value is not None)
    ess, mean, se, steps = (m[f"stats/{k}"] for k in ("ess", "mean_weight", "mean_weight_se",
                                                      "ess_step"))
    at = np.unique(np.linspace(0, len(steps) - 1, 5).astype(int))
    warn = []
    if ess < 0.01 * n:
        warn.append(f"ESS/N = {ess / n:.2%} < 1%: a handful of episodes make every estimate")
    if abs(mean - 1) > max(3 * se, 1e-4):  # 1e-4: float32 rounding, when every weight is 1
        warn.append(f"the mean weight {mean:.3f} is more than 3 standard errors from 1: are the "
                    "behaviour probabilities right?")
    return "\n".join([
        markdown_table(headers, rows),
        f"weights: ESS {ess:.1f} of {n} episodes; per-step ESS (PDIS, WPDIS, DR, WDR) at t = "
        f"{', '.join(map(str, at))}: {', '.join(f'{steps[t]:.1f}' for t in at)}; largest "
        f"normalised weight {m['stats/max_weight']:.3g}; mean weight {mean:.3f} +- {se:.3f} "
        "(expectation 1)",
        *["warning: " + "; ".join(warn)] * bool(warn),
        "no betting bounds on V^pi: they need --return-range LOW HIGH" if "betting/lower" not in m
        else f"betting (valid for every n): V^pi >= {m['betting/lower']:.4f} with probability >= "
        f"{1 - args.delta:g}; V^pi in [{m['betting/interval'][0]:.4f}, "
        f"{m['betting/interval'][1]:.4f}] with probability >= {1 - args.delta:g}"])


def sweep_table(stats: dict, sizes) -> str:
    """Two markdown tables: every estimator at every n, and the betting bounds at every n."""
    rows = [[name.upper(), n, f"{s['bias'][j]:+.4f}", f"{np.sqrt(s['variance'][j]):.4f}",
             f"{s['mse'][j]:.3g}", f"{s['coverage'][j]:.3f}", f"{s['t_coverage'][j]:.3f}"]
            for name, s in stats.items() if name != "betting" for j, n in enumerate(sizes)]
    bet = stats["betting"]
    betting = [[n, f"{bet['lower'][j]:.4f}", f"{bet['holds'][j]:.3f}", f"{bet['coverage'][j]:.3f}",
                f"{bet['width'][j]:.4f}"] for j, n in enumerate(sizes)]
    return "\n\n".join([
        markdown_table(["estimator", "n", "bias", "std", "MSE", "bootstrap-t coverage",
                        "t coverage"], rows),
        markdown_table(["n", "betting lower bound (mean)", "it holds", "betting interval coverage",
                        "its mean width"], betting)])


def write_tensorboard(run_dir, args: Args, tables: dict, scalars=()):
    """Tables (and the hyper-parameters) as text, scalars as (tag, value, step): the tensorboard
    package alone writes them (no torch, no tensorflow)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    writer = EventFileWriter(run_dir)
    hyper = markdown_table(["param", "value"], dataclasses.asdict(args).items())
    for tag, table in {"hyperparameters": hyper, **tables}.items():
        writer.add_event(Event(wall_time=time.time(), step=0, summary=text_pb(tag, table)))
    for tag, value, step in scalars:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))
    writer.close()


def load_dataset(args: Args):
    """(Episodes, target_log_prob, q_hat, v_hat, note) from --dataset; ArgError naming the flag."""
    try:
        with np.load(args.dataset) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as e:
        raise ArgError(f"--dataset: cannot read {args.dataset!r} as .npz ({e})")
    missing = [k for k in (*Episodes._fields, "target_log_prob") if k not in arrays]
    if missing:
        raise ArgError(f"--dataset: {args.dataset} lacks the array(s) {', '.join(missing)}")
    episodes = Episodes(*(arrays[k] for k in Episodes._fields))
    data = (episodes, arrays["target_log_prob"], arrays.get("q_hat"), arrays.get("v_hat"))
    note = "" if data[3] is None else ("\nnote: DR and WDR are unbiased only if v_hat(s) = sum_a "
                                       "pi(a|s) q_hat(s, a): that is the user's responsibility")
    try:
        check_episodes(*data[:2], args.gamma, *data[2:], values=True)
    except ValueError as e:
        raise ArgError(f"--dataset: {e}")
    return (*data, note)


# ============================================================================ 7. main
def main_gridworld(args: Args):
    problem = gridworld_problem(args)
    value, (low, high) = float(problem.value), map(float, problem.returns)
    print(f"GridWorld {len(GRID)}x{len(GRID[0])}, slip {args.slip}, gamma {args.gamma}, "
          f"H = {args.horizon or GRID_HORIZON}: exact V^pi = {value:.4f} (behaviour policy: "
          f"{float(problem.behaviour_value):.4f}); every return in [{low:.4f}, {high:.4f}]")
    t0 = time.perf_counter()  # the table: one dataset of --num-episodes
    one = dataclasses.replace(args, dataset_sizes=(args.num_episodes,), num_datasets=1)
    trial = jax.jit(make_gridworld_trial(one), compiler_options=FAST_COMPILE)
    m = jax.device_get(trial(jax.random.PRNGKey(args.seed))[1])
    table = report({k: v[0] for k, v in m.items()}, args.num_episodes, args, value)
    print(f"\n{args.num_episodes} episodes of the behaviour policy "
          f"({time.perf_counter() - t0:.1f} s, compile included):\n{table}\n")
    sizes = tuple(args.dataset_sizes)  # the sweep
    _, metrics, timing = run(args)
    stats = sweep_stats(jax.device_get(metrics), value)
    sweep = sweep_table(stats, sizes)
    print(f"\n{args.num_datasets} datasets for each n in {sizes}:\n{sweep}")
    print(f"{timing['devices']} device(s)  compile {timing['compile_s']:.1f} s"
          f"{' (cache)' if timing['cached'] else ''}  run {timing['run_s']:.1f} s  |  "
          f"{timing['episodes_per_s']:,.0f} logged episodes/s")
    if args.track:
        run_dir = run_dir_for(args, "GridWorld")
        scalars = [(f"ope/{name}/{stat}", v[j], n) for name, s in stats.items()
                   for stat, v in s.items() for j, n in enumerate(sizes)]
        tables = {"results/estimates": table, "results/sweep": sweep}
        write_tensorboard(run_dir, args, tables, scalars)
        print(f"tensorboard (ope/<estimator>/mse etc. against n) in {run_dir}")


def main_dataset(args: Args, data):
    episodes, target_log_prob, q_hat, v_hat, note = data
    t0, n, horizon = time.perf_counter(), *episodes.rewards.shape
    rows = jax.jit(episode_rows)(episodes, target_log_prob, args.gamma, q_hat, v_hat)
    evaluate = jax.jit(partial(assess, num_resamples=args.num_bootstrap, delta=args.delta,
                               returns=args.return_range), compiler_options=FAST_COMPILE)
    table = report(jax.device_get(evaluate(jax.random.PRNGKey(args.seed), rows, args.gamma)), n,
                   args)
    print(f"{args.dataset}: {n} episodes, H = {horizon}, gamma {args.gamma} "
          f"({time.perf_counter() - t0:.1f} s, compile included):\n{table}{note}")
    if args.track:
        name = os.path.splitext(os.path.basename(args.dataset))[0]
        write_tensorboard(run_dir_for(args, name), args, {"results/estimates": table})


def main_target_model(args: Args, model: TargetModel):
    t0, horizon = time.perf_counter(), args.horizon or model.max_steps
    discount = jnp.exp(log_discounts(args.gamma, horizon))

    def on_policy_return(key):  # of one episode of pi: the Monte Carlo ground truth, 5000 at once
        episodes, _ = collect_gymnax(key, model, 0.0, 1, horizon)
        return dot(episodes.rewards[0] * episodes.mask[0], discount)

    @partial(jax.jit, compiler_options=FAST_COMPILE)
    def evaluate(key):  # every estimator but DR/WDR (no Q-hat), and the ground truth
        key_data, key_boot, key_mc = jax.random.split(key, 3)
        episodes, log_pi = collect_gymnax(key_data, model, args.epsilon, args.num_episodes, horizon)
        rows = episode_rows(episodes, log_pi, args.gamma)
        mc_keys = jax.random.split(key_mc, args.num_mc_episodes)
        return (assess(key_boot, rows, args.gamma, args.num_bootstrap, args.delta,
                       args.return_range), jax.lax.map(on_policy_return, mc_keys, batch_size=5000))
    m, returns = jax.device_get(evaluate(jax.random.PRNGKey(args.seed)))
    mc, half = float(returns.mean()), 1.96 * float(returns.std(ddof=1)) / np.sqrt(len(returns))
    table = report(m, args.num_episodes, args, mc)
    print(f"{args.target_model} (seed {args.model_seed}) on {model.env_id}, gamma {args.gamma}, "
          f"H = {horizon}\nground truth: {args.num_mc_episodes} on-policy episodes, V^pi = "
          f"{mc:.4f} (95% CI [{mc - half:.4f}, {mc + half:.4f}])\n{args.num_episodes} episodes of "
          f"(1 - {args.epsilon}) pi + {args.epsilon} uniform ({time.perf_counter() - t0:.1f} s, "
          f"compile included); error against the Monte Carlo value:\n{table}")
    if args.track:
        write_tensorboard(run_dir_for(args, model.env_id), args, {"results/estimates": table})


def main():
    try:
        args = validate(tyro.cli(Args, description=__doc__.split("\n\n")[0]))
        data = load_dataset(args) if args.dataset else None
        model = load_target_model(args) if args.target_model else None
    except ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    compilation_cache.set_cache_dir(args.compile_cache_dir or None)
    compilation_cache.reset_cache()
    if data is not None:
        main_dataset(args, data)
    elif model is not None:
        main_target_model(args, model)
    else:
        main_gridworld(args)


if __name__ == "__main__":
    main()
