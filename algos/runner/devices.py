"""Devices and processes: a CPU device per core, --distributed's processes joined, the mesh that
lays the runs over the devices, and Shard, one device's part of a run (make_train's `shard`)."""
import dataclasses
import functools
import os
import socket
import time
from typing import Optional

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import envs, flags

JOIN_TIMEOUT_S = 60  # --distributed: a process that has not joined the others by then fails


def one_device_per_core():
    """A CPU device per core (XLA runs a program on about one), unless XLA_FLAGS or jax chose."""
    if ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
            and jax.config.jax_num_cpu_devices < 0 and jax.default_backend() == "cpu"):
        jax.extend.backend.clear_backends()
        jax.config.update("jax_num_cpu_devices", os.cpu_count() or 1)


def meet(args):
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
        raise flags.ArgError(f"--coordinator-address {args.coordinator_address}: {joined} of the "
                             f"{args.num_processes - 1} other processes joined within "
                             f"{JOIN_TIMEOUT_S} s") from None
    except (OSError, ValueError) as e:
        raise flags.ArgError(f"--coordinator-address {args.coordinator_address}: {e}") from None


def start_processes(args):
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
        raise flags.ArgError(f"--distributed: {e}") from None


def layout(args, limit: Optional[int] = None) -> Mesh:
    """The mesh: the runs over groups ("runs") of `span` devices ("batch": a run's SPLIT shared
    out, its gradients and statistics averaged), every process lending its first ones, as many
    (<= limit): the most devices, then the most groups (the fewest collectives). A span must split
    a run's SPLIT into valid runs; --devices-per-run sets it. A run's devices are consecutive: on
    one process, or on several. ArgError if none fits."""
    runs, processes = flags.num_runs(args), jax.process_count()
    local = min(limit or jax.local_device_count(), jax.local_device_count())
    if (args.devices_per_run or 0) > processes * local:
        raise flags.ArgError(f"--devices-per-run {args.devices_per_run} > {processes * local} "
                             "devices")
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
        raise flags.ArgError(f"--devices-per-run {args.devices_per_run}: "
                             f"{reasons[args.devices_per_run]}")
    asked = f" with --devices-per-run {args.devices_per_run}" if args.devices_per_run else ""
    split = args.algorithm.SPLIT
    raise flags.ArgError(f"{runs} runs (configurations x seeds) of {flags.flag(split)} "
                         f"{getattr(args, split)} do not split over {processes} processes x "
                         f"{local} devices{asked}")


def share_of(args, span: int):
    """The arguments of a device's share of a run spanning `span` devices (its SPLIT / span)."""
    split = args.algorithm.SPLIT
    return dataclasses.replace(args, **{split: getattr(args, split) // span})


def why_not_split(args, span: int) -> Optional[str]:
    """Why a run's SPLIT cannot be shared out over `span` devices (each share a valid run)."""
    split = args.algorithm.SPLIT
    if getattr(args, split) % span:
        return f"{flags.flag(split)} {getattr(args, split)} does not split into {span} equal shares"
    try:
        args.algorithm.resolve(share_of(args, span), *envs.make_env(args))
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
        steps, held = jax.tree.leaves(batch)[0].shape[:2]  # (held: this device's envs)
        group = count // np.gcd(steps, count)
        run_envs = held if self.axis is None else held * jax.lax.axis_size(self.axis)
        keys = self.keys(key, run_envs // group)
        order = jax.vmap(jax.random.permutation, in_axes=(0, None))(keys, group * steps)
        env = jnp.arange(len(keys))[:, None] * group + order // steps
        index = (order % steps) * (len(keys) * group) + env  # in the [T * n] batch
        index = index.reshape(len(keys), count, -1).swapaxes(0, 1).reshape(count, -1)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[index], batch)


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
