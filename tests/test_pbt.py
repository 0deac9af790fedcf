"""Population-based training (--pbt): the runner's exploit-and-explore step on a made-up
population (evidence, ties, keys, scales, the copiers' count, resampling, the margin), its
fitness over a window of episodes, its schedule in env steps, the population by lineage, what a
run records of its final values, and bad input. (A killed PBT run resumes to the uninterrupted
one, bit for bit, from another process: test_long_runs.py.)"""
import json
from typing import NamedTuple
from unittest import mock

import flax.serialization
import jax
import numpy as np
import pytest

import ppo
import q_learning as ql
from conftest import assert_usage_error, run_main, validated
from runner import flags, pbt, reports, sweep


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
    out = pbt.exploit_and_explore(args, state, hp, np.asarray(fitness, np.float32),
                                     jax.random.PRNGKey(seed))
    return jax.device_get(out)


def flat_hp(module, args, runs):
    """Every run at each HPARAMS flag's first value, [runs] float32 (a test then sets the swept)."""
    return {k: np.full(runs, getattr(args, k)[0], np.float32) for k in module.HPARAMS}


def ppo_population(rates=(1e-3, 2e-3), seeds=4, **pbt):
    args = validated(ppo, learning_rate=rates, num_seeds=seeds, pbt=True, **pbt)
    hp = flat_hp(ppo, args, len(rates) * seeds)
    hp["learning_rate"] = np.repeat(np.float32(rates), seeds)
    return args, hp


def test_exploit_copies_a_better_source_and_every_run_gets_a_key_of_its_own():
    """The bottom quarter copy a member of the top quarter: every leaf of its state and every
    hyperparameter; the others stay as they were, to the bit. Then no two runs share a key (the
    sweep's runs of one seed index did, and a copier kept its own: a clone of its source)."""
    args, hp = ppo_population(pbt_resample=0.0)
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


@pytest.mark.parametrize("runs, fraction, copiers", [
    (2, 0.25, 1), (3, 0.25, 1), (5, 0.25, 2), (6, 0.25, 2), (7, 0.25, 2), (8, 0.25, 2),
    (5, 0.5, 2), (8, 0.5, 4), (9, 0.1, 1)])
def test_copiers_are_the_fraction_rounded_up_and_at_most_half(runs, fraction, copiers):
    """Ray Tune's count: ceil(fraction x ranked), at most half of them (5-7 runs at a quarter: 2
    copiers, where floor gave 1); each copier is among the worst, each source among the best."""
    args, _ = ppo_population(pbt_fraction=fraction)
    state, fitness = population(runs + runs % 2)
    state, fitness = jax.tree.map(lambda x: x[:runs], state), fitness[:runs]
    hp = flat_hp(ppo, args, runs)
    for seed in range(5):
        copied = step(ppo, args, state, hp, fitness, seed)[2]
        order = np.argsort(fitness)
        assert set(np.flatnonzero(copied >= 0)) == set(order[:copiers])
        assert set(copied[copied >= 0]) <= set(order[-copiers:])


def test_no_evidence_sits_the_step_out():
    """A run without enough episodes in the window (NaN) is neither replaced nor copied from,
    however its NaN would sort; the others are ranked among themselves."""
    args, hp = ppo_population()
    state, fitness = population()
    fitness[[0, 5]] = np.nan  # run 0 the worst, run 5 among the best, were they ranked
    for seed in range(20):
        _, _, copied = step(ppo, args, state, hp, fitness, seed)
        assert copied[0] < 0 and copied[5] < 0 and 0 not in copied and 5 not in copied, copied
        ranked = np.flatnonzero(np.isfinite(fitness))
        worst = ranked[np.argsort(fitness[ranked])[:2]]  # a quarter of the 6 ranked, rounded up
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


def test_a_source_must_clear_the_margin():
    """--pbt-margin 3: a source better by 2 is not copied; one better by more than 3 is."""
    state, _ = population()
    close = np.float64([0, 0, 2, 2, 2, 2, 2, 2])  # the worst quarter: runs 0 and 1
    far = np.float64([0, 0, 3.5, 3.5, 3.5, 3.5, 3.5, 3.5])
    for margin, fitness, expected in ((3.0, close, 0), (3.0, far, 2), (0.0, close, 2)):
        args, hp = ppo_population(pbt_margin=margin)
        for seed in range(5):
            copied = step(ppo, args, state, hp, fitness, seed)[2]
            assert (copied >= 0).sum() == expected, (margin, fitness, copied)


