"""The example programs from programs/, run on the embedded model (real SmolLM2 on CPU)."""

import pytest

from tests.program_suite import CASES, run_suite_case

pytestmark = pytest.mark.model


@pytest.mark.parametrize("case", sorted(CASES))
def test_program_on_embedded(case, embedded_backend):
    run_suite_case(case, embedded_backend)
