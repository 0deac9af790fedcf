"""Our PPO beside PureJaxRL's on whatever device JAX sees (made for one GPU), each command in its
own process, one after the other: the whole process's wall time and the compile / run split that
each prints, on the same env-step budget and number of seeds.

    python benchmarks/bench_gpu.py --purejaxrl DIR [--out FILE] [--quick] [--all-minatar]

DIR holds PureJaxRL's PPO adapted to gymnax 1.0 and given a command line (kept out of this
repository; see PEER_FILES): ppo.py (purejaxrl/ppo.py, CartPole-v1) and ppo_minatar.py (the MinAtar
configuration of examples/brax_minatar.ipynb), each taking --env-id --num-envs --num-seeds
--total-timesteps (and optional overrides of PureJaxRL's config keys), vmapping PureJaxRL's
train over the seeds, and printing "compile X s  run Y s" like our summary does. Without DIR the
peers are skipped with a line saying so. Rows:
- (a) `ppo.py --num-envs 2048` and PureJaxRL's CartPole PPO with 2048 envs, otherwise its own
  config (128 steps per env and update), at our seeds and budget per seed;
- (b) `ppo.py --num-seeds 64` and PureJaxRL's CartPole PPO on 64 vmapped seeds, given the nearest
  equivalents of our resolved flags (the summary's `flags:` line; differences listed under the
  table);
- (c) `ppo.py --env-id Breakout-MinAtar` and the MinAtar notebook's config on the same game, seeds
  and steps (--all-minatar: the other four games of our MinAtar preset as well).
Our commands also get --no-track, a temporary --log-dir and an empty --compile-cache-dir (cold
compile, as on a new machine). Each process has a time limit (--timeout) and the whole run a
budget (--budget-s): a command that would start past it is skipped, so a hang costs one limit. The
table is rewritten after every process (FILE; the processes' output goes to FILE with .log in
place of .md, the rows to .json). --quick: tiny budgets, to check the pipeline on a CPU
(JAX_PLATFORMS=cpu). --only a,b,c picks rows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_FILES = {"cartpole": "ppo.py", "minatar": "ppo_minatar.py"}
VERSIONS = ("jaxlib", "flax", "optax", "chex", "distrax", "gymnax", "numpy")  # in the header
DEFAULT_PEERS = ROOT / ".peers" / "purejaxrl"
MINATAR = ("Breakout-MinAtar", "SpaceInvaders-MinAtar", "Asterix-MinAtar", "Freeway-MinAtar",
           "Seaquest-MinAtar")
# --quick: flags added to ours (tiny budgets, few seeds) per row group; (a)'s is one batch of
# PureJaxRL's (2048 envs x 128 steps).
QUICK = {"a": ["--num-seeds", "2", "--total-timesteps", "262144", "--eval-episodes", "4"],
         "b": ["--num-seeds", "4", "--total-timesteps", "16384", "--eval-episodes", "4"],
         "c": ["--num-seeds", "2", "--total-timesteps", "32768", "--eval-episodes", "4"]}
# Guesses for the duration estimate printed first (seconds): per process, start-up and compile;
# then steps per second over all seeds. Replace them with what a run measured.
GUESS = {"gpu": {"start": 35.0, "CartPole-v1": 3e6, "MinAtar": 8e5},
         "cpu": {"start": 15.0, "CartPole-v1": 3e5, "MinAtar": 8e4}}

SUMMARY = re.compile(r"mean (?P<mean>\S+)\s+min (?P<min>\S+)\s+\|\s+(?P<devices>\d+) device\(s\)"
                     r"\s+compile (?P<compile>[\d.]+) s(?P<cache> \(cache\))?\s+run (?P<run>[\d.]+)"
                     r" s\s+\|\s+(?P<sps>[\d,]+) steps/s")
SIZE = re.compile(r"(?P<seeds>\d+) seeds x (?P<steps>[\d,]+) steps")
SHAPE = re.compile(r"(?P<envs>\d+) envs x (?P<num_steps>\d+) steps x (?P<updates>\d+) updates")


# ----------------------------------------------------------------------------- running one
def device() -> dict:
    """What JAX sees, asked in a child process: this one must not hold the GPU (JAX would take
    most of its memory for the processes measured)."""
    code = f"""if True:
        import json
        from importlib import metadata
        import jax
        def version(name):
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                return "none"
        d = jax.devices()
        print(json.dumps({{"kind": d[0].device_kind, "platform": d[0].platform, "count": len(d),
                          "jax": jax.__version__,
                          "versions": " ".join(f"{{p}} {{version(p)}}" for p in {VERSIONS!r})}}))"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError):
        return {"kind": "unknown (jax did not answer)", "platform": "unknown", "count": 0,
                "jax": "?", "versions": "?"}


