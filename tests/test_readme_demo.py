"""The README's demo block is what ``opguard demo`` prints (see tests/readme_demo.py)."""

from __future__ import annotations

import pytest
import readme_demo


@pytest.mark.slow
def test_readme_shows_the_demo_as_it_runs() -> None:
    block, made_in = readme_demo.readme_block()
    output = readme_demo.run_demo()
    if made_in == readme_demo.environment():
        assert block == output, "README.md's demo block is stale: python tests/readme_demo.py"
    else:  # another torch or CPU computes other last digits: the rest must still agree
        assert readme_demo.without_numbers(block) == readme_demo.without_numbers(output), (
            "README.md's demo block is stale: python tests/readme_demo.py"
        )


def test_numbers_a_machine_computes_are_all_that_may_differ() -> None:
    line = (
        "      A: float32[8, 32, 64] fp a634c24a3d41dcc8\n  #175 at …/train.py:60, 1e-05, -3.5e-10"
    )
    assert readme_demo.without_numbers(line) == (
        "      A: float32[8, 32, 64] fp <fingerprint>\n  #175 at …/train.py:60, <number>, <number>"
    )
