"""Twin Delayed DDPG (TD3) in one fully jitted JAX file, and DDPG by its flags.

TD3 (Fujimoto et al. 2018, https://arxiv.org/abs/1802.09477) is off-policy actor-critic for
continuous actions with a deterministic policy: twin Q critics regress on r + gamma x the smaller
of two target critics at the target policy's action plus clipped Gaussian noise (target policy
smoothing); the policy ascends the first critic's Q, and it and the targets (Polyak averaging) are
updated once every --policy-frequency critic steps (delayed updates); the envs explore by Gaussian
noise on the policy's action. DDPG (Lillicrap et al. 2016, https://arxiv.org/abs/1509.02971) is
`--num-critics 1 --policy-noise 0 --policy-frequency 1`: one critic, no smoothing, no delay. The
replay buffer is sac.py's, [num_envs, slots, ...] in the run's state (checkpoints, --resume, --pbt
and a run over several devices carry it). The environment (gymnax), the buffer and every gradient
step run inside one `jax.jit`:
    python algos/td3.py                          # Pendulum-v1, 4 seeds, 20k steps each
    python algos/td3.py --num-critics 1 --policy-noise 0 --policy-frequency 1   # DDPG
    python algos/td3.py --env-id brax/inverted_pendulum

Expect (benchmarks/results/TD3.md): Pendulum-v1's greedy policy at -200 or better (solved) on
every seed after 20k steps (16 of 16 held-out seeds, mean -152; DDPG's flags: 16 of 16, -150.5).
"""

# ============================================================================ imports
import dataclasses
from functools import partial
from typing import NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from gymnax.environments import spaces


# ============================================================================ 1. hyperparameters
@dataclasses.dataclass
class Hyperparams:
    env_id: str = "Pendulum-v1"
    """gymnax environment id, or brax/<name> (continuous action space)"""
    total_timesteps: Optional[int] = None
    """environment steps per run"""
    num_envs: Optional[int] = None
    """parallel environments per seed"""
    num_steps: Optional[int] = None
    """steps of every env per update (the runner's unit: metrics are means over one)"""
    gradient_steps: Optional[int] = None
    """gradient steps after each step of all the envs (replay ratio: this / num_envs)"""
    buffer_size: Optional[int] = None
    """replay buffer capacity in transitions (rule: min(total_timesteps, 1M); a multiple of
    num_envs)"""
    batch_size: Optional[int] = None
    """transitions per gradient step, batch_size / num_envs drawn from each env's share"""
    learning_starts: Optional[int] = None
    """environment steps of uniform random actions before the first gradient step"""
    learning_rate: Optional[tuple[float, ...]] = None
    """sweep: Adam step size of the critics, the policy and the temperature"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor"""
    tau: Optional[tuple[float, ...]] = None
    """sweep: Polyak step of the target actor and critics toward the online ones, each policy
    update"""
    exploration_noise: Optional[tuple[float, ...]] = None
    """sweep: std of the Gaussian noise on the envs' actions, in half-widths of the action range"""
    policy_noise: Optional[tuple[float, ...]] = None
    """sweep: std of the target policy smoothing's noise, in half-widths (0: none, as DDPG)"""
    noise_clip: Optional[tuple[float, ...]] = None
    """sweep: the smoothing noise clipped to [-this, this], in half-widths"""
    policy_frequency: Optional[int] = None
    """critic steps per update of the policy and of the targets (1: no delay, as DDPG)"""
    num_critics: Optional[int] = None
    """2: TD3's twin critics, the smaller target; 1: DDPG's single critic"""
    hidden_size: Optional[int] = None
    """width of the two hidden layers of the policy and of each critic"""


# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program)
UNIT, POSITIVE = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1)), ("> 0", lambda x: x > 0)
NON_NEGATIVE = (">= 0", lambda x: x >= 0)
HPARAMS = dict(learning_rate=POSITIVE, gamma=UNIT, tau=UNIT, exploration_noise=NON_NEGATIVE,
               policy_noise=NON_NEGATIVE, noise_clip=NON_NEGATIVE)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma",)
COUNTS = {"learning_starts": 0}  # the int flags that may be below 1 (all others: >= 1)
SIZE_FLAGS = ("num_envs", "buffer_size", "batch_size")


