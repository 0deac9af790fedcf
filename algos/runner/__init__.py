"""The runner: what every training file in algos/ shares, written once. A file holds its algorithm
and ends with a tail that hands the module to cli.main; the runner reads from it the names of the
contract below, no other, and never imports an algorithm file nor branches on one's name."""
import dataclasses

REQUIRED = object()
# The contract: each name the runner reads from an algorithm module, its shape and purpose; then
# its default where a module may leave it out (REQUIRED: it may not).
CONTRACT = {
    # The module's docstring (its first paragraph opens --help), its path (its stem: --exp-name's
    # default; checkpoints and models name the file).
    "__doc__": REQUIRED, "__file__": REQUIRED,
    # A dataclass of the algorithm's flags, env_id first; each field's docstring is its --help.
    # A field left None is filled by resolve (--help shows its value on the default env).
    "Hyperparams": REQUIRED,
    # {flag: (rule text, rule)}: the float flags the program traces, typed tuple[float, ...]
    # (several values: a sweep, one program); rule(x) -> bool, on arrays too.
    "HPARAMS": REQUIRED,
    # The HPARAMS flags whose scale is 1 - x (discounts): --pbt perturbs 1 - x.
    "NEAR_ONE": REQUIRED,
    # The flags that set a run's memory, named when it does not fit.
    "SIZE_FLAGS": REQUIRED,
    # resolve(args, env, env_params) -> args, every None filled (presets, rules); a ValueError
    # names a bad flag (reported as one line, exit 2).
    "resolve": REQUIRED,
    # make_train(args, env, env_params, shard) -> train(key, hp) -> (state, metrics): one run, hp
    # {HPARAMS flag: traced float32}; shard: a devices.Shard (Shard(): the run on one device).
    # train.init(key, hp) -> state, a NamedTuple (its field `key`: the run's PRNG key, which
    # --pbt renews); train.update(hp, state) -> (state, metrics {name: scalar}: env_steps,
    # episode_return and episode_length (the mean over the update's ended episodes, NaN if
    # none), episodes (their count: --pbt weighs by it); loss/x -> tensorboard's losses/x);
    # train.num_updates. Where ENVS names a suite: train.act(state, obs, memory, key=None) ->
    # (actions, memory) for raw observations, greedy or with a key exploring, memory what the
    # policy carries from one step of an episode to the next ([N, ...] leaves; () without),
    # train.initial_memory(N) its value at an episode's start.
    "make_train": REQUIRED,
    # saved_model(state) -> {name: leaves}: all train.act reads; --save-model writes it,
    # --load-model reads it back into an initial state.
    "saved_model": REQUIRED,
    # {flag: least value} of the int flags that may be below 1 (the others: >= 1).
    "COUNTS": {},
    # The int flag whose count a run spanning several devices shares out (its envs).
    "SPLIT": "num_envs",
    # The suites whose tasks --env-id names, built by the runner for resolve, make_train and
    # evaluation: gymnax's ids and Brax's brax/<name>. () where the file builds its own env from
    # its flags (env and env_params None): no evaluation, GIF or Brax flags then.
    "ENVS": ("gymnax", "brax"),
    # XLA's options for the training programs: LLVM -O1 (ppo.py's program compiles in 6.4 s, not
    # 7.1, and runs as fast; sac.py on Pendulum-v1: 6.3 s, not 9.4, run 28.2 s and 28.3).
    "COMPILER_OPTIONS": {"xla_backend_optimization_level": 1},
    # The metric ranking a sweep's configurations (and --pbt's runs): episode_return or a SHOWN.
    "SCORE": "episode_return",
    # {metric: format} of the metrics shown in progress lines and the summary.
    "SHOWN": {},
    # A dataclass of the file's own switches (bool fields), beside the hyperparameters.
    "ExtraFlags": dataclasses.make_dataclass("NoFlags", []),
    # draw(folder, args, state) -> [paths] of the file's own pictures of one configuration.
    "draw": lambda folder, args, state: [],
}


class Algorithm:
    """An algorithm module as the runner reads it: the contract's names alone, each the module's
    own, read at every use (a test's patch of the module reaches the runner), or its default."""

    def __init__(self, module):
        self.module, self.__doc__, self.__file__ = module, module.__doc__, module.__file__

    def __getattr__(self, name):  # (called for the names the instance itself does not hold)
        if name not in CONTRACT:
            raise AttributeError(f"{name} is not in the runner's contract (runner/__init__.py)")
        if CONTRACT[name] is REQUIRED:
            return getattr(self.module, name)
        return getattr(self.module, name, CONTRACT[name])
