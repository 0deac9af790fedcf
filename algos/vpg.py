"""Vanilla policy gradient (VPG) with a learned baseline in one fully jitted JAX file.

VPG (REINFORCE, Williams 1992, with GAE(lambda) advantages A, Schulman et al. 2016) collects a
batch with the current policy, then takes ONE gradient step on -(log pi(a|s) A).mean(). The value
function (the baseline) is fitted by its own loss and Adam in PPO's epochs of minibatch steps.
The environment (gymnax), the rollout, GAE and every gradient step run inside one `jax.jit`;
seeds run side by side as `pmap(vmap(train))`.

Run it:
    python algos/vpg.py --help
    python algos/vpg.py                          # CartPole-v1, 4 seeds, 300k steps each
    python algos/vpg.py --env-id Pendulum-v1     # continuous actions, 300k steps each

Expect (64 seeds, RESULTS.md): CartPole-v1 ends at 500 on 63 of 64 seeds; Pendulum-v1 climbs from
-1230 (random actions) to a mean of -606, bimodal over seeds (21 of 64 reach -250): below PPO.
Flags left unset take per-action-kind defaults (ENV_DEFAULTS below) and rules that derive
the rollout length, minibatch count and budget from --num-envs (see `fill_defaults`).
"""

# ============================================================================ imports
import dataclasses
import itertools
import json
import os
import sys
import tempfile
import threading
import time
from functools import partial
from typing import NamedTuple, Optional

import jax

# Before any JAX operation (importing gymnax runs some): a CPU process gets one device and XLA
# runs these scan-bound programs mostly on one core; one device per core lets pmap use them all.
if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
        and jax.config.jax_num_cpu_devices < 0):
    jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)

import distrax
import flax.linen as nn
import flax.serialization
import flax.struct
import gymnax
import jax.numpy as jnp
import numpy as np
import optax
import tyro
from flax.training.train_state import TrainState
from gymnax.environments import spaces
from jax.experimental.compilation_cache import compilation_cache
from scipy.stats import trim_mean


