"""Deep Q-Networks (DQN) in one fully jitted JAX file.

DQN (Mnih et al. 2015, https://doi.org/10.1038/nature14236) learns Q(s, a) off-policy from a
replay buffer: each gradient step regresses Q(s, a) of a uniform draw of stored transitions on
r + gamma (1 - terminated) Q_target(s', a') (the Huber loss, or the squared error), where the
target network is a copy of the online one refreshed every --target-update-interval steps (or
moved toward it, --tau < 1). Double DQN (van Hasselt et al. 2016, arXiv 1509.06461), the default,
picks a' by the online network and values it by the target one; --no-double takes the target's
max. Many envs act epsilon-greedily, epsilon annealed linearly. The replay buffer is written here,
[num_envs, slots, ...] in the run's state (as sac.py's), so a checkpoint, --resume and --pbt
carry it. The environment (gymnax), the buffer and every gradient step run inside one `jax.jit`:
    python algos/dqn.py                          # CartPole-v1, 4 seeds, 500k steps each
    python algos/dqn.py --no-double              # DQN's own target: the target network's max
    python algos/dqn.py --env-id Breakout-MinAtar    # MinAtar's CNN

Expect (benchmarks/results/DQN.md): CartPole-v1's greedy policy at 475 or more on most seeds in
500k steps, not on all: every seed of the default base, 6 of 8 held-out seeds (mean 422.5).
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
    """steps of every env per update (the runner's unit: metrics are means over one)"""
    train_frequency: Optional[int] = None
    """steps of every env between two gradient steps (1: one after each step of the envs)"""
    buffer_size: Optional[int] = None
    """replay buffer capacity in transitions (a multiple of num_envs)"""
    batch_size: Optional[int] = None
    """transitions per gradient step, batch_size / num_envs drawn from each env's share"""
    learning_starts: Optional[int] = None
    """environment steps before the first gradient step"""
    learning_rate: Optional[tuple[float, ...]] = None
    """sweep: Adam step size"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor"""
    tau: Optional[tuple[float, ...]] = None
    """sweep: step of the target network toward the online one at each of its updates (1: a
    copy)"""
    target_update_interval: Optional[int] = None
    """environment steps between two updates of the target network"""
    double: bool = True
    """Double DQN's target (the online network's action, the target's value); --no-double: the
    target network's max"""
    loss: Optional[Literal["huber", "mse"]] = None
    """the loss of the TD error: Huber's (DQN's error clipping, delta 1) or the squared error"""
    start_e: Optional[tuple[float, ...]] = None
    """sweep: exploration epsilon at the start of the run"""
    end_e: Optional[tuple[float, ...]] = None
    """sweep: exploration epsilon after --exploration-fraction of the run, and to its end"""
    exploration_fraction: Optional[float] = None
    """fraction of --total-timesteps over which epsilon falls linearly from start_e to end_e"""
    anneal_lr: Optional[bool] = None
    """anneal the learning rate linearly to 0 over the run's gradient steps"""
    network: Optional[Literal["mlp", "cnn"]] = None
    """an MLP on the flattened observation, or MinAtar's convolution (image observations)"""
    hidden_sizes: Optional[tuple[int, ...]] = None
    """widths of the MLP's hidden layers"""


# The float hyperparameters (no shape nor loop length: train() traces them, a sweep is one program)
UNIT, POSITIVE = ("in [0, 1]", lambda x: (0 <= x) & (x <= 1)), ("> 0", lambda x: x > 0)
STEP = ("in (0, 1]", lambda x: (0 < x) & (x <= 1))
HPARAMS = dict(learning_rate=POSITIVE, gamma=UNIT, tau=STEP, start_e=UNIT, end_e=UNIT)
# Those whose scale is 1 - x (gamma's horizon is 1 / (1 - gamma)): --pbt moves 1 - x, not x.
NEAR_ONE = ("gamma",)
COUNTS = {"learning_starts": 0}  # the int flags that may be below 1 (all others: >= 1)
SIZE_FLAGS = ("num_envs", "buffer_size", "batch_size")


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
    and a dense layer of 128, relu, on [..., H, W, C]; the convolution as a dense layer on the 3x3
    patches (vmapped over seeds, XLA's CPU convolution becomes a slower grouped one)."""

    @nn.compact
    def __call__(self, x):
        h, w = x.shape[-3] - 2, x.shape[-2] - 2
        x = nn.relu(nn.Dense(16)(jnp.concatenate(
            [x[..., i:i + h, j:j + w, :] for i in range(3) for j in range(3)], axis=-1)))
        return nn.relu(nn.Dense(128)(x.reshape(*x.shape[:-3], -1)))


class QNetwork(nn.Module):
    """Q(s, a) of every action [..., A]: Dense and relu layers on the flattened observation, or a
    MinAtarCNN; then a linear layer."""
    action_dim: int
    hidden_sizes: tuple = (120, 84)
    network: str = "mlp"

    @nn.compact
    def __call__(self, obs):
        x = obs
        if self.network == "cnn":
            x = MinAtarCNN()(x)
        else:
            for size in self.hidden_sizes:
                x = nn.relu(nn.Dense(size)(x))
        return nn.Dense(self.action_dim)(x)


# ============================================================================ 4. the update
class Transition(NamedTuple):
    obs: jax.Array           # observation the action was taken in (network inputs)
    action: jax.Array
    reward: jax.Array
    next_obs: jax.Array      # the observation after the step, before any auto-reset
    terminated: jax.Array    # (a truncated step bootstraps: its next_obs is not terminal)


class RunnerState(NamedTuple):
    """What a run carries from one update to the next, and what a checkpoint holds."""
    params: dict
    target_params: dict
    opt_state: optax.OptState  # the optimiser itself is rebuilt from hp in every program
    # [num_envs (this device's), slots, ...], circular; a --pbt copy takes its source's buffer,
    # as its parameters (its Q was fit to that data).
    buffer: Transition
    env_state: object
    obs: jax.Array           # observations of the current step (network inputs)
    episode_return: jax.Array  # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    epsilon: jax.Array       # the exploration in force (act's, for the sampled evaluation)
    steps_done: jax.Array    # steps of every env so far (the buffer's write position follows)


def td_target(reward, terminated, next_q_online, next_q_target, gamma, double: bool):
    """r + gamma (1 - terminated) Q_target(s', a'): a' = argmax of the online network's Q(s', .)
    (Double DQN), or of the target's own (DQN: its max); a truncated step bootstraps from its true
    last observation."""
    chosen = (next_q_online if double else next_q_target).argmax(-1)
    next_value = jnp.take_along_axis(next_q_target, chosen[..., None], -1)[..., 0]
    return reward + gamma * (1.0 - terminated) * next_value


def loss_fn(params, target_params, network, hp, args, batch: Transition):
    """The loss of Q(s, a) against the TD target (no gradient through the target: the target
    network's values and the online network's choice of a'), and its statistics."""
    next_q = jax.lax.stop_gradient(network.apply(params, batch.next_obs))
    target = td_target(batch.reward, batch.terminated, next_q,
                       network.apply(target_params, batch.next_obs), hp["gamma"], args.double)
    q = jnp.take_along_axis(network.apply(params, batch.obs), batch.action[:, None], -1)[:, 0]
    error = optax.huber_loss if args.loss == "huber" else optax.squared_error
    loss = error(q, jax.lax.stop_gradient(target)).mean()
    return loss, {"loss/td": loss, "stats/q_mean": q.mean()}


def store(buffer: Transition, slot, transition: Transition) -> Transition:
    """The buffer [envs, slots, ...] with every env's transition written at `slot`, behind a
    barrier: without it XLA fused the write into the next draw, which then read the old buffer and
    copied all of it at every step on a mesh of two CPU devices (docs/dqn.md measures it)."""
    written = jax.tree.map(lambda b, x: b.at[:, slot].set(x), buffer, transition)
    return jax.lax.optimization_barrier(written)


def sample(buffer: Transition, filled, keys, share: int):
    """A batch from a buffer [envs, slots, ...], `share` transitions from each env, uniform over
    its first `filled` slots, by the env's key (keys [envs]: the same batch however the envs are
    split over devices)."""
    def one_env(env_buffer, key):
        return jax.tree.map(lambda x: x[jax.random.randint(key, (share,), 0, filled)], env_buffer)

    return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), jax.vmap(one_env)(buffer, keys))


