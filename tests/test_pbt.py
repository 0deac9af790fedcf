"""Population-based training (--pbt): the runner's exploit-and-explore step on a made-up
population, and bad input. (A killed PBT run resumes to the uninterrupted one, bit for bit, from
another process: test_long_runs.py.)"""
from typing import NamedTuple

import jax
import numpy as np
import pytest

import ppo
import q_learning as ql
from conftest import assert_usage_error


class Member(NamedTuple):  # a state as the contract has it: leaves and the run's key
    params: np.ndarray
    steps: np.ndarray
    key: np.ndarray


def population(runs=8, seed=0):
    rng = np.random.default_rng(seed)
    state = Member(rng.normal(size=(runs, 3, 2)).astype(np.float32),
                   rng.integers(0, 100, runs).astype(np.int32),
                   rng.integers(0, 2**31, (runs, 2)).astype(np.uint32))
    return state, rng.permutation(runs).astype(np.float64)  # fitness: all different


def step(module, args, state, hp, fitness, seed=0):
    out = module.exploit_and_explore(args, state, hp, fitness, jax.random.PRNGKey(seed))
    return jax.device_get(out)


def test_exploit_copies_the_source_but_its_key():
    """The bottom quarter copy a member of the top quarter: every leaf of its state and every
    hyperparameter, but the run's key; the others stay as they were, to the bit."""
    args = ppo.validate(ppo.Args(learning_rate=(1e-3, 2e-3), num_seeds=4, pbt=True))
    state, fitness = population()
    hp = {k: np.full(8, getattr(args, k)[0], np.float32) for k in ppo.HPARAMS}
    hp["learning_rate"] = np.repeat(np.float32([1e-3, 2e-3]), 4)
    new, new_hp, copied = step(ppo, args, state, hp, fitness)
    order = np.argsort(fitness)
    assert set(np.flatnonzero(copied >= 0)) == set(order[:2])  # the worst two of eight
    for r in range(8):
        source = copied[r] if copied[r] >= 0 else r
        if copied[r] >= 0:
            assert source in order[-2:]
        np.testing.assert_array_equal(new.params[r], state.params[source])
        np.testing.assert_array_equal(new.steps[r], state.steps[source])
        np.testing.assert_array_equal(new.key[r], state.key[r])  # its own key
        for k in ppo.HPARAMS:  # unswept flags are copied as they are
            if k != "learning_rate":
                assert new_hp[k][r] == hp[k][source]
        factor = new_hp["learning_rate"][r] / hp["learning_rate"][source]
        assert np.isclose(factor, 1.0) if copied[r] < 0 else (
            np.isclose(factor, 0.8) or np.isclose(factor, 1.25)), (r, factor)
    # The same key, the same step; another key, another draw somewhere in 20 tries.
    again = step(ppo, args, state, hp, fitness)
    jax.tree.map(np.testing.assert_array_equal, (new, new_hp, copied), again)
    assert any(not np.array_equal(step(ppo, args, state, hp, fitness, seed)[1]["learning_rate"],
                                  new_hp["learning_rate"]) for seed in range(1, 21))


def test_explore_keeps_every_value_inside_its_rule():
    """q_learning's gamma must stay in [0, 1): a value that x1.25 would push out keeps the
    source's; its learning rate in (0, 1] likewise. No key of many moves one out."""
    args = ql.validate(ql.Args(gamma=(0.9, 0.99), learning_rate=(0.5, 0.95), num_seeds=2,
                               pbt=True, pbt_fraction=0.5))
    state, fitness = population()
    hp = {"learning_rate": np.tile(np.float32([0.5, 0.5, 0.95, 0.95]), 2),
          "gamma": np.tile(np.float32([0.9, 0.99]), 4),
          "start_e": np.ones(8, np.float32), "end_e": np.full(8, 0.05, np.float32)}
    for seed in range(20):
        _, new_hp, copied = step(ql, args, state, hp, fitness, seed)
        for k, (_, holds) in ql.HPARAMS.items():
            assert np.all(holds(new_hp[k])), (k, new_hp[k])
        kept = (copied >= 0) & (hp["gamma"][np.maximum(copied, 0)] > 0.8)  # 0.9 or 0.99 x 1.25
        assert np.all((new_hp["gamma"][kept] < 1))


@pytest.mark.parametrize("flags, flag", [
    (["--pbt", "--num-seeds", 1], "--pbt"),  # a population of one
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0.6], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-every", 0], "--pbt-every")])
def test_bad_pbt_flags_are_one_line_before_compiling(flags, flag, tmp_path):
    assert_usage_error("q_learning.py", flags, flag, tmp_path)