def run_process(argv: list[str], timeout: float, log) -> dict:
    """Run argv in its own process group; its output goes to `log` line by line as it comes.
    Returns the output, the exit status (None: killed at the time limit) and the wall time."""
    log.write(f"\n$ {shlex.join(argv)}\n")
    log.flush()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True)
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            log.write(line)
            log.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the group this call started, and nothing else
        proc.wait()
        rc = None
    wall = time.perf_counter() - t0
    reader.join(timeout=10)
    log.write(f"[exit {rc}, {wall:.1f} s]\n")
    log.flush()
    return {"output": "".join(lines), "rc": rc, "process_s": wall}


def parse(output: str) -> dict:
    """The numbers of our summary, or of the peer's lines printed in the same shape."""
    r = {}
    if m := SIZE.search(output):
        r.update(seeds=int(m["seeds"]), steps=int(m["steps"].replace(",", "")))
    if m := SUMMARY.search(output):
        r.update(mean=float(m["mean"]), min=float(m["min"]), devices=int(m["devices"]),
                 compile_s=float(m["compile"]), cached=bool(m["cache"]), run_s=float(m["run"]),
                 sps=float(m["sps"].replace(",", "")))
    if m := SHAPE.search(output):
        r.update({k: int(v) for k, v in m.groupdict().items()})
    flags = next((line[len("flags: "):] for line in output.splitlines()
                  if line.startswith("flags: ")), None)
    if flags:
        r["flags"] = dict(item.split("=", 1) for item in flags.split() if "=" in item)
    return r


def resolved(flags: list[str]) -> dict:
    """Ours' resolved flags for `flags` without training (the runner's validate of ppo.py's
    command line, in a child process), in the shape parse() reads from a summary: for a peer whose
    ours failed."""
    code = f"""if True:
        import dataclasses, json, sys
        sys.path.insert(0, "algos")
        import ppo
        from runner.flags import args_class, parse, validate
        args = validate(parse(args_class(ppo), {flags!r}))
        one = lambda v: v[0] if isinstance(v, tuple) and len(v) == 1 else v
        print(json.dumps({{"seeds": args.num_seeds, "flags": {{
            k: str(one(v)) for k, v in vars(args).items() if k in
            {{f.name for f in dataclasses.fields(ppo.Hyperparams)}}}}}}))"""
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError):
        return {}


# ----------------------------------------------------------------------------- the rows
def ours_argv(flags: list[str], scratch: Path) -> list[str]:
    log_dir = tempfile.mkdtemp(dir=scratch, prefix="runs-")
    cache = tempfile.mkdtemp(dir=scratch, prefix="cache-")  # empty: a cold compile
    return [sys.executable, "algos/ppo.py", *flags, "--no-track", "--log-dir", log_dir,
            "--compile-cache-dir", cache]


def peer_argv(peers: Path, kind: str, env_id: str, envs: int, seeds: int, steps: int,
              extra: list[str] = ()) -> list[str]:
    return [sys.executable, str(peers / PEER_FILES[kind]), "--env-id", env_id, "--num-envs",
            str(envs), "--num-seeds", str(seeds), "--total-timesteps", str(steps), *extra]