def target_update(target, online, tau):
    """The target parameters moved a step tau toward the online ones (tau 1: a copy)."""
    return jax.tree.map(lambda t, o: (1.0 - tau) * t + tau * o, target, online)


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


def make_tx(args, hp, num_updates: int):
    """Adam from a run's traced learning rate, built in each program (it closes over hp); with
    --anneal-lr, linear to 0 over the run's gradient steps: those at every train_frequency-th
    step of the envs from the one that reaches learning_starts on."""
    if not args.anneal_lr:
        return optax.adam(hp["learning_rate"])
    env_steps = np.arange(1, num_updates * args.num_steps + 1)  # of each env, as steps_done
    steps = int(((env_steps * args.num_envs >= args.learning_starts)
                 & (env_steps % args.train_frequency == 0)).sum())
    return optax.adam(optax.linear_schedule(hp["learning_rate"], 0.0, steps))


def make_train(args, env, env_params, shard):
    """train(key, hp) -> (final RunnerState, metrics [num_updates]): one run as one program, its
    HPARAMS hp traced; train.init, train.update, train.act: the runner's contract.
    shard: this device's part of a run over several (the runner's Shard), its envs and means."""
    obs_shape = env.observation_space(env_params).shape
    obs_shape = obs_shape if args.network == "cnn" else (int(np.prod(obs_shape)),)
    as_inputs = lambda obs: obs.reshape(-1, *obs_shape).astype(jnp.float32)
    steps_per_update = args.num_envs * args.num_steps  # the run's (all devices')
    num_updates = args.total_timesteps // steps_per_update
    slots = args.buffer_size // args.num_envs  # per env
    per_env = args.batch_size // args.num_envs  # each env's share of a batch
    decay_steps = args.exploration_fraction * args.total_timesteps
    network = QNetwork(env.action_space(env_params).n, tuple(args.hidden_sizes), args.network)
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(hp, runner: RunnerState):
        """One epsilon-greedy step of every env, its transitions written at the buffer's oldest
        slot."""
        key, k_act, k_env = jax.random.split(runner.key, 3)
        epsilon = epsilon_schedule(runner.steps_done * args.num_envs, hp["start_e"], hp["end_e"],
                                   decay_steps)
        q_values = network.apply(runner.params, runner.obs)
        action = jax.vmap(epsilon_greedy, in_axes=(0, 0, None))(  # each env by a key of its own
            shard.keys(k_act, args.num_envs), q_values, epsilon)
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            shard.keys(k_env, args.num_envs), runner.env_state, action, env_params)
        transition = Transition(runner.obs, action, reward, as_inputs(info["final_observation"]),
                                terminated.astype(jnp.float32))
        buffer = store(runner.buffer, runner.steps_done % slots, transition)
        finished, episode_return, episode_length = count_episodes(
            reward, jnp.logical_or(terminated, truncated), runner.episode_return,
            runner.episode_length)
        runner = runner._replace(
            buffer=buffer, env_state=env_state, obs=as_inputs(next_obs),
            episode_return=episode_return, episode_length=episode_length, key=key,
            epsilon=epsilon, steps_done=runner.steps_done + 1)
        return runner, finished

    def gradient_step(hp, tx, target_params, carry, batch):
        params, opt_state = carry
        grads, stats = jax.grad(loss_fn, has_aux=True)(params, target_params, network, hp, args,
                                                       batch)
        updates, opt_state = tx.update(shard.pmean(grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), stats

    def step(hp, tx, runner: RunnerState, _):
        """A step of every env; every train_frequency of them from learning_starts on, a gradient
        step (a cond: one program from the first step on; the runner's vmap makes it a select,
        which computes the early steps and discards them); then, once every
        target_update_interval env steps, the target network's update."""
        runner, finished = env_step(hp, runner)
        key, k_learn = jax.random.split(runner.key)
        # Drawn at every step, learning or not: the cond takes the batch, not the buffer
        batch = sample(runner.buffer, jnp.minimum(runner.steps_done, slots),
                       shard.keys(k_learn, args.num_envs), per_env)
        learn = partial(gradient_step, hp, tx, runner.target_params)

        def wait(carry, batch):  # the statistics of no step: NaN, left out of the update's means
            shapes = jax.eval_shape(learn, carry, batch)[1]
            return carry, jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), shapes)

        learning = ((runner.steps_done * args.num_envs >= args.learning_starts)
                    & (runner.steps_done % args.train_frequency == 0))
        (params, opt_state), stats = jax.lax.cond(learning, learn, wait,
                                                  (runner.params, runner.opt_state), batch)
        before, after = (runner.steps_done - 1) * args.num_envs, runner.steps_done * args.num_envs
        crossed = after // args.target_update_interval > before // args.target_update_interval
        target = jax.tree.map(partial(jnp.where, crossed),
                              target_update(runner.target_params, params, hp["tau"]),
                              runner.target_params)
        runner = runner._replace(params=params, target_params=target, opt_state=opt_state,
                                 key=key)
        return runner, (finished, stats)

    def update(hp, runner: RunnerState):
        """num_steps steps of every env, with their gradient steps and target updates."""
        tx = make_tx(args, hp, num_updates)
        runner, (finished, stats) = jax.lax.scan(partial(step, hp, tx), runner, None,
                                                 args.num_steps)
        metrics = shard.pmean({k: jnp.nanmean(v) for k, v in stats.items()})
        metrics.update(episode_metrics(finished, shard.psum))
        metrics["env_steps"] = runner.steps_done * args.num_envs
        metrics["stats/epsilon"] = runner.epsilon
        return runner, metrics

    def init(key, hp) -> RunnerState:
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = network.init(k_init, jnp.zeros(obs_shape))
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            shard.keys(k_env, args.num_envs), env_params)
        obs = as_inputs(obs)
        envs = len(obs)  # this device's
        empty = lambda *shape, dtype=jnp.float32: jnp.zeros((envs, slots, *shape), dtype)
        buffer = Transition(empty(*obs_shape), empty(dtype=jnp.int32), empty(), empty(*obs_shape),
                            empty())
        return RunnerState(
            params=params, target_params=params,
            opt_state=make_tx(args, hp, num_updates).init(params), buffer=buffer,
            env_state=env_state, obs=obs, episode_return=jnp.zeros(envs),
            episode_length=jnp.zeros(envs, jnp.int32), key=k_run,
            epsilon=epsilon_schedule(0, hp["start_e"], hp["end_e"], decay_steps),
            steps_done=jnp.int32(0))

    def act(runner: RunnerState, obs, memory, key=None):
        """Actions for raw observations [N, ...]: greedy in Q, or epsilon-greedy at its epsilon;
        no memory from one step to the next: ()."""
        q_values = network.apply(runner.params, as_inputs(obs))
        if key is None:
            return q_values.argmax(-1), memory
        return epsilon_greedy(key, q_values, runner.epsilon), memory

    def train(key, hp):
        return jax.lax.scan(lambda runner, _: update(hp, runner), init(key, hp), None, num_updates)

    train.init, train.update, train.act, train.num_updates = init, update, act, num_updates
    train.initial_memory = lambda n: ()
    return train


