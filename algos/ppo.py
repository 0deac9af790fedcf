"""Proximal Policy Optimization (PPO) in one fully jitted JAX file.

PPO (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) collects a batch with the current
policy, then takes several epochs of minibatch steps on the clipped surrogate objective
min(r A, clip(r, 1-eps, 1+eps) A), where r is the probability ratio between the new and the
behaviour policy and A the GAE(lambda) advantage; the value loss joins the same objective.
The environment (gymnax), the rollout, GAE and every gradient step run inside one `jax.jit`:
    python algos/ppo.py                          # CartPole-v1, 4 seeds, 300k steps each
    python algos/ppo.py --num-envs 2048          # same task, 2048 envs per seed
    python algos/ppo.py --env-id Pendulum-v1     # continuous actions, 300k steps each
    python algos/ppo.py --env-id Asterix-MinAtar --capture-gif    # the CNN preset; a GIF of it

Expect (benchmarks/results): CartPole-v1 ends at 500 on 64 of 64 seeds; Pendulum-v1 at -157 (IQM),
-250 or better on 63 of 64 (RESULTS.md); MinAtar at its published PPO returns (MINATAR.md).
"""

# ============================================================================ imports
import dataclasses
from functools import partial
from typing import Literal, NamedTuple, Optional

import distrax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from gymnax.environments import spaces


# ============================================================================ 1. hyperparameters
@dataclasses.dataclass
class Hyperparams:
    env_id: str = "CartPole-v1"
    """gymnax environment id, or brax/<name> (discrete or continuous action space)"""
    total_timesteps: Optional[int] = None
    """environment steps per run (rule: max(300k, 1.5 x episode limit x num_envs))"""
    num_envs: Optional[int] = None
    """parallel environments per seed"""
    num_steps: Optional[int] = None
    """steps per environment per rollout (rule: 2048 // num_envs clipped to [16, 128])"""
    num_minibatches: Optional[int] = None
    """minibatches per epoch (rule: the largest divisor of the batch <= batch / 512, in [4, 32])"""
    update_epochs: Optional[int] = None
    """passes over each batch"""
    learning_rate: Optional[tuple[float, ...]] = None
    """sweep: Adam step size, annealed linearly to 0 with --anneal-lr"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor"""
    gae_lambda: Optional[tuple[float, ...]] = None
    """sweep: lambda of GAE(lambda)"""
    clip_coef: Optional[tuple[float, ...]] = None
    """sweep: surrogate clipping epsilon"""
    clip_vloss: bool = False
    """clip the value loss around the behaviour values as in the PPO2 code"""
    ent_coef: Optional[tuple[float, ...]] = None
    """sweep: entropy bonus coefficient"""
    vf_coef: tuple[float, ...] = (0.5,)
    """sweep: value loss coefficient"""
    max_grad_norm: tuple[float, ...] = (0.5,)
    """sweep: global gradient-norm clip"""
    network: Optional[Literal["mlp", "cnn"]] = None
    """separate MLPs on the flattened observation, or MinAtar's CNN shared by both heads"""
    hidden_size: Optional[int] = None
    """width of the MLPs' two hidden layers"""
    activation: Optional[Literal["tanh", "relu"]] = None
    """the MLPs' hidden activation"""
    normalize_obs: Optional[bool] = None
    """running observation normalisation"""
    normalize_reward: Optional[bool] = None
    """scale rewards by a running std of the discounted return"""


# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program)
UNIT, NON_NEGATIVE = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1)), (">= 0", lambda x: x >= 0)
POSITIVE = ("> 0", lambda x: x > 0)  # (a gradient clip of 0 would zero every step)
HPARAMS = dict(learning_rate=POSITIVE, gamma=UNIT, gae_lambda=UNIT, ent_coef=NON_NEGATIVE,
               clip_coef=NON_NEGATIVE, vf_coef=NON_NEGATIVE, max_grad_norm=POSITIVE)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma", "gae_lambda")