def test_a_discount_moves_on_its_scale_of_one_minus_gamma():
    """gamma 0.99 is perturbed on 1 - gamma (a horizon of 100 becomes 80 or 125, not 5): it
    stays in (0, 1) and near its value; a float not NEAR_ONE moves by x0.8 or x1.25."""
    args = validated(ppo, gamma=(0.99, 0.999), clip_coef=(0.1, 0.2), num_seeds=2,
                     pbt=True, pbt_fraction=0.5, pbt_resample=0.0)
    state, fitness = population()
    hp = flat_hp(ppo, args, 8)
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


def test_zero_stays_zero_but_a_discount_of_zero_moves_as_help_says(capsys):
    """ent_coef 0 swept beside 0.01 stays 0 when moved (0 x 1.25); q_learning's gamma 0 moves on
    1 - gamma to 0.2 (x0.8; x1.25 would leave [0, 1): kept). --help says both."""
    args = validated(ppo, ent_coef=(0.0, 0.01), num_seeds=4, pbt=True, pbt_resample=0.0)
    state, fitness = population()
    hp = flat_hp(ppo, args, 8)
    hp["ent_coef"] = np.zeros(8, np.float32)
    assert np.all(step(ppo, args, state, hp, fitness)[1]["ent_coef"] == 0)
    args = validated(ql, gamma=(0.0, 0.9), num_seeds=4, pbt=True, pbt_resample=0.0)
    hp = flat_hp(ql, args, 8)
    hp["gamma"] = np.zeros(8, np.float32)
    values = set()
    for seed in range(20):
        _, new_hp, copied = step(ql, args, state, hp, fitness, seed)
        values |= {round(float(x), 6) for x in new_hp["gamma"][copied >= 0]}
    assert values == {0.0, 0.2}, values
    with pytest.raises(SystemExit):
        flags.parse(flags.args_class(ppo), ["--help"])
    assert "a discount of 0 moves, another 0 stays 0" in " ".join(capsys.readouterr().out.split())


def test_explore_keeps_every_value_inside_its_rule():
    """q_learning's learning rate must stay in (0, 1]: a value that x1.25 would push out keeps
    the source's; its gamma in [0, 1) moves on 1 - gamma and stays inside. No key of many moves
    one out, resampling or not."""
    for resample in (0.0, 0.25):
        args = validated(ql, gamma=(0.9, 0.99), learning_rate=(0.5, 0.95), num_seeds=2,
                         pbt=True, pbt_fraction=0.5, pbt_resample=resample)
        state, fitness = population()
        hp = {"learning_rate": np.tile(np.float32([0.5, 0.5, 0.95, 0.95]), 2),
              "gamma": np.tile(np.float32([0.9, 0.99]), 4),
              "start_e": np.ones(8, np.float32), "end_e": np.full(8, 0.05, np.float32)}
        for seed in range(20):
            _, new_hp, copied = step(ql, args, state, hp, fitness, seed)
            for k, (_, holds) in ql.HPARAMS.items():
                assert np.all(holds(new_hp[k])), (k, new_hp[k])
            for r in np.flatnonzero(copied >= 0):  # 0.95 x 1.25 leaves (0, 1]: never taken
                assert not np.isclose(new_hp["learning_rate"][r], 0.95 * 1.25)
                if not resample:
                    ratio = new_hp["learning_rate"][r] / hp["learning_rate"][copied[r]]
                    assert np.isclose(ratio, [1.0, 0.8, 1.25]).any()


