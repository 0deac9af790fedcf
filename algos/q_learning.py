"""Tabular Q-learning for many independent agents at once, in one fully jitted JAX file.

Q-learning (Watkins 1989; Watkins & Dayan 1992, https://doi.org/10.1007/BF00992698) moves Q(s, a)
toward r + gamma * max_a' Q(s', a') after each step, with no bootstrap from a terminal s', acting
epsilon-greedily with random tie-breaks. `--num-agents N` agents, each with its own Q-table and env
(a GridWorld, or gymnax's FrozenLake-misc), take vmapped steps in a `lax.scan` in one `jax.jit`:
    python algos/q_learning.py                          # 6x6 maze, 4 seeds x 30 agents x 200k steps
    python algos/q_learning.py --slip 0.2 --plot        # slippery moves; PNG heat map of max Q
    python algos/q_learning.py --env-id FrozenLake-misc --num-agents 1024    # every flag: --help

Expect (defaults, RESULTS.md; Q* by value iteration): stats/greedy_optimal 1.0 (greedy actions
optimal in all reachable states), stats/q_error (max |Q - Q*| over visited pairs) ~1e-3 (rare
actions lag); --slip 0.2: ~98% (action gaps of 0.001), ~1e-2; FrozenLake-misc: 99-100%, ~0.07.
"""

# ============================================================================ imports
import dataclasses
import os
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from scipy.sparse.csgraph import breadth_first_order

# A step loop touching under 100 kB per iteration (one agent's) becomes one native loop, not an
# op launch per op (XLA:CPU's limit is 1 kB): ~3M steps/s, not 0.33M. Read when JAX starts.
if "xla_backend_extra_options" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_extra_options="
                               "xla_cpu_small_while_loop_byte_threshold=100000").strip()


# ============================================================================ 1. hyperparameters
@dataclasses.dataclass
class Hyperparams:
    env_id: str = "GridWorld-v0"
    """`GridWorld-v0` (the grid configured below) or `FrozenLake-misc` (gymnax's slippery lake)"""
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
    num_agents: int = 30
    """independent agents per seed, each with its own Q-table and its own environment"""
    total_timesteps: int = 200_000
    """environment steps per agent"""
    num_steps: int = 1_000
    """steps per agent per update; an update is one row of metrics (tensorboard, progress)"""
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


ENV_IDS, MAX_CELLS = ("GridWorld-v0", "FrozenLake-misc"), 1024
# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program)
UNIT = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1))
POSITIVE_UNIT = ("in (0, 1]", lambda x: (0 < x) & (x <= 1))
HPARAMS = dict(learning_rate=POSITIVE_UNIT, gamma=("in [0, 1)", lambda x: (0 <= x) & (x < 1)),
               start_e=UNIT, end_e=UNIT)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma",)
# The flags that set the memory a run needs (named when it does not fit).
SIZE_FLAGS = ("num_agents",)


# ============================================================================ 2. environment
# A state is an integer index; training uses only `reset` and `step`, value iteration the model.
class TabularModel(NamedTuple):  # the exact MDP
    P: np.ndarray         # [S, A, S'] transition probabilities
    R: np.ndarray         # [S, A] expected reward
    terminal: np.ndarray  # [S] bool
    start: int


class TabularEnv(NamedTuple):  # every function batched over the agents
    reset: Callable  # (key, n) -> (obs [n], state)
    step: Callable   # (keys [n], state, action [n]) -> (obs, state, reward, term, trunc, final_obs)
    model: TabularModel
    shape: tuple     # (rows, cols): how the states lie on a grid, for the heat map


MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # GridWorld's actions 0..3: up, right, down, left
LAKE_MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # FrozenLake's actions 0..3: left, down, right, up


def tabular_model(next_cell, mix, reward, terminal, start: int) -> TabularModel:
    """The MDP of a grid where the chosen action a makes move b with probability mix[a, b], move b
    leads from s to next_cell[s, b], and arriving at s' pays reward[s']; terminal states end it."""
    P = mix @ np.eye(len(next_cell))[next_cell]  # [A, B] @ [S, B, S']: P[s, a, s']
    P[terminal] = np.eye(len(next_cell))[terminal][:, None, :]  # stay put: Q* is 0 there
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


