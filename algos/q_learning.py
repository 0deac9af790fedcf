"""Tabular Q-learning for many independent agents at once, in one fully jitted JAX file.

Q-learning (Watkins 1989; Watkins & Dayan 1992, https://doi.org/10.1007/BF00992698) learns the
optimal action values of a finite MDP from its own experience: after each step (s, a, r, s') it
moves Q(s, a) toward r + gamma * max_a' Q(s', a') (no bootstrap from a terminal s'), acting
epsilon-greedily with ties broken at random. `--num-agents N` independent agents, each with its own
Q-table and its own environment, are stepped together by one vmapped step inside a `lax.scan`; the
whole run is one `jax.jit`, and seeds run side by side as `pmap(vmap(train))`. The environments are
tabular (a GridWorld written below, or gymnax's FrozenLake-misc), so the file also solves them
exactly by value iteration and logs how close every agent is to the optimal Q*.

Run it:
    python algos/q_learning.py --help
    python algos/q_learning.py                          # 6x6 maze, 2 seeds x 30 agents x 200k steps
    python algos/q_learning.py --slip 0.2 --plot        # slippery moves; PNG heat map of max Q
    python algos/q_learning.py --env-id FrozenLake-misc --num-agents 1024

Expect (defaults; 8 seeds took 5.5 s on 2 CPU cores, RESULTS.md): every agent's greedy policy is
optimal in every reachable state (stats/greedy_optimal 1.0); stats/q_error, max |Q - Q*| over the
pairs an agent visited (mean over agents), is about 1e-3 (rare actions lag; greedy values: 1e-5).
With --slip 0.2 greedy_optimal is ~98% (action gaps of 0.001) and q_error ~1e-2; on
FrozenLake-misc greedy_optimal is 99-100%, q_error about 0.07.
"""

# ============================================================================ imports
import dataclasses
import hashlib
import itertools
import json
import os
import signal
import socket
import sys
import tempfile
import time
from functools import partial
from typing import Callable, NamedTuple, Optional

import flax.serialization
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import tyro
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache
from scipy.sparse.csgraph import breadth_first_order
from scipy.stats import trim_mean
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.record_writer import RecordWriter

# Process-wide XLA settings, read when JAX starts its backend (its first operation): made on
# import, unless XLA_FLAGS or jax.config chose. One CPU device per core lets pmap use every core.
if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
        and jax.config.jax_num_cpu_devices < 0):
    jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
# A step loop touching under 100 kB per iteration (one agent's) becomes one native loop instead
# of an op launch per op (XLA:CPU's default limit is 1 kB): ~3M steps/s instead of 0.33M.
if "xla_backend_extra_options" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_extra_options="
                               "xla_cpu_small_while_loop_byte_threshold=100000").strip()


# ============================================================================ 1. arguments
@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    env_id: str = "GridWorld-v0"
    """`GridWorld-v0` (the grid configured below) or `FrozenLake-misc` (gymnax's slippery lake)"""
    seed: int = 1
    """base seed: seed k of the sweep uses the k-th split of PRNGKey(seed)"""
    num_seeds: int = 2
    """independent runs side by side: vmap per device, pmap over the devices (on CPU, cores)"""
    track: bool = True
    """write tensorboard event files under --log-dir"""
    log_dir: str = "runs"
    """root directory of the tensorboard runs"""
    save_model: bool = False
    """write the final Q-tables of every seed and agent to model.msgpack in the run directory"""
    plot: bool = False
    """save q_values.png in the run directory: max_a Q per cell (seed 0, agent 0) beside max_a Q*"""
    compile_cache_dir: str = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                            os.path.expanduser("~/.cache/jax"))
    """persistent compilation cache, so a rerun skips most of the compile ("" turns it off)"""
    resume: Optional[str] = None
    """RUN_DIR of a stopped run: continue from its checkpoint to the result the uninterrupted run
    gets (flags that would change the computation must be left out or match)"""
    num_segments: Optional[int] = None
    """the run is one compiled program called this many times; after each segment it logs,
    checkpoints and may stop (default: 10, more for long runs: one per 2^31 agent-steps)"""
    distributed: bool = False
    """one of several processes (jax.distributed): the runs are split over all their devices
    (implied by the next three flags)"""
    coordinator_address: Optional[str] = None
    """--distributed: HOST:PORT of process 0 (default: detected, e.g. under SLURM or Open MPI)"""
    num_processes: Optional[int] = None
    """--distributed: how many processes take part (default: detected)"""
    process_id: Optional[int] = None
    """--distributed: this process's index, 0 to num_processes - 1 (default: detected)"""

    # GridWorld-v0 (FrozenLake-misc has its own map)
    grid_size: tuple[int, int] = (6, 6)
    """rows and columns of the GridWorld"""
    start: tuple[int, int] = (0, 0)
    """start cell (row column)"""
    goal: tuple[int, int] = (5, 5)
    """goal cell (row column): reward 1 on arrival, and the episode ends there"""
    walls: tuple[tuple[int, int], ...] = (
        (0, 2), (1, 2), (2, 2), (1, 4), (2, 4), (3, 4), (4, 0), (4, 1), (4, 2), (4, 3), (4, 4))
    """wall cells as row column pairs; a move into a wall or off the grid stays put"""
    slip: float = 0.0
    """probability that a move goes in a uniformly random direction instead of the chosen one"""
    max_episode_steps: int = 100
    """time limit of an episode (both envs); a truncated episode is bootstrapped through"""

    # Q-learning
    num_agents: int = 30
    """independent agents per seed, each with its own Q-table and its own environment"""
    total_timesteps: int = 200_000
    """environment steps per agent"""
    num_steps: int = 1_000
    """steps per agent per update; an update is one row of metrics (tensorboard, progress)"""
    # Flags marked "sweep" take several values: all combinations train in one program (HPARAMS).
    learning_rate: tuple[float, ...] = (0.1,)
    """sweep: step size of the Q-update (annealed linearly to 0 with --anneal-lr)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run, so Q settles in stochastic envs"""
    gamma: tuple[float, ...] = (0.95,)
    """sweep: discount factor"""
    start_e: tuple[float, ...] = (1.0,)
    """sweep: epsilon of the epsilon-greedy policy at the start"""
    end_e: tuple[float, ...] = (0.05,)
    """sweep: epsilon at the end of the exploration phase and after it"""
    exploration_fraction: float = 0.5
    """fraction of --total-timesteps over which epsilon falls linearly from --start-e to --end-e"""


