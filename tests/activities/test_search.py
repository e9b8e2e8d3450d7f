"""The search policy's proposals (activities/search.py)."""

from activities.search import EXPLORE, KnobSearch
from baselines.registry import get_problem
from workflows.contracts import IterationRecord


def _wave(search, history, n=24):
    taken, out = set(), []
    for slot in range(n):
        c = search.propose(1 + len(history) + slot, slot, history, taken)
        taken.add(c.candidate_id)
        out.append(c)
    return out


def _changed(search, knobs):
    return {k for k in search.space if knobs[k] != search.default[k]}


def test_the_first_wave_explores_around_the_starting_kernel():
    # KDA's space holds ~250,000 points, most of them far slower than the start: before any result is back,
    # a population's proposals are the start and its one- or two-knob neighbours, with a few fresh samples
    s = KnobSearch(get_problem("kda"), seed=3)
    wave = _wave(s, [])
    assert wave[0].rationale == "the starting kernel as written" and wave[0].candidate_id == s.start_id
    near = [c for c in wave[1:] if c.rationale.startswith("mutate the starting kernel")]
    assert len(near) >= (1 - 2 * EXPLORE) * len(wave[1:])
    assert all(1 <= len(_changed(s, c.knobs)) <= 2 and c.parent == s.start_id for c in near)
    assert len({c.candidate_id for c in wave}) == len(wave)


def test_a_rejected_start_sends_the_search_across_the_space():
    s = KnobSearch(get_problem("kda"), seed=3)
    start = s.propose(1, 0, [], set())
    rejected = IterationRecord(iteration=1, candidate_id=start.candidate_id, source_key="k", knobs=start.knobs,
                               outcome="rejected", stage="compile", reason="compile-error")
    wave = _wave(s, [rejected], n=12)
    assert all(c.rationale.startswith("fresh sample") for c in wave)


def test_once_something_passed_its_parents_are_the_measured_candidates():
    s = KnobSearch(get_problem("kda"), seed=3)
    start = s.propose(1, 0, [], set())
    rec = IterationRecord(iteration=1, candidate_id=start.candidate_id, source_key="k", knobs=start.knobs,
                          outcome="improved", speedup=1.05, time_ms=0.94)
    wave = _wave(s, [rec], n=12)
    assert not any(c.rationale.startswith("mutate the starting kernel") for c in wave)
    assert sum(c.rationale.startswith(f"mutate {start.candidate_id} (1.05x)") for c in wave) >= 8


def test_every_mutation_changes_what_its_rationale_names():
    # at the ends of a knob's values and in weighted draws alike: no "ROWS 1->1"
    import re

    s = KnobSearch(get_problem("softmax"), seed=0)
    start = s.propose(1, 0, [], set())
    rec = IterationRecord(iteration=1, candidate_id=start.candidate_id, source_key="k", knobs=start.knobs,
                          outcome="improved", speedup=1.0, time_ms=1.0)
    changes = []
    for seed in range(8):
        s.seed = seed
        for c in _wave(s, [rec], n=24):
            if c.rationale.startswith("mutate"):
                pairs = re.findall(r"(\w+) (\S*)->(\S*?)(?:,|$)", c.rationale.split(": ", 1)[1])
                assert pairs and all(a != b for _, a, b in pairs), c.rationale
                assert all(str(c.knobs[k]) == b for k, _, b in pairs), (c.rationale, c.knobs)
                changes += pairs
    assert any(a == "1" for k, a, _ in changes if k == "ROWS"), "an end of a knob's values was mutated from"