def equivalents(flags: dict) -> tuple[list[str], list[str]]:
    """Our resolved flags -> PureJaxRL's nearest overrides, and what still differs."""
    extra = ["--num-steps", flags["num_steps"], "--num-minibatches", flags["num_minibatches"],
             "--update-epochs", flags["update_epochs"], "--lr", flags["learning_rate"],
             "--gamma", flags["gamma"], "--gae-lambda", flags["gae_lambda"],
             "--clip-eps", flags["clip_coef"], "--ent-coef", flags["ent_coef"],
             "--vf-coef", flags["vf_coef"], "--max-grad-norm", flags["max_grad_norm"],
             "--activation", flags["activation"],
             "--anneal-lr" if flags["anneal_lr"] == "True" else "--no-anneal-lr"]
    differ = []
    if flags.get("clip_vloss") != "True":
        differ.append("PureJaxRL clips the value loss (ours: clip_vloss=False)")
    if flags.get("hidden_size") != "64" or flags.get("network") != "mlp":
        differ.append(f"PureJaxRL's network is 2 x 64 MLPs (ours: {flags.get('network')}, "
                      f"hidden_size={flags.get('hidden_size')})")
    for k in ("normalize_obs", "normalize_reward"):
        if flags.get(k) == "True":
            differ.append(f"PureJaxRL has no {k} (ours: True)")
    return extra, differ


COMMON_DIFFERENCES = [
    "PureJaxRL's learning rate anneals once per update (its count // (minibatches x epochs)); "
    "ours linearly over every gradient step.",
    "PureJaxRL's GAE stops at every done (terminated or truncated) and never bootstraps through "
    "a time limit; ours bootstraps truncated steps from the true final observation.",
    "Ours runs its program in 10 segments, bringing each segment's metrics to the host and "
    "writing a checkpoint after each (inside its run s), and evaluates every seed on "
    "--eval-episodes (64) greedy and as many sampled episodes after training (in its process s, "
    "not its run s); PureJaxRL's is one call whose per-step metrics stay on the device until it "
    "returns (taken afterwards, outside its run s).",
    "Final return, both: per seed, the mean return of the episodes that ended in the last 5% of "
    "updates (PureJaxRL's from its LogWrapper info); the column shows the mean over seeds and the "
    "worst seed.",
]


def plan(args) -> list[dict]:
    """The rows to run, in order. A peer's row reads its numbers from ours (run first) when
    `after` is set: seeds and budget per seed, and for (b) our resolved flags."""
    rows = []

    def quick(group):  # the flags --quick adds
        return QUICK[group] if args.quick else []
    if "a" in args.only:
        rows += [{"group": "a", "who": "ours", "flags": ["--num-envs", "2048", *quick("a")]},
                 {"group": "a", "who": "purejaxrl", "kind": "cartpole", "after": "match"}]
    if "b" in args.only:
        seeds = [] if args.quick else ["--num-seeds", "64"]  # --quick: QUICK's 4
        rows += [{"group": "b", "who": "ours", "flags": [*seeds, *quick("b")]},
                 {"group": "b", "who": "purejaxrl", "kind": "cartpole", "after": "equivalents"}]
    if "c" in args.only:
        for game in MINATAR if args.all_minatar else MINATAR[:1]:
            group = "c" if game == MINATAR[0] else f"c/{game.split('-')[0]}"
            rows += [{"group": group, "who": "ours", "flags": ["--env-id", game, *quick("c")]},
                     {"group": group, "who": "purejaxrl", "kind": "minatar", "after": "match"}]
    return rows


def budget_of(row: dict) -> tuple[str, int, int]:
    """(env id, seeds, steps per seed) that ours resolves to, for the duration estimate."""
    flags = row["flags"]
    get = lambda name, default: flags[flags.index(name) + 1] if name in flags else default  # noqa
    env_id = get("--env-id", "CartPole-v1")
    default = 3_000_000 if env_id.endswith("MinAtar") else (
        1_536_000 if get("--num-envs", "32") == "2048" else 300_000)
    return env_id, int(get("--num-seeds", "4")), int(get("--total-timesteps", default))


def estimate(rows: list[dict], platform: str) -> float:
    guess = GUESS["gpu" if platform == "gpu" else "cpu"]
    total = 0.0
    for row in rows:
        if row["who"] != "ours":
            continue
        env_id, seeds, steps = budget_of(row)
        sps = guess["MinAtar" if env_id.endswith("MinAtar") else "CartPole-v1"]
        total += 2 * (guess["start"] + seeds * steps / sps)  # ours and the peer, alike
    return total