# ============================================================================ 1. arguments
@dataclasses.dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """name of this experiment (part of the run directory name)"""
    env_id: str = "CartPole-v1"
    """gymnax environment id (discrete or continuous action space)"""
    seed: int = 1
    """base seed: seed k of the sweep uses the k-th split of PRNGKey(seed)"""
    num_seeds: int = 4
    """independent runs side by side: vmap per device, pmap over the devices (on CPU, cores)"""
    track: bool = True
    """write tensorboard event files under --log-dir"""
    log_dir: str = "runs"
    """root directory of the tensorboard runs"""
    save_model: bool = False
    """write the final parameters of every seed to model.msgpack in the run directory"""
    compile_cache_dir: str = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                                            os.path.expanduser("~/.cache/jax"))
    """persistent compilation cache, so a rerun skips most of the compile ("" turns it off)"""

    # Algorithm. Fields left at None take a per-environment or derived default (fill_defaults).
    # Flags marked "sweep" take several values: all combinations train in one program (HPARAMS).
    total_timesteps: Optional[int] = None
    """environment steps per seed (default: 300k continuous; discrete max(300k, 1.5 * episode
    step limit * num_envs), so every env lives through a few episodes)"""
    num_envs: Optional[int] = None
    """parallel environments per seed (default: 32 for discrete, 8 for continuous actions)"""
    num_steps: Optional[int] = None
    """steps per environment per rollout (default: 2048 // num_envs clipped to [16, 128] for
    discrete actions, 32 for continuous ones)"""
    num_minibatches: Optional[int] = None
    """minibatches per epoch (default: batch / 512 clipped to [4, 32], a divisor of the batch)"""
    update_epochs: Optional[int] = None
    """value-function passes over each batch (default: 4)"""
    learning_rate: Optional[tuple[float, ...]] = None
    """sweep: Adam step size, annealed linearly to 0 with --anneal-lr (default: 2.5e-3 discrete,
    5e-3 continuous actions)"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    gamma: Optional[tuple[float, ...]] = None
    """sweep: discount factor (default: 0.99 discrete, 0.95 continuous actions)"""
    gae_lambda: Optional[tuple[float, ...]] = None
    """sweep: lambda of GAE(lambda) (default: 0.95)"""
    ent_coef: Optional[tuple[float, ...]] = None
    """sweep: entropy bonus coefficient (default: 0.01 discrete, 0 continuous actions)"""
    max_grad_norm: tuple[float, ...] = (0.5,)
    """sweep: global gradient-norm clip"""
    hidden_size: int = 64
    """width of the two hidden layers of the actor and of the critic"""
    normalize_obs: Optional[bool] = None
    """running observation normalisation (default: on for continuous actions)"""
    normalize_reward: Optional[bool] = None
    """scale rewards by a running std of the discounted return (default: on for continuous)"""


# Defaults by action kind, tuned on CartPole-v1 (500 on most seeds by 300k steps at 32 envs) and
# Pendulum-v1 (small batches, as VPG needs many policy steps; gamma=0.95 suits its dense reward).
ENV_DEFAULTS = {
    "discrete": dict(update_epochs=4, learning_rate=2.5e-3, gamma=0.99, gae_lambda=0.95,
                     ent_coef=0.01),
    "continuous": dict(num_envs=8, num_steps=32, update_epochs=4, learning_rate=5e-3,
                       gamma=0.95, gae_lambda=0.95, ent_coef=0.0, total_timesteps=300_000),
}
# The float hyperparameters, which change no array shape nor loop length, and the rule of each:
# several values sweep their grid, and train() takes them as traced values, not constants.
UNIT, NON_NEGATIVE = ("in [0, 1]", lambda x: 0 <= x <= 1), (">= 0", lambda x: x >= 0)
HPARAMS = dict(learning_rate=("> 0", lambda x: x > 0), gamma=UNIT, gae_lambda=UNIT,
               ent_coef=NON_NEGATIVE, max_grad_norm=NON_NEGATIVE)


class ArgError(ValueError):
    """A flag broke a rule: reported as one line with exit status 2, before anything compiles."""


def fill_defaults(args: Args) -> Args:
    """Resolve every None field from the environment kind and --num-envs (idempotent)."""
    env, env_params = gymnax.make(args.env_id)
    continuous = isinstance(env.action_space(env_params), spaces.Box)
    args = dataclasses.replace(args, **{
        k: (v,) if k in HPARAMS else v
        for k, v in ENV_DEFAULTS["continuous" if continuous else "discrete"].items()
        if getattr(args, k) is None})
    num_envs = args.num_envs or 32
    num_steps = args.num_steps or int(np.clip(2048 // num_envs, 16, 128))
    batch_size, most = num_envs * num_steps, int(np.clip(num_envs * num_steps // 512, 4, 32))
    # An env needs a whole episode (500 steps in CartPole-v1) before it reports a return.
    budget = max(300_000, int(1.5 * env_params.max_steps_in_episode * num_envs))
    return dataclasses.replace(
        args, num_envs=num_envs, num_steps=num_steps,
        num_minibatches=args.num_minibatches or max(  # the largest count <= most dividing it
            d for d in range(1, most + 1) if batch_size % d == 0),
        total_timesteps=args.total_timesteps or budget,
        normalize_obs=continuous if args.normalize_obs is None else args.normalize_obs,
        normalize_reward=continuous if args.normalize_reward is None else args.normalize_reward)


def grid(args: Args) -> list:
    """Every combination of the HPARAMS values (the first flag varies slowest)."""
    return [dict(zip(HPARAMS, values))
            for values in itertools.product(*(getattr(args, k) for k in HPARAMS))]


def check_one_value_flags(argv):
    """tyro would read `--num-envs 4 8` as an unknown option "8": name the flag instead."""
    one_value = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(Args)
                 if "tuple" not in str(f.type) and f.type is not bool}
    for i, flag in enumerate(argv):
        values = list(itertools.takewhile(lambda v: not v.startswith("--"), argv[i + 1:]))
        if flag in one_value and len(values) > 1:
            raise ArgError(f"{flag} takes one value: it sets array shapes or loop lengths")


def validate(args: Args) -> Args:
    """Check every flag before anything is compiled; returns the args with defaults filled."""
    try:  # an unknown id, or an env that cannot be built here (MNISTBandit-bsuite downloads data)
        env, env_params = gymnax.make(args.env_id)
    except Exception as e:
        raise ArgError(f"--env-id {args.env_id!r} cannot be built: {e!r}".splitlines()[0]) from None
    if not isinstance(env.action_space(env_params), (spaces.Discrete, spaces.Box)):
        raise ArgError(f"--env-id {args.env_id!r} has an action space VPG here does not handle")
    for name in ("num_seeds", "num_envs", "num_steps", "num_minibatches", "update_epochs",
                 "hidden_size", "total_timesteps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ArgError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(args, name)})")
    for name, (rule, holds) in HPARAMS.items():
        for x in getattr(args, name) or ():
            if not holds(x):
                raise ArgError(f"--{name.replace('_', '-')} must be {rule} (got {x})")
    args = fill_defaults(args)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches:
        raise ArgError(f"--num-minibatches {args.num_minibatches} must divide the batch "
                       f"num_envs * num_steps = {batch_size}")
    if args.total_timesteps < batch_size:
        raise ArgError(f"--total-timesteps {args.total_timesteps} is less than one batch "
                       f"(num_envs * num_steps = {batch_size})")
    return args


# ============================================================================ 2. environment
class RunningStats(NamedTuple):
    """Running mean and variance (parallel Welford), for observation and return normalisation."""
    mean: jax.Array
    var: jax.Array
    count: jax.Array

    @classmethod
    def create(cls, shape):
        return cls(jnp.zeros(shape), jnp.ones(shape), jnp.asarray(1e-4))

    def update(self, batch):
        b_mean, b_var, b_count = batch.mean(0), batch.var(0), batch.shape[0]
        delta, total = b_mean - self.mean, self.count + b_count
        mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        return RunningStats(mean, m2 / total, total)


def normalize(obs, stats: RunningStats, enabled: bool):
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -10, 10) if enabled else obs


# ============================================================================ 3. network
class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy and the value; orthogonal initialisation."""
    action_dim: int
    continuous: bool
    hidden_size: int = 64

    def setup(self):
        dense = lambda size, scale: nn.Dense(size, kernel_init=nn.initializers.orthogonal(scale))
        mlp = lambda out, scale: nn.Sequential([dense(self.hidden_size, np.sqrt(2)), nn.tanh,
                                                dense(self.hidden_size, np.sqrt(2)), nn.tanh,
                                                dense(out, scale)])
        self.actor = mlp(self.action_dim, 0.01)
        self.critic = mlp(1, 1.0)
        if self.continuous:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))

    def policy(self, obs) -> distrax.Distribution:
        out = self.actor(obs)
        if self.continuous:
            return distrax.MultivariateNormalDiag(out, jnp.exp(self.log_std))
        return distrax.Categorical(logits=out)

    def value(self, obs) -> jax.Array:
        return self.critic(obs)[..., 0]

    def __call__(self, obs):
        return self.policy(obs), self.value(obs)


