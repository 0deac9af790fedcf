"""The command line: the runner's flags beside the algorithm's, their rules (checked before
anything compiles) and the sweep they describe, configurations x seeds."""
import dataclasses
import functools
import itertools
import os
import sys
import tempfile
from typing import Annotated, Literal, Optional

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from . import Algorithm, envs


@dataclasses.dataclass
class RunnerFlags:
    exp_name: str = "(the file's stem)"
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
    """a model.msgpack (--save-model): no training; the end of training again, from its saved
    policies (their evaluation, GIF and pictures, as asked)"""
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
    devices_per_run: Optional[int] = None  # (its --help names the file's SPLIT: args_class)
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


# Flags a file without them offers (kept, at their defaults, in what it writes): Brax's, where
# ENVS has no Brax; those that play a policy in the runner's env, where ENVS is empty.
BRAX_FLAGS, PLAY_FLAGS = ("brax_backend",), ("capture_gif", "eval_episodes", "eval_every_segment")


class ArgError(ValueError):
    """A flag broke a rule: reported as one line with exit status 2, before anything compiles."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def args_class(module) -> type:
    """The dataclass Args of an algorithm module: its ExtraFlags, Hyperparams, then the runner's
    flags (those it cannot use hidden); Args.algorithm, the module as the runner reads it."""
    algorithm = Algorithm(module)
    hidden = ((() if "brax" in algorithm.ENVS else BRAX_FLAGS)
              + (() if algorithm.ENVS else PLAY_FLAGS))
    split = flag(algorithm.SPLIT)
    fields = {f.name: f for f in dataclasses.fields(RunnerFlags)}
    own = [("exp_name", str, dataclasses.field(
                default=os.path.basename(algorithm.__file__)[: -len(".py")])),
           ("devices_per_run", Annotated[Optional[int], tyro.conf.arg(help=(
               f"devices one run spans (its {split} shared out, means over all); unset: runs "
               "fill the devices, several a run if fewer; --resume keeps a run's"))],
            dataclasses.field(default=None))]
    own += [(name, Annotated[fields[name].type, tyro.conf.Suppress],
             dataclasses.field(default=fields[name].default)) for name in hidden]
    return dataclasses.make_dataclass(
        "Args", own, bases=(RunnerFlags, algorithm.Hyperparams, algorithm.ExtraFlags),
        namespace={"algorithm": algorithm})


def grid(args) -> list:
    """Every combination of the HPARAMS values (the first flag varies slowest)."""
    hparams = args.algorithm.HPARAMS
    return [dict(zip(hparams, v)) for v in itertools.product(*(getattr(args, k) for k in hparams))]


def num_runs(args) -> int:
    """The sweep's runs: its configurations x seeds."""
    return len(grid(args)) * args.num_seeds


def swept(args) -> list:
    """The HPARAMS flags given several values."""
    return [k for k in args.algorithm.HPARAMS if len(getattr(args, k)) > 1]


def run_inputs(args, stream: Optional[int] = None) -> tuple:
    """(keys [runs, 2], hp {flag: float32 [runs]}) of the sweep's runs, configuration by
    configuration: seed k's key is the k-th split of PRNGKey(--seed) (of its fold_in with
    `stream`, a stream of its own: evaluation's) in every configuration."""
    key, configs = jax.random.PRNGKey(args.seed), grid(args)
    key = key if stream is None else jax.random.fold_in(key, stream)
    keys = jnp.tile(jax.random.split(key, args.num_seeds), (len(configs), 1))
    return keys, {k: np.repeat(np.float32([c[k] for c in configs]), args.num_seeds)
                  for k in args.algorithm.HPARAMS}


