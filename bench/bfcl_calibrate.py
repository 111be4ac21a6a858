"""Calibrate ``tool_choice="auto"``'s first decision on a BFCL slice the benchmark does not score.

    python bench/bfcl_calibrate.py [DIR] [--offset 100] [--limit 80] [--categories a,b]
                                   [--signal relevance|probe|joint] [--abstain 1.0]

``auto`` in the injected format first scores the turn; below a threshold the turn is a
plain answer. Two signals: ``relevance`` (the default, :mod:`structgen.tools.relevance`:
how much the user's question raises the likelihood of the best allowed tool's description,
nats per token) and ``probe`` (:mod:`structgen.tools.decision`: the model's probability of
opening the call block; the decision used after tool results).
This script reads the signal for every record of the slice (records
``offset .. offset+limit-1`` of each category; ``bench/bfcl.py`` scores the first ``--limit``
records, so the default slice is disjoint from it) and prints, for each candidate threshold,
the share of call-category records that would call and of ``*irrelevance*`` records that
would not, and the threshold with the best balanced accuracy (the mean of the two shares,
each call category weighted like the irrelevance one). Only the decision runs: each turn
is scored, decided "answer" and cut after two tokens. Last line::

    RESULT signal=<relevance|probe> threshold=<x> balanced_accuracy=<x> call_rate=<x> abstain_rate=<x>

``--signal joint`` calibrates the default decision, relevance then grounding
(:mod:`structgen.tools.grounding`): every turn is committed to a call (relevance threshold
off, ``max_tokens`` 192 as in ``bench/bfcl.py``), its relevance and its calls' grounding are
read, and a turn calls when both reach their thresholds. The pair chosen keeps the
irrelevance abstain rate at least ``--abstain`` (default 1.0: ``bench/bfcl.py``'s goal is an
irrelevance accuracy no lower than the unconstrained model's, which never calls) and the
highest accuracy on the call categories -- the share of records whose committed calls pass
the checker and are kept, ``bench/bfcl.py``'s ``accuracy`` -- (ties: the higher call rate, the
higher abstain rate, then the lower thresholds). Last line::

    RESULT signal=joint relevance_threshold=<x> grounding_threshold=<x> accuracy=<x> call_rate=<x> abstain_rate=<x>
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import structgen as sg  # noqa: E402
from bench.bfcl import ROLE, default_dir, record_tools  # noqa: E402
from bench.bfcl_check import Category, check_calls, load_categories  # noqa: E402

#: per signal: the tool_choice that scores it and then always answers (the turn is cut after
#: 2 tokens), and the meta key the score is read from
SIGNALS = {"relevance": ({"mode": "auto", "relevance_threshold": 1e9}, "tool_relevance"),
           "probe": ({"mode": "auto", "call_threshold": 1.0}, "call_probability")}


#: joint: every turn committed to a call, unchecked (its relevance and grounding are read)
JOINT = {"mode": "auto", "relevance_threshold": -1e9, "grounding_threshold": None}


@sg.program
def probe_turn(s, messages, tools, parallel, choice, max_tokens=2):
    s += sg.use_tools(tools)
    for m in messages:
        s += ROLE.get(m["role"], sg.user)(m["content"])
    s += sg.assistant(sg.gen("out", tools=tools, tool_choice=choice, parallel_tool_calls=bool(parallel),
                             max_tokens=max_tokens))


#: one record of the joint calibration: (relevance, grounding or None, its committed calls pass the checker)
Joint = tuple[float, "float | None", bool]


def joint_scores(backend: Any, cat: Category, max_tokens: int = 192) -> list[Joint]:
    """Per record: ``(relevance, grounding, correct)`` of the turn committed to a call."""
    from structgen.contract.backend import Message
    from structgen.tools.grounding import call_grounding, grounding_source

    tools = [record_tools(r) for r in cat.records]
    states = probe_turn.run_batch([{"messages": r.messages, "tools": ts, "parallel": cat.parallel, "choice": JOINT,
                                    "max_tokens": max_tokens} for r, ts in zip(cat.records, tools, strict=True)],
                                  backend=backend, num_threads=16)
    out = []
    for rec, ts, st in zip(cat.records, tools, states, strict=True):
        st.raise_if_failed()
        source = grounding_source([Message(m["role"], m["content"]) for m in rec.messages])
        calls = st.tool_calls("out")
        grounding = call_grounding(calls, ts, source)
        correct = not cat.irrelevance and check_calls([(c.name, c.raw_arguments) for c in calls], rec, cat)
        out.append((float(st.get_meta_info("out")["tool_relevance"]), grounding, bool(correct)))
    return out


def joint_rates(calls: dict[str, list[Joint]], abstain: list[Joint], tr: float,
                tg: float) -> tuple[float, float, float]:
    """``(call rate, abstain rate, accuracy)`` of the pair: a turn calls at relevance >= ``tr``
    and grounding >= ``tg`` (or none to check); it is right when it calls and its calls pass."""
    def calls_at(x: Joint) -> bool:
        return x[0] >= tr and (x[1] is None or x[1] >= tg)
    call_rate = sum(sum(map(calls_at, xs)) / len(xs) for xs in calls.values()) / len(calls)
    accuracy = sum(sum(calls_at(x) and x[2] for x in xs) / len(xs) for xs in calls.values()) / len(calls)
    return call_rate, sum(not calls_at(x) for x in abstain) / len(abstain), accuracy


def best_pair(calls: dict[str, list[Joint]], abstain: list[Joint], need: float,
              groundings: Sequence[float] | None = None) -> tuple[float, float, float, float, float] | None:
    """``(relevance threshold, grounding threshold, accuracy, call rate, abstain rate)``: the
    pair (candidates: values seen in the slice; ``groundings``: only these grounding
    thresholds) with abstain rate >= ``need`` and the highest accuracy (ties: call rate,
    abstain rate, the lower thresholds); None when no pair abstains enough."""
    xs = [x for v in calls.values() for x in v] + abstain
    trs = sorted({x[0] for x in xs})
    tgs = sorted({x[1] for x in xs if x[1] is not None} | {0.0}) if groundings is None else list(groundings)
    best: tuple[float, float, float, float, float] | None = None
    for tg in tgs:
        for tr in trs:
            cr, ar, acc = joint_rates(calls, abstain, tr, tg)
            if ar >= need and (best is None or (acc, cr, ar) > best[2:]):  # ties: the lower thresholds
                best = (tr, tg, acc, cr, ar)
    return best


def probabilities(backend: Any, cat: Category, signal: str = "relevance") -> list[float]:
    choice, key = SIGNALS[signal]
    states = probe_turn.run_batch([{"messages": r.messages, "tools": record_tools(r), "parallel": cat.parallel,
                                    "choice": choice} for r in cat.records], backend=backend, num_threads=16)
    out = []
    for st in states:
        st.raise_if_failed()
        out.append(float(st.get_meta_info("out")[key]))
    return out


def rates(calls: dict[str, list[float]], abstain: list[float], t: float) -> tuple[float, float]:
    """``(call rate, abstain rate)`` at threshold ``t``: each call category weighted alike."""
    call_rate = sum(sum(p >= t for p in ps) / len(ps) for ps in calls.values()) / len(calls)
    return call_rate, sum(p < t for p in abstain) / len(abstain)


def best_threshold(calls: dict[str, list[float]], abstain: list[float]) -> tuple[float, float, float, float]:
    """``(threshold, balanced accuracy, call rate, abstain rate)``: the candidate (a score
    seen in the slice) with the best balanced accuracy; ties go to the lower threshold."""
    candidates = sorted({p for ps in calls.values() for p in ps} | set(abstain))
    best = (candidates[0] if candidates else 0.0, -1.0, 0.0, 0.0)
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
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("--categories", default=None)
    ap.add_argument("--signal", choices=[*sorted(SIGNALS), "joint"], default="relevance")
    ap.add_argument("--abstain", type=float, default=1.0, help="joint: the irrelevance abstain rate to keep")
    ap.add_argument("--dump", default="", help="joint: also write each record's (relevance, grounding, correct) "
                                               "as JSON to this file")
    args = ap.parse_args()
    cats = load_categories(Path(args.dir), args.limit, args.offset)
    if args.categories:
        cats = [c for c in cats if c.name in set(args.categories.split(","))]
    if not any(c.irrelevance for c in cats) or all(c.irrelevance for c in cats):
        sys.exit("need an *irrelevance* category and at least one call category")
    from structgen.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend()
    if args.signal == "joint":
        scores = {c.name: joint_scores(backend, c) for c in cats}
        backend.close()
        if args.dump:
            Path(args.dump).write_text(json.dumps({c.name: {"ids": [r.id for r in c.records], "scores": scores[c.name]}
                                                   for c in cats}), encoding="utf-8")
        jcalls = {c.name: scores[c.name] for c in cats if not c.irrelevance}
        jabstain = [x for c in cats if c.irrelevance for x in scores[c.name]]
        print(f"slice: records {args.offset}..{args.offset + args.limit - 1} of "
              + ", ".join(f"{c.name} ({len(c.records)})" for c in cats))
        print(f"{'grounding >=':>12} {'relevance >=':>13} {'accuracy':>9} {'call rate':>10} {'abstain':>10}")
        for g in (0.0, 0.25, 0.5, 0.6, 0.75, 1.0):  # per grounding threshold: its best relevance threshold
            row = best_pair(jcalls, jabstain, args.abstain, groundings=[g])
            if row is not None:
                print("{:>12.2f} {:>13.3f} {:>9.3f} {:>10.3f} {:>10.3f}".format(row[1], row[0], *row[2:]))
        found = best_pair(jcalls, jabstain, args.abstain)
        if found is None:
            sys.exit(f"no pair of thresholds abstains on {args.abstain:.0%} of the irrelevance records")
        tr, tg, acc, cr, ar = found
        print(f"RESULT signal=joint relevance_threshold={tr:.4f} grounding_threshold={tg:.4f} accuracy={acc:.3f} "
              f"call_rate={cr:.3f} abstain_rate={ar:.3f}")
        return
    probs = {c.name: probabilities(backend, c, args.signal) for c in cats}
    backend.close()
    calls = {c.name: probs[c.name] for c in cats if not c.irrelevance}
    abstain = [p for c in cats if c.irrelevance for p in probs[c.name]]
    print(f"slice: records {args.offset}..{args.offset + args.limit - 1} of "
          + ", ".join(f"{c.name} ({len(c.records)})" for c in cats))
    for name, ps in probs.items():
        qs = sorted(ps)
        print(f"{name:<20} {args.signal} quartiles "
              + " ".join(f"{qs[min(len(qs) - 1, int(q * len(qs)))]:.4f}" for q in (0.25, 0.5, 0.75)))
    print(f"{'threshold':>10} {'call rate':>10} {'abstain':>10}")
    grid = (0.005, 0.01, 0.02, 0.03, 0.05, 0.1) if args.signal == "probe" else (0.5, 0.75, 1.0, 1.1, 1.25, 1.5)
    for t in grid:
        print("{:>10.3f} {:>10.3f} {:>10.3f}".format(t, *rates(calls, abstain, t)))
    t, bal, cr, ar = best_threshold(calls, abstain)
    print(f"RESULT signal={args.signal} threshold={t:.4f} balanced_accuracy={bal:.3f} call_rate={cr:.3f} "
          f"abstain_rate={ar:.3f}")


if __name__ == "__main__":
    main()