# ----------------------------------------------------------------------------- the table
def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def table(results: list[dict], dev: dict, notes: list[str]) -> str:
    head = (f"Device: {dev['kind']} ({dev['platform']}, {dev['count']} device(s) seen), "
            f"jax {dev['jax']} ({dev['versions']}), Python {sys.version.split()[0]}, "
            f"{time.strftime('%Y-%m-%d %H:%M')}")
    lines = [head, "",
             "| row | command | devices | seeds x steps | process s | compile s | run s | "
             "steps/s | final return (mean, worst seed) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        p = r.get("parsed", {})
        size = (f"{p['seeds']} x {p['steps']:,}" if "seeds" in p else "n/a")
        status = "" if r["rc"] == 0 else (" (timed out)" if r["rc"] is None
                                          else f" (exit {r['rc']})")
        lines.append(
            f"| {r['group']} | `{r['shown']}`{status} | {p.get('devices', 'n/a')} | {size} | "
            f"{r['process_s']:.1f} | "
            f"{fmt(p.get('compile_s'))}{' (cache)' if p.get('cached') else ''} | "
            f"{fmt(p.get('run_s'))} | {fmt(p.get('sps'), ',.0f')} | "
            f"{fmt(p.get('mean'), '.4g')}, {fmt(p.get('min'), '.4g')} |")
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])) + "\n"


def shown(argv: list[str], peers: Path | None) -> str:
    """The command as a reader would type it: ours without the bookkeeping flags."""
    args = argv[1:]
    if args and args[0] == "algos/ppo.py":
        return "ppo.py " + " ".join(args[1:args.index("--log-dir")])  # as far as --no-track
    name = Path(args[0]).name
    return f"purejaxrl/{name} " + " ".join(args[1:])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--purejaxrl", type=Path, default=DEFAULT_PEERS if DEFAULT_PEERS.is_dir()
                   else None, help="folder of the PureJaxRL entry points (default: .peers/"
                   "purejaxrl if present)")
    p.add_argument("--out", type=Path, default=None, help="write the markdown table here")
    p.add_argument("--quick", action="store_true", help="tiny budgets (a pipeline check)")
    p.add_argument("--all-minatar", action="store_true", help="(c) on all five MinAtar games")
    p.add_argument("--only", default="a,b,c", help="row groups to run: a, b, c")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per process")
    p.add_argument("--budget-s", type=float, default=None,
                   help="the whole run's seconds: later processes get what is left, or skip")
    args = p.parse_args()
    args.only = set(args.only.split(","))
    start = time.perf_counter()
    deadline = start + args.budget_s if args.budget_s else None
    dev = device()
    print(f"device: {dev['kind']} ({dev['platform']} x {dev['count']}), jax {dev['jax']}, "
          f"{dev['versions']} [{time.perf_counter() - start:.1f} s]", flush=True)
    rows = plan(args)
    peers = args.purejaxrl
    notes = []
    if peers is None or not all((peers / f).is_file() for f in PEER_FILES.values()):
        notes.append(f"PureJaxRL skipped: no {' and '.join(PEER_FILES.values())} in "
                     f"{peers or '--purejaxrl (not given)'}")
        rows = [r for r in rows if r["who"] == "ours"]
    expected = estimate(rows, dev["platform"])
    print(f"{len(rows)} processes; expected about {expected / 60:.1f} min on this "
          f"{dev['platform']} (a guess: {GUESS['gpu' if dev['platform'] == 'gpu' else 'cpu']})"
          + (f"; budget {args.budget_s:.0f} s" if deadline else ""), flush=True)
    out = args.out
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.with_suffix(".log") if out else Path(os.devnull)
    results, last_ours = [], {}
    differences = {}
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as scratch, open(log_path, "w") as log:
        scratch = Path(scratch)
        for row in rows:
            left = deadline - time.perf_counter() if deadline else float("inf")
            if left < 20:
                notes.append(f"({row['group']}) {row['who']} not run: the budget was spent")
                continue
            timeout = min(args.timeout, left)
            if row["who"] == "ours":
                argv = ours_argv(row["flags"], scratch)
                env_id = row["flags"][row["flags"].index("--env-id") + 1] \
                    if "--env-id" in row["flags"] else "CartPole-v1"
                last_ours[row["group"]] = {"env_id": env_id, "argv_flags": row["flags"]}
            else:
                o = last_ours.get(row["group"], {})
                if o and (not o.get("flags") or "seeds" not in o):  # ours failed: its resolve
                    o.update(resolved(o["argv_flags"]))
                    notes.append(f"({row['group']}) ours printed no summary: PureJaxRL's "
                                 "seeds, budget and flags come from ppo.py's resolve")
                flags = o.get("flags")
                if not flags or "seeds" not in o:
                    notes.append(f"({row['group']}) PureJaxRL not run: no seeds and budget "
                                 "from ours")
                    continue
                env_id = (row["kind"] == "minatar" and o["env_id"]) or "CartPole-v1"
                extra = []
                if row["after"] == "equivalents":
                    extra, differ = equivalents(flags)
                    differences[row["group"]] = differ
                argv = peer_argv(peers, row["kind"], env_id, int(flags["num_envs"]),
                                 int(o["seeds"]), int(flags["total_timesteps"]), extra)
            r = run_process(argv, timeout, log)
            r.update(group=row["group"], who=row["who"], argv=argv, shown=shown(argv, peers),
                     parsed=parse(r["output"]))
            if row["who"] == "ours":
                last_ours[row["group"]].update({k: v for k, v in r["parsed"].items()
                                                if k in ("flags", "seeds")})
            pr = r["parsed"]
            status = "" if r["rc"] == 0 else (
                "  [timed out]" if r["rc"] is None else f"  [exit {r['rc']}]")
            print(f"({r['group']}) {r['shown']}: process {r['process_s']:.1f} s, compile "
                  f"{fmt(pr.get('compile_s'))} s, run {fmt(pr.get('run_s'))} s, "
                  f"{fmt(pr.get('sps'), ',.0f')} steps/s, final {fmt(pr.get('mean'), '.4g')}"
                  f"{status}", flush=True)
            if r["rc"] != 0:  # the end of what it said, here too
                print("    " + "\n    ".join(r["output"].rstrip().splitlines()[-15:]), flush=True)
            results.append(r)
            if out:
                write(out, results, dev, notes + row_notes(results, differences, last_ours))
    text = table(results, dev, notes + row_notes(results, differences, last_ours))
    print("\n" + text)
    print(f"total {time.perf_counter() - start:.0f} s (expected about {expected:.0f} s)")
    if out:
        write(out, results, dev, notes + row_notes(results, differences, last_ours))