def gridworld_env(args) -> TabularEnv:  # static: the flags' layout is baked into the program
    index = lambda cell: int(np.ravel_multi_index(cell, args.grid_size))
    start, goal, slip = index(args.start), index(args.goal), float(args.slip)
    next_cell = grid_moves(*args.grid_size, MOVES, [index(w) for w in args.walls])
    terminal = np.arange(len(next_cell)) == goal  # and the goal alone pays 1
    mix = (1.0 - slip) * np.eye(len(MOVES)) + slip / len(MOVES)  # or a random move
    model = tabular_model(next_cell, mix, terminal.astype(float), terminal, start)

    def reset(key, n):
        state = GridState(jnp.full(n, start, jnp.int32), jnp.zeros(n, jnp.int32))
        return state.cell, state

    def step(keys, state, action):
        """One step of every GridWorld (a key each), reset at the goal or the time limit. One
        uniform u per env: u < slip (probability slip) slips, then u / slip picks the move."""
        if slip > 0:
            u = key_uniform(keys)
            random_move = (u / slip * len(MOVES)).astype(jnp.int32)
            action = jnp.where(u < slip, jnp.minimum(random_move, len(MOVES) - 1), action)
        cell = jnp.asarray(next_cell)[state.cell, action]  # final_obs, before any reset
        time = state.time + 1
        terminated, truncated = cell == goal, time >= args.max_episode_steps
        done = terminated | truncated
        state = GridState(jnp.where(done, start, cell), jnp.where(done, 0, time))
        return state.cell, state, terminated.astype(jnp.float32), terminated, truncated, cell

    return TabularEnv(reset, step, model, tuple(args.grid_size))


# ---------------------------------------------------------------- gymnax FrozenLake-misc
def frozen_lake_env(args) -> TabularEnv:
    import gymnax  # here, not at the top: importing it takes seconds, and only this env needs it
    env, params = gymnax.make("FrozenLake-misc")  # its observation is the cell index
    params = params.replace(max_steps_in_episode=args.max_episode_steps)
    reset = lambda key, n: jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)

    def step(keys, state, action):  # gymnax's obs, state, reward, terminated, truncated; final_obs
        *out, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, action, params)
        return *out, info["final_observation"]

    # gymnax's dynamics: the chosen move with probability success_rate, else a perpendicular one
    tiles = np.asarray(env.desc).ravel()  # 0 start, 1 frozen, 2 hole, 3 goal
    sure = env.success_rate if env.is_slippery else 1.0
    turns = np.roll(np.eye(4), 1, axis=1) + np.roll(np.eye(4), -1, axis=1)  # action a -> a -/+ 1
    schedule = np.asarray(env.reward_schedule, np.float64)  # goal, hole, frozen (and start)
    model = tabular_model(grid_moves(env.nrow, env.ncol, LAKE_MOVES),
                          sure * np.eye(4) + (1 - sure) / 2 * turns,
                          schedule[np.select([tiles == 3, tiles == 2], [0, 1], 2)],
                          np.isin(tiles, (2, 3)), int(np.argmax(tiles == 0)))
    return TabularEnv(reset, step, model, (env.nrow, env.ncol))


def tabular_env(args) -> TabularEnv:
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
def key_uniform(keys):
    """u ~ U[0, 1) from each key's own first random word ([n, 2] raw keys, as fold_in makes them):
    one hash a draw, not two (an agent draws twice a step from keys of its own)."""
    return (keys[:, 0] >> 8).astype(jnp.float32) * 2.0**-24


