"""How close the runner's memory check is: XLA's estimate of the compiled programs' memory (what
the runner compares with the memory the process can have) against the peak resident memory of the
same run, for ppo.py on CartPole-v1 at three --num-envs, one seed, one segment of 4 updates.

    python benchmarks/bench_memory.py [--sizes 16384 131072 524288]

Each size runs in a fresh process; the peak is that process's (getrusage), less the peak of the
same command at 256 envs (imports, JAX's runtime, the compiled code: what the estimate leaves
out). Prints a markdown table."""
import argparse
import os
import subprocess
import sys
import tempfile

import common

CHILD = """
import sys, resource
sys.path.insert(0, {algos!r})
import ppo
from runner import cli, sweep
estimates = []
check = sweep.check_memory
def spy(args, programs, devices):  # the check's own figure: the largest program's, x devices
    estimates.append(max(m.argument_size_in_bytes + m.output_size_in_bytes
                         + m.temp_size_in_bytes - m.alias_size_in_bytes
                         for m in (p.memory_analysis() for p in programs)) * devices)
    return check(args, programs, devices)
sweep.check_memory = spy
sys.argv = ["ppo.py", "--num-envs", sys.argv[1], "--num-steps", "16", "--num-minibatches", "4",
            "--update-epochs", "1", "--total-timesteps", str(int(sys.argv[1]) * 16 * 4),
            "--num-seeds", "1", "--num-segments", "1", "--no-track", "--compile-cache-dir", "",
            "--log-dir", sys.argv[2]]
cli.main(ppo)
print("ESTIMATE", estimates[0], "PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def measure(envs: int, log_dir: str) -> tuple[int, int]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    proc = subprocess.run([sys.executable, "-c", CHILD.format(algos=str(common.ALGOS)),
                           str(envs), log_dir], capture_output=True, text=True, env=env)
    line = [x for x in proc.stdout.splitlines() if x.startswith("ESTIMATE")]
    if proc.returncode or not line:
        raise SystemExit(proc.stderr[-2000:])
    _, estimate, _, peak = line[0].split()
    return int(estimate), int(peak)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[16384, 131072, 524288])
    sizes = parser.parse_args().sizes
    with tempfile.TemporaryDirectory() as log_dir:
        _, base = measure(256, log_dir)
        rows = [(n, *measure(n, log_dir)) for n in sizes]
    print(f"{common.machine_header()}; load {common.load_average()}; measured peak less the "
          f"256-env run's ({base / 2**20:.0f} MiB)\n")
    print(common.md_table(
        ["--num-envs", "XLA's estimate MiB", "measured peak - base MiB", "estimate / measured"],
        [[f"{n:,}", f"{e / 2**20:,.0f}", f"{(p - base) / 2**20:,.0f}",
          f"{e / max(p - base, 1):.2f}"] for n, e, p in rows]))


if __name__ == "__main__":
    main()