ENV_IDS = ("GridWorld-v0", "FrozenLake-misc")
MAX_CELLS = 1024
# The float hyperparameters, which change no array shape nor loop length, and the rule of each:
# several values sweep their grid, and train() takes them as traced values, not constants.
UNIT, POSITIVE_UNIT = ("in [0, 1]", lambda x: 0 <= x <= 1), ("in (0, 1]", lambda x: 0 < x <= 1)
HPARAMS = dict(learning_rate=POSITIVE_UNIT, gamma=("in [0, 1)", lambda x: 0 <= x < 1),
               start_e=UNIT, end_e=UNIT)


class ArgError(ValueError):
    """A flag broke a rule: reported as one line with exit status 2, before anything compiles."""


def grid(args: Args) -> list:
    """Every combination of the HPARAMS values (the first flag varies slowest)."""
    return [dict(zip(HPARAMS, values))
            for values in itertools.product(*(getattr(args, k) for k in HPARAMS))]


def check_one_value_flags(argv):
    """tyro would read `--num-agents 4 8` as an unknown option "8": name the flag instead."""
    one_value = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(Args)
                 if "tuple" not in str(f.type) and f.type is not bool}
    for i, flag in enumerate(argv):
        values = list(itertools.takewhile(lambda v: not v.startswith("--"), argv[i + 1:]))
        if flag in one_value and len(values) > 1:
            raise ArgError(f"{flag} takes one value: it sets array shapes or loop lengths")