# ============================================================================ 2. environment
# The env comes from the runner (envs.make_env: gymnax's, or Brax's behind that interface); its Box
# actions are the policy's tanh scaled to [low, high], and the noises are in half-widths of it.
def perturbed(action, noise, clip, low, high):
    """action + noise clipped to [-clip, clip] (both in half-widths of [low, high]), the sum
    clipped to [low, high]: the envs' exploration (clip inf) and the target policy smoothing."""
    scale = (high - low) / 2
    return jnp.clip(action + jnp.clip(noise, -clip, clip) * scale, low, high)


# ============================================================================ 3. network
class Actor(nn.Module):
    """The deterministic policy: two hidden layers of Dense and relu, then a Dense whose tanh is
    scaled to [low, high]."""
    low: tuple
    high: tuple
    hidden_size: int = 256

    @nn.compact
    def __call__(self, obs):
        x = obs
        for _ in range(2):
            x = nn.relu(nn.Dense(self.hidden_size)(x))
        low, high = jnp.asarray(self.low), jnp.asarray(self.high)
        return low + (high - low) / 2 * (jnp.tanh(nn.Dense(len(self.low))(x)) + 1.0)


class Critic(nn.Module):
    """Q(s, a): two hidden layers of Dense and relu on [obs, action], then a linear output."""
    hidden_size: int = 256

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs, action], axis=-1)
        for _ in range(2):
            x = nn.relu(nn.Dense(self.hidden_size)(x))
        return nn.Dense(1)(x)[..., 0]


def critics(num_critics: int, hidden_size: int):
    """num_critics critics as one module of stacked parameters [num_critics, ...] (one batched
    matmul per layer): Q [num_critics, B]."""
    stacked = nn.vmap(Critic, variable_axes={"params": 0}, split_rngs={"params": True},
                      in_axes=None, out_axes=0, axis_size=num_critics)
    return stacked(hidden_size)


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # observation the action was taken in (network inputs)
    action: jax.Array        # as the env got it, in [low, high]
    reward: jax.Array
    next_obs: jax.Array      # the observation after the step, before any auto-reset
    terminated: jax.Array    # (a truncated step bootstraps: its next_obs is not terminal)


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    params: dict             # {"actor", "critic"}
    targets: dict            # {"actor", "critic"}: the target networks
    opt_state: dict          # {"actor", "critic"}: each its own Adam (the actor's steps fewer)
    # [num_envs (this device's), slots, ...], circular. A --pbt copy takes its source's buffer,
    # as its parameters: its critics were fit to that data.
    buffer: Transition
    env_state: object
    obs: jax.Array           # observations of the current step (network inputs)
    episode_return: jax.Array  # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    steps_done: jax.Array    # steps of every env so far (the buffer's write position follows)
    critic_steps: jax.Array  # gradient steps so far: every policy_frequency-th steps the policy
    exploration_noise: jax.Array  # the envs' noise in force (act's, for the sampled evaluation)


def critic_target(reward, terminated, next_q, gamma):
    """r + gamma (1 - terminated) min_i Q_i'(s', a'), next_q [num_critics, B] at the smoothed
    target action a' (TD3's clipped double Q; one critic: DDPG's); a truncated step bootstraps
    from its true last observation."""
    return reward + gamma * (1.0 - terminated) * next_q.min(0)


def polyak(target, online, tau):
    """The target parameters moved a step tau toward the online ones."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def critic_loss(critic_params, targets, actor, critic, hp, batch: Transition, noise, bounds):
    """The critics' squared errors (summed, as CleanRL's) against the target at the target
    policy's action smoothed by standard normal noise [B, A] x policy_noise, clipped."""
    next_action = perturbed(actor.apply(targets["actor"], batch.next_obs),
                            noise * hp["policy_noise"], hp["noise_clip"], *bounds)
    next_q = critic.apply(targets["critic"], batch.next_obs, next_action)
    target = critic_target(batch.reward, batch.terminated, next_q, hp["gamma"])
    q = critic.apply(critic_params, batch.obs, batch.action)  # [num_critics, B]
    loss = ((q - target) ** 2).mean(-1).sum()
    return loss, {"loss/critic": loss, "stats/q_mean": q.mean()}


def actor_loss(actor_params, critic_params, actor, critic, obs):
    """-Q_1(s, pi(s)): the policy ascends its first critic (TD3's choice, not the minimum)."""
    return -critic.apply(critic_params, obs, actor.apply(actor_params, obs))[0].mean()


