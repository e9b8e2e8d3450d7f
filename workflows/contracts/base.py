"""What every contract shares: the task queues, the phases, outcomes and stages, the cheating families, the
strict base model, and pydantic errors as one line."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

AGENT_QUEUE = "marathon-agent"
GPU_QUEUE = "marathon-gpu"
WORKFLOW_TYPE = "KernelOptimization"
# the error type of a GPU worker's refusal once its self-test failed: the work is sound, the worker is not
SELFTEST_FAILED = "SelfTestFailed"
STATE_VERSION = 2  # the carried state of this workflow version (docs/architecture.md, Versioning)

Phase = Literal[
    "starting", "proposing", "checking", "evaluating", "compiling", "verifying", "benchmarking", "recording",
    "compacting", "paused", "reverifying", "done",
]
Outcome = Literal["improved", "passed", "rejected"]
Stage = Literal["propose", "rules", "compile", "verify", "benchmark", "profile", "sandbox"]
#: the cheating families a rejection can name: a rejection's reason starts with `family:` when it has one
FAMILIES = ("network", "process", "filesystem", "output-cache", "lazy-output", "precomputed", "shape-specific",
            "stream", "timer")


def family_of(text: str | None) -> str | None:
    """The family a rejection's reason (or rule) names by its first word, else None."""
    head = (text or "").split(":", 1)[0].strip()
    return head if head in FAMILIES else None


def explain(e: ValidationError) -> str:
    """A pydantic error as one readable line: `field: message; ...`."""
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "input"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            parts.append(f"{loc}: {err['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


class Strict(BaseModel):
    """Unknown fields are an error: a typo in a RunSpec must not silently become a default."""

    model_config = ConfigDict(extra="forbid")


class Verdict(Strict):
    """A report that can refuse a candidate: a refusal whose text starts with `family:` names that cheating
    family in `family`. Subclasses declare `family: str | None = None` among their fields (where it has
    always been in their JSON) and say which field holds the refusal's text."""

    family_text: ClassVar[str] = "reason"  # the field whose first word may name the family

    def refused(self) -> bool:
        return not self.ok

    @model_validator(mode="after")
    def _family(self):
        if self.family is None and self.refused():
            self.family = family_of(getattr(self, self.family_text))
        return self
