"""Brax tasks (--env-id brax/<name>): every CPU-sized preset of ppo.py, sac.py and td3.py as typed
on held-out seeds, ppo.py beside PureJaxRL's ppo_continuous_action.py on hopper, and sac.py beside
rejax's SAC on inverted_double_pendulum.

    python benchmarks/bench_brax.py [--quick] [--rows ROW,...]   # writes results/BRAX.md
    python benchmarks/bench_brax.py --rows ROW,... --append      # adds a section to it
    python benchmarks/run.py --only brax                         # the same, through run.py

Each invocation's section names its date, commit, machine and load: --append adds one below the
sections already there (a row that takes an hour need not wait for the whole table again), which
stand as they were measured.

(a) Each row of ROWS as typed, `--seed 5000 --num-seeds 8` (held-out seeds, as bench_sac.py), one
process per row with an empty compilation cache (common.run_command): the final training return
(mean over the last 5% of updates; mean over the seeds [95% CI]), the greedy and sampled
evaluations (the file's own, 64 episodes per seed as typed; mean [95% CI] and the worst seed),
the whole process's seconds. The hopper and walker2d rows (8 x 5M Brax steps each) take by far
the longest: --rows picks a subset.
(b) ppo.py beside PureJaxRL (luchris429/purejaxrl, purejaxrl/ppo_continuous_action.py) on
brax/hopper (brax/walker2d when --rows names purejaxrl:brax/walker2d): 4 seeds x 5M steps, the
positional backend, 2048 envs x 10 steps, normalised env, one process each with an empty
compilation cache: whole-process seconds and the final training return. PureJaxRL is not
installed: its checkout's path comes from PUREJAXRL_DIR (the pair is skipped with a line saying
so when it is unset); it runs in this venv, as its authors run it (purejaxrl_worker), navix (in
its requirements.txt, imported by its wrappers.py for a gridworld wrapper alone) replaced by an
empty stand-in where it is not installed.
(c) sac.py beside rejax's SAC (rejax 0.1.3, in the peers' environment: benchmarks/peers.py) on
brax/inverted_double_pendulum, positional backend: sac.py's preset as typed (its own process, 2
seeds: SEEDS_C) and rejax's SAC at the same steps, network, batch and settings (SAC_AS_OURS), 2
seeds in one process (pmap over the 2 cores, bench_sac.py's rejax_worker), an empty compilation
cache: whole-process seconds and each run's final policy on 64 fresh episodes, greedy (the mean
action through rejax's tanh) and sampled (rejax's own act). rejax sees Brax through its own wrapper
(rejax.compat), whose `done` includes the 1000-step limit (no bootstrap there), as under the gymnax
before 1.0 it was written for (rejax_worker says how).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sac  # noqa: E402
import common  # noqa: E402
import peers  # noqa: E402

BASE, SEEDS_A, SEEDS_B = 5000, 8, 4  # the held-out seed base, as bench_sac.py's
# (c): rejax's replay draws a batch weighted without replacement over all 200k slots (a Gumbel
# top-k) each gradient step: 4 seeds x 20k steps ran 83 s (2026-11-28; sac.py's 4 x 200k: ~340 s);
# and with 2 seeds a core its memory grew ~27 MB a second of run, killed for memory before 200k
# steps on 24 GiB (2026-11-28), where one seed a core held 1.4 GB (585 s a process): 2 seeds each.
SEEDS_C = 2
QUICK_SEEDS, QUICK_EVAL_EPISODES = 2, 2
TIMEOUT = 6 * 3600  # a hopper or walker2d row is 8 x 5M Brax steps on 2 cores
SMALL = ["--num-envs", "64", "--total-timesteps", "2560"]  # --quick for a 2048 x 10 preset
# (a): row -> (file, --env-id, its flags under --quick). The CPU-sized presets (PRESETS / BRAX in
# algos/ppo.py, algos/sac.py and algos/td3.py); the others are sized for a GPU and not
# measured here.
ROWS = {
    "ppo:brax/inverted_pendulum": ("ppo", "brax/inverted_pendulum",
                                   ["--total-timesteps", "8192"]),  # 2 updates of 16 x 256
    "ppo:brax/hopper": ("ppo", "brax/hopper", SMALL),
    "ppo:brax/walker2d": ("ppo", "brax/walker2d", SMALL),
    "sac:brax/inverted_pendulum": ("sac", "brax/inverted_pendulum",
                                   ["--total-timesteps", "3000", "--learning-starts", "1000"]),
    "sac:brax/inverted_double_pendulum": ("sac", "brax/inverted_double_pendulum",
                                          ["--total-timesteps", "3000", "--learning-starts",
                                           "1000"]),
    "td3:brax/inverted_pendulum": ("td3", "brax/inverted_pendulum",
                                   ["--total-timesteps", "3000", "--learning-starts", "1000"]),
    "td3:brax/inverted_double_pendulum": ("td3", "brax/inverted_double_pendulum",
                                          ["--total-timesteps", "3000", "--learning-starts",
                                           "1000"]),
}
# (b): row -> Brax env name. walker2d doubles (b)'s hours, so only when --rows names it.
PEER_ROWS = {"purejaxrl:brax/hopper": "hopper", "purejaxrl:brax/walker2d": "walker2d"}
# (c): row -> (a)'s row of sac.py whose preset rejax's SAC runs beside (SAC_AS_OURS).
REJAX_ROWS = {"rejax:brax/inverted_double_pendulum": "sac:brax/inverted_double_pendulum"}
DEFAULT_ROWS = (*ROWS, "purejaxrl:brax/hopper", *REJAX_ROWS)
# PureJaxRL's own configuration: the __main__ block of ppo_continuous_action.py, with 5M steps
# (not 5e7: ppo.py's preset, 2 cores) and DEBUG off (a host callback printing every finished
# episode, which would time the printing).
PUREJAXRL = {"LR": 3e-4, "NUM_ENVS": 2048, "NUM_STEPS": 10, "TOTAL_TIMESTEPS": 5_000_000,
             "UPDATE_EPOCHS": 4, "NUM_MINIBATCHES": 32, "GAMMA": 0.99, "GAE_LAMBDA": 0.95,
             "CLIP_EPS": 0.2, "ENT_COEF": 0.0, "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5,
             "ACTIVATION": "tanh", "ENV_NAME": "hopper", "ANNEAL_LR": False,
             "NORMALIZE_ENV": True, "DEBUG": False}
QUICK_PUREJAXRL = {"NUM_ENVS": 64, "TOTAL_TIMESTEPS": 2560}  # as SMALL
# (c): rejax's SAC at sac.py's BOX preset at 200k steps, as brax/inverted_double_pendulum's without
# its critics' LayerNorm and annealing (rejax has neither; sac.py runs with SAC_FLAGS):
# bench_sac.REJAX (sac.py's Box preset in rejax's terms) with BOX's 5000 random steps first and a
# buffer of the whole run.
SAC_AS_OURS = dict(bench_sac.REJAX, fill_buffer=5_000, buffer_size=200_000)
SAC_FLAGS = ["--critic-layer-norm", "False", "--anneal-lr", "False"]
QUICK_SAC = dict(buffer_size=3_000, fill_buffer=1_000)  # as (a)'s --quick flags


# ----------------------------------------------------------------------------- PureJaxRL worker
def purejaxrl_worker(config: dict) -> dict:
    """PureJaxRL's make_train(config) as its walkthrough runs seeds: jax.jit(jax.vmap(...)) over
    jax.random.split(PRNGKey(seed), seeds), in this process on the devices JAX picks (one CPU
    device). Any failure (its imports under gymnax 1.0 / brax 0.14 included) comes back as
    {"error": ...} for the row: an hour of the other rows is not lost to it."""
    notes = []
    try:
        import brax.envs
        import jax

        folder = Path(config["dir"])
        folder = folder / "purejaxrl" if (folder / "purejaxrl").is_dir() else folder
        sys.path.insert(0, str(folder))  # its files import each other by bare name (wrappers)
        if importlib.util.find_spec("navix") is None:  # in its requirements.txt, not ours
            sys.modules["navix"] = types.ModuleType("navix")  # read only by its gridworld wrapper
            notes.append("navix (imported by its wrappers.py for its gridworld wrapper alone) "
                         "not installed: an empty stand-in module")
        # Older checkouts read brax.envs.wrapper.*, which brax 0.14 keeps in wrappers.training.
        if "envs.wrapper." in (folder / "wrappers.py").read_text() and not hasattr(
                brax.envs, "wrapper"):
            import brax.envs.wrappers.training as training

            brax.envs.wrapper = training  # the same EpisodeWrapper and AutoResetWrapper
            notes.append("brax.envs.wrapper aliased to brax.envs.wrappers.training")
        module = __import__("ppo_continuous_action")
        train = jax.jit(jax.vmap(module.make_train(dict(config["config"]))))
        keys = jax.random.split(jax.random.PRNGKey(config["seed"]), config["seeds"])
        t0 = time.perf_counter()
        compiled = train.lower(keys).compile()
        compile_s, t0 = time.perf_counter() - t0, time.perf_counter()
        metrics = jax.block_until_ready(compiled(keys))["metrics"]
        run_s = time.perf_counter() - t0
        # [seeds, updates, steps, envs]: the mean return of the episodes that ended in the last
        # 5% of updates (ppo.py's window), per seed
        ended = np.asarray(metrics["returned_episode"], bool)
        returns = np.asarray(metrics["returned_episode_returns"], np.float64)
        w = max(1, round(ended.shape[1] * 0.05))
        final = [float(r[-w:][e[-w:]].mean()) if e[-w:].any() else float("nan")
                 for r, e in zip(returns, ended)]
        steps = ended.shape[1] * ended.shape[2] * ended.shape[3]
        return {"final": final, "compile_s": compile_s, "run_s": run_s, "steps": steps,
                "devices": jax.device_count(), "notes": notes}
    except Exception as e:  # reported in the row
        return {"error": last_line(e), "notes": notes}


# ----------------------------------------------------------------------------- running them
def last_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]


def ours(name: str, flags: list[str]) -> dict:
    """`python algos/<name>.py FLAGS --no-track` in its own process, an empty compilation cache;
    no threshold is claimed for these tasks (np.inf: reach times unused). A failure or timeout
    comes back as {"error": ...}."""
    try:
        with tempfile.TemporaryDirectory() as cache:
            return common.run_command(name, flags, np.inf, cache, timeout=TIMEOUT)
    except Exception as e:
        return {"error": last_line(e)}


def command_line(name: str, flags: list[str]) -> str:
    return (f"python algos/{name}.py {' '.join(flags)} --no-track "
            "--compile-cache-dir EMPTY_TEMP_DIR")


def row_flags(row: str, quick: bool, seeds: int = SEEDS_A) -> list[str]:
    """The flags of (a)'s row: its preset as typed on the held-out seeds (--quick: tiny)."""
    _, env_id, quick_flags = ROWS[row]
    flags = ["--env-id", env_id, "--seed", str(BASE), "--num-seeds",
             str(QUICK_SEEDS if quick else seeds)]
    if quick:
        flags += ["--eval-episodes", str(QUICK_EVAL_EPISODES), *quick_flags]
    return flags


