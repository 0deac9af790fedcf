"""Copy and hack: the edits a researcher makes to a copy of ppo.py are short and touch only its
algorithm (the runner is not in the file). Three of them, applied as text to a copy, then a tiny
sweep of it: a KL penalty (a swept coefficient) in 3 places, a new metric in 1 line, another
optimiser in 1."""
import importlib.util

import numpy as np

from conftest import ALGOS, validated
from runner import sweep

EDITS = {  # what -> [(text of ppo.py, its replacement)], each a place of the file
    "kl_penalty": [
        ('    max_grad_norm: tuple[float, ...] = (0.5,)\n',
         '    max_grad_norm: tuple[float, ...] = (0.5,)\n    kl_coef: tuple[float, ...] = (0.0,)\n'
         '    """sweep: weight of a KL(behaviour || new policy) penalty in the loss"""\n'),
        ("max_grad_norm=POSITIVE)", "max_grad_norm=POSITIVE, kl_coef=NON_NEGATIVE)"),
        ('    loss = policy_loss + hp["vf_coef"] * value_loss - hp["ent_coef"] * entropy',
         '    loss = policy_loss + hp["vf_coef"] * value_loss - hp["ent_coef"] * entropy \\\n'
         '        + hp["kl_coef"] * ((ratio - 1.0) - log_ratio).mean()')],
    "new_metric": [('"stats/approx_kl": ((ratio - 1.0) - log_ratio).mean(),',
                    '"stats/approx_kl": ((ratio - 1.0) - log_ratio).mean(), '
                    '"stats/ratio_max": ratio.max(),')],
    "optimiser": [("optax.adam(", "optax.adamw(")],
}


def test_three_hacks_on_a_copy_train(tmp_path):
    text = (ALGOS / "ppo.py").read_text()
    tail = text.index("\n# " + "=" * 76 + " 7. the tail")
    for what, places in EDITS.items():
        for old, new in places:
            assert text.count(old) == 1 and text.index(old) < tail, (what, old)
            text = text.replace(old, new)
    assert len(EDITS["kl_penalty"]) == 3 and all(
        len(EDITS[k]) == 1 and EDITS[k][0][1].count("\n") == 0 for k in ("new_metric", "optimiser"))
    (tmp_path / "ppo_hacked.py").write_text(text)
    spec = importlib.util.spec_from_file_location("ppo_hacked", tmp_path / "ppo_hacked.py")
    hacked = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hacked)

    args = validated(
        hacked, env_id="CartPole-v1", num_envs=4, num_steps=16, num_minibatches=2,
        update_epochs=2, total_timesteps=4 * 16 * 3, hidden_size=16, num_seeds=2, track=False,
        kl_coef=(0.0, 5.0))
    state, metrics, _ = sweep.run(args)
    ratio_max = metrics["stats/ratio_max"]  # [2 coefficients, 2 seeds, 3 updates]
    assert ratio_max.shape == (2, 2, 3) and np.all(np.isfinite(ratio_max)) and np.any(ratio_max > 1)
    # The penalty is a swept, traced coefficient: the same seeds, other losses from update 2 on.
    assert not np.array_equal(metrics["loss/policy"][0], metrics["loss/policy"][1])
    # adamw: Adam's state, then its weight decay's, then its step size's (adam has no middle one).
    assert len(state.opt_state[1]) == 3
