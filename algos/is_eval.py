"""Off-policy evaluation by importance sampling: OIS, WIS, PDIS, WPDIS, DR and WDR in one jitted call.

Estimate the value V^pi = E_pi[sum_t gamma^t r_t] of a target policy pi from episodes logged by a
different behaviour policy b, reweighting every logged step by rho_t = pi(a_t|s_t) / b(a_t|s_t):
ordinary and weighted importance sampling (OIS, WIS), per-decision importance sampling (PDIS, Precup,
Sutton & Singh 2000) and its weighted form (WPDIS), doubly robust (DR, Jiang & Li 2016,
https://arxiv.org/abs/1511.03722) and weighted doubly robust (WDR, Thomas & Brunskill 2016,
https://arxiv.org/abs/1604.00923), with the effective sample size (sum w)^2 / sum w^2 and
percentile-bootstrap 95% confidence intervals. Episodes are a struct of arrays (`Episodes`: [N, H]
arrays padded to a horizon H, with a mask), so every estimator is vectorised over the episode axis,
never a Python loop over episode objects. Products of ratios are sums of logs, and each step's
weights are divided by their largest before they are exponentiated: long horizons neither overflow
nor turn into NaN. From Python: `from is_eval import Episodes, estimate, episode_rows, bootstrap_ci`.

The default experiment is the 4x4 GridWorld with slip below: the exact V^pi by backward induction,
episodes of a more exploratory behaviour policy from a vmapped rollout, a table of every estimator on
1000 episodes, then a sweep over n = 10 ... 10000 episodes with 100 independent datasets each
(vmapped, pmapped over devices): bias, variance, MSE and bootstrap coverage against the exact value.

Run it:
    python algos/is_eval.py --help
    python algos/is_eval.py                                      # GridWorld table + sweep
    python algos/is_eval.py --dataset episodes.npz --gamma 0.99  # your own logged episodes
    python algos/is_eval.py --target-model runs/<run>/model.msgpack --horizon 100

Expect (default, under a minute on 2 CPU cores): exact V^pi = 0.2472; on 1000 episodes every
estimate within 0.04 of it and inside its 95% interval; in the sweep, OIS and PDIS unbiased with MSE
falling as 1/n, WIS and WPDIS biased at n = 10 (-0.28, -0.20) but with a smaller MSE, DR and WDR
(Q-hat from the fitted model) with the smallest MSE at every n; bootstrap coverage 89-94% at
n >= 1000 (a little short of 95%: percentile intervals of heavy-tailed weights, and for DR/WDR a
Q-hat that is not refitted per resample).
"""

# ============================================================================ imports
import dataclasses
import json
import math
import os
import sys
import time
from functools import partial
from typing import NamedTuple, Optional

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import tyro

# gymnax is imported where --target-model needs it: importing it takes seconds, and nothing else does.


# ============================================================================ 1. arguments
@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """base seed: the table's dataset uses PRNGKey(seed), dataset k of the sweep its k-th split"""
    num_datasets: int = 100
    """independent datasets per size n in the sweep (this file's --num-seeds: vmap on each device,
    pmap across devices); must be a multiple of the number of devices"""
    track: bool = True
    """write tensorboard event files (scalars and result tables) and the MSE plot under --log-dir"""
    log_dir: str = "runs"
    """root directory of the tensorboard runs"""

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

    slip: float = 0.2
    """GridWorld: probability that a move goes in a uniformly random direction instead"""
    target_temperature: float = 0.02
    """GridWorld: the target policy is softmax(Q* / target_temperature)"""
    behaviour_temperature: float = 0.1
    """GridWorld: the behaviour policy is softmax(Q* / behaviour_temperature), more exploratory"""

    dataset: Optional[str] = None
    """evaluate the episodes in this .npz file instead: arrays obs, actions, rewards,
    behaviour_log_prob, mask and target_log_prob ([N, H]; obs [N, H, ...]), optionally q_hat and
    v_hat ([N, H]) for DR and WDR"""
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
    """Check every flag before anything is compiled (the files --dataset and --target-model name
    are checked when they are loaded, also before compiling)."""
    if not 0.0 <= args.gamma <= 1.0:
        raise ArgError(f"--gamma must be in [0, 1] (got {args.gamma})")
    for flag, value in [("--num-episodes", args.num_episodes), ("--num-datasets", args.num_datasets),
                        ("--horizon", args.horizon), ("--num-mc-episodes", args.num_mc_episodes)]:
        if value is not None and value < 1:
            raise ArgError(f"{flag} must be >= 1 (got {value})")
    if not args.dataset_sizes or min(args.dataset_sizes) < 1:
        raise ArgError(f"--dataset-sizes must be one or more sizes n >= 1 (got {args.dataset_sizes})")
    for flag, value in [("--num-bootstrap", args.num_bootstrap), ("--sweep-bootstrap", args.sweep_bootstrap)]:
        if value < 2:
            raise ArgError(f"{flag} must be >= 2 resamples (got {value})")
    if not 0.0 <= args.slip <= 1.0:
        raise ArgError(f"--slip must be in [0, 1] (got {args.slip})")
    for flag, value in [("--target-temperature", args.target_temperature),
                        ("--behaviour-temperature", args.behaviour_temperature)]:
        if not value > 0:
            raise ArgError(f"{flag} must be > 0 (got {value})")
    if not 0.0 <= args.epsilon <= 1.0:
        raise ArgError(f"--epsilon must be in [0, 1] (got {args.epsilon})")
    if args.dataset is not None and args.target_model is not None:
        raise ArgError("--dataset and --target-model are two different experiments: give one")
    sweep = args.dataset is None and args.target_model is None
    if sweep and args.num_datasets % jax.local_device_count():
        raise ArgError(f"--num-datasets {args.num_datasets} must be a multiple of the "
                       f"{jax.local_device_count()} devices")
    return args