SIZE_FLAGS = ("num_envs", "num_steps")


# ============================================================================ 2. environment
class RunningStats(NamedTuple):
    """Running mean and variance (parallel Welford), for observation and return normalisation."""
    mean: jax.Array
    var: jax.Array
    count: jax.Array

    def update(self, batch, psum=lambda x: x):
        """The statistics with batch [n, ...] added: a device's share; psum adds the run's count,
        sum and squares about the mean so far in one all-reduce."""
        b_count, b_sum, b_squares = psum((jnp.float32(len(batch)), batch.sum(0),
                                          ((batch - self.mean) ** 2).sum(0)))
        delta, total = b_sum / b_count - self.mean, self.count + b_count
        b_var = jnp.maximum(b_squares / b_count - delta**2, 0.0)  # rounding can take it below 0
        mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        return RunningStats(mean, m2 / total, total)


def normalize(obs, stats: RunningStats, enabled: bool):
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -10, 10) if enabled else obs


def scale_reward(reward, done, discounted_return, stats: RunningStats, gamma, enabled: bool, psum):
    """Reward scaling as gym's NormalizeReward: the reward over the running std of each env's
    discounted return -> (scaled reward, discounted return restarted where done, its statistics)."""
    discounted_return = discounted_return * gamma + reward
    if enabled:
        stats = stats.update(discounted_return[:, None], psum)
        reward = reward / jnp.sqrt(stats.var[0] + 1e-8)
    return reward, jnp.where(done, 0.0, discounted_return), stats


def env_interface(args, env, env_params):
    """(obs_shape, as_inputs, action_space, to_env): the network's inputs from the env's
    observations (any rank flattened for the MLP, images for the CNN) and the env's actions
    from the network's (a Box's clipped to its bounds)."""
    action_space = env.action_space(env_params)
    obs_shape = env.observation_space(env_params).shape
    obs_shape = obs_shape if args.network == "cnn" else (int(np.prod(obs_shape)),)
    as_inputs = lambda obs: obs.reshape(-1, *obs_shape).astype(jnp.float32)
    if not isinstance(action_space, spaces.Box):
        return obs_shape, as_inputs, action_space, lambda action: action
    clip = partial(jnp.clip, min=action_space.low, max=action_space.high)
    return obs_shape, as_inputs, action_space, clip


# ============================================================================ 3. network
class MinAtarCNN(nn.Module):
    """MinAtar's (Young & Tian 2019): 16 filters of 3x3, a dense layer of 128, relu, on [..., H, W,
    C]; the convolution as a dense layer on 3x3 patches (vmapped, XLA's CPU one is slower)."""

    @nn.compact
    def __call__(self, x):
        dense = lambda size: nn.Dense(size, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))
        h, w = x.shape[-3] - 2, x.shape[-2] - 2
        x = nn.relu(dense(16)(jnp.concatenate([x[..., i:i + h, j:j + w, :]
                                               for i in range(3) for j in range(3)], axis=-1)))
        return nn.relu(dense(128)(x.reshape(*x.shape[:-3], -1)))