def validate(args: Args) -> Args:
    """Check every flag before anything is compiled."""
    if args.env_id not in ENV_IDS:
        raise ArgError(f"--env-id {args.env_id!r} is not one of {', '.join(ENV_IDS)}")
    counts = ("num_seeds", "num_agents", "num_steps", "total_timesteps", "max_episode_steps",
              "num_segments")
    rules = {**dict.fromkeys(counts, (">= 1", lambda x: x is None or x >= 1)), **HPARAMS,
             "slip": UNIT, "exploration_fraction": POSITIVE_UNIT}
    for name, (rule, holds) in rules.items():
        for x in np.atleast_1d(getattr(args, name)):
            if not holds(x):
                raise ArgError(f"--{name.replace('_', '-')} must be {rule} (got {x})")
    if args.total_timesteps < args.num_steps:
        raise ArgError(f"--total-timesteps {args.total_timesteps} is less than one update "
                       f"(--num-steps {args.num_steps})")
    args = dataclasses.replace(args, num_segments=args.num_segments or max(10, -(
        -args.total_timesteps * args.num_agents * args.num_seeds * len(grid(args)) // 2**31)))
    if args.env_id == "FrozenLake-misc":
        return args
    rows, cols = args.grid_size
    if rows < 1 or cols < 1 or not 2 <= rows * cols <= MAX_CELLS:
        raise ArgError(f"--grid-size {rows} {cols} must have 2 to {MAX_CELLS} cells (the exact "
                       f"model P[s, a, s'] is a dense array)")
    for flag, cell in [("--start", args.start), ("--goal", args.goal)] + [
            ("--walls cell", wall) for wall in args.walls]:
        if not (0 <= cell[0] < rows and 0 <= cell[1] < cols):
            raise ArgError(f"{flag} {cell[0]} {cell[1]} is outside the {rows}x{cols} grid")
        if flag != "--walls cell" and tuple(cell) in map(tuple, args.walls):
            raise ArgError(f"{flag} {cell[0]} {cell[1]} is a wall (see --walls)")
    if tuple(args.start) == tuple(args.goal):
        raise ArgError("--goal must differ from --start")
    model = gridworld_env(args).model
    if not (model_reachable(model) & model.terminal).any():
        raise ArgError(f"--goal {args.goal[0]} {args.goal[1]} cannot be reached from --start "
                       f"{args.start[0]} {args.start[1]}: the walls cut every path")
    return args


# ============================================================================ 2. environment
# Both environments are tabular: a state is an integer index. Each exposes its exact model, from
# which value iteration below computes Q*; training uses only the batched `reset` and `step`.

class TabularModel(NamedTuple):
    """The exact MDP: P[s, a, s'] transition probabilities, R[s, a] expected reward, terminal[s]."""
    P: np.ndarray
    R: np.ndarray
    terminal: np.ndarray
    start: int


class TabularEnv(NamedTuple):
    """What training needs from an environment, every function batched over the agents."""
    reset: Callable  # (key, n) -> (obs [n], state)
    step: Callable   # (key, state, action [n]) -> (obs, state, reward, term., trunc., final_obs)
    model: TabularModel
    shape: tuple     # (rows, cols): how the states lie on a grid, for the heat map


MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # GridWorld's actions 0..3: up, right, down, left
LAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # FrozenLake's actions 0..3: left, down, right, up


def tabular_model(next_cell, mix, reward, terminal, start: int) -> TabularModel:
    """The MDP of a grid where the chosen action a makes move b with probability mix[a, b], move b
    leads from s to next_cell[s, b], and arriving at s' pays reward[s']; terminal states end it."""
    S = len(next_cell)
    P = mix @ np.eye(S)[next_cell]  # [A, B] @ [S, B, S']: P[s, a, s']
    P[terminal] = np.eye(S)[terminal][:, None, :]  # stay put: Q* is 0 where episodes end
    return TabularModel(P, P @ reward * ~terminal[:, None], terminal, start)


def grid_moves(rows: int, cols: int, moves, walls=()) -> np.ndarray:
    """next_cell [S, A] of a grid: the cell that each (row, column) move leads to from each cell;
    a move off the grid or into a wall stays put."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    dr, dc = np.array(moves).T
    cell = np.clip(r[:, None] + dr, 0, rows - 1) * cols + np.clip(c[:, None] + dc, 0, cols - 1)
    return np.where(np.isin(cell, walls), np.arange(rows * cols)[:, None], cell).astype(np.int32)


# ---------------------------------------------------------------- GridWorld, as pure functions
class GridState(NamedTuple):
    cell: jax.Array  # int32 cell index: row * cols + col
    time: jax.Array  # steps since the last reset


def gridworld_env(args: Args) -> TabularEnv:
    """The GridWorld of the flags, static: its layout is baked into the compiled program."""
    index = lambda cell: int(np.ravel_multi_index(cell, args.grid_size))
    start, goal, slip = index(args.start), index(args.goal), float(args.slip)
    next_cell = grid_moves(*args.grid_size, MOVES, [index(w) for w in args.walls])
    terminal = np.arange(len(next_cell)) == goal  # and the goal alone pays 1
    mix = (1.0 - slip) * np.eye(len(MOVES)) + slip / len(MOVES)  # or a random move
    model = tabular_model(next_cell, mix, terminal.astype(float), terminal, start)

    def reset(key, n):
        state = GridState(jnp.full(n, start, jnp.int32), jnp.zeros(n, jnp.int32))
        return state.cell, state

    def step(key, state, action):
        """One step of every GridWorld, reset at the goal or the time limit. With probability slip
        (u < slip, one uniform u per env) the move goes in a random direction instead, and given
        that, u / slip is uniform on [0, 1) and picks it."""
        if slip > 0:
            u = jax.random.uniform(key, action.shape)
            random_move = (u / slip * len(MOVES)).astype(jnp.int32)
            action = jnp.where(u < slip, jnp.minimum(random_move, len(MOVES) - 1), action)
        cell = jnp.asarray(next_cell)[state.cell, action]  # final_obs, before any reset
        time = state.time + 1
        terminated = cell == goal
        truncated = time >= args.max_episode_steps
        done = terminated | truncated
        state = GridState(jnp.where(done, start, cell), jnp.where(done, 0, time))
        return state.cell, state, terminated.astype(jnp.float32), terminated, truncated, cell

    return TabularEnv(reset, step, model, tuple(args.grid_size))


# ---------------------------------------------------------------- gymnax FrozenLake-misc
def frozen_lake_env(args: Args) -> TabularEnv:
    import gymnax  # here, not at the top: importing it takes seconds, and only this env needs it

    env, params = gymnax.make("FrozenLake-misc")
    params = params.replace(max_steps_in_episode=args.max_episode_steps)

    def reset(key, n):  # the observation is the cell index
        return jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)

    def step(key, state, action):
        keys = jax.random.split(key, action.shape[0])
        obs, state, reward, terminated, truncated, info = jax.vmap(
            env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)
        return obs, state, reward, terminated, truncated, info["final_observation"]

    # The exact model of gymnax's dynamics: the chosen direction with probability success_rate,
    # else one of the two perpendicular ones; holes and the goal end the episode.
    tiles = np.asarray(env.desc).ravel()  # 0 start, 1 frozen, 2 hole, 3 goal
    sure = env.success_rate if env.is_slippery else 1.0
    turns = np.roll(np.eye(4), 1, axis=1) + np.roll(np.eye(4), -1, axis=1)  # action a -> a -/+ 1
    schedule = np.asarray(env.reward_schedule, np.float64)  # goal, hole, frozen (and start)
    model = tabular_model(grid_moves(env.nrow, env.ncol, LAKE_MOVES),
                          sure * np.eye(4) + (1 - sure) / 2 * turns,
                          schedule[np.select([tiles == 3, tiles == 2], [0, 1], 2)],
                          np.isin(tiles, (2, 3)), int(np.argmax(tiles == 0)))
    return TabularEnv(reset, step, model, (env.nrow, env.ncol))


def make_env(args: Args) -> TabularEnv:
    return frozen_lake_env(args) if args.env_id == "FrozenLake-misc" else gridworld_env(args)


# ---------------------------------------------------------------- exact solution
def model_reachable(model: TabularModel):
    """Bool [S]: the states some policy can reach from the start; episodes stop at terminals."""
    steps = (model.P.sum(1) > 0) & ~model.terminal[:, None]  # [S, S']: some action leads there
    order = breadth_first_order(steps.astype(float), model.start, return_predecessors=False)
    return np.isin(np.arange(len(model.R)), order)


def value_iteration(P, R, terminal, gamma, tol=1e-7, max_iters=100_000):
    """Q* of a tabular MDP: repeat Q <- R + gamma * P max_a' Q (terminal states worth 0) until no
    entry moves by more than `tol` (then |Q - Q*| <= gamma * tol / (1 - gamma))."""
    P, R = jnp.asarray(P, jnp.float32), jnp.asarray(R, jnp.float32)

    def improve(carry):
        q, _, i = carry
        q_new = R + gamma * P @ jnp.where(terminal, 0.0, q.max(-1))
        return q_new, jnp.abs(q_new - q).max(), i + 1

    return jax.lax.while_loop(lambda c: (c[1] > tol) & (c[2] < max_iters), improve,
                              (jnp.zeros_like(R), jnp.float32(jnp.inf), 0))[0]


# ============================================================================ 3. Q-table and policy
# This file's "network": a table q [num_states, num_actions] per agent, read by the epsilon-greedy
# policy and written by the Q-learning update, pure functions of one agent that training vmaps.

def epsilon_greedy(q_row, epsilon, u):
    """Action of one agent from its Q-values q_row [A] and one uniform u ~ U[0, 1): u < epsilon
    explores (a uniformly random action), else greedy with ties broken at random (argmax alone
    would always pick action 0 while Q is all zeros). One number serves both draws: given the side
    of epsilon it fell on, the rescaled u is again uniform on [0, 1) and picks a candidate."""
    explore = u < epsilon
    candidates = explore | (q_row == q_row.max())
    u_pick = jnp.where(explore, u / epsilon, (u - epsilon) / (1.0 - epsilon))
    count = candidates.sum()
    k = jnp.minimum((u_pick * count).astype(jnp.int32), count - 1)
    return jnp.argmax(candidates & (jnp.cumsum(candidates) - 1 == k))


def q_update(q, s, a, reward, terminated, s_next, learning_rate, gamma):
    """Watkins' update of one agent's table q [S, A] after the step (s, a, reward, s_next), with no
    bootstrap from a terminal s_next (a truncated episode does bootstrap): (new q, TD error)."""
    target = reward + gamma * jnp.where(terminated, 0.0, q[s_next].max())
    td_error = target - q[s][a]  # q[s], not q[s, a]: the same row the policy read (XLA shares it)
    return q.at[s, a].add(learning_rate * td_error), td_error


# ============================================================================ 4. training
class Agents(NamedTuple):
    """The N agents of one seed: every leaf has a leading [N] axis."""
    q: jax.Array               # [N, S, A] Q-tables
    visited: jax.Array         # [N, S, A] bool: has the agent taken action a in state s
    env_state: object          # their environments
    obs: jax.Array             # [N] current states
    episode_return: jax.Array  # [N] undiscounted return of the running episode
    episode_length: jax.Array  # [N]


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    agents: Agents
    key: jax.Array
    q_star: jax.Array          # [S, A] by value iteration with this run's gamma
    update: jax.Array          # updates done so far


OPTIMAL_TOL = 1e-5  # Q* is in float32: actions within this of the best count as optimal
# Agents are independent, so an update steps them block by block, and a block's tables stay in
# the core's cache through all of its steps (65536 agents: 2.1x faster than all at once).
BLOCK_BYTES = 512 * 1024


def block_size(num_agents: int, bytes_per_agent: int) -> int:
    """Agents per block: the largest divisor of num_agents whose tables fit in BLOCK_BYTES, or all
    of them at once when no divisor comes near that (a prime number of agents, say)."""
    target = min(num_agents, max(1, BLOCK_BYTES // bytes_per_agent))
    size = max(d for d in range(1, target + 1) if num_agents % d == 0)
    return size if 4 * size >= target else num_agents


def make_train(args: Args):
    """train(key, hp) -> (final RunnerState, metrics [num_updates]): one run, its HPARAMS values
    hp as traced scalars, in one program; the command line runs it in pieces: train.init(key, hp),
    then train.advance(hp, runner, length, valid) -> (runner, metrics [length]) repeatedly. One
    agent runs ~9x slower unless this module was imported before JAX's first operation (see the
    small-loop setting under the imports) or XLA_FLAGS sets it."""
    env = make_env(args)
    model = env.model
    N = args.num_agents
    num_updates = args.total_timesteps // args.num_steps
    num_blocks = N // block_size(N, model.R.size * 5)  # [S, A] float32 q and bool visited
    scored = jnp.asarray(model_reachable(model) & ~model.terminal)  # where greedy_optimal looks

    # The per-agent functions of section 3, vmapped over the agents (schedules are shared).
    policy = jax.vmap(lambda q, s, eps, u: epsilon_greedy(q[s], eps, u), in_axes=(0, 0, None, 0))
    update = jax.vmap(q_update, in_axes=(0, 0, 0, 0, 0, 0, None, None))
    mark_visited = jax.vmap(lambda visited, s, a: visited.at[s, a].set(True))

    def env_step(hp, carry, t):
        """One step of a block of agents: act, step the environments, learn."""
        agents, totals, key = carry
        key, k_act, k_env = jax.random.split(key, 3)
        t = t.astype(jnp.float32)
        epsilon = hp["start_e"] + (hp["end_e"] - hp["start_e"]) * jnp.minimum(
            t / (args.exploration_fraction * args.total_timesteps), 1)
        lr = hp["learning_rate"] * (1 - t / args.total_timesteps if args.anneal_lr else 1)
        u = jax.random.uniform(k_act, agents.obs.shape)
        action = policy(agents.q, agents.obs, epsilon, u)
        obs, env_state, reward, terminated, truncated, final_obs = env.step(
            k_env, agents.env_state, action)
        q, td_error = update(agents.q, agents.obs, action, reward, terminated, final_obs, lr,
                             hp["gamma"])
        episode_return = agents.episode_return + reward
        episode_length = agents.episode_length + 1
        done = terminated | truncated
        # Per-agent sums over the update (episodes finished, their returns and lengths, |TD|).
        totals = jax.tree.map(jnp.add, totals, (done, jnp.where(done, episode_return, 0.0),
                                                jnp.where(done, episode_length, 0),
                                                jnp.abs(td_error)))
        agents = Agents(q, mark_visited(agents.visited, agents.obs, action), env_state, obs,
                        jnp.where(done, 0.0, episode_return), jnp.where(done, 0, episode_length))
        return (agents, totals, key), None

    def run_block(hp, t0, block):
        """All the steps of an update for one block of agents, from step t0 (of each agent)."""
        agents, key = block
        n = agents.obs.shape[0]
        totals = (jnp.zeros(n, jnp.int32), jnp.zeros(n), jnp.zeros(n, jnp.int32), jnp.zeros(n))
        (agents, totals, _), _ = jax.lax.scan(partial(env_step, hp), (agents, totals, key),
                                              t0 + jnp.arange(args.num_steps))
        return t0, (agents, totals)

    def update_step(hp, runner: RunnerState):
        key, *block_keys = jax.random.split(runner.key, num_blocks + 1)
        blocks = jax.tree.map(lambda x: x.reshape(num_blocks, N // num_blocks, *x.shape[1:]),
                              runner.agents)
        _, (blocks, totals) = jax.lax.scan(partial(run_block, hp), runner.update * args.num_steps,
                                           (blocks, jnp.stack(block_keys)))
        agents = jax.tree.map(lambda x: x.reshape(N, *x.shape[2:]), blocks)
        runner = runner._replace(agents=agents, key=key, update=runner.update + 1)
        optimal = runner.q_star >= runner.q_star.max(-1, keepdims=True) - OPTIMAL_TOL  # [S, A]
        count, return_sum, length_sum, td_sum = (x.sum() for x in totals)
        visited_error = jnp.where(agents.visited, jnp.abs(agents.q - runner.q_star), 0.0)
        greedy = agents.q == agents.q.max(-1, keepdims=True)  # [N, S, A]
        correct = ~(greedy & ~optimal).any(-1) & scored  # [N, S]: every greedy action is optimal
        metrics = {  # env_steps in float32: all agents' steps overflow int32 past 2^31
            "env_steps": runner.update.astype(jnp.float32) * (args.num_steps * N),
            "episode_return": jnp.where(count > 0, return_sum / count, jnp.nan),
            "episode_length": jnp.where(count > 0, length_sum / count, jnp.nan),
            "stats/td_error": td_sum / (args.num_steps * N),
            "stats/q_error": visited_error.max(axis=(1, 2)).mean(),
            "stats/greedy_optimal": (correct.sum(-1) / scored.sum()).mean(),
        }
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_env, k_run = jax.random.split(key)
        obs, env_state = env.reset(k_env, N)
        agents = Agents(jnp.zeros((N, *model.R.shape)), jnp.zeros((N, *model.R.shape), bool),
                        env_state, obs, jnp.zeros(N), jnp.zeros(N, jnp.int32))
        q_star = value_iteration(model.P, model.R, model.terminal, hp["gamma"])
        return RunnerState(agents, k_run, q_star, jnp.int32(0))

    def advance(hp, runner: RunnerState, length: int, valid):
        """`length` updates, of which only the first `valid` (traced) run: the last, shorter
        segment of a run is then the same program as the others (a branch not taken costs
        nothing; its metrics rows are dropped)."""
        step = partial(update_step, hp)
        skip = lambda runner: (runner, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                                                    jax.eval_shape(step, runner)[1]))
        return jax.lax.scan(lambda runner, i: jax.lax.cond(i < valid, step, skip, runner),
                            runner, jnp.arange(length))

    def train(key, hp):
        return advance(hp, init(key, hp), num_updates, num_updates)

    train.init, train.advance, train.num_updates = init, advance, num_updates
    return train


# ============================================================================ 5. seed sweep
# XLA:CPU hands the small reductions of the step (max over 4 actions of [agents, 4]) to YNNPACK;
# for this loop XLA's own code is faster (1.2x at 8192 agents on 2 cores). GPUs ignore it.
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


CACHE_HITS = []  # of the persistent cache: counted around a compile, to say where it came from
jax.monitoring.register_event_listener(lambda e, **_: e.endswith("hits") and CACHE_HITS.append(e))


JOIN_TIMEOUT_S = 60  # --distributed: a process that has not joined the others by then fails


def meet(args: Args):
    """Before JAX joins the processes (it would abort one whose peers never come, with no word of
    why), process 0 waits at the coordinator address until every other process has knocked, and
    they knock until it answers. After JOIN_TIMEOUT_S, a one-line error."""
    host, _, port = args.coordinator_address.rpartition(":")
    deadline, joined = time.time() + JOIN_TIMEOUT_S, 0
    try:
        if args.process_id == 0:
            with socket.create_server(("", int(port))) as server:
                server.settimeout(JOIN_TIMEOUT_S)
                for joined in range(args.num_processes - 1):
                    server.accept()[0].close()
        while args.process_id:  # the others knock until process 0 answers
            with socket.socket() as knock:
                if knock.connect_ex((host, int(port))) == 0:
                    break
            if time.time() > deadline:
                raise OSError(f"nothing answered within {JOIN_TIMEOUT_S} s")
            time.sleep(1)
    except TimeoutError:
        raise ArgError(f"--coordinator-address {args.coordinator_address}: {joined} of the "
                       f"{args.num_processes - 1} other processes joined within "
                       f"{JOIN_TIMEOUT_S} s") from None
    except (OSError, ValueError) as e:
        raise ArgError(f"--coordinator-address {args.coordinator_address}: {e}") from None


def start_processes(args: Args):
    """--distributed (implied by its three flags): join the other processes (jax.distributed) and
    check that the runs split evenly over them. Without an address JAX detects the cluster."""
    if not (args.distributed or args.coordinator_address or args.num_processes
            or args.process_id is not None):
        return
    if args.coordinator_address and 0 <= (args.process_id or 0) < (args.num_processes or 0):
        meet(args)  # (an id out of range, or no count: JAX's own immediate error below)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # collectives on CPU
    jax.extend.backend.clear_backends()  # started by the checks (gymnax): JAX must join first
    try:
        jax.distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                                   initialization_timeout=JOIN_TIMEOUT_S)
    except ValueError as e:  # JAX's own checks: no address or count given or found, id range
        raise ArgError(f"--distributed: {e}") from None
    runs, processes = len(grid(args)) * args.num_seeds, jax.process_count()
    if runs % processes:
        raise ArgError(f"{runs} runs (configurations x seeds) do not split over {processes} "
                       "processes")


def segments(args: Args, num_devices: Optional[int] = None, start=None):
    """Train each configuration of grid(args) on args.num_seeds seeds: pmap over the largest
    number of local devices (at most num_devices) that divides this process's runs x vmap on
    each device, in args.num_segments calls of one compiled program (the runner state stays on
    the devices). With --distributed each process trains its contiguous share of the runs.

    Seed k gets the k-th split of PRNGKey(args.seed) in every configuration, whatever the layout.
    Yields (state, metrics, timing) after each segment, state and metrics as numpy [runs, ...]
    leaves (every process's runs, configuration-major; metrics [runs, updates so far]).
    start: the (state, metrics) of a checkpoint, whose run this continues."""
    configs, seeds = grid(args), args.num_seeds
    runs = len(configs) * seeds
    share = runs // jax.process_count()  # this process's runs (all of them without --distributed)
    mine = slice(jax.process_index() * share, (jax.process_index() + 1) * share)
    limit = num_devices or jax.local_device_count()
    devices = jax.local_devices()[: max(d for d in range(1, limit + 1) if share % d == 0)]
    keys = jnp.tile(jax.random.split(jax.random.PRNGKey(args.seed), seeds), (len(configs), 1))
    hp = {k: jnp.repeat(jnp.array([c[k] for c in configs], jnp.float32), seeds) for k in HPARAMS}
    layout = lambda x: x[mine].reshape(len(devices), share // len(devices), *x.shape[1:])
    # Every process's share, in process order, as numpy arrays (process 0 alone writes them).
    gather = lambda tree: multihost_utils.process_allgather(
        jax.tree.map(lambda x: x.reshape(share, *x.shape[2:]), tree), tiled=True)
    keys, hp = jax.tree.map(layout, (keys, hp))
    train = make_train(args)
    length = -(-train.num_updates // args.num_segments)  # the last segment may run fewer
    init = jax.pmap(jax.vmap(train.init), devices=devices)
    advance = jax.pmap(jax.vmap(lambda hp, runner, valid: train.advance(hp, runner, length, valid),
                                in_axes=(0, 0, None)), devices=devices, donate_argnums=1)
    t0, hits = time.perf_counter(), len(CACHE_HITS)  # a hit from here on is training's
    if start is None:
        runner, metrics = init.lower(keys, hp).compile(COMPILER_OPTIONS)(keys, hp), None
    else:  # the checkpoint's leaves are [runs, ...]: the structure comes from init's
        state, metrics = start
        runner = jax.tree.map(layout, flax.serialization.from_state_dict(
            jax.eval_shape(init, keys, hp), state))
    # `valid` goes to each device (a broadcast argument fails to lower across processes).
    per_device = lambda valid: np.full(len(devices), valid, np.int32)
    advance = advance.lower(hp, runner, per_device(length)).compile(COMPILER_OPTIONS)
    compile_s, cached = time.perf_counter() - t0, len(CACHE_HITS) > hits
    done, t_start = 0 if metrics is None else metrics["env_steps"].shape[1], time.perf_counter()
    valid = lambda first: min(length, train.num_updates - first)
    out = advance(hp, runner, per_device(valid(done)))
    for first in range(done, train.num_updates, length):
        state, new = gather(out)  # (this waits for the segment)
        if first + length < train.num_updates:  # the next one runs while the host writes this one
            out = advance(hp, out[0], per_device(valid(first + length)))
        new = jax.tree.map(lambda x: x[:, :valid(first)], new)
        metrics = new if metrics is None else jax.tree.map(
            lambda a, b: np.concatenate([a, b], axis=1), metrics, new)
        run_s = time.perf_counter() - t_start
        yield state, metrics, {
            "compile_s": compile_s, "run_s": run_s, "cached": cached,
            "devices": len(devices) * jax.process_count(),
            "sps": runs * (first + valid(first) - done) * args.num_steps * args.num_agents / run_s}


def run(args: Args, num_devices: Optional[int] = None):
    """The whole sweep of segments(): (final runner state, metrics, timing), every leaf with a
    leading [num_seeds] axis, or [num_configs, num_seeds] for a sweep of several configurations."""
    *_, (state, metrics, timing) = segments(args, num_devices)
    lead = (len(grid(args)), args.num_seeds) if len(grid(args)) > 1 else (args.num_seeds,)
    return *jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), (state, metrics)), timing


# ============================================================================ 6. logging and output
def progress(args: Args, metrics, timing) -> str:
    """The line printed after each segment: the last update of every run, averaged."""
    last = {k: v[:, -1] for k, v in metrics.items()}
    returns = last["episode_return"][np.isfinite(last["episode_return"])]
    line = f"return {np.mean(returns):6.3f}" if len(returns) else "no episode finished yet"
    runs = "seeds" if len(metrics["env_steps"]) == args.num_seeds else "runs"
    return (f"[{args.exp_name}] steps {metrics['env_steps'][0, -1]:>12,.0f} / "
            f"{args.total_timesteps * args.num_agents:,}  {line}  greedy optimal "
            f"{np.mean(last['stats/greedy_optimal']):6.1%}  q_error "
            f"{np.mean(last['stats/q_error']):.2e} (mean of {len(metrics['env_steps'])} {runs})"
            f"  SPS {timing['sps']:,.0f}")


def config_dirs(run_dir, args: Args) -> list:
    """(arguments, directory) of each configuration: the run directory, or in a sweep one
    sub-directory per configuration, named by its values of the swept flags."""
    return [(dataclasses.replace(args, **{k: (v,) for k, v in config.items()}), os.path.join(
        run_dir, "__".join(f"{k}={v:g}" for k, v in config.items() if len(getattr(args, k)) > 1)))
        for config in grid(args)]


class Tensorboard:
    """Event files written with the tensorboard package alone (no torch, no tensorflow), one per
    run (seed_k), appended after each segment: `tensorboard --logdir` shows the run live."""
    TAGS = {"episode_return": "charts/episodic_return", "episode_length": "charts/episodic_length"}

    def __init__(self, run_dir, args: Args, done):  # done: the env_steps already written
        name = f"events.out.tfevents.{time.time():010.0f}.{socket.gethostname()}.{os.getpid()}"
        self.paths, self.written = [], done.shape[1]
        for one, config_dir in config_dirs(run_dir, args):
            table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(one).items())
            # A resumed run starts a new file, whose START event makes TensorBoard drop what the
            # stopped run wrote after its checkpoint: no step appears twice.
            first = Event(step=int(done[0, -1]) + 1, session_log=SessionLog(
                status=SessionLog.START)) if done.size else Event(
                summary=text_pb("hyperparameters", table))
            for k in range(args.num_seeds):
                self.paths.append(os.path.join(config_dir, f"seed_{k}", name))
                os.makedirs(os.path.dirname(self.paths[-1]), exist_ok=True)
                self.append(self.paths[-1], [Event(file_version="brain.Event:2"), first])

    @staticmethod
    def append(path, events):
        with open(path, "ab") as f:
            for event in events:
                event.wall_time = time.time()
                RecordWriter(f).write(event.SerializeToString())

    def write(self, metrics, sps):
        """Append the updates of `metrics` ([runs, updates so far]) not written yet."""
        new = {k: v[:, self.written:] for k, v in metrics.items()}
        self.written, steps = metrics["env_steps"].shape[1], new.pop("env_steps")
        scalar = lambda tag, value, step: Event(step=int(step), summary=Summary(value=[
            Summary.Value(tag=self.TAGS.get(tag, tag.replace("loss/", "losses/")),
                          simple_value=float(value))]))
        for r, path in enumerate(self.paths):
            self.append(path, [scalar(k, v[r, i], step) for i, step in enumerate(steps[r])
                               for k, v in new.items() if np.isfinite(v[r, i])]
                        + [scalar("charts/SPS", sps, steps[r, -1])])


def write_atomic(path, data: bytes):
    """Write beside `path`, then rename: a reader, or a crash, sees the old file or the new one."""
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
        f.write(data)
        os.fsync(f.fileno())
    os.replace(f.name, path)


def write_checkpoint(run_dir, args: Args, state: RunnerState, metrics):
    """run_dir/checkpoint.msgpack: the arguments, every run's RunnerState and the metrics so far,
    behind their SHA-256. flax.serialization, as for models: orbax's asynchronous, sharded
    machinery buys nothing for a file of a few MB written between segments."""
    data = flax.serialization.msgpack_serialize({
        "args": json.dumps(dataclasses.asdict(args)), "metrics": metrics,
        "state": flax.serialization.to_state_dict(state)})
    write_atomic(os.path.join(run_dir, "checkpoint.msgpack"), hashlib.sha256(data).digest() + data)


# Flags a resumed run may change: they do not change what it computes.
RESUME_MAY_CHANGE = ("track", "log_dir", "exp_name", "save_model", "plot", "compile_cache_dir",
                     "resume", "distributed", "coordinator_address", "num_processes", "process_id")


def read_checkpoint(args: Args, argv) -> tuple:
    """(arguments, checkpoint) of the run that --resume continues: the checkpoint's arguments,
    where a flag typed on the command line may change only what does not change the results."""
    try:
        with open(os.path.join(args.resume, "checkpoint.msgpack"), "rb") as f:
            digest, data = f.read(32), f.read()
        if hashlib.sha256(data).digest() != digest:
            raise ValueError("its checksum does not match: the file is damaged")
        checkpoint = flax.serialization.msgpack_restore(data)
    except (OSError, ValueError) as e:
        raise ArgError(f"--resume {args.resume}: no usable checkpoint ({e})") from None
    saved, typed = json.loads(checkpoint["args"]), {a.split("=")[0] for a in argv}
    for k, v in saved.items():
        if (k not in RESUME_MAY_CHANGE and "--" + k.replace("_", "-") in typed
                and json.loads(json.dumps(getattr(args, k))) != v):
            raise ArgError(f"--{k.replace('_', '-')} differs from the checkpoint's {v}: --resume "
                           "continues the run as it was started")
    steps = checkpoint["metrics"]["env_steps"]
    if steps[0, -1] / saved["num_agents"] + saved["num_steps"] > saved["total_timesteps"]:
        raise ArgError(f"--resume {args.resume}: that run is finished (no whole update left)")
    return dataclasses.replace(args, **{
        k: tuple(map(tuple, v)) if k == "walls" else tuple(v) if isinstance(v, list) else v
        for k, v in saved.items() if k not in RESUME_MAY_CHANGE}), checkpoint


def save_model(model_dir, args: Args, state: RunnerState):
    """Atomically write every seed's and agent's Q-table and visited pairs to model.msgpack."""
    payload = {"args": json.dumps(dataclasses.asdict(args)),
               "q": state.agents.q,  # [num_seeds, num_agents, num_states, num_actions]
               "visited": state.agents.visited}
    os.makedirs(model_dir, exist_ok=True)
    write_atomic(os.path.join(model_dir, "model.msgpack"),
                 flax.serialization.msgpack_serialize(payload))
    return os.path.join(model_dir, "model.msgpack")


def plot_q_values(run_dir, args: Args, state: RunnerState):
    """Heat maps of max_a Q per cell (seed 0, agent 0) beside max_a Q*, with arrows for the greedy
    actions, S the start and T the terminal cells; walls and unreachable cells are blank."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure to close

    env = make_env(args)
    model = env.model
    shown = model_reachable(model)
    moves = MOVES if args.env_id == "GridWorld-v0" else LAKE_MOVES
    fig = Figure(figsize=(10, 4.5))
    axes = fig.subplots(1, 2)
    q, q_star = state.agents.q[0, 0], state.q_star[0]  # [S, A] each
    for ax, table, title in [(axes[0], q, "learned max_a Q (seed 0, agent 0)"),
                             (axes[1], q_star, "optimal max_a Q* (value iteration)")]:
        values = np.where(shown, table.max(-1), np.nan).reshape(env.shape)
        image = ax.imshow(values, cmap="viridis", vmin=0, vmax=max(q_star.max(), 1e-9))
        for s in np.nonzero(shown & ~model.terminal)[0]:
            r, c = divmod(int(s), env.shape[1])
            dr, dc = moves[int(np.argmax(table[s]))]
            ax.arrow(c - 0.25 * dc, r - 0.25 * dr, 0.3 * dc, 0.3 * dr, head_width=0.12,
                     color="white", length_includes_head=True)
        for s, label in [(model.start, "S")] + [(s, "T") for s in np.nonzero(model.terminal)[0]]:
            r, c = divmod(int(s), env.shape[1])
            ax.text(c + 0.3, r - 0.25, label, color="white", ha="center", va="center")
        ax.set(title=title, xticks=[], yticks=[])
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.suptitle(f"{args.env_id}: greedy actions (arrows) and state values")
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "q_values.png")
    fig.savefig(path, dpi=100)
    return path


def summary(args: Args, metrics, timing) -> str:
    """metrics: leaves [num_configs, num_seeds, num_updates]; a sweep prints one row per
    configuration, best final greedy_optimal first."""
    configs = grid(args)
    returns = metrics["episode_return"]  # final: the mean over the last 5% of updates
    finals = np.nanmean(returns[..., -max(1, round(returns.shape[-1] * 0.05)):], axis=-1)
    optimal, errors = metrics["stats/greedy_optimal"][..., -1], metrics["stats/q_error"][..., -1]
    sweep = f"{len(configs)} configurations x " if len(configs) > 1 else ""
    lines = [f"{args.exp_name} on {args.env_id}: {sweep}{args.num_seeds} seeds x "
             f"{args.num_agents} agents x {args.total_timesteps:,} steps ({args.num_steps} steps "
             "per update)"]
    timing_line = (f"{timing['devices']} device(s)  compile {timing['compile_s']:.1f} s"
                   f"{' (cache)' if timing['cached'] else ''}  run {timing['run_s']:.1f} s  |  "
                   f"{timing['sps']:,.0f} agent-steps/s")
    if len(configs) == 1:
        per_seed = [("final return per seed (last 5% of updates): ", finals, "{:.3f}"),
                    ("greedy optimal per seed (mean over agents): ", optimal, "{:.1%}"),
                    ("q_error per seed (mean over agents):        ", errors, "{:.2e}")]
        lines += [label + " ".join(map(form.format, x[0])) for label, x, form in per_seed]
        return "\n".join(lines + [f"mean return {np.mean(finals):.3f}  |  {timing_line}"])
    varied = [k for k in HPARAMS if len(getattr(args, k)) > 1]
    rng = np.random.default_rng(0)
    lines.append(" | ".join(varied + ["final return mean [95% CI over seeds]", "IQM", "worst",
                                      "greedy optimal", "q_error"]))
    for c in np.lexsort((-finals.mean(1), -optimal.mean(1))):
        x = finals[c]  # this configuration's seeds: bootstrap their mean
        ci = np.percentile(x[rng.integers(0, len(x), (2000, len(x)))].mean(1), [2.5, 97.5])
        lines.append(" | ".join([f"{configs[c][k]:g}" for k in varied] + [
            f"{x.mean():.3f} [{ci[0]:.3f}, {ci[1]:.3f}]", f"{trim_mean(x, 0.25):.3f}",
            f"{x.min():.3f}", f"{optimal[c].mean():.1%}", f"{errors[c].mean():.2e}"]))
    return "\n".join(lines + [timing_line])


# ============================================================================ 7. main
STOP = []  # Ctrl-C was pressed: the run stops at the end of the current segment


def stop_after_segment(signum, frame):
    """The first Ctrl-C lets the segment finish and write its checkpoint; the second, with the
    default handler back, stops at once."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    STOP.append(signum)
    print("\nstopping at the end of this segment (Ctrl-C again: at once)", file=sys.stderr)


def main():
    try:
        check_one_value_flags(sys.argv[1:])  # before tyro, which would blame the value
        args = validate(tyro.cli(Args, description=__doc__.split("\n\n")[0]))
        args, checkpoint = read_checkpoint(args, sys.argv[1:]) if args.resume else (args, None)
        start_processes(args)
        run_dir = args.resume or os.path.join(
            args.log_dir, f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}")
        writer = jax.process_index() == 0  # --distributed: process 0 alone writes and prints
        if writer:
            os.makedirs(run_dir, exist_ok=True)  # before anything compiles: --log-dir must work
    except (ArgError, OSError) as e:
        print(f"error: {e if isinstance(e, ArgError) else f'--log-dir: {e}'}", file=sys.stderr)
        sys.exit(2)
    compilation_cache.set_cache_dir(args.compile_cache_dir or None)  # read at the first compile
    signal.signal(signal.SIGINT, stop_after_segment)
    start = checkpoint and (checkpoint["state"], checkpoint["metrics"])
    board = writer and args.track and Tensorboard(
        run_dir, args, start[1]["env_steps"] if start else np.zeros((1, 0)))
    for state, metrics, timing in segments(args, start=start):
        if board:
            board.write(metrics, timing["sps"])
        if writer:
            write_checkpoint(run_dir, args, state, metrics)
            print(progress(args, metrics, timing), flush=True)
        # Every process stops after the same segment: the others would wait for it forever.
        if multihost_utils.process_allgather(np.int32(len(STOP))).any():
            if writer:
                print(f"stopped with a checkpoint; continue with: python {sys.argv[0]} --resume "
                      f"{run_dir}", flush=True)
            sys.exit(130)
    if not writer:
        return
    pick = lambda tree, c: jax.tree.map(lambda x: x[c * args.num_seeds:][:args.num_seeds], tree)
    for c, (one, config_dir) in enumerate(config_dirs(run_dir, args)):
        if args.save_model:
            print(f"saved {save_model(config_dir, one, pick(state, c))}")
        if args.plot:
            print(f"saved {plot_q_values(config_dir, one, pick(state, c))}")
    lead = (len(grid(args)), args.num_seeds)
    print(summary(args, jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), metrics), timing))


if __name__ == "__main__":
    main()