def delayed_policy_step(due, actor, critic, tx, pmean, tau, obs, params, targets, actor_opt):
    """Where due (every policy_frequency-th critic step), the policy's step on the critics as they
    are now (TD3's order) and the targets' Polyak step; else none. -> (params, targets, actor_opt,
    the policy's loss: NaN where none, left out of the means). pmean: the gradient's mean over the
    run's devices. A cond: the runner's vmap makes it a select, which computes the step and
    discards it."""
    def step(params, targets, actor_opt):
        loss, grads = jax.value_and_grad(actor_loss)(params["actor"], params["critic"], actor,
                                                     critic, obs)
        updates, actor_opt = tx.update(pmean(grads), actor_opt, params["actor"])
        params = dict(params, actor=optax.apply_updates(params["actor"], updates))
        return params, polyak(targets, params, tau), actor_opt, loss

    def no_step(params, targets, actor_opt):
        return params, targets, actor_opt, jnp.float32(jnp.nan)

    return jax.lax.cond(due, step, no_step, params, targets, actor_opt)


def behaviour(key, action, noise_std, random: bool, low, high):
    """An env's action: uniform over [low, high] while random (before learning_starts), else the
    policy's action with Gaussian noise of noise_std half-widths, clipped to the box."""
    k_noise, k_uniform = jax.random.split(key)
    uniform = jax.random.uniform(k_uniform, low.shape, minval=low, maxval=high)
    noise = jax.random.normal(k_noise, low.shape) * noise_std
    return jnp.where(random, uniform, perturbed(action, noise, jnp.inf, low, high))


def store(buffer: Transition, slot, transition: Transition) -> Transition:
    """The buffer [envs, slots, ...] with every env's transition written at `slot`, behind a
    barrier: without it XLA fused the write into the next draw, which then read the old buffer and
    copied all of it at every step on a mesh of two CPU devices (docs/dqn.md measures it)."""
    written = jax.tree.map(lambda b, x: b.at[:, slot].set(x), buffer, transition)
    return jax.lax.optimization_barrier(written)


def sample(buffer: Transition, filled, keys, share: int):
    """A batch from a buffer [envs, slots, ...], `share` transitions from each env, uniform over
    its first `filled` slots, by the env's key (keys [envs]: the same batch however the envs are
    split over devices), and standard normal noise for its smoothing [envs x share, A]."""
    def one_env(env_buffer, key):
        k_index, k_noise = jax.random.split(key)
        index = jax.random.randint(k_index, (share,), 0, filled)
        noise = jax.random.normal(k_noise, (share, *env_buffer.action.shape[1:]))
        return jax.tree.map(lambda x: x[index], env_buffer), noise

    batch, noise = jax.vmap(one_env)(buffer, keys)
    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), (batch, noise))


def action_bounds(env, env_params):
    """(low, high) of the env's Box actions as numpy arrays, also where make_train is called inside
    a jit (evaluation): some gymnax spaces build them with jnp."""
    with jax.ensure_compile_time_eval():
        space = env.action_space(env_params)
        return tuple(np.broadcast_to(np.asarray(x), space.shape).astype(np.float32)
                     for x in (space.low, space.high))


def count_episodes(reward, done, episode_return, episode_length):
    """Each env's return and length so far after a step, restarted where an episode ended, and the
    ended episodes' (count, return sum, length sum), which episode_metrics averages."""
    episode_return, episode_length = episode_return + reward, episode_length + 1
    finished = (done.sum(), (episode_return * done).sum(), (episode_length * done).sum())
    return finished, jnp.where(done, 0.0, episode_return), jnp.where(done, 0, episode_length)


def episode_metrics(finished, psum):
    """How many episodes ended in an update, their mean return and length (NaN if none), from its
    steps' (count, return sum, length sum), summed over the run's devices by psum."""
    count, return_sum, length_sum = psum(jax.tree.map(lambda x: x.sum(), finished))
    return {"episode_return": jnp.where(count > 0, return_sum / count, jnp.nan),
            "episode_length": jnp.where(count > 0, length_sum / count, jnp.nan), "episodes": count}


