"""The suite's learning tests on other seed bases: how far each row's criterion is from its spread.

    python benchmarks/learning_rows.py                       # every row, seed bases 1, 100, 200
    python benchmarks/learning_rows.py --rows vpg:pendulum_default --bases 1 100 200 300

A learning test (tests/test_*.py, a LEARNING table checked by conftest.assert_learns) runs its row
on one seed base (--seed 1), on the suite's 2 host devices. Its criterion must hold on any x86 host,
whose floating-point results, and so trajectories, differ: it is sized from the row's spread over
several seed bases, never from the one the suite runs. For each row and base this prints every
seed's final return (mean episode return over the last 5% of updates), the median, how many seeds
reach the row's floor, the rise from the first 10% of updates to the last, and whether the row's
criterion holds (conftest.learning_verdict, the test's own code). Run it alone: it trains.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import conftest  # noqa: E402, I001  (2 host devices and algos/ on sys.path, as in the suite)
import numpy as np  # noqa: E402
from runner import evaluation, reports, sweep  # noqa: E402

# test module -> the algorithm module its LEARNING table trains
TABLES = {"test_ppo": "ppo", "test_vpg": "vpg", "test_ppo_rnn": "ppo_rnn", "test_sac": "sac",
          "test_dqn": "dqn", "test_td3": "td3", "test_presets": "ppo"}


def rows():
    """{"algo:row": (algorithm module, spec)} of every LEARNING table of the suite."""
    found = {}
    for test, algo in TABLES.items():
        try:
            table = importlib.import_module(test).LEARNING
        except (ImportError, AttributeError):
            continue
        table = table if "args" not in table else {"minatar": table}  # (one row, not a table)
        for name, spec in table.items():
            found[f"{algo}:{name}"] = (importlib.import_module(algo), spec)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="*", help="algo:row names (default: all)")
    parser.add_argument("--bases", nargs="*", type=int, default=[1, 100, 200])
    opts = parser.parse_args()
    table = rows()
    for name in opts.rows or table:
        module, spec = table[name]
        for base in opts.bases:
            t0 = time.perf_counter()
            args = conftest.validated(module, num_seeds=spec["seeds"], track=False, seed=base,
                                      **spec["args"])
            state, metrics, _ = sweep.run(args)
            finals = reports.final_returns(metrics)
            verdict = conftest.learning_verdict(metrics, finals, spec)
            greedy = ""  # the rows that also judge the most likely actions' evaluation
            if spec.get("greedy") is not None:
                evals = evaluation.evaluator(args)(state)["eval/episodic_return_greedy"]
                greedy = f" | greedy {np.round(evals, 3).tolist()} (row: >= {spec['greedy']})"
            print(f"{name} base {base}: finals {np.round(finals, 1).tolist()} median "
                  f"{np.median(finals):.1f} | {verdict or 'holds'}{greedy} | "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
