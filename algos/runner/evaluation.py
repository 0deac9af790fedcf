"""Evaluation: the trained policies (train.act) play fresh episodes in the runner's env, greedy
and exploring, in one jitted call vmapped over the runs; an episode of one drawn as a GIF."""
import jax
import jax.numpy as jnp
import numpy as np

from . import envs, flags, sweep


def play(args, train, runner, key, episodes: int, record: bool = True):
    """`episodes` fresh episodes of a run's policy by its greedy actions, as many exploring (one
    episode a slot: a policy's memory runs from its start to its end). record: a scan to the time
    limit, per step [T, 2 x episodes] the env states before it, rewards, ended; else each slot's
    return [2 x episodes], by a loop that stops when every episode has ended."""
    env, env_params = envs.make_env(args)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def step(carry, key):
        obs, env_state, (greedy_memory, sampled_memory), ended = carry
        k_act, k_env = jax.random.split(key)
        greedy, greedy_memory = train.act(runner, obs[:episodes], greedy_memory)
        sampled, sampled_memory = train.act(runner, obs[episodes:], sampled_memory, k_act)
        obs, next_state, reward, terminated, truncated, _ = vstep(
            jax.random.split(k_env, 2 * episodes), env_state, jnp.concatenate([greedy, sampled]),
            env_params)
        return ((obs, next_state, (greedy_memory, sampled_memory), ended | terminated | truncated),
                (env_state, reward, ended))

    keys = jax.random.split(key, int(env_params.max_steps_in_episode) + 1)  # (some: floats)
    obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(keys[0], 2 * episodes), env_params)
    memories = (train.initial_memory(episodes), train.initial_memory(episodes))
    start = (obs, env_state, memories, jnp.zeros(2 * episodes, bool))
    if record:
        return jax.lax.scan(step, start, keys[1:])[1]

    def advance(loop):
        t, carry, returns = loop
        carry, (_, reward, ended) = step(carry, keys[t + 1])
        return t + 1, carry, returns + jnp.where(ended, 0.0, reward)

    unfinished = lambda loop: (loop[0] < len(keys) - 1) & ~loop[1][-1].all()
    return jax.lax.while_loop(unfinished, advance, (0, start, jnp.zeros(2 * episodes)))[2]


def evaluator(args):
    """The runs' final states ([runs, ...] leaves) -> {tag: [runs]}, each run's mean return over
    --eval-episodes fresh episodes, greedy and sampled (seed k's keys in every configuration);
    None where there is nothing to play (no env of the runner's, or --eval-episodes 0)."""
    if not (args.eval_episodes and args.algorithm.ENVS):
        return None
    train = sweep.build_train(args)

    def mean_returns(runner, key):
        returns = jnp.split(play(args, train, runner, key, args.eval_episodes, record=False), 2)
        return {f"eval/episodic_return_{kind}": x.mean()
                for kind, x in zip(("greedy", "sampled"), returns)}

    scores = jax.jit(jax.vmap(mean_returns))
    keys = flags.run_inputs(args, stream=1)[0]
    return lambda state: jax.device_get(scores(state, keys))


def capture_gif(path, args, state):
    """An episode of the first run's greedy policy, drawn by gymnax's Visualizer or by Brax's."""
    train = sweep.build_train(args)
    states, rewards, ended = play(args, train, jax.tree.map(lambda x: x[0], state),
                                  jax.random.PRNGKey(args.seed), 1)  # [:, 0]: greedy
    frames = int(np.argmax(ended[:, 0])) if ended[:, 0].any() else len(ended)  # the episode's steps
    episode = [jax.tree.map(lambda x: x[t, 0], states) for t in range(frames)]
    envs.draw(*envs.make_env(args), episode, rewards[:frames, 0], path)
    return path
