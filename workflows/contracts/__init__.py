"""Pydantic contracts between the workflow, the activities, the CLI and the Web UI, grouped by what they
describe: base (queues, phases, families, the strict model), budget, records (candidates a run keeps),
harness (a candidate's evaluation), agent (proposals, compaction), llm (model turns and tools), run
(the input, the carried state, signals, status and result).

Everything here is small: kernel sources, logs, prompts and profiles travel as artifact-store keys
(`*_key`, a sha256 hex digest), never as content. Every name is importable from `workflows.contracts`.
"""

from workflows.contracts.agent import CompactRequest, CompactResult, Proposal, ProposeRequest
from workflows.contracts.base import (AGENT_QUEUE, FAMILIES, GPU_QUEUE, SELFTEST_FAILED, STATE_VERSION,
                                      WORKFLOW_TYPE, Outcome, Phase, Stage, Strict, Verdict, explain, family_of)
from workflows.contracts.budget import Budget, BudgetChange, Used
from workflows.contracts.harness import (BenchReport, BenchRequest, Candidate, CompileReport, CrownDecision,
                                         DeviceFacts, DistributionTiming, EvalRequest, EvaluateRequest,
                                         EvaluationResult, ProfileReport, Receipt, RuleReport, RuleRequest,
                                         VerifyReport)
from workflows.contracts.llm import (CallView, LlmProgress, LlmToolRequest, LlmTurnRequest, LlmTurnResult, ToolCall,
                                     ToolResult, TurnView)
from workflows.contracts.records import BestRef, BestSummary, IterationRecord, LeaderEntry
from workflows.contracts.run import CarriedState, Evaluation, Hint, RunResult, RunSpec, Status, StopRequest

__all__ = [
    "AGENT_QUEUE", "FAMILIES", "GPU_QUEUE", "SELFTEST_FAILED", "STATE_VERSION", "WORKFLOW_TYPE", "Outcome", "Phase",
    "Stage",
    "Strict", "Verdict", "explain", "family_of",
    "Budget", "BudgetChange", "Used",
    "BestRef", "BestSummary", "IterationRecord", "LeaderEntry",
    "BenchReport", "BenchRequest", "Candidate", "CompileReport", "CrownDecision", "DeviceFacts", "DistributionTiming",
    "EvalRequest", "EvaluateRequest", "EvaluationResult", "ProfileReport", "Receipt", "RuleReport", "RuleRequest",
    "VerifyReport",
    "CompactRequest", "CompactResult", "Proposal", "ProposeRequest",
    "CallView", "LlmProgress", "LlmToolRequest", "LlmTurnRequest", "LlmTurnResult", "ToolCall", "ToolResult",
    "TurnView",
    "CarriedState", "Evaluation", "Hint", "RunResult", "RunSpec", "Status", "StopRequest",
]
