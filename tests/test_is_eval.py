"""Off-policy evaluation: the estimators against enumeration and a plain numpy reference, the exact
identities, numerical robustness, the sweep's statistics and layouts, the command line."""
import dataclasses
import importlib.util
import itertools
import re
import shutil
import sys
import types

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import is_eval
from conftest import assert_usage_error, help_text, read_scalars, run_script, validated

WEIGHTED = ("wis", "wpdis", "wdr")
BETTING_LINE = (r"^betting \(valid for every n\): V\^pi >= (\S+) with probability >= 0.95; V\^pi "
                r"in \[(\S+), (\S+)\] with probability >= 0.95$")
ESTIMATOR_ROWS = [name.upper() for name in is_eval.ESTIMATORS]


# ----------------------------------------------------------------------------- references
def numpy_estimates(tlp, blp, rewards, mask, gamma, q_hat=None, v_hat=None):
    """The estimators as the issue writes them, with direct products of ratios, in float64."""
    tlp, blp, rewards, q_hat, v_hat = (None if x is None else np.asarray(x, np.float64)
                                       for x in (tlp, blp, rewards, q_hat, v_hat))
    mask = np.asarray(mask, bool)
    n, horizon = rewards.shape
    rho = np.where(mask, np.exp(np.where(mask, tlp - blp, 0.0)), 1.0)
    w = np.cumprod(rho, axis=1)  # w_{0:t}
    w_prev = np.concatenate([np.ones((n, 1)), w[:, :-1]], axis=1)  # w_{0:t-1}
    r = np.where(mask, rewards, 0.0)
    disc = gamma ** np.arange(horizon)  # numpy: 0.0 ** 0 == 1
    ret, W = (r * disc).sum(1), w[:, -1]
    out = {
        "ois": np.mean(W * ret),
        "wis": np.sum(W * ret) / np.sum(W),
        "pdis": np.mean((disc * w * r).sum(1)),
        "wpdis": np.sum(disc * (w * r).sum(0) / w.sum(0)),
        "ess": W.sum() ** 2 / (W**2).sum(),
        "ess_step": w.sum(0) ** 2 / (w**2).sum(0),
        "max_weight": W.max() / W.sum(),
        "mean_weight": W.mean(),
        "mean_weight_se": W.std() / np.sqrt(max(n - 1, 1)),
    }
    if q_hat is not None:
        q, v = np.where(mask, q_hat, 0.0), np.where(mask, v_hat, 0.0)
        out["dr"] = np.mean((disc * (w * (r - q) + w_prev * v)).sum(1))
        out["wdr"] = np.sum(disc * ((w / w.sum(0)) * (r - q) + (w_prev / w_prev.sum(0)) * v))
    return out


def numpy_q_values(P, R, policy, gamma, horizon):
    """Q^pi_t(s, a) [H, S, A] of an H-step episode by backward induction in float64, from P
    [S, A, S] and the expected reward R [S, A] of a step (absorbing cells: 0)."""
    P, R, policy = (np.asarray(x, np.float64) for x in (P, R, policy))
    q, v = np.zeros((horizon, *R.shape)), np.zeros(len(P))
    for t in reversed(range(horizon)):
        q[t] = R + gamma * P @ v
        v = (policy * q[t]).sum(-1)
    return q


def random_data(rng, n, horizon, *, spread=0.5, min_len=1, model=True):
    """Off-policy episodes of random lengths; padding holds garbage (even -inf, NaN and log-probs
    above 0). Log-probs are at most 0 and multiples of 2^-10, so that float32 sums of them (and
    shifts by whole numbers) are exact."""
    lengths = rng.integers(min_len, horizon + 1, n)
    mask = np.arange(horizon)[None] < lengths[:, None]
    blp = np.round(np.log(rng.uniform(0.1, 1.0, (n, horizon))) * 1024) / 1024
    tlp = np.minimum(blp + np.round(rng.normal(0.0, spread, (n, horizon)) * 1024) / 1024, 0.0)
    rewards = rng.normal(size=(n, horizon))
    q_hat, v_hat = rng.normal(size=(n, horizon)), rng.normal(size=(n, horizon))
    for x, junk in ((blp, -np.inf), (tlp, 3.0), (rewards, np.nan), (q_hat, np.nan), (v_hat, 1e30)):
        x[~mask] = junk
    episodes = is_eval.Episodes(np.zeros((n, horizon, 2), np.float32),
                                np.zeros((n, horizon), np.int32),
                                rewards.astype(np.float32), blp.astype(np.float32), mask)
    extra = (q_hat.astype(np.float32), v_hat.astype(np.float32)) if model else (None, None)
    return episodes, tlp.astype(np.float32), *extra


def printed_table(out):
    """{ESTIMATOR: [estimate, bootstrap-t low, high, t low, high(, error)]} from the first table a
    run printed, and the ESS of its weights line."""
    rows = re.findall(r"^\| ([A-Z_]+) \| (\S+) \| \[(\S+), (\S+)\] \| \[(\S+), (\S+)\] \|(.*)$",
                      out, re.M)
    table = {name: [float(x) for x in (*numbers, *rest.replace("|", " ").split())]
             for name, *numbers, rest in rows[:7] if name in (*ESTIMATOR_ROWS, "ORACLE_DR")}
    return table, float(re.search(r"^weights: ESS (\S+) of", out, re.M).group(1))


def as_floats(d):
    return {k: float(v) for k, v in d.items() if np.ndim(v) == 0}


def assert_matches(got, want, rtol, atol=1e-7, keys=None):
    for k in keys or want:
        np.testing.assert_allclose(np.asarray(got[k], np.float64), want[k], rtol=rtol, atol=atol,
                                   err_msg=k)


def rows_estimates(rows, n, gamma, counts=None):
    """Every estimate and weight statistic from bootstrap rows, each counted `counts` times."""
    sums = is_eval.weighted_sums(rows, counts)
    return is_eval.from_sums(sums, n, gamma) | is_eval.weight_stats(sums, n)


def single_episode_estimates(episodes, tlp, gamma, q_hat, v_hat):
    """Every episode as its own dataset (n = 1), vmapped: [fast path, bootstrap rows]."""
    one = lambda x: x[None]  # noqa: E731

    def fast(ep, t, q, v):
        return is_eval.estimators(jax.tree.map(one, ep), one(t), gamma, one(q), one(v))[0]

    def rows(ep, t, q, v):
        r = is_eval.episode_rows(jax.tree.map(one, ep), one(t), gamma, one(q), one(v))
        return rows_estimates(r, 1, gamma, jnp.ones(1, r.w.dtype))

    return [jax.jit(jax.vmap(f))(episodes, tlp, q_hat, v_hat) for f in (fast, rows)]


# ----------------------------------------------------------------------------- exact identities
def test_enumeration_expectations_are_exact():
    """On a tiny random MDP (S=3, A=2, H=4), weight every trajectory by its behaviour probability:
    E[OIS] = E[PDIS] = E[DR with an arbitrary Q-hat] = V^pi and E[WIS with n = 1] = V^b, to 1e-6."""
    rng = np.random.default_rng(0)
    S, A, H, gamma = 3, 2, 4, 0.9
    P = rng.dirichlet(np.ones(S), size=(S, A))
    R = rng.normal(size=(S, A))
    d0 = rng.dirichlet(np.ones(S))
    pi, b = rng.dirichlet(np.ones(A), size=S), rng.dirichlet(np.ones(A), size=S)
    q_table = rng.normal(size=(H, S, A))  # arbitrary; V-hat is its expectation under pi
    v_table = (q_table * pi).sum(-1)

    trajectories = list(itertools.product(range(S), repeat=H))
    actions = list(itertools.product(range(A), repeat=H))
    s = np.array([st for st in trajectories for _ in actions])  # [N, H]
    a = np.array([at for _ in trajectories for at in actions])
    t = np.arange(H)
    p_dyn = d0[s[:, 0]] * np.prod(P[s[:, :-1], a[:, :-1], s[:, 1:]], axis=1)
    p_b, p_pi = p_dyn * np.prod(b[s, a], 1), p_dyn * np.prod(pi[s, a], 1)
    ret = (gamma**t * R[s, a]).sum(1)
    v_pi, v_b = p_pi @ ret, p_b @ ret
    assert np.isclose(p_b.sum(), 1.0) and np.isclose(p_pi.sum(), 1.0)

    with jax.enable_x64(True):
        f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
        episodes = is_eval.Episodes(jnp.asarray(s), jnp.asarray(a), f64(R[s, a]),
                                    f64(np.log(b[s, a])),
                                    jnp.ones(s.shape, bool))
        for est in single_episode_estimates(episodes, f64(np.log(pi[s, a])), gamma,
                                            f64(q_table[t, s, a]), f64(v_table[t, s])):
            assert est["ois"].dtype == jnp.float64
            expect = {k: float(p_b @ np.asarray(v)) for k, v in est.items() if v.ndim == 1}
            for k in ("ois", "pdis", "dr"):
                assert abs(expect[k] - v_pi) < 1e-6, (k, expect[k], v_pi)
            for k in ("wis", "wpdis"):
                assert abs(expect[k] - v_b) < 1e-6, (k, expect[k], v_b)
    assert abs(v_pi - v_b) > 0.05  # the two values differ, so the checks above tell them apart