class ActorCritic(nn.Module):
    """Policy and value heads on MLPs of their own, or on one MinAtarCNN they share (MinAtar's
    network: half the work of two)."""
    action_dim: int
    continuous: bool
    hidden_size: int = 64
    network: str = "mlp"
    activation: str = "tanh"

    def setup(self):
        dense = lambda size, scale: nn.Dense(size, kernel_init=nn.initializers.orthogonal(scale))
        act, size = getattr(nn, self.activation), self.hidden_size
        mlp = lambda: [] if self.network == "cnn" else [dense(size, np.sqrt(2)), act,
                                                        dense(size, np.sqrt(2)), act]
        self.torso = MinAtarCNN() if self.network == "cnn" else lambda x: x
        self.actor = nn.Sequential(mlp() + [dense(self.action_dim, 0.01)])
        self.critic = nn.Sequential(mlp() + [dense(1, 1.0)])
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def __call__(self, obs):  # (the policy or the value alone: XLA drops the other's work)
        features = self.torso(obs)
        out, value = self.actor(features), self.critic(features)[..., 0]
        if self.continuous:
            return distrax.MultivariateNormalDiag(out, jnp.exp(self.log_std)), value
        return distrax.Categorical(logits=out), value

    def policy(self, obs) -> distrax.Distribution:
        return self(obs)[0]

    def value(self, obs) -> jax.Array:
        return self(obs)[1]


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # normalised observation the action was chosen from
    action: jax.Array
    log_prob: jax.Array      # behaviour log-probability
    value: jax.Array         # V(obs) by the behaviour parameters
    reward: jax.Array        # (scaled) reward used for learning
    next_value: jax.Array    # V of the observation after the step, before any auto-reset
    terminated: jax.Array
    truncated: jax.Array


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    params: dict
    opt_state: optax.OptState  # the optimiser itself is rebuilt from hp in every program
    env_state: object
    obs: jax.Array           # raw observations of the current step
    obs_stats: RunningStats
    return_stats: RunningStats
    discounted_return: jax.Array  # per env, for reward scaling
    episode_return: jax.Array     # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    updates_done: jax.Array


def compute_gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    """GAE(lambda) over a [T, N] rollout by a reversed scan. next_values[t] is V of the observation
    after step t *before* auto-reset, so a truncated step bootstraps from its true final
    observation; a terminated step does not bootstrap; the advantage recursion stops at either."""
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values
    masks = gamma * gae_lambda * (1.0 - jnp.maximum(terminated, truncated))

    def step(adv_next, x):
        delta, mask = x
        adv = delta + mask * adv_next
        return adv, adv

    _, advantages = jax.lax.scan(step, jnp.zeros_like(deltas[0]), (deltas, masks), reverse=True)
    return advantages, advantages + values


def standardize(x, psum=lambda x: x):
    """(x - mean) / std, over a device's share of a run's x when psum adds the shares."""
    count = psum(x.size)
    mean = psum(x.sum()) / count
    return (x - mean) / (jnp.sqrt(psum(((x - mean) ** 2).sum()) / count) + 1e-8)