def part_a(quick: bool, rows: list[str]) -> list[str]:
    if not rows:
        return []
    table, commands = [], []
    for row in rows:
        name, flags = ROWS[row][0], row_flags(row, quick)
        commands.append(command_line(name, flags))
        r = ours(name, flags)
        print(f"  brax (a) {row}: {r.get('error', 'done')}", flush=True)
        if "error" in r:
            table.append([f"`{name}.py {' '.join(flags)}`", f"failed: {r['error']}",
                          *[""] * 6])
            continue
        final = np.asarray(r["final"][0], np.float64)
        evals = {k: np.asarray(r["evals"][k][0], np.float64) for k in ("greedy", "sampled")}
        table.append([f"`{r['command']}`", f"{r['num_seeds']} x {r['total_timesteps']:,}",
                      f"{r['process_s']:.0f} ({r['compile_s']:.0f} + {r['run_s']:.0f})",
                      common.with_ci(final, spec=".1f"),
                      *(v for k in ("greedy", "sampled")
                        for v in (common.with_ci(evals[k], spec=".1f"), f"{evals[k].min():.1f}"))])
    headers = ["command", "seeds x steps", "whole process s (compile + run)",
               "final training return, mean [95% CI]", "evaluation, greedy", "worst seed",
               "evaluation, sampled", "worst seed"]
    return ["### (a) The CPU-sized Brax presets as typed, on held-out seeds",
            "Commands, each in its own process (run as typed by common.run_command):\n\n"
            + "\n".join(f"    {c}" for c in commands),
            "Final training return: the mean episode return over the last 5% of updates, mean "
            "over the seeds [95% bootstrap CI]. Evaluation: "
            f"{QUICK_EVAL_EPISODES if quick else 64} fresh episodes per seed (1000-step limit) "
            "by the mean action (greedy) and by sampled ones: mean over the seeds [95% CI], and "
            "the worst seed's mean. Backend: positional (the files' default).",
            common.md_table(headers, table)]


