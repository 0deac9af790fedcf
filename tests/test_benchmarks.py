"""The benchmark pipeline: one command writes parseable tables and plots; the README shows them."""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, validated
from runner import events, flags


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


# ----------------------------------------------------------------------------- cell rules
def value(cell: str, unit: str = "") -> float:
    """The finite number a cell shows ("1,234.5", "**39**", "0.335M" with unit "M"); a cell that
    is no number ("n/a", "nan", "inf") fails."""
    text = cell.strip("*")
    assert text.endswith(unit), (cell, unit)
    x = float(text[:len(text) - len(unit)].replace(",", ""))
    assert math.isfinite(x), cell
    return x


def count(cell: str) -> int:
    x = value(cell)
    assert x == int(x) and x >= 1, cell
    return int(x)


def interval(cell: str) -> tuple[float, float, float]:
    """"m [lo, hi]" -> (lo, m, hi), asserting lo <= m <= hi."""
    match = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell)
    assert match, cell
    lo, m, hi = value(match[2]), value(match[1]), value(match[3])
    assert lo <= m <= hi, cell
    return lo, m, hi


def score_range(row: dict) -> tuple[float, float]:
    """The range of a command's score: q_learning's greedy_optimal is a fraction; Pendulum-v1
    pays -16.3 at worst per step for 200 steps; CartPole-v1 (no --env-id) 1 per step for 500."""
    command = row["command"]
    if "q_learning.py" in command:
        return 0.0, 1.0
    if "--env-id Pendulum-v1" in command:
        return -16.3 * 200, 0.0
    assert "--env-id" not in command, f"no score range for {command}"
    return 0.0, 500.0


def within(lo: float, hi: float, unit: str = ""):
    return lambda cell, row: lo <= value(cell, unit) <= hi


def positive(hi: float, unit: str = ""):
    return lambda cell, row: 0 < value(cell, unit) <= hi


def scores(cell, row):
    lo, hi = score_range(row)
    return lo <= interval(cell)[0] and interval(cell)[2] <= hi


def evaluation(cell, row):
    """An evaluation's returns are scores (q_learning has none: its greedy_optimal is exact)."""
    if "q_learning.py" in row["command"]:
        return cell == "none: greedy_optimal is exact"
    return scores(cell, row)


def worst_seed(cell, row):
    mean = row.get("final score, mean [95% CI]") or row["mean [95% CI]"]
    lo, hi = score_range(row)
    return lo <= value(cell) <= interval(mean)[1] <= hi


def reached_by(cell, row):
    """Seconds from launch until every seed reached the threshold (within the process's time),
    or how many seeds reached it: "k/n reached" (k < n), maybe "(last at t)"."""
    match = re.fullmatch(r"(\d+)/(\d+) reached( \(last at ([\d.]+)\))?", cell)
    if match:
        return int(match[1]) < int(match[2]) == int(row.get("seeds", match[2])) and (
            match[4] is None or 0 < float(match[4]) <= value(row["whole process s"]))
    return 0 < value(cell) <= value(row["whole process s"])


def compile_s(cell, row):
    """Compile seconds, "(cache)" exactly on a warm row that loaded the cache."""
    assert cell.endswith(" (cache)") == (row.get("cache") == "warm"), (cell, row)
    seconds = value(cell.removesuffix(" (cache)"))
    return 0 < seconds <= value(row.get("whole process s", "600"))


def fraction_of(total_column: str):
    def check(cell, row):
        match = re.fullmatch(r"(\d+)/(\d+)", cell)
        return bool(match) and int(match[1]) <= int(match[2]) == count(row[total_column])
    return check


def mse(cell, row):  # the mean of squared errors: bias^2 + variance, to the shown digits
    bias, std = value(row["bias"]), value(row["std"])
    return math.isclose(value(cell), bias ** 2 + std ** 2, rel_tol=0.01,
                        abs_tol=2e-4 * (1 + abs(bias) + std))


