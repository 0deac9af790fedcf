"""Off-policy evaluation by importance sampling: OIS, WIS, PDIS, WPDIS, DR and WDR in one jitted
call, with BCa intervals, a high-confidence lower bound and weight diagnostics.

Estimate V^pi = E_pi[sum_t gamma^t r_t] of a target policy pi from episodes of a behaviour policy b,
reweighting every logged step by rho_t = pi(a_t|s_t) / b(a_t|s_t): ordinary and weighted importance
sampling (OIS, WIS), per-decision IS (PDIS, Precup, Sutton & Singh 2000) and its weighted form
(WPDIS), doubly robust (DR, Jiang & Li 2016) and weighted DR (WDR, Thomas & Brunskill 2016). Each
gets a BCa bootstrap 95% interval (Efron 1987); the weights get diagnostics (effective sample sizes,
largest normalised weight, mean weight); V^pi gets a lower bound holding with probability
>= 1 - delta (HCOPE: Thomas, Theocharous & Ghavamzadeh 2015). Episodes are [N, H] arrays padded
with a mask (`Episodes`), all of it vectorised over episodes; ratio products are sums of logs and
each step's weights are divided by their largest before exponentiating: no overflow, no NaN.

The default experiment is the 4x4 GridWorld below: the exact V^pi by backward induction, every
estimator on 1000 episodes of a more exploratory behaviour policy, then 500 datasets for each
n = 10 ... 10000 (vmapped, pmapped): bias, variance, MSE, interval coverage. DR and WDR use the
Q-hat of the model fitted on the data, cross-fitted (Kallus & Uehara 2020) over --folds folds.

Run it:
    python algos/is_eval.py --help
    python algos/is_eval.py                                      # GridWorld table + sweep
    python algos/is_eval.py --dataset episodes.npz --gamma 0.99 --return-range 0 1
    python algos/is_eval.py --target-model runs/<run>/model.msgpack --horizon 100

Expect (default, 59 s on 2 CPU cores): exact V^pi = 0.2472; OIS and PDIS unbiased with MSE
falling as 1/n, DR and WDR the smallest MSE; BCa coverage 0.88-0.94 at n >= 100, short of 95%
(heavy weights; Q-hat not refitted per resample); the bound always holds, 0.27 below V^pi at 10^4.
"""

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
    """independent datasets per size n in the sweep (this file's --num-seeds: vmap on each device,
    pmap over the devices, on CPU cores)"""
    track: bool = True
    """write tensorboard event files (scalars and result tables) and the MSE plot under --log-dir"""
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
    """bootstrap resamples for the table's confidence intervals"""
    sweep_bootstrap: int = 200
    """bootstrap resamples per dataset in the sweep (for the intervals' coverage)"""
    delta: float = 0.05
    """the lower bound on V^pi holds with probability >= 1 - delta"""
    return_range: Optional[tuple[float, float]] = None
    """LOW HIGH: every episode's discounted return lies in [LOW, HIGH]; the lower bound needs it
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
    rewards, behaviour_log_prob, mask, target_log_prob; for DR and WDR q_hat and v_hat at the logged
    steps, or q_hat of every action and target_prob pi(a|s_t) ([N, H, A] both)"""
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
    """Check every flag before anything is compiled (--dataset and --target-model are checked when
    they are loaded, also before compiling)."""
    rules = [  # (fields, rule, holds for a value)
        (("gamma", "slip", "epsilon"), "must be in [0, 1]", lambda v: 0 <= v <= 1),
        (("num_episodes", "num_datasets", "horizon", "num_mc_episodes"), "must be >= 1",
         lambda v: v is None or v >= 1),
        (("dataset_sizes",), "must be one or more sizes n >= 1", lambda v: min(v, default=0) >= 1),
        (("num_bootstrap", "sweep_bootstrap"), "must be >= 2 resamples", lambda v: v >= 2),
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
    and every possible next cell: the exact range the lower bound needs."""
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
    """`num_episodes` GridWorld episodes of the behaviour policy (a vmapped scan over steps), and
    the target's log-probabilities of the logged actions. After the end the state stays put, mask
    False. Actions and next states are drawn by inverting cumulative probabilities."""
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
        _, (obs, actions, rewards, blp, mask, tlp) = jax.lax.scan(step, carry, uniforms)
        return Episodes(obs, actions, rewards, blp, mask), tlp
    return jax.vmap(episode)(jax.random.split(key, num_episodes))


def fit_q_hat(episodes: Episodes, target, gamma, use):
    """Q-hat [H, S, A] of the target policy in the maximum-likelihood model (transition counts, mean
    rewards) fitted on the episodes where `use` ([N] bool) is True. Unvisited state-actions get no
    successor and zero reward."""
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
# A policy saved by algos/ppo.py --save-model on its gymnax env: its actor MLP, laid out as ppo.py's
# (so that the saved parameters load as they are), and ppo.py's observation normalisation. Only a
# discrete policy's logits are needed: neither the critic nor log_std is loaded.
class TargetModel(NamedTuple):
    env_id: str
    actor: dict  # one seed's "actor" parameters of ppo.py's ActorCritic: Dense layers 0, 2 and 4
    obs_mean: np.ndarray
    obs_var: np.ndarray
    normalize_obs: bool
    max_steps: int  # the env's episode limit: the default horizon


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
    from gymnax.environments import spaces
    env, env_params = gymnax.make(env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        raise ArgError(f"--target-model: {env_id} has continuous actions; importance ratios here "
                       "need a discrete action space")
    if not 0 <= k < obs_mean.shape[0]:
        raise ArgError(f"--model-seed must be in [0, {obs_mean.shape[0]}) for {path} (got {k})")
    return TargetModel(env_id, jax.tree.map(lambda x: np.asarray(x)[k], actor), obs_mean[k],
                       obs_var[k], bool(saved["normalize_obs"]), env_params.max_steps_in_episode)


def collect_gymnax(key, model: TargetModel, epsilon, num_episodes: int, horizon: int):
    """Episodes of b = (1 - epsilon) pi + epsilon uniform on the model's gymnax env (vmapped scan
    over steps, masked after the first termination or truncation), and log pi of logged actions."""
    import gymnax
    env, env_params = gymnax.make(model.env_id)
    num_actions, hidden = env.action_space(env_params).n, model.actor["layers_0"]["bias"].shape[-1]
    network = nn.Sequential([nn.Dense(hidden), nn.tanh, nn.Dense(hidden), nn.tanh,
                             nn.Dense(num_actions)])
    def step(carry, key):
        obs, state, alive = carry
        key_action, key_env = jax.random.split(key)
        x = obs if not model.normalize_obs else jnp.clip(
            (obs - model.obs_mean) / jnp.sqrt(model.obs_var + 1e-8), -10.0, 10.0)
        log_pi = jax.nn.log_softmax(network.apply({"params": model.actor}, x))
        log_b = jnp.log((1.0 - epsilon) * jnp.exp(log_pi) + epsilon / num_actions)
        a = jax.random.categorical(key_action, log_b)
        next_obs, state, reward, terminated, truncated, _ = env.step(key_env, state, a, env_params)
        logged = (obs, a, reward.astype(jnp.float32), log_b[a], alive, log_pi[a])
        return (next_obs, state, alive & ~(terminated | truncated)), logged
    def episode(key):
        key_reset, key_steps = jax.random.split(key)
        carry = (*env.reset(key_reset, env_params), jnp.asarray(True))
        _, (*logged, tlp) = jax.lax.scan(step, carry, jax.random.split(key_steps, horizon))
        return Episodes(*logged), tlp
    return jax.vmap(episode)(jax.random.split(key, num_episodes))


# ============================================================================ 3. estimators
# This file's network section. `_episode_terms` is one episode, vmapped: log w_{0:t}, the running
# sum of log rho (padded steps have rho = 1 and r = 0), and the values the weights multiply. At
# every step the weights are divided by their largest over episodes (the "shift") before they are
# exponentiated; the mask multiplies the per-step terms after the exponential. `estimators` sums
# CHUNK episodes at a time and merges blocks like an online softmax (both rescaled by exp(shift -
# the larger shift)); `episode_rows` keeps every episode's terms, for the bootstrap and the bound.
CHUNK = 4096  # a block's arrays stay in cache, yet are big enough for XLA to split over 2 cores
ESTIMATORS = ("ois", "wis", "pdis", "wpdis", "dr", "wdr")
HOLDOUT = 5  # the lower bound's truncation is chosen on the first n // HOLDOUT episodes


class Sums(NamedTuple):
    """Sums over episodes of the shifted weights w~_{i,t} = w_{i,0:t} / exp(shift_t) times the terms
    of the estimators (from `episode_rows`, each episode's own term): `from_sums` of these."""

    shift: jax.Array  # [H] log of what step t's weights were divided by (-inf: all weights are 0)
    w: jax.Array  # [H] sum_i w~_{i,t}
    wr: jax.Array  # [H] sum_i w~_{i,t} r_{i,t}
    wg: jax.Array  # [] sum_i w~_{i,H-1} G_i, with G_i = sum_t gamma^t r_{i,t}
    w2: jax.Array  # [H] sum_i w~_{i,t}^2
    wd: Optional[jax.Array]  # [H] sum_i w~_{i,t} (r_{i,t} - Q-hat_{i,t})  (DR and WDR only)
    wv: Optional[jax.Array]  # [H] sum_i w~_{i,t-1} V-hat_{i,t}, step t-1's shift  (DR and WDR only)
    invalid: jax.Array  # [] logged steps with zero behaviour probability, real steps after padding


def log_discounts(gamma, horizon: int, dtype=jnp.float32):
    """t log(gamma) for t = 0..H-1 (0 at t = 0, also for gamma = 0): gamma^t itself underflows
    float32 (gamma = 0.9 at t ~ 830) where the weights it multiplies may still be huge."""
    t = jnp.arange(horizon, dtype=dtype)
    return jnp.where(t > 0, t * jnp.log(jnp.asarray(gamma, dtype)), 0.0)


def _running_sum(x):
    """x_0 + ... + x_t for every t of a 1-D x, as products with two small triangular matrices (steps
    in chunks of about sqrt(H)): vmapped, a batched matmul, 1.5x faster on XLA:CPU than
    jnp.cumsum (a reduce-window) and 1.9x than a scan over time. x must be finite."""
    horizon = x.shape[0]
    size = math.isqrt(horizon - 1) + 1  # ceil(sqrt(H))
    count = -(-horizon // size)
    chunks = jnp.pad(x, (0, count * size - horizon)).reshape(count, size)
    within = dot(chunks, jnp.triu(jnp.ones((size, size), x.dtype)))  # sums inside each chunk
    before = dot(within[:, -1], jnp.triu(jnp.ones((count, count), x.dtype), 1))  # earlier chunks
    return (within + before[:, None]).reshape(-1)[:horizon]


def _episode_terms(tlp, blp, rewards, mask, q_hat, v_hat, gamma):
    """One episode ([H] arrays): log w_{0:t} (-inf from the first logged action the target never
    takes), the masked rewards, r - Q-hat and V-hat the weights multiply, its discounted return, and
    its invalid steps: log-ratio +inf or NaN (behaviour probability 0), real steps after padding."""
    mask = mask.astype(bool)
    steps = jnp.arange(rewards.shape[0])
    log_rho = jnp.where(mask, tlp - blp, 0.0)
    never = log_rho == -jnp.inf
    first_never = jnp.min(jnp.where(never, steps, steps.shape[0]))
    log_w = jnp.where(steps >= first_never, -jnp.inf, _running_sum(jnp.where(never, 0.0, log_rho)))
    r = jnp.where(mask, rewards, 0.0)
    ret = dot(jnp.exp(log_discounts(gamma, steps.shape[0], r.dtype)), r)
    invalid = jnp.sum(~(log_rho < jnp.inf)) + jnp.sum(mask[1:] & ~mask[:-1])
    if q_hat is None:
        return log_w, r, None, None, ret, invalid
    return log_w, r, jnp.where(mask, r - q_hat, 0.0), jnp.where(mask, v_hat, 0.0), ret, invalid


def _finite(shift):  # every weight is 0: nothing to divide by
    return jnp.where(shift > -jnp.inf, shift, 0.0)


def episode_rows(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None) -> Sums:
    """Pure and jittable: every episode's own term of every sum, as [N, ...] rows, with the shift
    [H] the per-step largest log-weight over all N episodes. `weighted_sums` of the rows gives the
    sums of the data or of a bootstrap resample."""
    per_episode = jax.vmap(_episode_terms, in_axes=(0, 0, 0, 0, 0, 0, None))
    log_w, r, dr, v_hat, ret, invalid = per_episode(
        target_log_prob, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, q_hat, v_hat,
        gamma)
    shift = log_w.max(0)
    w = jnp.exp(log_w - _finite(shift))
    w_prev = jnp.concatenate([jnp.ones_like(w[:, :1]), w[:, :-1]], axis=1)
    return Sums(shift=shift, w=w, wr=w * r, wg=w[:, -1] * ret, w2=w**2,
                wd=None if dr is None else w * dr, wv=None if v_hat is None else w_prev * v_hat,
                invalid=invalid)


def weighted_sums(rows: Sums, counts=None) -> Sums:
    """The sums over episodes, each row counted `counts` times ([N]; None: once)."""
    total = (lambda x: x.sum(0)) if counts is None else (lambda x: dot(counts, x))
    return jax.tree.map(total, rows._replace(shift=None))._replace(shift=rows.shift)


def _merge(a: Sums, b: Sums) -> Sums:
    """The sums of two blocks, each rescaled to the larger shift of every step."""
    shift = jnp.maximum(a.shift, b.shift)
    fa, fb = (jnp.where(x.shift > -jnp.inf, jnp.exp(x.shift - shift), 0.0) for x in (a, b))
    def prev(f):  # w~_{0:t-1} carries step t-1's shift; at t = 0 every weight is 1 (shift 0)
        return jnp.concatenate([jnp.ones_like(f[:1]), f[:-1]])
    def mix(x, y, f, g):
        return None if x is None else x * f + y * g
    return Sums(shift=shift, w=mix(a.w, b.w, fa, fb), wr=mix(a.wr, b.wr, fa, fb),
                wg=mix(a.wg, b.wg, fa[-1], fb[-1]), w2=mix(a.w2, b.w2, fa**2, fb**2),
                wd=mix(a.wd, b.wd, fa, fb), wv=mix(a.wv, b.wv, prev(fa), prev(fb)),
                invalid=a.invalid + b.invalid)


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
        "ois": _times_exp(s.shift[-1], s.wg) / n,
        "wis": _ratio(s.wg, s.w[..., -1]),
        "pdis": _times_exp(s.shift + log_discount, s.wr).sum(-1) / n,
        "wpdis": (discount * _ratio(s.wr, s.w)).sum(-1),
    }
    if s.wd is not None:
        prev_shift = jnp.concatenate([jnp.zeros_like(s.shift[:1]), s.shift[:-1]])
        prev_w = jnp.concatenate([jnp.full_like(s.w[..., :1], n), s.w[..., :-1]], axis=-1)
        out["dr"] = (_times_exp(s.shift + log_discount, s.wd)
                     + _times_exp(prev_shift + log_discount, s.wv)).sum(-1) / n
        out["wdr"] = (discount * (_ratio(s.wd, s.w) + _ratio(s.wv, prev_w))).sum(-1)
    return out


def weight_stats(s: Sums, n: int) -> dict:
    """The effective sample size (sum w)^2 / sum w^2 of the trajectory weights (OIS, WIS) and of
    each step's (PDIS, WPDIS, DR, WDR: `ess_step` [H]), the largest normalised trajectory weight
    (1 / sum_i w~: the shift makes the largest w~ 1) and the mean trajectory weight with its
    standard error: its expectation is 1, so far from 1 means wrong behaviour probabilities."""
    mean = _times_exp(s.shift[-1], s.w[-1]) / n
    square = _times_exp(2.0 * s.shift[-1], s.w2[-1]) / n
    ess = _ratio(s.w**2, s.w2)
    return {"ess": ess[-1], "ess_step": ess, "max_weight": _ratio(1.0, s.w[-1]),
            "mean_weight": mean,
            "mean_weight_se": jnp.sqrt(jnp.maximum(square - mean**2, 0.0) / max(n - 1, 1))}


@jax.jit
def estimators(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None):
    """Pure and jittable: ({name: estimate} and the `weight_stats`, the number of invalid steps: the
    estimates mean nothing unless it is 0). OIS, WIS, PDIS and WPDIS always; DR and WDR when q_hat
    and v_hat ([N, H]) are given."""
    data = (episodes._replace(obs=None, actions=None), target_log_prob, q_hat, v_hat)
    n = episodes.rewards.shape[0]
    num_full, rest = divmod(n, CHUNK)

    def block(start, size):
        part = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), data)
        return weighted_sums(episode_rows(part[0], part[1], gamma, *part[2:]))

    sums = block(0, min(n, CHUNK))
    if n > CHUNK:  # a scan over the other full blocks, then the rest
        sums, _ = jax.lax.scan(lambda s, i: (_merge(s, block(i * CHUNK, CHUNK)), None), sums,
                               jnp.arange(1, num_full))
        sums = _merge(sums, block(num_full * CHUNK, rest)) if rest else sums

    return from_sums(sums, n, gamma) | weight_stats(sums, n), sums.invalid