def part_b(quick: bool, rows: list[str]) -> list[str]:
    if not rows:
        return []
    seeds = QUICK_SEEDS if quick else SEEDS_B
    text = ["### (b) ppo.py beside PureJaxRL's ppo_continuous_action.py"]
    folder = os.environ.get("PUREJAXRL_DIR")
    if not folder:
        print("  brax (b): skipped, PUREJAXRL_DIR unset", flush=True)
        return [*text, "- skipped: set PUREJAXRL_DIR to a checkout of luchris429/purejaxrl (the "
                       "folder holding purejaxrl/ppo_continuous_action.py) to run this part."]
    table, notes = [], set()
    for row in rows:
        env = PEER_ROWS[row]
        flags = ["--env-id", f"brax/{env}", "--seed", str(BASE), "--num-seeds", str(seeds),
                 "--eval-episodes", "0"]  # PureJaxRL evaluates nothing: time training alone
        config = {**PUREJAXRL, "ENV_NAME": env, **(QUICK_PUREJAXRL if quick else {})}
        if quick:
            flags += SMALL
        r = ours("ppo", flags)
        if "error" in r:
            table.append(["ppo.py", f"`ppo.py {' '.join(flags)}`", f"failed: {r['error']}",
                          "", "", "", ""])
        else:
            table.append(["ppo.py", f"`{r['command']}`",
                          f"{r['num_seeds']} x {r['total_timesteps']:,}", r["devices"],
                          f"{r['process_s']:.0f} ({r['compile_s']:.0f} + {r['run_s']:.0f})",
                          common.with_ci(r["final"][0], spec=".1f"),
                          " ".join(f"{x:.1f}" for x in r["final"][0])])
        call = (f"`jax.jit(jax.vmap(make_train(config)))` over {seeds} keys of "
                f"PRNGKey({BASE}), ENV_NAME {env}, TOTAL_TIMESTEPS {config['TOTAL_TIMESTEPS']:,}"
                f", NUM_ENVS {config['NUM_ENVS']}")
        try:
            with tempfile.TemporaryDirectory() as cache:  # an empty compilation cache, as ours
                t = common.run_worker(Path(__file__), {"dir": folder, "config": config,
                                                       "seed": BASE, "seeds": seeds},
                                      timeout=TIMEOUT, as_user=True,
                                      env={"JAX_COMPILATION_CACHE_DIR": cache})
        except Exception as e:
            t = {"error": last_line(e)}
        notes.update(t.get("notes", []))
        if "error" in t:
            table.append(["PureJaxRL", call, f"failed: {t['error']}", "", "", "", ""])
        else:
            table.append(["PureJaxRL", call, f"{seeds} x {t['steps']:,}", t["devices"],
                          f"{t['process_s']:.0f} ({t['compile_s']:.0f} + {t['run_s']:.0f})",
                          common.with_ci(t["final"], spec=".1f"),
                          " ".join(f"{x:.1f}" for x in t["final"])])
        print(f"  brax (b) {env}: ours {r.get('error', 'done')}, PureJaxRL "
              f"{t.get('error', 'done')}", flush=True)
    headers = ["implementation", "command", "seeds x steps", "XLA devices",
               "whole process s (compile + run)", "final training return, mean [95% CI]",
               "per seed"]
    return [*text,
            "Both: the positional backend, PureJaxRL's configuration (2048 envs x 10 steps, 4 "
            "epochs of 32 minibatches, lr 3e-4, gamma 0.99, GAE 0.95, clip 0.2, hidden 256 tanh, "
            "observations and rewards normalised), one process each from launch to exit with an "
            "empty compilation cache, on the devices each picks itself. PureJaxRL: its "
            f"ppo_continuous_action.py from PUREJAXRL_DIR ({folder}), imported unchanged in this "
            "venv, with the config of its __main__ block but TOTAL_TIMESTEPS and DEBUG off (its "
            "per-episode print callback), run as its walkthrough runs seeds: " + call.split(",")[0]
            + "." + (f" Compatibility: {'; '.join(sorted(notes))}." if notes else ""),
            common.md_table(headers, table),
            "Final training return: the mean return of the episodes that ended in the last 5% of "
            "updates, per seed (ours: the mean over those updates of each update's mean; "
            "PureJaxRL: the mean of `returned_episode_returns` where `returned_episode`), then "
            "mean over the seeds [95% bootstrap CI]. Settings that do not match: PureJaxRL's "
            "Brax wrapper (EpisodeWrapper + AutoResetWrapper, `done` = Brax's done) treats the "
            "1000-step limit as a termination, so its value target does not bootstrap there; "
            "ours truncates apart from the task's termination and bootstraps through the limit. "
            "PureJaxRL keeps lr 3e-4 (ANNEAL_LR False) and clips the value loss; ours anneals "
            "lr to 0 and does not clip it (its preset). Ours runs without its final evaluation "
            "(--eval-episodes 0), as PureJaxRL has none."]