text = lambda cell, row: bool(cell.strip())
fraction = within(0.0, 1.0)
MINUTES = 600.0  # the quick run's timeout: no time in it can be longer
# Every column of every table `run.py --quick` writes, by header: a rule its cells keep.
RULES = {
    # the commands table (bench_cli.py) and the robustness table (robustness.py)
    "command": lambda cell, row: cell.startswith("`") and cell.endswith("`"),
    "cache": lambda cell, row: cell in (
        "cold", "warm", "warm, not cached: the cold run's compiles each took under 1 s"),
    "devices": lambda cell, row: 1 <= count(cell) <= os.cpu_count(),
    "whole process s": positive(MINUTES),
    "compile s": compile_s,
    "run s": lambda cell, row: 0 < value(cell) <= value(row["whole process s"]),
    "steps/s (all seeds)": positive(1e11),
    "every seed reached the threshold by (s, whole process)": reached_by,
    "every seed reached the threshold by (s, whole process, cold cache)": reached_by,
    "final score, mean [95% CI]": scores,
    "mean [95% CI]": scores,
    "evaluation, sampled actions: mean [95% CI]": evaluation,
    "evaluation, greedy actions: mean [95% CI]": evaluation,
    "IQM [95% CI]": scores,
    "worst seed": worst_seed,
    "steps per seed": lambda cell, row: count(cell) > 0,
    "seeds": lambda cell, row: count(cell) > 0,
    "threshold": lambda cell, row: value(cell) in (475.0, -250.0, 1.0),
    "final score >= threshold": fraction_of("seeds"),
    # q_learning speed (bench_q_learning.py)
    "workload (q_learning.py: devices x agents per device)": text,
    "agents": lambda cell, row: count(cell) > 0,
    "steps per agent": lambda cell, row: count(cell) > 0,
    "M agent-steps/s (median)": positive(1e4),
    "M agent-steps/s (best)": lambda cell, row: (
        value(row["M agent-steps/s (median)"]) <= value(cell) <= 1e4),
    "greedy-optimal at the end": fraction,
    "peak RSS MiB": positive(1e6),
    # is_eval speed, accuracy and betting bounds (bench_is_eval.py)
    "implementation": text,
    "estimators": text,
    "episodes x H": lambda cell, row: bool(re.fullmatch(r"[\d,]+ x \d+", cell)),
    "first call s": positive(MINUTES),
    "median ms": positive(MINUTES * 1e3),
    "episodes/s (median)": positive(1e4, "M"),
    "episodes/s (best)": lambda cell, row: (
        value(row["episodes/s (median)"], "M") <= value(cell, "M") <= 1e4),
    "median vs numpy (all)": positive(1e4, "x"),
    "max rel. diff vs float64": within(0.0, 1e-3),
    "estimator": text,
    "n": lambda cell, row: count(cell) > 0,
    "bias": within(-10.0, 10.0),
    "std": within(0.0, 10.0),
    "MSE": mse,
    "95% bootstrap-t coverage": fraction,
    "95% t coverage": fraction,
    "lower bound: mean": within(-10.0, 10.0),
    "lower bound - V^pi": within(-10.0, 10.0),
    "it holds": fraction,
    "interval: coverage": fraction,
    "mean width": within(0.0, 20.0),
    # the time of each section (run.py)
    "section": text,
    "seconds": positive(MINUTES),
}
# The only cells that may be "n/a", by row and column: numpy compiles nothing.
NOT_APPLICABLE = {
    ("numpy loop, one agent (baseline, 1 core)", "compile s"),
    ("numpy vectorised, every agent's step per iteration (baseline, 1 core)", "compile s"),
}


def check_cells(table):
    """Every cell of a parsed table keeps its column's rule of RULES (a column without one fails);
    "n/a" only where NOT_APPLICABLE names its row and column."""
    header, *rows = table
    missing = [name for name in header if name not in RULES]
    assert not missing, f"no rule for the column(s) {missing} of the table {header}"
    for cells in rows:
        row = dict(zip(header, cells))
        for name, cell in row.items():
            if (cells[0], name) in NOT_APPLICABLE:
                assert cell == "n/a", (name, cells)
                continue
            try:
                holds = RULES[name](cell, row)
            except (AssertionError, ValueError, KeyError) as e:
                raise AssertionError(f"{name!r}: {cell!r} in {row} ({e!r})") from e
            assert holds, f"{name!r}: {cell!r} breaks its rule, in {row}"


