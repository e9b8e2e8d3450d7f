"""A starting kernel handed in for the search policy: its KNOBS and KNOB_SPACE read, anything wrong one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.search import KnobSearch
from baselines.problem import start_kernel_knobs
from baselines.registry import get_problem

START = (Path(__file__).parent / "files" / "layernorm_start.py").read_text()


def test_the_knobs_and_the_space_are_read():
    defaults, space = start_kernel_knobs(START)
    assert defaults == {"ROWS": 1, "num_warps": 4}
    assert space == {"ROWS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8]}


@pytest.mark.parametrize("change,words", [
    (("KNOB_SPACE = {", "SPACE = {"), "needs one module-level KNOB_SPACE"),
    (("KNOBS = {\"ROWS\": 1, \"num_warps\": 4}\n", ""), "no 'KNOBS = {...}' line"),
    (("\"ROWS\": [1, 2, 4, 8]", "\"ROWS\": [2, 4]"), "does not hold KNOBS' value 1"),
    (("\"ROWS\": [1, 2, 4, 8]", "\"ROWS\": []"), "non-empty list of distinct values"),
    (("\"ROWS\": [1, 2, 4, 8]", "\"ROWS\": [1, 1]"), "non-empty list of distinct values"),
    (("\"ROWS\": [1, 2, 4, 8]", "\"BLOCK\": [1]"), "names 'BLOCK', which KNOBS has not"),
    (("\"ROWS\": [1, 2, 4, 8]", "\"ROWS\": [1, len]"), "literal dict of lists of constants"),
    (("def run(inputs, out):", "def run(inputs, out)"), "syntax error at line"),
])
def test_a_bad_starting_kernel_is_one_line(change, words):
    with pytest.raises(ValueError) as e:
        start_kernel_knobs(START.replace(*change))
    assert words in str(e.value) and "\n" not in str(e.value), e.value


def test_the_search_tunes_the_starting_kernel_not_the_problem_s_template():
    s = KnobSearch(get_problem("softmax"), seed=0, start_kernel=START)
    first = s.propose(1, 0, [], set())
    assert first.source == START.replace('KNOBS = {"ROWS": 1, "num_warps": 4}', "KNOBS = {'ROWS': 1, 'num_warps': 4}")
    assert s.space == {"ROWS": [1, 2, 4, 8], "num_warps": [1, 2, 4, 8]}
    assert set(s.parse_hints(["ROWS=4"])) == {"ROWS"}