# ============================================================================ 4. training
class Transition(NamedTuple):
    obs: jax.Array           # normalised observation the action was chosen from
    action: jax.Array
    log_prob: jax.Array      # behaviour log-probability
    reward: jax.Array        # (scaled) reward used for learning
    next_obs: jax.Array      # normalised observation after the step, before any auto-reset
    terminated: jax.Array
    truncated: jax.Array


class VPGState(TrainState):
    """flax's TrainState, whose `tx` takes the value steps, plus the policy step's Adam."""
    policy_tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)
    policy_opt_state: optax.OptState = None


class RunnerState(NamedTuple):
    train_state: TrainState
    env_state: object
    obs: jax.Array           # raw observations of the current step
    obs_stats: RunningStats
    return_stats: RunningStats
    discounted_return: jax.Array  # per env, for reward scaling
    episode_return: jax.Array     # per env, undiscounted, for reporting
    episode_length: jax.Array
    key: jax.Array
    hp: dict                 # this run's HPARAMS values (traced)


def compute_gae(rewards, values, next_values, terminated, truncated, gamma, gae_lambda):
    """GAE(lambda) over a [T, N] rollout by a reversed scan.

    next_values[t] is V of the observation after step t *before* auto-reset, so a truncated step
    bootstraps from its true final observation; a terminated step does not bootstrap; the
    advantage recursion stops at either."""
    deltas = rewards + gamma * (1.0 - terminated) * next_values - values
    masks = gamma * gae_lambda * (1.0 - jnp.maximum(terminated, truncated))

    def step(adv_next, x):
        delta, mask = x
        adv = delta + mask * adv_next
        return adv, adv

    _, advantages = jax.lax.scan(step, jnp.zeros_like(deltas[0]), (deltas, masks), reverse=True)
    return advantages, advantages + values