def test_quick_run_writes_tables_and_plots(tmp_path):
    """`run.py --quick`: every default section on tiny budgets (under a minute on 2 idle cores);
    every cell of its tables keeps its column's rule (finite, in its range)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = (tmp_path / "RESULTS.md").read_text()
    assert report.splitlines()[2].startswith("Machine: ")
    tables = parse_tables(report)
    sections = [row[0] for row in tables[-1][1:]]
    assert sections == ["commands", "robustness", "q_learning", "is_eval", "**total**"]
    for table in tables:
        check_cells(table)
    assert {(row[0], name) for header, *rows in tables for row in rows
            for name, cell in zip(header, row) if cell == "n/a"} == NOT_APPLICABLE
    assert {p.name for p in tmp_path.glob("*.png")} == {
        "learning_curves.png", "q_learning_speed.png", "is_eval_mse_vs_n.png"}


def test_cell_rules_refuse_nan_na_and_absurd_numbers():
    """The rules above fail a cell that no correct run writes."""
    header = ["command", "cache", "devices", "whole process s", "compile s", "run s",
              "final score, mean [95% CI]", "worst seed"]
    good = ["`ppo.py --num-seeds 2`", "warm", "2", "12.0", "1.7 (cache)", "6.6",
            "500 [500, 500]", "500"]
    check_cells([header, good])
    for column, bad in [("run s", "nan"), ("run s", "n/a"), ("run s", "0.0"), ("run s", "13"),
                        ("compile s", "1.7"), ("cache", "warm, cache not used"),
                        ("final score, mean [95% CI]", "501 [500, 502]"),
                        ("final score, mean [95% CI]", "400 [450, 500]"), ("worst seed", "-1"),
                        ("devices", "0")]:
        row = list(good)
        row[header.index(column)] = bad
        with pytest.raises(AssertionError):
            check_cells([header, row])
    with pytest.raises(AssertionError, match="no rule"):
        check_cells([["a new column"], ["1"]])
    numpy = ["numpy loop, one agent (baseline, 1 core)", "1", "5,000", "n/a", "0.1", "0.11",
             "0.05", "250"]
    header = ["workload (q_learning.py: devices x agents per device)", "agents",
              "steps per agent", "compile s", "M agent-steps/s (median)",
              "M agent-steps/s (best)", "greedy-optimal at the end", "peak RSS MiB"]
    check_cells([header, numpy])
    with pytest.raises(AssertionError):  # n/a by name only
        check_cells([header, ["q_learning.py, 1 x 1", *numpy[1:]]])
    with pytest.raises(AssertionError):
        check_cells([header, [*numpy[:6], "1.5", "250"]])


def test_numpy_baselines_run_q_learning_as_the_file_does():
    """bench_q_learning's numpy baselines: the loop and the vectorised one take the same steps
    on one agent (they draw the same random numbers), slips included; the loop's greedy policy
    after 100k steps is optimal and its values are V* (value iteration), as the file's are."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_q_learning
    import q_learning as ql

    Args = flags.args_class(ql)
    for slip in (0.0, 0.2):  # a small open grid, where the goal is soon reached
        grid = bench_q_learning.NumpyGrid(ql, Args(grid_size=(3, 4), walls=(), goal=(2, 3),
                                                   slip=slip))
        loop = bench_q_learning.numpy_loop(grid, 2_000)
        np.testing.assert_array_equal(loop, bench_q_learning.numpy_vectorised(grid, 1, 2_000))
        assert grid.greedy_optimal(loop) > 0.5  # it learned
    grid = bench_q_learning.NumpyGrid(ql, Args())
    q = bench_q_learning.numpy_loop(grid, 100_000)
    assert grid.greedy_optimal(q) == 1.0
    v_error = np.abs(q[0].max(-1) - grid.q_star.max(-1))[grid.scored]
    assert v_error.max() < 1e-3, v_error


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
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--only", "nosuch",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--only" in proc.stderr


RUN_FILES = ("episode.gif", "q_values.png")  # what a run writes into its own directory


def test_readme_and_docs_name_files_that_exist():
    """Every results file the README and docs/ quote (RESULTS.md, MINATAR.md, a plot...) is in
    benchmarks/results/, and every relative link of theirs leads to a file of the repository."""
    results = ROOT / "benchmarks" / "results"
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) >= 2 + 13  # the README, CONTRIBUTING, a page per algorithm and topic
    for page in pages:
        text = page.read_text()
        for name in set(re.findall(r"\b([A-Z][A-Z_]*\.md|[a-z_]+\.(?:png|gif))\b", text)):
            found = [p for p in (results / name, ROOT / name, page.parent / name) if p.exists()]
            assert found or name in RUN_FILES, (page.name, name)
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / link).exists(), (page.name, link)