def validate(args):
    """Check every flag (an int: >= 1 or its least value in COUNTS, the runner's below; --seed any)
    and resolve the unset ones (the file's `resolve`), before any compile."""
    algorithm = args.algorithm
    least = {**algorithm.COUNTS, "eval_episodes": 0, "process_id": 0, "pbt_burn_in": 0,
             "seed": -np.inf}
    for name, value in vars(args).items():
        if type(value) is int and value < least.get(name, 1):
            raise ArgError(f"{flag(name)} must be >= {least.get(name, 1)} (got {value})")
    for name, (rule, holds) in algorithm.HPARAMS.items():
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
        args = algorithm.resolve(args, *envs.make_env(args))
    except ValueError as e:
        raise ArgError(str(e)) from None
    check_pbt(args)
    if args.capture_gif:  # a first frame, drawn now (classic control by pygame, headless)
        for device in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):
            os.environ.setdefault(device, "dummy")
        env, env_params = envs.make_env(args)
        try:
            with tempfile.TemporaryDirectory() as folder:
                first = env.reset(jax.random.PRNGKey(0), env_params)[1]
                envs.draw(env, env_params, [first], [0.0], os.path.join(folder, "first.gif"))
        except Exception as e:
            raise ArgError(f"--capture-gif cannot draw {args.env_id} here: "
                           f"{str(e).splitlines()[0]}") from None
    if args.pbt:  # the schedule's unset steps: a tenth of the run, a burn-in of two of them
        interval = args.pbt_interval or max(1, args.total_timesteps // 10)
        burn_in = 2 * interval if args.pbt_burn_in is None else args.pbt_burn_in
        args = dataclasses.replace(args, pbt_interval=interval, pbt_burn_in=burn_in)
    runs_steps = args.total_timesteps * num_runs(args)
    return dataclasses.replace(args, num_segments=args.num_segments or max(  # one per 2^24 steps
        10, -(-runs_steps // 2**24)))


def check_pbt(args):
    """The --pbt flags' rules (that its schedule has a step: segments, which knows the updates)."""
    typed = [f.name for f in dataclasses.fields(RunnerFlags)
             if f.name.startswith("pbt_") and getattr(args, f.name) != f.default]
    if typed and not args.pbt:
        raise ArgError(f"{flag(typed[0])} is for --pbt, which is not set")
    rules = {"pbt_fraction": ("in (0, 0.5]", lambda x: 0 < x <= 0.5),
             "pbt_last_stretch": ("in [0, 1)", lambda x: 0 <= x < 1),
             "pbt_resample": ("in [0, 1]", lambda x: 0 <= x <= 1),
             "pbt_margin": (">= 0", lambda x: x >= 0)}
    for name, (rule, holds) in rules.items():
        if not holds(getattr(args, name)):
            raise ArgError(f"{flag(name)} must be {rule} (got {getattr(args, name)})")
    if args.pbt and not args.load_model and num_runs(args) < 2:
        raise ArgError("--pbt needs a population of 2 runs or more (configurations x seeds)")


def typed_flags(argv) -> dict:
    """{flag: the words after it} of each flag on the command line, as --kebab-case (tyro takes
    --snake_case too), and --x for a typed --no-x."""
    typed = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            name = word.split("=")[0].replace("_", "-")
            typed[name] = list(itertools.takewhile(lambda v: not v.startswith("--"), argv[i + 1:]))
            if name.startswith("--no-"):
                typed["--" + name[len("--no-"):]] = typed[name]
    return typed


def parse(Args: type, argv):
    """The command line as Args; --help shows what a flag left to resolve is on the default env."""
    one_value = {flag(f.name) for f in dataclasses.fields(Args)
                 if "tuple" not in str(f.type) and f.type is not bool}
    for name, values in typed_flags(argv).items():  # tyro would blame the second value as an
        if name in one_value and len(values) > 1:  # unknown option
            raise ArgError(f"{name} takes one value (only the swept floats, HPARAMS, take more)")
    algorithm, shown = Args.algorithm, Args
    if "--help" in argv or "-h" in argv:
        shown = help_hints(Args)
    typed = tyro.cli(shown, args=argv, description=(
        f"{algorithm.__doc__.split(chr(10) * 2)[0]}\n\nThe algorithm's flags come first; the "
        "runner's from --exp-name on."))
    return Args(**{f.name: getattr(typed, f.name) for f in dataclasses.fields(Args)})


def help_hints(Args: type) -> type:
    """Args whose flags left to resolve show in --help their value on the default env."""
    shown, hinted = validate(Args()), []
    algorithm = Args.algorithm
    algorithm_flags = {f.name for f in dataclasses.fields(algorithm.Hyperparams)}
    for field in (f for f in dataclasses.fields(Args) if f.default is None):
        value = getattr(shown, field.name)
        value = value[0] if isinstance(value, tuple) and len(value) == 1 else value
        where = (f"; per env: PRESETS in {os.path.basename(algorithm.__file__)}"
                 if field.name in algorithm_flags else "")
        hint = f"(default: {value} on {shown.env_id}{where})" if value is not None else None
        config = tyro.conf.arg(help_behavior_hint=hint or "(default: unset)")
        hinted.append((field.name, Annotated[field.type, config], dataclasses.field(default=None)))
    return dataclasses.make_dataclass("Args", hinted, bases=(Args,))