def epsilon_greedy(q_row, epsilon, u):
    """One agent's action from q_row [A] and u ~ U[0, 1): u < epsilon explores, else greedy, ties
    at random (argmax would pick action 0 while Q is 0); u, rescaled within its side, picks one."""
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
class Agents(NamedTuple):  # the N agents of one seed
    q: jax.Array               # [N, S, A] Q-tables
    visited: jax.Array         # [N, S, A] bool: has the agent taken action a in state s
    env_state: object          # their environments, [N] leading axis
    obs: jax.Array             # [N] current states
    episode_return: jax.Array  # [N] undiscounted return of the running episode
    episode_length: jax.Array  # [N]


class RunnerState(NamedTuple):  # what a checkpoint holds
    agents: Agents
    key: jax.Array
    q_star: jax.Array          # [S, A] by value iteration with this run's gamma
    updates_done: jax.Array


OPTIMAL_TOL = 1e-5  # Q* is in float32: actions within this of the best count as optimal
# Independent agents step block by block, a block's tables in the core's cache (65536: 2.1x faster).
BLOCK_BYTES = 512 * 1024


def block_size(num_agents: int, bytes_per_agent: int) -> int:
    """Agents per block: the largest divisor of num_agents whose tables fit in BLOCK_BYTES, or all
    of them at once when no divisor comes near that (a prime number of agents, say)."""
    target = min(num_agents, max(1, BLOCK_BYTES // bytes_per_agent))
    size = max(d for d in range(1, target + 1) if num_agents % d == 0)
    return size if 4 * size >= target else num_agents


def make_train(args, env, env_params, shard):
    """train(key, hp) -> (final RunnerState, metrics [num_updates]): one run, HPARAMS hp traced;
    train.init(key, hp) -> RunnerState, train.update(hp, runner) -> (runner, metrics). One agent
    runs ~9x slower unless this module was imported before JAX's first operation (XLA_FLAGS).
    shard: this device's part of a run over several (the runner's Shard): its share of the agents,
    stepped independently; only the metrics are the whole run's."""
    env = tabular_env(args)  # (ENVS: its own, not the runner's: env and env_params are None)
    model = env.model
    N = args.num_agents  # the run's (all devices')
    num_updates = args.total_timesteps // args.num_steps

    scored = jnp.asarray(model_reachable(model) & ~model.terminal)  # where greedy_optimal looks
    policy = jax.vmap(lambda q, s, eps, u: epsilon_greedy(q[s], eps, u), in_axes=(0, 0, None, 0))
    learn = jax.vmap(q_update, in_axes=(0, 0, 0, 0, 0, 0, None, None))
    mark_visited = jax.vmap(lambda visited, s, a: visited.at[s, a].set(True))

    def env_step(hp, carry, t):  # one step of a block of agents
        agents, totals, keys = carry
        # Each agent's draws from a key of its own (the step's fold of it): the same on any layout
        k_act, k_env = (jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, 2 * t + i)
                        for i in (0, 1))
        t = t.astype(jnp.float32)
        epsilon = hp["start_e"] + (hp["end_e"] - hp["start_e"]) * jnp.minimum(
            t / (args.exploration_fraction * args.total_timesteps), 1)
        lr = hp["learning_rate"] * (1 - t / args.total_timesteps if args.anneal_lr else 1)
        action = policy(agents.q, agents.obs, epsilon, key_uniform(k_act))
        obs, env_state, reward, terminated, truncated, final_obs = env.step(
            k_env, agents.env_state, action)
        q, td_error = learn(agents.q, agents.obs, action, reward, terminated, final_obs, lr,
                             hp["gamma"])
        done = terminated | truncated
        episode = agents.episode_return + reward, agents.episode_length + 1  # return, length
        # Per-agent sums over the update (episodes finished, their returns and lengths, |TD|).
        ended = [jnp.where(done, x, 0) for x in episode]
        totals = jax.tree.map(jnp.add, totals, (done, *ended, jnp.abs(td_error)))
        agents = Agents(q, mark_visited(agents.visited, agents.obs, action), env_state, obs,
                        *[jnp.where(done, 0, x) for x in episode])
        return (agents, totals, keys), None

    def run_block(hp, t0, block):  # an update's steps of one block of agents, from step t0
        agents, keys = block
        totals = tuple(jnp.zeros(agents.obs.shape, t) for t in (jnp.int32, float, jnp.int32, float))
        (agents, totals, _), _ = jax.lax.scan(partial(env_step, hp), (agents, totals, keys),
                                              t0 + jnp.arange(args.num_steps))
        return t0, (agents, totals)

    def update(hp, runner: RunnerState):
        mine = len(runner.agents.obs)  # this device's agents; [S, A] float32 q and bool visited:
        num_blocks = mine // block_size(mine, model.R.size * 5)
        # A key per agent of the run, this device's share: its draws whatever the blocks' layout
        key, k_agents = jax.random.split(runner.key)
        blocks = jax.tree.map(lambda x: x.reshape(num_blocks, -1, *x.shape[1:]),
                              (runner.agents, shard.keys(k_agents, N)))
        first_step = runner.updates_done * args.num_steps
        _, (blocks, totals) = jax.lax.scan(partial(run_block, hp), first_step, blocks)
        agents = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), blocks)
        runner = runner._replace(agents=agents, key=key, updates_done=runner.updates_done + 1)
        optimal = runner.q_star >= runner.q_star.max(-1, keepdims=True) - OPTIMAL_TOL  # [S, A]
        count, return_sum, length_sum, td_sum = shard.psum(tuple(x.sum() for x in totals))
        visited_error = jnp.where(agents.visited, jnp.abs(agents.q - runner.q_star), 0.0)
        greedy = agents.q == agents.q.max(-1, keepdims=True)  # [N, S, A]
        correct = ~(greedy & ~optimal).any(-1) & scored  # [N, S]: every greedy action is optimal
        # The rate in force at the update's first step (as env_step's), before this update
        annealed = 1 - first_step / args.total_timesteps if args.anneal_lr else 1
        metrics = {  # env_steps in float32: all agents' steps overflow int32 past 2^31
            "env_steps": runner.updates_done.astype(jnp.float32) * (args.num_steps * N),
            "episode_return": jnp.where(count > 0, return_sum / count, jnp.nan),
            "episode_length": jnp.where(count > 0, length_sum / count, jnp.nan), "episodes": count,
            "stats/td_error": td_sum / (args.num_steps * N),
            "stats/q_error": shard.pmean(visited_error.max(axis=(1, 2)).mean()),
            "stats/greedy_optimal": shard.pmean((correct.sum(-1) / scored.sum()).mean()),
            "charts/learning_rate": hp["learning_rate"] * annealed,
        }
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_env, k_run = jax.random.split(key)
        obs, env_state = jax.tree.map(shard.share, env.reset(k_env, N))
        n = len(obs)  # this device's
        agents = Agents(jnp.zeros((n, *model.R.shape)), jnp.zeros((n, *model.R.shape), bool),
                        env_state, obs, jnp.zeros(n), jnp.zeros(n, jnp.int32))
        q_star = value_iteration(model.P, model.R, model.terminal, hp["gamma"])
        return RunnerState(agents, k_run, q_star, jnp.int32(0))

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.num_updates = init, update, num_updates
    return train