def loss_fn(params, network, hp, batch: Transition, advantages, targets):
    """VPG's loss on a batch and its statistics; hp holds ent_coef."""
    dist, values = network.apply(params, batch.obs)
    log_prob = dist.log_prob(batch.action)
    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy_loss = -(log_prob * advantages).mean()  # its gradient: -mean(grad log pi * A)
    value_loss = 0.5 * ((values - targets) ** 2).mean()
    entropy = dist.entropy().mean()
    loss = policy_loss + value_loss - hp["ent_coef"] * entropy
    return loss, {"loss/policy": policy_loss, "loss/value": value_loss, "loss/entropy": entropy,
                  "stats/approx_kl": ((ratio - 1.0) - log_ratio).mean()}


def make_train(args: Args):
    """train(key, hp) -> (final RunnerState, metrics of shape [num_updates]): one run, with its
    HPARAMS values hp (a dict of scalars) as traced arguments."""
    args = fill_defaults(args)
    env, env_params = gymnax.make(args.env_id)
    action_space = env.action_space(env_params)
    continuous = isinstance(action_space, spaces.Box)
    # Observations of any rank (MinAtar's grids) are flattened for the MLP.
    obs_shape = (int(np.prod(env.observation_space(env_params).shape)),)
    as_vectors = lambda obs: obs.reshape(args.num_envs, -1).astype(jnp.float32)
    action_dim = action_space.shape[0] if continuous else action_space.n
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    num_updates = args.total_timesteps // batch_size
    progress_every = max(1, num_updates // 10)
    network = ActorCritic(action_dim, continuous, args.hidden_size)

    # The policy step (`policy_tx`) and the value steps (`tx`) each move only their own part of the
    # parameters, with their own Adam moments: a shared Adam would move the actor in value steps.
    part = lambda params: jax.tree.map_with_path(
        lambda path, _: "value" if "critic" in jax.tree_util.keystr(path) else "policy", params)

    def make_tx(hp):
        """(policy_tx, tx) of one run, with its traced learning rate and gradient clip."""
        adam = lambda steps: optax.chain(optax.clip_by_global_norm(hp["max_grad_norm"]), optax.adam(
            optax.linear_schedule(hp["learning_rate"], 0.0, steps) if args.anneal_lr
            else hp["learning_rate"], eps=1e-5))
        value_steps = num_updates * args.update_epochs * args.num_minibatches
        return (optax.multi_transform({"value": optax.set_to_zero(), "policy": adam(num_updates)},
                                      part),
                optax.multi_transform({"policy": optax.set_to_zero(), "value": adam(value_steps)},
                                      part))

    vreset = jax.vmap(env.reset, in_axes=(0, None))
    vstep = jax.vmap(env.step, in_axes=(0, 0, 0, None))

    def env_step(runner: RunnerState, _):
        obs_stats = runner.obs_stats.update(runner.obs) if args.normalize_obs else runner.obs_stats
        obs = normalize(runner.obs, obs_stats, args.normalize_obs)
        key, k_act, k_env = jax.random.split(runner.key, 3)
        dist = network.apply(runner.train_state.params, obs, method=ActorCritic.policy)
        action, log_prob = dist.sample_and_log_prob(seed=k_act)
        env_action = jnp.clip(action, action_space.low, action_space.high) if continuous else action
        next_obs, env_state, reward, terminated, truncated, info = vstep(
            jax.random.split(k_env, args.num_envs), runner.env_state, env_action, env_params)
        done = jnp.logical_or(terminated, truncated)
        terminated, truncated = terminated.astype(jnp.float32), truncated.astype(jnp.float32)

        # Reward scaling divides by the std of the discounted return (as gym's NormalizeReward).
        discounted_return = runner.discounted_return * runner.hp["gamma"] + reward
        return_stats = (runner.return_stats.update(discounted_return[:, None])
                        if args.normalize_reward else runner.return_stats)
        scaled_reward = reward / jnp.sqrt(return_stats.var[0] + 1e-8) if args.normalize_reward \
            else reward
        episode_return = runner.episode_return + reward
        episode_length = runner.episode_length + 1
        final_obs = normalize(as_vectors(info["final_observation"]), obs_stats, args.normalize_obs)
        transition = Transition(obs, action, log_prob, scaled_reward, final_obs, terminated,
                                truncated)
        finished = (done.sum(), (episode_return * done).sum(), (episode_length * done).sum())
        runner = RunnerState(
            runner.train_state, env_state, as_vectors(next_obs), obs_stats, return_stats,
            jnp.where(done, 0.0, discounted_return), jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length), key, runner.hp)
        return runner, (transition, finished)

    def update_minibatch(hp, train_state, minibatch):
        grads, stats = jax.grad(loss_fn, has_aux=True)(train_state.params, network, hp, *minibatch)
        return train_state.apply_gradients(grads=grads), stats

    def update_epoch(hp, carry, _):
        train_state, batch, key = carry
        key, k_perm = jax.random.split(key)
        perm = jax.random.permutation(k_perm, batch_size)
        minibatches = jax.tree.map(
            lambda x: x[perm].reshape(args.num_minibatches, minibatch_size, *x.shape[1:]), batch)
        train_state, stats = jax.lax.scan(partial(update_minibatch, hp), train_state, minibatches)
        return (train_state, batch, key), stats

    def update_step(runner: RunnerState, update_idx):
        runner, (traj, finished) = jax.lax.scan(env_step, runner, None, args.num_steps)
        params = runner.train_state.params
        values = network.apply(params, traj.obs, method=ActorCritic.value)
        next_values = network.apply(params, traj.next_obs, method=ActorCritic.value)
        advantages, targets = compute_gae(traj.reward, values, next_values, traj.terminated,
                                          traj.truncated, runner.hp["gamma"],
                                          runner.hp["gae_lambda"])
        flat = lambda x: x.reshape(batch_size, *x.shape[2:])
        batch = jax.tree.map(flat, (traj, advantages, targets))
        # One policy-gradient step on the whole batch (the losses are those before it) ...
        state, hp = runner.train_state, runner.hp
        grads, stats = jax.grad(loss_fn, has_aux=True)(params, network, hp, *batch)
        updates, policy_opt_state = state.policy_tx.update(grads, state.policy_opt_state)
        runner = runner._replace(train_state=state.replace(
            params=optax.apply_updates(params, updates), policy_opt_state=policy_opt_state))
        stats["stats/approx_kl"] = loss_fn(runner.train_state.params, network, hp,
                                           *batch)[1]["stats/approx_kl"]
        # ... then PPO's epochs of minibatch steps, which `tx` spends on the value function alone.
        key, k_epochs = jax.random.split(runner.key)
        (train_state, _, _), _ = jax.lax.scan(partial(update_epoch, runner.hp),
                                              (runner.train_state, batch, k_epochs), None,
                                              args.update_epochs)
        runner = runner._replace(train_state=train_state, key=key)

        count, return_sum, length_sum = jax.tree.map(lambda x: x.sum(), finished)
        metrics = {k: v.mean() for k, v in stats.items()}
        metrics["env_steps"] = (update_idx + 1) * batch_size
        metrics["episode_return"] = jnp.where(count > 0, return_sum / count, jnp.nan)
        metrics["episode_length"] = jnp.where(count > 0, length_sum / count, jnp.nan)
        # update_idx is not batched under vmap, so this cond is a real branch, not a select.
        jax.lax.cond((update_idx + 1) % progress_every == 0,
                     lambda: jax.debug.callback(PROGRESS, metrics), lambda: None)
        return runner, metrics

    def train(key, hp):
        k_init, k_env, k_run = jax.random.split(key, 3)
        params = network.init(k_init, jnp.zeros(obs_shape))
        policy_tx, tx = make_tx(hp)
        train_state = VPGState.create(apply_fn=network.apply, params=params, tx=tx,
                                      policy_tx=policy_tx, policy_opt_state=policy_tx.init(params))
        obs, env_state = vreset(jax.random.split(k_env, args.num_envs), env_params)
        runner = RunnerState(
            train_state, env_state, as_vectors(obs), RunningStats.create(obs_shape),
            RunningStats.create((1,)), jnp.zeros(args.num_envs), jnp.zeros(args.num_envs),
            jnp.zeros(args.num_envs, jnp.int32), k_run, hp)
        runner, metrics = jax.lax.scan(update_step, runner, jnp.arange(num_updates))
        return runner, metrics

    return train


