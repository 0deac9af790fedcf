"""Q-learning: the models and value iteration against hand-solved cases and a float64 numpy solver,
learning to Q* on deterministic and slippery GridWorlds, tie-breaking, the seed sweep, the CLI."""
import dataclasses
from typing import NamedTuple

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import q_learning as ql
from conftest import assert_usage_error, help_text, read_scalars, run_main, validated
from runner import flags, sweep

Args = flags.args_class(ql)  # q_learning's flags and the runner's


def numpy_q_star(model, gamma):
    """Q* by value iteration in plain numpy float64, to 1e-12."""
    P, R = np.asarray(model.P, np.float64), np.asarray(model.R, np.float64)
    q = np.zeros_like(R)
    while True:
        q_new = R + gamma * P @ np.where(model.terminal, 0.0, q.max(1))
        if np.abs(q_new - q).max() < 1e-12:
            return q_new
        q = q_new


def optimal_actions(q_star):
    return q_star >= q_star.max(1, keepdims=True) - 1e-9


def scored_states(model):
    return ql.model_reachable(model) & ~model.terminal


# ------------------------------------------------------------------------- models, value iteration
def test_value_iteration_on_hand_solved_grids():
    # A 1x3 corridor, goal on the right, gamma 0.9 (actions: up, right, down, left).
    corridor = ql.tabular_env(Args(grid_size=(1, 3), start=(0, 0), goal=(0, 2), walls=())).model
    q = np.asarray(ql.value_iteration(corridor.P, corridor.R, corridor.terminal, 0.9))
    expected = np.array([[0.81, 0.9, 0.81, 0.81],   # from 0: right reaches 1, anything else stays
                         [0.9, 1.0, 0.9, 0.81],     # from 1: right is the goal, left goes back to 0
                         [0.0, 0.0, 0.0, 0.0]])     # the goal is terminal
    np.testing.assert_allclose(q, expected, atol=1e-6)
    # A slippery 1x2 grid: only "right" leaves cell 0, so V = (1 - 3p/4) / (1 - 3p gamma / 4).
    p, gamma = 0.2, 0.9
    pair = ql.tabular_env(Args(grid_size=(1, 2), start=(0, 0), goal=(0, 1), walls=(), slip=p)).model
    q = np.asarray(ql.value_iteration(pair.P, pair.R, pair.terminal, gamma))
    v = (1 - 3 * p / 4) / (1 - 3 * p * gamma / 4)
    np.testing.assert_allclose(q[0, 1], v, atol=1e-6)
    np.testing.assert_allclose(q[0, [0, 2, 3]], p / 4 + (1 - p / 4) * gamma * v, atol=1e-6)


MODELS = {
    "maze": dict(),
    "slippery": dict(grid_size=(4, 4), goal=(3, 3), walls=((1, 1), (2, 2)), slip=0.2,
                     gamma=(0.9,)),
    "frozen_lake": dict(env_id="FrozenLake-misc"),
}


@pytest.mark.parametrize("case", MODELS)
def test_value_iteration_matches_numpy(case):
    args = Args(**MODELS[case])
    model = ql.tabular_env(args).model
    np.testing.assert_allclose(model.P.sum(-1), 1.0, atol=1e-12)
    q = np.asarray(ql.value_iteration(model.P, model.R, model.terminal, args.gamma[0]))
    np.testing.assert_allclose(q, numpy_q_star(model, args.gamma[0]), atol=1e-5)