# ============================================================================ 5. flags' rules
def resolve(args, env, env_params):
    """Check the flags of this file before anything is compiled (ValueError names a bad one)."""
    if args.env_id not in ENV_IDS:
        raise ValueError(f"--env-id {args.env_id!r} is not one of {', '.join(ENV_IDS)}")
    for name, (rule, holds) in {"slip": UNIT, "exploration_fraction": POSITIVE_UNIT}.items():
        if not holds(value := getattr(args, name)):
            raise ValueError(f"--{name.replace('_', '-')} must be {rule} (got {value})")
    if args.total_timesteps < args.num_steps:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one update "
                         f"(--num-steps {args.num_steps})")
    if args.env_id == "FrozenLake-misc":
        return args
    rows, cols = args.grid_size
    if rows < 1 or cols < 1 or not 2 <= rows * cols <= MAX_CELLS:
        raise ValueError(f"--grid-size {rows} {cols} must have 2 to {MAX_CELLS} cells (the exact "
                         f"model P[s, a, s'] is a dense array)")
    for name, cell in [("--start", args.start), ("--goal", args.goal)] + [
            ("--walls cell", wall) for wall in args.walls]:
        if not (0 <= cell[0] < rows and 0 <= cell[1] < cols):
            raise ValueError(f"{name} {cell[0]} {cell[1]} is outside the {rows}x{cols} grid")
        if name != "--walls cell" and tuple(cell) in map(tuple, args.walls):
            raise ValueError(f"{name} {cell[0]} {cell[1]} is a wall (see --walls)")
    if tuple(args.start) == tuple(args.goal):
        raise ValueError("--goal must differ from --start")
    if not (model_reachable(model := gridworld_env(args).model) & model.terminal).any():
        raise ValueError(f"--goal {args.goal[0]} {args.goal[1]} cannot be reached from --start "
                         f"{args.start[0]} {args.start[1]}: the walls cut every path")
    return args


