"""Soft Actor-Critic (SAC) in one fully jitted JAX file.

SAC (Haarnoja et al. 2018, https://arxiv.org/abs/1801.01290) is off-policy actor-critic for
continuous actions that maximises return plus alpha x the policy's entropy: twin Q critics regress
on r + gamma (min of two target critics - alpha log pi) at an action of the policy, their targets
follow them by Polyak averaging, and a tanh-squashed Gaussian policy maximises min Q - alpha log pi
by the reparameterisation trick. The temperature alpha is learnt toward a target entropy (-|A|),
as in "SAC: Algorithms and Applications" (https://arxiv.org/abs/1812.05905). The replay buffer is
written here (no extra dependency), [num_envs, slots, ...] in the run's state, so a checkpoint,
--resume and --pbt carry it, and a run over several devices keeps each device's envs' share
(state_specs splits the env axis; flashbax's [slots, envs] would not split so). The environment
(gymnax), the buffer and every gradient step run inside one `jax.jit`:
    python algos/sac.py                          # Pendulum-v1, 4 seeds, 20k steps each
    python algos/sac.py --no-autotune --alpha 0.2    # a fixed temperature
    python algos/sac.py --env-id Swimmer-misc    # 50k steps: returns from about 60 to 370

Expect (benchmarks/results/SAC.md): Pendulum-v1's greedy policy at -200 or better (solved) on every
seed after 20k steps (16 of 16 held-out seeds, mean -150), 4 seeds in 42.5 s a whole process.
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
    anneal_lr: Optional[bool] = None
    """anneal the learning rate linearly to 0 over the run's gradient steps"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor"""
    tau: Optional[tuple[float, ...]] = None
    """sweep: Polyak step of the target critics toward the critics, each gradient step"""
    alpha: Optional[tuple[float, ...]] = None
    """sweep: entropy temperature: fixed with --no-autotune (unset: 0.2, CleanRL's), its initial
    value with --autotune (unset: the preset's)"""
    autotune: bool = True
    """learn the temperature (log alpha) toward --target-entropy"""
    target_entropy: Optional[tuple[float, ...]] = None
    """sweep: the policy entropy the temperature aims at (rule: -number of action dimensions)"""
    hidden_size: Optional[int] = None
    """width of the two hidden layers of the policy and of each critic"""
    critic_layer_norm: Optional[bool] = None
    """a LayerNorm before each hidden relu of the critics"""


# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program)
UNIT, POSITIVE = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1)), ("> 0", lambda x: x > 0)
FINITE = ("finite", jnp.isfinite)  # (jnp: --pbt checks it inside a jit)
HPARAMS = dict(learning_rate=POSITIVE, gamma=UNIT, tau=UNIT, alpha=POSITIVE,
               target_entropy=FINITE)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma",)
COUNTS = {"learning_starts": 0}  # the int flags that may be below 1 (all others: >= 1)
SIZE_FLAGS = ("num_envs", "buffer_size", "batch_size")


# ============================================================================ 2. environment
# The env comes from the runner (envs.make_env: gymnax's, or Brax's behind that interface); its Box
# actions are the policy's tanh scaled to [low, high].
def squash(u, low, high):
    """Actions in [low, high] of the Gaussian samples u, and log |d action / d u| per row; the
    log(1 - tanh(u)^2) as 2 (log 2 - u - softplus(-2u)): finite where tanh(u) rounds to 1."""
    scale = (high - low) / 2
    log_det = (2 * (np.log(2.0) - u - jax.nn.softplus(-2.0 * u)) + jnp.log(scale)).sum(-1)
    return low + scale * (jnp.tanh(u) + 1.0), log_det


# ============================================================================ 3. network
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0  # CleanRL's bounds of the policy's log std