# ============================================================================ 5. presets
# What each preset sets for a flag left unset (None), and where it comes from; an env without an
# entry takes the "discrete" one.
# CartPole-v1: PureJaxRL's dqn.py (luchris429/purejaxrl, purejaxrl/dqn.py): gamma 0.99, batch 128,
# 10,000 steps before learning, the target copied every 500 env steps, epsilon 1 -> 0.05 over half
# the run, 500k steps, a 120-84 relu MLP; but 8 envs (not 10: a batch draws an equal share from
# each), a gradient step after every step of the envs (theirs: one per 10 env steps, here one per
# 8), Double DQN's target (theirs: the max), and a buffer of 50,000 with Adam 5e-4 annealed to 0
# (theirs: 10,000 and 2.5e-4 constant, under which the final greedy policy missed 475 on 3 of 12
# seeds of bases 1, 100 and 200; this, on none, and on none of 8 held-out seeds: docs/dqn.md).
# Their squared error, not the Huber loss: in its linear range (TD errors above 1: Q near 100
# here) Huber fits the median of the targets, which the rare terminal steps do not move, and Q
# grew without bound (seed 1: Q 2.7e6 at 145k steps; 2 seeds, 500k: returns 9.6, one way).
CARTPOLE = dict(total_timesteps=500_000, num_envs=8, num_steps=100, train_frequency=1,
                buffer_size=50_000, batch_size=128, learning_starts=10_000,
                learning_rate=5e-4, gamma=0.99, tau=1.0, target_update_interval=500,
                loss="mse", start_e=1.0, end_e=0.05, exploration_fraction=0.5, network="mlp",
                hidden_sizes=(120, 84), anneal_lr=True)