# ============================================================================ 5. seed sweep
# LLVM at -O1: compiles faster than XLA's default (6.4 vs 7.1 s, RESULTS.md), as fast a program.
COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
CACHE_HITS = []  # of the persistent cache: counted around a compile, to say where it came from
jax.monitoring.register_event_listener(lambda e, **_: e.endswith("hits") and CACHE_HITS.append(e))


def run(args: Args, num_devices: Optional[int] = None):
    """Train each configuration of grid(args) on args.num_seeds seeds: pmap over the largest
    number of local devices (at most num_devices) that divides the runs x vmap on each device.

    Seed k gets the k-th split of PRNGKey(args.seed) in every configuration, whatever the layout.
    Returns (final_runner_state, metrics, timing); every leaf has a leading [num_seeds] axis, or
    [num_configs, num_seeds] for a sweep of several configurations."""
    args = fill_defaults(args)
    configs, seeds = grid(args), args.num_seeds
    runs = len(configs) * seeds
    limit = num_devices or jax.local_device_count()
    devices = jax.local_devices()[: max(d for d in range(1, limit + 1) if runs % d == 0)]
    keys = jnp.tile(jax.random.split(jax.random.PRNGKey(args.seed), seeds), (len(configs), 1))
    hp = {k: jnp.repeat(jnp.array([c[k] for c in configs], jnp.float32), seeds) for k in HPARAMS}
    layout = lambda x: x.reshape(len(devices), runs // len(devices), *x.shape[1:])
    keys, hp = jax.tree.map(layout, (keys, hp))
    t0 = time.perf_counter()
    lowered = jax.pmap(jax.vmap(make_train(args)), devices=devices).lower(keys, hp)
    hits = len(CACHE_HITS)  # a hit from here on is the training program's
    compiled = lowered.compile(COMPILER_OPTIONS)
    compile_s, cached = time.perf_counter() - t0, len(CACHE_HITS) > hits
    PROGRESS.start(args, runs)
    state, metrics = jax.block_until_ready(compiled(keys, hp))
    run_s = time.perf_counter() - PROGRESS.t_start
    lead = (len(configs), seeds) if len(configs) > 1 else (seeds,)
    state, metrics = jax.tree.map(lambda x: x.reshape(*lead, *x.shape[2:]), (state, metrics))
    steps_taken = float(np.sum(metrics["env_steps"][..., -1]))  # every run, whole updates only
    timing = {"compile_s": compile_s, "run_s": run_s, "sps": steps_taken / run_s,
              "devices": len(devices), "cached": cached}
    return state, metrics, timing


# ============================================================================ 6. logging and output
class Progress:
    """Host side of the in-jit progress callback: one line once every run reported an update."""

    def start(self, args: Args, runs: Optional[int] = None):
        self.args, self.runs, self.pending, self.lines = args, runs or args.num_seeds, {}, []
        self.t_start = time.perf_counter()
        self.lock = threading.Lock()  # callbacks arrive on one thread per device

    def __call__(self, metrics):
        steps = int(metrics["env_steps"])
        with self.lock:
            returns = self.pending.setdefault(steps, [])
            returns.append(float(metrics["episode_return"]))
            if len(returns) < self.runs:
                return
            del self.pending[steps]
        sps = steps * self.runs / max(time.perf_counter() - self.t_start, 1e-9)
        self.lines.append((steps, sps))
        finished = [r for r in returns if np.isfinite(r)]
        runs = "seeds" if self.runs == self.args.num_seeds else "runs"
        line = (f"return {np.mean(finished):8.2f} (mean of {len(finished)} {runs})" if finished
                else "no episode finished yet")
        print(f"[{self.args.exp_name}] steps {steps:>10,} / {self.args.total_timesteps:,}  "
              f"{line}  SPS {sps:,.0f}", flush=True)


PROGRESS = Progress()


def final_returns(metrics, fraction=0.05):
    """Per seed: mean episode_return over the last `fraction` of updates (NaNs ignored)."""
    returns = np.asarray(metrics["episode_return"])
    tail = max(1, int(round(returns.shape[1] * fraction)))
    return np.nanmean(returns[:, -tail:], axis=1)


def write_tensorboard(run_dir, args: Args, metrics):
    """Event files written with the tensorboard package alone (no torch, no tensorflow)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    table = "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
    tags = {"episode_return": "charts/episodic_return", "episode_length": "charts/episodic_length"}
    for k in range(args.num_seeds):
        writer = EventFileWriter(os.path.join(run_dir, f"seed_{k}"))
        writer.add_event(Event(wall_time=time.time(), summary=text_pb("hyperparameters", table)))
        scalars = [(tags.get(key, key.replace("loss/", "losses/")), values[k, i], step)
                   for i, step in enumerate(metrics["env_steps"][k])
                   for key, values in metrics.items() if key != "env_steps"]
        for tag, value, step in scalars + [("charts/SPS", sps, s) for s, sps in PROGRESS.lines]:
            if np.isfinite(value):
                writer.add_event(Event(wall_time=time.time(), step=int(step), summary=Summary(
                    value=[Summary.Value(tag=tag, simple_value=float(value))])))
        writer.close()


def save_model(run_dir, args: Args, state: RunnerState):
    """Atomically write every seed's parameters (and normalisation statistics) to model.msgpack."""
    payload = {"args": json.dumps(dataclasses.asdict(args)),
               "params": jax.device_get(state.train_state.params),
               "obs_mean": np.asarray(state.obs_stats.mean),
               "obs_var": np.asarray(state.obs_stats.var)}
    os.makedirs(run_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".model.", delete=False) as f:
        f.write(flax.serialization.msgpack_serialize(payload))
    os.replace(f.name, os.path.join(run_dir, "model.msgpack"))
    return os.path.join(run_dir, "model.msgpack")


def summary(args: Args, finals, timing) -> str:
    """finals: [num_configs, num_seeds] final returns; one row per configuration, best first."""
    configs = grid(args)
    sweep = f"{len(configs)} configurations x " if len(configs) > 1 else ""
    lines = [f"{args.exp_name} on {args.env_id}: {sweep}{args.num_seeds} seeds x "
             f"{args.total_timesteps:,} steps ({args.num_envs} envs x {args.num_steps} steps "
             "per update)"]
    timing_line = (f"{timing['devices']} device(s)  compile {timing['compile_s']:.1f} s"
                   f"{' (cache)' if timing['cached'] else ''}  run {timing['run_s']:.1f} s  |  "
                   f"{timing['sps']:,.0f} steps/s")
    if len(configs) == 1:
        return "\n".join(lines + [
            "final return per seed (last 5% of updates): "
            + " ".join(f"{r:.1f}" for r in finals[0]),
            f"mean {np.mean(finals):.2f}  min {np.min(finals):.2f}  |  {timing_line}"])
    varied = [k for k in HPARAMS if len(getattr(args, k)) > 1]
    rng = np.random.default_rng(0)
    lines.append(" | ".join(varied + ["final return mean [95% CI over seeds]", "IQM", "worst"]))
    for c in np.argsort(-finals.mean(1), kind="stable"):
        x = finals[c]  # this configuration's seeds: bootstrap their mean
        ci = np.percentile(x[rng.integers(0, len(x), (2000, len(x)))].mean(1), [2.5, 97.5])
        lines.append(" | ".join([f"{configs[c][k]:g}" for k in varied] + [
            f"{x.mean():.1f} [{ci[0]:.1f}, {ci[1]:.1f}]", f"{trim_mean(x, 0.25):.1f}",
            f"{x.min():.1f}"]))
    return "\n".join(lines + [timing_line])


# ============================================================================ 7. main
def main():
    try:
        check_one_value_flags(sys.argv[1:])  # before tyro, which would blame the value
        args = validate(tyro.cli(Args, description=__doc__.split("\n\n")[0]))
    except ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    # The cache is set up at the first compile (importing gymnax runs some): set it up again.
    compilation_cache.set_cache_dir(args.compile_cache_dir or None)
    compilation_cache.reset_cache()
    state, metrics, timing = run(args)
    configs, metrics = grid(args), jax.device_get(metrics)
    if len(configs) == 1:  # a configuration axis in front, as a sweep has
        state, metrics = jax.tree.map(lambda x: x[None], (state, metrics))
    pick, start = (lambda tree, c: jax.tree.map(lambda x: x[c], tree)), int(time.time())
    for c, config in enumerate(configs):  # one run directory each, named by the varied values
        one = dataclasses.replace(args, **{k: (v,) for k, v in config.items()})
        varied = "".join(f"__{k}={v:g}" for k, v in config.items() if len(getattr(args, k)) > 1)
        run_dir = os.path.join(args.log_dir,
                               f"{args.env_id}__{args.exp_name}__{args.seed}__{start}{varied}")
        if args.track:
            write_tensorboard(run_dir, one, pick(metrics, c))
        if args.save_model:
            print(f"saved {save_model(run_dir, one, pick(state, c))}")
    print(summary(args, np.stack([final_returns(pick(metrics, c)) for c in range(len(configs))]),
                  timing))


if __name__ == "__main__":
    main()
