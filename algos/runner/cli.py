"""main: the command line of a training file, its signals (stop after a segment, with a checkpoint),
the sweep and its files, and every error as one line (exit 2, or 74 for a file not written)."""
import json
import os
import shutil
import signal
import sys
import threading
import time

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.experimental.compilation_cache import compilation_cache

from . import devices, evaluation, events, files, flags, reports, sweep

STOP = []  # the signals received: the run stops at the end of the current segment


def stop_after_segment(signum, frame):
    """The first Ctrl-C or SIGTERM (a scheduler's notice of preemption) lets the segment finish
    and checkpoint; a second one (the default handlers back) stops at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    STOP.append(signum)
    print(f"\n{signal.Signals(signum).name}: stopping at the end of this segment (again: at "
          "once)", file=sys.stderr)


def train_and_write(args, checkpoint, run_dir, is_lead: bool):
    """The sweep: progress, events and a checkpoint after each segment (is_lead: this process
    writes and prints, process 0 of --distributed), then evaluation and files."""
    start = (checkpoint["state"], checkpoint["metrics"]) if checkpoint else None
    done = start[1]["env_steps"] if start else np.zeros((1, 0))  # the steps already written
    writer = events.Tensorboard(run_dir, args, done) if is_lead and args.track else None
    evaluate, evals = evaluation.evaluator(args) if is_lead else None, {}
    for state, metrics, timing in sweep.segments(args, start=start):
        if args.eval_every_segment and evaluate:
            evals = evaluate(state)
        if writer:
            speed = [timing["sps"]] * len(metrics["env_steps"])
            writer.write(metrics, {"charts/SPS": speed, **evals})
        # Every process stops after the same segment (others would wait), decided before its
        # line; but for the last: the run then finishes (its evaluation, files; none to resume)
        stop = multihost_utils.process_allgather(np.int32(STOP[0] if STOP else 0))
        if is_lead:
            files.write_checkpoint(run_dir, args, state, metrics, timing["num_updates"],
                                   timing["span"])
            print(reports.progress(args, metrics, timing), flush=True)
        if stop.any() and metrics["env_steps"].shape[1] < timing["num_updates"]:
            if is_lead:
                print(f"stopped with a checkpoint; continue with: python {sys.argv[0]} --resume "
                      f"{run_dir}", flush=True)
            sys.exit(128 + int(stop.max()))  # 130 after Ctrl-C, 143 after SIGTERM
    if not is_lead:
        return
    if evaluate and not args.eval_every_segment:
        evals = evaluate(state)
        if writer:
            writer.write(metrics, evals)
    if writer and args.pbt:
        writer.write_lineages(args, metrics, evals)
    records = reports.pbt_record(args, metrics) if args.pbt else []
    for c, (one, config_dir) in enumerate(files.config_dirs(run_dir, args)):
        os.makedirs(config_dir, exist_ok=True)
        seeds = slice(c * args.num_seeds, (c + 1) * args.num_seeds)  # this configuration's
        pbt = {f"seed_{k}": record for k, record in enumerate(records[seeds])}
        write_files(config_dir, one, jax.tree.map(lambda x: x[seeds], state), args.save_model,
                    pbt)
    print(reports.summary(args, metrics, timing, evals))


def write_files(folder, args, state, saving: bool, pbt={}):
    """One configuration's model (if saving), GIF (if asked) and the file's pictures; with --pbt,
    pbt.json: each seed's final hyperparameters and the run it descends from (pbt_record)."""
    paths = [files.save_model(folder, args, state, pbt)] if saving else []
    if pbt:
        paths.append(os.path.join(folder, "pbt.json"))
        files.write_atomic(paths[-1], json.dumps(pbt, indent=1).encode())
    if args.capture_gif:
        paths.append(evaluation.capture_gif(os.path.join(folder, "episode.gif"), args, state))
    for path in paths + args.algorithm.draw(folder, args, state):
        print(f"saved {path}")


def main(module):
    """The command line (sys.argv) on an algorithm module."""
    devices.one_device_per_core()
    try:
        args, saved = flags.parse(flags.args_class(module), sys.argv[1:]), None
        if args.resume or args.load_model:  # the saved flags, before any is judged
            args, saved = files.read_saved(args, sys.argv[1:])
        args = flags.validate(args)
        devices.start_processes(args)
        if not args.load_model:  # runs and envs that do not split over the devices: one
            devices.layout(args)  # line, now (a saved model plays on any devices)
        run_dir = args.resume or os.path.join(
            args.log_dir, f"{args.env_id.replace('/', '-')}__{args.exp_name}__{args.seed}__"
            f"{int(time.time())}")  # (brax/hopper: brax-hopper, one folder)
        is_lead = jax.process_index() == 0  # --distributed: process 0 alone writes and prints
        if is_lead and not args.load_model:  # before anything compiles: --log-dir must work,
            os.makedirs(run_dir, exist_ok=bool(args.resume))  # and be no other run's (exit 2)
    except (flags.ArgError, OSError) as e:  # (an OSError: --log-dir cannot be made)
        print(f"error: {'' if isinstance(e, flags.ArgError) else '--log-dir: '}{e}",
              file=sys.stderr)
        sys.exit(2)
    # The cache is set up at the first compile (importing gymnax runs some): set it up again.
    compilation_cache.set_cache_dir(args.compile_cache_dir or None)
    compilation_cache.reset_cache()
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # every program, not only
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # those over 1 s
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop_after_segment)
    threading.excepthook = events.Tensorboard.quiet_writer_errors
    try:
        if not args.load_model:
            train_and_write(args, saved, run_dir, is_lead)
        else:  # the saved policy of each seed, evaluated and drawn as after training
            state, evaluate = files.load_model(args, saved), evaluation.evaluator(args)
            print(f"{args.exp_name} on {args.env_id}: {args.num_seeds} seeds of {args.load_model}")
            write_files(os.path.dirname(args.load_model), args, state, saving=False)
            for k, v in (evaluate(state) if evaluate else {}).items():
                print(f"{k} per seed ({args.eval_episodes} episodes): "
                      + " ".join(f"{x:.4g}" for x in v))
    except flags.ArgError as e:  # the memory check, or a checkpoint this file cannot continue
        if is_lead and not (args.resume or args.load_model):  # the folder this run made
            shutil.rmtree(run_dir, ignore_errors=True)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a file that cannot be written: no space left, no permission...
        intact = "" if args.load_model else f" (the last checkpoint in {run_dir} is intact)"
        print(f"error: cannot write {e.filename}: {e.strerror}{intact}", file=sys.stderr)
        sys.exit(74)  # EX_IOERR
