"""The benchmark pipeline: one command writes parseable tables and plots; the README shows them."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT


def parse_tables(markdown):
    """Every markdown table as a list of rows (lists of cells); asserts the rows are well formed."""
    tables, current = [], []
    for line in markdown.splitlines() + [""]:
        if line.startswith("|"):
            current.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif current:
            header, rule, *rows = current
            assert all(set(cell) <= set("-: ") for cell in rule), rule
            assert rows, header
            assert all(len(row) == len(header) for row in rows), (header, rows)
            tables.append([header, *rows])
            current = []
    return tables


def test_quick_run_writes_tables_and_plots(tmp_path):
    """`run.py --quick`: every default section on tiny budgets (under a minute on 2 idle cores)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "RESULTS.md").read_text()
    assert report.splitlines()[2].startswith("Machine: ")
    tables = parse_tables(report)
    sections = [row[0] for row in tables[-1][1:]]
    assert sections == ["commands", "robustness", "q_learning", "is_eval", "**total**"]
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "learning_curves.png", "q_learning_speed.png", "is_eval_mse_vs_n.png"}


def test_time_to_threshold_is_the_first_update_that_reaches_it():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import common

    score = [[np.nan, 400, 480, 300], [np.nan, np.nan, 100, 200], [500, 500, 500, 500]]
    assert common.reach_fraction(score, 475).tolist() == [0.75, 0.0, 0.25]
    assert common.solve_time([3.0, 7.5]) == (7.5, 2)
    assert common.solve_time([3.0, None]) == (None, 1)


def test_a_failing_section_is_reported_and_fails_the_run(tmp_path, monkeypatch):
    """A section that raises leaves its error in RESULTS-<sections>.md and exits non-zero."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run

    monkeypatch.setitem(run.SECTIONS, "q_learning", "no_such_benchmark_module")
    monkeypatch.setattr(run, "FAILED", [])
    with pytest.raises(SystemExit, match="failed sections: q_learning"):
        run.main(["--quick", "--only", "q_learning", "--out", str(tmp_path)])
    report = (tmp_path / "RESULTS-q_learning.md").read_text()
    assert "**The q_learning section failed**: `ModuleNotFoundError" in report


def test_unknown_section_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "dqn",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--only" in proc.stderr


def test_readme_shows_the_latest_results():
    """The README's results block is exactly the last full run's RESULTS.md (or says none ran)."""
    results = ROOT / "benchmarks" / "results" / "RESULTS.md"
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- results:start -->")[1].split("<!-- results:end -->")[0]
    if not results.exists():
        assert block.strip() == "(no full benchmark run recorded yet)"
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run as bench_run

    assert block.strip() == bench_run.readme_block(results.read_text()).strip()
    parse_tables(block)


def test_live_check_reads_the_scalars_ppo_appends_while_it_runs(tmp_path):
    """bench_long_runs.scalar_steps on event files as ppo.py's Tensorboard writes them: the
    hyperparameter table is no scalar, a segment's scalars count once appended, and a record
    still being written (a torn tail) is left for the next read, not an error."""
    import io

    from tensorboard.summary.writer.record_writer import RecordWriter

    import ppo

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_long_runs

    args = ppo.validate(ppo.Args(num_seeds=2))
    board = ppo.Tensorboard(tmp_path, args, np.zeros((1, 0)))
    assert bench_long_runs.scalar_steps(tmp_path) == []
    segment = lambda *steps: {"env_steps": np.array([steps, steps]), "episode_return": np.full(
        (2, len(steps)), 20.0), "loss/value": np.full((2, len(steps)), 0.5)}
    board.write(segment(2048, 4096), {"charts/SPS": [1e5, 1e5]})
    assert sorted(set(bench_long_runs.scalar_steps(tmp_path))) == [2048, 4096]
    torn = io.BytesIO()
    RecordWriter(torn).write(b"x" * 100)
    with open(board.paths[0], "ab") as f:
        f.write(torn.getvalue()[:-7])
    assert sorted(set(bench_long_runs.scalar_steps(tmp_path))) == [2048, 4096]


def test_minatar_verdict_and_time_to_target():
    """bench_minatar (its games run only with `run.py --only minatar`): the issue's rule (mean at
    least the target, every seed above half; a seed without episodes misses), and the first curve
    bin whose mean over the seeds reached the target, in steps and seconds from launch."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_minatar

    assert bench_minatar.verdict([30, 29, 28, 25], 28) == "met"
    assert bench_minatar.verdict([60, 60, 10, 20], 28) == "not met: worst seed 10 <= 14"
    assert bench_minatar.verdict([20, 20, 20, np.nan], 28).startswith("not met: mean nan < 28")
    result = {"curves": [[[None, 20, 30, 40], [None, 30, 28, 10]]],
              "curve_steps": [100, 200, 300, 400], "launched_at": 1000.0, "run_s": 40.0,
              "returned_at": 1050.0}  # the run started 10 s after the launch
    assert bench_minatar.time_to_target(result, 25) == (200, 30.0)
    assert bench_minatar.time_to_target(result, 29) == (300, 40.0)
    assert bench_minatar.time_to_target(result, 30) is None  # each seed did; the mean did not
    assert bench_minatar.time_to_target(result, 41) is None