def test_resampling_draws_log_uniform_over_the_grids_range():
    """--pbt-resample 1: every copy's rate is drawn anew, inside [1e-4, 1e-2] (the grid's range,
    not the source's x0.8 / x1.25), log-uniform: about half below 1e-3, the geometric middle;
    a discount's 1 - gamma likewise between the grid's. At the default 0.25, about a quarter of
    the copies draw (the others' ratio to their source is 0.8 or 1.25)."""
    args, hp = ppo_population(rates=(1e-4, 1e-2), pbt_resample=1.0, pbt_fraction=0.5)
    state, fitness = population()
    drawn = []
    for seed in range(100):
        _, new_hp, copied = step(ppo, args, state, hp, fitness, seed)
        drawn += list(new_hp["learning_rate"][copied >= 0])
    drawn = np.float64(drawn)  # 400 draws
    assert drawn.min() >= 1e-4 * (1 - 1e-6) and drawn.max() <= 1e-2 * (1 + 1e-6)
    below = np.mean(drawn < 1e-3)  # binomial(400, 0.5): sd 0.025; uniform would give 0.09
    assert 0.4 < below < 0.6, below
    args = validated(ppo, gamma=(0.9, 0.99), num_seeds=4, pbt=True, pbt_resample=1.0)
    hp_gamma = flat_hp(ppo, args, 8)
    hp_gamma["gamma"] = np.repeat(np.float32([0.9, 0.99]), 4)
    for seed in range(20):
        _, new_hp, copied = step(ppo, args, state, hp_gamma, fitness, seed)
        assert np.all((new_hp["gamma"][copied >= 0] >= 0.9 - 1e-6)
                      & (new_hp["gamma"][copied >= 0] <= 0.99 + 1e-6))
    args, hp = ppo_population(rates=(1e-4, 1e-2), pbt_fraction=0.5)  # the default 0.25
    redrawn = copies = 0
    for seed in range(100):
        _, new_hp, copied = step(ppo, args, state, hp, fitness, seed)
        ratio = new_hp["learning_rate"] / hp["learning_rate"][np.maximum(copied, 0)]
        copies += (copied >= 0).sum()
        redrawn += (~np.isclose(ratio, 0.8) & ~np.isclose(ratio, 1.25) & (copied >= 0)).sum()
    assert 0.17 < redrawn / copies < 0.33, (redrawn, copies)  # 400 copies: sd 0.022


def episodes_metrics(returns, episodes, module=ppo):
    score = flags.args_class(module).algorithm.SCORE
    return {score: np.float32(returns), "episodes": np.int32(episodes)}


def test_fitness_is_the_mean_over_the_windows_episodes():
    """An update whose 1 episode returned 100 weighs 1/41 beside one whose 40 returned 0: the
    fitness is 100/41, not the mean of the two updates' means (50). Only the window counts; a run
    with fewer than --pbt-min-episodes episodes in it has none (NaN)."""
    args, _ = ppo_population(pbt_min_episodes=10)
    nan = np.nan
    metrics = episodes_metrics([[1e6, 100, 0, -1e6], [1e6, 5, nan, -1e6], [1e6, 7, 9, -1e6]],
                               [[50, 1, 40, 50], [50, 9, 0, 50], [50, 10, 30, 50]])
    fitness = pbt.window_fitness(args, metrics, 1, 3)
    np.testing.assert_allclose(fitness, [100 / 41, nan, (70 + 270) / 40])
    args, _ = ppo_population(pbt_min_episodes=9)
    assert pbt.window_fitness(args, metrics, 1, 3)[1] == 5
    # A score that is not of episodes (q_learning's share of greedy actions that are optimal):
    # its mean over the window's updates, with as many episodes as asked.
    args = validated(ql, learning_rate=(0.1, 0.2), pbt=True)
    metrics = episodes_metrics([[0.0, 0.5, 1.0, 0.0]] * 2, [[50, 1, 40, 50], [0, 0, 5, 0]], ql)
    np.testing.assert_allclose(pbt.window_fitness(args, metrics, 1, 3), [0.75, nan])