def row_notes(results: list[dict], differences: dict, ours: dict) -> list[str]:
    """What differs between each pair of rows, from what the processes printed (ours: the
    group's resolved flags)."""
    notes = []
    by = {(r["group"], r["who"]): r["parsed"] for r in results}
    for group in dict.fromkeys(r["group"] for r in results):
        peer = by.get((group, "purejaxrl"), {})
        f = ours.get(group, {}).get("flags", {})
        if not peer:
            continue
        batches = (f"ours {f.get('num_envs')} envs x {f.get('num_steps')} steps per update, "
                   f"{f.get('num_minibatches')} minibatches x {f.get('update_epochs')} epochs; "
                   f"PureJaxRL {peer.get('envs')} envs x {peer.get('num_steps')} steps x "
                   f"{peer.get('updates')} updates")
        if group == "a":
            notes.append(f"(a) PureJaxRL keeps its own CartPole config but for the env count "
                         f"(lr 2.5e-4, clip 0.2, 4 minibatches x 4 epochs, value clipping; "
                         f"ours: lr {f.get('learning_rate')}, clip {f.get('clip_coef')}): "
                         f"{batches}.")
        elif group == "b":
            notes.append(f"(b) PureJaxRL given our resolved flags: {batches}. Still different: "
                         + "; ".join(differences.get("b", []) or ["nothing else"]) + ".")
        else:
            notes.append(f"({group}) the notebook's config (lr 5e-3, 64 envs x 128 steps, 8 "
                         f"minibatches x 4 epochs, relu 2 x 64, value clipping; its 1e7 steps "
                         f"replaced by ours): {batches}.")
    return notes + (COMMON_DIFFERENCES if any(r["who"] == "purejaxrl" for r in results) else [])


def write(out: Path, results: list[dict], dev: dict, notes: list[str]):
    out.write_text(table(results, dev, notes))
    out.with_suffix(".json").write_text(json.dumps(
        {"device": dev, "rows": [{k: v for k, v in r.items() if k != "output"}
                                 for r in results]}, indent=1))


if __name__ == "__main__":
    main()