def test_dr_with_exact_q_is_exact_on_every_episode():
    """Deterministic MDP, exact Q^pi: DR and WDR return V^pi on every single episode."""
    rng = np.random.default_rng(1)
    S, A, H, gamma, n = 4, 3, 6, 0.9, 200
    nxt, R = rng.integers(0, S, (S, A)), rng.normal(size=(S, A))
    pi, b = rng.dirichlet(np.ones(A), size=S), rng.dirichlet(np.ones(A), size=S)
    q = numpy_q_values(np.eye(S)[nxt], R, pi, gamma, H)
    v_pi = (pi * q[0]).sum(-1)[0]
    s, a = np.zeros((n, H), int), np.zeros((n, H), int)
    for t in range(H):
        a[:, t] = [rng.choice(A, p=b[x]) for x in s[:, t]]
        if t + 1 < H:
            s[:, t + 1] = nxt[s[:, t], a[:, t]]
    t = np.arange(H)
    episodes = is_eval.Episodes(s, a, R[s, a].astype(np.float32),
                                np.log(b[s, a]).astype(np.float32),
                                np.ones((n, H), bool))
    data = (episodes, np.log(pi[s, a]).astype(np.float32), gamma,
            q[t, s, a].astype(np.float32), (pi * q).sum(-1)[t, s].astype(np.float32))
    est = single_episode_estimates(*data)[0]
    np.testing.assert_allclose(est["dr"], v_pi, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(est["wdr"], v_pi, rtol=1e-5, atol=1e-5)
    assert np.std(np.asarray(est["ois"])) > 0.1  # plain importance sampling is not exact
    whole = is_eval.estimate(*data)
    np.testing.assert_allclose([whole["dr"], whole["wdr"]], v_pi, rtol=1e-5)


def test_on_policy_equals_monte_carlo_mean():
    """pi = b: OIS, WIS, PDIS and WPDIS all equal the mean discounted return, variable lengths and
    garbage in the padding included."""
    rng = np.random.default_rng(2)
    episodes, _, _, _ = random_data(rng, 200, 10)
    tlp = np.where(episodes.mask, episodes.behaviour_log_prob, 5.0)
    mc = (np.where(episodes.mask, episodes.rewards, 0.0) * 0.97 ** np.arange(10)).sum(1).mean()
    est = as_floats(is_eval.estimate(episodes, tlp, 0.97))
    for k in ("ois", "wis", "pdis", "wpdis"):
        np.testing.assert_allclose(est[k], mc, rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_allclose(est["ess"], 200, rtol=1e-5)


# ----------------------------------------------------------------------------- against numpy
@pytest.mark.parametrize("n", [500, 2 * is_eval.CHUNK + 123])
def test_log_space_matches_direct_products(n):
    """Where direct products are finite, log space agrees with them (float64 numpy reference), for
    the fast path (with blocks of very different weight scales to merge) and the bootstrap rows,
    including rows counted several times as in a resample."""
    rng = np.random.default_rng(3)
    episodes, tlp, q_hat, v_hat = random_data(rng, n, 15)
    episodes.behaviour_log_prob[n // 2:] -= 0.5 * episodes.mask[n // 2:]  # weighs e^{0.5 t} more
    gamma = 0.95
    want = numpy_estimates(tlp, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, gamma,
                           q_hat, v_hat)
    assert_matches(is_eval.estimate(episodes, tlp, gamma, q_hat, v_hat), want, rtol=2e-4)
    rows = jax.jit(is_eval.episode_rows)(episodes, tlp, gamma, q_hat, v_hat)
    assert_matches(rows_estimates(rows, n, gamma), want, rtol=2e-4)

    counts = rng.multinomial(n, np.ones(n) / n)  # one bootstrap resample
    idx = np.repeat(np.arange(n), counts)
    resampled = [np.asarray(x)[idx] for x in (tlp, episodes.behaviour_log_prob, episodes.rewards,
                                              episodes.mask, q_hat, v_hat)]
    want = numpy_estimates(*resampled[:4], gamma, *resampled[4:])
    del want["max_weight"]  # 1 / the sum of shifted weights: only while the largest is counted once
    assert_matches(rows_estimates(rows, n, gamma, jnp.asarray(counts, jnp.float32)), want,
                   rtol=2e-4)


def test_padding_scaling_and_zero_model():
    """Padding more steps changes no estimate; scaling every ratio leaves the weighted ones (and the
    ESS) unchanged even past float32's range; DR with Q-hat = V-hat = 0 is PDIS, WDR is WPDIS."""
    rng = np.random.default_rng(4)
    episodes, tlp, q_hat, v_hat = random_data(rng, 200, 10)
    gamma = 0.9
    base = as_floats(is_eval.estimate(episodes, tlp, gamma, q_hat, v_hat))

    def pad(x, value):
        return np.concatenate([x, np.full((x.shape[0], 7, *x.shape[2:]), value, x.dtype)], axis=1)

    padded = is_eval.Episodes(pad(episodes.obs, 1.0), pad(episodes.actions, 3),
                              pad(episodes.rewards, 9.0),
                              pad(episodes.behaviour_log_prob, -np.inf), pad(episodes.mask, False))
    longer = is_eval.estimate(padded, pad(tlp, 2.0), gamma, pad(q_hat, 4.0), pad(v_hat, 4.0))
    assert_matches(longer, base, rtol=1e-5, atol=1e-6)

    full, tlp_full, q_full, v_full = random_data(rng, 200, 10, min_len=10)  # weights scale alike
    base_full = as_floats(is_eval.estimate(full, tlp_full, gamma, q_full, v_full))
    for per_step in (-30.0, 30.0):  # all weights scaled by e^{+-300} (log-probs stay <= 0)
        lower = full._replace(behaviour_log_prob=full.behaviour_log_prob - max(per_step, 0.0))
        scaled = as_floats(is_eval.estimate(lower, tlp_full + min(per_step, 0.0), gamma, q_full,
                                            v_full))
        assert_matches(scaled, base_full, rtol=1e-5, atol=1e-6, keys=(*WEIGHTED, "ess"))

    zero = np.zeros_like(q_hat)
    est = as_floats(is_eval.estimate(episodes, tlp, gamma, zero, zero))
    np.testing.assert_allclose(est["dr"], est["pdis"], rtol=1e-6)
    np.testing.assert_allclose(est["wdr"], est["wpdis"], rtol=1e-6)


def test_long_horizon_and_underflow_stay_finite():
    """H = 1000 (the direct float32 product underflows) stays finite and correct; weights that all
    underflow, or are exactly 0, give defined finite weighted estimates, never NaN."""
    rng = np.random.default_rng(5)
    n, horizon, gamma = 200, 1000, 0.99
    episodes, tlp, q_hat, v_hat = random_data(rng, n, horizon, spread=0.3, min_len=900)
    tlp = tlp + np.float32(np.log(0.8))
    ratios = np.where(episodes.mask, np.exp(tlp - episodes.behaviour_log_prob), 1.0)
    ratios = ratios.astype(np.float32)
    assert np.all(np.prod(ratios, axis=1) == 0)  # the direct product underflows in every episode
    want = numpy_estimates(tlp, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, gamma,
                           q_hat, v_hat)
    est = as_floats(is_eval.estimate(episodes, tlp, gamma, q_hat, v_hat))
    assert all(np.isfinite(v) for v in est.values()), est
    assert_matches(est, want, rtol=2e-3, atol=1e-6, keys=(*WEIGHTED, "ess", "pdis", "dr"))

    small = random_data(rng, 200, 10)
    under = as_floats(is_eval.estimate(small[0], small[1] - 200.0, gamma, *small[2:]))  # e^-200
    assert all(np.isfinite(v) for v in under.values()), under
    full, tlp_full, q_full, v_full = random_data(rng, 200, 10, min_len=10)  # weights scale alike
    ref = as_floats(is_eval.estimate(full, tlp_full, gamma, q_full, v_full))
    under = as_floats(is_eval.estimate(full, tlp_full - 200.0, gamma, q_full, v_full))
    assert_matches(under, ref, rtol=1e-5, atol=1e-6, keys=(*WEIGHTED, "ess"))

    zero = as_floats(is_eval.estimate(full, np.full_like(tlp_full, -np.inf), gamma, q_full, v_full))
    assert all(np.isfinite(v) for v in zero.values()), zero
    assert zero["wis"] == zero["ois"] == zero["ess"] == 0.0


def test_bad_library_input():
    rng = np.random.default_rng(6)
    episodes, tlp, q_hat, v_hat = random_data(rng, 200, 10, min_len=10)
    blp = episodes.behaviour_log_prob.copy()
    blp[3, 4] = -np.inf
    with pytest.raises(ValueError, match="episode 3, step 4"):
        is_eval.estimate(episodes._replace(behaviour_log_prob=blp), tlp, 0.9)
    for gamma in (-0.1, 1.5):
        with pytest.raises(ValueError, match="gamma"):
            is_eval.estimate(episodes, tlp, gamma)
    with pytest.raises(ValueError, match="target_log_prob"):
        is_eval.estimate(episodes, tlp[:, :9], 0.9)
    with pytest.raises(ValueError, match="q_hat and v_hat"):
        is_eval.estimate(episodes, tlp, 0.9, q_hat)
    rewards = episodes.rewards.copy()
    rewards[5, 1] = np.nan  # found inside the jitted call, then named on the host
    with pytest.raises(ValueError, match="episode 5, step 1: rewards is nan"):
        is_eval.estimate(episodes._replace(rewards=rewards), tlp, 0.9)
    with pytest.raises(ValueError, match="episode 0, step 0: target_log_prob is 0.25"):
        is_eval.estimate(episodes, tlp - tlp + 0.25, 0.9)
    empty = jax.tree.map(lambda x: x[:0], episodes)
    with pytest.raises(ValueError, match="N >= 1"):
        is_eval.estimate(empty, tlp[:0], 0.9)


def test_discount_in_log_space_and_gamma_zero():
    """gamma = 0.9 over 1000 steps with weights growing e^{0.12 t}: gamma^t underflows float32 at
    t ~ 830 while w_t gamma^t is still e^{15}, so PDIS and DR need the discount in log space;
    gamma = 0 leaves only the first step. Both against the float64 reference."""
    rng = np.random.default_rng(11)
    episodes, tlp, q_hat, v_hat = random_data(rng, 100, 1000, spread=0.05, min_len=1000)
    episodes.behaviour_log_prob[:] -= np.float32(0.12)  # log-probs stay <= 0
    assert np.float32(0.9) ** np.float32(990) == 0  # subnormals included; XLA flushes earlier
    want = numpy_estimates(tlp, episodes.behaviour_log_prob, episodes.rewards, episodes.mask, 0.9,
                           q_hat, v_hat)
    assert_matches(is_eval.estimate(episodes, tlp, 0.9, q_hat, v_hat), want, rtol=2e-3,
                   keys=("pdis", "dr", "wpdis", "wdr"))
    short, tlp, q_hat, v_hat = random_data(rng, 200, 8)
    want = numpy_estimates(tlp, short.behaviour_log_prob, short.rewards, short.mask, 0.0, q_hat,
                           v_hat)
    got = is_eval.estimate(short, tlp, 0.0, q_hat, v_hat)
    assert_matches(got, want, rtol=1e-5, atol=1e-6, keys=is_eval.ESTIMATORS)


def test_mask_must_be_a_prefix_of_ones():
    rng = np.random.default_rng(12)
    episodes, tlp, _, _ = random_data(rng, 50, 6, min_len=6)
    mask = episodes.mask.copy()
    mask[7, 3] = False
    with pytest.raises(ValueError, match="episode 7: mask is False at step 3 but True at step 4"):
        is_eval.estimate(episodes._replace(mask=mask), tlp, 0.9)


def test_weight_warnings():
    """The mean weight 3 standard errors from 1 (behaviour log-probabilities off by 0.2 per step)
    and an ESS under 1% of N each print a warning; on-policy data print none."""
    rng = np.random.default_rng(13)
    episodes, tlp, _, _ = random_data(rng, 2000, 10, spread=0.3, min_len=10)
    args = is_eval.Args()

    def printed(tlp):
        est = is_eval.estimate(episodes, tlp, 0.9)
        return is_eval.report({f"stats/{k}": v for k, v in est.items()}, 2000, args)

    assert "warning" not in printed(episodes.behaviour_log_prob)
    assert "mean weight" in printed(tlp - 0.2).splitlines()[-2]
    heavy = printed(np.minimum(tlp + rng.normal(0, 3, tlp.shape).astype(np.float32), 0.0))
    assert "warning: ESS/N =" in heavy


# ----------------------------------------------------------------------------- intervals, bounds
def numpy_influence_se(tlp, blp, rewards, mask, gamma, q_hat, v_hat, extra):
    """{name: (estimate, delta-method SE)} in float64, written as the gradient of each estimator
    (a function of the means of per-episode vectors z_i) against the covariance of z (ddof = 1)."""
    tlp, blp, rewards, q_hat, v_hat = (np.asarray(x, np.float64)
                                       for x in (tlp, blp, rewards, q_hat, v_hat))
    mask = np.asarray(mask, bool)
    n, horizon = rewards.shape
    w = np.cumprod(np.where(mask, np.exp(np.where(mask, tlp - blp, 0.0)), 1.0), axis=1)
    w_prev = np.concatenate([np.ones((n, 1)), w[:, :-1]], axis=1)
    r, q, v = (np.where(mask, x, 0.0) for x in (rewards, q_hat, v_hat))
    disc = gamma ** np.arange(horizon)
    ret = (r * disc).sum(1)

    def mean_of(z):  # z [n]: the mean and sqrt(var / n)
        return z.mean(), z.std(ddof=1) / np.sqrt(n)

    def ratio_of(parts, scale):  # sum_t scale_t mean(a_t) / mean(b_t) over parts [(a, b)]
        z = np.concatenate([x for part in parts for x in part], 1)
        m = z.mean(0)
        grad, value = np.zeros_like(m), 0.0
        for j, _ in enumerate(parts):
            a, b = slice(2 * j * len(scale), (2 * j + 1) * len(scale)), slice(
                (2 * j + 1) * len(scale), (2 * j + 2) * len(scale))
            value += (scale * m[a] / m[b]).sum()
            grad[a], grad[b] = scale / m[b], -scale * m[a] / m[b] ** 2
        return value, np.sqrt(grad @ np.cov(z, rowvar=False, ddof=1) @ grad / n)

    out = {"ois": mean_of(w[:, -1] * ret), "pdis": mean_of((w * r * disc).sum(1)),
           "dr": mean_of(((w * (r - q) + w_prev * v) * disc).sum(1)),
           "wis": ratio_of([((w[:, -1] * ret)[:, None], w[:, -1:])], np.ones(1)),
           "wpdis": ratio_of([(w * r, w)], disc),
           "wdr": ratio_of([(w * (r - q), w), (w_prev * v, w_prev)], disc)}
    return out | {k: mean_of(np.asarray(x, np.float64)) for k, x in extra.items()}


@pytest.mark.parametrize("folds", [1, 2])
def test_bootstrap_t_matches_numpy(folds):
    """Bootstrap-t and t intervals of all six estimators and an extra mean, against float64 numpy
    on the same resamples: each resample's episodes taken as a dataset of their own, its estimate
    and its SE (`numpy_influence_se`), T* = (estimate* - estimate) / SE*, order statistics."""
    rng = np.random.default_rng(14)
    n, horizon, gamma, num_resamples = 60, 5, 0.9, 300
    episodes, tlp, q_hat, v_hat = random_data(rng, n, horizon, spread=0.6)
    extra = {"x": rng.lognormal(0.0, 1.0, n).astype(np.float32)}
    rows = jax.jit(is_eval.episode_rows)(episodes, tlp, gamma, q_hat, v_hat)
    key = jax.random.PRNGKey(3)
    _, boot, plain = jax.jit(is_eval.bootstrap_intervals, static_argnums=(3, 4, 5))(
        key, rows, gamma, num_resamples, 0.95, folds, extra)
    data = [np.asarray(x) for x in (tlp, episodes.behaviour_log_prob, episodes.rewards,
                                    episodes.mask, q_hat, v_hat)]
    full = numpy_influence_se(*data[:4], gamma, *data[4:], extra)
    keys = jax.random.split(key, -(-num_resamples // 100))
    counts = np.concatenate([np.asarray(is_eval.resample_counts(k, n, 100, folds)) for k in keys])
    stats = []
    for c in counts[:num_resamples].astype(int):
        idx = np.repeat(np.arange(n), c)
        stats.append(numpy_influence_se(*[x[idx] for x in data[:4]], gamma,
                                        *[x[idx] for x in data[4:]],
                                        {k: x[idx] for k, x in extra.items()}))
    t_quantile, skew = scipy.stats.t.ppf(0.975, n - 1), {}
    for name, (est, se) in full.items():
        t = np.sort([(s[name][0] - est) / s[name][1] for s in stats])
        # 301 * 0.975 = 293.5 rounded up, 301 * 0.025 = 7.5 rounded down (1-based ranks)
        want = est - np.array([t[293], t[6]]) * se
        width = want[1] - want[0]
        np.testing.assert_allclose(boot[name], want, atol=2e-3 * width, err_msg=name)
        t_interval = est + np.array([-1, 1]) * t_quantile * se
        np.testing.assert_allclose(plain[name], t_interval, atol=1e-4 * width, err_msg=name)
        skew[name] = np.abs(want - t_interval).max() / width
    assert min(skew.values()) > 0.01, skew  # 5x the tolerance: the test tells the two apart


# Valid bounds may hold in every dataset, so their other side is how far they lie from V^pi: on
# each side, on average, at most this times the asymptotic distance of betting with these bets,
# sd sqrt(2 log(1 / alpha) / n) at level alpha, sd that of the side's variable (Waudby-Smith &
# Ramdas 2024); 25% for its higher-order terms (measured: 0.72-0.97 of it).
BETTING_WIDTH = 1.25


def numpy_betting_lower_bound(x, delta, cap=0.5):
    """The betting bound in float64: the same predictable bets, the root of log K(m) = log(1 /
    delta) by scipy's brentq."""
    n = len(x)
    seen = np.arange(2, n + 2)
    mean = (0.5 + np.cumsum(x)) / seen
    var = (0.25 + np.cumsum((x - mean) ** 2)) / seen
    bet = np.sqrt(2 * np.log(1 / delta) / (n * np.concatenate([[0.25], var[:-1]])))

    def excess(m):
        return np.log1p(np.minimum(bet, cap / m) * (x - m)).sum() - np.log(1 / delta)

    return 0.0 if excess(1e-12) < 0 else (1.0 if excess(1.0) >= 0 else
                                          scipy.optimize.brentq(excess, 1e-12, 1.0, xtol=1e-10))


def bernoulli_bandit(key, n, behaviour=0.25, target=0.75, success=(0.3, 0.8)):
    """One-step episodes: action 1 with probability `behaviour` (the target's: `target`), reward 1
    with probability success[action]: V^pi = 0.25 * 0.3 + 0.75 * 0.8 = 0.675, weights 3 or 1/3."""
    key_action, key_reward = jax.random.split(key)
    a = jax.random.bernoulli(key_action, behaviour, (n, 1))
    r = jax.random.bernoulli(key_reward, jnp.where(a, success[1], success[0])).astype(jnp.float32)
    blp = jnp.log(jnp.where(a, behaviour, 1 - behaviour))
    episodes = is_eval.Episodes(a, a.astype(jnp.int32), r, blp, jnp.ones((n, 1), bool))
    return episodes, jnp.log(jnp.where(a, target, 1 - target))


def test_betting_bounds_match_numpy_hold_and_tighten():
    """The betting bounds against float64 numpy on random weighted returns; then on 400 Bernoulli
    datasets with V^pi known, at n = 30 and 300: the delta = 0.1 lower bound fails and the
    interval misses V^pi at most as often as Binomial(400, 0.1) allows (p = 0.001), and the
    bounds tighten with n. Being valid they may hold in every dataset, so their other side is
    their distance from V^pi: at n = 300 the mean gap of the lower bound, and of each end of the
    interval, is at most BETTING_WIDTH times betting's asymptotic one (the exact sd of W R and
    W (1 - R): 1.17 and 0.63); measured 0.97, 0.96 and 0.85 of it, where a t-interval's at the
    same level would be 0.60, 0.67 and 0.67 of it (z = 1.28 and 1.64 to sqrt(2 log(1 / alpha)))."""
    rng = np.random.default_rng(15)
    bounds = jax.jit(is_eval.betting_bounds)
    for n, spread in ((50, 0.3), (2000, 0.8)):
        episodes, tlp, _, _ = random_data(rng, n, 6, spread=spread)
        episodes = episodes._replace(rewards=rng.uniform(-1, 1, (n, 6)).astype(np.float32))
        rows = is_eval.episode_rows(episodes, tlp, 0.9)
        m = episodes.mask
        w = np.exp(np.cumsum(np.where(m, tlp - episodes.behaviour_log_prob, 0.0), 1))[:, -1]
        ret = (np.where(m, episodes.rewards, 0.0) * 0.9 ** np.arange(6)).sum(1)
        high = (0.9 ** np.arange(6)).sum()
        lower, (low2, high2) = bounds(rows, -high, high, 0.05)
        want = [-high + 2 * high * numpy_betting_lower_bound(w * (ret + high) / (2 * high), d)
                for d in (0.05, 0.025)]
        want.append(high - 2 * high * numpy_betting_lower_bound(w * (high - ret) / (2 * high),
                                                                0.025))
        np.testing.assert_allclose([lower, low2, high2], want, atol=1e-4 * high, err_msg=str(n))
        assert all(-high < x < high for x in want)  # inside the range, not at an end of it

    def trial(key):
        out = []
        for n in (30, 300):
            episodes, tlp = bernoulli_bandit(key, 300)
            rows = is_eval.episode_rows(*jax.tree.map(lambda x: x[:n], (episodes, tlp)), 1.0)
            lower, interval = is_eval.betting_bounds(rows, 0.0, 1.0, 0.1)
            out.append(jnp.concatenate([lower[None], interval]))
        return jnp.stack(out)

    found = np.asarray(jax.jit(jax.vmap(trial))(jax.random.split(jax.random.PRNGKey(5), 400)))
    value, allowed = 0.675, scipy.stats.binom.isf(0.001, 400, 0.1)
    assert ((found[:, :, 0] > value).sum(0) <= allowed).all(), (found[:, :, 0] > value).sum(0)
    misses = (found[:, :, 1] > value) | (value > found[:, :, 2])
    assert (misses.sum(0) <= allowed).all(), misses.sum(0)
    mean = found.mean(0)  # [n, (lower, interval low, interval high)]
    assert mean[1, 0] > mean[0, 0] + 0.1 and mean[1, 2] - mean[1, 1] < 0.7 * (mean[0, 2]
                                                                              - mean[0, 1]), mean
    p, w = np.array([0.75, 0.25]), np.array([0.25 / 0.75, 0.75 / 0.25])  # bernoulli_bandit's
    success = np.array([0.3, 0.8])
    sd_lower = np.sqrt(p @ (w**2 * success) - value**2)  # of W R
    sd_upper = np.sqrt(p @ (w**2 * (1 - success)) - (1 - value) ** 2)  # of W (1 - R)
    side = lambda alpha: BETTING_WIDTH * np.sqrt(2 * np.log(1 / alpha) / 300)  # noqa: E731
    assert value - mean[1, 0] <= sd_lower * side(0.1), (mean, sd_lower)
    assert value - mean[1, 1] <= sd_lower * side(0.05) and mean[1, 2] - value <= (
        sd_upper * side(0.05)), (mean, sd_lower, sd_upper)


def test_cross_fitting_and_fold_resampling():
    """Each fold's Q-hat is the model fitted on the other folds' episodes alone; one fold fits all;
    a resample draws each fold's size from that fold."""
    args = is_eval.Args()
    problem = is_eval.gridworld_problem(args)
    collect = jax.jit(is_eval.collect, static_argnums=(4, 5))
    episodes, _ = collect(jax.random.PRNGKey(3), problem.mdp, problem.behaviour, problem.target, 51,
                          20)
    cross_fit = jax.jit(is_eval.cross_fit, static_argnums=3)
    q, q_hat, v_hat = cross_fit(episodes, problem.target, args.gamma, 2)
    fold, fit = is_eval.fold_of(51, 2), jax.jit(is_eval.fit_q_hat)
    assert np.bincount(fold).tolist() == [26, 25]
    t = np.arange(20)
    for k in (0, 1):
        other = jax.tree.map(lambda x: x[fold != k], episodes)
        alone = fit(other, problem.target, args.gamma, np.ones(len(other.obs), bool))
        np.testing.assert_allclose(q[k], alone, atol=1e-6)
        mine = jax.tree.map(lambda x: np.asarray(x)[fold == k], episodes)
        np.testing.assert_allclose(np.asarray(q_hat)[fold == k], alone[t, mine.obs, mine.actions],
                                   atol=1e-6)
        v = (alone * problem.target).sum(-1)[t, mine.obs]
        np.testing.assert_allclose(np.asarray(v_hat)[fold == k], v, atol=1e-6)
    assert not np.allclose(q[0], q[1])
    whole = cross_fit(episodes, problem.target, args.gamma, 1)[0][0]
    np.testing.assert_allclose(whole, fit(episodes, problem.target, args.gamma, np.ones(51, bool)),
                               atol=1e-6)
    resample_counts = jax.jit(is_eval.resample_counts, static_argnums=(1, 2, 3))
    counts = np.asarray(resample_counts(jax.random.PRNGKey(0), 51, 40, 2))
    assert (counts[:, fold == 0].sum(1) == 26).all() and (counts[:, fold == 1].sum(1) == 25).all()


# ----------------------------------------------------------------------------- the GridWorld
def test_gridworld_exact_values():
    """The exact values agree with a numpy backward induction and with a Monte Carlo run of the
    file's own rollout, on-policy, within 4 standard errors."""
    args = is_eval.Args()
    problem = is_eval.gridworld_problem(args)
    P, R = np.asarray(problem.mdp.P, np.float64), np.asarray(problem.mdp.R, np.float64)
    assert np.allclose(P.sum(-1), 1.0)
    for policy, value in ((problem.target, problem.value),
                          (problem.behaviour, problem.behaviour_value)):
        policy = np.asarray(policy, np.float64)
        q = numpy_q_values(P, R, policy, args.gamma, is_eval.GRID_HORIZON)
        np.testing.assert_allclose(value, (policy * q[0]).sum(-1)[problem.mdp.start], rtol=1e-5)
        episodes, _ = jax.jit(is_eval.collect, static_argnums=(4, 5))(
            jax.random.PRNGKey(0), problem.mdp, policy, policy, 50_000, is_eval.GRID_HORIZON)
        discount = args.gamma ** np.arange(is_eval.GRID_HORIZON)
        ret = np.asarray((episodes.rewards * episodes.mask * discount).sum(1))
        assert abs(ret.mean() - value) < 4 * ret.std() / np.sqrt(len(ret)), (ret.mean(), value)


def numpy_q_hat_se(mdp, policy, gamma, q, visits, moves):
    """(First-order standard error [H, S, A], bias bound [S, A]) of `fit_q_hat`'s maximum-likelihood
    Q-hat, in float64, from the exact MDP, the target's exact Q^pi [H, S, A] and the data's counts:
    visits [S, A] (R-hat's draws) and logged transitions moves [S, A] (P-hat's, a subset of them).
    To first order Q-hat_t - Q_t = sum_{k >= t} M^{k-t} e_k, M[(s, a), (s', a')] = gamma P(s'|s, a)
    pi(a'|s'), with e_k = (R-hat - R) + gamma (P-hat - P) V_{k+1}: means of independent draws
    s' ~ P(.|s, a), independent between state-actions given the counts. So entry x at step t has
    variance sum_y c^2 Var r(s') / N_y + Var u(s') / N'_y + 2 c Cov(r(s'), u(s')) / N_y, with
    c = sum_k M^{k-t}[x, y], u = gamma sum_k M^{k-t}[x, y] V_{k+1} and r(s') the reward of entering
    s'. A live pair y never logged has Q-hat = 0, an error of at most max |Q|, which reaches x with
    weight sum_{j >= 1} M^j[x, y]: the bias bound."""
    H, S, A = q.shape
    P, reward = np.asarray(mdp.P, np.float64), np.asarray(mdp.reward, np.float64)
    M = (gamma * P[..., None] * np.asarray(policy, np.float64)).reshape(S * A, S * A)
    powers = [np.eye(S * A)]
    for _ in range(H - 1):
        powers.append(powers[-1] @ M)
    powers = np.array(powers)  # [j, x, y]: M^j
    v = np.concatenate([(policy * q).sum(-1), np.zeros((1, S))])  # V_0 .. V_H
    seen = visits.reshape(-1) > 0
    p_next, n_r, n_p = P.reshape(S * A, S)[seen], visits.reshape(-1)[seen], moves.reshape(-1)[seen]
    mean_r, var_r = p_next @ reward, p_next @ reward**2 - (p_next @ reward) ** 2
    var = np.zeros((H, S * A))
    for t in range(H):
        c = powers[: H - t][:, :, seen]  # [k - t, x, y]
        u = gamma * np.einsum("jxy,js->xys", c, v[t + 1:])
        mean_u = np.einsum("ys,xys->xy", p_next, u)
        var_u = np.einsum("ys,xys->xy", p_next, u**2) - mean_u**2
        cov = np.einsum("ys,s,xys->xy", p_next, reward, u) - mean_r * mean_u
        var[t] = ((c.sum(0) ** 2 * var_r + 2 * c.sum(0) * cov) / n_r + var_u / n_p).sum(-1)
    never = ~seen & ~np.repeat(np.asarray(mdp.terminal), A)
    bias = powers[1:][:, :, never].sum((0, 2)) * np.abs(q).max()
    return np.sqrt(np.maximum(var, 0.0)).reshape(H, S, A), bias.reshape(S, A)


def test_fit_q_hat_matches_exact_q_pi():
    """fit_q_hat on 50,000 behaviour episodes is the target's exact Q^pi (numpy_q_values) at every
    step and every state-action the data logged (780 entries), within 5 first-order standard errors
    of the fit (numpy_q_hat_se, from the counts of the very data: their median is 0.0037, about 1%
    of |Q|; 5 SE: p < 6e-7 an entry, < 5e-4 over the 780 by Bonferroni), plus the bias bound of the
    pairs never logged (1e-25 here: the target all but never takes them) and 1e-4 for float32 sums
    of up to 3e4 rewards (where the SE is 0, a deterministic reward, the error is 7e-6). The SE was
    checked once on 200 datasets of 5000 episodes: the spread of Q-hat is 0.86-1.15 times it
    (median 1.01), 0.23% of |z| above 3 (normal: 0.27%). Absorbing cells: 0 in both. DR and WDR are
    unbiased for any Q-hat, so only this tells the fit from zeros: a zero Q-hat, and Q^b (the
    behaviour's values), miss the tolerance at most entries."""
    args = is_eval.Args()
    problem = is_eval.gridworld_problem(args)
    horizon, n, pi = is_eval.GRID_HORIZON, 50_000, np.asarray(problem.target, np.float64)
    episodes, _ = jax.jit(is_eval.collect, static_argnums=(4, 5))(
        jax.random.PRNGKey(0), problem.mdp, problem.behaviour, problem.target, n, horizon)
    q_hat = jax.jit(is_eval.fit_q_hat)(episodes, problem.target, args.gamma, np.ones(n, bool))
    P, R = np.asarray(problem.mdp.P, np.float64), np.asarray(problem.mdp.R, np.float64)
    q = numpy_q_values(P, R, pi, args.gamma, horizon)
    s, a, m = (np.asarray(x) for x in (episodes.obs, episodes.actions, episodes.mask))
    visits, moves = np.zeros(R.shape), np.zeros(R.shape)
    np.add.at(visits, (s[m], a[m]), 1)
    np.add.at(moves, (s[:, :-1][m[:, :-1]], a[:, :-1][m[:, :-1]]), 1)
    terminal = np.asarray(problem.mdp.terminal)
    assert np.array_equal(visits > 0, moves > 0) and (visits[terminal] == 0).all()
    assert (visits > 0)[~terminal[:, None] & (pi > 1e-3)].all()  # every action pi takes is logged
    se, bias = numpy_q_hat_se(problem.mdp, pi, args.gamma, q, visits, moves)
    tolerance = 5 * se + bias + 1e-4
    logged = np.broadcast_to(visits > 0, q.shape)
    error = np.abs(np.asarray(q_hat, np.float64) - q)
    assert (error <= tolerance)[logged].all(), (error / tolerance)[logged].max()
    assert (np.asarray(q_hat)[:, terminal] == 0).all() and (q[:, terminal] == 0).all()
    for wrong in (np.zeros_like(q), numpy_q_values(P, R, problem.behaviour, args.gamma, horizon)):
        assert (np.abs(wrong - q) > tolerance)[logged].mean() > 0.5


def numpy_weight_moments(mdp, target, behaviour, gamma, horizon):
    """[E W^2, E W^2 G, E W^2 G^2] under the behaviour policy, W = prod_t pi / b an episode's weight
    and G its discounted return, in float64 by backward induction (after the end W = 1, G = 0):
    Var W (G - c) = E W^2 G^2 - 2 c E W^2 G + c^2 E W^2 - (V^pi - c)^2."""
    P, reward = np.asarray(mdp.P, np.float64), np.asarray(mdp.reward, np.float64)
    pi, b = np.asarray(target, np.float64), np.asarray(behaviour, np.float64)
    b_rho2 = b * np.divide(pi, b, out=np.zeros_like(pi), where=b > 0) ** 2
    live, ended = ~np.asarray(mdp.terminal), np.array([[1.0], [0.0], [0.0]])
    m = np.broadcast_to(ended, (3, len(P)))  # the moments from each cell, of the remaining steps
    for _ in range(horizon):
        after = [m[0], reward * m[0] + gamma * m[1],
                 reward**2 * m[0] + 2 * gamma * reward * m[1] + gamma**2 * m[2]]
        m = np.where(live, np.stack([(b_rho2 * (P @ x)).sum(-1) for x in after]), ended)
    return m[:, mdp.start]


def numpy_dr_variance(mdp, target, behaviour, gamma, horizon, q_hat):
    """The variance of one episode's DR term under the behaviour policy, in float64 from the exact
    MDP (q_hat = 0: PDIS's). Y_t = V-hat_t(s_t) + rho_t (r_t + gamma Y_{t+1} - Q-hat_t(s_t, a_t)), 0
    after the end; E[Y_t | s] = V^pi_t(s) whatever Q-hat, and E[Y_t^2 | s] by backward induction
    (the recursion of Jiang & Li 2016, Theorem 1, written as second moments)."""
    P, R = np.asarray(mdp.P, np.float64), np.asarray(mdp.R, np.float64)
    reward, live = np.asarray(mdp.reward, np.float64), ~np.asarray(mdp.terminal)
    pi, b = np.asarray(target, np.float64), np.asarray(behaviour, np.float64)
    rho = np.divide(pi, b, out=np.zeros_like(pi), where=b > 0)
    second, value = np.zeros(len(P)), np.zeros(len(P))  # E[Y_{t+1}^2 | s], V^pi_{t+1}(s)
    for t in reversed(range(horizon)):
        mean = R + gamma * P @ value  # E[r_t + gamma Y_{t+1} | s, a] = Q^pi_t
        square = P @ (reward**2 + 2 * gamma * reward * value + gamma**2 * second)
        q, v = q_hat[t], (pi * q_hat[t]).sum(-1, keepdims=True)
        y2 = v**2 + 2 * v * rho * (mean - q) + rho**2 * (square - 2 * q * mean + q**2)
        second = np.where(live, (b * y2).sum(-1), 0.0)
        value = np.where(live, (pi * mean).sum(-1), 0.0)
    return second[mdp.start] - value[mdp.start] ** 2


# One sweep serves the statistics, the layout checks and (its compiled program, from the session's
# compilation cache) the command line test. Thresholds: what a correct implementation reaches on
# this GridWorld with 400 datasets (MSE estimates of heavy-tailed IS have ~10% noise).
SWEEP = dict(dataset_sizes=(100, 1000), num_datasets=400, num_episodes=1000, num_bootstrap=200,
             track=False)
SWEEP_FLAGS = [x for k, v in SWEEP.items() if k != "track"
               for x in (f"--{k.replace('_', '-')}", *(v if isinstance(v, tuple) else (v,)))]
MSE_RATIO = (6.0, 16.0)  # MSE(n = 100) / MSE(n = 1000) for the unbiased OIS and PDIS: 10 in theory
# Coverage of a nominal 95% interval over the sweep's 400 datasets: binomial SE sqrt(0.95 * 0.05 /
# 400) = 0.011. Two-sided at n = 1000: at least the 0.93 - 3 SE (approximate intervals of
# heavy-tailed estimates may undercover a little), at most 0.95 + 3 SE (more is an interval too
# wide: 1.5 times as wide, as the test checks on these datasets, covers more).
COVERAGE_SE = float(np.sqrt(0.95 * 0.05 / SWEEP["num_datasets"]))
COVERAGE = (0.93 - 3 * COVERAGE_SE, 0.95 + 3 * COVERAGE_SE)
BOUND_HOLDS = 0.95 - 3 * COVERAGE_SE  # the delta = 0.05 betting bound and interval, at every n
BOUND_AT_1000 = -0.2  # the lower bound's mean at n = 1000 (V^pi = 0.2472; the target)


@pytest.fixture(scope="module")
def sweep():
    args = is_eval.validate(is_eval.Args(**SWEEP))
    _, metrics, _ = is_eval.run(args)
    return args, jax.device_get(metrics)


def test_sweep_statistics(sweep):
    """Over 400 datasets: MSE falls as 1/n; the 95% bootstrap-t and t intervals of every estimator
    cover V^pi at n = 1000 neither too rarely nor too often (COVERAGE); the betting bounds hold at
    least as often as their 95% (they are valid, conservative: holding in every dataset is no
    fault) and are not vacuous: narrower than the return range at every n, and at n = 1000 each
    end of the interval lies on average at most BETTING_WIDTH times betting's asymptotic distance
    from V^pi, from the exact sd of W (G - low) and W (high - G) (numpy_weight_moments: 5.47 and
    1.79, where OIS's W G has 1.97: why the interval is 2.1 times as wide as OIS's bootstrap-t
    here); measured 0.90 and 0.72 of it."""
    args, metrics = sweep
    problem = is_eval.gridworld_problem(args)
    value, (low, high) = float(problem.value), np.asarray(problem.returns, np.float64)
    stats = is_eval.sweep_stats(metrics, value)
    for name in ("ois", "pdis"):
        ratio = stats[name]["mse"][0] / stats[name]["mse"][1]
        assert MSE_RATIO[0] <= ratio <= MSE_RATIO[1], (name, stats[name]["mse"])
    for name, kind in itertools.product((*is_eval.ESTIMATORS, "oracle_dr"), ("", "t_")):
        assert COVERAGE[0] <= stats[name][f"{kind}coverage"][1] <= COVERAGE[1], (name, stats[name])
        estimate, interval = (metrics[f"{k}/{name}"][:, 1]
                              for k in ("estimate", "t" if kind else "bootstrap_t"))
        wide = estimate[:, None] + 1.5 * (interval - estimate[:, None])
        assert ((wide[:, 0] <= value) & (value <= wide[:, 1])).mean() > COVERAGE[1], name
    betting = stats["betting"]
    assert (betting["holds"] >= BOUND_HOLDS).all() and (betting["coverage"] >= BOUND_HOLDS).all()
    assert betting["lower"][1] >= BOUND_AT_1000 and betting["lower"][1] > betting["lower"][0]
    moments = numpy_weight_moments(problem.mdp, problem.target, problem.behaviour, args.gamma,
                                   is_eval.GRID_HORIZON)
    spread = [np.sqrt(moments @ [c * c, -2 * c, 1.0] - (value - c) ** 2) for c in (low, high)]
    asymptotic = np.sqrt(2 * np.log(2 / args.delta) / args.dataset_sizes[1]) * np.array(spread)
    ends = np.asarray(metrics["betting/interval"][:, 1], np.float64).mean(0)
    assert (betting["width"] < high - low).all(), betting["width"]
    assert (np.array([value - ends[0], ends[1] - value]) <= BETTING_WIDTH * asymptotic).all(), (
        ends, asymptotic)
    for name in is_eval.ESTIMATORS:  # every estimator is consistent: small bias at n = 1000
        sd = np.sqrt(stats[name]["variance"][1] / args.num_datasets)
        assert abs(stats[name]["bias"][1]) < 3 * sd + 0.01


def test_dr_variance_is_below_pdis(sweep):
    """DR with a good Q-hat varies far less than PDIS (DR with Q-hat = 0): its variance exceeds its
    value with the exact Q^pi by terms in Q-hat - Q^pi alone (Jiang & Li 2016, Theorem 1). Exact
    variances of one episode's term (numpy_dr_variance): PDIS 6.79, DR with Q^pi 1.67, ratio 0.25.
    Over the sweep's 400 datasets at n = 1000: PDIS's and oracle DR's variances are their exact
    ones / n within 3 SE (of a variance over 400 datasets, from the data: 7.5%); for oracle DR and
    for DR with the cross-fitted Q-hat (fit_q_hat on 500 episodes a fold), Var(PDIS) - Var(DR)
    exceeds 3 SE of the paired difference, and Var(DR) / Var(PDIS) is at most the exact 0.25 + 3
    of its SEs (delta method, 0.019): a fitted Q-hat as good as Q^pi. A zero Q-hat makes DR PDIS
    itself (test_padding_scaling_and_zero_model): difference 0, ratio 1: it fails."""
    args, metrics = sweep
    problem = is_eval.gridworld_problem(args)
    q_pi = numpy_q_values(problem.mdp.P, problem.mdp.R, problem.target, args.gamma,
                          is_eval.GRID_HORIZON)
    exact = {name: numpy_dr_variance(problem.mdp, problem.target, problem.behaviour, args.gamma,
                                     is_eval.GRID_HORIZON, q_hat)
             for name, q_hat in (("pdis", np.zeros_like(q_pi)), ("oracle_dr", q_pi))}
    n, m = args.dataset_sizes[1], args.num_datasets
    squares = {}  # each dataset's squared deviation from the mean, whose mean is the variance
    for name in ("pdis", "oracle_dr", "dr"):
        x = np.asarray(metrics[f"estimate/{name}"][:, 1], np.float64)
        squares[name] = (x - x.mean()) ** 2
    for name, variance in exact.items():
        sq = squares[name]
        assert abs(sq.mean() - variance / n) <= 3 * sq.std(ddof=1) / np.sqrt(m), (name, variance)
    pdis, bound = squares["pdis"], exact["oracle_dr"] / exact["pdis"]
    for name in ("oracle_dr", "dr"):
        diff, ratio = pdis - squares[name], squares[name].mean() / pdis.mean()
        influence = (squares[name] - ratio * pdis) / pdis.mean()  # of each dataset on the ratio
        assert diff.mean() > 3 * diff.std(ddof=1) / np.sqrt(m), name
        assert ratio <= bound + 3 * influence.std(ddof=1) / np.sqrt(m), (name, ratio, bound)


def test_seed_sweep_layout_and_determinism(sweep):
    """Dataset k alone (jit without vmap or pmap, compiled as main() compiles the table, here at
    n = 1000 as the sweep's last size) gives the answers of the 2-device pmap x lax.map sweep to
    1e-5, on either device; the same key gives the same bits; another seed another dataset."""
    args, metrics = sweep
    assert jax.local_device_count() == 2
    for k, v in metrics.items():
        assert v.shape[:2] == (args.num_datasets, len(args.dataset_sizes)), k
        extra_axis = k == "stats/ess_step" or k == "betting/interval" or k.startswith(
            ("bootstrap_t/", "t/"))  # [H] per-step ESS, [low, high] intervals
        assert v.ndim == 2 + extra_axis, k
    one = dataclasses.replace(args, dataset_sizes=(args.num_episodes,), num_datasets=1)
    alone = jax.jit(is_eval.make_gridworld_trial(one), compiler_options=is_eval.FAST_COMPILE)
    assert args.num_episodes == args.dataset_sizes[-1]
    keys = jax.random.split(jax.random.PRNGKey(args.seed), args.num_datasets)
    first = None
    for d in (0, 1, 198, 200, 201, 399):  # 0-199 on the first device, 200-399 on the second
        got = jax.device_get(alone(keys[d])[1])
        for k, v in got.items():
            np.testing.assert_allclose(v[0], metrics[k][d, -1], rtol=1e-5, atol=1e-6, err_msg=k)
        first = first or got
    again = jax.device_get(alone(keys[0])[1])
    assert all(np.array_equal(first[k], again[k]) for k in first)
    other = jax.device_get(alone(jax.random.split(jax.random.PRNGKey(args.seed + 1), 1)[0])[1])
    assert not np.allclose(first["estimate/wis"], other["estimate/wis"])


def test_sweep_not_a_multiple_of_the_devices(monkeypatch):
    """3 (or 5) datasets on 2 devices run on the largest device count dividing them, 1; 4 and 6 on
    both; dataset k is the k-th split of PRNGKey(seed) in every layout (the trial stubbed: the
    layout alone is under test here, the program's own in the test above)."""
    def make_gridworld_trial(args):
        return lambda key: (key, {"estimate/wis": jax.random.uniform(key, (2,))})

    monkeypatch.setattr(is_eval, "make_gridworld_trial", make_gridworld_trial)
    for num, devices in ((3, 1), (4, 2), (5, 1), (6, 2)):
        args = is_eval.validate(is_eval.Args(num_datasets=num, track=False))
        keys, metrics, timing = is_eval.run(args)
        assert timing["devices"] == devices, (num, timing)
        np.testing.assert_array_equal(keys, jax.random.split(jax.random.PRNGKey(args.seed), num))
        assert metrics["estimate/wis"].shape == (num, 2)


# ----------------------------------------------------------------------------- command line
def test_help_lists_every_flag_with_its_doc(capsys):
    text = help_text(is_eval, capsys)
    for phrase in ["independent datasets per size n in the sweep",
                   "discount factor of the value being",
                   "bootstrap resamples for the table's confidence intervals"]:
        assert phrase in text, phrase


def test_copied_file_runs_alone_and_writes_outputs(tmp_path, monkeypatch, capsys):
    """A copy of the file alone in an empty folder, run from there (in this process: that it
    imports nothing of this repository, test_layout.py): the default experiment, as small as the
    sweep tests' (whose programs it finds in the session's compilation cache), with its table,
    progress, tensorboard scalars (step = n)."""
    folder = tmp_path / "alone"
    folder.mkdir()
    shutil.copy(is_eval.__file__, folder / "is_eval.py")
    spec = importlib.util.spec_from_file_location("is_eval_copy", folder / "is_eval.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    monkeypatch.chdir(folder)
    monkeypatch.setattr(sys, "argv", [str(folder / "is_eval.py"), *map(str, SWEEP_FLAGS)])
    copy.main()
    out = capsys.readouterr().out
    assert "exact V^pi = 0.2472" in out
    table, ess = printed_table(out)
    assert list(table) == [*ESTIMATOR_ROWS, "ORACLE_DR"] and 0 < ess <= 1000, out
    for est, low, high, t_low, t_high, error in table.values():
        assert low < high and t_low <= est <= t_high
        assert abs(est - error - 0.2472) < 2e-4
    bound, low, high = map(float, re.search(BETTING_LINE, out, re.M).groups())
    assert -0.99 <= low <= bound < 0.2472 < high <= 0.593  # within the return range
    assert out.count("[is_eval] datasets") == 10  # a progress line every 10% of the datasets
    assert re.search(r"^2 device\(s\)  compile", out, re.M), out
    (run_dir,) = (folder / "runs").iterdir()
    assert run_dir.name.startswith("GridWorld__is_eval__1__")
    for name, stat in [(k, "coverage") for k in (*is_eval.ESTIMATORS, "oracle_dr")] + [
            ("betting", "holds")]:
        assert [step for step, _ in read_scalars(run_dir, f"ope/{name}/{stat}")] == [100, 1000]


def write_npz(path, episodes, tlp, **extra):
    np.savez(path, **episodes._asdict(), target_log_prob=tlp, **extra)


def test_dataset_flag(tmp_path, monkeypatch, capsys):
    """--dataset through main() (in this process): the printed table is estimate() on the file."""
    rng = np.random.default_rng(7)
    episodes, tlp, q_hat, v_hat = random_data(rng, 400, 9)
    write_npz(tmp_path / "logged.npz", episodes, tlp, q_hat=q_hat, v_hat=v_hat)
    monkeypatch.setattr("sys.argv", ["is_eval.py", "--dataset", str(tmp_path / "logged.npz"),
                                     "--gamma", "0.9", "--num-bootstrap", "200",
                                     "--log-dir", str(tmp_path / "runs")])
    is_eval.main()
    out = capsys.readouterr().out
    table, ess = printed_table(out)
    want = is_eval.estimate(episodes, tlp, 0.9, q_hat, v_hat)
    assert abs(ess - float(want["ess"])) < 0.1
    for name in is_eval.ESTIMATORS:
        est, low, high, t_low, t_high = table[name.upper()]
        assert abs(est - float(want[name])) <= 1e-4 and low < high and t_low <= est <= t_high
    assert "the user's responsibility" in out and "they need --return-range" in out
    assert any((tmp_path / "runs").glob("logged__is_eval__1__*/events.out.tfevents.*"))


def test_dataset_return_range_gives_the_betting_bounds(tmp_path, monkeypatch, capsys):
    """--return-range with --dataset: the printed betting line is betting_bounds on its episodes."""
    rng = np.random.default_rng(10)
    n, horizon = 300, 5
    episodes, tlp, _, _ = random_data(rng, n, horizon)
    episodes = episodes._replace(rewards=rng.uniform(0, 1, (n, horizon)).astype(np.float32))
    write_npz(tmp_path / "bounded.npz", episodes, tlp)
    monkeypatch.setattr("sys.argv", ["is_eval.py", "--dataset", str(tmp_path / "bounded.npz"),
                                     "--num-bootstrap", "200", "--no-track", "--return-range",
                                     "0", str(horizon)])
    is_eval.main()
    out = capsys.readouterr().out
    lower, (low, high) = is_eval.betting_bounds(is_eval.episode_rows(episodes, tlp, 0.95), 0.0,
                                                float(horizon), 0.05)
    printed = [float(x) for x in re.search(BETTING_LINE, out, re.M).groups()]
    np.testing.assert_allclose(printed, [lower, low, high], atol=1e-4)
    assert 0 < printed[0] < printed[2] < horizon and "responsibility" not in out


def test_bad_dataset_is_one_line_exit_2(tmp_path):
    rng = np.random.default_rng(8)
    episodes, tlp, _, _ = random_data(rng, 10, 6, min_len=6)
    write_npz(tmp_path / "short.npz", episodes, tlp[:, :5])
    assert_usage_error("is_eval.py", ["--dataset", tmp_path / "short.npz"], "--dataset", tmp_path)
    blp = episodes.behaviour_log_prob.copy()
    blp[2, 3] = -np.inf
    write_npz(tmp_path / "zero.npz", episodes._replace(behaviour_log_prob=blp), tlp)
    assert_usage_error("is_eval.py", ["--dataset", tmp_path / "zero.npz"],
                       "--dataset: episode 2, step 3", tmp_path)
    mask = episodes.mask.copy()
    mask[4, 2] = False  # real steps after it: not a prefix of ones
    write_npz(tmp_path / "gap.npz", episodes._replace(mask=mask), tlp)
    assert_usage_error("is_eval.py", ["--dataset", tmp_path / "gap.npz"],
                       "--dataset: episode 4: mask is False at step 2", tmp_path)
    write_npz(tmp_path / "3d.npz", episodes, tlp, q_hat=np.zeros((10, 6, 3), np.float32),
              v_hat=np.zeros((10, 6), np.float32))
    assert_usage_error("is_eval.py", ["--dataset", tmp_path / "3d.npz"],
                       "--dataset: q_hat has shape (10, 6, 3)", tmp_path)


@pytest.mark.parametrize("array, value, message", [
    ("rewards", np.nan, "rewards is nan"),
    ("rewards", -np.inf, "rewards is -inf"),
    ("obs", np.nan, "obs is nan"),
    ("obs", np.inf, "obs is inf"),
    ("target_log_prob", np.nan, "target_log_prob is nan"),
    ("behaviour_log_prob", np.nan, "behaviour_log_prob is nan"),
    ("target_log_prob", np.inf, "target_log_prob is inf"),
    ("behaviour_log_prob", 0.5, "behaviour_log_prob is 0.5; a log-probability is at most 0"),
    ("target_log_prob", 0.5, "target_log_prob is 0.5; a log-probability is at most 0"),
    ("q_hat", np.nan, "q_hat is nan"),
    ("v_hat", np.inf, "v_hat is inf"),
])
def test_bad_values_in_dataset_are_one_line_exit_2(array, value, message, tmp_path):
    """A NaN or infinite value, or a log-probability above 0, at a real step is named in one line
    before anything compiles (in padding, random_data's garbage passes: see test_dataset_flag)."""
    episodes, tlp, q_hat, v_hat = random_data(np.random.default_rng(16), 10, 6, min_len=6)
    arrays = dict(episodes._asdict(), target_log_prob=tlp, q_hat=q_hat, v_hat=v_hat)
    arrays[array] = arrays[array].copy()
    arrays[array][3, 2] = value
    np.savez(tmp_path / "bad.npz", **arrays)
    assert_usage_error("is_eval.py", ["--dataset", tmp_path / "bad.npz"],
                       f"--dataset: episode 3, step 2: {message}", tmp_path)


@pytest.mark.parametrize("typed, flag", [
    (["--gamma", "1.5"], "--gamma"),
    (["--gamma", "-0.1"], "--gamma"),
    (["--num-episodes", "0"], "--num-episodes"),
    (["--dataset-sizes", "0", "10"], "--dataset-sizes"),
    (["--num-datasets", "0"], "--num-datasets"),
    (["--num-bootstrap", "1"], "--num-bootstrap"),
    (["--horizon", "0"], "--horizon"),
    (["--epsilon", "1.5"], "--epsilon"),
    (["--folds", "0"], "--folds"),
    (["--folds", "11"], "--folds"),
    (["--delta", "1"], "--delta"),
    (["--return-range", "1", "0"], "--return-range"),
    (["--dataset", "missing.npz"], "--dataset"),
    (["--target-model", "missing.msgpack"], "--target-model"),
])
def test_bad_input_is_one_line_exit_2(typed, flag, tmp_path):
    assert_usage_error("is_eval.py", typed, flag, tmp_path)


def test_cli_usage_error_exit_code(tmp_path):
    proc = run_script("is_eval.py", "--gamma", "1.5", "--log-dir", tmp_path / "runs", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --gamma must be in [0, 1] (got 1.5)"
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- --target-model
def save_ppo_model(folder, env_id, **given):
    """A model.msgpack written by ppo.py's own save_model for 2 seeds, with small random parameters
    in its network's tree (the file layout is what matters here, not how good the policy is)."""
    import ppo
    from runner import files, flags, sweep

    args = validated(ppo, env_id=env_id, num_seeds=2, hidden_size=16, normalize_obs=True, **given)
    hp = {k: jnp.float32(v) for k, v in flags.grid(args)[0].items()}
    shapes = jax.eval_shape(sweep.build_train(args).init, jax.random.PRNGKey(0), hp)
    rng = np.random.default_rng(9)
    params = jax.tree.map(lambda x: rng.normal(0.0, 0.3, (2, *x.shape)).astype(np.float32),
                          shapes.params)
    obs_shape = shapes.obs_stats.mean.shape
    stats = types.SimpleNamespace(mean=rng.normal(size=(2, *obs_shape)),
                                  var=rng.uniform(0.5, 2.0, (2, *obs_shape)))
    folder.mkdir(parents=True, exist_ok=True)
    state = types.SimpleNamespace(params=params, obs_stats=stats)
    return files.save_model(str(folder), args, state)


def test_target_model(tmp_path, capsys):
    saved = save_ppo_model(tmp_path / "cartpole", "CartPole-v1")
    args = is_eval.validate(is_eval.Args(
        target_model=saved, model_seed=1, horizon=40, num_episodes=500, num_mc_episodes=5000,
        num_bootstrap=200, epsilon=0.5, log_dir=str(tmp_path / "runs")))
    is_eval.main_target_model(args, is_eval.load_target_model(args))
    out = capsys.readouterr().out
    mc = float(re.search(r"V\^pi = (\S+) \(95% CI", out).group(1))
    table, _ = printed_table(out)
    assert list(table) == ["OIS", "WIS", "PDIS", "WPDIS"], out
    for est, low, high, _, _, error in table.values():  # near-uniform: intervals hold the truth
        assert low - 0.05 <= mc <= high + 0.05 and abs(est - error - mc) < 2e-4, out
    assert any((tmp_path / "runs").glob("CartPole-v1__is_eval__1__*/events.out.tfevents.*"))
    with pytest.raises(is_eval.ArgError, match="--model-seed"):
        is_eval.load_target_model(is_eval.Args(target_model=saved, model_seed=2))
    for env_id, given in [("Pendulum-v1", {}), ("Breakout-MinAtar", {"network": "cnn"})]:
        model = save_ppo_model(tmp_path / env_id, env_id, **given)
        with pytest.raises(is_eval.ArgError, match=f"policy of {env_id}; this file rebuilds"):
            is_eval.load_target_model(is_eval.Args(target_model=model))


def test_target_model_of_image_observations(tmp_path):
    """MinAtar's preset policy, a relu MLP on the flattened 10x10x4 grid: its log-probabilities
    are those ppo.py's own network gives the logged observations."""
    import ppo

    saved = save_ppo_model(tmp_path, "Breakout-MinAtar")
    model = is_eval.load_target_model(is_eval.Args(target_model=saved, model_seed=1))
    assert model.activation == "relu"
    episodes, log_pi = is_eval.collect_gymnax(jax.random.PRNGKey(0), model, 0.5, 4, 6)
    args = validated(ppo, env_id="Breakout-MinAtar", hidden_size=16)
    params = flax.serialization.msgpack_restore(open(saved, "rb").read())["params"]
    obs = np.clip((episodes.obs.reshape(4, 6, -1) - model.obs_mean)
                  / np.sqrt(model.obs_var + 1e-8), -10, 10)
    network = ppo.ActorCritic(action_dim=3, continuous=False, hidden_size=args.hidden_size,
                              activation=args.activation)  # Breakout-MinAtar's 3 actions
    dist = network.apply(jax.tree.map(lambda x: x[1], params), obs, method="policy")
    np.testing.assert_allclose(log_pi, dist.log_prob(episodes.actions), rtol=1e-5, atol=1e-5)