def test_schedule_in_env_steps_with_burn_in_and_a_quiet_end():
    """CartPole's 1M steps at 8 x 125 = 1000 steps an update: --pbt-interval 50,000 is every 50
    updates; by default from two intervals on (100) and none in the last fifth (after 800); the
    same schedule whatever the population's size or --num-segments; each segment ends on a
    step. A burn-in and a quiet end that leave no step: one line, before anything compiles."""
    flags = dict(num_envs=8, num_steps=125, total_timesteps=1_000_000, pbt_interval=50_000)
    for seeds, segments in ((2, 10), (4, 3), (2, 1000)):
        args, _ = ppo_population(seeds=seeds, num_segments=segments, **flags)
        steps, interval = pbt.schedule(args, 1000)
        assert interval == 50 and steps == list(range(100, 801, 50))
        length = sweep.segment_length(args, 1000)
        assert interval % length == 0 and length <= -(-1000 // segments), (length, segments)
    args, _ = ppo_population(pbt_burn_in=0, pbt_last_stretch=0.0, **flags)
    assert pbt.schedule(args, 1000)[0] == list(range(50, 1000, 50))
    args, _ = ppo_population(pbt_burn_in=333_000, pbt_last_stretch=0.5, **flags)
    assert pbt.schedule(args, 1000)[0] == [350, 400, 450, 500]
    args, _ = ppo_population(**{**flags, "pbt_interval": None})  # a tenth of the run
    assert pbt.schedule(args, 1000) == ([200, 300, 400, 500, 600, 700, 800], 100)


class Recorder:
    """A population step that records what it was given (a fake exploit_and_explore)."""

    def __init__(self):
        self.calls = []

    def __call__(self, state, hp, fitness, key):
        self.calls.append((np.asarray(fitness), np.asarray(key)))
        return state, hp, np.full(len(fitness), -1)


def test_the_pbt_step_reads_its_window_at_its_cadence_and_again_on_resume():
    """pbt.step steps only after the scheduled updates, on the fitness of the interval just
    before (the episodes of updates [u - interval, u), not earlier ones); its key depends on the
    seed and the update alone, so a resumed run (the step taken again after the checkpoint)
    draws what the uninterrupted one drew."""
    args, _ = ppo_population(seeds=1, num_envs=8, num_steps=125, total_timesteps=20_000,
                             pbt_interval=2_000, pbt_burn_in=0, pbt_min_episodes=1)
    steps, interval = pbt.schedule(args, 20)
    assert (steps, interval) == ([2, 4, 6, 8, 10, 12, 14, 16], 2)
    returns = np.arange(40, dtype=np.float32).reshape(2, 20)
    metrics = episodes_metrics(returns, np.ones((2, 20)))
    record = Recorder()
    for done in range(21):
        out = pbt.step(args, record, np.zeros(2), {}, metrics, done, 20)
        assert (out[2] is None) == (done not in steps)
    assert len(record.calls) == len(steps)
    for u, (fitness, _) in zip(steps, record.calls):
        np.testing.assert_allclose(fitness, returns[:, u - 2:u].mean(1))
    again = Recorder()
    pbt.step(args, again, np.zeros(2), {}, metrics, 6, 20)
    np.testing.assert_array_equal(again.calls[0][1], record.calls[2][1])
    assert len({tuple(key) for _, key in record.calls}) == len(steps)


def test_population_summary_has_evaluations_and_lineages_left():
    """A made-up run of 4 members and 6 updates: run 2 copied run 0 after update 2, run 3 copied
    run 2 after update 4. Run 3's lineage is run 0's, then run 2's, then its own; the summary
    ranks the final runs by SCORE along their lineage, shows each one's evaluations and final
    values, how many lineages are left, and the best one's schedule."""
    args = validated(ppo, learning_rate=(1e-3, 2e-3), num_seeds=2, pbt=True)
    nan = np.nan
    copied_from = np.float32([[nan, nan, nan, nan, nan, nan]] * 2
                             + [[nan, 0, nan, nan, nan, nan], [nan, nan, nan, 2, nan, nan]])
    returns = np.float32([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25],
                          [30, 31, 32, 33, 34, 35], [40, 41, 42, 43, 44, 99]])
    rates = np.float32([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [2, 2, 1.25, 1.25, 1.25, 1.25],
                        [2, 2, 2, 2, 1.5, 1.5]]) * 1e-3
    metrics = {"env_steps": np.tile(np.arange(1, 7) * 100, (4, 1)), "episode_return": returns,
               "pbt/copied_from": copied_from, "hp/learning_rate": rates}
    along, roots, score, order = reports.lineages(args, metrics)
    np.testing.assert_array_equal(roots, [0, 1, 0, 0])
    np.testing.assert_array_equal(along["episode_return"][3], [10, 11, 32, 33, 44, 99])
    np.testing.assert_array_equal(along["hp/learning_rate"][3], np.float32(
        [1, 1, 1.25, 1.25, 1.5, 1.5]) * 1e-3)
    np.testing.assert_array_equal(order, [3, 2, 1, 0])  # final returns 99, 35, 25, 15
    evals = {"eval/episodic_return_greedy": np.float32([1, 2, 3, 4]),
             "eval/episodic_return_sampled": np.float32([5, 6, 7, 8])}
    lines = reports.population_lines(args, metrics, evals)
    assert lines[0].endswith("| episode_return | eval/episodic_return_greedy | "
                             "eval/episodic_return_sampled | learning_rate")
    assert lines[1] == "3 | run 0 (learning_rate 0.001, seed 0) | 99 | 4 | 8 | 0.0015"
    assert lines[5] == "lineages left: 2 of 4 runs descend from run 0, run 1"
    assert lines[-1] == ("run 3's lineage, learning_rate: 0.001 from step 0, 0.00125 from step "
                         "200, 0.0015 from step 400")
    metrics.update({f"hp/{k}": np.full((4, 6), getattr(args, k)[0], np.float32)
                    for k in ppo.HPARAMS if k != "learning_rate"})
    records = reports.pbt_record(args, metrics)
    assert records[3]["descends_from"] == "run 0 (learning_rate 0.001, seed 0)"
    assert records[3]["hyperparameters"]["learning_rate"] == np.float32(1.5e-3)


