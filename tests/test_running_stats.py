"""The running mean and variance behind --normalize-obs and --normalize-reward (ppo.py, vpg.py,
ppo_rnn.py: one copy each) against a float64 two-pass reference on fresh random batches, with
features that are nearly constant far from 0, as a Brax pendulum's cos(angle) is at its reset:
there the one-pass batch variance rounds below 0, and the normalised observation was NaN."""
import importlib

import jax.numpy as jnp
import numpy as np
import pytest

PRIOR_COUNT = 1e-4  # the files' initial statistics: mean 0, variance 1, this count


@pytest.mark.parametrize("name", ["ppo", "vpg", "ppo_rnn"])
def test_running_stats_match_float64_and_stay_finite(name):
    module = importlib.import_module(name)
    rng = np.random.default_rng(7)
    n, wide, constant = 2048, 4, 64
    # Columns: 4 ordinary features, then 64 near-constant ones (the cos of an angle drawn in
    # +-0.01 about an offset of 0 to 0.3): variances of 1e-10 to 3e-6 beside means near 1.
    batches = []
    for _ in range(3):
        ordinary = rng.normal(2.0, 3.0, (n, wide))
        angles = rng.uniform(-0.01, 0.01, (n, constant)) + rng.uniform(0.0, 0.3, constant)
        batches.append(np.concatenate([ordinary, np.cos(angles)], 1).astype(np.float32))
    dim = wide + constant
    stats = module.RunningStats(jnp.zeros(dim), jnp.ones(dim), jnp.asarray(PRIOR_COUNT))
    for k, batch in enumerate(batches, 1):
        stats = stats.update(jnp.asarray(batch))
        assert np.all(np.asarray(stats.var) >= 0), f"negative variance after batch {k}"
        normalized = np.asarray(module.normalize(jnp.asarray(batch), stats, True))
        assert np.all(np.isfinite(normalized)), f"non-finite normalised batch {k}"
        # The float64 reference: the prior as PRIOR_COUNT pseudo-observations of mean 0 and
        # variance 1, pooled with every batch so far, each term a sum of squares (never < 0).
        seen = np.concatenate(batches[:k]).astype(np.float64)
        total = PRIOR_COUNT + len(seen)
        data_mean = seen.mean(0)
        mean = data_mean * len(seen) / total
        m2 = (PRIOR_COUNT + ((seen - data_mean) ** 2).sum(0)
              + data_mean**2 * PRIOR_COUNT * len(seen) / total)
        np.testing.assert_allclose(stats.count, total, rtol=1e-6)
        np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-6)
        # float32: a near-constant feature's variance is known to its rounding (~1e-7 of 1)
        np.testing.assert_allclose(stats.var, m2 / total, rtol=1e-3, atol=3e-7)
