"""Activities of the agent worker (task queue marathon-agent): propose, check rules, compact.

Sync activities: the worker runs them in a thread pool, so file I/O never blocks its event loop. They are
methods of one object per worker, holding the settings read when the worker was built.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.artifacts import ArtifactStoreError
from activities.ledger import append_chunk, read_ledger
from activities.settings import AgentSettings
from workflows.logs import activity_logger
from activities.notebook import summarize
from workflows.contracts import (Candidate, CompactRequest, CompactResult, Proposal, ProposeRequest,
                                 RuleReport, RuleRequest, RunSpec)


def _infra(e: Exception) -> ApplicationError:
    # Retrying cannot fix a full or read-only store quickly; the workflow pauses with this message.
    return ApplicationError(str(e), type="ArtifactStoreError", non_retryable=True)


class AgentActivities:
    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings

    @activity.defn(name="propose_candidate")
    def propose_candidate(self, req: ProposeRequest) -> Proposal:
        from baselines.registry import get_problem

        if req.policy != "search":
            raise ApplicationError(f"policy {req.policy!r} is proposed by its own activities, not this one",
                                   non_retryable=True)
        from activities.search import KnobSearch

        store = self.settings.store
        try:
            history = read_ledger(store, req.ledger_key) + list(req.recent)
            start = store.get_text(req.start_kernel) if req.start_kernel else None
            search = KnobSearch(get_problem(req.problem), req.seed, start)
            choice = search.propose(req.iteration, req.slot, history, set(req.taken), req.hints)
            refused = search.hint_problems(req.hints, req.problem)  # sent past `marathon hint`: the run says why
            if choice is None:
                return Proposal(candidate=None, note="search space exhausted: every knob setting was tried",
                                refused_hints=refused)
            key = store.put_text(choice.source)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        activity_logger().info("proposed", iteration=req.iteration, slot=req.slot, candidate=choice.candidate_id,
                               rationale=choice.rationale)
        return Proposal(candidate=Candidate(candidate_id=choice.candidate_id, source_key=key,
                                            knobs=choice.knobs, parent=choice.parent,
                                            rationale=choice.rationale), refused_hints=refused)


    @activity.defn(name="check_spec")
    def check_spec(self, spec: RunSpec) -> None:
        """The run's problem and shape exist on this worker's registry."""
        from baselines.registry import UnknownProblem, check_problem_name, get_problem

        try:
            check_problem_name(spec.problem)
        except UnknownProblem as e:
            raise ApplicationError(str(e), type="InvalidRunSpec", non_retryable=True) from None
        if spec.start_kernel is not None:
            from baselines.problem import start_kernel_knobs

            if spec.policy != "search":
                raise ApplicationError("start_kernel is the search policy's starting template; the llm policy writes "
                                       "its own kernels", type="InvalidRunSpec", non_retryable=True)
            try:
                start_kernel_knobs(self.settings.store.get_text(spec.start_kernel))
            except (OSError, ArtifactStoreError) as e:
                raise ApplicationError(f"start_kernel {spec.start_kernel}: not in the artifact store ({e})",
                                       type="InvalidRunSpec", non_retryable=True) from None
            except ValueError as e:
                raise ApplicationError(f"start_kernel: {e}", type="InvalidRunSpec", non_retryable=True) from None
        if spec.shape is not None:
            p = get_problem(spec.problem)
            names = [s.name for s in p.shapes] + [p.cpu_shape.name]
            if spec.shape not in names:
                raise ApplicationError(f"problem {spec.problem} has no shape {spec.shape!r}; shapes: {', '.join(names)}",
                                       type="InvalidRunSpec", non_retryable=True)


    @activity.defn(name="check_rules")
    def check_rules(self, req: RuleRequest) -> RuleReport:
        from rules.check import check_source

        try:
            source = self.settings.store.get_text(req.source_key)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        report = check_source(source, req.problem)
        if not report.ok:
            from workflows.metrics import count_evaluation

            count_evaluation("rejected", "rules")
        return report


    @activity.defn(name="compact_notebook")
    def compact_notebook(self, req: CompactRequest) -> CompactResult:
        store = self.settings.store
        try:
            ledger_key = append_chunk(store, req.ledger_key, req.workflow_id, req.run, req.records)
            all_records = read_ledger(store, ledger_key)
            version = req.notebook_version + 1
            text = summarize(req.problem, version, req.notebook_key, req.records, all_records, req.best)
            tokens_in = tokens_out = 0
            if req.policy == "llm":
                from activities.llm.compaction import rewrite_notebook

                text, tokens_in, tokens_out = rewrite_notebook(req, text, store, self.settings.llm)
            notebook_key = store.put_text(text)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        activity_logger().info("compacted", run=req.run, records=len(req.records), notebook_version=version,
                               final=req.final)
        return CompactResult(notebook_key=notebook_key, notebook_version=version, ledger_key=ledger_key,
                             tokens_in=tokens_in, tokens_out=tokens_out)

    def all(self) -> list:
        return [self.check_spec, self.propose_candidate, self.check_rules, self.compact_notebook]
