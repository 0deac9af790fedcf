"""Reproduce every benchmark table the README shows, with one command.

    python benchmarks/run.py            # the full run (about an hour on 2 cores)
    python benchmarks/run.py --quick    # a few minutes: same tables, tiny budgets
    python benchmarks/run.py --only ppo,vpg,q_learning,is_eval
    python benchmarks/run.py --peers    # add the reference implementations (own requirements)
    python benchmarks/run.py --only envs  # every gymnax env, PPO and VPG beside a random policy

Writes RESULTS.md (all tables, machine header first) and the PNGs into --out
(default benchmarks/results/). A full run into the default folder also refreshes the block of
README.md between the results markers, so the README always shows the latest full results.
The envs section (well over an hour on 2 cores) runs only when --only names it, and writes its
table to ENVS.md in the same folder, never to RESULTS.md nor the README."""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SECTIONS = {  # selector -> (module, the algorithms it covers)
    "rl": ("bench_rl", ("ppo", "vpg")),
    "q_learning": ("bench_q_learning", ("q_learning",)),
    "is_eval": ("bench_is_eval", ("is_eval",)),
    "envs": ("bench_envs", ("envs",)),
}
ALL = ("ppo", "vpg", "q_learning", "is_eval")  # the default run
OPTIONAL = ("envs",)  # run only when --only names them; written to <NAME>.md
README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks the pipeline")
    parser.add_argument("--only", default=",".join(ALL),
                        help=f"comma list out of {','.join(ALL + OPTIONAL)}")
    parser.add_argument("--peers", action="store_true",
                        help="also run reference implementations "
                             "(benchmarks/requirements-peers.txt)")
    parser.add_argument("--out", type=Path, default=common.RESULTS, help="output folder")
    opts = parser.parse_args(argv)
    selected = [name.strip() for name in opts.only.split(",") if name.strip()]
    unknown = sorted(set(selected) - set(ALL + OPTIONAL))
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)} "
                     f"(choose from {', '.join(ALL + OPTIONAL)})")

    opts.out.mkdir(parents=True, exist_ok=True)
    common.RESULTS = opts.out
    t0 = time.time()
    mode = ("quick (tiny budgets: numbers check the pipeline, not the algorithms)" if opts.quick
            else "full")
    only = "" if opts.only == ",".join(ALL) else f" --only {opts.only}"
    header = [common.machine_header(),
              f"Produced by `python benchmarks/run.py{' --quick' if opts.quick else ''}{only}"
              f"{' --peers' if opts.peers else ''}` ({mode}), {time.strftime('%Y-%m-%d')}."]
    for name in OPTIONAL:
        if name in selected:
            module_name = SECTIONS[name][0]
            print(f"running {module_name} ...", flush=True)
            t_section = time.time()
            text = "\n\n".join([*header, __import__(module_name).run(opts.quick),
                                 f"Section time: {time.time() - t_section:.0f} s."]) + "\n"
            (opts.out / f"{name.upper()}.md").write_text(text)
            print(text)
    if not set(selected) & set(ALL):
        return
    parts = ["# Benchmark results", *header]
    for module_name, algos in SECTIONS.values():
        chosen = [a for a in algos if a in selected and a in ALL]
        if not chosen:
            continue
        print(f"running {module_name} for {', '.join(chosen)} ...", flush=True)
        module = __import__(module_name)
        text = (module.run(opts.quick, chosen) if module_name == "bench_rl"
                else module.run(opts.quick))
        parts.append(text)
    if opts.peers:
        import peers
        parts.append(peers.run(opts.quick, selected))
    parts.append(f"Total benchmark time: {time.time() - t0:.0f} s.")
    report = "\n\n".join(parts) + "\n"
    (opts.out / "RESULTS.md").write_text(report)
    print(report)
    if not opts.quick and opts.out.resolve() == (common.ROOT / "benchmarks" / "results").resolve():
        update_readme(report)


def readme_block(report: str) -> str:
    """RESULTS.md as the README shows it: no title, image links relative to the repository root."""
    return report.replace("](", "](benchmarks/results/").replace("# Benchmark results\n\n", "")


def update_readme(report: str):
    readme = common.ROOT / "README.md"
    text = readme.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    readme.write_text(text[:start] + "\n" + readme_block(report) + text[end:])


if __name__ == "__main__":
    main()
