"""Parallelised Q-Network (PQN) in one fully jitted JAX file.

PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning",
https://arxiv.org/abs/2407.04811) is deep Q-learning without a replay buffer or a target network:
many parallel environments act epsilon-greedily for a few steps, each step's target is the
Q(lambda) return computed with the current network, and a few epochs of minibatch steps regress
Q(s, a) on it. LayerNorm in the Q-network is what keeps this stable (the paper's main result).
The environment (gymnax), the rollout, the Q(lambda) targets and every gradient step run inside
one `jax.jit`:
    python algos/pqn.py                          # CartPole-v1, 4 seeds, 500k steps each
    python algos/pqn.py --q-lambda 0             # one-step TD targets instead of Q(lambda)
    python algos/pqn.py --env-id Breakout-MinAtar --capture-gif   # the CNN, 10M steps

Expect (benchmarks/results/RESULTS.md, 64 seeds): CartPole-v1's greedy policy at 499.9 (its training
return 466: it explores at epsilon 0.2 to the end); MinAtar at ppo's steps: MINATAR.md.
"""

# ============================================================================ imports
import dataclasses
from functools import partial
from typing import Literal, NamedTuple, Optional

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
    """gymnax environment id (discrete action space)"""
    total_timesteps: Optional[int] = None
    """environment steps per run"""
    num_envs: Optional[int] = None
    """parallel environments per seed"""
    num_steps: Optional[int] = None
    """steps per environment per rollout"""
    num_minibatches: Optional[int] = None
    """minibatches per epoch (must divide num_envs * num_steps)"""
    update_epochs: Optional[int] = None
    """passes over each batch"""
    learning_rate: Optional[tuple[float, ...]] = None
    """sweep: RAdam step size, annealed linearly to 0 with --anneal-lr"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor"""
    q_lambda: Optional[tuple[float, ...]] = None
    """sweep: lambda of the Q(lambda) targets (0: one-step TD, 1: Monte Carlo to the rollout end)"""
    reward_scale: Optional[tuple[float, ...]] = None
    """sweep: factor on the rewards the Q-network learns from (returns are reported unscaled)"""
    start_e: Optional[tuple[float, ...]] = None
    """sweep: exploration epsilon at the start of the run"""
    end_e: Optional[tuple[float, ...]] = None
    """sweep: exploration epsilon after --exploration-fraction of the run, and to its end"""
    exploration_fraction: Optional[float] = None
    """fraction of --total-timesteps over which epsilon falls linearly from start_e to end_e"""
    max_grad_norm: Optional[tuple[float, ...]] = None
    """sweep: global gradient-norm clip"""
    network: Optional[Literal["mlp", "cnn"]] = None
    """an MLP on the flattened observation, or MinAtar's convolution (image observations)"""
    hidden_size: Optional[int] = None
    """width of the MLP's two hidden layers"""


# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program).
# The rules hold elementwise on arrays too.
UNIT, POSITIVE = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1)), ("> 0", lambda x: x > 0)
HPARAMS = dict(learning_rate=POSITIVE, gamma=UNIT, q_lambda=UNIT, reward_scale=POSITIVE,
               start_e=UNIT, end_e=UNIT, max_grad_norm=POSITIVE)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma", "q_lambda")
# The flags that set the memory a run needs (named when it does not fit).
SIZE_FLAGS = ("num_envs", "num_steps")


# ============================================================================ 2. environment
# The env comes from the runner (its envs.make_env: gymnax's); what acting in it needs: the
# exploration schedule and rule.
def epsilon_schedule(env_steps, start_e, end_e, decay_steps):
    """Epsilon after `env_steps` environment steps: linear from start_e to end_e over the first
    `decay_steps`, then end_e."""
    fraction = jnp.clip(env_steps / max(decay_steps, 1), 0.0, 1.0)
    return (start_e + fraction * (end_e - start_e)).astype(jnp.float32)


def epsilon_greedy(key, q_values, epsilon):
    """argmax_a Q [..., A] per row, replaced with probability epsilon by a uniform action."""
    k_explore, k_action = jax.random.split(key)
    greedy = q_values.argmax(-1)
    explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
    return jnp.where(explore, jax.random.randint(k_action, greedy.shape, 0, q_values.shape[-1]),
                     greedy)