# ============================================================================ 2. environment
# A GridWorld with slip as a tabular MDP: transition tensor P[s, a, s'], the reward for entering each
# cell, absorbing terminal cells. 'S' start, 'G' goal (+1, ends), 'P' pit (-1, ends), '.' free; every
# other step costs 0.04 (Russell & Norvig's GridWorld), so rewards come at every step, not just the last.
GRID = (
    "S...",
    ".P.P",
    "....",
    "P..G",
)
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
    R = jnp.where(terminal[:, None], 0.0, P @ reward)
    return TabularMDP(P, R, reward, terminal, cells.index("S"))


def q_values(P, R, gamma, horizon: int, policy=None):
    """Q_t(s, a), t = 0..H-1, of an H-step episode by backward induction, under `policy` ([S, A]) or,
    if None, the optimal one: exact for the truncated problem the logged episodes come from."""

    def backward(v_next, _):
        q = R + gamma * P @ v_next
        v = q.max(-1) if policy is None else (policy * q).sum(-1)
        return v, q

    _, q = jax.lax.scan(backward, jnp.zeros(P.shape[0]), None, length=horizon, reverse=True)
    return q  # [H, S, A]


class Problem(NamedTuple):
    mdp: TabularMDP
    target: jax.Array  # [S, A] pi(a|s)
    behaviour: jax.Array  # [S, A] b(a|s)
    value: jax.Array  # exact V^pi(start) of the target
    behaviour_value: jax.Array  # exact V^b(start): what every estimator would return on-policy


def gridworld_problem(args: Args) -> Problem:
    """The MDP, the two softmax policies of the optimal Q, and their exact values."""
    return _gridworld_problem(args.slip, args.gamma, args.target_temperature, args.behaviour_temperature,
                              args.horizon or GRID_HORIZON)


@partial(jax.jit, static_argnums=4)
def _gridworld_problem(slip, gamma, target_temperature, behaviour_temperature, horizon: int) -> Problem:
    mdp = gridworld(slip)
    q_star = q_values(mdp.P, mdp.R, gamma, horizon)[0]
    target = jax.nn.softmax(q_star / target_temperature, axis=-1)
    behaviour = jax.nn.softmax(q_star / behaviour_temperature, axis=-1)

    def value(policy):
        return policy[mdp.start] @ q_values(mdp.P, mdp.R, gamma, horizon, policy)[0, mdp.start]

    return Problem(mdp, target, behaviour, value(target), value(behaviour))


class Episodes(NamedTuple):
    """Logged episodes as a struct of arrays padded to a horizon H. Steps where mask is False are
    padding and contribute nothing: ratio 1, reward 0."""

    obs: jax.Array  # [N, H, ...]
    actions: jax.Array  # [N, H]
    rewards: jax.Array  # [N, H]
    behaviour_log_prob: jax.Array  # [N, H] log b(a_t | s_t) of the logged action
    mask: jax.Array  # [N, H] bool: a real step, not padding


def collect(key, mdp: TabularMDP, behaviour, target, num_episodes: int, horizon: int):
    """`num_episodes` GridWorld episodes of the behaviour policy (a vmapped scan over steps), and the
    target's log-probabilities of the logged actions. After the end the state stays put, mask False.
    Actions and next states are drawn by inverting cumulative probabilities, one uniform each."""
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
        _, (obs, actions, rewards, blp, mask, tlp) = jax.lax.scan(step, carry, jax.random.uniform(key, (horizon, 2)))
        return Episodes(obs, actions, rewards, blp, mask), tlp

    return jax.vmap(episode)(jax.random.split(key, num_episodes))


def fit_q_hat(episodes: Episodes, target, gamma, num_states: int):
    """Q-hat [H, S, A] of the target policy in the maximum-likelihood model (transition counts, mean
    rewards) fitted on these episodes. Unvisited state-actions get no successor and zero reward."""
    s, a, m = episodes.obs, episodes.actions, episodes.mask.astype(jnp.float32)
    num_actions = target.shape[1]
    visits = jnp.zeros((num_states, num_actions)).at[s, a].add(m)
    reward_sum = jnp.zeros((num_states, num_actions)).at[s, a].add(m * episodes.rewards)
    moves = jnp.zeros((num_states, num_actions, num_states)).at[s[:, :-1], a[:, :-1], s[:, 1:]].add(m[:, :-1])
    P_hat = moves / jnp.maximum(moves.sum(-1, keepdims=True), 1.0)
    R_hat = reward_sum / jnp.maximum(visits, 1.0)
    return q_values(P_hat, R_hat, gamma, s.shape[1], target)


def at_logged_steps(q_table, target, episodes: Episodes):
    """Q-hat(s_t, a_t) and V-hat(s_t) = E_pi Q-hat(s_t, .) at every logged step, both [N, H]."""
    t = jnp.arange(q_table.shape[0])
    return q_table[t, episodes.obs, episodes.actions], (q_table * target).sum(-1)[t, episodes.obs]


