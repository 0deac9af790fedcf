"""Proximal Policy Optimization with a recurrent (GRU) policy in one fully jitted JAX file.

ppo.py's PPO (Schulman et al. 2017, https://arxiv.org/abs/1707.06347) with a GRU between torso
and heads, zeroed at each episode's start, for tasks whose observations do not show all a policy
needs (PureJaxRL's ppo_rnn.py, CleanRL's ppo_atari_lstm.py). The update re-runs each env's rollout
from its state at the rollout's start: a minibatch is a set of whole envs. All in one `jax.jit`:
    python algos/ppo_rnn.py                              # CartPole-v1, 4 seeds, 300k steps each
    python algos/ppo_rnn.py --env-id MemoryChain-bsuite  # recall a bit seen 5 steps before
    python algos/ppo_rnn.py --mask-velocity              # CartPole-v1 without its velocities
Expect (benchmarks/results/RNN.md, 4 seeds, greedy evaluation [final training return per seed]):
CartPole-v1 500 [500 on 3 seeds, 470.4]; without velocities 499.4 at 1M steps [373 to 500];
Pendulum-v1 without velocities -175 [-164 to -210]; MemoryChain-bsuite 1 [1 on each] (ppo.py 0.02).
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
    mask_velocity: bool = False
    """hide the velocities of CartPole-v1 or Pendulum-v1: a task that needs memory (POMDP)"""
    total_timesteps: Optional[int] = None
    """environment steps per run (rule: max(300k, 1.5 x episode limit x num_envs))"""
    num_envs: Optional[int] = None
    """parallel environments per seed"""
    num_steps: Optional[int] = None
    """steps per environment per rollout (rule: 2048 // num_envs clipped to [16, 128])"""
    num_minibatches: Optional[int] = None
    """minibatches of whole envs per epoch (rule: the largest divisor of num_envs <= 4)"""
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
    """a dense layer on the flattened observation, or MinAtar's CNN, before the GRU"""
    hidden_size: Optional[int] = None
    """width of the dense layers and of the GRU's hidden state"""
    activation: Optional[Literal["tanh", "relu"]] = None
    """the dense layers' activation"""
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
COUNTS = {}  # the int flags that may be below 1 (all others: >= 1): none
SIZE_FLAGS = ("num_envs", "num_steps")
POSITIONS = {"CartPole-v1": [0, 2], "Pendulum-v1": [0, 1]}  # --mask-velocity's (as POPGym's)


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
    observations (--mask-velocity's kept; any rank flattened for the MLP, images for the CNN) and
    the env's actions from the network's (a Box's clipped to its bounds)."""
    action_space = env.action_space(env_params)
    kept = POSITIONS[args.env_id] if args.mask_velocity else slice(None)
    obs_shape = np.zeros(env.observation_space(env_params).shape)[..., kept].shape
    obs_shape = obs_shape if args.network == "cnn" else (int(np.prod(obs_shape)),)
    as_inputs = lambda obs: obs[..., kept].reshape(-1, *obs_shape).astype(jnp.float32)
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


@partial(nn.scan, variable_broadcast="params", split_rngs={"params": False}, in_axes=1, out_axes=1)
def gru_over_steps(cell: nn.GRUCell, memory, inputs):
    """The GRU over [N, T, ...] inputs; in the scan, zeroed where `first` [N, T] starts episodes"""
    x, first = inputs
    return cell(jnp.where(first[..., None], 0.0, memory), x)


class ActorCritic(nn.Module):
    """A torso (a dense layer or the MinAtarCNN), the GRU, heads of a dense layer (CNN: linear)."""
    action_dim: int
    continuous: bool
    hidden_size: int = 64
    network: str = "mlp"
    activation: str = "tanh"

    def setup(self):
        dense = lambda size, scale: nn.Dense(size, kernel_init=nn.initializers.orthogonal(scale))
        act, size = getattr(nn, self.activation), self.hidden_size
        head = lambda: [] if self.network == "cnn" else [dense(size, np.sqrt(2)), act]
        self.torso = MinAtarCNN() if self.network == "cnn" else nn.Sequential(head())
        self.gru = nn.GRUCell(size)
        self.actor = nn.Sequential(head() + [dense(self.action_dim, 0.01)])
        self.critic = nn.Sequential(head() + [dense(1, 1.0)])
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def __call__(self, memory, obs, first):
        """memory [N, hidden] before obs [N, T, ...], first [N, T] -> after; policy, value [N, T]"""
        memory, features = gru_over_steps(self.gru, memory, (self.torso(obs), first))
        out, value = self.actor(features), self.critic(features)[..., 0]
        if self.continuous:
            return memory, distrax.MultivariateNormalDiag(out, jnp.exp(self.log_std)), value
        return memory, distrax.Categorical(logits=out), value

    def initial_memory(self, n: int):  # as at an episode's first step (the GRU zeroes it there)
        return jnp.zeros((n, self.hidden_size))


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # normalised observation the action was chosen from
    first: jax.Array         # obs is an episode's first: the GRU met it with a zero hidden state
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
    first: jax.Array         # obs starts an episode (the last step ended one)
    memory: jax.Array        # the GRU's hidden state before obs, [num_envs, hidden_size]
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


def loss_fn(params, network, hp, clip_vloss, memory, batch: Transition, advantages, targets):
    """PPO's loss on a minibatch of whole envs ([envs, T]) re-run from their rollout-start memory,
    its advantages standardized, and its statistics; hp holds clip_coef, vf_coef, ent_coef."""
    _, dist, values = network.apply(params, memory, batch.obs, batch.first)
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
    HPARAMS hp traced; train.init, train.update, train.act: the runner's contract at the fence.
    shard: this device's part of a run over several (the runner's Shard), its envs and means."""
    obs_shape, as_inputs, action_space, to_env = env_interface(args, env, env_params)
    continuous = isinstance(action_space, spaces.Box)
    action_dim = action_space.shape[0] if continuous else action_space.n
    batch_size = args.num_envs * args.num_steps  # the run's (all devices')
    num_updates = args.total_timesteps // batch_size
    network = ActorCritic(action_dim, continuous, args.hidden_size, args.network, args.activation)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def step(params, memory, obs, first):  # one step of N envs (obs [N, ...]): sequences of 1
        memory, dist, value = network.apply(params, memory, obs[:, None], first[:, None])
        return memory, dist[:, 0], value[:, 0]

    def env_step(hp, runner: RunnerState, _):
        obs_stats = (runner.obs_stats.update(runner.obs, shard.psum) if args.normalize_obs
                     else runner.obs_stats)
        obs = normalize(runner.obs, obs_stats, args.normalize_obs)
        key, k_act, k_env = jax.random.split(runner.key, 3)

        def act_one(memory, obs, first, key):  # each env by a key of its own, however split
            memory, dist, value = step(runner.params, memory[None], obs[None], first[None])
            action, log_prob = dist.sample_and_log_prob(seed=key)
            return memory[0], action[0], log_prob[0], value[0]

        memory, action, log_prob, value = jax.vmap(act_one)(
            runner.memory, obs, runner.first, shard.keys(k_act, args.num_envs))
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            shard.keys(k_env, args.num_envs), runner.env_state, to_env(action), env_params)
        done = jnp.logical_or(terminated, truncated)
        terminated, truncated = terminated.astype(jnp.float32), truncated.astype(jnp.float32)
        scaled_reward, discounted_return, return_stats = scale_reward(
            reward, done, runner.discounted_return, runner.return_stats, hp["gamma"],
            args.normalize_reward, shard.psum)
        finished, episode_return, episode_length = count_episodes(
            reward, done, runner.episode_return, runner.episode_length)
        # V(final obs) by the episode's memory, before the reset (PureJaxRL's ignores truncation)
        final_obs = normalize(as_inputs(info["final_observation"]), obs_stats, args.normalize_obs)
        next_value = step(runner.params, memory, final_obs, jnp.zeros_like(done))[2]
        transition = Transition(obs, runner.first, action, log_prob, value, scaled_reward,
                                next_value, terminated, truncated)
        runner = runner._replace(
            env_state=env_state, obs=as_inputs(next_obs), obs_stats=obs_stats,
            return_stats=return_stats, discounted_return=discounted_return, first=done,
            episode_return=episode_return, episode_length=episode_length, memory=memory, key=key)
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
        # Whole envs ([1, n, ...]): minibatch i takes env i of every block of num_minibatches
        memory, traj, advantages, targets = shard.minibatches(
            k_perm, jax.tree.map(lambda x: x[None], batch), args.num_minibatches)
        # Each minibatch's advantages standardized over it (all the run's devices' shares: here,
        # for all minibatches at once, not a collective in each step)
        advantages = jax.vmap(partial(standardize, psum=shard.psum))(advantages)
        (params, opt_state), stats = jax.lax.scan(partial(update_minibatch, hp, tx),
                                                  (params, opt_state),
                                                  (memory, traj, advantages, targets))
        return (params, opt_state, batch, key), stats

    def update(hp, runner: RunnerState):
        """One rollout of num_steps in every env, then update_epochs passes of minibatch steps."""
        memory = runner.memory  # each env's state at the rollout's start: its re-run's start
        runner, (traj, finished) = jax.lax.scan(partial(env_step, hp), runner, None,
                                                args.num_steps)
        advantages, targets = compute_gae(traj.reward, traj.value, traj.next_value, traj.terminated,
                                          traj.truncated, hp["gamma"], hp["gae_lambda"])
        batch = (memory, *jax.tree.map(lambda x: x.swapaxes(0, 1), (traj, advantages, targets)))
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
        params = network.init(k_init, network.initial_memory(1), jnp.zeros((1, 1, *obs_shape)),
                              jnp.ones((1, 1), bool))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            shard.keys(k_env, args.num_envs), env_params)
        stats = lambda shape: RunningStats(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))
        envs = len(obs)  # this device's
        return RunnerState(
            params=params, opt_state=make_tx(args, hp, num_updates).init(params),
            env_state=env_state, obs=as_inputs(obs), obs_stats=stats(obs_shape),
            return_stats=stats((1,)), first=jnp.ones(envs, bool),
            memory=network.initial_memory(envs), discounted_return=jnp.zeros(envs),
            episode_return=jnp.zeros(envs), episode_length=jnp.zeros(envs, jnp.int32),
            key=k_run, updates_done=jnp.int32(0))

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...], normalisation frozen: sampled, or greedy."""
        obs = normalize(as_inputs(obs), runner.obs_stats, args.normalize_obs)
        memory, dist, _ = step(runner.params, memory, obs, jnp.zeros(len(obs), bool))
        return to_env(dist.mode() if key is None else dist.sample(seed=key)), memory

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = network.initial_memory
    return train


# ============================================================================ 5. presets
# Presets: what each sets for a flag left unset (None) and where it comes from. An env without an
# entry takes its action space's (discrete, box); what neither sets follows the rules of `resolve`.
# Discrete: ppo.py's CartPole-v1 preset at lr 5e-3: 500 on 12 of 12 seeds (at its 2.5e-3: 1 of 4)
DISCRETE = dict(num_envs=32, update_epochs=4, learning_rate=5e-3, gamma=0.99, gae_lambda=0.95,
                clip_coef=0.1, ent_coef=0.01, network="mlp", hidden_size=64, activation="tanh",
                normalize_obs=False, normalize_reward=False)
# Continuous: ppo.py's Pendulum-v1 preset; -171 at 300k steps with --mask-velocity (4 seeds).
# CartPole-v1 without velocities: greedy 428-500 at 1M; MemoryChain-bsuite: greedy 1 on 8 of 8 seeds
CONTINUOUS = dict(DISCRETE, num_envs=16, num_steps=256, update_epochs=10, learning_rate=1e-3,
                  gamma=0.95, clip_coef=0.2, ent_coef=0.0, total_timesteps=300_000,
                  normalize_obs=True, normalize_reward=True)
PRESETS = {"discrete": DISCRETE, "box": CONTINUOUS, "CartPole-v1": DISCRETE,
           "Pendulum-v1": CONTINUOUS, "MemoryChain-bsuite": dict(DISCRETE, total_timesteps=100_000),
           "CartPole-v1 --mask-velocity": dict(DISCRETE, total_timesteps=1_000_000)}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id, then the rules; ValueError on a bad flag."""
    if not isinstance(space := env.action_space(env_params), (spaces.Discrete, spaces.Box)):
        raise ValueError(f"--env-id {args.env_id!r} has an action space PPO here does not handle")
    if args.mask_velocity and args.env_id not in POSITIONS:
        raise ValueError(f"--mask-velocity hides velocities of {' and '.join(POSITIONS)} only")
    preset = PRESETS.get(args.env_id, PRESETS[type(space).__name__.lower()])
    preset = PRESETS.get(f"{args.env_id} --mask-velocity", preset) if args.mask_velocity else preset
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    num_steps = args.num_steps or int(np.clip(2048 // args.num_envs, 16, 128))
    batch_size = args.num_envs * num_steps
    args = dataclasses.replace(
        args, num_steps=num_steps,
        # An env needs a whole episode (500 steps in CartPole-v1) before it reports a return.
        total_timesteps=args.total_timesteps or max(
            300_000, int(1.5 * env_params.max_steps_in_episode * args.num_envs)),
        num_minibatches=args.num_minibatches or max(
            d for d in range(1, 5) if args.num_envs % d == 0))
    if args.num_envs % args.num_minibatches:  # a minibatch holds whole envs' sequences
        raise ValueError(f"--num-minibatches {args.num_minibatches} must divide --num-envs "
                         f"{args.num_envs} (minibatches split the envs, not their steps)")
    if args.total_timesteps < batch_size:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                         f"(num_envs * num_steps = {batch_size})")
    if args.network == "cnn" and len(shape := env.observation_space(env_params).shape) != 3:
        raise ValueError(f"--network cnn needs image observations; {args.env_id}'s are {shape}")
    return args


# ============================================================================ 6. hooks
# The runner's hooks (its contract at the fence), beside COUNTS and SIZE_FLAGS above: what a run
# over several devices splits, XLA's options (LLVM -O1 compiles faster, as fast a program), the
# ranking metric, the shown ones, the saved model (all act reads), no switches of its own.
SPLIT = "num_envs"
ENVS = "gymnax"  # --env-id: gymnax's, or a Brax task (brax/<name>), built by the runner
COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
SCORE, SHOWN = "episode_return", {}  # SHOWN: metric -> format
saved_model = lambda state: {"params": state.params, "obs_mean": state.obs_stats.mean,
                             "obs_var": state.obs_stats.var}
ExtraFlags, draw = dataclasses.make_dataclass("ExtraFlags", []), lambda folder, args, state: []


# ============================================================================ runner
# The same in every file that trains, byte for byte (a test compares them): a sweep of
# make_train's program and all around it. It reads these names from above the fence, no other:
#   Hyperparams       dataclass of the algorithm's flags (env_id first; docstrings: --help).
#   HPARAMS           {flag: (rule text, rule)}: the float flags the program traces, typed
#                     tuple[float, ...], several values a sweep; rule(x) -> bool, on arrays too.
#   NEAR_ONE          the HPARAMS flags whose scale is 1 - x (discounts): --pbt perturbs 1 - x.
#   COUNTS            {flag: least value} of the int flags that may be below 1 (others: >= 1).
#   SPLIT             the int flag whose count a run spanning devices shares out (its envs).
#   SIZE_FLAGS        the flags that set a run's memory, named when it does not fit.
#   ENVS              "gymnax": --env-id is gymnax's or brax/<name>, which make_env (below)
#                     builds for resolve and make_train; "own": the file builds its own (None).
#   resolve(args, env, env_params) -> args, every None filled (presets, rules); ValueError names a
#                     bad flag.
#   make_train(args, env, env_params, shard) -> train(key, hp) -> (state, metrics): one run, hp
#                     {HPARAMS flag: traced float32}; shard: a Shard (below; Shard(): one device).
#                     train.init(key, hp) -> state, a NamedTuple (its field `key`: the run's PRNG
#                     key, which --pbt renews); train.update(hp, state) -> (state, metrics);
#                     train.num_updates; for evaluation and GIFs, train.act(state, obs, memory,
#                     key=None) -> (actions, memory) for raw observations, greedy or with a key
#                     exploring, memory what the policy carries from one step of an episode to
#                     the next ([N, ...] leaves; () without), at its start train.initial_memory(N).
#                     metrics {name: scalar}: env_steps, episode_return, episode_length (mean
#                     over the update's ended episodes, NaN if none), episodes (their count:
#                     --pbt weighs by it); loss/x -> losses/x.
#   COMPILER_OPTIONS  XLA's options for the compiled programs.
#   SCORE, SHOWN      the metric ranking a sweep's configurations; {metric: format} to show.
#   saved_model(state) -> {name: leaves}: all act reads; --save-model writes, --load-model reads it.
#   ExtraFlags, draw  the file's own switches (a dataclass); draw(folder, args, state) -> [paths]
#                     of its own pictures of one trained configuration.
#   and the algorithm's imports of partial, jnp and np (which the runner uses too).
import dataclasses
import functools
import hashlib
import itertools
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Annotated, Literal, Optional

import flax.serialization
import flax.struct
import jax
import jax.extend
import tyro
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from tensorboard.compat.proto.event_pb2 import Event, SessionLog
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.plugins.text.summary_v2 import text_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter


# ---------------------------------- flags: the runner's beside the file's, checked before compiling
@dataclasses.dataclass
class Args(Hyperparams, ExtraFlags):
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    seed: int = 1
    """base seed: seed k of the sweep uses the k-th split of PRNGKey(seed)"""
    num_seeds: int = 4
    """independent runs side by side: vmap per device, over all the devices (on CPU, cores)"""
    track: bool = True
    """write tensorboard event files under --log-dir"""
    log_dir: str = "runs"
    """root of the run directories"""
    save_model: bool = False
    """write the final model of every run to model.msgpack in the run directory"""
    capture_gif: bool = False
    """after training, draw an episode of the first seed's greedy policy (gymnax's, Brax's envs)"""
    eval_episodes: int = 64
    """after training, fresh episodes of each run's policy, greedy and exploring (where it acts)"""
    eval_every_segment: bool = False
    """evaluate after every segment too (tensorboard: eval/episodic_return_greedy, _sampled)"""
    load_model: Optional[str] = None
    """a model.msgpack (--save-model): no training; evaluate its policies (and --capture-gif)"""
    compile_cache_dir: str = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                            os.path.expanduser("~/.cache/jax"))
    """persistent compilation cache, so a rerun skips most of the compile ("" turns it off)"""
    resume: Optional[str] = None
    """RUN_DIR of a stopped run: continue it to what the uninterrupted run computes"""
    num_segments: Optional[int] = None
    """calls of the compiled program, each followed by progress, events and a checkpoint"""
    distributed: bool = False
    """one of several processes (jax.distributed), which split the runs (implied by the next 3)"""
    coordinator_address: Optional[str] = None
    """--distributed: HOST:PORT of process 0; unset: detected (e.g. under SLURM or Open MPI)"""
    num_processes: Optional[int] = None
    """--distributed: how many processes take part; unset: detected"""
    process_id: Optional[int] = None
    """--distributed: this process's index, 0 to num_processes - 1; unset: detected"""
    devices_per_run: Annotated[Optional[int], tyro.conf.arg(help=(
        f"devices one run spans (its --{SPLIT.replace('_', '-')} shared out, means over all); "
        "unset: runs fill the devices, several a run if fewer; --resume keeps a run's"))] = None
    brax_backend: Optional[Literal["positional", "spring", "generalized", "mjx"]] = None
    """--env-id brax/<name>: Brax's physics pipeline (unset: positional, as PureJaxRL's)"""
    pbt: bool = False
    """population-based training: the sweep's runs copy better ones, then move each swept float
    by x0.8 or x1.25 (a discount's 1 - x: a discount of 0 moves, another 0 stays 0), or draw it
    anew from the grid's range (--pbt-resample)"""
    pbt_interval: Optional[int] = None
    """--pbt: env steps of a run (as --total-timesteps counts them) between two steps of the
    population, in whole updates (unset: a tenth of --total-timesteps)"""
    pbt_burn_in: Optional[int] = None
    """--pbt: env steps of a run before the population's first step (unset: two intervals)"""
    pbt_last_stretch: float = 0.2
    """--pbt: the fraction at the run's end in which the population takes no step, in [0, 1)"""
    pbt_fraction: float = 0.25
    """--pbt: the bottom fraction of the ranked runs (rounded up, at most half) copies a better
    member of the top one, in (0, 0.5]"""
    pbt_min_episodes: int = 10
    """--pbt: ended episodes a run needs in an interval to be ranked (else it sits the step out)"""
    pbt_resample: float = 0.25
    """--pbt: the probability that a copy draws a swept float anew (log-uniform over the grid's
    range; a discount's 1 - x) instead of moving it, in [0, 1]"""
    pbt_margin: float = 0.0
    """--pbt: a source's fitness must exceed its copier's by more than this (SCORE's units)"""


class ArgError(ValueError):
    """A flag broke a rule: reported as one line with exit status 2, before anything compiles."""


flag = lambda name: "--" + name.replace("_", "-")


def grid(args: Args) -> list:
    """Every combination of the HPARAMS values (the first flag varies slowest)."""
    return [dict(zip(HPARAMS, v)) for v in itertools.product(*(getattr(args, k) for k in HPARAMS))]


def validate(args: Args) -> Args:
    """Check every flag (an int: >= 1 or its least value in COUNTS, the runner's below; --seed any)
    and resolve the unset ones (the file's `resolve`), before any compile."""
    least = {**COUNTS, "eval_episodes": 0, "process_id": 0, "pbt_burn_in": 0, "seed": -np.inf}
    for name, value in vars(args).items():
        if type(value) is int and value < least.get(name, 1):
            raise ArgError(f"{flag(name)} must be >= {least.get(name, 1)} (got {value})")
    for name, (rule, holds) in HPARAMS.items():
        for x in getattr(args, name) or ():
            if not holds(x):
                raise ArgError(f"{flag(name)} must be {rule} (got {x})")
        named = [f"{x:g}" for x in getattr(args, name) or ()]  # as its configurations' folders
        if len(set(named)) < len(named):
            raise ArgError(f"{flag(name)} names a value twice (to 6 digits): {' '.join(named)}")
    if args.brax_backend and not args.env_id.startswith("brax/"):
        raise ArgError(f"--brax-backend is for Brax's envs (brax/<name>), not {args.env_id}")
    if args.capture_gif and sys.platform == "linux":  # before brax loads MuJoCo, which reads it:
        os.environ.setdefault("MUJOCO_GL", "egl")  # its renderer headless
    try:
        args = resolve(args, *make_env(args))
    except ValueError as e:
        raise ArgError(str(e)) from None
    check_pbt(args)
    if args.capture_gif:  # drawn headless: classic control by pygame (Brax's: MUJOCO_GL above)
        for device in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):
            os.environ.setdefault(device, "dummy")
        from gymnax.visualize import Visualizer
        if ENVS == "own":
            raise ArgError(f"--capture-gif draws gymnax's and Brax's envs, not {args.env_id}")
        try:  # a first frame, drawn now
            env, env_params = make_env(args)
            first = [env.reset(jax.random.PRNGKey(0), env_params)[1]]
            if hasattr(env, "write_gif"):  # a Brax task: MuJoCo's renderer
                env.write_gif(first, os.devnull)
            else:
                gif = Visualizer(env, env_params, first)
                gif.init()
                if not hasattr(gif, "im"):
                    raise ValueError("gymnax has no drawing of it")
        except Exception as e:
            raise ArgError(f"--capture-gif cannot draw {args.env_id} here: "
                           f"{str(e).splitlines()[0]}") from None
    if args.pbt:  # the schedule's unset steps: a tenth of the run, a burn-in of two of them
        interval = args.pbt_interval or max(1, args.total_timesteps // 10)
        burn_in = 2 * interval if args.pbt_burn_in is None else args.pbt_burn_in
        args = dataclasses.replace(args, pbt_interval=interval, pbt_burn_in=burn_in)
    runs_steps = args.total_timesteps * len(grid(args)) * args.num_seeds
    return dataclasses.replace(args, num_segments=args.num_segments or max(  # one per 2^24 steps
        10, -(-runs_steps // 2**24)))


def check_pbt(args: Args):
    """The --pbt flags' rules (that its schedule has a step: segments, which knows the updates)."""
    defaults = {f.name: f.default for f in dataclasses.fields(Args) if f.name.startswith("pbt_")}
    typed = [k for k, v in defaults.items() if getattr(args, k) != v]
    if typed and not args.pbt:
        raise ArgError(f"{flag(typed[0])} is for --pbt, which is not set")
    rules = {"pbt_fraction": ("in (0, 0.5]", lambda x: 0 < x <= 0.5),
             "pbt_last_stretch": ("in [0, 1)", lambda x: 0 <= x < 1),
             "pbt_resample": ("in [0, 1]", lambda x: 0 <= x <= 1),
             "pbt_margin": (">= 0", lambda x: x >= 0)}
    for name, (rule, holds) in rules.items():
        if not holds(getattr(args, name)):
            raise ArgError(f"{flag(name)} must be {rule} (got {getattr(args, name)})")
    if args.pbt and not args.load_model and len(grid(args)) * args.num_seeds < 2:
        raise ArgError("--pbt needs a population of 2 runs or more (configurations x seeds)")


def parse(argv) -> Args:
    """The command line as Args; --help shows what a flag left to resolve is on the default env."""
    one_value = {flag(f.name) for f in dataclasses.fields(Args)
                 if "tuple" not in str(f.type) and f.type is not bool}
    for i, name in enumerate(argv):  # tyro would blame the second value as an unknown option
        values = itertools.takewhile(lambda v: not v.startswith("--"), argv[i + 1:])
        if name in one_value and len(list(values)) > 1:
            raise ArgError(f"{name} takes one value (only the swept floats, HPARAMS, take more)")
    shown, hinted, file = validate(Args()), [], os.path.basename(__file__)
    algorithm_flags = {f.name for f in dataclasses.fields(Hyperparams)}
    for field in (f for f in dataclasses.fields(Args) if f.default is None):
        value = getattr(shown, field.name)
        value = value[0] if isinstance(value, tuple) and len(value) == 1 else value
        where = f"; per env: PRESETS in {file}" if field.name in algorithm_flags else ""
        hint = f"(default: {value} on {shown.env_id}{where})" if value is not None else None
        config = tyro.conf.arg(help_behavior_hint=hint or "(default: unset)")
        hinted.append((field.name, Annotated[field.type, config],
                       dataclasses.field(default=None)))
    typed = tyro.cli(dataclasses.make_dataclass("Args", hinted, bases=(Args,)), args=argv,
                     description=f"{__doc__.split(chr(10) * 2)[0]}\n\nThe algorithm's flags "
                     "come first; the runner's from --exp-name on.")
    return Args(**{f.name: getattr(typed, f.name) for f in dataclasses.fields(Args)})


# ---------------------------------- processes: a device per core, --distributed joins the others
EVENTS = []  # JAX's: a cache hit among those of a compile says where the program came from
jax.monitoring.register_event_listener(lambda event, **_: EVENTS.append(event))
JOIN_TIMEOUT_S = 60  # --distributed: a process that has not joined the others by then fails


def meet(args: Args):
    """Before JAX joins the processes (it aborts one whose peers never come), process 0 waits for
    a knock of every other one, who knock until it answers; after JOIN_TIMEOUT_S, one line."""
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
    """--distributed (implied by its three flags): join the others."""
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


# ---------------------------------------- envs: gymnax's, or a Brax task behind gymnax's interface
def make_env(args: Args) -> tuple:
    """(env, env_params) of --env-id for resolve, make_train and evaluation, built once; (None,
    None) where the file builds its own (ENVS)."""
    return build_env(args.env_id, args.brax_backend) if ENVS == "gymnax" else (None, None)


@functools.cache
def build_env(env_id: str, backend: Optional[str]) -> tuple:
    """gymnax's env_id, or brax/<name> behind gymnax's interface; ArgError if it cannot be built
    here (an unknown id, or one that needs what is not here: MNISTBandit-bsuite downloads data)."""
    if env_id.startswith("brax/"):
        return brax_env(env_id[len("brax/"):], backend or "positional")
    import gymnax
    try:
        return gymnax.make(env_id)
    except Exception as e:
        raise ArgError(f"--env-id {env_id!r} cannot be built: {e!r}".splitlines()[0]) from None


def build_train(args: Args, shard=None):
    """make_train on --env-id's env: a run alone on its device, unless shard."""
    return make_train(args, *make_env(args), shard or Shard())


def brax_env(name: str, backend: str) -> tuple:
    """(env, env_params): Brax's task `name` as a gymnax env, whose step does the rest: at the
    task's end (terminated: a hopper that falls) or at max_steps_in_episode (truncated, not
    terminated) a fresh start from the step's key, info["final_observation"] the observation
    before it. brax is imported here alone (0.7 s): a gymnax run never does."""
    from brax import envs
    from gymnax.environments import environment, spaces
    if name not in envs._envs:
        raise ArgError(f"--env-id brax/{name}: Brax has no such env; it has "
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

        def write_gif(self, states, path):  # (--capture-gif) by MuJoCo's renderer, in real time
            from brax.io import image
            from PIL import Image
            physics = [unpack(s.brax).pipeline_state for s in states]
            frames = image.render_array(task.sys, physics, 240, 320)
            first, *rest = [Image.fromarray(frame) for frame in frames]
            first.save(path, format="GIF", save_all=True, append_images=rest, loop=0,
                       duration=round(1000 * task.dt))

    return BraxEnv(), Params()


# ----------------------- the sweep: segments of one program over the devices, PBT between them
def layout(args: Args, limit: Optional[int] = None) -> Mesh:
    """The mesh: the runs over groups ("runs") of `span` devices ("batch": a run's SPLIT shared
    out, its gradients and statistics averaged), every process lending its first ones, as many
    (<= limit): the most devices, then the most groups (the fewest collectives). A span must split
    a run's SPLIT into valid runs; --devices-per-run sets it. A run's devices are consecutive: on
    one process, or on several. ArgError if none fits."""
    runs, processes = len(grid(args)) * args.num_seeds, jax.process_count()
    local = min(limit or jax.local_device_count(), jax.local_device_count())
    if (args.devices_per_run or 0) > processes * local:
        raise ArgError(f"--devices-per-run {args.devices_per_run} > {processes * local} devices")
    reasons = {span: why_not_split(args, span) for span in range(1, processes * local + 1)}
    fits = []
    for groups in (g for g in range(1, runs + 1) if runs % g == 0):
        for span in range(1, processes * local // groups + 1):
            lent, apart = divmod(groups * span, processes)  # the devices each process lends
            whole = lent and (lent % span == 0 or span % lent == 0)  # a run on whole processes
            if not (apart or reasons[span]) and whole and args.devices_per_run in (None, span):
                fits.append((groups * span, groups, span))
    if fits:
        _, groups, span = max(fits)
        by_process = [sorted((d for d in jax.devices() if d.process_index == p),
                             key=lambda d: d.id)[:groups * span // processes]
                      for p in range(processes)]
        return Mesh(np.array(by_process).reshape(groups, span), ("runs", "batch"))
    if reasons.get(args.devices_per_run):
        raise ArgError(f"--devices-per-run {args.devices_per_run}: {reasons[args.devices_per_run]}")
    asked = f" with --devices-per-run {args.devices_per_run}" if args.devices_per_run else ""
    raise ArgError(f"{runs} runs (configurations x seeds) of {flag(SPLIT)} {getattr(args, SPLIT)} "
                   f"do not split over {processes} processes x {local} devices{asked}")


def why_not_split(args: Args, span: int) -> Optional[str]:
    """Why a run's SPLIT cannot be shared out over `span` devices (each share a valid run)."""
    count = getattr(args, SPLIT)
    if count % span:
        return f"{flag(SPLIT)} {count} does not split into {span} equal shares"
    try:
        resolve(dataclasses.replace(args, **{SPLIT: count // span}), *make_env(args))
    except ValueError as e:
        return f"a device's share of a run: {e}"


class Shard:
    """One device's part of a run (make_train's `shard`): its share of the run's SPLIT (envs),
    the run's arrays that it holds rows of, and sums and means over the run's devices (the mesh
    axis `axis`). A run alone on its device: Shard(), the whole run, no collective."""

    def __init__(self, axis: Optional[str] = None):
        self.axis = axis

    def share(self, x):
        """This device's rows of a run-wide array [SPLIT, ...] (ordered by env)."""
        if self.axis is None:
            return x
        size = len(x) // jax.lax.axis_size(self.axis)
        return jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index(self.axis) * size, size)

    def keys(self, key, count: int):
        """This device's share of `count` keys split from key: each env's the same on any layout."""
        return self.share(jax.random.split(key, count))

    def all_reduce(self, collective, tree):
        """One collective per dtype, its leaves as one flat array (XLA's CPU all-reduce meets its
        peers once per array: a tree of gradients would meet once per leaf)."""
        if self.axis is None:
            return tree
        if isinstance(tree, int):  # a count known when tracing: JAX folds it (times the devices)
            return collective(tree, self.axis)
        leaves, treedef = jax.tree.flatten(jax.tree.map(jnp.asarray, tree))
        for dtype in dict.fromkeys(x.dtype for x in leaves):  # (the same order on every device)
            mine = [i for i, x in enumerate(leaves) if x.dtype == dtype]
            flat, unravel = ravel_pytree([leaves[i] for i in mine])
            for i, x in zip(mine, unravel(collective(flat, self.axis))):
                leaves[i] = x
        return jax.tree.unflatten(treedef, leaves)

    psum = functools.partialmethod(all_reduce, jax.lax.psum)  # a pytree's sum over the devices
    pmean = functools.partialmethod(all_reduce, jax.lax.pmean)  # and its mean

    def minibatches(self, key, batch, count: int):
        """batch [T, n, ...] (this device's n envs) -> [count, T n / count, ...], the same samples
        on any layout: the run's envs in blocks of `group` (the fewest whose steps split into
        count: one env if count divides T), each block's steps shuffled by a key of its own;
        minibatch i is chunk i of every block (so it holds as many steps of each block)."""
        steps, envs = jax.tree.leaves(batch)[0].shape[:2]
        group = count // np.gcd(steps, count)
        run_envs = envs if self.axis is None else envs * jax.lax.axis_size(self.axis)
        keys = self.keys(key, run_envs // group)
        order = jax.vmap(jax.random.permutation, in_axes=(0, None))(keys, group * steps)
        env = jnp.arange(len(keys))[:, None] * group + order // steps
        index = (order % steps) * (len(keys) * group) + env  # in the [T * n] batch
        index = index.reshape(len(keys), count, -1).swapaxes(0, 1).reshape(count, -1)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[index], batch)


def state_specs(args: Args, span: int, key, hp):
    """A PartitionSpec per state leaf: [runs, ...] over "runs" and, where a device holds only its
    share of the run's (a leaf smaller in a run of its share of SPLIT), that axis over "batch"."""
    share = dataclasses.replace(args, **{SPLIT: getattr(args, SPLIT) // span})
    whole, part = (jax.eval_shape(build_train(run).init, key, hp) for run in (args, share))

    def spec(whole, part):
        split = [i for i, (a, b) in enumerate(zip(whole.shape, part.shape)) if a != b]
        return P("runs", *[None] * split[0], "batch") if split else P("runs")

    return jax.tree.map(spec, whole, part)


def on_mesh(mesh, tree, specs):
    """Host arrays (the same in every process) as the mesh's global arrays, laid out by specs (a
    PartitionSpec per leaf, or one for a whole subtree)."""
    def put(spec, subtree):
        return jax.tree.map(lambda x: jax.make_array_from_callback(
            np.shape(x), NamedSharding(mesh, spec), lambda index: np.asarray(x)[index]), subtree)

    return jax.tree.map(put, specs, tree)


def to_host(mesh, tree):
    """numpy leaves of every process's runs (several processes: one program gathers them all)."""
    if jax.process_count() > 1:
        tree = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))(tree)
    return jax.device_get(tree)


def compile_sweep(args: Args, mesh, specs, train, keys, hp, resuming: bool):
    """(run_init, run_segment: (hp, state, valid) -> (state, metrics [runs, length]), length):
    one program over the mesh each, vmap over a device's runs, compiled before anything runs."""
    length = segment_length(args, train.num_updates)

    def one_segment(hp, state, valid):
        """`length` updates, the first `valid` (traced) taken: the last, shorter segment too."""
        update = jax.jit(train.update)  # traced once: for skip's shapes, and to run

        def skip(hp, state):  # the state as it is, and metrics of zeros
            return state, jax.tree.map(jnp.zeros_like, jax.eval_shape(update, hp, state)[1])

        def step(state, i):
            state, metrics = jax.lax.cond(i < valid, update, skip, hp, state)
            if args.pbt:  # the values in force (the schedule, what --resume continues with)
                metrics.update({f"hp/{k}": v for k, v in hp.items()})
                metrics["pbt/copied_from"] = jnp.float32(jnp.nan)  # set after a population step
            return state, metrics

        return jax.lax.scan(step, state, jnp.arange(length))

    # (make_train keeps a run's params the same on its devices; JAX's check_vma rejects our scans.)
    over_mesh = partial(jax.shard_map, mesh=mesh, check_vma=False)
    run_init = jax.jit(over_mesh(jax.vmap(train.init), in_specs=P("runs"), out_specs=specs))
    run_segment = jax.jit(over_mesh(jax.vmap(one_segment, in_axes=(0, 0, None)),
                                    in_specs=(P("runs"), specs, P()),
                                    out_specs=(specs, P("runs"))), donate_argnums=1)
    shaped = lambda x, spec: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                  sharding=NamedSharding(mesh, spec))
    keys, hp = shaped(keys, P("runs")), jax.tree.map(lambda x: shaped(x, P("runs")), hp)
    state = jax.tree.map(shaped, jax.eval_shape(run_init, keys, hp), specs)
    run_segment = run_segment.lower(hp, state, shaped(np.int32(0), P())).compile(COMPILER_OPTIONS)
    run_init = None if resuming else run_init.lower(keys, hp).compile(COMPILER_OPTIONS)
    return run_init, run_segment, length


def segment_length(args: Args, num_updates: int) -> int:
    """Updates in a segment (the last may run fewer): num_updates / --num-segments rounded up;
    with --pbt, the greatest divisor of its interval not above that (a step ends a segment)."""
    length = -(-num_updates // args.num_segments)
    if args.pbt:
        interval = pbt_schedule(args, num_updates)[1]
        length = max(d for d in range(1, min(length, interval) + 1) if interval % d == 0)
    return length


def pbt_schedule(args: Args, num_updates: int) -> tuple:
    """--pbt: (the updates after which the population steps, the interval in updates): every
    --pbt-interval env steps in whole updates, from --pbt-burn-in on, none in the run's
    --pbt-last-stretch. The same whatever the population's size or --num-segments."""
    per_update = args.total_timesteps / num_updates  # (steps of an update, as the flags count)
    interval = max(1, round(args.pbt_interval / per_update))
    burn_in, last = args.pbt_burn_in / per_update, (1 - args.pbt_last_stretch) * num_updates
    return [u for u in range(interval, num_updates, interval) if burn_in <= u <= last], interval


def window_fitness(args: Args, metrics, first: int, last: int):
    """--pbt: each run's SCORE over updates [first, last), NaN where the run ended fewer than
    --pbt-min-episodes episodes there. A metric of episodes (episode_return, episode_length) is
    their mean: each update's weighted by its count of them; another, its mean over the updates."""
    score = np.asarray(metrics[SCORE][:, first:last], np.float64)
    episodes = np.asarray(metrics["episodes"][:, first:last], np.float64)
    weight = episodes if SCORE.startswith("episode_") else np.isfinite(score) * 1.0
    total = np.where(weight > 0, score * weight, 0.0).sum(1)  # (an update's NaN weighs nothing)
    with np.errstate(all="ignore"):
        return np.where(episodes.sum(1) >= args.pbt_min_episodes, total / weight.sum(1), np.nan)


def pbt_step(args: Args, step, state, hp, metrics, done: int, num_updates: int):
    """(state, hp, copied_from) after `done` updates: `step` (exploit_and_explore, jitted) where the
    schedule has one, on fitness over the interval before it; else copied_from None."""
    steps, interval = pbt_schedule(args, num_updates) if args.pbt else ([], 0)
    if done not in steps:
        return state, hp, None
    key = jax.random.fold_in(jax.random.PRNGKey(args.seed), done)  # the same on --resume
    fitness = window_fitness(args, metrics, done - interval, done)
    return jax.device_get(step(state, hp, fitness, key))


def segments(args: Args, num_devices: Optional[int] = None, start=None):
    """Train grid(args) x seeds (seed k: the k-th split of PRNGKey(args.seed)) in num_segments
    calls of one program over the devices (layout), PBT between two; from `start`, a
    checkpoint's (state, metrics), on --resume. Yields after each (state, metrics [runs, updates
    so far], timing), all the processes' runs; the next segment runs while the caller writes."""
    configs, seeds, runs = grid(args), args.num_seeds, len(grid(args)) * args.num_seeds
    mesh = layout(args, num_devices)
    span, on_runs = mesh.shape["batch"], partial(on_mesh, mesh, specs=P("runs"))
    keys = jnp.tile(jax.random.split(jax.random.PRNGKey(args.seed), seeds), (len(configs), 1))
    hp_runs = {k: np.repeat(np.float32([c[k] for c in configs]), seeds) for k in HPARAMS}
    train = build_train(args, Shard("batch" if span > 1 else None))
    if args.pbt and not pbt_schedule(args, train.num_updates)[0]:  # (before anything compiles)
        raise ArgError(f"--pbt: no step of the population in {args.total_timesteps:,} steps (see "
                       "--pbt-interval, --pbt-burn-in, --pbt-last-stretch)")
    specs = state_specs(args, span, keys[0], {k: v[0] for k, v in hp_runs.items()})
    t0, seen = time.perf_counter(), len(EVENTS)  # a cache hit from here on is training's
    run_init, run_segment, length = compile_sweep(args, mesh, specs, train, keys, hp_runs,
                                                  resuming=start is not None)
    check_memory(args, [p for p in (run_init, run_segment) if p], mesh.size // jax.process_count())
    compile_s, cached = time.perf_counter() - t0, any(e.endswith("hits") for e in EVENTS[seen:])
    population = partial(pbt_step, args, jax.jit(partial(exploit_and_explore, args)),
                         num_updates=train.num_updates)
    if start is None:
        state, metrics = run_init(on_runs(keys), on_runs(hp_runs)), None
    else:  # a checkpoint's leaves are [runs, ...] as one device holds them, whatever the layout
        (saved_state, metrics), one = start, build_train(args)  # (the whole run's shapes)
        try:
            state = flax.serialization.from_state_dict(
                jax.eval_shape(jax.vmap(one.init), keys, hp_runs), saved_state)
        except (ValueError, KeyError) as e:
            raise ArgError(f"--resume: the checkpoint's state does not fit this file's ({e})")
        if args.pbt:  # those of the last segment; the population steps on as it would have
            hp_runs = {k: metrics[f"hp/{k}"][:, -1] for k in HPARAMS}
            state, hp_runs, _ = population(state, hp_runs, metrics, metrics["env_steps"].shape[1])
        state = on_mesh(mesh, state, specs)
    done = 0 if metrics is None else metrics["env_steps"].shape[1]
    steps_before = 0 if done == 0 else metrics["env_steps"][0, done - 1]
    valid = lambda first: on_mesh(mesh, np.int32(min(length, train.num_updates - first)), P())
    t_start = time.perf_counter()
    out = run_segment(on_runs(hp_runs), state, valid(done))
    for first in range(done, train.num_updates, length):
        state, new = to_host(mesh, out)  # (this waits for the segment)
        new = jax.tree.map(lambda x: x[:, :min(length, train.num_updates - first)], new)
        metrics = new if metrics is None else jax.tree.map(
            lambda a, b: np.concatenate([a, b], axis=1), metrics, new)
        following = out[0]  # the next segment runs while the host writes this one
        stepped, hp_runs, copied = population(state, hp_runs, metrics, first + length)
        if copied is not None:  # (the next segment waits for it); the sources at the last update
            following = on_mesh(mesh, stepped, specs)
            column = np.where(copied < 0, np.nan, copied)[:, None]
            metrics["pbt/copied_from"] = np.hstack([metrics["pbt/copied_from"][:, :-1], column])
        if first + length < train.num_updates:
            out = run_segment(on_runs(hp_runs), following, valid(first + length))
        run_s = time.perf_counter() - t_start
        yield state, metrics, {
            "compile_s": compile_s, "run_s": run_s, "cached": cached, "first": first,
            "num_updates": train.num_updates, "devices": mesh.size, "span": span,
            "sps": runs * float(metrics["env_steps"][0, -1] - steps_before) / run_s}


def check_memory(args: Args, programs, devices: int):
    """Refuse programs whose memory (XLA's estimate) exceeds what this process can have."""
    need = max(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes for m in (p.memory_analysis() for p in programs))
    if jax.default_backend() == "cpu":
        need, where = need * devices, "available on this machine"
        try:  # Linux's estimate of what can be had without swapping; elsewhere, all of it
            with open("/proc/meminfo") as f:
                have = 1024 * int(next(x for x in f if x.startswith("MemAvailable")).split()[1])
        except OSError:
            have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        where = f"on each {jax.default_backend()} device"
        have = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", np.inf)
    if need > have:
        sizes = ", ".join(flag(k) for k in (*SIZE_FLAGS, "num_seeds"))
        raise ArgError(f"the run needs about {need / 2**30:.1f} GiB (XLA's estimate), more than "
                       f"the {have / 2**30:.1f} GiB {where}: make {sizes} smaller")


def exploit_and_explore(args: Args, state, hp, fitness, key):
    """PBT's step (Jaderberg et al. 2017) over the population ([runs, ...] leaves, hp {flag:
    [runs]}, fitness [runs]; NaN: no evidence, the run sits the step out). The others are ranked,
    ties at random; each of their bottom --pbt-fraction (of n ranked: ceil, at most n // 2, as
    Ray Tune's) copies the state and hyperparameters of a member drawn from their top as many if
    it is better by more than --pbt-margin, then explores each swept float (explore). Every run
    goes on with a key of its own (the step's, folded with its index).
    -> (state, hp, copied_from: -1 if not)."""
    runs, index = len(fitness), jnp.arange(len(fitness))
    k_ties, k_pick, k_runs, *k_flags = jax.random.split(key, 3 + len(HPARAMS))
    ranked = jnp.isfinite(fitness)
    count = ranked.sum()
    n = jnp.minimum(jnp.ceil(args.pbt_fraction * count), count // 2).astype(jnp.int32)
    ties = jax.random.uniform(k_ties, (runs,))
    order = jnp.lexsort((ties, jnp.where(ranked, fitness, 0.0), ~ranked))  # worst first, NaN last
    rank = jnp.argsort(order)
    drawn = order[count - n + jax.random.randint(k_pick, (runs,), 0, jnp.maximum(n, 1))]
    copies = (rank < n) & (fitness[drawn] > fitness + args.pbt_margin)
    source = jnp.where(copies, drawn, index)
    hp = {k: v[source] for k, v in hp.items()}
    for k, k_flag in zip(HPARAMS, k_flags):
        if len(getattr(args, k)) > 1:  # a swept flag
            hp[k] = jnp.where(copies, explore(args, k, hp[k], k_flag), hp[k])
    keys = jax.vmap(partial(jax.random.fold_in, k_runs))(index)
    state = jax.tree.map(lambda x: x[source], state)._replace(key=keys)
    return state, hp, jnp.where(copies, source, -1)


def explore(args: Args, name: str, value, key):
    """New values [runs] of the swept float `name`: each moved by x0.8 or x1.25, or with
    probability --pbt-resample drawn anew over the grid's range (log-uniform; uniform where the
    range reaches 0); a NEAR_ONE flag on its scale 1 - x. A value its rule refuses stays."""
    k_move, k_redraw, k_draw = jax.random.split(key, 3)

    def scale(x):  # (its own inverse)
        return 1 - x if name in NEAR_ONE else x

    x, swept = scale(value), [scale(v) for v in getattr(args, name)]
    low, high = min(swept), max(swept)
    u = jax.random.uniform(k_draw, x.shape)
    drawn = low * (high / low) ** u if low > 0 else low + (high - low) * u
    moved = x * jnp.where(jax.random.bernoulli(k_move, 0.5, x.shape), 0.8, 1.25)
    new = scale(jnp.where(jax.random.bernoulli(k_redraw, args.pbt_resample, x.shape), drawn, moved))
    return jnp.where(HPARAMS[name][1](new), new, value)


def run(args: Args, num_devices: Optional[int] = None):
    """(state, metrics, timing) of the whole sweep, leaves [num_seeds] or [configs, seeds]."""
    *_, (state, metrics, timing) = segments(args, num_devices)
    lead = (len(grid(args)), args.num_seeds) if len(grid(args)) > 1 else (args.num_seeds,)
    return *jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), (state, metrics)), timing


# ------------------------------------ output: progress, statistics, summary, tensorboard events
def final_returns(metrics, fraction=0.05):
    """Per run: mean episode_return over the last `fraction` of updates (NaNs ignored); where no
    episode ended in them (Brax's 1000-step episodes all cut at once, none falling), the last
    update's in which some did; NaN if none ever did."""
    returns = np.asarray(metrics["episode_return"])
    window = returns[..., -max(1, round(returns.shape[-1] * fraction)):]
    ended = np.isfinite(window).any(-1)
    mean = np.nanmean(np.where(ended[..., None], window, 0.0), axis=-1)  # (0: not taken below)
    last = returns.shape[-1] - 1 - np.argmax(np.isfinite(returns)[..., ::-1], axis=-1)
    return np.where(ended, mean, np.take_along_axis(returns, last[..., None], -1)[..., 0])


def progress(args: Args, metrics, timing) -> str:
    """After each segment: steps, the return of the segment's episodes, the SHOWN metrics, speed."""
    returns, steps = metrics["episode_return"][:, timing["first"]:], metrics["env_steps"][0]
    finished = np.isfinite(returns).any(1)
    line = [f"return {np.mean([np.nanmean(r) for r in returns[finished]]):8.4g} (episodes of "
            f"{finished.sum()} of {len(returns)} runs)" if finished.any()
            else "no episode finished yet"]
    line += [f"{k} {form.format(np.mean(metrics[k][:, -1]))}" for k, form in SHOWN.items()]
    total = steps[-1] / len(steps) * timing["num_updates"]
    return (f"[{args.exp_name}] steps {steps[-1]:>12,.0f} / {total:,.0f}  {' '.join(line)}  "
            f"SPS {timing['sps']:,.0f}")


def iqm(x) -> float:
    """Interquartile mean (Agarwal et al. 2021): the mean of the middle half of the values."""
    x = np.sort(np.asarray(x, dtype=np.float64).ravel())
    low, high = int(np.floor(0.25 * len(x))), int(np.ceil(0.75 * len(x)))
    return float(x[low:high].mean())


def bootstrap_ci(x, stat=np.mean):
    """95% percentile-bootstrap confidence interval of `stat` over the runs in x (5000 draws)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    picks = np.random.default_rng(0).integers(0, len(x), size=(5000, len(x)))
    stats = [stat(x[p]) for p in picks]
    return tuple(float(q) for q in np.quantile(stats, [0.025, 0.975]))


def final_scores(metrics, evals={}) -> dict:
    """Per run: the final training return, each SHOWN metric at the last update, evals as given."""
    return {"episode_return": final_returns(metrics),
            **{k: np.asarray(metrics[k])[:, -1] for k in SHOWN}, **evals}


def lineages(args: Args, metrics, evals={}):
    """--pbt: (metrics [runs, updates] along each final run's lineage, the run each descends from,
    its final SCORE, the runs best first). A copy (pbt/copied_from, at a segment's last update)
    hands its source's state on: up to it, the lineage is the source's."""
    copied_from = np.asarray(metrics["pbt/copied_from"])
    slot, path = np.arange(len(copied_from)), np.zeros(copied_from.shape, int)
    for i in reversed(range(copied_from.shape[1])):
        source = copied_from[slot, i]
        slot = np.where(np.isfinite(source), source, slot).astype(int)
        path[:, i] = slot
    along = {k: np.take_along_axis(np.asarray(v), path, 0) for k, v in metrics.items()}
    score = final_scores(along, evals)[SCORE]
    return along, path[:, 0], score, np.argsort(-score, kind="stable")


def summary(args: Args, metrics, timing, evals={}) -> str:
    """metrics [runs, updates], evals {tag: [runs]}: a configuration's seeds, or a sweep's rows;
    with --pbt, the final population by lineage."""
    configs, shown = grid(args), {**dict.fromkeys(evals, "{:.4g}"), **SHOWN}
    by_config = lambda x: np.asarray(x).reshape(len(configs), args.num_seeds)
    finals = {k: by_config(v) for k, v in final_scores(metrics, evals).items()}
    sweep = f"{len(configs)} configurations x " if len(configs) > 1 else ""
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(Hyperparams)}
    flags = {k: v for k, v in flags.items() if k != "env_id" and not (k in HPARAMS and len(v) > 1)}
    lines = [f"{args.exp_name} on {args.env_id}: {sweep}{args.num_seeds} seeds x "
             f"{metrics['env_steps'][0, -1]:,.0f} steps",  # then the flags as resolved, but swept
             "flags: " + " ".join(f"{k}={v[0] if k in HPARAMS else v}" for k, v in flags.items())]
    per_run = f" ({timing['span']} a run)" if timing["span"] > 1 else ""
    if timing["span"] == 1 and timing["devices"] < jax.device_count():  # devices left idle
        per_run = f" (a run on each: {why_not_split(args, 2) or '--devices-per-run 1'})"
    timing_line = (f"{timing['devices']} device(s){per_run}  compile {timing['compile_s']:.1f} s"
                   f"{' (cache)' if timing['cached'] else ''}  run {timing['run_s']:.1f} s  |  "
                   f"{timing['sps']:,.0f} steps/s")
    returns, varied = finals["episode_return"], [k for k in HPARAMS if len(getattr(args, k)) > 1]
    if args.pbt:
        lines += population_lines(args, metrics, evals, varied)
    elif len(configs) == 1:
        lines.append("final return per seed (last 5% of updates): "
                     + " ".join(f"{r:.4g}" for r in returns[0]))
        for k, form in shown.items():
            what = "last update" if k in SHOWN else f"{args.eval_episodes} episodes"
            values = " ".join(form.format(x) for x in finals[k][0])
            lines.append(f"{k} per seed ({what}): {values}")
        timing_line = f"mean {np.mean(returns):.4g}  min {np.min(returns):.4g}  |  {timing_line}"
    else:
        lines.append(" | ".join([*varied, "final return mean [95% CI over seeds]", "IQM", "worst",
                                 *shown]))
        for c in np.argsort(-finals[SCORE].mean(1), kind="stable"):
            x, ci = returns[c], bootstrap_ci(returns[c])  # over this configuration's seeds
            lines.append(" | ".join(
                [f"{configs[c][k]:g}" for k in varied]
                + [f"{x.mean():.4g} [{ci[0]:.4g}, {ci[1]:.4g}]", f"{iqm(x):.4g}", f"{x.min():.4g}"]
                + [form.format(finals[k][c].mean()) for k, form in shown.items()]))
    return "\n".join(lines + [timing_line])


def population_lines(args: Args, metrics, evals, varied) -> list:
    """--pbt: the final runs best first by SCORE, each with the run its lineage descends from
    (configuration and seed), its evaluations and final swept values; how many lineages are
    left; the schedule of the best lineage's swept values."""
    along, roots, score, order = lineages(args, metrics, evals)
    steps = metrics["env_steps"][0]
    lines = [f"population by lineage, best first: run | descends from | {SCORE} | "
             + " | ".join([*evals, *varied])]
    lines += [" | ".join([str(r), f"run {roots[r]} ({run_name(args, roots[r], varied)})",
                          f"{score[r]:.4g}", *(f"{evals[k][r]:.4g}" for k in evals),
                          *(f"{along[f'hp/{k}'][r, -1]:.4g}" for k in varied)]) for r in order]
    lines.append(f"lineages left: {len(set(roots))} of {len(roots)} runs descend from "
                 + ", ".join(f"run {r}" for r in sorted(set(roots))))
    for k in varied:
        schedule = along[f"hp/{k}"][order[0]]
        changes = [0, *np.flatnonzero(np.diff(schedule)) + 1]  # where a new value holds
        lines.append(f"run {order[0]}'s lineage, {k}: " + ", ".join(
            f"{schedule[i]:.4g} from step {steps[i] - steps[0]:,.0f}" for i in changes))
    return lines


def run_name(args: Args, run: int, varied) -> str:
    """A run of the sweep by its swept values and seed: "learning_rate 0.001, seed 0"."""
    config = grid(args)[run // args.num_seeds]
    return ", ".join([*(f"{k} {config[k]:g}" for k in varied), f"seed {run % args.num_seeds}"])


def pbt_record(args: Args, metrics, varied) -> list:
    """--pbt: per run, the hyperparameters in force at its end and the run its lineage descends
    from (what its folder and saved model record: not the values it started with)."""
    roots = lineages(args, metrics)[1]
    return [{"hyperparameters": {k: float(metrics[f"hp/{k}"][r, -1]) for k in HPARAMS},
             "descends_from": f"run {roots[r]} ({run_name(args, roots[r], varied)})"}
            for r in range(len(roots))]


def config_dirs(run_dir, args: Args) -> list:
    """(arguments, directory) of each configuration: in a sweep, one named by its swept values."""
    return [(dataclasses.replace(args, **{k: (v,) for k, v in config.items()}), os.path.join(
        run_dir, "__".join(f"{k}={v:g}" for k, v in config.items() if len(getattr(args, k)) > 1)))
        for config in grid(args)]


class Tensorboard:
    """An event file per run by tensorboard's own writer, flushed after each segment."""
    TAGS = {"episode_return": "charts/episodic_return", "episode_length": "charts/episodic_length",
            "episodes": "charts/episodes"}

    def __init__(self, run_dir, args: Args, done):  # done: the env_steps already written
        self.writers, self.written = [], done.shape[1]
        for one, config_dir in config_dirs(run_dir, args):
            table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(one).items())
            first = Event(summary=text_pb("hyperparameters", table))
            if done.size:  # a resumed run's START: TensorBoard drops the stopped run's later steps
                first = Event(step=int(done[0, -1]) + 1,
                              session_log=SessionLog(status=SessionLog.START))
            for k in range(args.num_seeds):  # (an OSError here names its path)
                self.writers.append(EventFileWriter(os.path.join(config_dir, f"seed_{k}")))
                self.writers[-1].add_event(first)

    def write(self, metrics, last: dict):
        """metrics' updates not written yet, `last` {tag: [runs]} at each run's last step."""
        new = {k: v[:, self.written:] for k, v in metrics.items()}
        self.written, steps = metrics["env_steps"].shape[1], new.pop("env_steps")
        for r, writer in enumerate(self.writers):
            for i, step in enumerate(steps[r]):
                for k, v in new.items():
                    if np.isfinite(v[r, i]):
                        writer.add_event(self.scalar(k, v[r, i], step))
            for k, v in last.items():
                writer.add_event(self.scalar(k, v[r], metrics["env_steps"][r, -1]))
            try:
                writer.flush()
            except OSError as e:  # (its thread's: quiet_writer_errors keeps it to one line)
                raise OSError(e.errno, e.strerror, writer.get_logdir()) from None

    def write_lineages(self, args: Args, metrics, evals, population: str):
        """--pbt, at the end: in each run's folder, lineage/<tag>: the curves of its final
        model's lineage (its ancestors' before each copy); the population best first, as text."""
        along = lineages(args, metrics, evals)[0]
        self.written = 0  # (all the updates, again: as the lineage's)
        self.write({"env_steps": along.pop("env_steps"),
                    **{f"lineage/{k}": v for k, v in along.items()}}, {})
        self.writers[0].add_event(Event(summary=text_pb("population by lineage", population)))
        self.writers[0].flush()

    def scalar(self, name: str, value, step) -> Event:
        value = Summary.Value(tag=self.TAGS.get(name, name.replace("loss/", "losses/")),
                              simple_value=float(value))
        return Event(wall_time=time.time(), step=int(step), summary=Summary(value=[value]))

    @staticmethod
    def quiet_writer_errors(hook):  # (threading.excepthook: write() reports a writer's error)
        if not issubclass(hook.exc_type, OSError):
            threading.__excepthook__(hook)


# ------------------------------------------- files: checkpoints and models; evaluation and GIFs
def write_atomic(path, data: bytes):
    """Write beside `path`, then rename: a reader, or a crash, sees the old file or the new one;
    a failed write leaves no temporary file and names `path`. Mode: as open() gives (umask)."""
    temporary = None
    try:
        with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), delete=False) as f:
            temporary = f.name
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            os.chmod(f.name, 0o666 & ~UMASK)  # not the temporary file's 0600
        os.replace(temporary, path)
    except OSError as e:
        if temporary and os.path.exists(temporary):
            os.unlink(temporary)
        raise OSError(e.errno, e.strerror, path) from None


UMASK = os.umask(0o022)  # read (and put back) once
os.umask(UMASK)


def write_checkpoint(run_dir, args: Args, state, metrics, num_updates, span=None):
    """run_dir/checkpoint.msgpack: the arguments (the span: --resume keeps it), every run's state
    and metrics, after a SHA-256."""
    args = dataclasses.replace(args, devices_per_run=span or args.devices_per_run)
    data = flax.serialization.msgpack_serialize({
        "format": FORMAT, "file": os.path.basename(__file__), "num_updates": num_updates,
        "args": json.dumps(dataclasses.asdict(args)), "metrics": metrics,
        "state": flax.serialization.to_state_dict(state)})
    write_atomic(os.path.join(run_dir, "checkpoint.msgpack"), hashlib.sha256(data).digest() + data)


FORMAT = 2  # of checkpoint.msgpack: a file reads the format it writes, and refuses others
# Flags that --resume and --load-model may change, which do not change what is computed: the
# runner's, but these. Typed, they win; else the saved value holds, but for this process's own.
RESUME_MAY_CHANGE = {f.name for f in dataclasses.fields(Args)} - {
    f.name for f in dataclasses.fields(Hyperparams)} - {
    "seed", "num_seeds", "num_segments", "brax_backend",
    *(f.name for f in dataclasses.fields(Args) if f.name.startswith("pbt"))}
THIS_PROCESS = ("resume", "load_model", "compile_cache_dir", "distributed", "coordinator_address",
                "num_processes", "process_id")


def read_saved(args: Args, argv) -> tuple:
    """(arguments, contents) of --resume's checkpoint or --load-model's model: the saved arguments
    but for the typed flags of RESUME_MAY_CHANGE (the others must agree)."""
    if args.load_model and args.resume:
        raise ArgError("--load-model plays a saved model; --resume trains on: choose one")
    name, path = "--load-model", args.load_model
    if args.resume:
        name, path = "--resume", os.path.join(args.resume, "checkpoint.msgpack")
    try:
        with open(path, "rb") as f:
            digest, data = (f.read(32), f.read()) if args.resume else (None, f.read())
        if digest and hashlib.sha256(data).digest() != digest:
            raise ValueError("its checksum does not match: the file is damaged")
        saved = flax.serialization.msgpack_restore(data)
        if not isinstance(saved, dict) or "args" not in saved:
            raise ValueError("it holds no arguments")
    except (OSError, ValueError) as e:
        raise ArgError(f"{name} {path}: not a usable file ({e})") from None
    if saved.get("format", 0) != FORMAT:
        raise ArgError(f"{name} {path}: its format is {saved.get('format', 0)}; this file reads "
                       f"format {FORMAT}")
    flags, ours = json.loads(saved["args"]), {f.name for f in dataclasses.fields(Args)}
    if set(flags) != ours:
        raise ArgError(f"{name} {path}: written by {saved['file']}, whose flags differ from this "
                       f"file's ({', '.join(sorted(set(flags) ^ ours))})")
    typed = {a.split("=")[0].replace("_", "-") for a in argv}  # tyro's --flag_name too,
    typed |= {"--" + a[len("--no-"):] for a in typed if a.startswith("--no-")}  # and --no-flag
    for k, v in flags.items():
        differs = json.loads(json.dumps(getattr(args, k))) != v  # (tuples as JSON's lists)
        if k not in RESUME_MAY_CHANGE and flag(k) in typed and differs:
            raise ArgError(f"{flag(k)} differs from the saved {v}: {name} takes the run as it "
                           "was started")
    if args.resume and saved["metrics"]["env_steps"].shape[1] >= saved["num_updates"]:
        raise ArgError(f"--resume {args.resume}: that run is finished (no update left)")

    def as_tuples(value):  # JSON's lists, nested too, as the tuples the flags hold
        return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value

    kept = {k: as_tuples(v) for k, v in flags.items()
            if k not in THIS_PROCESS and not (k in RESUME_MAY_CHANGE and flag(k) in typed)}
    return dataclasses.replace(args, **kept), saved


def play(args: Args, runner, key, episodes: int, record: bool = True):
    """`episodes` fresh episodes of a run's policy by its greedy actions, as many exploring (one
    episode a slot: a policy's memory runs from its start to its end). record: a scan to the time
    limit, per step [T, 2 x episodes] the env states before it, rewards, ended; else each slot's
    return [2 x episodes], by a loop that stops when every episode has ended."""
    (env, env_params), train = make_env(args), build_train(args)
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


def evaluator(args: Args):
    """The runs' final states ([runs, ...] leaves) -> {tag: [runs]}, each run's mean return over
    --eval-episodes fresh episodes, greedy and sampled (seed k's keys in every configuration);
    None without `act`."""
    if not (args.eval_episodes and hasattr(build_train(args), "act")):
        return None

    def mean_returns(runner, key):
        returns = jnp.split(play(args, runner, key, args.eval_episodes, record=False), 2)
        return {f"eval/episodic_return_{kind}": x.mean()
                for kind, x in zip(("greedy", "sampled"), returns)}

    scores = jax.jit(jax.vmap(mean_returns))
    keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(args.seed), 1), args.num_seeds)
    keys = jnp.tile(keys, (len(grid(args)), 1))
    return lambda state: jax.device_get(scores(state, keys))


def capture_gif(path, args: Args, state):
    """An episode of the first run's greedy policy, drawn by gymnax's Visualizer or by Brax's."""
    from gymnax.visualize import Visualizer
    states, rewards, ended = play(args, jax.tree.map(lambda x: x[0], state),
                                  jax.random.PRNGKey(args.seed), 1)  # [:, 0]: greedy
    frames = int(np.argmax(ended[:, 0])) if ended[:, 0].any() else len(ended)  # the episode's steps
    episode = [jax.tree.map(lambda x: x[t, 0], states) for t in range(frames)]
    env, env_params = make_env(args)
    if hasattr(env, "write_gif"):
        env.write_gif(episode, path)
    else:
        Visualizer(env, env_params, episode, np.cumsum(rewards[:frames, 0])).animate(path)
    return path


def save_model(model_dir, args: Args, state, pbt={}):
    """Atomically write saved_model(state) of every seed, and the arguments (the ones it started
    with; --pbt: "pbt", each seed's final ones, as pbt.json), to model.msgpack."""
    write_atomic(os.path.join(model_dir, "model.msgpack"), flax.serialization.msgpack_serialize(
        {"format": FORMAT, "file": os.path.basename(__file__), "pbt": json.dumps(pbt),
         "args": json.dumps(dataclasses.asdict(args)), **saved_model(state)}))
    return os.path.join(model_dir, "model.msgpack")


def load_model(args: Args, saved):
    """Each seed's state from a saved model: init's, with the leaves saved_model picks replaced."""
    hp = {k: jnp.full(args.num_seeds, getattr(args, k)[0], jnp.float32) for k in HPARAMS}
    leaves, treedef = jax.tree.flatten(jax.vmap(build_train(args).init)(
        jax.random.split(jax.random.PRNGKey(args.seed), args.num_seeds), hp))
    where = saved_model(jax.tree.unflatten(treedef, range(len(leaves))))  # leaf indices
    mine = {k: saved.get(k) for k in where}
    pairs = list(zip(jax.tree.leaves(where), jax.tree.leaves(mine)))
    if jax.tree.structure(mine) != jax.tree.structure(where) or any(
            np.shape(x) != leaves[i].shape for i, x in pairs):
        raise ArgError(f"--load-model {args.load_model}: its model does not fit this file's")
    for i, x in pairs:
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)


# ------------------------------ main: signals, the sweep and its files, errors as one line each
STOP = []  # the signals received: the run stops at the end of the current segment


def stop_after_segment(signum, frame):
    """The first Ctrl-C or SIGTERM (a scheduler's notice of preemption) lets the segment finish
    and checkpoint; a second one (the default handlers back) stops at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    STOP.append(signum)
    print(f"\n{signal.Signals(signum).name}: stopping at the end of this segment (again: at "
          "once)", file=sys.stderr)


def train_and_write(args: Args, checkpoint, run_dir, is_lead: bool):
    """The sweep: progress, events and a checkpoint after each segment (is_lead: this process
    writes and prints, process 0 of --distributed), then evaluation and files."""
    start = (checkpoint["state"], checkpoint["metrics"]) if checkpoint else None
    done = start[1]["env_steps"] if start else np.zeros((1, 0))  # the steps already written
    events = Tensorboard(run_dir, args, done) if is_lead and args.track else None
    evaluate, evals = evaluator(args) if is_lead else None, {}
    for state, metrics, timing in segments(args, start=start):
        if args.eval_every_segment and evaluate:
            evals = evaluate(state)
        if events:
            speed = [timing["sps"]] * len(metrics["env_steps"])
            events.write(metrics, {"charts/SPS": speed, **evals})
        # Every process stops after the same segment (others would wait), decided before its
        # line; but for the last: the run then finishes (its evaluation, files; none to resume)
        stop = multihost_utils.process_allgather(np.int32(STOP[0] if STOP else 0))
        if is_lead:
            write_checkpoint(run_dir, args, state, metrics, timing["num_updates"], timing["span"])
            print(progress(args, metrics, timing), flush=True)
        if stop.any() and metrics["env_steps"].shape[1] < timing["num_updates"]:
            if is_lead:
                print(f"stopped with a checkpoint; continue with: python {sys.argv[0]} --resume "
                      f"{run_dir}", flush=True)
            sys.exit(128 + int(stop.max()))  # 130 after Ctrl-C, 143 after SIGTERM
    if not is_lead:
        return
    if evaluate and not args.eval_every_segment:
        evals = evaluate(state)
        if events:
            events.write(metrics, evals)
    varied = [k for k in HPARAMS if len(getattr(args, k)) > 1]
    if events and args.pbt:
        events.write_lineages(args, metrics, evals, "\n".join(
            population_lines(args, metrics, evals, varied)))
    records = pbt_record(args, metrics, varied) if args.pbt else []
    for c, (one, config_dir) in enumerate(config_dirs(run_dir, args)):
        os.makedirs(config_dir, exist_ok=True)
        seeds = slice(c * args.num_seeds, (c + 1) * args.num_seeds)  # this configuration's
        pbt = {f"seed_{k}": record for k, record in enumerate(records[seeds])}
        write_files(config_dir, one, jax.tree.map(lambda x: x[seeds], state), args.save_model,
                    pbt)
    print(summary(args, metrics, timing, evals))


def write_files(folder, args: Args, state, saving: bool, pbt={}):
    """One configuration's model (if saving), GIF (if asked) and the file's pictures; with --pbt,
    pbt.json: each seed's final hyperparameters and the run it descends from (pbt_record)."""
    paths = [save_model(folder, args, state, pbt)] if saving else []
    if pbt:
        paths.append(os.path.join(folder, "pbt.json"))
        write_atomic(paths[-1], json.dumps(pbt, indent=1).encode())
    if args.capture_gif:
        paths.append(capture_gif(os.path.join(folder, "episode.gif"), args, state))
    for path in paths + draw(folder, args, state):
        print(f"saved {path}")


def main():
    # A CPU device per core (XLA runs a program on about one), unless XLA_FLAGS or jax chose.
    if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
            and jax.config.jax_num_cpu_devices < 0 and jax.default_backend() == "cpu"):
        jax.extend.backend.clear_backends()
        jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)
    try:
        args, saved = parse(sys.argv[1:]), None
        if args.resume or args.load_model:  # the saved flags, before any is judged
            args, saved = read_saved(args, sys.argv[1:])
        args = validate(args)
        start_processes(args)
        if not args.load_model:  # runs and envs that do not split over the devices: one
            layout(args)  # line, now (a saved model plays on any devices)
        run_dir = args.resume or os.path.join(
            args.log_dir, f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__"
            f"{int(time.time())}")  # (brax/hopper: brax-hopper, one folder)
        is_lead = jax.process_index() == 0  # --distributed: process 0 alone writes and prints
        if is_lead and not args.load_model:  # before anything compiles: --log-dir must work,
            os.makedirs(run_dir, exist_ok=bool(args.resume))  # and be no other run's (exit 2)
    except (ArgError, OSError) as e:  # (an OSError: --log-dir cannot be made)
        print(f"error: {'' if isinstance(e, ArgError) else '--log-dir: '}{e}", file=sys.stderr)
        sys.exit(2)
    # The cache is set up at the first compile (importing gymnax runs some): set it up again.
    compilation_cache.set_cache_dir(args.compile_cache_dir or None)
    compilation_cache.reset_cache()
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # every program, not only
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # those over 1 s
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_after_segment)
    threading.excepthook = Tensorboard.quiet_writer_errors
    try:
        if not args.load_model:
            train_and_write(args, saved, run_dir, is_lead)
        else:  # the saved policy of each seed, evaluated and drawn as after training
            state, evaluate = load_model(args, saved), evaluator(args)
            print(f"{args.exp_name} on {args.env_id}: {args.num_seeds} seeds of {args.load_model}")
            write_files(os.path.dirname(args.load_model), args, state, saving=False)
            for k, v in (evaluate(state) if evaluate else {}).items():
                print(f"{k} per seed ({args.eval_episodes} episodes): "
                      + " ".join(f"{x:.4g}" for x in v))
    except ArgError as e:  # the memory check, or a checkpoint this file cannot continue
        if is_lead and not (args.resume or args.load_model):  # the folder this run made
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a file that cannot be written: no space left, no permission...
        intact = "" if args.load_model else f" (the last checkpoint in {run_dir} is intact)"
        print(f"error: cannot write {e.filename}: {e.strerror}{intact}", file=sys.stderr)
        sys.exit(74)  # EX_IOERR


if __name__ == "__main__":
    main()
