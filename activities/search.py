"""Policy `search`: an evolutionary optimizer over a problem's template knobs.

Each proposal is either a mutation of a parent drawn by tournament from the candidates that passed
(mostly the fast ones), or, with a small probability, a fresh sample in which every knob value is drawn by
its record so far (values that keep failing fade, values seen in fast kernels are preferred; untried values
get an optimistic prior). Until something has passed, the parent is the starting kernel, which its author
verified and tuned: a population's first wave explores around it instead of across the whole space, where
most points are far slower (unless the start itself was rejected). No candidate is proposed twice.
The random stream is seeded by (seed, iteration, slot), so a run is reproducible for its seed whatever
crashes and retries happen in between.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from baselines.problem import Problem, render, start_kernel_knobs
from workflows.artifacts import candidate_id
from workflows.contracts import IterationRecord

EXPLORE = 0.15  # probability of a fresh sample instead of a mutation
TOURNAMENT = 3


@dataclass
class Choice:
    knobs: dict[str, Any]
    source: str
    candidate_id: str
    parent: str | None
    rationale: str


class KnobSearch:
    def __init__(self, problem: Problem, seed: int, start_kernel: str | None = None) -> None:
        """Over the problem's template and knob space, or over `start_kernel`'s (a template the user handed
        in with its KNOB_SPACE: baselines.problem.start_kernel_knobs)."""
        if start_kernel is None:
            self.template, self.space, self.default = problem.template(), problem.knob_space(), problem.default_knobs()
        else:
            self.template = start_kernel
            self.default, self.space = start_kernel_knobs(start_kernel)
        self.seed = seed
        self.start_id = candidate_id(render(self.template, self.default))

    def propose(self, iteration: int, slot: int, history: list[IterationRecord],
                taken: set[str], hints: list[str] = ()) -> Choice | None:
        rng = random.Random(f"{self.seed}:{iteration}:{slot}")
        tried = {r.candidate_id for r in history} | set(taken)
        passed = [r for r in history if r.outcome in ("passed", "improved") and r.knobs and r.speedup]
        if not history and not taken:
            return self._choice(self.default, None, "the starting kernel as written")
        steer = self.parse_hints(hints)
        if steer:
            # An operator's `KNOB=value` hint: apply it to the best kernel so far (or the start).
            top = max(passed, key=lambda r: r.speedup) if passed else None
            knobs = {**(top.knobs if top else self.default), **steer}
            c = self._choice(knobs, top.candidate_id if top else None,
                             "hint: " + ", ".join(f"{k}={v}" for k, v in steer.items()))
            if c.candidate_id not in tried:
                return c
        stats = self._value_stats(history)
        start_rejected = any(r.candidate_id == self.start_id and r.outcome == "rejected" for r in history)
        for _ in range(200):
            if passed and rng.random() > EXPLORE:
                parent = max(rng.sample(passed, min(TOURNAMENT, len(passed))), key=lambda r: r.speedup)
                knobs, what = self._mutate(parent.knobs, rng, stats)
                # an interpreter timing's ratio says nothing about speed: name the parent without it
                score = "" if parent.interpreter else f" ({parent.speedup:.3g}x)"
                c = self._choice(knobs, parent.candidate_id, f"mutate {parent.candidate_id}{score}: {what}")
            elif not passed and not start_rejected and rng.random() > EXPLORE:
                knobs, what = self._mutate(self.default, rng, stats)
                c = self._choice(knobs, self.start_id, f"mutate the starting kernel: {what}")
            else:
                knobs = {k: self._draw(k, rng, stats) for k in self.space}
                c = self._choice(knobs, None, "fresh sample weighted by each knob value's record")
            if c.candidate_id not in tried:
                return c
        return self._first_untried(rng, tried)

    def hint_problems(self, hints, problem: str = "the problem") -> list[str]:
        """Why each hint that names no knob value of this search's space cannot steer it (hint_problem)."""
        return [why for h in hints if (why := hint_problem(self.space, h, problem))]

    def parse_hints(self, hints) -> dict[str, Any]:
        """`NAME=value` pairs naming a knob and one of its values; other text is ignored here (the
        llm policy reads free text)."""
        out: dict[str, Any] = {}
        for h in hints:
            for tok in h.replace(",", " ").split():
                name, sep, val = tok.partition("=")
                if not sep or name not in self.space:
                    continue
                for v in self.space[name]:
                    if str(v) == val.strip("'\""):
                        out[name] = v
        return out

    def _mutate(self, knobs: dict, rng: random.Random, stats) -> tuple[dict, str]:
        """`knobs` with one knob (sometimes two) set to another of its values, and what changed."""
        child = {**self.default, **{k: v for k, v in knobs.items() if k in self.space}}
        names = sorted(k for k, values in self.space.items() if len(values) > 1)  # a knob with one value is fixed
        if not names:
            return child, "no knob has a second value"
        changed = []
        for name in rng.sample(names, 1 if rng.random() < 0.7 or len(names) < 2 else 2):
            values = self.space[name]
            if rng.random() < 0.7 and child[name] in values:  # a neighbouring value: small steps in ordered knobs
                i = values.index(child[name])
                j = i + rng.choice((-1, 1))
                new = values[j if 0 <= j < len(values) else 2 * i - j]  # at an end, the one neighbour
            else:
                new = self._draw(name, rng, stats, other_than=child[name])
            changed.append(f"{name} {child[name]}->{new}")
            child[name] = new
        return child, ", ".join(changed)

    def _value_stats(self, history: list[IterationRecord]) -> dict[tuple[str, str], list[float]]:
        """(knob, repr(value)) -> outcomes: speedup for a pass, 0 for a rejection."""
        out: dict[tuple[str, str], list[float]] = {}
        for r in history:
            if not r.knobs:
                continue
            score = r.speedup if r.outcome in ("passed", "improved") and r.speedup else 0.0
            for k, v in r.knobs.items():
                out.setdefault((k, repr(v)), []).append(score)
        return out

    def _draw(self, name: str, rng: random.Random, stats, other_than: Any = None) -> Any:
        """A value of the knob, weighted by its record; with `other_than`, never that value."""
        values = [v for v in self.space[name] if other_than is None or v != other_than] or self.space[name]
        best = max((max(s) for s in stats.values() if s), default=1.0) or 1.0
        weights = []
        for v in values:
            s = stats.get((name, repr(v)))
            # untried: optimistic (as good as the best seen); tried: mean relative to the best, floored
            weights.append(1.0 if not s else max(0.05, sum(s) / len(s) / best))
        return rng.choices(values, weights=weights)[0]

    def _first_untried(self, rng: random.Random, tried: set[str]) -> Choice | None:
        names = sorted(self.space)
        combos = list(itertools.product(*(self.space[n] for n in names)))
        rng.shuffle(combos)
        for combo in combos[:100_000]:
            c = self._choice(dict(zip(names, combo)), None, "systematic: first untried point")
            if c.candidate_id not in tried:
                return c
        return None

    def _choice(self, knobs: dict, parent: str | None, why: str) -> Choice:
        source = render(self.template, knobs)
        return Choice(knobs=dict(sorted({**self.default, **knobs}.items())), source=source,
                      candidate_id=candidate_id(source), parent=parent, rationale=why)


def hint_problem(space: dict, text: str, problem: str = "the problem") -> str | None:
    """Why a search hint is not `KNOB=value` pairs from `space` (one line), or None: the search ignores
    anything else, so the CLI refuses it and the run reports it."""
    knobs = ", ".join(space)
    for tok in text.replace(",", " ").split():
        name, sep, val = tok.partition("=")
        if not sep:
            return (f"a search run takes KNOB=value hints (free text is for --policy llm); {tok!r} is not one; "
                    f"{problem}'s knobs: {knobs}")
        if name not in space:
            return f"{problem} has no knob {name!r}; its knobs: {knobs}"
        values = [str(v) for v in space[name]]
        if val.strip("'\"") not in values:
            return f"knob {name} has no value {val!r}; its values: " + ", ".join(repr(v) if v == "" else v
                                                                                  for v in values)
    return None