class Actor(nn.Module):
    """The squashed Gaussian policy: two hidden layers of Dense and relu, then the mean and log
    std of u; the action is squash(u)."""
    low: tuple
    high: tuple
    hidden_size: int = 256

    @nn.compact
    def __call__(self, obs):
        x = obs
        for _ in range(2):
            x = nn.relu(nn.Dense(self.hidden_size)(x))
        mean, log_std = jnp.split(nn.Dense(2 * len(self.low))(x), 2, axis=-1)
        # A tanh into [LOG_STD_MIN, LOG_STD_MAX], not a clip: its gradient never vanishes.
        return mean, LOG_STD_MIN + (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(log_std) + 1) / 2

    def sample(self, obs, noise):
        """(action, log pi(action | obs)) from standard normal noise, reparameterised."""
        mean, log_std = self(obs)
        u = mean + jnp.exp(log_std) * noise
        gaussian = (-0.5 * noise**2 - log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        action, log_det = squash(u, jnp.asarray(self.low), jnp.asarray(self.high))
        return action, gaussian - log_det

    def greedy(self, obs):
        return squash(self(obs)[0], jnp.asarray(self.low), jnp.asarray(self.high))[0]


class Critic(nn.Module):
    """Q(s, a): two hidden layers of Dense and relu on [obs, action], then a linear output;
    with layer_norm, a LayerNorm before each relu, as RLPD's critics (Ball et al. 2023,
    https://arxiv.org/abs/2302.02948): it bounds the features a target is extrapolated from."""
    hidden_size: int = 256
    layer_norm: bool = False

    @nn.compact
    def __call__(self, obs, action):
        x = jnp.concatenate([obs, action], axis=-1)
        for _ in range(2):
            x = nn.Dense(self.hidden_size)(x)
            x = nn.relu(nn.LayerNorm()(x) if self.layer_norm else x)
        return nn.Dense(1)(x)[..., 0]


# The twin critics as one module of stacked parameters [2, ...]: one batched matmul per layer.
TwinCritic = nn.vmap(Critic, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=None, out_axes=0, axis_size=2)


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # observation the action was taken in (network inputs)
    action: jax.Array        # as the env got it, in [low, high]
    reward: jax.Array
    next_obs: jax.Array      # the observation after the step, before any auto-reset
    terminated: jax.Array    # (a truncated step bootstraps: its next_obs is not terminal)


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    params: dict             # {"actor", "critic", "log_alpha"}
    target_critic: dict
    opt_state: optax.OptState  # the optimiser itself is rebuilt from hp in every program
    # [num_envs (this device's), slots, ...], circular. A --pbt copy takes its source's buffer,
    # as its parameters: its critics were fit to that data, and a policy's own recent experience
    # is what SAC's targets assume (an empty or a foreign buffer would be another experiment).
    buffer: Transition
    env_state: object
    obs: jax.Array           # observations of the current step (network inputs)
    episode_return: jax.Array  # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    steps_done: jax.Array    # steps of every env so far (the buffer's write position follows)


def critic_target(reward, terminated, next_q1, next_q2, next_log_prob, alpha, gamma):
    """The soft Bellman target r + gamma (1 - terminated) (min(Q1', Q2') - alpha log pi(a'|s'))
    at a' ~ pi(s'); a truncated step bootstraps from its true last observation."""
    soft_value = jnp.minimum(next_q1, next_q2) - alpha * next_log_prob
    return reward + gamma * (1.0 - terminated) * soft_value


def polyak(target, online, tau):
    """The target parameters moved a step tau toward the online ones."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


def temperature_loss(log_alpha, log_prob, target_entropy):
    """J(alpha) = E[-alpha (log pi + target entropy)] (1812.05905, eq. 18): its descent raises
    alpha while the entropy -log pi is below the target and lowers it above."""
    return -(jnp.exp(log_alpha) * (log_prob + target_entropy)).mean()


def loss_fn(params, target_critic, actor, critic, hp, autotune, batch: Transition, noise):
    """The critics', the policy's and the temperature's losses as one sum, each reaching only
    its own parameters (stop_gradient elsewhere), so one Adam step takes all three; noise
    [2, B, A]: the reparameterisation's at s' and at s."""
    log_alpha = params["log_alpha"]
    alpha = jax.lax.stop_gradient(jnp.exp(log_alpha)) if autotune else hp["alpha"]
    next_action, next_log_prob = jax.lax.stop_gradient(
        actor.apply(params["actor"], batch.next_obs, noise[0], method=Actor.sample))
    next_q1, next_q2 = critic.apply(target_critic, batch.next_obs, next_action)
    target = critic_target(batch.reward, batch.terminated, next_q1, next_q2, next_log_prob,
                           alpha, hp["gamma"])
    q = critic.apply(params["critic"], batch.obs, batch.action)  # [2, B]
    critic_loss = ((q - target) ** 2).mean(-1).sum()  # the two critics' MSEs, as CleanRL's
    action, log_prob = actor.apply(params["actor"], batch.obs, noise[1], method=Actor.sample)
    q_pi = critic.apply(jax.lax.stop_gradient(params["critic"]), batch.obs, action).min(0)
    actor_loss = (alpha * log_prob - q_pi).mean()
    alpha_loss = temperature_loss(log_alpha, jax.lax.stop_gradient(log_prob),
                                  hp["target_entropy"]) if autotune else 0.0 * log_alpha
    return critic_loss + actor_loss + alpha_loss, {
        "loss/critic": critic_loss, "loss/actor": actor_loss, "loss/temperature": alpha_loss,
        "stats/alpha": alpha, "stats/entropy": -log_prob.mean(), "stats/q_mean": q.mean()}


def store(buffer: Transition, slot, transition: Transition) -> Transition:
    """The buffer [envs, slots, ...] with every env's transition written at `slot`, behind a
    barrier: without it XLA fused the write into the next draw, which then read the old buffer and
    copied all of it at every step on a mesh of two CPU devices (docs/dqn.md measures it)."""
    written = jax.tree.map(lambda b, x: b.at[:, slot].set(x), buffer, transition)
    return jax.lax.optimization_barrier(written)


def sample(buffer: Transition, filled, keys, share: int):
    """A batch from a buffer [envs, slots, ...], `share` transitions from each env, uniform over
    its first `filled` slots, by the env's key (keys [envs]: the same batch however the envs are
    split over devices), and the policy's noise for it [2, envs x share, A]."""
    def one_env(env_buffer, key):
        k_index, k_noise = jax.random.split(key)
        index = jax.random.randint(k_index, (share,), 0, filled)
        noise = jax.random.normal(k_noise, (2, share, *env_buffer.action.shape[1:]))
        return jax.tree.map(lambda x: x[index], env_buffer), noise

    batch, noise = jax.vmap(one_env)(buffer, keys)
    return (jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batch),
            jnp.swapaxes(noise, 0, 1).reshape(2, -1, *noise.shape[3:]))