# ---------------------------------------------------------------------------- --target-model
# A policy saved by algos/ppo.py --save-model on its gymnax env. The network and the observation
# normalisation are copied from algos/ppo.py, so that its parameter tree loads as it is. Parameters
# are only loaded here, never initialised, so the initialisers are left out, and only the discrete
# policy's logits are used, so the distrax distributions are too.
class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy and the value (the layout of algos/ppo.py)."""
    action_dim: int
    continuous: bool
    hidden_size: int = 64

    def setup(self):
        def mlp(out):
            return nn.Sequential([nn.Dense(self.hidden_size), nn.tanh,
                                  nn.Dense(self.hidden_size), nn.tanh, nn.Dense(out)])
        self.actor = mlp(self.action_dim)
        self.critic = mlp(1)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def logits(self, obs) -> jax.Array:
        return self.actor(obs)

    def value(self, obs) -> jax.Array:
        return self.critic(obs)[..., 0]

    def __call__(self, obs):
        return self.logits(obs), self.value(obs)


class TargetModel(NamedTuple):
    env_id: str
    params: dict
    obs_mean: np.ndarray
    obs_var: np.ndarray
    normalize_obs: bool
    hidden_size: int


def load_target_model(args: Args) -> TargetModel:
    """Read --target-model (ppo.py's payload: args as JSON, params, obs_mean, obs_var, each with a
    leading seed axis) and keep seed --model-seed. ArgError if it cannot be evaluated here."""
    path = args.target_model
    try:
        with open(path, "rb") as f:
            payload = flax.serialization.msgpack_restore(f.read())
        saved = json.loads(payload["args"])
        env_id, params = saved["env_id"], payload["params"]
        obs_mean, obs_var = np.asarray(payload["obs_mean"]), np.asarray(payload["obs_var"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ArgError(f"--target-model: cannot read {path!r} as a model saved by ppo.py ({e!r})")
    import gymnax
    from gymnax.environments import spaces

    env, env_params = gymnax.make(env_id)
    if not isinstance(env.action_space(env_params), spaces.Discrete):
        raise ArgError(f"--target-model: {env_id} has continuous actions; importance ratios here "
                       "need a discrete action space")
    num_seeds = obs_mean.shape[0]
    if not 0 <= args.model_seed < num_seeds:
        raise ArgError(f"--model-seed must be in [0, {num_seeds}) for {path} (got {args.model_seed})")
    pick = lambda x: np.asarray(x)[args.model_seed]  # noqa: E731
    return TargetModel(env_id, jax.tree.map(pick, params), obs_mean[args.model_seed],
                       obs_var[args.model_seed], bool(saved["normalize_obs"]), int(saved["hidden_size"]))


def target_model_horizon(args: Args, model: TargetModel) -> int:
    import gymnax

    return args.horizon or gymnax.make(model.env_id)[1].max_steps_in_episode


def normalize(obs, mean, var, enabled: bool):
    if not enabled:
        return obs
    return jnp.clip((obs - mean) / jnp.sqrt(var + 1e-8), -10.0, 10.0)


def collect_gymnax(key, model: TargetModel, epsilon, num_episodes: int, horizon: int):
    """Episodes of b = (1 - epsilon) pi + epsilon uniform on the model's gymnax env (vmapped scan over
    steps, masked after the first termination or truncation), and log pi of the logged actions."""
    import gymnax

    env, env_params = gymnax.make(model.env_id)
    num_actions = env.action_space(env_params).n
    network = ActorCritic(num_actions, False, model.hidden_size)

    def episode(key):
        key_reset, key_steps = jax.random.split(key)
        obs, state = env.reset(key_reset, env_params)

        def step(carry, key):
            obs, state, alive = carry
            key_action, key_env = jax.random.split(key)
            x = normalize(obs, model.obs_mean, model.obs_var, model.normalize_obs)
            log_pi = jax.nn.log_softmax(network.apply(model.params, x, method=ActorCritic.logits))
            log_b = jnp.log((1.0 - epsilon) * jnp.exp(log_pi) + epsilon / num_actions)
            a = jax.random.categorical(key_action, log_b)
            next_obs, state, reward, terminated, truncated, _ = env.step(key_env, state, a, env_params)
            logged = (obs, a, reward, log_b[a], alive, log_pi[a])
            return (next_obs, state, alive & ~(terminated | truncated)), logged

        carry = (obs, state, jnp.asarray(True))
        _, (obs, actions, rewards, blp, mask, tlp) = jax.lax.scan(step, carry, jax.random.split(key_steps, horizon))
        return Episodes(obs, actions, rewards.astype(jnp.float32), blp, mask), tlp

    return jax.vmap(episode)(jax.random.split(key, num_episodes))


def monte_carlo_value(key, model: TargetModel, gamma, num_episodes: int, horizon: int, batch: int = 5000):
    """Discounted returns of `num_episodes` on-policy episodes of pi (epsilon = 0), [num_episodes],
    `batch` episodes at a time so that memory stays bounded."""
    discount = gamma ** jnp.arange(horizon)

    def returns(key):
        episodes, _ = collect_gymnax(key, model, 0.0, batch, horizon)
        return (episodes.rewards * episodes.mask * discount).sum(-1)

    num_batches = -(-num_episodes // batch)
    return jax.lax.map(returns, jax.random.split(key, num_batches)).reshape(-1)[:num_episodes]


# ============================================================================ 3. estimators
# This file's network section. `_episode_terms` is one episode: log w_{0:t}, the running sum of
# log rho (padded steps have rho = 1 and r = 0), and the per-step values the weights multiply; it is
# vmapped over the episodes. At every step the weights are divided by their largest over episodes
# (the "shift") before they are exponentiated, and the mask multiplies the per-step terms after the
# exponential. `estimators` sums the terms of CHUNK episodes at a time and merges blocks like an
# online softmax: both sides rescaled by exp(their shift - the larger shift). `episode_rows` keeps
# every episode's terms instead, for the bootstrap.
CHUNK = 4096  # a block's arrays stay in cache, yet are big enough for XLA to split over 2 cores
ESTIMATORS = ("ois", "wis", "pdis", "wpdis", "dr", "wdr")


class Sums(NamedTuple):
    """Sums over episodes of the shifted weights w~_{i,t} = w_{i,0:t} / exp(shift_t) times the terms
    of the estimators (or, from `episode_rows`, each episode's own term); every estimate is a
    function of these (`from_sums`)."""

    shift: jax.Array  # [H] log of what step t's weights were divided by (-inf: all weights are 0)
    w: jax.Array  # [H] sum_i w~_{i,t}
    wr: jax.Array  # [H] sum_i w~_{i,t} r_{i,t}
    wg: jax.Array  # [] sum_i w~_{i,H-1} G_i, with G_i = sum_t gamma^t r_{i,t}
    w2: jax.Array  # [] sum_i w~_{i,H-1}^2
    wd: Optional[jax.Array]  # [H] sum_i w~_{i,t} (r_{i,t} - Q-hat_{i,t})  (DR and WDR only)
    wv: Optional[jax.Array]  # [H] sum_i w~_{i,t-1} V-hat_{i,t}, step t-1's shift  (DR and WDR only)
    undefined: jax.Array  # [] logged steps whose ratio is undefined: zero behaviour probability


def _running_sum(x):
    """x_0 + ... + x_t for every t of a 1-D x, as products with two small triangular matrices (steps
    in chunks of about sqrt(H)): vmapped, a batched matmul, several times faster on XLA:CPU than
    jnp.cumsum (a reduce-window) or a scan over time. x must be finite."""
    horizon = x.shape[0]
    size = math.isqrt(horizon - 1) + 1  # ceil(sqrt(H))
    count = -(-horizon // size)
    chunks = jnp.pad(x, (0, count * size - horizon)).reshape(count, size)
    within = chunks @ jnp.triu(jnp.ones((size, size), x.dtype))  # running sums inside each chunk
    before = within[:, -1] @ jnp.triu(jnp.ones((count, count), x.dtype), 1)  # totals of earlier chunks
    return (within + before[:, None]).reshape(-1)[:horizon]


def _episode_terms(tlp, blp, rewards, mask, q_hat, v_hat, gamma):
    """One episode ([H] arrays): log w_{0:t} (-inf from the first logged action the target never
    takes), the masked rewards, r - Q-hat and V-hat the weights multiply, its discounted return, and
    how many of its logged steps have an undefined log-ratio (+inf or NaN: behaviour probability 0)."""
    mask = mask.astype(bool)
    steps = jnp.arange(rewards.shape[0])
    log_rho = jnp.where(mask, tlp - blp, 0.0)
    never = log_rho == -jnp.inf
    first_never = jnp.min(jnp.where(never, steps, steps.shape[0]))
    log_w = jnp.where(steps >= first_never, -jnp.inf, _running_sum(jnp.where(never, 0.0, log_rho)))
    r = jnp.where(mask, rewards, 0.0)
    ret = jnp.sum(gamma ** steps.astype(r.dtype) * r)
    undefined = jnp.sum(~(log_rho < jnp.inf))
    if q_hat is None:
        return log_w, r, None, None, ret, undefined
    return log_w, r, jnp.where(mask, r - q_hat, 0.0), jnp.where(mask, v_hat, 0.0), ret, undefined


def _finite(shift):
    return jnp.where(shift > -jnp.inf, shift, 0.0)  # every weight is 0: nothing to divide by


def episode_rows(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None) -> Sums:
    """Pure and jittable: every episode's own term of every sum, as [N, ...] rows, with the shift [H]
    the per-step largest log-weight over all N episodes. `weighted_sums` of the rows gives the sums of
    the data or of a bootstrap resample."""
    per_episode = jax.vmap(_episode_terms, in_axes=(0, 0, 0, 0, 0, 0, None))
    log_w, r, dr, v_hat, ret, undefined = per_episode(
        target_log_prob, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, q_hat, v_hat, gamma)
    shift = log_w.max(0)
    w = jnp.exp(log_w - _finite(shift))
    w_prev = jnp.concatenate([jnp.ones_like(w[:, :1]), w[:, :-1]], axis=1)
    return Sums(shift=shift, w=w, wr=w * r, wg=w[:, -1] * ret, w2=w[:, -1] ** 2,
                wd=None if dr is None else w * dr, wv=None if v_hat is None else w_prev * v_hat,
                undefined=undefined)


def weighted_sums(rows: Sums, counts=None) -> Sums:
    """The sums over episodes, each row counted `counts` times ([N]; None: once)."""
    total = (lambda x: x.sum(0)) if counts is None else (lambda x: counts @ x)
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
                wg=mix(a.wg, b.wg, fa[-1], fb[-1]), w2=mix(a.w2, b.w2, fa[-1] ** 2, fb[-1] ** 2),
                wd=mix(a.wd, b.wd, fa, fb), wv=mix(a.wv, b.wv, prev(fa), prev(fb)),
                undefined=a.undefined + b.undefined)


def _times_exp(log_scale, x):
    """x * exp(log_scale) without inf * 0: a sum of shifted weights, scaled back."""
    return jnp.sign(x) * jnp.exp(log_scale + jnp.log(jnp.abs(x)))


def _ratio(x, y):
    """x / y, and 0 where every weight is 0 (y == 0): the weighted estimators' defined value."""
    return jnp.where(y > 0, x / jnp.where(y > 0, y, 1.0), 0.0)


def from_sums(s: Sums, n: int, gamma) -> dict:
    """Every estimate (and the ESS) from the sums over n episodes; leading batch axes are kept."""
    discount = gamma ** jnp.arange(s.shift.shape[0], dtype=s.w.dtype)
    log_discount = jnp.log(discount)
    w_last = s.w[..., -1]
    out = {
        "ois": _times_exp(s.shift[-1], s.wg) / n,
        "wis": _ratio(s.wg, w_last),
        "pdis": _times_exp(s.shift + log_discount, s.wr).sum(-1) / n,
        "wpdis": (discount * _ratio(s.wr, s.w)).sum(-1),
        "ess": _ratio(w_last**2, s.w2),
    }
    if s.wd is not None:
        prev_shift = jnp.concatenate([jnp.zeros_like(s.shift[:1]), s.shift[:-1]])
        prev_w = jnp.concatenate([jnp.full_like(s.w[..., :1], n), s.w[..., :-1]], axis=-1)
        out["dr"] = (_times_exp(s.shift + log_discount, s.wd)
                     + _times_exp(prev_shift + log_discount, s.wv)).sum(-1) / n
        out["wdr"] = (discount * (_ratio(s.wd, s.w) + _ratio(s.wv, prev_w))).sum(-1)
    return out


def estimators(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None):
    """Pure and jittable: ({name: estimate}, number of logged steps whose ratio is undefined, i.e.
    with zero behaviour probability: the estimates mean nothing unless it is 0).
    OIS, WIS, PDIS, WPDIS and the ESS always; DR and WDR when q_hat and v_hat ([N, H]) are given."""
    data = (episodes._replace(obs=None, actions=None), target_log_prob, q_hat, v_hat)
    n, horizon = episodes.rewards.shape
    num_full, rest = divmod(n, CHUNK)

    def block(start, size):
        part = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, size), data)
        return weighted_sums(episode_rows(part[0], part[1], gamma, *part[2:]))

    if num_full == 0:
        sums = block(0, rest)
    else:  # a scan over the full blocks, then the rest
        zeros = jnp.zeros(horizon, jnp.result_type(episodes.rewards, float))
        model = None if q_hat is None else zeros
        empty = Sums(jnp.full_like(zeros, -jnp.inf), zeros, zeros, zeros[0], zeros[0], model, model, jnp.int32(0))
        sums, _ = jax.lax.scan(lambda s, i: (_merge(s, block(i * CHUNK, CHUNK)), None), empty, jnp.arange(num_full))
        sums = _merge(sums, block(num_full * CHUNK, rest)) if rest else sums
    return from_sums(sums, n, gamma), sums.undefined