def resample_counts(key, n: int, batch: int, folds: int = 1):
    """[batch, n]: how often each episode is drawn in `batch` bootstrap resamples, each of which
    draws with replacement as many episodes from every fold (`fold_of`) as the fold holds."""
    fold = fold_of(n, folds)
    start, size = np.searchsorted(fold, fold), np.bincount(fold)[fold]
    draws = jax.random.randint(key, (batch, n), start, start + size)
    return jnp.zeros((batch, n)).at[jnp.arange(batch)[:, None], draws].add(1.0)


def bca_interval(boot, estimate, jackknife, level: float = 0.95):
    """The BCa interval (Efron 1987) from bootstrap estimates [B], the estimate and the jackknife's
    leave-one-out estimates [N]: bootstrap percentiles moved by the bias correction z0 (from the
    fraction of resamples below the estimate) and the acceleration a (the jackknife's skewness)."""
    norm, b = jax.scipy.stats.norm, boot.shape[0]
    below = (jnp.sum(boot < estimate) + 0.5 * jnp.sum(boot == estimate)) / b
    z0 = norm.ppf(jnp.clip(below, 0.5 / b, 1.0 - 0.5 / b))
    d = jackknife.mean() - jackknife
    a = _ratio(jnp.sum(d**3), 6.0 * jnp.sum(d**2) ** 1.5)
    z = z0 + norm.ppf(jnp.array([(1.0 - level) / 2.0, (1.0 + level) / 2.0]))
    return jnp.quantile(boot, norm.cdf(z0 + z / jnp.maximum(1.0 - a * z, 1e-6)))  # pole: extremes