# MinAtar: Young & Tian 2019's DQN (replay of 100,000, batch 32, the target every 1,000 steps,
# epsilon 1 -> 0.1 over 100,000 steps, 5,000 steps before learning, gamma 0.99, the Huber loss,
# its CNN, 5M steps), but 4 envs with a gradient step after every step of the 4 (theirs: one env,
# a gradient step per step) and Adam at their 2.5e-4 (theirs: RMSProp).
MINATAR = dict(CARTPOLE, total_timesteps=5_000_000, num_envs=4, num_steps=250, train_frequency=1,
               buffer_size=100_000, batch_size=32, learning_starts=5_000, learning_rate=2.5e-4,
               anneal_lr=False, target_update_interval=1_000, loss="huber", end_e=0.1,
               exploration_fraction=0.02, network="cnn")
PRESETS = {"discrete": CARTPOLE, "CartPole-v1": CARTPOLE,
           **{f"{game}-MinAtar": MINATAR
              for game in ("Breakout", "SpaceInvaders", "Asterix", "Freeway", "Seaquest")}}


def resolve(args, env, env_params):
    """Unset (None) flags from the preset of --env-id, then the rules; ValueError on a bad flag."""
    if not isinstance(space := env.action_space(env_params), spaces.Discrete):
        raise ValueError(f"--env-id {args.env_id!r}: DQN needs discrete actions, not "
                         f"{type(space).__name__}")
    preset = PRESETS.get(args.env_id, PRESETS["discrete"])
    args = dataclasses.replace(args, **{k: (v,) if k in HPARAMS else v
                                        for k, v in preset.items() if getattr(args, k) is None})
    n = args.num_envs
    if args.buffer_size % n:
        raise ValueError(f"--buffer-size {args.buffer_size} must be a multiple of --num-envs {n}")
    if args.batch_size % n:
        raise ValueError(f"--batch-size {args.batch_size} must be a multiple of --num-envs {n} "
                         "(each env gives an equal share)")
    if args.total_timesteps < n * args.num_steps:
        raise ValueError(f"--total-timesteps {args.total_timesteps} is less than one update "
                         f"(num_envs * num_steps = {n * args.num_steps})")
    if not 0 < args.exploration_fraction <= 1:
        raise ValueError(f"--exploration-fraction must be in (0, 1] (got "
                         f"{args.exploration_fraction})")
    if args.network == "cnn" and len(shape := env.observation_space(env_params).shape) != 3:
        raise ValueError(f"--network cnn needs image observations; {args.env_id}'s are {shape}")
    if not args.hidden_sizes or min(args.hidden_sizes) < 1:
        raise ValueError(f"--hidden-sizes must be one or more widths >= 1 (got "
                         f"{' '.join(map(str, args.hidden_sizes))})")
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
