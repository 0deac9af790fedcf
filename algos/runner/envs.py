"""Environments: gymnax's, by id, or a Brax task (--env-id brax/<name>) behind gymnax's interface
(brax is imported for those alone: a gymnax run never does), and an episode drawn as a GIF."""
import functools
import os
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


def make_env(args) -> tuple:
    """(env, env_params) of --env-id for resolve, make_train and evaluation, built once; (None,
    None) where the file builds its own (ENVS empty). ValueError if it cannot be built here."""
    suites = args.algorithm.ENVS
    if not suites:
        return None, None
    if args.env_id.startswith("brax/") and "brax" not in suites:
        file = os.path.basename(args.algorithm.__file__)
        raise ValueError(f"--env-id {args.env_id!r}: {file} runs no Brax task")
    return build_env(args.env_id, args.brax_backend)


@functools.cache
def build_env(env_id: str, backend: Optional[str]) -> tuple:
    """gymnax's env_id, or brax/<name> behind gymnax's interface; ValueError if it cannot be built
    here (an unknown id, or one that needs what is not here: MNISTBandit-bsuite downloads data)."""
    if env_id.startswith("brax/"):
        return brax_env(env_id[len("brax/"):], backend or "positional")
    import gymnax
    try:
        return gymnax.make(env_id)
    except Exception as e:
        raise ValueError(f"--env-id {env_id!r} cannot be built: {e!r}".splitlines()[0]) from None


def draw(env, env_params, states: list, rewards, path: str):
    """A GIF at path of an episode's env states: a Brax task's by MuJoCo's renderer, in real time;
    gymnax's by its Visualizer, with the return so far. ValueError where gymnax has no drawing."""
    if hasattr(env, "write_gif"):
        return env.write_gif(states, path)
    from gymnax.visualize import Visualizer
    gif = Visualizer(env, env_params, states, np.cumsum(rewards))
    gif.animate(path)
    if not hasattr(gif, "im"):  # (it draws nothing, silently, of an env it has no drawing of)
        raise ValueError("gymnax has no drawing of it")


def brax_env(name: str, backend: str) -> tuple:
    """(env, env_params): Brax's task `name` as a gymnax env, whose step does the rest: at the
    task's end (terminated: a hopper that falls) or at max_steps_in_episode (truncated, not
    terminated) a fresh start from the step's key, info["final_observation"] the observation
    before it. brax is imported here alone (0.7 s)."""
    from brax import envs
    from gymnax.environments import environment, spaces
    if name not in envs._envs:
        raise ValueError(f"--env-id brax/{name}: Brax has no such env; it has "
                         f"{', '.join(sorted(envs._envs))}")
    task = envs.get_environment(name, backend=backend)
    # The env state keeps Brax's State less its arrays of no elements (mjx's: no contacts...): XLA
    # crashes compiling a program over several devices that takes or gives one (jax 0.11.2).
    start = jax.eval_shape(task.reset, jax.random.PRNGKey(0))  # Brax's State, as shapes
    template, treedef = jax.tree.flatten(jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), start))

    def pack(state) -> list:  # the leaves of Brax's State that hold elements
        return [x for x in jax.tree.leaves(state) if np.size(x)]

    def unpack(leaves: list):  # Brax's State again (an array of no elements: the template's)
        given = iter(leaves)
        return jax.tree.unflatten(treedef, [next(given) if x.size else x for x in template])

    @flax.struct.dataclass
    class State(environment.EnvState):  # time: steps since the episode's start
        brax: list  # pack(Brax's State): pipeline_state, obs, reward, done (the task's end), ...

    @flax.struct.dataclass
    class Params(environment.EnvParams):
        max_steps_in_episode: int = 1000  # Brax's episode length (action repeat 1)

    class BraxEnv(environment.Environment):
        def reset_env(self, key, params):
            state = task.reset(key)
            return state.obs, State(jnp.int32(0), pack(state))

        def step_env(self, key, state, action, params):  # (Brax's dynamics take no key)
            new = task.step(unpack(state.brax), action)
            return new.obs, State(state.time + 1, pack(new)), new.reward, new.done > 0, {}

        def is_truncated(self, state, params):  # the limit, unless the task ended there too
            return (state.time >= params.max_steps_in_episode) & (unpack(state.brax).done == 0)

        def action_space(self, params=None):  # every Brax task's actions are in [-1, 1]
            return spaces.Box(-1.0, 1.0, (task.action_size,), jnp.float32)

        def observation_space(self, params=None):
            return spaces.Box(-jnp.inf, jnp.inf, (start.obs.shape[-1],), jnp.float32)

        def write_gif(self, states, path):
            from brax.io import image
            from PIL import Image
            physics = [unpack(s.brax).pipeline_state for s in states]
            frames = image.render_array(task.sys, physics, 240, 320)
            first, *rest = [Image.fromarray(frame) for frame in frames]
            first.save(path, format="GIF", save_all=True, append_images=rest, loop=0,
                       duration=round(1000 * task.dt))

    return BraxEnv(), Params()

