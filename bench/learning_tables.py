"""The learning protocol's tables for docs/performance.md, and its plot, from its results file.

Reads bench/results/learning-protocol.json (or FILE), computes the summary as `bench/learning.py
--report` does (the same statistics, the same resamples) and prints three markdown tables:
  - the mean return over seeds with its 95 % interval, per environment, algorithm and milestone, with
    the IQM (and its interval) at 100 % of the stored steps and at 100k needed interactions;
  - P(aesrl > X) with its interval, per environment, X and milestone, and the call the interval makes
    (ahead, level, behind) once both sides have all the seeds the protocol declares (before that,
    "(k v m)": the runs each side has, and no call);
  - the calls at 100 % of the stored steps and at 100k needed interactions, per environment: `aesrl`'s
    mean with its interval and the algorithms it is ahead of, level with and behind, each comparison
    called only once both sides have all their declared seeds ("not yet" lists the others);
  - the compute: cells run and pending, crashes, hours.
It writes nothing to the results file. `--plot PNG` draws each environment's mean with its interval
at 25/50/100 % of the stored steps and at 25k/50k/100k needed interactions (needs matplotlib);
`--doc MD` puts the tables into MD between the lines `<!-- protocol tables -->` and
`<!-- end protocol tables -->` (docs/performance.md's Results), replacing what was there; for another
protocol's file, its own lines (learning-protocol-v2.json: `<!-- protocol v2 tables -->` ...).

    python bench/learning_tables.py [FILE] [--plot docs/img/learning-protocol.png] [--doc docs/performance.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.learning import RESULTS, load, protocol_cells, summarise  # noqa: E402

STEPS, INTERACTIONS = ("25", "50", "100"), ("i25k", "i50k", "i100k")
def marks(file: Path) -> tuple[str, str]:
    """The lines of a doc that a protocol's tables go between, named after its results file."""
    name = file.stem.removeprefix("learning-").replace("-", " ") + " tables"
    return f"<!-- {name} -->", f"<!-- end {name} -->"

SHORT = {"HalfCheetah-v5": "HalfCheetah", "Hopper-v5": "Hopper", "Walker2d-v5": "Walker2d", "Ant-v5": "Ant"}


def num(x: float) -> str:
    """A return as the docs write it: thousands apart by a space, a true minus sign."""
    return f"{x:,.0f}".replace(",", " ").replace("-", "−")


def stat(s: list[float] | None) -> str:
    if s is None:
        return ""
    return num(s[0]) + (f" [{num(s[1])}, {num(s[2])}]" if math.isfinite(s[1]) else "")


def env_name(env: str, protocol: dict) -> str:
    return SHORT.get(env, env) + (" (held out)" if env in protocol["held_out"] else "")


