"""Population-based training (--pbt): the runner's exploit-and-explore step on a made-up
population (evidence, ties, keys, scales), the population by lineage, and bad input. (A killed PBT
run resumes to the uninterrupted one, bit for bit, from another process: test_long_runs.py.)"""
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
    """Members with different leaves; keys as a sweep's are: seed k's in every configuration."""
    rng = np.random.default_rng(seed)
    keys = np.tile(rng.integers(0, 2**31, (runs // 2, 2)).astype(np.uint32), (2, 1))
    state = Member(rng.normal(size=(runs, 3, 2)).astype(np.float32),
                   rng.integers(0, 100, runs).astype(np.int32), keys)
    return state, rng.permutation(runs).astype(np.float64)  # fitness: all different


def step(module, args, state, hp, fitness, seed=0):
    out = module.exploit_and_explore(args, state, hp, np.asarray(fitness, np.float32),
                                     jax.random.PRNGKey(seed))
    return jax.device_get(out)


def ppo_population(rates=(1e-3, 2e-3)):
    args = ppo.validate(ppo.Args(learning_rate=rates, num_seeds=4, pbt=True))
    hp = {k: np.full(8, getattr(args, k)[0], np.float32) for k in ppo.HPARAMS}
    hp["learning_rate"] = np.repeat(np.float32(rates), 4)
    return args, hp


def test_exploit_copies_a_better_source_and_every_run_gets_a_key_of_its_own():
    """The bottom quarter copy a member of the top quarter: every leaf of its state and every
    hyperparameter; the others stay as they were, to the bit. Then no two runs share a key (the
    sweep's runs of one seed index did, and a copier kept its own: a clone of its source)."""
    args, hp = ppo_population()
    state, fitness = population()
    new, new_hp, copied = step(ppo, args, state, hp, fitness)
    order = np.argsort(fitness)
    assert set(np.flatnonzero(copied >= 0)) == set(order[:2])  # the worst two of eight
    for r in range(8):
        source = copied[r] if copied[r] >= 0 else r
        if copied[r] >= 0:
            assert source in order[-2:] and fitness[source] > fitness[r]
        np.testing.assert_array_equal(new.params[r], state.params[source])
        np.testing.assert_array_equal(new.steps[r], state.steps[source])
        for k in ppo.HPARAMS:  # unswept flags are copied as they are
            if k != "learning_rate":
                assert new_hp[k][r] == hp[k][source]
        factor = new_hp["learning_rate"][r] / hp["learning_rate"][source]
        assert np.isclose(factor, 1.0) if copied[r] < 0 else (
            np.isclose(factor, 0.8) or np.isclose(factor, 1.25)), (r, factor)
    assert len({tuple(k) for k in state.key}) == 4  # the sweep's: seed k's in both configurations
    assert len({tuple(k) for k in new.key}) == 8  # after the step: none shared
    # The same key, the same step; another key, another draw somewhere in 20 tries.
    again = step(ppo, args, state, hp, fitness)
    jax.tree.map(np.testing.assert_array_equal, (new, new_hp, copied), again)
    assert any(not np.array_equal(step(ppo, args, state, hp, fitness, seed)[1]["learning_rate"],
                                  new_hp["learning_rate"]) for seed in range(1, 21))


def test_no_evidence_sits_the_step_out():
    """A run without an episode in the window (NaN: long episodes) is neither replaced nor copied
    from, however its NaN would sort; the others are ranked among themselves."""
    args, hp = ppo_population()
    state, fitness = population()
    fitness[[0, 5]] = np.nan  # run 0 the worst, run 5 among the best, were they ranked
    for seed in range(20):
        _, _, copied = step(ppo, args, state, hp, fitness, seed)
        assert copied[0] < 0 and copied[5] < 0 and 0 not in copied and 5 not in copied, copied
        ranked = np.flatnonzero(np.isfinite(fitness))
        worst = ranked[np.argsort(fitness[ranked])[:1]]  # a quarter of the 6 ranked: 1
        assert set(np.flatnonzero(copied >= 0)) == set(worst)
    _, _, copied = step(ppo, args, state, hp, np.full(8, np.nan))  # nobody has evidence
    assert np.all(copied < 0)


def test_equal_fitness_copies_nobody_and_ties_break_at_random():
    """Every run at 500: no copy (a copy needs a strictly better source). Where the bottom
    quarter is a tie, who copies is drawn at random, not taken by index."""
    args, hp = ppo_population()
    state, _ = population()
    _, new_hp, copied = step(ppo, args, state, hp, np.full(8, 500.0))
    assert np.all(copied < 0)
    np.testing.assert_array_equal(new_hp["learning_rate"], hp["learning_rate"])
    fitness = np.float64([10, 10, 10, 10, 10, 10, 500, 500])  # bottom quarter: 2 of the 6 tied
    copiers = {tuple(np.flatnonzero(step(ppo, args, state, hp, fitness, seed)[2] >= 0))
               for seed in range(30)}
    assert len(copiers) > 3 and all(len(c) == 2 and max(c) < 6 for c in copiers), copiers


def test_a_discount_moves_on_its_scale_of_one_minus_gamma():
    """gamma 0.99 is perturbed on 1 - gamma (a horizon of 100 becomes 80 or 125, not 5): it
    stays in (0, 1) and near its value; a float not NEAR_ONE moves by x0.8 or x1.25."""
    args = ppo.validate(ppo.Args(gamma=(0.99, 0.999), clip_coef=(0.1, 0.2), num_seeds=2,
                                 pbt=True, pbt_fraction=0.5))
    state, fitness = population()
    hp = {k: np.full(8, getattr(args, k)[0], np.float32) for k in ppo.HPARAMS}
    hp["gamma"], hp["clip_coef"] = np.float32([0.99, 0.999] * 4), np.float32([0.1, 0.2] * 4)
    moved = 0
    for seed in range(10):
        _, new_hp, copied = step(ppo, args, state, hp, fitness, seed)
        for r in np.flatnonzero(copied >= 0):
            gamma, source = new_hp["gamma"][r], hp["gamma"][copied[r]]
            assert 0 < gamma < 1
            assert np.isclose((1 - gamma) / (1 - source), [0.8, 1.25], rtol=1e-3).any(), gamma
            assert np.isclose(new_hp["clip_coef"][r] / hp["clip_coef"][copied[r]],
                              [0.8, 1.25]).any()
            moved += 1
    assert moved == 40


def test_explore_keeps_every_value_inside_its_rule():
    """q_learning's learning rate must stay in (0, 1]: a value that x1.25 would push out keeps
    the source's; its gamma in [0, 1) moves on 1 - gamma and stays inside. No key of many moves
    one out."""
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
        for r in np.flatnonzero(copied >= 0):  # 0.95 x 1.25 leaves (0, 1]: the source's kept
            ratio = new_hp["learning_rate"][r] / hp["learning_rate"][copied[r]]
            assert np.isclose(ratio, [1.0, 0.8, 1.25]).any()
            assert not np.isclose(new_hp["learning_rate"][r], 0.95 * 1.25)


def test_population_by_lineage_ranked_by_score():
    """A made-up run of 4 members and 3 segments: run 2 copied run 0 after segment 1, run 3
    copied run 2 after segment 2. Run 3's lineage is run 0's, then run 2's, then its own; the
    summary ranks the final runs by SCORE along their lineage, with their schedules."""
    args = ppo.validate(ppo.Args(learning_rate=(1e-3, 2e-3), num_seeds=2, pbt=True))
    nan = np.nan
    copied_from = np.float32([[nan, nan, nan, nan, nan, nan]] * 2
                             + [[nan, 0, nan, nan, nan, nan], [nan, nan, nan, 2, nan, nan]])
    returns = np.float32([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25],
                          [30, 31, 32, 33, 34, 35], [40, 41, 42, 43, 44, 99]])
    rates = np.float32([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [2, 2, 1.25, 1.25, 1.25, 1.25],
                        [2, 2, 2, 2, 1.5, 1.5]]) * 1e-3
    metrics = {"env_steps": np.tile(np.arange(1, 7) * 100, (4, 1)), "episode_return": returns,
               "pbt/copied_from": copied_from, "hp/learning_rate": rates}
    along, roots, score, order = ppo.lineages(args, metrics)
    np.testing.assert_array_equal(roots, [0, 1, 0, 0])
    np.testing.assert_array_equal(along["episode_return"][3], [10, 11, 32, 33, 44, 99])
    np.testing.assert_array_equal(along["hp/learning_rate"][3], np.float32(
        [1, 1, 1.25, 1.25, 1.5, 1.5]) * 1e-3)
    np.testing.assert_array_equal(order, [3, 2, 1, 0])  # final returns 99, 35, 25, 15
    lines = ppo.population_lines(args, metrics, {}, ["learning_rate"])
    assert lines[1] == "3 | run 0 (learning_rate 0.001, seed 0) | 99 | 0.0015"
    assert lines[-1] == ("run 3's lineage, learning_rate: 0.001 from step 0, 0.00125 from step "
                         "200, 0.0015 from step 400")


@pytest.mark.parametrize("flags, flag", [
    (["--pbt", "--num-seeds", 1], "--pbt"),  # a population of one
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0.6], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-every", 0], "--pbt-every")])
def test_bad_pbt_flags_are_one_line_before_compiling(flags, flag, tmp_path):
    assert_usage_error("q_learning.py", flags, flag, tmp_path)