@pytest.mark.parametrize("case", ["slippery", "frozen_lake"])
def test_model_matches_sampled_steps(case):
    """The exposed P[s, a, s'] is what env.step does: 2000 samples of every (s, a) pair."""
    env = ql.tabular_env(Args(**MODELS[case]))
    S, A = env.model.R.shape
    n = 2000
    cells = jnp.repeat(jnp.arange(S), A * n)
    actions = jnp.tile(jnp.repeat(jnp.arange(A), n), S)
    _, state = env.reset(jax.random.PRNGKey(0), S * A * n)
    if case == "frozen_lake":
        state = state.replace(position=cells)
    else:
        state = state._replace(cell=cells)
    keys = jax.random.split(jax.random.PRNGKey(1), len(actions))  # a key each, as in training
    _, _, reward, terminated, _, final = jax.jit(env.step)(keys, state, actions)
    counts = np.zeros((S, A, S))
    np.add.at(counts, (np.asarray(cells), np.asarray(actions), np.asarray(final)), 1)
    live = ~env.model.terminal  # episodes never step from a terminal state
    np.testing.assert_allclose(counts[live] / n, env.model.P[live], atol=0.05)
    mean_reward = np.asarray(reward).reshape(S, A, n).mean(-1)
    np.testing.assert_allclose(mean_reward[live], env.model.R[live], atol=0.05)
    np.testing.assert_array_equal(np.asarray(terminated), env.model.terminal[np.asarray(final)])


# ----------------------------------------------------------------------------- policy
def test_tie_breaking_is_uniform_among_maximal_actions():
    draws = 40_000
    u = jax.random.uniform(jax.random.PRNGKey(0), (draws,))
    policy = jax.jit(jax.vmap(ql.epsilon_greedy, in_axes=(None, None, 0)))

    def frequencies(q_row, epsilon):
        return np.bincount(np.asarray(policy(jnp.asarray(q_row), epsilon, u)), minlength=4)

    def chi_square(counts, probs):
        expected = draws * np.asarray(probs)
        keep = expected > 0
        assert counts[~keep].sum() == 0, counts
        return (((counts - expected) ** 2)[keep] / expected[keep]).sum()

    # Chi-square quantiles at p = 0.001: 13.8 with 2 degrees of freedom, 16.3 with 3.
    assert chi_square(frequencies([0.0, 0.0, 0.0, 0.0], 0.0), [0.25] * 4) < 16.3  # all-zero Q
    assert chi_square(frequencies([1.0, 0.0, 1.0, 1.0], 0.0), [1 / 3, 0, 1 / 3, 1 / 3]) < 13.8
    assert chi_square(frequencies([0.0, 2.0, 1.0, 0.5], 1.0), [0.25] * 4) < 16.3  # all exploring
    eps = 0.3  # unique best action 1: 1 - eps + eps / 4; the others eps / 4 each
    assert chi_square(frequencies([0.0, 2.0, 1.0, 0.5], eps),
                      [eps / 4, 1 - 3 * eps / 4, eps / 4, eps / 4]) < 16.3


# ----------------------------------------------------------------------------- learning to Q*
# One table: the setting, its budget (steps per agent) and what a correct Q-learning reaches on
# every agent of 2 seeds x 8 agents. "greedy" = the greedy actions are optimal in every reachable
# non-terminal state; "q_error" = max |Q - Q*| over the pairs the agent visited; "v_error" =
# max |max_a Q - V*| over the reachable non-terminal states.
# - deterministic: uniform behaviour (epsilon 1, Q-learning is off-policy) and lr 0.5 visit every
#   pair often; each visit halves the error, so Q reaches Q* to float32 precision.
# - default: the file's defaults (epsilon 1 -> 0.05 over half the run, lr 0.1 -> 0); rarely tried
#   actions lag, but the greedy values converge (worst of 300 agents measured 4e-6).
# - slippery: slip 0.2; lr annealed to 0 averages the noisy targets (worst of 300 agents measured
#   q_error 0.028; the smallest action gap of this grid is 0.046).
SMALL_GRID = dict(grid_size=(4, 4), goal=(3, 3), walls=((1, 1), (2, 2)), gamma=(0.9,))
LEARNING = {
    "deterministic": dict(args=dict(**SMALL_GRID, start_e=(1.0,), end_e=(1.0,),
                                    learning_rate=(0.5,), anneal_lr=False),
                          budget=20_000, q_error=1e-4, v_error=1e-4),
    "default": dict(args=dict(), budget=200_000, q_error=None, v_error=1e-3),
    "slippery": dict(args=dict(**SMALL_GRID, slip=0.2, start_e=(1.0,), end_e=(1.0,)),
                     budget=50_000, q_error=0.05, v_error=0.05),
}


