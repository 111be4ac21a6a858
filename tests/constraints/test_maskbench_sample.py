"""structgen's constraint layer on a fixed MaskBench sample (tests/data/maskbench_sample.txt).

268 small files, up to 16 per source, up to 6 per source that raw llguidance 1.9.1 cannot
compile. Each schema is compiled through ``compiler_for(tokenizer)``; each test instance's
compact JSON is walked token by token against the mask (mask only, as ``bench/maskbench.py``
does), then EOS. Floors are the counts reached when the sample was fixed; the one exact
requirement is that no invalid instance passes both the mask and the final validation.

Skipped when the data directory (``$MASKBENCH_DIR``, else ``../shared/maskbench`` next to the
repository: ``tests/shared_data.py``) is absent.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from structgen.constraints.bitmask import allocate_token_bitmask
from structgen.constraints.compiler import CompileCache, compiler_for
from structgen.constraints.spec import json_schema_spec
from structgen.constraints.validation import validate_output
from structgen.errors import ConstraintError, OutputValidationError
from tests.shared_data import shared_dir

DATA = Path(os.environ.get("MASKBENCH_DIR") or shared_dir() / "maskbench")
SAMPLE = Path(__file__).parent / "data" / "maskbench_sample.txt"

# per source: (files compiled, valid accepted, invalid rejected) reached on the sample
FLOORS: dict[str, tuple[int, int, int]] = {
    "BFCL_java": (16, 16, 0),
    "BFCL_javascript": (16, 16, 0),
    "BFCL_multiple": (16, 16, 0),
    "BFCL_parallel": (16, 16, 0),
    "BFCL_parallel_multiple": (16, 16, 0),
    "BFCL_simple": (16, 16, 0),
    "BFCL_sql": (16, 16, 0),
    "Github_easy": (16, 25, 25),
    "Github_medium": (16, 25, 45),
    "Github_trivial": (16, 20, 37),
    "Glaiveai2K": (16, 11, 12),
    "Handwritten": (12, 13, 27),
    "JME": (16, 16, 0),
    "Kubernetes": (16, 26, 31),
    "Snowplow": (16, 22, 47),
    "Synthesized": (16, 15, 37),
    "WashingtonPost": (16, 19, 39),
}
TOTAL_FLOOR = (304, 300)  # (valid accepted, invalid rejected) over the whole sample


def _source(name: str) -> str:
    return name.split("---", maxsplit=1)[0] if "---" in name else re.sub(r"_\d+\.json$", "", name)


def _names() -> list[str]:
    return [ln.strip() for ln in SAMPLE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def _accepted(compiled, ids, mask, eos) -> bool:
    m = compiled.matcher()
    row = mask[0]
    for t in ids:
        m.fill_bitmask(mask, 0)
        if not (int(row[t >> 5]) >> (t & 31)) & 1 or not m.consume(t):
            return False
    m.fill_bitmask(mask, 0)
    return bool((int(row[eos >> 5]) >> (eos & 31)) & 1)


@pytest.fixture(scope="module")
def results(tokenizer):
    if not DATA.is_dir():
        pytest.skip(f"MaskBench data not found at {DATA}")
    compiler = compiler_for(tokenizer, cache=CompileCache(maxsize=32))
    mask = allocate_token_bitmask(1, compiler.vocab_size, kind="numpy")
    eos = compiler.eos_token_id
    per: dict[str, Counter] = {}
    for name in _names():
        data = json.loads((DATA / name).read_text())
        c = per.setdefault(_source(name), Counter())
        c["files"] += 1
        spec = json_schema_spec(data["schema"], strict=False)  # JSON Schema's open default, as the tests expect
        try:
            compiled = compiler.compile(spec)
        except ConstraintError:
            c["compile_errors"] += 1
            continue
        c["compiled"] += 1
        c["looser"] += not compiled.exact
        for test in data["tests"]:
            text = json.dumps(test["data"], separators=(",", ":"), ensure_ascii=False)
            ok = _accepted(compiled, tokenizer.encode(text, add_special_tokens=False), mask, eos)
            if test["valid"]:
                c["valid"] += 1
                c["valid_accepted"] += ok
            else:
                c["invalid"] += 1
                c["invalid_rejected"] += not ok
                if ok:
                    try:
                        validate_output(spec, text)
                        c["invalid_to_user"] += 1
                    except (OutputValidationError, ConstraintError):
                        pass
    return per


def test_sample_covers_every_source(results):
    assert len(results) >= 17
    assert sum(c["files"] for c in results.values()) == len(_names())


def test_nothing_invalid_reaches_the_user(results):
    assert sum(c["invalid_to_user"] for c in results.values()) == 0


def test_every_sample_schema_compiles(results):
    assert sum(c["compile_errors"] for c in results.values()) == 0


def test_rates_per_source_do_not_regress(results):
    lines = []
    for src, c in sorted(results.items()):
        lines.append(f"{src}: compiled {c['compiled']}/{c['files']} looser {c['looser']} "
                     f"valid {c['valid_accepted']}/{c['valid']} "
                     f"invalid rejected {c['invalid_rejected']}/{c['invalid']}")
        floor = FLOORS.get(src)
        if floor is not None:
            ok = c["compiled"] >= floor[0] and c["valid_accepted"] >= floor[1] and c["invalid_rejected"] >= floor[2]
            assert ok, lines[-1]
    print("\n".join(lines))


def test_totals_do_not_regress(results):
    total = Counter()
    for c in results.values():
        total.update(c)
    # valid instances rejected here are llguidance's fixed property order (JSON objects whose
    # keys come in another order than the schema lists them) and const 1.0 written as 1
    assert total["valid_accepted"] >= TOTAL_FLOOR[0]
    assert total["invalid_rejected"] >= TOTAL_FLOOR[1]
    assert total["compiled"] == len(_names())