def part_c(quick: bool, rows: list[str]) -> list[str]:
    if not rows:
        return []
    text = ["### (c) sac.py beside rejax's SAC"]
    python = peers.peers_python()
    if not (python and peers.installed(python, "rejax")):
        print("  brax (c): skipped, rejax not installed", flush=True)
        return [*text, "- skipped: rejax runs in the peers' environment (benchmarks/peers.py: "
                       ".venv-peers or PEERS_PYTHON), which is not there."]
    table, seeds = [], QUICK_SEEDS if quick else SEEDS_C
    episodes = QUICK_EVAL_EPISODES if quick else 64
    settings = {**SAC_AS_OURS, **(QUICK_SAC if quick else {})}
    for row in rows:
        name, env_id, _ = ROWS[REJAX_ROWS[row]]
        r = ours(name, [*row_flags(REJAX_ROWS[row], quick, SEEDS_C), *SAC_FLAGS])
        steps = r.get("total_timesteps", 0)
        call = (f"`jax.pmap(jax.vmap(get_algo('sac').create(env={env_id}, **settings).train))` "
                f"over {seeds} keys of PRNGKey({BASE})")
        try:
            with tempfile.TemporaryDirectory() as cache:
                t = common.run_worker(Path(bench_sac.__file__), {
                    "peer": "rejax", "env": env_id, "steps": steps, "seeds": seeds, "seed": BASE,
                    "episodes": episodes, "settings": settings, "time_sampler": False},
                    timeout=TIMEOUT, python=python, as_user=True,
                    env={**peers.PEER_ENV, "JAX_COMPILATION_CACHE_DIR": cache})
        except Exception as e:
            t = {"error": last_line(e)}
        for label, command, result in (("sac.py", f"`{r.get('command')}`", r),
                                        ("rejax", call, t)):
            if "error" in result:
                table.append([label, command, f"failed: {result['error']}", *[""] * 5])
                continue
            evals = result["evals"] if label == "sac.py" else {k: [result[k]] for k in (
                "greedy", "sampled")}
            cells = []
            for kind in ("greedy", "sampled"):
                x = np.asarray(evals[kind][0], np.float64)
                cells += [common.with_ci(x, spec=".1f"), f"{x.min():.1f}"]
            table.append([label, command, f"{seeds} x {steps:,}",
                          f"{result['process_s']:.0f} ({result['compile_s']:.0f} + "
                          f"{result['run_s']:.0f})", *cells])
        print(f"  brax (c) {env_id}: ours {r.get('error', 'done')}, rejax "
              f"{t.get('error', 'done')}", flush=True)
    headers = ["implementation", "command", "seeds x steps",
               "whole process s (compile + training run)", "evaluation, greedy", "worst seed",
               "evaluation, sampled", "worst seed"]
    return [*text,
            "Both: the positional backend, sac.py's preset as typed but with "
            f"{' '.join(SAC_FLAGS)} (its Box preset's critics and constant learning rate); "
            "rejax's SAC (0.1.3, in the peers' environment, through bench_sac.py's worker) with "
            "the same settings (" + ", ".join(f"{k}={v}" for k, v in settings.items())
            + "; rejax's defaults otherwise: no gradient clipping, no observation or reward "
            "normalisation), its seeds in one program (pmap over the 2 cores x vmap), an empty "
            f"compilation cache each. Evaluation: {episodes} fresh episodes per seed of each "
            "run's final policy, by the mean action (greedy) and by sampled ones (rejax: its own "
            "act and evaluate, compiled and run after training, in its process time): mean over "
            "the seeds [95% CI], and the worst seed's mean.",
            common.md_table(headers, table),
            "Settings that do not match: rejax's Brax wrapper ends an episode at the 1000-step "
            "limit with the same `done` as the task's end, so its critics' target does not "
            f"bootstrap there (sac.py's does); its first {settings['fill_buffer']:,} steps act "
            "by its initial policy (sac.py's uniformly at random); it clips the policy's log "
            "std to [-10, 2] (sac.py: a tanh into [-5, 2]); it steps the policy before the "
            "critics, whose target then takes the stepped policy's actions (sac.py: one step of "
            "the three from the same parameters); its replay draws are weighted "
            "without replacement over the buffer (sac.py's uniform); its log-probability leaves "
            "out the action scale's log-determinant (0 here: Brax's actions are in [-1, 1])."]