# ============================================================================ 3. network
class MinAtarCNN(nn.Module):
    """MinAtar's network (Young & Tian 2019, https://arxiv.org/abs/1903.03176): 16 filters of 3x3
    and a dense layer of 128, relu, on [..., H, W, C], with PQN's LayerNorm before each relu. The
    convolution is a dense layer on the 3x3 patches: XLA's CPU convolution, vmapped over seeds,
    becomes a slower grouped convolution."""

    @nn.compact
    def __call__(self, x):
        dense = lambda size: nn.Dense(size, kernel_init=nn.initializers.orthogonal(np.sqrt(2)))
        h, w = x.shape[-3] - 2, x.shape[-2] - 2
        x = nn.relu(nn.LayerNorm()(dense(16)(jnp.concatenate(
            [x[..., i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=-1))))
        return nn.relu(nn.LayerNorm()(dense(128)(x.reshape(*x.shape[:-3], -1))))


class QNetwork(nn.Module):
    """Q(s, a) of every action [..., A]: two hidden layers of Dense, LayerNorm and relu on the
    flattened observation, or a MinAtarCNN; then a linear layer."""
    action_dim: int
    hidden_size: int = 256
    network: str = "mlp"

    @nn.compact
    def __call__(self, obs):
        x = obs
        if self.network == "cnn":
            x = MinAtarCNN()(x)
        else:
            for _ in range(2):
                x = nn.relu(nn.LayerNorm()(nn.Dense(self.hidden_size)(x)))
        return nn.Dense(self.action_dim)(x)


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # observation the action was chosen from (network inputs)
    action: jax.Array
    reward: jax.Array        # scaled reward used for learning
    next_q_max: jax.Array    # max_a Q of the observation after the step, before any auto-reset
    terminated: jax.Array
    truncated: jax.Array


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    params: dict
    opt_state: optax.OptState  # the optimiser itself is rebuilt from hp in every program
    env_state: object
    obs: jax.Array           # observations of the current step (network inputs)
    episode_return: jax.Array  # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    epsilon: jax.Array       # the exploration epsilon in force (the next rollout's)
    updates_done: jax.Array


def q_lambda_targets(rewards, next_q_max, terminated, truncated, gamma, q_lambda):
    """Q(lambda) returns over a [T, N] rollout by a reversed scan:
        G_t = r_t + gamma (1 - terminated_t) [M_t + q_lambda (1 - done_t) (G_{t+1} - M_t)],
    with M_t = next_q_max[t] = max_a Q of the observation after step t *before* auto-reset, and
    G_T = M_{T-1} after the last step. A truncated step bootstraps from its true final observation,
    a terminated one does not; the lambda-mixing stops at either. q_lambda = 0: one-step TD."""
    terminated, done = terminated.astype(rewards.dtype), jnp.maximum(terminated, truncated)

    def step(g_next, x):
        reward, m, term, d = x
        g = reward + gamma * (1.0 - term) * (m + q_lambda * (1.0 - d) * (g_next - m))
        return g, g

    _, targets = jax.lax.scan(step, next_q_max[-1], (rewards, next_q_max, terminated,
                                                     done.astype(rewards.dtype)), reverse=True)
    return targets


def loss_fn(params, network, obs, action, targets):
    """0.5 (Q(s, a) - G)^2 on one minibatch, G held fixed, and its statistics."""
    q_taken = jnp.take_along_axis(network.apply(params, obs), action[..., None], -1)[..., 0]
    td_error = q_taken - jax.lax.stop_gradient(targets)
    loss = 0.5 * (td_error**2).mean()
    return loss, {"loss/td": loss, "stats/q_mean": q_taken.mean(),
                  "stats/td_error": jnp.abs(td_error).mean()}


def make_tx(args, hp, num_updates):
    """The optimiser of one run (RAdam, as PQN's code), from its traced learning rate and clip."""
    lr, steps = hp["learning_rate"], num_updates * args.update_epochs * args.num_minibatches
    return optax.chain(optax.clip_by_global_norm(hp["max_grad_norm"]), optax.radam(
        optax.linear_schedule(lr, 0.0, steps) if args.anneal_lr else lr))


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
    """train(key, hp) -> (final RunnerState, metrics [num_updates]): one run, its HPARAMS values
    hp (a dict of scalars) traced, as one program. Its parts: train.init(key, hp) -> RunnerState,
    train.update(hp, runner) -> (runner, metrics) and train.act(runner, obs, memory, key). axis:
    the mesh axis that the run's envs are split over when it spans devices: each steps its share,
    and the gradients and every statistic of the batch are the whole run's."""
    # The MLP takes observations of any rank (MinAtar's grids) flattened; the CNN, images.
    obs_shape = env.observation_space(env_params).shape
    obs_shape = obs_shape if args.network == "cnn" else (int(np.prod(obs_shape)),)
    as_inputs = lambda obs: obs.reshape(-1, *obs_shape).astype(jnp.float32)
    batch_size = args.num_envs * args.num_steps  # the run's (all devices')
    num_updates = args.total_timesteps // batch_size
    decay_steps = args.exploration_fraction * args.total_timesteps
    network = QNetwork(env.action_space(env_params).n, args.hidden_size, args.network)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(hp, runner: RunnerState, _):
        key, k_act, k_env = jax.random.split(runner.key, 3)
        # Each env explores by a key of its own: the same however the envs are split
        action = jax.vmap(epsilon_greedy, in_axes=(0, 0, None))(
            shard.keys(k_act, args.num_envs), network.apply(runner.params, runner.obs),
            runner.epsilon)
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            shard.keys(k_env, args.num_envs), runner.env_state, action, env_params)
        done = jnp.logical_or(terminated, truncated)
        terminated, truncated = terminated.astype(jnp.float32), truncated.astype(jnp.float32)
        finished, episode_return, episode_length = count_episodes(
            reward, done, runner.episode_return, runner.episode_length)
        # max Q here, on num_envs observations at a time, not on the whole rollout after it, as
        # ppo.py computes its values (a small batch stays in the core's cache).
        next_q_max = network.apply(runner.params, as_inputs(info["final_observation"])).max(-1)
        transition = Transition(runner.obs, action, hp["reward_scale"] * reward, next_q_max,
                                terminated, truncated)
        runner = runner._replace(
            env_state=env_state, obs=as_inputs(next_obs),
            episode_return=episode_return, episode_length=episode_length, key=key)
        return runner, (transition, finished)

    def update_minibatch(tx, carry, minibatch):
        params, opt_state = carry
        grads, stats = jax.grad(loss_fn, has_aux=True)(params, network, *minibatch)
        updates, opt_state = tx.update(shard.pmean(grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), stats

    def update_epoch(tx, carry, _):
        params, opt_state, batch, key = carry
        key, k_perm = jax.random.split(key)
        minibatches = shard.minibatches(k_perm, batch, args.num_minibatches)
        (params, opt_state), stats = jax.lax.scan(partial(update_minibatch, tx),
                                                  (params, opt_state), minibatches)
        return (params, opt_state, batch, key), stats

    def update(hp, runner: RunnerState):
        """One rollout of num_steps in every env, its Q(lambda) targets from the network that
        collected it, then update_epochs passes of minibatch steps; then the next epsilon."""
        # The epsilon of this run's hp now, not the one carried: --pbt may have moved start_e or
        # end_e (or copied another run's state) since the last update.
        epsilon = epsilon_schedule(runner.updates_done * batch_size, hp["start_e"], hp["end_e"],
                                   decay_steps)
        runner, (traj, finished) = jax.lax.scan(partial(env_step, hp),
                                                runner._replace(epsilon=epsilon), None,
                                                args.num_steps)
        targets = q_lambda_targets(traj.reward, traj.next_q_max, traj.terminated, traj.truncated,
                                   hp["gamma"], hp["q_lambda"])
        batch = (traj.obs, traj.action, targets)
        key, k_epochs = jax.random.split(runner.key)
        (params, opt_state, _, _), stats = jax.lax.scan(
            partial(update_epoch, make_tx(args, hp, num_updates)),
            (runner.params, runner.opt_state, batch, k_epochs), None, args.update_epochs)
        updates_done = runner.updates_done + 1
        runner = runner._replace(params=params, opt_state=opt_state, key=key,
                                 updates_done=updates_done, epsilon=epsilon_schedule(
                                     updates_done * batch_size, hp["start_e"], hp["end_e"],
                                     decay_steps))
        metrics = shard.pmean({k: v.mean() for k, v in stats.items()})
        metrics.update(episode_metrics(finished, shard.psum))
        metrics["stats/epsilon"] = epsilon  # the rollout's
        metrics["env_steps"] = updates_done * batch_size
        # The rate in force at the update's first step (make_tx's schedule, before this update)
        annealed = 1 - (updates_done - 1) / num_updates if args.anneal_lr else 1
        metrics["charts/learning_rate"] = hp["learning_rate"] * annealed
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = network.init(k_init, jnp.zeros(obs_shape))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            shard.keys(k_env, args.num_envs), env_params)
        return RunnerState(
            params=params, opt_state=make_tx(args, hp, num_updates).init(params),
            env_state=env_state, obs=as_inputs(obs), episode_return=jnp.zeros(len(obs)),
            episode_length=jnp.zeros(len(obs), jnp.int32), key=k_run,
            epsilon=epsilon_schedule(0, hp["start_e"], hp["end_e"], decay_steps),
            updates_done=jnp.int32(0))

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...]: greedy in Q, or epsilon-greedy at its epsilon;
        no memory from one step to the next: ()."""
        q_values = network.apply(runner.params, as_inputs(obs))
        greedy = q_values.argmax(-1)
        return (greedy if key is None else epsilon_greedy(key, q_values, runner.epsilon)), memory

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = lambda n: ()
    return train


# ============================================================================ 5. presets
# What each preset sets for a flag left unset (None), and where it comes from; an env without an
# entry takes the "discrete" one. purejaxql is PQN's authors' code, read at commit 47af6d7
# (https://github.com/mttga/purejaxql/tree/47af6d7b35c89ddfe633aaf7341bdb8964cb7cce).
# CartPole-v1: purejaxql/config/alg/pqn_cartpole.yaml as it is (REW_SCALE -> reward_scale,
# LAMBDA -> q_lambda, EPS_DECAY -> exploration_fraction, 2 layers of HIDDEN_SIZE, LayerNorm).
# One change, not a value: purejaxql's (pre-1.0) gymnax step ends a time-limited episode as a
# termination; here its last step bootstraps.
CARTPOLE = dict(total_timesteps=500_000, num_envs=32, num_steps=64, num_minibatches=16,
                update_epochs=4, learning_rate=1e-4, gamma=0.99, q_lambda=0.95, reward_scale=0.1,
                start_e=1.0, end_e=0.2, exploration_fraction=0.2, max_grad_norm=10.0,
                network="mlp", hidden_size=256)
# MinAtar: purejaxql/config/alg/pqn_minatar.yaml (no REW_SCALE there: 1) and pqn_minatar.py's
# LayerNorm CNN. Not taken: that script's division of the 0/1 observations by 255 (an Atari habit).
MINATAR = dict(CARTPOLE, total_timesteps=10_000_000, num_envs=128, num_steps=32,
               num_minibatches=32, update_epochs=2, learning_rate=5e-4, q_lambda=0.65,
               reward_scale=1.0, end_e=0.05, exploration_fraction=0.1, network="cnn")
PRESETS = {"discrete": CARTPOLE, "CartPole-v1": CARTPOLE,
           **{f"{game}-MinAtar": MINATAR
              for game in ("Breakout", "SpaceInvaders", "Asterix", "Freeway", "Seaquest")}}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id; ValueError naming the flag on a bad one."""
    if not isinstance(space := env.action_space(env_params), spaces.Discrete):
        raise ValueError(f"--env-id {args.env_id!r}: PQN needs discrete actions, not "
                         f"{type(space).__name__}")
    preset = PRESETS.get(args.env_id, PRESETS["discrete"])
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise ValueError(f"--num-minibatches {args.num_minibatches} must divide the batch "
                         f"num_envs * num_steps = {batch_size}")
    if args.total_timesteps < batch_size:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                         f"(num_envs * num_steps = {batch_size})")
    if not 0 < args.exploration_fraction <= 1:
        raise ValueError(f"--exploration-fraction must be in (0, 1] (got "
                         f"{args.exploration_fraction})")
    if args.network == "cnn" and len(shape := env.observation_space(env_params).shape) != 3:
        raise ValueError(f"--network cnn needs image observations; {args.env_id}'s are {shape}")
    return args


# ============================================================================ 6. hooks
# The runner's hooks (runner/__init__.py) that differ from its defaults: gymnax's envs alone (its
# actions are discrete; Brax's are not), what --save-model writes (the epsilon too: a loaded
# model's sampled evaluation acts at it).
ENVS = ("gymnax",)
saved_model = lambda state: {"params": state.params, "epsilon": state.epsilon}


# ============================================================================ 7. the tail
if __name__ == "__main__":  # run as a script: the runner (algos/runner/) trains this module
    import sys

    from runner import cli
    cli.main(sys.modules[__name__])