def bootstrap_ci(key, rows: Sums, gamma, num_resamples: int = 1000, level: float = 0.95) -> dict:
    """Pure and jittable percentile-bootstrap intervals, {name: [low, high]}, from `episode_rows`.
    A resample draws N episodes with replacement, as counts per episode; the estimates of a batch of
    100 resamples are vmapped over their counts, and a scan goes through the batches."""
    n, batch = rows.w.shape[0], min(num_resamples, 100)

    def resample_batch(key):
        draws = jax.random.randint(key, (batch, n), 0, n)
        counts = jnp.zeros((batch, n), rows.w.dtype).at[jnp.arange(batch)[:, None], draws].add(1.0)
        return jax.vmap(lambda c: from_sums(weighted_sums(rows, c), n, gamma))(counts)

    estimates = jax.lax.map(resample_batch, jax.random.split(key, -(-num_resamples // batch)))
    q = jnp.array([(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return {name: jnp.quantile(x.reshape(-1)[:num_resamples], q) for name, x in estimates.items() if name != "ess"}


def check_episodes(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None):
    """ValueError for input the estimators cannot take: shapes, gamma, Q-hat without V-hat."""
    shape = tuple(np.shape(episodes.rewards))
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"rewards must be [N, H] with N >= 1 episodes and H >= 1 steps (got shape {shape})")
    arrays = dict(episodes._asdict(), target_log_prob=target_log_prob, q_hat=q_hat, v_hat=v_hat)
    for name, x in arrays.items():
        if x is None:
            continue
        if tuple(np.shape(x)[:2]) != shape or (name != "obs" and np.ndim(x) != 2):
            raise ValueError(f"{name} has shape {tuple(np.shape(x))} but rewards has {shape}; every "
                             "array must be [N, H] (obs [N, H, ...])")
    if (q_hat is None) != (v_hat is None):
        raise ValueError("give both q_hat and v_hat (for DR and WDR) or neither")
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1] (got {gamma})")


def zero_probability_error(episodes: Episodes, target_log_prob) -> str:
    """The message naming the first logged step whose importance ratio is undefined."""
    blp, tlp = np.asarray(episodes.behaviour_log_prob), np.asarray(target_log_prob)
    with np.errstate(invalid="ignore"):
        i, t = np.argwhere(np.asarray(episodes.mask).astype(bool) & ~(tlp - blp < np.inf))[0]
    if blp[i, t] == -np.inf:
        return (f"episode {i}, step {t}: the behaviour policy gave the logged action probability 0 "
                "(behaviour_log_prob = -inf), so its importance ratio is undefined")
    return f"episode {i}, step {t}: the log-ratio target_log_prob - behaviour_log_prob is {tlp[i, t] - blp[i, t]}"


_estimators_jit = jax.jit(estimators)


def estimate(episodes: Episodes, target_log_prob, gamma, q_hat=None, v_hat=None) -> dict:
    """Every estimator on your data in one jitted call: 'ois', 'wis', 'pdis', 'wpdis', 'ess' and, with
    q_hat (Q-hat at the logged actions) and v_hat (V-hat at the logged states), 'dr' and 'wdr'.
    ValueError for bad shapes, gamma outside [0, 1], or a logged step whose behaviour probability is
    zero (naming the episode and step)."""
    check_episodes(episodes, target_log_prob, gamma, q_hat, v_hat)
    used = episodes._replace(obs=None, actions=None)  # not needed: not sent to the device
    out, undefined = _estimators_jit(used, target_log_prob, gamma, q_hat, v_hat)
    if int(undefined):
        raise ValueError(zero_probability_error(episodes, target_log_prob))
    return out


# ============================================================================ 4. the experiment
# The experiment's programs are many small kernels: LLVM at -O1 compiles them in about half the time
# of XLA's default and they run as fast (measured on the sweep). `estimate` keeps the default.
FAST_COMPILE = {"xla_backend_optimization_level": 1}


def make_train(args: Args, num_resamples: Optional[int] = None):
    """train(key) -> (Q-hat, metrics): one dataset of the GridWorld sweep, pure and jittable. Collects
    max(dataset_sizes) episodes of the behaviour policy; for each n, the first n of them give every
    estimator (DR and WDR with the Q-hat of the model fitted on those n) and its bootstrap interval
    (`num_resamples`, default --sweep-bootstrap). metrics: `estimate/<name>`, `ci_low/<name>`,
    `ci_high/<name>` and `stats/ess`, each [len(dataset_sizes)]; Q-hat [H, S, A] is the one of the
    largest n."""
    sizes = tuple(args.dataset_sizes)
    horizon = args.horizon or GRID_HORIZON
    num_resamples = num_resamples or args.sweep_bootstrap

    def train(key):
        problem = gridworld_problem(args)
        key_data, key_boot = jax.random.split(key)
        episodes, target_log_prob = collect(key_data, problem.mdp, problem.behaviour, problem.target,
                                            max(sizes), horizon)
        results = []
        for n in sizes:
            data, tlp = jax.tree.map(lambda x: x[:n], (episodes, target_log_prob))
            q_table = fit_q_hat(data, problem.target, args.gamma, problem.target.shape[0])
            q_hat, v_hat = at_logged_steps(q_table, problem.target, data)
            rows = episode_rows(data, tlp, args.gamma, q_hat, v_hat)  # the bootstrap needs them anyway
            est = from_sums(weighted_sums(rows, jnp.ones(n)), n, args.gamma)
            ci = bootstrap_ci(jax.random.fold_in(key_boot, n), rows, args.gamma, num_resamples)
            result = {f"estimate/{k}": est[k] for k in ESTIMATORS}
            result.update({f"ci_low/{k}": ci[k][0] for k in ESTIMATORS})
            result.update({f"ci_high/{k}": ci[k][1] for k in ESTIMATORS})
            result["stats/ess"] = est["ess"]
            results.append(result)
        metrics = {k: jnp.stack([r[k] for r in results]) for k in results[0]}
        jax.debug.callback(report_progress, metrics["estimate/wis"][-1])
        return q_table, metrics

    return train


def make_evaluate_target_model(args: Args, model: TargetModel):
    """evaluate(key) -> (estimates, intervals, Monte Carlo returns) for --target-model: every
    estimator but DR/WDR (no Q-hat) on --num-episodes episodes of the epsilon-mixture, and the
    discounted returns of --num-mc-episodes on-policy episodes for the ground truth."""
    horizon = target_model_horizon(args, model)

    def evaluate(key):
        key_data, key_boot, key_mc = jax.random.split(key, 3)
        episodes, tlp = collect_gymnax(key_data, model, args.epsilon, args.num_episodes, horizon)
        rows = episode_rows(episodes, tlp, args.gamma)
        est = from_sums(weighted_sums(rows, jnp.ones(args.num_episodes)), args.num_episodes, args.gamma)
        ci = bootstrap_ci(key_boot, rows, args.gamma, args.num_bootstrap)
        return est, ci, monte_carlo_value(key_mc, model, args.gamma, args.num_mc_episodes, horizon)

    return evaluate


# ============================================================================ 5. dataset sweep
def run(args: Args, num_devices: Optional[int] = None):
    """All args.num_datasets datasets of the sweep: pmap over devices x vmap over datasets on each
    (in about ten batches per device: that bounds memory and paces the progress lines).

    Dataset k always gets the k-th split of PRNGKey(args.seed), whatever the layout. Returns
    (Q-hat, metrics, timing); every leaf has a leading [num_datasets] axis."""
    devices = jax.local_devices()[: num_devices or jax.local_device_count()]
    per_device = args.num_datasets // len(devices)
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_datasets)
    keys = keys.reshape(len(devices), per_device, *keys.shape[1:])
    batch = max(d for d in range(1, max(1, per_device // 10) + 1) if per_device % d == 0)  # no remainder
    train = make_train(args)
    sweep = jax.pmap(lambda k: jax.lax.map(train, k, batch_size=batch), devices=devices)
    PROGRESS.start(args)
    t0 = time.perf_counter()
    compiled = sweep.lower(keys).compile(compiler_options=FAST_COMPILE)
    compile_s = time.perf_counter() - t0
    PROGRESS.t_start = time.perf_counter()
    state, metrics = jax.block_until_ready(compiled(keys))
    run_s = time.perf_counter() - PROGRESS.t_start
    merge = lambda x: x.reshape(args.num_datasets, *x.shape[2:])  # noqa: E731
    state, metrics = jax.tree.map(merge, (state, metrics))
    episodes = args.num_datasets * max(args.dataset_sizes)
    timing = {"compile_s": compile_s, "run_s": run_s, "episodes_per_s": episodes / run_s}
    return state, metrics, timing


def sweep_stats(metrics, value) -> dict:
    """Bias, variance, MSE and interval coverage of every estimator at every n, across datasets."""
    stats = {}
    for name in ESTIMATORS:
        est = np.asarray(metrics[f"estimate/{name}"], dtype=np.float64)  # [datasets, sizes]
        low, high = np.asarray(metrics[f"ci_low/{name}"]), np.asarray(metrics[f"ci_high/{name}"])
        stats[name] = {
            "bias": est.mean(0) - value,
            "variance": est.var(0),
            "mse": ((est - value) ** 2).mean(0),
            "coverage": ((low <= value) & (value <= high)).mean(0),
        }
    return stats


# ============================================================================ 6. logging and output
class Progress:
    """Host side of the in-jit progress callback, once per finished dataset: a line every 10%
    (silent until `start`, e.g. when make_train is called directly)."""

    def __init__(self):
        self.args = None

    def start(self, args: Args):
        self.args, self.wis, self.t_start = args, [], time.perf_counter()

    def __call__(self, wis):
        if self.args is None:
            return
        self.wis.append(float(wis))
        done, total = len(self.wis), self.args.num_datasets
        if done * 10 // total > (done - 1) * 10 // total:
            elapsed = time.perf_counter() - self.t_start
            print(f"[{self.args.exp_name}] datasets {done:>5} / {total}  WIS at n = "
                  f"{max(self.args.dataset_sizes)}: {np.mean(self.wis):.4f} (mean)  "
                  f"{done * max(self.args.dataset_sizes) / max(elapsed, 1e-9):,.0f} episodes/s", flush=True)


PROGRESS = Progress()
report_progress = PROGRESS.__call__


class EventWriter:
    """Minimal tensorboard writer on the tensorboard package alone (no torch, no tensorflow)."""

    def __init__(self, log_dir):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._writer = EventFileWriter(log_dir)

    def scalar(self, tag, value, step):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def text(self, tag, markdown):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.plugins.text.summary_v2 import text_pb
        self._writer.add_event(Event(wall_time=time.time(), step=0, summary=text_pb(tag, markdown)))

    def close(self):
        self._writer.close()


def run_dir_for(args: Args, env_id: str) -> str:
    return os.path.join(args.log_dir, f"{env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")


def markdown_table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def estimates_table(est: dict, ci: dict, value: Optional[float] = None) -> str:
    """estimator | estimate | 95% CI | error against the true value (when known) | ESS."""
    rows = []
    for name in ESTIMATORS:
        if name in est:
            low, high = (float(x) for x in ci[name])
            row = [name.upper(), f"{float(est[name]):.4f}", f"[{low:.4f}, {high:.4f}]"]
            row += [] if value is None else [f"{float(est[name]) - value:+.4f}"]
            rows.append(row + [f"{float(est['ess']):.1f}"])
    headers = ["estimator", "estimate", "95% CI"] + ([] if value is None else ["error"]) + ["ESS"]
    return markdown_table(headers, rows)


def sweep_table(stats: dict, sizes) -> str:
    rows = [[name.upper(), n, f"{s['bias'][j]:+.4f}", f"{np.sqrt(s['variance'][j]):.4f}",
             f"{s['mse'][j]:.3g}", f"{s['coverage'][j]:.2f}"]
            for name, s in stats.items() for j, n in enumerate(sizes)]
    return markdown_table(["estimator", "n", "bias", "std", "MSE", "95% CI coverage"], rows)


def plot_mse(stats: dict, sizes, path: str):
    """MSE against n on log-log axes, one line per estimator, with a 1/n guide."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name in ESTIMATORS:
        ax.plot(sizes, stats[name]["mse"], marker="o", label=name.upper())
    ax.plot(sizes, [stats["ois"]["mse"][0] * sizes[0] / n for n in sizes], "k:", label="1/n")
    ax.set(xscale="log", yscale="log", xlabel="episodes n", ylabel="MSE against the exact V^pi",
           title="Off-policy estimators on the GridWorld")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_tensorboard(run_dir, args: Args, tables: dict, scalars=()):
    """The hyper-parameters and result tables as text; scalars as (tag, value, step)."""
    writer = EventWriter(run_dir)
    writer.text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(
        f"|{k}|{v}|" for k, v in dataclasses.asdict(args).items()))
    for tag, table in tables.items():
        writer.text(tag, table)
    for tag, value, step in scalars:
        writer.scalar(tag, value, step)
    writer.close()


def load_dataset(args: Args):
    """(Episodes, target_log_prob, q_hat, v_hat) from --dataset; ArgError naming the flag."""
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
    try:
        check_episodes(*data[:2], args.gamma, *data[2:])
    except ValueError as e:
        raise ArgError(f"--dataset: {e}")
    with np.errstate(invalid="ignore"):
        defined = ~episodes.mask.astype(bool) | (data[1] - episodes.behaviour_log_prob < np.inf)
    if not defined.all():
        raise ArgError(f"--dataset: {zero_probability_error(episodes, data[1])}")
    return data


# ============================================================================ 7. main
def main_gridworld(args: Args):
    problem = gridworld_problem(args)
    value = float(problem.value)
    print(f"GridWorld {len(GRID)}x{len(GRID[0])}, slip {args.slip}, gamma {args.gamma}, "
          f"H = {args.horizon or GRID_HORIZON}: exact V^pi = {value:.4f} "
          f"(behaviour policy: {float(problem.behaviour_value):.4f})")

    t0 = time.perf_counter()  # the table: one dataset of --num-episodes
    one = dataclasses.replace(args, dataset_sizes=(args.num_episodes,), num_datasets=1)
    table_train = jax.jit(make_train(one, args.num_bootstrap), compiler_options=FAST_COMPILE)
    _, m = jax.device_get(table_train(jax.random.PRNGKey(args.seed)))
    est = {k: m[f"estimate/{k}"][0] for k in ESTIMATORS} | {"ess": m["stats/ess"][0]}
    table = estimates_table(est, {k: (m[f"ci_low/{k}"][0], m[f"ci_high/{k}"][0]) for k in ESTIMATORS}, value)
    print(f"\n{args.num_episodes} episodes of the behaviour policy "
          f"({time.perf_counter() - t0:.1f} s, compile included):\n{table}\n")

    sizes = tuple(args.dataset_sizes)  # the sweep
    _, metrics, timing = run(args)
    stats = sweep_stats(jax.device_get(metrics), value)
    sweep = sweep_table(stats, sizes)
    print(f"\n{args.num_datasets} datasets for each n in {sizes}:\n{sweep}")
    print(f"compile {timing['compile_s']:.1f} s  run {timing['run_s']:.1f} s  |  "
          f"{timing['episodes_per_s']:,.0f} logged episodes/s")
    if args.track:
        run_dir = run_dir_for(args, "GridWorld")
        scalars = [(f"ope/{name}/{stat}", s[stat][j], n) for name, s in stats.items()
                   for stat in ("bias", "variance", "mse", "coverage") for j, n in enumerate(sizes)]
        write_tensorboard(run_dir, args, {"results/estimates": table, "results/sweep": sweep}, scalars)
        plot_mse(stats, sizes, os.path.join(run_dir, "mse_vs_n.png"))
        print(f"tensorboard and mse_vs_n.png in {run_dir}")


def main_dataset(args: Args, data):
    episodes, tlp, q_hat, v_hat = data
    t0 = time.perf_counter()
    est = estimate(episodes, tlp, args.gamma, q_hat, v_hat)
    rows = jax.jit(episode_rows)(episodes, tlp, args.gamma, q_hat, v_hat)
    ci = jax.jit(bootstrap_ci, static_argnums=3)(jax.random.PRNGKey(args.seed), rows, args.gamma, args.num_bootstrap)
    table = estimates_table(est, ci)
    n, horizon = episodes.rewards.shape
    print(f"{args.dataset}: {n} episodes, H = {horizon}, gamma {args.gamma} "
          f"({time.perf_counter() - t0:.1f} s, compile included):\n{table}")
    if args.track:
        name = os.path.splitext(os.path.basename(args.dataset))[0]
        write_tensorboard(run_dir_for(args, name), args, {"results/estimates": table})


def main_target_model(args: Args, model: TargetModel):
    t0 = time.perf_counter()
    evaluate = jax.jit(make_evaluate_target_model(args, model), compiler_options=FAST_COMPILE)
    est, ci, returns = jax.device_get(evaluate(jax.random.PRNGKey(args.seed)))
    mc, half = float(returns.mean()), 1.96 * float(returns.std(ddof=1)) / np.sqrt(len(returns))
    table = estimates_table(est, ci, mc)
    print(f"{args.target_model} (seed {args.model_seed}) on {model.env_id}, gamma {args.gamma}, "
          f"H = {target_model_horizon(args, model)}\n"
          f"ground truth: {args.num_mc_episodes} on-policy episodes, V^pi = {mc:.4f} "
          f"(95% CI [{mc - half:.4f}, {mc + half:.4f}])\n"
          f"{args.num_episodes} episodes of (1 - {args.epsilon}) pi + {args.epsilon} uniform "
          f"({time.perf_counter() - t0:.1f} s, compile included); error against the Monte Carlo value:\n{table}")
    if args.track:
        write_tensorboard(run_dir_for(args, model.env_id), args, {"results/estimates": table})


def main():
    args = tyro.cli(Args, description=__doc__.split("\n\n")[0])
    try:
        args = validate(args)
        data = load_dataset(args) if args.dataset else None
        model = load_target_model(args) if args.target_model else None
    except ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if data is not None:
        main_dataset(args, data)
    elif model is not None:
        main_target_model(args, model)
    else:
        main_gridworld(args)


if __name__ == "__main__":
    main()
