"""The sweep: the configurations x seeds of one command as one program over the devices, compiled
once and called in segments, the population of --pbt stepping between two."""
import os
import time
from functools import partial
from typing import Optional

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import devices, envs, flags, pbt

EVENTS = []  # JAX's: a cache hit among those of a compile says where the program came from
jax.monitoring.register_event_listener(lambda event, **_: EVENTS.append(event))


def build_train(args, shard: Optional[devices.Shard] = None):
    """make_train on --env-id's env: a run alone on its device, unless shard."""
    return args.algorithm.make_train(args, *envs.make_env(args), shard or devices.Shard())


def state_specs(args, span: int, whole, key, hp):
    """A PartitionSpec per state leaf: [runs, ...] over "runs" and, where a device holds only its
    share of the run's (a leaf smaller in a run of its share of SPLIT), that axis over "batch"."""
    shapes = jax.eval_shape(whole.init, key, hp)
    part = shapes if span == 1 else jax.eval_shape(
        build_train(devices.share_of(args, span)).init, key, hp)

    def spec(whole, part):
        split = [i for i, (a, b) in enumerate(zip(whole.shape, part.shape)) if a != b]
        return P("runs", *[None] * split[0], "batch") if split else P("runs")

    return jax.tree.map(spec, shapes, part)


def compile_sweep(args, mesh, specs, train, keys, hp, resuming: bool):
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
    options = args.algorithm.COMPILER_OPTIONS
    run_segment = run_segment.lower(hp, state, shaped(np.int32(0), P())).compile(options)
    run_init = None if resuming else run_init.lower(keys, hp).compile(options)
    return run_init, run_segment, length


