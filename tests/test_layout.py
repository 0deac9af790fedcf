"""The algorithm first: ppo.py, vpg.py and q_learning.py each open with their algorithm, then a
fence line, then the runner, the same in the three files byte for byte. What the runner takes from
the file above it is a short list of named hooks, and nothing above the fence uses the runner."""
import ast
import re

import pytest

import ppo
import q_learning as ql
import vpg
from conftest import ALGOS

FENCE = re.compile(r"^# =+ runner$", re.M)
ABOVE = {"ppo": 400, "vpg": 400, "q_learning": 450}  # the most lines above the fence
HOOKS = ("Hyperparams", "HPARAMS", "resolve", "make_train", "COMPILER_OPTIONS",
         "SCORE", "SHOWN", "model", "Drawing", "draw")


def split(name):
    """(algorithm, runner) of algos/<name>.py: the text above the fence line, and from it on."""
    text = (ALGOS / f"{name}.py").read_text()
    (fence,) = FENCE.finditer(text)  # exactly one fence
    return text[:fence.start()], text[fence.start():]


def test_runners_are_byte_identical():
    runners = {name: split(name)[1] for name in ABOVE}
    assert runners["vpg"] == runners["ppo"]
    assert runners["q_learning"] == runners["ppo"]


@pytest.mark.parametrize("name", ABOVE)
def test_line_budgets(name):
    algorithm, runner = split(name)
    assert algorithm.count("\n") <= ABOVE[name]
    assert runner.count("\n") <= 650 and (algorithm + runner).count("\n") <= 1050
    assert all(len(line) <= 100 for line in (algorithm + runner).splitlines())


def module_names(tree):
    """Names bound at module level: definitions, assignments and imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@pytest.mark.parametrize("name", ABOVE)
def test_nothing_above_the_fence_uses_the_runner(name):
    """Every name the algorithm reads is bound above the fence (or a builtin): the runner's names
    (Args, ArgError, segments, the tensorboard writer...) are not reachable from it."""
    algorithm, runner = split(name)
    tree = ast.parse(algorithm)
    below = module_names(ast.parse(runner)) - module_names(tree)
    names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
    local = {n.id for n in names if isinstance(n.ctx, ast.Store)} | {
        a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
        for a in n.args + n.kwonlyargs + n.posonlyargs}
    read = {n.id for n in names if isinstance(n.ctx, ast.Load)} - local
    assert below and not read & below, read & below
    # And the runner's few inputs from above are the named hooks.
    assert {n for n in HOOKS if re.search(rf"\b{n}\b", runner)} == set(HOOKS)


@pytest.mark.parametrize("module", [ppo, vpg, ql], ids=lambda m: m.__name__)
def test_hooks(module):
    """The hooks have the shapes the runner expects: SCORE ranks by the return or a SHOWN metric,
    Drawing's flags are switches apart from the hyperparameters, a float hyperparameter's rule
    holds for its default value."""
    assert module.SCORE == "episode_return" or module.SCORE in module.SHOWN
    hyperparams = {f.name for f in module.dataclasses.fields(module.Hyperparams)}
    for field in module.dataclasses.fields(module.Drawing):
        assert field.type is bool and field.name not in hyperparams
    assert set(module.HPARAMS) <= {f.name for f in module.dataclasses.fields(module.Hyperparams)}
    args = module.validate(module.Args())
    for name, (_, holds) in module.HPARAMS.items():
        assert all(holds(x) for x in getattr(args, name)), name
