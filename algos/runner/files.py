"""A run's files: its configurations' folders, the checkpoint written after every segment and read
by --resume, the model of --save-model read by --load-model; every file written atomically."""
import dataclasses
import hashlib
import json
import os
import tempfile

import flax.serialization
import jax
import numpy as np

from . import flags, sweep

FORMAT = 2  # of checkpoint.msgpack and model.msgpack: the runner reads the format it writes
# Flags that --resume and --load-model may not change (they change what is computed): the
# algorithm's, and these. Those of this process alone are never taken from the saved run.
FIXED = ("seed", "num_seeds", "num_segments", "brax_backend",
         *(f.name for f in dataclasses.fields(flags.RunnerFlags) if f.name.startswith("pbt")))
THIS_PROCESS = ("resume", "load_model", "compile_cache_dir", "distributed", "coordinator_address",
                "num_processes", "process_id")


def config_dirs(run_dir, args) -> list:
    """(arguments, directory) of each configuration: in a sweep, one named by its swept values."""
    varied = flags.swept(args)
    return [(dataclasses.replace(args, **{k: (v,) for k, v in config.items()}),
             os.path.join(run_dir, "__".join(f"{k}={config[k]:g}" for k in varied)))
            for config in flags.grid(args)]


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


def header(args, **fields) -> dict:
    """What a checkpoint or a model opens with: its format, the file that wrote it, `fields`, and
    the arguments (their JSON)."""
    return {"format": FORMAT, "file": os.path.basename(args.algorithm.__file__), **fields,
            "args": json.dumps(dataclasses.asdict(args))}


def write_checkpoint(run_dir, args, state, metrics, num_updates, span=None):
    """run_dir/checkpoint.msgpack: the arguments (the span: --resume keeps it), every run's state
    and metrics, after a SHA-256."""
    args = dataclasses.replace(args, devices_per_run=span or args.devices_per_run)
    data = flax.serialization.msgpack_serialize({
        **header(args, num_updates=num_updates), "metrics": metrics,
        "state": flax.serialization.to_state_dict(state)})
    write_atomic(os.path.join(run_dir, "checkpoint.msgpack"), hashlib.sha256(data).digest() + data)


def read_saved(args, argv) -> tuple:
    """(arguments, contents) of --resume's checkpoint or --load-model's model: the saved arguments
    but for the typed runner's flags not FIXED (the others must agree)."""
    if args.load_model and args.resume:
        raise flags.ArgError("--load-model plays a saved model; --resume trains on: choose one")
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
        raise flags.ArgError(f"{name} {path}: not a usable file ({e})") from None
    if saved.get("format", 0) != FORMAT:
        raise flags.ArgError(f"{name} {path}: its format is {saved.get('format', 0)}; this file "
                             f"reads format {FORMAT}")
    saved_flags, ours = json.loads(saved["args"]), {f.name for f in dataclasses.fields(args)}
    if set(saved_flags) != ours:
        raise flags.ArgError(f"{name} {path}: written by {saved['file']}, whose flags differ from "
                             f"this file's ({', '.join(sorted(set(saved_flags) ^ ours))})")
    algorithm_flags = {f.name for f in dataclasses.fields(args.algorithm.Hyperparams)}
    may_change = ours - algorithm_flags - set(FIXED)
    typed = flags.typed_flags(argv)
    for k, v in saved_flags.items():
        differs = json.loads(json.dumps(getattr(args, k))) != v  # (tuples as JSON's lists)
        if k not in may_change and flags.flag(k) in typed and differs:
            raise flags.ArgError(f"{flags.flag(k)} differs from the saved {v}: {name} takes the "
                                 "run as it was started")
    if args.resume and saved["metrics"]["env_steps"].shape[1] >= saved["num_updates"]:
        raise flags.ArgError(f"--resume {args.resume}: that run is finished (no update left)")

    def as_tuples(value):  # JSON's lists, nested too, as the tuples the flags hold
        return tuple(as_tuples(v) for v in value) if isinstance(value, list) else value

    kept = {k: as_tuples(v) for k, v in saved_flags.items()
            if k not in THIS_PROCESS and not (k in may_change and flags.flag(k) in typed)}
    return dataclasses.replace(args, **kept), saved


def save_model(model_dir, args, state, pbt={}):
    """Atomically write saved_model(state) of every seed, and the arguments (the ones it started
    with; --pbt: "pbt", each seed's final ones, as pbt.json), to model.msgpack."""
    path = os.path.join(model_dir, "model.msgpack")
    write_atomic(path, flax.serialization.msgpack_serialize(
        {**header(args, pbt=json.dumps(pbt)), **args.algorithm.saved_model(state)}))
    return path


def load_model(args, saved):
    """Each seed's state from a saved model: init's, with the leaves saved_model picks replaced."""
    leaves, treedef = jax.tree.flatten(jax.vmap(sweep.build_train(args).init)(
        *flags.run_inputs(args)))
    where = args.algorithm.saved_model(jax.tree.unflatten(treedef, range(len(leaves))))  # indices
    mine = {k: saved.get(k) for k in where}
    pairs = list(zip(jax.tree.leaves(where), jax.tree.leaves(mine)))
    if jax.tree.structure(mine) != jax.tree.structure(where) or any(
            np.shape(x) != leaves[i].shape for i, x in pairs):
        raise flags.ArgError(f"--load-model {args.load_model}: its model does not fit this file's")
    for i, x in pairs:
        leaves[i] = x
    return jax.tree.unflatten(treedef, leaves)