def segment_length(args, num_updates: int) -> int:
    """Updates in a segment (the last may run fewer): num_updates / --num-segments rounded up;
    with --pbt, the greatest divisor of its interval not above that (a step ends a segment)."""
    length = -(-num_updates // args.num_segments)
    if args.pbt:
        interval = pbt.schedule(args, num_updates)[1]
        length = max(d for d in range(1, min(length, interval) + 1) if interval % d == 0)
    return length


def segments(args, num_devices: Optional[int] = None, start=None):
    """Train grid(args) x seeds (seed k: the k-th split of PRNGKey(args.seed)) in num_segments
    calls of one program over the devices (layout), PBT between two; from `start`, a
    checkpoint's (state, metrics), on --resume. Yields after each (state, metrics [runs, updates
    so far], timing), all the processes' runs; the next segment runs while the caller writes."""
    mesh = devices.layout(args, num_devices)
    span, on_runs = mesh.shape["batch"], partial(devices.on_mesh, mesh, specs=P("runs"))
    keys, hp_runs = flags.run_inputs(args)
    whole = build_train(args)
    train = whole if span == 1 else build_train(args, devices.Shard("batch"))
    if args.pbt and not pbt.schedule(args, train.num_updates)[0]:  # (before anything compiles)
        raise flags.ArgError(f"--pbt: no step of the population in {args.total_timesteps:,} "
                             "steps (see --pbt-interval, --pbt-burn-in, --pbt-last-stretch)")
    specs = state_specs(args, span, whole, keys[0], {k: v[0] for k, v in hp_runs.items()})
    t0, seen = time.perf_counter(), len(EVENTS)  # a cache hit from here on is training's
    run_init, run_segment, length = compile_sweep(args, mesh, specs, train, keys, hp_runs,
                                                  resuming=start is not None)
    check_memory(args, [p for p in (run_init, run_segment) if p], mesh.size // jax.process_count())
    compile_s, cached = time.perf_counter() - t0, any(e.endswith("hits") for e in EVENTS[seen:])
    population = partial(pbt.step, args, jax.jit(partial(pbt.exploit_and_explore, args)),
                         num_updates=train.num_updates)
    if start is None:
        state, metrics = run_init(on_runs(keys), on_runs(hp_runs)), None
    else:  # a checkpoint's leaves are [runs, ...] as one device holds them, whatever the layout
        saved_state, metrics = start
        try:
            state = flax.serialization.from_state_dict(
                jax.eval_shape(jax.vmap(whole.init), keys, hp_runs), saved_state)
        except (ValueError, KeyError) as e:
            raise flags.ArgError(f"--resume: the checkpoint's state does not fit this file's ({e})")
        if args.pbt:  # those of the last segment; the population steps on as it would have
            hp_runs = {k: metrics[f"hp/{k}"][:, -1] for k in args.algorithm.HPARAMS}
            state, hp_runs, _ = population(state, hp_runs, metrics, metrics["env_steps"].shape[1])
        state = devices.on_mesh(mesh, state, specs)
    done = 0 if metrics is None else metrics["env_steps"].shape[1]
    steps_before = 0 if done == 0 else metrics["env_steps"][0, done - 1]
    valid = lambda first: devices.on_mesh(mesh, np.int32(min(length, train.num_updates - first)),
                                          P())
    t_start = time.perf_counter()
    out = run_segment(on_runs(hp_runs), state, valid(done))
    for first in range(done, train.num_updates, length):
        state, new = devices.to_host(mesh, out)  # (this waits for the segment)
        new = jax.tree.map(lambda x: x[:, :min(length, train.num_updates - first)], new)
        metrics = new if metrics is None else jax.tree.map(
            lambda a, b: np.concatenate([a, b], axis=1), metrics, new)
        following = out[0]  # the next segment runs while the host writes this one
        stepped, hp_runs, copied = population(state, hp_runs, metrics, first + length)
        if copied is not None:  # (the next segment waits for it); the sources at the last update
            following = devices.on_mesh(mesh, stepped, specs)
            column = np.where(copied < 0, np.nan, copied)[:, None]
            metrics["pbt/copied_from"] = np.hstack([metrics["pbt/copied_from"][:, :-1], column])
        if first + length < train.num_updates:
            out = run_segment(on_runs(hp_runs), following, valid(first + length))
        run_s = time.perf_counter() - t_start
        yield state, metrics, {
            "compile_s": compile_s, "run_s": run_s, "cached": cached, "first": first,
            "num_updates": train.num_updates, "devices": mesh.size, "span": span,
            "sps": flags.num_runs(args) * float(metrics["env_steps"][0, -1] - steps_before) / run_s}


def check_memory(args, programs, local_devices: int):
    """Refuse programs whose memory (XLA's estimate) exceeds what this process can have."""
    need = max(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes for m in (p.memory_analysis() for p in programs))
    if jax.default_backend() == "cpu":
        need, where = need * local_devices, "available on this machine"
        try:  # Linux's estimate of what can be had without swapping; elsewhere, all of it
            with open("/proc/meminfo") as f:
                have = 1024 * int(next(x for x in f if x.startswith("MemAvailable")).split()[1])
        except OSError:
            have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    else:
        where = f"on each {jax.default_backend()} device"
        have = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit", np.inf)
    if need > have:
        sizes = ", ".join(flags.flag(k) for k in (*args.algorithm.SIZE_FLAGS, "num_seeds"))
        raise flags.ArgError(f"the run needs about {need / 2**30:.1f} GiB (XLA's estimate), more "
                             f"than the {have / 2**30:.1f} GiB {where}: make {sizes} smaller")


def run(args, num_devices: Optional[int] = None):
    """(state, metrics, timing) of the whole sweep, leaves [num_seeds] or [configs, seeds]."""
    *_, (state, metrics, timing) = segments(args, num_devices)
    configs = len(flags.grid(args))
    lead = (configs, args.num_seeds) if configs > 1 else (args.num_seeds,)
    return *jax.tree.map(lambda x: x.reshape(*lead, *x.shape[1:]), (state, metrics)), timing