# ============================================================================ 6. hooks
# The runner's hooks (runner/__init__.py) that differ from its defaults.
# No YNNPACK (XLA's own kernels are 1.2x faster); XLA's default LLVM level (3), pinned: a level in
# XLA_FLAGS (the tests' -O0 for their own programs) must not change the training program's results.
COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "", "xla_backend_optimization_level": 3}
SCORE, SHOWN = "stats/greedy_optimal", {"stats/greedy_optimal": "{:.1%}", "stats/q_error": "{:.2e}"}
saved_model = lambda state: {"q": state.agents.q, "visited": state.agents.visited}  # [S, A]
SPLIT = "num_agents"  # what a run over several devices splits
ENVS = ()  # GridWorld-v0 and FrozenLake-misc: tabular, built here from the flags


@dataclasses.dataclass
class ExtraFlags:
    plot: bool = False
    """save q_values.png: max_a Q per cell (seed 0, agent 0) beside max_a Q*"""


def draw(folder, args, state: RunnerState) -> list:
    """--plot: heat maps of max_a Q per cell (seed 0, agent 0) beside max_a Q*, with arrows for the
    greedy actions, S the start and T the terminal cells; walls and unreachable cells are blank."""
    if not args.plot:  # (the import takes a second)
        return []
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure to close
    env = tabular_env(args)
    model, shown = env.model, model_reachable(env.model)
    rows, cols = np.divmod(np.arange(len(shown)), env.shape[1])  # each state's cell
    dr, dc = np.array(MOVES if args.env_id == "GridWorld-v0" else LAKE_MOVES).T  # each action's
    arrows = shown & ~model.terminal
    fig, q_star = Figure(figsize=(10, 4.5)), state.q_star[0]  # [S, A]
    axes = fig.subplots(1, 2)
    for ax, table, title in [(axes[0], state.agents.q[0, 0], "learned max_a Q (seed 0, agent 0)"),
                             (axes[1], q_star, "optimal max_a Q* (value iteration)")]:
        values = np.where(shown, table.max(-1), np.nan).reshape(env.shape)
        image = ax.imshow(values, cmap="viridis", vmin=0, vmax=max(q_star.max(), 1e-9))
        a = table.argmax(-1)[arrows]  # greedy actions; y grows downwards, as the rows do
        ax.quiver(cols[arrows], rows[arrows], dc[a], dr[a], color="white", angles="xy",
                  scale_units="xy", scale=10 / 3, pivot="mid", width=0.006, headwidth=4)
        for s, label in [(model.start, "S")] + [(s, "T") for s in np.nonzero(model.terminal)[0]]:
            ax.text(cols[s] + 0.3, rows[s] - 0.25, label, color="white", ha="center", va="center")
        ax.set(title=title, xticks=[], yticks=[])
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.suptitle(f"{args.env_id}: greedy actions (arrows) and state values")
    fig.savefig(path := os.path.join(folder, "q_values.png"), dpi=100)
    return [path]


# ============================================================================ 7. the tail
if __name__ == "__main__":  # run as a script: the runner (algos/runner/) trains this module
    import sys

    from runner import cli
    cli.main(sys.modules[__name__])
