"""A hyperparameter sweep as one command vs the same configurations as separate commands.

    python benchmarks/bench_sweep.py [--quick]    # writes results/sweep.md (--quick: prints it)

`python algos/ppo.py --learning-rate a b c --ent-coef x y --clip-coef u v --num-seeds 8` trains
the 12 configurations x 8 seeds in one compiled program. The alternative is one command per
configuration (8 seeds each). Both are timed as whole processes, as a user types them: with the
persistent compilation cache off (every process compiles) and on (a shared cache directory: the
separate commands run the same program with other traced values, so all but the first compile
come from the cache)."""
from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

GRID = {"--learning-rate": ["1e-3", "2.5e-3", "5e-3"], "--ent-coef": ["0", "0.01"],
        "--clip-coef": ["0.1", "0.2"]}
SEEDS = 8


def whole_process(flags: list[str], cache: str) -> float:
    with tempfile.TemporaryDirectory() as log_dir:  # its run directory (checkpoints) goes here
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(common.ALGOS / "ppo.py"), *flags, "--no-track",
                               "--compile-cache-dir", cache, "--log-dir", log_dir],
                              capture_output=True, text=True, cwd=common.ROOT)
        seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return seconds


def run(quick: bool) -> str:
    load_start = common.load_average()
    grid = {k: v[:2] for k, v in list(GRID.items())[:1]} if quick else GRID
    base = ["--num-seeds", str(SEEDS)] + (["--total-timesteps", "20480"] if quick else [])
    sweep_flags = base + [x for flag, values in grid.items() for x in (flag, *values)]
    configs = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    rows = []
    for label in ("off (every process compiles)", "on (one shared cache directory)"):
        with tempfile.TemporaryDirectory() as folder:
            cache = folder if label.startswith("on") else ""
            if cache:  # fill the cache as a user's earlier runs would have
                whole_process(sweep_flags, cache)
                whole_process(base + [x for k, v in configs[0].items() for x in (k, v)], cache)
            sweep_s = whole_process(sweep_flags, cache)
            separate_s = sum(whole_process(base + [x for k, v in c.items() for x in (k, v)], cache)
                             for c in configs)
        rows.append([label, len(configs), SEEDS, f"{sweep_s:.1f}", f"{separate_s:.1f}",
                     f"{separate_s / sweep_s:.1f}x"])
    headers = ["compilation cache", "configurations", "seeds each", "one sweep command s",
               f"{len(configs)} separate commands s", "separate / sweep"]
    return "\n\n".join([
        "### One sweep command vs one command per configuration (PPO, CartPole-v1)",
        f"Load average (1, 5, 15 min) at the start: {load_start}.",
        "Whole-process wall time, from interpreter start. Grid: "
        f"{', '.join(f'{k} {' '.join(v)}' for k, v in grid.items())}.",
        common.md_table(headers, rows), f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    command = "python benchmarks/bench_sweep.py" + (" --quick" if quick else "")
    report = "\n\n".join([*common.produced_by(command, "quick" if quick else "full"), run(quick)])
    if not quick:
        (common.RESULTS / "sweep.md").write_text(report + "\n")
    print(report)
