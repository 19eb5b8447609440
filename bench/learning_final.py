"""The protocol's amendment for runs that end one episode short of their budget.

TD3 stops at the last whole episode under the budget: where episode lengths vary (Hopper-v5,
Walker2d-v5) it ends at, say, 99,942 stored steps and never writes the 100 % snapshot (nor, since
its needed interactions are its stored steps, the 100k-interaction one). Its final actor is in the
run folder (`policy.npz`, the snapshot format): that is its policy at the end of the budget. This
script scores it for each such row with the protocol's own scorer (`score_snapshot`, 10 fixed start
states) and adds it under the missing milestone with `"from": "final policy"` and the steps it was
taken at. It changes nothing else: a milestone the run's end is more than one episode short of stays
missing, and no row is re-run.

Run it with the frozen checkout's code and versions (the protocol's pins), from that checkout:

    cd WORKTREE && PROTOCOL_VENV/bin/python /path/to/main/bench/learning_final.py [--protocol v2]

The second protocol takes the same amendment: its learners alone (`--algo td3`) stop the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def final_policy_scores(folder: Path, protocol: dict, scores: dict, steps: int, interactions: int,
                        score) -> dict[str, dict]:
    """The final policy's score (`score(policy.npz, eval_seeds)`, taken once) under each milestone a
    finished run lacks and ended within one episode of; {} for a run that did not finish."""
    final = folder / "policy.npz"
    try:
        finished = json.loads((folder / "summary.json").read_text()).get("status") == "finished"
    except (OSError, ValueError):
        return {}
    if not finished or not final.exists():
        return {}
    episode = json.loads((folder / "config.json").read_text()).get("max_episode_steps", 1000)
    reached = {"steps": steps, "interactions": interactions}
    keys = [key for key, (kind, n) in protocol["milestones"].items()
            if key not in scores and n - episode <= reached[kind] < n]
    if not keys:
        return {}
    got = {**score(final, protocol["eval_seeds"]), "at_steps": steps, "at_interactions": interactions,
           "from": "final policy"}
    return dict.fromkeys(keys, got)


def amend(results: Path, runs: Path, score, update) -> list[str]:
    """Add the final policy's score to every row that ended within one episode of a milestone it lacks."""
    data = json.loads(results.read_text())
    protocol, done = data["protocol"], []
    for row in data["rows"]:
        folder = runs / row["env"] / f"{row['algo']}-s{row['seed']}"
        for key, got in final_policy_scores(folder, protocol, row["scores"], row["steps"], row["interactions"],
                                            score).items():
            match = {k: row[k] for k in ("env", "algo", "seed")}

            def put(d, match=match, key=key, got=got):
                for r in d["rows"]:
                    if all(r[k] == v for k, v in match.items()) and key not in r["scores"]:
                        r["scores"][key] = got

            update(results, put)
            done.append(f"{row['env']}:{row['algo']}:{row['seed']} {key} = {got['mean']:.0f} "
                        f"(final policy at {row['steps']:,} steps)")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="the frozen checkout (default: here)")
    ap.add_argument("--protocol", choices=("v1", "v2"), default="v1",
                    help="v1: learning-protocol.json (the default); v2: learning-protocol-v2.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.root))
    from bench.learning import score_snapshot, update  # the frozen code's scorer and locked writer

    results = args.root / "bench" / "results"
    stem = {"v1": "learning-protocol", "v2": "learning-protocol-v2"}[args.protocol]
    for line in amend(results / f"{stem}.json", results / stem, score_snapshot, update):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
