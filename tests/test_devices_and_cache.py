"""What the runner (algos/runner/, the same for every file) does with the machine: one CPU device
per core unless the user chose a count, the largest device count that divides the seeds, and the
persistent compilation cache (a rerun compiles from it)."""
import os
import re
import warnings

import numpy as np
import pytest

import ppo
import q_learning as ql
import vpg
from conftest import run_script, validated
from runner import devices, flags, reports, sweep

TINY = {  # script -> flags of a run that compiles and trains in a few seconds
    "ppo.py": ["--num-envs", 4, "--num-steps", 16, "--num-minibatches", 2,
               "--total-timesteps", 4 * 16 * 2],
    "vpg.py": ["--num-envs", 4, "--num-steps", 16, "--num-minibatches", 2,
               "--total-timesteps", 4 * 16 * 2],
    "q_learning.py": ["--num-agents", 2, "--num-steps", 10, "--total-timesteps", 20],
}


@pytest.mark.parametrize("script", ["ppo.py"])  # (the runner is the same for every file)
def test_one_device_per_core_and_cache_on_rerun(script, tmp_path):
    """Without XLA_FLAGS, a sweep of os.cpu_count() seeds runs on that many devices; the second
    run of the same command compiles from the cache directory the first one filled, with JAX's
    default threshold (programs that compiled in a second or more: ppo's take several)."""
    cores = os.cpu_count()
    env = {k: v for k, v in os.environ.items() if k not in (
        "XLA_FLAGS", "JAX_NUM_CPU_DEVICES", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS")}
    flags = [*TINY[script], "--num-seeds", cores, "--no-track", "--eval-episodes", 0,
             "--compile-cache-dir", tmp_path / "cache"]
    first, second = (run_script(script, *flags, cwd=tmp_path, env=env) for _ in range(2))
    for proc in (first, second):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f" {cores} device(s)" in proc.stdout, proc.stdout
        assert "final return per seed (last 5% of updates): " in proc.stdout  # one configuration
    assert "(cache)" not in first.stdout and any((tmp_path / "cache").iterdir())
    assert re.search(r"compile [\d.]+ s \(cache\)", second.stdout), second.stdout


def test_an_empty_compile_cache_dir_turns_the_cache_off(tmp_path):
    """--compile-cache-dir "" even where JAX_COMPILATION_CACHE_DIR names a cache: nothing is read
    from it (a cache the same command filled) nor written to it."""
    cache = tmp_path / "cache"
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    filled = run_script("q_learning.py", *TINY["q_learning.py"], "--no-track", cwd=tmp_path,
                        env=env)  # (the variable's cache, on)
    assert filled.returncode == 0, filled.stderr[-2000:]
    before = sorted(p.name for p in cache.iterdir())
    assert before
    proc = run_script("q_learning.py", *TINY["q_learning.py"], "--no-track",
                      "--compile-cache-dir", "", cwd=tmp_path, env=env)
    assert proc.returncode == 0 and "(cache)" not in proc.stdout, proc.stderr[-2000:]
    assert sorted(p.name for p in cache.iterdir()) == before


@pytest.mark.parametrize("module", [ql], ids=lambda m: m.__name__)
def test_seeds_not_divisible_by_devices_span_them(module):
    """3 seeds on 2 devices: each run spans both (its agents split over them) rather than one
    device idling; with an odd count of agents to split, 1 device."""
    flags = dict(zip(*[iter(TINY[os.path.basename(module.__file__)])] * 2))
    fields = {k.lstrip("-").replace("-", "_"): v for k, v in flags.items()}
    args = validated(module, num_seeds=3, track=False, **fields)
    _, metrics, timing = sweep.run(args)
    assert (timing["devices"], timing["span"]) == (2, 2)
    assert np.asarray(metrics["env_steps"]).shape[0] == 3
    assert devices.layout(validated(module, num_seeds=3, num_agents=3)).size == 1


@pytest.mark.parametrize("module", [ppo, vpg, ql], ids=lambda m: m.__name__)
def test_progress_before_any_episode_ends(module):
    """Before any episode has finished, the progress line says so instead of printing nan."""
    nan = np.full((2, 3), np.nan, np.float32)
    metrics = {"env_steps": np.full((2, 3), 5), "episode_return": nan,
               "stats/greedy_optimal": np.zeros((2, 3)), "stats/q_error": np.ones((2, 3))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "Mean of empty slice"
        line = reports.progress(flags.args_class(module)(num_seeds=2, total_timesteps=10), metrics,
                               {"sps": 1.0, "first": 1, "num_updates": 4})
    assert "no episode finished yet" in line and "nan" not in line