@pytest.mark.parametrize("case", LEARNING)
def test_learns_q_star(case, monkeypatch):
    spec = LEARNING[case]
    # Small blocks (4 agents of the 4x4 grid, 1 of the maze), so the blocked update learns here.
    monkeypatch.setattr(ql, "BLOCK_BYTES", 4 * 16 * 4 * 5)
    args = validated(ql, num_seeds=2, num_agents=8, total_timesteps=spec["budget"],
                     num_steps=spec["budget"] // 10, track=False, **spec["args"])
    state, metrics, _ = sweep.run(args)
    model = ql.tabular_env(args).model
    q_star = numpy_q_star(model, args.gamma[0])
    scored = scored_states(model)
    q = np.asarray(state.agents.q, np.float64).reshape(-1, *q_star.shape)
    visited = np.asarray(state.agents.visited).reshape(q.shape)
    greedy = q == q.max(-1, keepdims=True)
    wrong = (greedy & ~optimal_actions(q_star)).any(-1) & scored
    assert not wrong.any(), np.argwhere(wrong)
    assert visited[:, scored].any(-1).all()  # every reachable state was visited
    v_error = np.abs(q.max(-1) - q_star.max(-1))[:, scored].max()
    assert v_error <= spec["v_error"], v_error
    q_error = np.where(visited, np.abs(q - q_star), 0.0).max(axis=(1, 2))
    if spec["q_error"] is not None:
        assert q_error.max() <= spec["q_error"], q_error
    # The logged metrics say the same (mean over a seed's agents, last update).
    np.testing.assert_allclose(metrics["stats/greedy_optimal"][:, -1], 1.0)
    np.testing.assert_allclose(metrics["stats/q_error"][:, -1], q_error.reshape(2, -1).mean(1),
                               rtol=1e-3, atol=1e-6)


class Replay(NamedTuple):
    """An agent's env state, and beside it the test's own Q-table (which the file never reads)."""
    inner: object    # gymnax's state
    obs: jax.Array   # the state the agent acts from
    t: jax.Array     # steps it has taken
    q: jax.Array     # [S, A]: Watkins' update on exactly the transitions the agent made


def replaying(env, args):
    """`env` (a TabularEnv), whose steps also feed each agent's transition to Watkins' update as
    the paper and --help state it, with the steps the env itself returns: Q(s, a) += lr_t (r +
    gamma [not terminated] max_a' Q(s', a') - Q(s, a)), s' the cell the move led to (before the
    reset), lr_t = lr (1 - t / total_timesteps) at the agent's t-th step."""
    lr, total, gamma = args.learning_rate[0], args.total_timesteps, args.gamma[0]

    def watkins(q, s, a, reward, terminated, s_next, t):
        target = reward + gamma * jnp.where(terminated, 0.0, q[s_next].max())
        return q.at[s, a].add(lr * (1 - t.astype(jnp.float32) / total) * (target - q[s, a]))

    def reset(key, n):
        obs, inner = env.reset(key, n)
        return obs, Replay(inner, obs, jnp.zeros(n, jnp.int32), jnp.zeros((n, *env.model.R.shape)))

    def step(key, state, action):
        obs, inner, reward, terminated, truncated, s_next = env.step(key, state.inner, action)
        q = jax.vmap(watkins)(state.q, state.obs, action, reward, terminated, s_next, state.t)
        return obs, Replay(inner, obs, state.t + 1, q), reward, terminated, truncated, s_next

    return env._replace(reset=reset, step=step)


def test_frozen_lake_learns(monkeypatch):
    """FrozenLake-misc (slippery, gamma 0.95) at the default schedule, 2 seeds x 4 agents.

    Exact: every agent's final table equals the test's own replay of Watkins' update on the
    transitions that agent made (`replaying`): the target, gamma, no bootstrap at termination,
    the bootstrap from the final cell at truncation (~90 truncations per agent) and the annealed
    step size, end to end. Tolerance: the two float32 computations may round differently (they
    agree bit for bit here); the update is a sup-norm non-expansion, so differences only add up,
    a few float32 ulps (2.4e-7 at |Q| <= 1) per update, ~1e-4 over 2e5 updates as a random walk:
    5e-4 allows 5 of its std and sits 10x below the smallest bug measured.
    Measured (3 seeds of each, copies of the file or q_update patched): the replay differs by
    0.13 with gamma**2, 0.17 to 0.20 with the step size not annealed, 0.03 with half of it, 9e-3
    to 1.4e-2 when truncation stops the bootstrap, 5e-3 to 9e-3 when it bootstraps from the
    reset cell. (A q_update that ignores `terminated` learns the same tables: agents never act
    from a terminal cell, so its row stays 0; test_q_update_terminal_and_truncated checks that.)

    No bound on stats/q_error (max |Q - Q*| over an agent's visited pairs): measured 0.056 to
    0.083 (seed means, 5 seeds; agents 0.046 to 0.115), it is the noise of the sampled targets at
    this budget, not a lag behind Q* (the expected update at the same visits ends within 9e-4 of
    Q*). Its worst pair is one whose updates stopped while lr was still large, freezing in a
    successor value off by about gamma sigma sqrt(lr / (2 - lr)) = 0.064 at lr 0.1 (sigma <= 0.29,
    the targets' std under Q*), 9 to 48 times the std of the pair's own averaged targets; a tail
    bound on its max over pairs needs the correlations of that noise, and the finite-time bounds
    of asynchronous Q-learning, ~(1 - gamma)^-5/2 (visits per pair)^-1/2 (Li et al. 2020), are
    over 100 here (Q in [0, 1] already bounds it by 1). The old bound 0.15 passed every seed
    without the annealing (0.11 to 0.15), with half the step size and with either truncation bug,
    and one of three with gamma**2 (0.144 to 0.161)."""
    make_env = ql.tabular_env
    monkeypatch.setattr(ql, "tabular_env", lambda args: replaying(make_env(args), args))
    args = validated(ql, env_id="FrozenLake-misc", num_seeds=2, num_agents=4,
                     total_timesteps=200_000, num_steps=20_000, track=False)
    state, metrics, _ = sweep.run(args)
    model = make_env(args).model
    S, A = model.R.shape
    q = np.asarray(state.agents.q).reshape(-1, S, A)
    replay = np.asarray(state.agents.env_state.q).reshape(q.shape)
    assert np.abs(replay).max() > 0.5  # the replay learned (Q*'s largest value is 0.72)
    np.testing.assert_allclose(q, replay, rtol=0, atol=5e-4)
    # The greedy policy: its action gaps go down to 0.007, so a state or two can stay wrong at
    # this budget (30 agents measured: mean greedy_optimal 0.99).
    assert np.asarray(metrics["stats/greedy_optimal"])[:, -1].mean() >= 0.9, metrics
    returns = np.asarray(metrics["episode_return"])  # measured 0.02 -> 0.53
    assert np.nanmean(returns[:, -1]) >= np.nanmean(returns[:, 0]) + 0.3, returns
    # stats/q_error is what its definition gives from the final tables, in float64.
    visited = np.asarray(state.agents.visited).reshape(q.shape)
    q_error = np.where(visited, np.abs(q - numpy_q_star(model, args.gamma[0])), 0).max((1, 2))
    np.testing.assert_allclose(metrics["stats/q_error"][:, -1], q_error.reshape(2, -1).mean(1),
                               rtol=1e-4, atol=1e-6)


def test_q_update_terminal_and_truncated():
    """Watkins' update on a table whose terminal row is not 0 (which no run makes: no agent acts
    from a terminal state): a terminated step's target is the reward alone; a truncated one
    (terminated False) bootstraps from max_a' Q(s', a'). Only Q(s, a) moves."""
    q = jnp.zeros((3, 2)).at[2].set(jnp.array([5.0, 7.0])).at[0, 1].set(0.5)
    for terminated, target in [(True, 1.0), (False, 1.0 + 0.9 * 7.0)]:
        new, td_error = ql.q_update(q, 0, 1, 1.0, jnp.bool_(terminated), 2, 0.5, 0.9)
        np.testing.assert_allclose(td_error, target - 0.5, rtol=1e-6)
        np.testing.assert_allclose(new, q.at[0, 1].set(0.5 + 0.5 * (target - 0.5)), rtol=1e-6)


def test_greedy_optimal_of_hand_made_tables():
    """stats/greedy_optimal against a count of our own: three agents' tables set by hand (a
    learning rate of 0 keeps them through the update): Q* itself (every greedy action optimal),
    Q* with a wrong action made greedy in 5 reachable states, and Q* with every state's optimal
    actions turned worst. From Q* in float64 numpy: the mean over agents of the fraction of
    reachable non-terminal states whose every greedy action is optimal."""
    args = validated(ql, num_agents=3, num_steps=1, total_timesteps=1, track=False)
    model = ql.tabular_env(args).model
    q_star = numpy_q_star(model, args.gamma[0])
    scored = np.flatnonzero(scored_states(model))
    optimal = optimal_actions(q_star)
    wrong = q_star.copy()
    for s in scored[::len(scored) // 5][:5]:  # 5 states: a non-optimal action above the best
        wrong[s, np.flatnonzero(~optimal[s])[0]] = q_star[s].max() + 1.0
    worst = np.where(optimal, q_star.min() - 1.0, q_star)
    tables = np.stack([q_star, wrong, worst])
    greedy = tables == tables.max(-1, keepdims=True)
    per_agent = (~(greedy & ~optimal).any(-1))[:, scored].mean(-1)
    np.testing.assert_allclose(per_agent[:2], [1.0, 1 - 5 / len(scored)])
    assert per_agent[2] < 0.2, per_agent  # (a state where every action is optimal stays right)
    expected = per_agent.mean()

    train = sweep.build_train(args)
    hp = {k: jnp.float32(getattr(args, k)[0]) for k in ql.HPARAMS} | {"learning_rate": 0.0}
    runner = train.init(jax.random.PRNGKey(0), hp)
    runner = runner._replace(agents=runner.agents._replace(q=jnp.float32(tables)))
    _, metrics = jax.jit(train.update)(hp, runner)
    np.testing.assert_allclose(metrics["stats/greedy_optimal"], expected, rtol=1e-6)


def test_block_size_splits_agents_evenly():
    for n in [1, 30, 512, 1000, 4096, 32768, 65536, 10007]:
        size = ql.block_size(n, 720)
        assert n % size == 0
        assert size * 720 <= ql.BLOCK_BYTES or size == n  # fits the cache, or no even split
    assert ql.block_size(32768, 720) == 512 and ql.block_size(10007, 720) == 10007


# ----------------------------------------------------------------------------- seed sweep
TINY = dict(num_agents=8, total_timesteps=3_000, num_steps=1_000, track=False)


def test_seed_sweep_layout_and_determinism():
    args = validated(ql, num_seeds=4, slip=0.1, **TINY)
    _, one_device, _ = sweep.run(args, num_devices=1)
    state, two_devices, _ = sweep.run(args, num_devices=2)
    again_state, again, _ = sweep.run(args, num_devices=2)
    _, other_seed, _ = sweep.run(dataclasses.replace(args, seed=args.seed + 1), num_devices=2)
    for key in one_device:
        assert one_device[key].shape == (4, 3), key
        # Another layout may round differently by an ulp: the first update agrees to 1e-5.
        np.testing.assert_allclose(one_device[key][:, 0], two_devices[key][:, 0], rtol=1e-5,
                                   atol=1e-7, err_msg=key)
        np.testing.assert_array_equal(two_devices[key], again[key], err_msg=key)
    np.testing.assert_array_equal(state.agents.q, again_state.agents.q)
    np.testing.assert_allclose(one_device["stats/greedy_optimal"][:, -1],
                               two_devices["stats/greedy_optimal"][:, -1], atol=0.05)
    np.testing.assert_array_equal(two_devices["env_steps"][0], [8_000, 16_000, 24_000])
    # The learning rate in force at each update's first step (annealed per step over the run).
    np.testing.assert_allclose(two_devices["charts/learning_rate"][0], 0.1 * (1 - np.arange(3) / 3),
                               rtol=1e-6)
    # Seeds are independent experiments, and another --seed is another sweep.
    errors = np.asarray(two_devices["stats/q_error"])
    assert len({float(x) for x in errors[:, 0]}) == 4
    assert not np.array_equal(errors, np.asarray(other_seed["stats/q_error"]))


def test_memory_does_not_grow_with_steps():
    def temp_bytes(total):
        args = Args(**dict(TINY, total_timesteps=total))
        hp = {k: jnp.float32(getattr(args, k)[0]) for k in ql.HPARAMS}
        lowered = jax.jit(sweep.build_train(args)).lower(jax.random.PRNGKey(0), hp)
        compiled = lowered.compile(args.algorithm.COMPILER_OPTIONS)
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp_bytes(100_000) <= temp_bytes(3_000) + 1024


# ----------------------------------------------------------------------------- command line
def test_help_lists_every_flag_with_its_doc(capsys):
    text = help_text(ql, capsys)
    for phrase in ["independent agents per seed", "probability that a move goes in a uniformly",
                   "environment steps per agent", "wall cells as row column pairs"]:
        assert phrase in text, phrase


def test_a_run_writes_its_events_model_and_plot(tmp_path, capsys):
    """A tiny run from the command line: a progress line per segment, events, the model (its Q
    tables) and the plot (q_learning's draw), and one permission rule for every file (the umask's;
    no 0600 for the atomic writes)."""
    out = run_main(ql, ["--num-seeds", 2, "--num-agents", 4, "--total-timesteps", 2_000,
                        "--num-steps", 200, "--slip", 0.1, "--save-model", "--plot", "--log-dir",
                        tmp_path / "runs"], capsys)
    assert "stats/greedy_optimal per seed" in out
    assert out.count("[q_learning] steps") == 10  # a progress line per segment
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert run_dir.name.startswith("GridWorld-v0__q_learning__1__")
    for k in range(2):
        points = read_scalars(run_dir / f"seed_{k}", "charts/episodic_return")
        steps = [s for s, _ in points]
        assert len(steps) >= 5 and steps == sorted(steps) and len(set(steps)) == len(steps)
        assert len(read_scalars(run_dir / f"seed_{k}", "stats/greedy_optimal")) == 10
    payload = flax.serialization.msgpack_restore((run_dir / "model.msgpack").read_bytes())
    assert payload["q"].shape == (2, 4, 36, 4) and payload["visited"].shape == (2, 4, 36, 4)
    assert payload["visited"].any(-1).sum() >= 2 * 4 * 2  # every agent left its start cell
    assert (run_dir / "q_values.png").stat().st_size > 10_000
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "checkpoint.msgpack", "model.msgpack", "q_values.png", "seed_0", "seed_1"]  # no .tmp
    # One permission rule for all a run writes (the umask's; no 0600 for the atomic writes).
    assert len({p.stat().st_mode & 0o777 for p in run_dir.rglob("*") if p.is_file()}) == 1


@pytest.mark.parametrize("typed, flag", [
    (["--num-agents", "0"], "--num-agents"),
    (["--num-seeds", "0"], "--num-seeds"),
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--start-e", "1.5"], "--start-e"),
    (["--end-e", "-0.1"], "--end-e"),
    (["--goal", "6", "2"], "--goal"),
    (["--walls", "1", "0", "0", "1", "1", "1"], "--goal"),  # the start is walled in
])
def test_bad_input_is_one_line_exit_2(typed, flag, tmp_path):
    assert_usage_error("q_learning.py", typed, flag, tmp_path)