def run(quick: bool = False, rows: list[str] | None = None, added: bool = False) -> str:
    """This invocation's section of BRAX.md (added: below the sections of earlier ones)."""
    rows = list(DEFAULT_ROWS if rows is None else rows)
    load_start, started = common.load_average(), time.strftime("%Y-%m-%d %H:%M %Z")
    text = [*part_a(quick, [r for r in rows if r in ROWS]),
            *part_b(quick, [r for r in rows if r in PEER_ROWS]),
            *part_c(quick, [r for r in rows if r in REJAX_ROWS])]
    named = "" if rows == list(DEFAULT_ROWS) else f" --rows {','.join(rows)}"
    title = (f"Brax, added by a later invocation: {', '.join(rows)}" if added else
             "Brax: the CPU-sized presets, ppo.py beside PureJaxRL, sac.py beside rejax")
    return "\n\n".join([
        f"## {title}", *([common.machine_header()] if added else []),
        "benchmarks/bench_brax.py (`python benchmarks/bench_brax.py" + (" --quick" if quick else "")
        + named + (" --append" if added else "") + "`" + ("" if added else
                                                          ", or `python benchmarks/run.py --only "
                                                          "brax`")
        + f"), started {started}, commit {common.code_version()}. Load average (1, 5, 15 min) "
        f"at the start: {load_start}" + (". Quick: tiny budgets, the pipeline, not the "
                                          "algorithms." if quick else "."),
        *text, f"Load average at the end: {common.load_average()}."])


if __name__ == "__main__":
    if not common.worker_entry(purejaxrl_worker):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--quick", action="store_true",
                            help="2 seeds, tiny budgets (2048-env presets: 64 envs): the pipeline")
        parser.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                            help=f"comma list out of {','.join([*ROWS, *PEER_ROWS, *REJAX_ROWS])}")
        parser.add_argument("--append", action="store_true",
                            help="add this invocation's section below BRAX.md's (else: rewrite it)")
        opts = parser.parse_args()
        chosen = [r.strip() for r in opts.rows.split(",") if r.strip()]
        if unknown := sorted(set(chosen) - set(ROWS) - set(PEER_ROWS) - set(REJAX_ROWS)):
            parser.error(f"--rows: unknown {', '.join(unknown)} "
                         f"(choose from {', '.join([*ROWS, *PEER_ROWS, *REJAX_ROWS])})")
        path = common.RESULTS / "BRAX.md"
        if opts.append and not path.exists():
            parser.error(f"--append: there is no {path} to add to")
        before = path.read_text().rstrip("\n") + "\n\n" if opts.append else ""
        report = (before if opts.append else common.machine_header() + "\n\n") + run(
            opts.quick, chosen, added=opts.append)
        common.RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(report + "\n")
        print(report[len(before):])