def test_a_pbt_run_prints_every_member_and_records_its_final_values(tmp_path, capsys):
    """The issue's command on a small budget: the summary lists every member with its greedy
    and sampled evaluation and the lineages left; each configuration's folder holds pbt.json and
    its model the same record: each seed's values in force at the end (the metrics' last), not
    those it started with, and the run it descends from."""
    out = run_main(ppo, ["--learning-rate", 1e-3, 2.5e-3, "--num-seeds", 2, "--pbt",
                         "--num-envs", 8, "--num-steps", 32, "--total-timesteps", 8 * 32 * 20,
                         "--pbt-min-episodes", 1, "--eval-episodes", 4, "--save-model",
                         "--no-track", "--log-dir", tmp_path], capsys)
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("population by lineage"))
    assert "eval/episodic_return_greedy | eval/episodic_return_sampled" in lines[head]
    members = lines[head + 1:head + 5]
    assert sorted(int(line.split(" | ")[0]) for line in members) == [0, 1, 2, 3]
    assert all(len(line.split(" | ")) == 6 for line in members)
    assert lines[head + 5].startswith("lineages left: ")
    (run_dir,) = tmp_path.iterdir()
    final = {}
    for rate in ("0.001", "0.0025"):
        folder = run_dir / f"learning_rate={rate}"
        record = json.loads((folder / "pbt.json").read_text())
        model = flax.serialization.msgpack_restore((folder / "model.msgpack").read_bytes())
        assert json.loads(model["pbt"]) == record and sorted(record) == ["seed_0", "seed_1"]
        for seed, values in record.items():
            final[rate, seed] = values["hyperparameters"]["learning_rate"]
            assert values["descends_from"].startswith("run ")
    for line in members:  # the summary's final values are the records'
        run, *_, rate = line.split(" | ")
        config = ("0.001", "0.0025")[int(run) // 2]
        assert np.isclose(final[config, f"seed_{int(run) % 2}"], float(rate), rtol=1e-3)


def test_a_member_of_one_seed_plays_back(tmp_path, capsys):
    """A --pbt sweep of one seed a configuration saves each configuration's model with --pbt and
    one seed: --load-model plays it (a population of one is refused for training alone)."""
    run_main(ql, ["--learning-rate", 0.1, 0.5, "--num-seeds", 1, "--pbt", "--num-agents", 64,
                  "--num-steps", 1000, "--total-timesteps", 20_000, "--save-model",
                  "--no-track", "--log-dir", tmp_path], capsys)
    (run_dir,) = tmp_path.iterdir()
    model = run_dir / "learning_rate=0.1" / "model.msgpack"
    assert f"1 seeds of {model}" in run_main(ql, ["--load-model", model], capsys)


@pytest.mark.parametrize("typed, flag", [
    (["--pbt", "--num-seeds", 1], "--pbt"),  # a population of one
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0.6], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-fraction", 0], "--pbt-fraction"),
    (["--pbt", "--num-seeds", 4, "--pbt-interval", 0], "--pbt-interval"),
    (["--pbt", "--num-seeds", 4, "--pbt-burn-in", -1], "--pbt-burn-in"),
    (["--pbt", "--num-seeds", 4, "--pbt-last-stretch", 1], "--pbt-last-stretch"),
    (["--pbt", "--num-seeds", 4, "--pbt-resample", 1.5], "--pbt-resample"),
    (["--pbt", "--num-seeds", 4, "--pbt-margin", -1], "--pbt-margin"),
    (["--pbt", "--num-seeds", 4, "--pbt-min-episodes", 0], "--pbt-min-episodes"),
    (["--num-seeds", 4, "--pbt-interval", 1000], "--pbt-interval")])  # without --pbt
def test_bad_pbt_flags_are_one_line_before_compiling(typed, flag, tmp_path):
    assert_usage_error("q_learning.py", typed, flag, tmp_path)


def test_a_schedule_without_a_step_is_one_line_before_compiling(tmp_path, capsys):
    """A burn-in past the run's quiet end: exit status 2, one line, no run directory left, and
    nothing compiled (the check needs the run's updates: make_train's, before it is traced)."""
    with pytest.raises(SystemExit) as stop, mock.patch.object(ql.jax, "jit", side_effect=(
            AssertionError("compiled"))):
        run_main(ql, ["--pbt", "--num-seeds", 4, "--pbt-burn-in", 150_000, "--pbt-last-stretch",
                      0.9, "--log-dir", tmp_path], capsys)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: --pbt: no step of the population in 200,000 steps"), err
    assert not list(tmp_path.iterdir())