def test_live_check_reads_the_scalars_ppo_appends_while_it_runs(tmp_path):
    """bench_long_runs.scalar_steps on event files as ppo.py's Tensorboard writes them: the
    hyperparameter table is no scalar, a segment's scalars count once appended, and a record
    still being written (a torn tail) is left for the next read, not an error."""
    import io

    from tensorboard.summary.writer.record_writer import RecordWriter

    import ppo

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_long_runs

    args = validated(ppo, num_seeds=2)
    board = events.Tensorboard(tmp_path, args, np.zeros((1, 0)))
    assert bench_long_runs.scalar_steps(tmp_path) == []
    segment = lambda *steps: {"env_steps": np.array([steps, steps]), "episode_return": np.full(
        (2, len(steps)), 20.0), "loss/value": np.full((2, len(steps)), 0.5)}
    board.write(segment(2048, 4096), {"charts/SPS": [1e5, 1e5]})
    assert sorted(set(bench_long_runs.scalar_steps(tmp_path))) == [2048, 4096]
    torn = io.BytesIO()
    RecordWriter(torn).write(b"x" * 100)
    (path,) = (tmp_path / "seed_0").glob("events.out.tfevents.*")
    with open(path, "ab") as f:
        f.write(torn.getvalue()[:-7])
    assert sorted(set(bench_long_runs.scalar_steps(tmp_path))) == [2048, 4096]


def test_minatar_verdict_and_time_to_target():
    """bench_minatar (its games run only with `run.py --only minatar`): the issue's rule (mean at
    least the target, every seed above half; a seed without episodes misses), and the curve bin
    from which the mean over the seeds held the target to the end (the sustained rule), in steps
    and seconds from launch."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_minatar

    assert bench_minatar.verdict([30, 29, 28, 25], 28) == "met"
    assert bench_minatar.verdict([60, 60, 10, 20], 28) == "not met: worst seed 10 <= 14"
    assert bench_minatar.verdict([20, 20, 20, np.nan], 28).startswith("not met: mean nan < 28")
    result = {"curves": [[[None, 20, 30, 40], [None, 30, 28, 10]]],
              "curve_steps": [100, 200, 300, 400], "launched_at": 1000.0, "run_s": 40.0,
              "returned_at": 1050.0}  # the run started 10 s after the launch
    assert bench_minatar.time_to_target(result, 25) == (200, 30.0)  # the mean: 25, 29, 25
    assert bench_minatar.time_to_target(result, 29) is None  # reached at 300, not held to 400
    assert bench_minatar.time_to_target(result, 30) is None  # each seed did; the mean did not
    assert bench_minatar.time_to_target(result, 41) is None


def test_reached_by_means_held_to_the_end():
    """Every table's "reached by" (common.held_from): from the update after which the score's mean
    over a trailing 5% of updates (NaN, no episode finished, ignored) stays at or above the
    threshold to the end; one lucky update, or a rise that falls back, does not count."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import common

    lucky = np.zeros(100)
    lucky[10] = 10_000.0  # its window's mean is far above for 5 updates, then falls back
    rising = np.r_[np.zeros(50), np.full(50, 500.0)]
    gaps = rising.copy()
    gaps[60::3] = np.nan
    fallen = np.r_[rising[:90], np.zeros(10)]
    never = np.full(100, np.nan)
    first = common.held_from(np.stack([lucky, rising, gaps, fallen, never]), 475.0)
    # window 5: the first whole window of 500s ends at update 54
    np.testing.assert_array_equal(first, [-1, 54, 54, -1, -1])
    np.testing.assert_allclose(common.reach_fraction(rising, 475.0), 0.55)
    # 4 updates, a window of 1: 480 then 300 never held 475; 480, 490 to the end did
    short = [[np.nan, 400, 480, 300], [np.nan, np.nan, 100, 200], [500, 500, 500, 500],
             [np.nan, 300, 480, 490]]
    assert common.reach_fraction(short, 475).tolist() == [0.0, 0.0, 0.25, 0.75]
    assert common.solve_time([3.0, 7.5]) == (7.5, 2)
    assert common.solve_time([3.0, None]) == (None, 1)