def returns_table(summary: dict, protocol: dict) -> str:
    head = ["env", "algo", "n", *STEPS, "IQM 100", *INTERACTIONS, "IQM i100k"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for env, marks in summary.items():
        name = env_name(env, protocol)
        for algo in protocol["seeds"]:
            cells = {k: marks[k]["algos"].get(algo) for k in marks}
            if not any(cells.values()):
                continue
            n = max(c["n"] for c in cells.values() if c)
            row = [name, algo, str(n)]
            for group, last in ((STEPS, "100"), (INTERACTIONS, "i100k")):
                row += [stat(cells[k]["mean"]) if cells.get(k) else "" for k in group]
                row.append(stat(cells[last]["iqm"]) if cells.get(last) else "")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def all_seeds(cell: dict, other: str, protocol: dict) -> bool:
    """Both sides of P(aesrl > other) at this milestone have every seed the protocol declares: only then
    is the difference called. With fewer, a percentile interval of 2 runs against 2 is [1, 1] whenever
    they separate (1 time in 6)."""
    return all(cell["algos"][a]["n"] == len(protocol["seeds"][a]) for a in ("aesrl", other))


def improvement_table(summary: dict, protocol: dict) -> str:
    head = ["env", "P(aesrl > X)", *STEPS, *INTERACTIONS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for env, marks in summary.items():
        name = env_name(env, protocol)
        others = dict.fromkeys(x for k in marks for x in marks[k]["vs"])
        for other in others:
            row = [name, other]
            for k in (*STEPS, *INTERACTIONS):
                v = marks.get(k, {}).get("vs", {}).get(other)
                if v is None:
                    row.append("")
                    continue
                p = f"{v['p'][0]:.2f}" + (f" [{v['p'][1]:.2f}, {v['p'][2]:.2f}]" if math.isfinite(v["p"][1]) else "")
                ns = [marks[k]["algos"][a]["n"] for a in ("aesrl", other)]
                row.append(f"{p} {v['verdict']}" if all_seeds(marks[k], other, protocol) else f"{p} ({ns[0]} v {ns[1]})")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def calls_table(summary: dict, protocol: dict) -> str:
    """What the intervals call, and nothing more: the table the README quotes."""
    head = ["env", "at", "aesrl", "ahead of", "level with", "behind", "not yet"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---|---|---|---|"]
    for env, marks in summary.items():
        for key, at in (("100", "100 % stored steps"), ("i100k", "100k interactions")):
            cell = marks.get(key)
            if not cell or "aesrl" not in cell["algos"]:
                continue
            calls: dict[str, list[str]] = {"ahead": [], "level": [], "behind": [], "not yet": []}
            for other, v in cell["vs"].items():
                calls[v["verdict"] if all_seeds(cell, other, protocol) else "not yet"].append(other)
            lines.append("| " + " | ".join([env_name(env, protocol), at, stat(cell["algos"]["aesrl"]["mean"]),
                                             *(", ".join(calls[c]) for c in calls)]) + " |")
    return "\n".join(lines)


def compute_line(data: dict) -> str:
    rows, protocol = data["rows"], data["protocol"]
    done = {(r["env"], r["algo"], r["seed"]) for r in rows}
    cells = protocol_cells(protocol)
    hours = sum(r["wall_s"] for r in rows) / 3600
    return (f"{len(done)} of {len(cells)} cells recorded, {len(cells) - len(done)} pending, "
            f"{len(data['crashes'])} crashes, {hours:.1f} h of cells, commit {protocol['commit'][:7]}")


def plot(summary: dict, protocol: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(summary)
    fig, axes = plt.subplots(2, len(envs), figsize=(4.2 * len(envs), 6.4), squeeze=False)
    for col, env in enumerate(envs):
        for row, (group, xs, label) in enumerate(((STEPS, (25, 50, 100), "stored steps (k)"),
                                                  (INTERACTIONS, (25, 50, 100), "needed interactions (k)"))):
            ax = axes[row][col]
            for algo in protocol["seeds"]:
                pts = [(x, summary[env][k]["algos"][algo]) for x, k in zip(xs, group, strict=True)
                       if k in summary[env] and algo in summary[env][k]["algos"]]
                if not pts:
                    continue
                x = [p[0] for p in pts]
                mean = [p[1]["mean"] for p in pts]
                line, = ax.plot(x, [m[0] for m in mean], marker="o", label=algo)
                lo = [m[1] if math.isfinite(m[1]) else m[0] for m in mean]
                hi = [m[2] if math.isfinite(m[2]) else m[0] for m in mean]
                ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.15)
            ax.set_title(env_name(env, protocol), fontsize=10)
            ax.set_xlabel(label)
            ax.set_xticks(xs)
            if col == 0:
                ax.set_ylabel("mean return, 10 fixed starts")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Learning protocol: mean over seeds with 95 % bootstrap interval (runs per cell: the "
                 "tables)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", type=Path, default=RESULTS / "learning-protocol.json",
                    help="the protocol's results file (default bench/results/learning-protocol.json)")
    ap.add_argument("--plot", type=Path, metavar="PNG", help="also draw the means with their intervals here")
    ap.add_argument("--doc", type=Path, metavar="MD", help="also put the tables into MD between its marker lines")
    a = ap.parse_args(argv)
    if not a.file.is_file():
        ap.error(f"{a.file}: no such results file")
    data = load(a.file)
    if data.get("protocol") is None:
        ap.error(f"{a.file}: declares no protocol (bench/learning.py --declare COMMIT)")
    summary = summarise(data["rows"], data["protocol"])
    text = (compute_line(data) + ".\n\n" + returns_table(summary, data["protocol"]) + "\n\n"
            + improvement_table(summary, data["protocol"]) + "\n\n" + calls_table(summary, data["protocol"]))
    print(text)
    if a.doc:
        doc = a.doc.read_text()
        first, last = marks(a.file)
        start, end = doc.find(first), doc.find(last)
        if start < 0 or end < start:
            ap.error(f"{a.doc}: no lines {first} and {last} (in that order) to put the tables between")
        a.doc.write_text(doc[:start + len(first)] + "\n" + text + "\n" + doc[end:])
        print(f"\ntables: {a.doc}")
    if a.plot:
        plot(summary, data["protocol"], a.plot)
        print(f"\nplot: {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