def bootstrap_ci(key, rows: Sums, gamma, num_resamples: int = 1000, level: float = 0.95,
                 folds: int = 1) -> dict:
    """Pure and jittable BCa intervals, {name: [low, high]}, from `episode_rows`: `num_resamples`
    resamples (`resample_counts`, in vmapped batches of 100) and the jackknife, each episode left
    out as the total minus its row."""
    n, batch = rows.w.shape[0], min(num_resamples, 100)
    rows = rows._replace(w2=None)  # the estimates do not need it
    def resample_batch(key):
        counts = resample_counts(key, n, batch, folds).astype(rows.w.dtype)
        return jax.vmap(lambda c: from_sums(weighted_sums(rows, c), n, gamma))(counts)
    boot = jax.lax.map(resample_batch, jax.random.split(key, -(-num_resamples // batch)))
    total = weighted_sums(rows)
    tail = total._replace(shift=None)
    jack = jax.vmap(lambda row: from_sums(jax.tree.map(jnp.subtract, tail, row)._replace(
        shift=total.shift), max(n - 1, 1), gamma))(rows._replace(shift=None))
    est = from_sums(total, n, gamma)
    return {k: bca_interval(boot[k].reshape(-1)[:num_resamples], est[k], jack[k], level)
            for k in ESTIMATORS if k in est}


def lower_bound(rows: Sums, low, high, delta):
    """Pure and jittable: a lower bound on V^pi that holds with probability >= 1 - delta when every
    discounted return lies in [low, high] (HCOPE). X_i = w_i (G_i - low) / (high - low) >= 0 has
    mean (V^pi - low) / (high - low); truncated at c it can only lose mean, and min(X, c) in [0, c]
    obeys Maurer & Pontil's (2009) empirical Bernstein bound. The first n // HOLDOUT episodes choose
    c among their X's quantiles (the best bound they predict); the others give the bound."""
    n, pre = rows.w.shape[0], rows.w.shape[0] // HOLDOUT
    post, ln = n - pre, jnp.log(2.0 / delta)
    if pre < 2:  # too few episodes to say anything
        return jnp.asarray(low, rows.w.dtype)
    log_x = _finite(rows.shift[-1]) + jnp.log(jnp.maximum(rows.wg - low * rows.w[:, -1], 0.0))
    log_x = log_x - jnp.log(high - low)
    def bound(log_x, log_c):  # on E[min(X, c)], as if from `post` episodes like these
        y = jnp.exp(jnp.minimum(log_x, log_c))
        return (y.mean() - jnp.sqrt(2.0 * ln * y.var(ddof=1) / post)
                - 7.0 * jnp.exp(log_c) * ln / (3.0 * (post - 1)))
    # Past c = 3 (post - 1) / (7 ln) the last term alone exceeds 1: nothing to gain, nor overflow.
    pick = np.linspace(0, pre - 1, min(pre, 32)).astype(int)
    candidates = jnp.minimum(jnp.sort(log_x[:pre])[pick], jnp.log(3.0 * (post - 1) / (7.0 * ln)))
    best = candidates[jnp.argmax(jax.vmap(partial(bound, log_x[:pre]))(candidates))]
    return low + (high - low) * jnp.maximum(bound(log_x[pre:], best), 0.0)


def assess(key, rows: Sums, gamma, num_resamples: int, delta, returns=None, folds: int = 1):
    """Pure and jittable, from `episode_rows`: (every estimate and `weight_stats`, BCa intervals,
    the lower bound when the return range [low, high] is given, else None)."""
    n, sums = rows.w.shape[0], weighted_sums(rows)
    est = from_sums(sums, n, gamma) | weight_stats(sums, n)
    ci = bootstrap_ci(key, rows, gamma, num_resamples, folds=folds)
    return est, ci, None if returns is None else lower_bound(rows, *returns, delta)


def check_episodes(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None, *,
                   values: bool = False):
    """ValueError for input the estimators cannot take: shapes, gamma, Q-hat without V-hat; with
    `values` (numpy, on the host), a mask not a prefix of ones or an undefined importance ratio."""
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
    blp, tlp = np.asarray(episodes.behaviour_log_prob), np.asarray(target_log_prob)
    with np.errstate(invalid="ignore"):
        for i, t in np.argwhere(mask & ~(tlp - blp < np.inf))[:1]:
            raise ValueError(f"episode {i}, step {t}: " + (
                "the behaviour policy gave the logged action probability 0 (behaviour_log_prob = "
                "-inf), so its importance ratio is undefined" if blp[i, t] == -np.inf else
                f"the log-ratio target_log_prob - behaviour_log_prob is {tlp[i, t] - blp[i, t]}"))


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


def make_train(args: Args, num_resamples: Optional[int] = None):
    """Named for every algos/ file's entry point (CONVENTIONS; the tests patch it), though nothing
    is trained: evaluate(key) -> (Q-hats [folds, H, S, A], metrics) is one GridWorld dataset, pure
    and jittable. Each n: the first n of max(dataset_sizes) episodes give every estimator (DR, WDR
    cross-fitted), its BCa interval (`num_resamples`, default --sweep-bootstrap), the weight stats
    and the lower bound ("hcope", interval [bound, inf)), as metrics [len(dataset_sizes), ...]."""
    sizes = tuple(args.dataset_sizes)
    horizon = args.horizon or GRID_HORIZON
    num_resamples = num_resamples or args.sweep_bootstrap
    def evaluate(key):
        problem = gridworld_problem(args)
        key_data, key_boot = jax.random.split(key)
        episodes, target_log_prob = collect(key_data, problem.mdp, problem.behaviour,
                                            problem.target, max(sizes), horizon)
        results = []
        for n in sizes:
            data, tlp = jax.tree.map(lambda x: x[:n], (episodes, target_log_prob))
            q_tables, q_hat, v_hat = cross_fit(data, problem.target, args.gamma, args.folds)
            rows = episode_rows(data, tlp, args.gamma, q_hat, v_hat)
            est, ci, bound = assess(jax.random.fold_in(key_boot, n), rows, args.gamma,
                                    num_resamples, args.delta, problem.returns, args.folds)
            ci["hcope"] = jnp.stack([bound, jnp.inf])
            result = {("estimate/" if k in ESTIMATORS else "stats/") + k: v for k, v in est.items()}
            result |= {f"ci_{side}/{k}": x for k in ci for side, x in zip(("low", "high"), ci[k])}
            results.append(result | {"estimate/hcope": bound})
        metrics = {k: jnp.stack([r[k] for r in results]) for k in results[0]}
        jax.debug.callback(PROGRESS, metrics["estimate/wis"][-1])
        return q_tables, metrics
    return evaluate


# ============================================================================ 5. dataset sweep
CACHE_HITS = []  # of the persistent cache: counted around a compile, to say where it came from
jax.monitoring.register_event_listener(lambda e, **_: e.endswith("hits") and CACHE_HITS.append(e))


def run(args: Args, num_devices: Optional[int] = None):
    """All args.num_datasets datasets: pmap over the most local devices (at most num_devices) that
    divide them x vmap over datasets on each, in about ten batches per device (bounded memory, paced
    progress). Dataset k: k-th split of PRNGKey(args.seed). Returns (Q-hats, metrics, timing)."""
    num, limit = args.num_datasets, num_devices or jax.local_device_count()
    devices = jax.local_devices()[: max(d for d in range(1, limit + 1) if num % d == 0)]
    per_device = num // len(devices)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), (len(devices), per_device))
    batch = max(d for d in range(1, max(1, per_device // 10) + 1) if per_device % d == 0)
    sweep = jax.pmap(partial(jax.lax.map, make_train(args), batch_size=batch), devices=devices)
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
    """Bias, variance, MSE and interval coverage of every estimator at every n, across datasets
    (for "hcope", the lower bound, coverage is how often it holds)."""
    stats = {}
    for name in (*ESTIMATORS, "hcope"):
        err = np.asarray(metrics[f"estimate/{name}"], np.float64) - value  # [datasets, sizes]
        low, high = np.asarray(metrics[f"ci_low/{name}"]), np.asarray(metrics[f"ci_high/{name}"])
        stats[name] = {"bias": err.mean(0), "variance": err.var(0), "mse": (err**2).mean(0),
                       "coverage": ((low <= value) & (value <= high)).mean(0)}
    return stats


# ============================================================================ 6. logging and output
class Progress:
    """Host side of the in-jit progress callback, once per finished dataset: a line every 10% of the
    sweep (silent until `start`, e.g. when make_train is called directly)."""
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


def report(est: dict, ci: dict, n: int, args: Args, value=None, bound=None) -> str:
    """The table (estimator | estimate | 95% CI | error against `value`, when known), the weight
    diagnostics, a warning when they say the estimates cannot be trusted, and the lower bound."""
    est = {k: np.asarray(v, np.float64) for k, v in est.items()}
    rows = [[name.upper(), f"{est[name]:.4f}", "[{:.4f}, {:.4f}]".format(*map(float, ci[name]))]
            + ([] if value is None else [f"{est[name] - value:+.4f}"])
            for name in ESTIMATORS if name in est]
    headers = ["estimator", "estimate", "95% CI (BCa)"] + ([] if value is None else ["error"])
    ess, mean, se, steps = est["ess"], est["mean_weight"], est["mean_weight_se"], est["ess_step"]
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
        f"normalised weight {est['max_weight']:.3g}; mean weight {mean:.3f} +- {se:.3f} "
        "(expectation 1)",
        *["warning: " + "; ".join(warn)] * bool(warn),
        f"V^pi >= {float(bound):.4f} with probability >= {1 - args.delta:g}" if bound is not None
        else "no lower bound on V^pi: it needs --return-range LOW HIGH"])


def sweep_table(stats: dict, sizes) -> str:
    rows = [[name.upper(), n, f"{s['bias'][j]:+.4f}", f"{np.sqrt(s['variance'][j]):.4f}",
             f"{s['mse'][j]:.3g}", f"{s['coverage'][j]:.3f}"]
            for name, s in stats.items() for j, n in enumerate(sizes)]
    return markdown_table(["estimator", "n", "bias", "std", "MSE", "95% CI coverage"], rows)


def plot_mse(stats: dict, sizes, path: str):
    """MSE against n on log-log axes, one line per estimator, with a 1/n guide."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure to close
    fig = Figure(figsize=(6, 4.5), layout="tight")
    ax = fig.subplots()
    for name in ESTIMATORS:
        ax.plot(sizes, stats[name]["mse"], marker="o", label=name.upper())
    ax.plot(sizes, [stats["ois"]["mse"][0] * sizes[0] / n for n in sizes], "k:", label="1/n")
    ax.set(xscale="log", yscale="log", xlabel="episodes n", ylabel="MSE against the exact V^pi",
           title="Off-policy estimators on the GridWorld")
    ax.legend()
    fig.savefig(path, dpi=120)


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
    q_hat, v_hat, pi = (arrays.get(k) for k in ("q_hat", "v_hat", "target_prob"))
    note = "" if v_hat is None else ("\nnote: DR and WDR are unbiased only if v_hat(s) = sum_a "
                                     "pi(a|s) q_hat(s, a): with both given at the logged steps, "
                                     "that is the user's responsibility")
    if q_hat is not None and q_hat.ndim == 3:  # v_hat follows: sum_a pi(a|s) q_hat(s, a)
        if v_hat is not None or pi is None or pi.shape != q_hat.shape:
            raise ArgError(f"--dataset: q_hat of every action {q_hat.shape} needs target_prob "
                           "pi(a|s_t) of the same shape and no v_hat, which is computed from them")
        a = np.clip(episodes.actions, 0, q_hat.shape[-1] - 1)[..., None].astype(int)  # padding
        v_hat = (pi * q_hat).sum(-1).astype(q_hat.dtype)
        q_hat = np.take_along_axis(q_hat, a, -1)[..., 0]
    data = (episodes, arrays["target_log_prob"], q_hat, v_hat)
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
    evaluate = jax.jit(make_train(one, args.num_bootstrap), compiler_options=FAST_COMPILE)
    _, m = jax.device_get(evaluate(jax.random.PRNGKey(args.seed)))
    est = {k.split("/")[1]: v[0] for k, v in m.items() if k.startswith(("estimate/", "stats/"))}
    ci = {k: (m[f"ci_low/{k}"][0], m[f"ci_high/{k}"][0]) for k in ESTIMATORS}
    table = report(est, ci, args.num_episodes, args, value, est["hcope"])
    print(f"\n{args.num_episodes} episodes of the behaviour policy "
          f"({time.perf_counter() - t0:.1f} s, compile included):\n{table}\n")
    sizes = tuple(args.dataset_sizes)  # the sweep
    _, metrics, timing = run(args)
    stats = sweep_stats(jax.device_get(metrics), value)
    sweep = sweep_table(stats, sizes) + (f"\n(HCOPE: the lower bound for delta = {args.delta}; "
                                         "bias: mean bound - V^pi; coverage: how often it holds)")
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
        plot_mse(stats, sizes, os.path.join(run_dir, "mse_vs_n.png"))
        print(f"tensorboard and mse_vs_n.png in {run_dir}")


def main_dataset(args: Args, data):
    episodes, tlp, q_hat, v_hat, note = data
    t0 = time.perf_counter()
    rows = jax.jit(episode_rows)(episodes, tlp, args.gamma, q_hat, v_hat)
    evaluate = jax.jit(partial(assess, num_resamples=args.num_bootstrap, delta=args.delta,
                               returns=args.return_range), compiler_options=FAST_COMPILE)
    est, ci, bound = jax.device_get(evaluate(jax.random.PRNGKey(args.seed), rows, args.gamma))
    n, horizon = episodes.rewards.shape
    table = report(est, ci, n, args, bound=bound)
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
        episodes, tlp = collect_gymnax(key_data, model, args.epsilon, args.num_episodes, horizon)
        rows = episode_rows(episodes, tlp, args.gamma)
        mc_keys = jax.random.split(key_mc, args.num_mc_episodes)
        return (*assess(key_boot, rows, args.gamma, args.num_bootstrap, args.delta,
                        args.return_range), jax.lax.map(on_policy_return, mc_keys, batch_size=5000))
    est, ci, bound, returns = jax.device_get(evaluate(jax.random.PRNGKey(args.seed)))
    mc, half = float(returns.mean()), 1.96 * float(returns.std(ddof=1)) / np.sqrt(len(returns))
    table = report(est, ci, args.num_episodes, args, mc, bound)
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