def loss_fn(params, network, hp, clip_vloss, batch: Transition, advantages, targets):
    """PPO's loss on one minibatch, its advantages standardized, and its statistics; hp holds
    clip_coef, vf_coef, ent_coef."""
    dist, values = network.apply(params, batch.obs)
    log_prob = dist.log_prob(batch.action)
    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    clip = hp["clip_coef"]
    policy_loss = -jnp.minimum(ratio * advantages,
                               jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * advantages).mean()
    if clip_vloss:
        clipped = batch.value + jnp.clip(values - batch.value, -clip, clip)
        value_loss = 0.5 * jnp.maximum((values - targets) ** 2, (clipped - targets) ** 2).mean()
    else:
        value_loss = 0.5 * ((values - targets) ** 2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + hp["vf_coef"] * value_loss - hp["ent_coef"] * entropy
    return loss, {"loss/policy": policy_loss, "loss/value": value_loss, "loss/entropy": entropy,
                  "stats/approx_kl": ((ratio - 1.0) - log_ratio).mean(),
                  "stats/clip_frac": (jnp.abs(ratio - 1.0) > clip).mean()}


def make_tx(args, hp, num_updates):
    """Adam from a run's traced learning rate (annealed to 0 over its minibatch steps), after a clip
    of the gradients' global norm: built in each program, since it closes over the traced hp."""
    lr, steps = hp["learning_rate"], num_updates * args.update_epochs * args.num_minibatches
    return optax.chain(optax.clip_by_global_norm(hp["max_grad_norm"]), optax.adam(
        optax.linear_schedule(lr, 0.0, steps) if args.anneal_lr else lr, eps=1e-5))


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
    obs_shape, as_inputs, action_space, to_env = env_interface(args, env, env_params)
    continuous = isinstance(action_space, spaces.Box)
    action_dim = action_space.shape[0] if continuous else action_space.n
    batch_size = args.num_envs * args.num_steps  # the run's (all devices')
    num_updates = args.total_timesteps // batch_size
    network = ActorCritic(action_dim, continuous, args.hidden_size, args.network, args.activation)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(hp, runner: RunnerState, _):
        obs_stats = (runner.obs_stats.update(runner.obs, shard.psum) if args.normalize_obs
                     else runner.obs_stats)
        obs = normalize(runner.obs, obs_stats, args.normalize_obs)
        key, k_act, k_env = jax.random.split(runner.key, 3)

        def act_one(obs, key):  # each env by a key of its own: the same however they are split
            dist, value = network.apply(runner.params, obs)
            return *dist.sample_and_log_prob(seed=key), value

        action, log_prob, value = jax.vmap(act_one)(obs, shard.keys(k_act, args.num_envs))
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            shard.keys(k_env, args.num_envs), runner.env_state, to_env(action), env_params)
        done = jnp.logical_or(terminated, truncated)
        terminated, truncated = terminated.astype(jnp.float32), truncated.astype(jnp.float32)
        scaled_reward, discounted_return, return_stats = scale_reward(
            reward, done, runner.discounted_return, runner.return_stats, hp["gamma"],
            args.normalize_reward, shard.psum)
        finished, episode_return, episode_length = count_episodes(
            reward, done, runner.episode_return, runner.episode_length)
        # V here, num_envs at a time, not after the rollout: it stays in cache (CNN: 1.9x faster)
        final_obs = normalize(as_inputs(info["final_observation"]), obs_stats, args.normalize_obs)
        next_value = network.apply(runner.params, final_obs, method=ActorCritic.value)
        transition = Transition(obs, action, log_prob, value, scaled_reward, next_value,
                                terminated, truncated)
        runner = runner._replace(
            env_state=env_state, obs=as_inputs(next_obs), obs_stats=obs_stats,
            return_stats=return_stats, discounted_return=discounted_return,
            episode_return=episode_return, episode_length=episode_length, key=key)
        return runner, (transition, finished)

    def update_minibatch(hp, tx, carry, minibatch):
        params, opt_state = carry
        grads, stats = jax.grad(loss_fn, has_aux=True)(params, network, hp, args.clip_vloss,
                                                       *minibatch)
        updates, opt_state = tx.update(shard.pmean(grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), stats

    def update_epoch(hp, tx, carry, _):
        params, opt_state, batch, key = carry
        key, k_perm = jax.random.split(key)
        traj, advantages, targets = shard.minibatches(k_perm, batch, args.num_minibatches)
        # Each minibatch's advantages standardized over it (all the run's devices' shares: here,
        # for all minibatches at once, not a collective in each step)
        advantages = jax.vmap(partial(standardize, psum=shard.psum))(advantages)
        (params, opt_state), stats = jax.lax.scan(partial(update_minibatch, hp, tx),
                                                  (params, opt_state), (traj, advantages, targets))
        return (params, opt_state, batch, key), stats

    def update(hp, runner: RunnerState):
        """One rollout of num_steps in every env, then update_epochs passes of minibatch steps."""
        runner, (traj, finished) = jax.lax.scan(partial(env_step, hp), runner, None,
                                                args.num_steps)
        advantages, targets = compute_gae(traj.reward, traj.value, traj.next_value, traj.terminated,
                                          traj.truncated, hp["gamma"], hp["gae_lambda"])
        batch = (traj, advantages, targets)
        key, k_epochs = jax.random.split(runner.key)
        (params, opt_state, _, _), stats = jax.lax.scan(
            partial(update_epoch, hp, make_tx(args, hp, num_updates)),
            (runner.params, runner.opt_state, batch, k_epochs), None, args.update_epochs)
        runner = runner._replace(params=params, opt_state=opt_state, key=key,
                                 updates_done=runner.updates_done + 1)
        metrics = shard.pmean({k: v.mean() for k, v in stats.items()})
        metrics.update(episode_metrics(finished, shard.psum))
        metrics["env_steps"] = runner.updates_done * batch_size
        # The rate in force at the update's first step (make_tx's schedule, before this update)
        annealed = 1 - (runner.updates_done - 1) / num_updates if args.anneal_lr else 1
        metrics["charts/learning_rate"] = hp["learning_rate"] * annealed
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = network.init(k_init, jnp.zeros(obs_shape))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            shard.keys(k_env, args.num_envs), env_params)
        stats = lambda shape: RunningStats(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))
        envs = len(obs)  # this device's
        return RunnerState(
            params=params, opt_state=make_tx(args, hp, num_updates).init(params),
            env_state=env_state, obs=as_inputs(obs), obs_stats=stats(obs_shape),
            return_stats=stats((1,)), discounted_return=jnp.zeros(envs),
            episode_return=jnp.zeros(envs), episode_length=jnp.zeros(envs, jnp.int32),
            key=k_run, updates_done=jnp.int32(0))

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...], normalisation frozen: sampled, or greedy."""
        obs = normalize(as_inputs(obs), runner.obs_stats, args.normalize_obs)
        dist = network.apply(runner.params, obs, method=ActorCritic.policy)
        return to_env(dist.mode() if key is None else dist.sample(seed=key)), memory  # (none)

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = lambda n: ()
    return train


# ============================================================================ 5. presets
# Presets: what each sets for a flag left unset (None) and where it comes from. An env without an
# entry takes its action space's (discrete, box); what neither sets follows the rules of `resolve`.
# Discrete: a 12-configuration x 32-seed sweep on CartPole-v1 (benchmarks/robustness.py).
DISCRETE = dict(num_envs=32, update_epochs=4, learning_rate=2.5e-3, gamma=0.99, gae_lambda=0.95,
                clip_coef=0.1, ent_coef=0.01, network="mlp", hidden_size=64, activation="tanh",
                normalize_obs=False, normalize_reward=False)
# Continuous: Pendulum-v1 (results/robustness_candidates.md); gamma 0.95 suits its dense reward.
CONTINUOUS = dict(DISCRETE, num_envs=16, num_steps=256, update_epochs=10, learning_rate=1e-3,
                  gamma=0.95, clip_coef=0.2, ent_coef=0.0, total_timesteps=300_000,
                  normalize_obs=True, normalize_reward=True)
# MinAtar: each game's least wall time to its published return on 2 cores (MINATAR_SEARCH.md).
# PureJaxRL's examples/brax_minatar.ipynb without its value clipping, 3M steps (not 10M); MinAtar's
# CNN on 2 epochs, 1.5M steps, for Asterix and Freeway, which that MLP does not learn in 3M, and
# Seaquest (no published return: the CNN's evaluation was the better at 1M steps).
MINATAR = dict(DISCRETE, num_envs=64, num_steps=128, num_minibatches=8, activation="relu",
               learning_rate=5e-3, clip_coef=0.2, total_timesteps=3_000_000)
MINATAR_CNN = dict(MINATAR, network="cnn", update_epochs=2, total_timesteps=1_500_000)
# Brax, 1000-step episodes. For 2 CPU cores: inverted_pendulum, CONTINUOUS at gamma 0.99 (BRAX.md);
# hopper, walker2d: PureJaxRL's ppo_continuous_action.py at 5M steps (not 50M). For a GPU (3 timed
# on an H200, GPU.md): Brax's PPO (google/brax notebooks/training.ipynb; unrolls as envs x steps).
PUREJAXRL = dict(CONTINUOUS, num_envs=2048, num_steps=10, num_minibatches=32, update_epochs=4,
                 learning_rate=3e-4, gamma=0.99, hidden_size=256, total_timesteps=5_000_000)
BRAX_GPU = dict(PUREJAXRL, num_steps=80, hidden_size=64, gamma=0.97, clip_coef=0.3, ent_coef=1e-2,
                total_timesteps=50_000_000)
LONG_UNROLLS = dict(BRAX_GPU, num_steps=160, update_epochs=8, ent_coef=1e-3)
BRAX = {"brax/inverted_pendulum": dict(CONTINUOUS, gamma=0.99, total_timesteps=200_000),
        "brax/inverted_double_pendulum": dict(BRAX_GPU, total_timesteps=20_000_000),
        "brax/reacher": dict(LONG_UNROLLS, num_steps=200, gamma=0.95),
        "brax/hopper": PUREJAXRL, "brax/walker2d": PUREJAXRL,
        "brax/ant": dict(BRAX_GPU, num_envs=4096),
        "brax/halfcheetah": dict(LONG_UNROLLS, gamma=0.95), "brax/humanoid": LONG_UNROLLS}
PRESETS = {"discrete": DISCRETE, "box": CONTINUOUS, "CartPole-v1": DISCRETE,
           "Pendulum-v1": CONTINUOUS,
           "Acrobot-v1": dict(DISCRETE, total_timesteps=500_000),  # the gymnax README's budget
           # After gymnax-blines' MountainCar-v0/ppo.yaml: 32 envs (not 16), grad norm 0.5 (1.0),
           # lr annealed to 0 (to 5e-4 after a warm-up), tanh (relu), normalised observations.
           "MountainCar-v0": dict(DISCRETE, num_steps=32, num_minibatches=4, update_epochs=64,
                                  learning_rate=5e-3, clip_coef=0.2, ent_coef=0.003,
                                  normalize_obs=True, total_timesteps=500_000),
           # Breakout: entropy 0.05, not 0.01, at which a seed can stall (BREAKOUT_SEARCH.md).
           "Breakout-MinAtar": dict(MINATAR, ent_coef=0.05), "SpaceInvaders-MinAtar": MINATAR,
           **dict.fromkeys(("Asterix-MinAtar", "Freeway-MinAtar", "Seaquest-MinAtar"), MINATAR_CNN),
           **BRAX}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id, then the rules; ValueError on a bad flag."""
    if not isinstance(space := env.action_space(env_params), (spaces.Discrete, spaces.Box)):
        raise ValueError(f"--env-id {args.env_id!r} has an action space PPO here does not handle")
    preset = PRESETS.get(args.env_id, PRESETS[type(space).__name__.lower()])
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    num_steps = args.num_steps or int(np.clip(2048 // args.num_envs, 16, 128))
    batch_size = args.num_envs * num_steps
    most = int(np.clip(batch_size // 512, 4, 32))
    args = dataclasses.replace(
        args, num_steps=num_steps,
        # An env needs a whole episode (500 steps in CartPole-v1) before it reports a return.
        total_timesteps=args.total_timesteps or max(
            300_000, int(1.5 * env_params.max_steps_in_episode * args.num_envs)),
        num_minibatches=args.num_minibatches or max(
            d for d in range(1, most + 1) if batch_size % d == 0))
    if batch_size % args.num_minibatches:
        raise ValueError(f"--num-minibatches {args.num_minibatches} must divide the batch "
                         f"num_envs * num_steps = {batch_size}")
    if args.total_timesteps < batch_size:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                         f"(num_envs * num_steps = {batch_size})")
    if args.network == "cnn" and len(shape := env.observation_space(env_params).shape) != 3:
        raise ValueError(f"--network cnn needs image observations; {args.env_id}'s are {shape}")
    return args


# ============================================================================ 6. hooks
# The runner's hooks (runner/__init__.py) that differ from its defaults: the saved model.
saved_model = lambda state: {"params": state.params, "obs_mean": state.obs_stats.mean,
                             "obs_var": state.obs_stats.var}


# ============================================================================ 7. the tail
if __name__ == "__main__":  # run as a script: the runner (algos/runner/) trains this module
    import sys

    from runner import cli
    cli.main(sys.modules[__name__])