def make_train(args, env, env_params, shard):
    """train(key, hp) -> (final RunnerState, metrics [num_updates]): one run as one program, its
    HPARAMS hp traced; train.init, train.update, train.act: the runner's contract.
    shard: this device's part of a run over several (the runner's Shard), its envs and means."""
    low, high = action_bounds(env, env_params)
    obs_shape = (int(np.prod(env.observation_space(env_params).shape)),)
    as_inputs = lambda obs: obs.reshape(-1, *obs_shape).astype(jnp.float32)
    steps_per_update = args.num_envs * args.num_steps  # the run's (all devices')
    num_updates = args.total_timesteps // steps_per_update
    slots = args.buffer_size // args.num_envs  # per env
    per_env = args.batch_size // args.num_envs  # each env's share of a batch
    actor = Actor(tuple(map(float, low)), tuple(map(float, high)), args.hidden_size)
    critic = critics(args.num_critics, args.hidden_size)
    optimiser = lambda hp: optax.adam(hp["learning_rate"])  # in each program: it closes over hp
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(hp, runner: RunnerState):
        """One step of every env (its `behaviour`, by a key of its own: the same however the envs
        are split), its transitions written at the buffer's oldest slot."""
        key, k_act, k_env = jax.random.split(runner.key, 3)
        policy = actor.apply(runner.params["actor"], runner.obs)
        random = runner.steps_done * args.num_envs < args.learning_starts
        action = jax.vmap(behaviour, in_axes=(0, 0, None, None, None, None))(
            shard.keys(k_act, args.num_envs), policy, hp["exploration_noise"], random, low, high)
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            shard.keys(k_env, args.num_envs), runner.env_state, action, env_params)
        done = jnp.logical_or(terminated, truncated)
        transition = Transition(runner.obs, action, reward, as_inputs(info["final_observation"]),
                                terminated.astype(jnp.float32))
        buffer = store(runner.buffer, runner.steps_done % slots, transition)
        finished, episode_return, episode_length = count_episodes(
            reward, done, runner.episode_return, runner.episode_length)
        runner = runner._replace(
            buffer=buffer, env_state=env_state, obs=as_inputs(next_obs),
            episode_return=episode_return, episode_length=episode_length, key=key,
            steps_done=runner.steps_done + 1, exploration_noise=hp["exploration_noise"])
        return runner, finished

    def gradient_step(hp, tx, buffer, filled, carry, key):
        """A critic step, and on every policy_frequency-th one a policy step after it."""
        params, targets, opt_state, critic_steps = carry
        batch, noise = sample(buffer, filled, shard.keys(key, args.num_envs), per_env)
        grads, stats = jax.grad(critic_loss, has_aux=True)(
            params["critic"], targets, actor, critic, hp, batch, noise, (low, high))
        updates, critic_opt = tx.update(shard.pmean(grads), opt_state["critic"], params["critic"])
        params = dict(params, critic=optax.apply_updates(params["critic"], updates))
        critic_steps = critic_steps + 1
        params, targets, actor_opt, stats["loss/actor"] = delayed_policy_step(
            critic_steps % args.policy_frequency == 0, actor, critic, tx, shard.pmean, hp["tau"],
            batch.obs, params, targets, opt_state["actor"])
        opt_state = {"actor": actor_opt, "critic": critic_opt}
        return (params, targets, opt_state, critic_steps), stats

    def step(hp, tx, runner: RunnerState, _):
        """A step of every env, then gradient_steps gradient steps once learning_starts have been
        taken (a cond: one program from the first step on)."""
        runner, finished = env_step(hp, runner)
        key, k_learn = jax.random.split(runner.key)
        carry = (runner.params, runner.targets, runner.opt_state, runner.critic_steps)
        filled = jnp.minimum(runner.steps_done, slots)

        def learn(carry):  # (the buffer outside the carry: a cond's select would copy it)
            return jax.lax.scan(partial(gradient_step, hp, tx, runner.buffer, filled), carry,
                                jax.random.split(k_learn, args.gradient_steps))

        def wait(carry):  # the statistics of no step: NaN, left out of the update's means
            shapes = jax.eval_shape(learn, carry)[1]
            return carry, jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), shapes)

        started = runner.steps_done * args.num_envs >= args.learning_starts
        (params, targets, opt_state, critic_steps), stats = jax.lax.cond(started, learn, wait,
                                                                         carry)
        runner = runner._replace(params=params, targets=targets, opt_state=opt_state,
                                 critic_steps=critic_steps, key=key)
        return runner, (finished, stats)

    def update(hp, runner: RunnerState):
        """num_steps steps of every env, each followed by its gradient steps."""
        runner, (finished, stats) = jax.lax.scan(partial(step, hp, optimiser(hp)), runner, None,
                                                 args.num_steps)
        metrics = shard.pmean({k: jnp.nanmean(v) for k, v in stats.items()})
        metrics.update(episode_metrics(finished, shard.psum))
        metrics["env_steps"] = runner.steps_done * args.num_envs
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_actor, k_critic, k_env, k_run = jax.random.split(key, 4)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            shard.keys(k_env, args.num_envs), env_params)
        obs = as_inputs(obs)
        params = {"actor": actor.init(k_actor, obs),
                  "critic": critic.init(k_critic, obs, jnp.zeros((len(obs), *low.shape)))}
        envs = len(obs)  # this device's
        empty = lambda *shape: jnp.zeros((envs, slots, *shape))
        buffer = Transition(empty(*obs_shape), empty(*low.shape), empty(), empty(*obs_shape),
                            empty())
        return RunnerState(
            params=params, targets=params,
            opt_state={part: optimiser(hp).init(p) for part, p in params.items()},
            buffer=buffer, env_state=env_state, obs=obs, episode_return=jnp.zeros(envs),
            episode_length=jnp.zeros(envs, jnp.int32), key=k_run, steps_done=jnp.int32(0),
            critic_steps=jnp.int32(0), exploration_noise=hp["exploration_noise"])

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...]: the policy's (greedy), or with the envs'
        Gaussian exploration noise; no memory from one step to the next: ()."""
        action = actor.apply(runner.params["actor"], as_inputs(obs))
        if key is None:
            return action, memory
        noise = jax.random.normal(key, action.shape) * runner.exploration_noise
        return perturbed(action, noise, jnp.inf, low, high), memory

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = lambda n: ()
    return train


# ============================================================================ 5. presets
# Presets: what each sets for a flag left unset (None) and where it comes from. An env without an
# entry takes "box"; what neither sets follows the rules of `resolve`.
# Box: CleanRL's td3_continuous_action_jax.py (gamma, tau, batch 256, the three noises, the delay
# of 2, two critics), but sac.py's BOX where it differs for gymnax's small tasks: lr 1e-3 (not
# 3e-4), two layers of 64 (not 256), 5,000 random steps (not 25,000), 100k steps (not 1M).
BOX = dict(total_timesteps=100_000, num_envs=1, num_steps=100, gradient_steps=1,
           batch_size=256, learning_starts=5_000, learning_rate=1e-3, gamma=0.99, tau=0.005,
           exploration_noise=0.1, policy_noise=0.2, noise_clip=0.5, policy_frequency=2,
           num_critics=2, hidden_size=64)
# Pendulum-v1: BOX at 20k steps, learning_starts 1000 (its episodes are 200 steps), as sac.py's.
# Brax's pendulums: BOX at 200k steps, sac.py's budget on them. Other Brax tasks take BOX.
PRESETS = {"box": BOX, "Pendulum-v1": dict(BOX, total_timesteps=20_000, learning_starts=1_000),
           "brax/inverted_pendulum": dict(BOX, total_timesteps=200_000),
           "brax/inverted_double_pendulum": dict(BOX, total_timesteps=200_000)}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id, then the rules; ValueError on a bad flag."""
    if not isinstance(space := env.action_space(env_params), spaces.Box):
        raise ValueError(f"--env-id {args.env_id!r}: TD3 here needs continuous (Box) actions, "
                         f"not {type(space).__name__}")
    preset = PRESETS.get(args.env_id, PRESETS["box"])
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    n = args.num_envs
    args = dataclasses.replace(
        args, buffer_size=args.buffer_size or -(-min(args.total_timesteps, 1_000_000) // n) * n)
    if args.buffer_size % n:
        raise ValueError(f"--buffer-size {args.buffer_size} must be a multiple of --num-envs {n}")
    if args.batch_size % n:
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple of --num-envs {n} "
                         "(each env gives an equal share)")
    if args.total_timesteps < n * args.num_steps:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one update "
                         f"(num_envs * num_steps = {n * args.num_steps})")
    return args


# ============================================================================ 6. hooks
# The runner's hooks (runner/__init__.py) that differ from its defaults: the saved model (the
# actor and the exploration noise: all act reads).
saved_model = lambda state: {"params": state.params["actor"],
                             "exploration_noise": state.exploration_noise}


# ============================================================================ 7. the tail
if __name__ == "__main__":  # run as a script: the runner (algos/runner/) trains this module
    import sys

    from runner import cli
    cli.main(sys.modules[__name__])