def make_tx(args, hp, num_updates: int):
    """Adam from a run's traced learning rate, built in each program (it closes over hp); with
    --anneal-lr, linear to 0 over the run's gradient steps: those after each env step from the
    one that reaches learning_starts on."""
    first = max(-(-args.learning_starts // args.num_envs), 1)
    steps = (num_updates * args.num_steps - first + 1) * args.gradient_steps
    lr = hp["learning_rate"]
    return optax.adam(optax.linear_schedule(lr, 0.0, steps) if args.anneal_lr else lr)


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
    critic = TwinCritic(args.hidden_size, args.critic_layer_norm)
    optimiser = partial(make_tx, args, num_updates=num_updates)  # of a run's hp
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(runner: RunnerState):
        """One step of every env, by the policy (uniform actions before learning_starts), its
        transitions written at the buffer's oldest slot."""
        key, k_act, k_env = jax.random.split(runner.key, 3)

        def act_one(obs, key):  # each env by a key of its own: the same however they are split
            k_noise, k_uniform = jax.random.split(key)
            noise = jax.random.normal(k_noise, low.shape)
            uniform = jax.random.uniform(k_uniform, low.shape, minval=low, maxval=high)
            policy = actor.apply(runner.params["actor"], obs, noise, method=Actor.sample)[0]
            return jnp.where(runner.steps_done * args.num_envs < args.learning_starts,
                             uniform, policy)

        action = jax.vmap(act_one)(runner.obs, shard.keys(k_act, args.num_envs))
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
            steps_done=runner.steps_done + 1)
        return runner, finished

    def gradient_step(hp, tx, buffer, filled, carry, key):
        params, target_critic, opt_state = carry
        batch, noise = sample(buffer, filled, shard.keys(key, args.num_envs), per_env)
        grads, stats = jax.grad(loss_fn, has_aux=True)(params, target_critic, actor, critic, hp,
                                                       args.autotune, batch, noise)
        updates, opt_state = tx.update(shard.pmean(grads), opt_state, params)
        params = optax.apply_updates(params, updates)
        target_critic = polyak(target_critic, params["critic"], hp["tau"])
        return (params, target_critic, opt_state), stats

    def step(hp, tx, runner: RunnerState, _):
        """A step of every env, then gradient_steps gradient steps once learning_starts have been
        taken (a cond: one program from the first step on; the runner's vmap makes it a select,
        which computes the early gradient steps and discards them: Pendulum-v1, 4 seeds, as long
        with --learning-starts 1000 as with 0, 29.5 s and 29.0 s, medians of 3)."""
        runner, finished = env_step(runner)
        key, k_learn = jax.random.split(runner.key)
        carry = (runner.params, runner.target_critic, runner.opt_state)
        filled = jnp.minimum(runner.steps_done, slots)

        def learn(carry):  # (the buffer outside the carry: a cond's select would copy it)
            return jax.lax.scan(partial(gradient_step, hp, tx, runner.buffer, filled), carry,
                                jax.random.split(k_learn, args.gradient_steps))

        def wait(carry):  # the statistics of no step: NaN, left out of the update's means
            shapes = jax.eval_shape(learn, carry)[1]
            return carry, jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), shapes)

        started = runner.steps_done * args.num_envs >= args.learning_starts
        (params, target_critic, opt_state), stats = jax.lax.cond(started, learn, wait, carry)
        runner = runner._replace(params=params, target_critic=target_critic,
                                 opt_state=opt_state, key=key)
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
        params = {"actor": actor.init(k_actor, obs, jnp.zeros((len(obs), *low.shape)),
                                      method=Actor.sample),
                  "critic": critic.init(k_critic, obs, jnp.zeros((len(obs), *low.shape))),
                  "log_alpha": jnp.log(hp["alpha"]).astype(jnp.float32)}
        envs = len(obs)  # this device's
        empty = lambda *shape: jnp.zeros((envs, slots, *shape))
        buffer = Transition(empty(*obs_shape), empty(*low.shape), empty(), empty(*obs_shape),
                            empty())
        return RunnerState(
            params=params, target_critic=params["critic"], opt_state=optimiser(hp).init(params),
            buffer=buffer, env_state=env_state, obs=obs, episode_return=jnp.zeros(envs),
            episode_length=jnp.zeros(envs, jnp.int32), key=k_run, steps_done=jnp.int32(0))

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...]: the squashed mean (greedy), or sampled."""
        obs = as_inputs(obs)
        if key is None:
            return actor.apply(runner.params["actor"], obs, method=Actor.greedy), memory  # (none)
        noise = jax.random.normal(key, (len(obs), *low.shape))
        return actor.apply(runner.params["actor"], obs, noise, method=Actor.sample)[0], memory

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = lambda n: ()
    return train


# ============================================================================ 5. presets
# Presets: what each sets for a flag left unset (None) and where it comes from. An env without an
# entry takes "box"; what neither sets follows the rules of `resolve`.
# Box: CleanRL's sac_continuous_action.py (gamma, tau, batch, learning_starts, log alpha's start
# at 0, its q_lr 1e-3 for all three; the policy at every critic step, not every 2nd), but two
# layers of 64 (4x faster than 256 on CPU) and 100k steps (not 1M) for gymnax's small tasks.
BOX = dict(total_timesteps=100_000, num_envs=1, num_steps=100, gradient_steps=1,
           batch_size=256, learning_starts=5_000, learning_rate=1e-3, gamma=0.99, tau=0.005,
           alpha=1.0, hidden_size=64, critic_layer_norm=False, anneal_lr=False)
# Pendulum-v1: BOX at 20k steps, learning_starts 1000 (its episodes are 200 steps); lr 1e-3 was
# the best of a sweep of {3e-4, 1e-3} x alpha {1, 0.1} x 4 seeds (greedy -156 mean; the others
# within 7 of it). Reacher-misc, Swimmer-misc: BOX at 50k steps, measured, 4 seeds: greedy 48 to
# 55 (16 uniform), 355 to 397 (62 at 10k steps). All 2026-11-27.
# Brax (1000-step episodes). For 2 CPU cores: the pendulums, BOX at 200k steps;
# inverted_double_pendulum also with RLPD's LayerNorm in the critics and the learning rate annealed
# to 0 (4 seeds as typed: greedy 7860 to 9355; each alone, and what else was tried: README). For a
# GPU, not measured here: hopper and walker2d, Brax's own SAC (google/brax notebooks/training.ipynb,
# 128 envs, hidden 256; without its reward scaling); halfcheetah, ant and reacher, rejax's tuned
# configs/brax (128 envs, a gradient step per env step); humanoid, the SAC paper's (Haarnoja et
# al. 2018: lr 3e-4, batch 256, hidden 256, 10M steps).
BRAX_GPU = dict(BOX, num_envs=128, num_steps=10, gradient_steps=128, buffer_size=1_048_576,
                learning_starts=10_240, batch_size=512, hidden_size=256, total_timesteps=5_242_880)
BRAX = {"brax/inverted_pendulum": dict(BOX, total_timesteps=200_000),
        "brax/inverted_double_pendulum": dict(BOX, total_timesteps=200_000,
                                              critic_layer_norm=True, anneal_lr=True),
        "brax/hopper": dict(BRAX_GPU, gradient_steps=64, learning_starts=8192, learning_rate=6e-4,
                            gamma=0.997, total_timesteps=6_553_600),
        "brax/walker2d": dict(BRAX_GPU, gradient_steps=32, batch_size=128, learning_starts=8192,
                              learning_rate=6e-4, gamma=0.997, total_timesteps=7_864_320),
        "brax/halfcheetah": dict(BRAX_GPU, learning_rate=2.05e-4, gamma=0.98),
        "brax/ant": dict(BRAX_GPU, learning_rate=1.2e-4, gamma=0.95, tau=0.01),
        "brax/reacher": dict(BRAX_GPU, learning_rate=4.62e-4, gamma=0.95, tau=0.01),
        "brax/humanoid": dict(BRAX_GPU, num_envs=1, num_steps=1_000, gradient_steps=1,
                              batch_size=256, learning_rate=3e-4, buffer_size=1_000_000,
                              total_timesteps=10_000_000)}
PRESETS = {"box": BOX, "Pendulum-v1": dict(BOX, total_timesteps=20_000, learning_starts=1_000),
           "Reacher-misc": dict(BOX, total_timesteps=50_000),
           "Swimmer-misc": dict(BOX, total_timesteps=50_000), **BRAX}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id, then the rules; ValueError on a bad flag."""
    if not isinstance(space := env.action_space(env_params), spaces.Box):
        raise ValueError(f"--env-id {args.env_id!r}: SAC here needs continuous (Box) actions, "
                         f"not {type(space).__name__}")
    if args.alpha is None and not args.autotune:  # fixed: CleanRL's, not the learnt one's start
        args = dataclasses.replace(args, alpha=(0.2,))
    if args.pbt and args.autotune and len(args.alpha or ()) > 1:
        raise ValueError("--pbt cannot move --alpha while --autotune learns it (it is only its "
                         "start): add --no-autotune, or sweep it without --pbt")
    preset = PRESETS.get(args.env_id, PRESETS["box"])
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    n = args.num_envs
    args = dataclasses.replace(
        args, target_entropy=args.target_entropy or (-float(np.prod(space.shape)),),
        buffer_size=args.buffer_size or -(-min(args.total_timesteps, 1_000_000) // n) * n)
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
# actor: all act reads).
saved_model = lambda state: {"params": state.params["actor"]}


# ============================================================================ 7. the tail
if __name__ == "__main__":  # run as a script: the runner (algos/runner/) trains this module
    import sys

    from runner import cli
    cli.main(sys.modules[__name__])
