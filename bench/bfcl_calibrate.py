"""Calibrate ``tool_choice="auto"``'s call threshold on a BFCL slice the benchmark does not score.

    python bench/bfcl_calibrate.py [DIR] [--offset 100] [--limit 40] [--categories a,b]

``auto`` in the injected format first asks the model how likely the turn opens the call
block (:mod:`structgen.tools.decision`); below a threshold the turn is a plain answer.
This script reads that *call probability* for every record of the slice (records
``offset .. offset+limit-1`` of each category; ``bench/bfcl.py`` scores the first ``--limit``
records, so the default slice is disjoint from it) and prints, for each candidate threshold,
the share of call-category records that would call and of ``*irrelevance*`` records that
would not, and the threshold with the best balanced accuracy (the mean of the two shares,
each call category weighted like the irrelevance one). Only the probe runs: each turn is
decided and cut after two tokens. Last line::

    RESULT call_threshold=<x> balanced_accuracy=<x> call_rate=<x> abstain_rate=<x>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structgen as sg  # noqa: E402
from bench.bfcl import ROLE, default_dir, record_tools  # noqa: E402
from bench.bfcl_check import Category, load_categories  # noqa: E402


@sg.program
def probe_turn(s, messages, tools, parallel):
    s += sg.use_tools(tools)
    for m in messages:
        s += ROLE.get(m["role"], sg.user)(m["content"])
    # call_threshold=1: every turn is decided "answer" after the probe, cut after 2 tokens
    s += sg.assistant(sg.gen("out", tools=tools, tool_choice={"mode": "auto", "call_threshold": 1.0},
                             parallel_tool_calls=bool(parallel), max_tokens=2))


def probabilities(backend: Any, cat: Category) -> list[float]:
    states = probe_turn.run_batch([{"messages": r.messages, "tools": record_tools(r), "parallel": cat.parallel}
                                   for r in cat.records], backend=backend, num_threads=16)
    out = []
    for st in states:
        st.raise_if_failed()
        out.append(float(st.get_meta_info("out")["call_probability"]))
    return out


def rates(calls: dict[str, list[float]], abstain: list[float], t: float) -> tuple[float, float]:
    """``(call rate, abstain rate)`` at threshold ``t``: each call category weighted alike."""
    call_rate = sum(sum(p >= t for p in ps) / len(ps) for ps in calls.values()) / len(calls)
    return call_rate, sum(p < t for p in abstain) / len(abstain)


def best_threshold(calls: dict[str, list[float]], abstain: list[float]) -> tuple[float, float, float, float]:
    """``(threshold, balanced accuracy, call rate, abstain rate)``: the candidate (a probability
    seen in the slice) with the best balanced accuracy; ties go to the lower threshold."""
    candidates = sorted({p for ps in calls.values() for p in ps} | set(abstain) | {0.0})
    best = (0.0, -1.0, 0.0, 0.0)
    for t in candidates:
        call_rate, abstain_rate = rates(calls, abstain, t)
        bal = (call_rate + abstain_rate) / 2
        if bal > best[1] + 1e-12:
            best = (t, bal, call_rate, abstain_rate)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", default=str(default_dir()))
    ap.add_argument("--offset", type=int, default=100)
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--categories", default=None)
    args = ap.parse_args()
    cats = load_categories(Path(args.dir), args.limit, args.offset)
    if args.categories:
        cats = [c for c in cats if c.name in set(args.categories.split(","))]
    if not any(c.irrelevance for c in cats) or all(c.irrelevance for c in cats):
        sys.exit("need an *irrelevance* category and at least one call category")
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend()
    probs = {c.name: probabilities(backend, c) for c in cats}
    backend.close()
    calls = {c.name: probs[c.name] for c in cats if not c.irrelevance}
    abstain = [p for c in cats if c.irrelevance for p in probs[c.name]]
    print(f"slice: records {args.offset}..{args.offset + args.limit - 1} of "
          + ", ".join(f"{c.name} ({len(c.records)})" for c in cats))
    for name, ps in probs.items():
        qs = sorted(ps)
        print(f"{name:<20} call probability quartiles "
              + " ".join(f"{qs[min(len(qs) - 1, int(q * len(qs)))]:.4f}" for q in (0.25, 0.5, 0.75)))
    print(f"{'threshold':>10} {'call rate':>10} {'abstain':>10}")
    for t in (0.005, 0.01, 0.02, 0.03, 0.05, 0.1):
        print("{:>10.3f} {:>10.3f} {:>10.3f}".format(t, *rates(calls, abstain, t)))
    t, bal, cr, ar = best_threshold(calls, abstain)
    print(f"RESULT call_threshold={t:.4f} balanced_accuracy={bal:.3f} call_rate={cr:.3f} abstain_rate={ar:.3f}")


if __name__ == "__main__":
    main()
