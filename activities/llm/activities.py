"""The llm policy's activities on the agent worker: `llm_turn` (prompt, reply, tool calls with kernel
sources replaced by artifact keys; the workflow executes every call, each one activity, and hands the
answers to the next turn) and `llm_tool` (the tools that only read)."""

from __future__ import annotations

import difflib
import threading

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from baselines.registry import get_problem
from workflows.artifacts import ArtifactStore, ArtifactStoreError
from workflows.contracts import LlmToolRequest, LlmTurnRequest, LlmTurnResult, ToolResult
from workflows.text import INTERPRETER_VERDICT, model_result_text
from activities.llm.calls import parse_calls
from activities.llm.chat import chat, offered_tools
from activities.llm.context import with_server_context
from activities.llm.endpoint import Profile, cost
from activities.llm.prompt import fit_prompt
from activities.llm.sources import FENCE
from activities.llm.tools import READ_LINES_DEFAULT, TOOLS, text_tool_calls
from activities.settings import AgentSettings


def _infra(e: Exception) -> ApplicationError:
    return ApplicationError(str(e), type="ArtifactStoreError", non_retryable=True)


_LEDGER_INDEX: dict[str, dict[str, str]] = {}  # ledger head -> candidate id -> what came of it
_LEDGER_LOCK = threading.Lock()


def ledger_index(store: ArtifactStore, ledger_key: str | None) -> dict[str, str]:
    """Every candidate recorded in the run's ledger (all earlier runs), with a one-line outcome. A
    ledger head names immutable chunks, so the index is kept per head."""
    if not ledger_key:
        return {}
    with _LEDGER_LOCK:
        if ledger_key in _LEDGER_INDEX:
            return _LEDGER_INDEX[ledger_key]
    from activities.ledger import read_ledger

    out: dict[str, str] = {}
    for r in read_ledger(store, ledger_key):
        out.setdefault(r.candidate_id, f"iteration {r.iteration}: {r.outcome}, {model_result_text(r, 200)}")
    with _LEDGER_LOCK:
        if len(_LEDGER_INDEX) > 64:
            _LEDGER_INDEX.clear()
        _LEDGER_INDEX[ledger_key] = out
    return out


def _retry_quietly(e: ApplicationError, turn: int) -> ApplicationError:
    """An endpoint failure that Temporal retries (down, timing out, 5xx, 429) is logged here in one line
    per attempt, and raised as benign, so the worker does not print a traceback for each retry; one that
    pauses the run is raised as it is."""
    if e.non_retryable:
        return e
    attempt = activity.info().attempt
    activity.logger.warning("llm turn %d, attempt %d failed; retried by Temporal: %s", turn, attempt,
                            (e.message or type(e).__name__).splitlines()[0][:300])
    return ApplicationError(e.message, *e.details, type=e.type, next_retry_delay=e.next_retry_delay,
                            category=ApplicationErrorCategory.BENIGN)


def line_range(text: str, label: str, args: dict) -> str:
    """Lines start_line..end_line of a file (1-based, inclusive), headed with where they are."""
    lines = text.splitlines()
    try:
        first = max(1, int(args.get("start_line") or 1))
        last = int(args.get("end_line") or first + READ_LINES_DEFAULT - 1)
    except (TypeError, ValueError):
        first, last = 1, READ_LINES_DEFAULT
    last = min(max(first, last), len(lines))
    more = f"; lines {last + 1}-{len(lines)} follow: read them with start_line={last + 1}" if last < len(lines) else ""
    return f"# {label} lines {first}-{last} of {len(lines)}{more}\n" + "\n".join(lines[first - 1:last]) + "\n"


class LlmActivities:
    """The llm policy's activities over the worker's settings, read when the worker was built."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings

    @activity.defn(name="llm_turn")
    def llm_turn(self, req: LlmTurnRequest) -> LlmTurnResult:
        """One model turn: prompt -> reply -> tool calls. The prompt, the raw reply and the answers to the
        previous turn are appended to the conversation (a chain of turn records in the artifact store)."""
        store = self.settings.store
        ep = with_server_context(self.settings.llm.endpoint(req.model))
        built: dict = {}
        # a model stuck without submitting must call the submission alone (workflows/llm_progress.py)
        only = "submit_kernel" if req.submit_only else None

        def build(s: Profile, shrink: int) -> list[dict]:
            mode = "text" if s.tool_mode == "text" else "native"
            tools = offered_tools(TOOLS, s, only)
            try:
                msgs = fit_prompt(req, store, s, shrink, mode, tools)
            except ArtifactStoreError as e:
                raise _infra(e) from e
            built.update(messages=msgs, mode=mode, tools=tools)
            return msgs

        try:
            seen = ledger_index(store, req.ledger_key)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        try:  # only the submission open: a call is required (tool_choice, where the profile allows)
            reply = chat(build, ep, TOOLS, adapted=req.adapted, only=only)
        except ApplicationError as e:
            raise _retry_quietly(e, req.turn) from None
        messages = built["messages"]
        try:
            prompt_key = store.put_json({"kind": "llm-prompt", "model": ep.model, "messages": messages,
                                         "tools": [t["function"]["name"] for t in built["tools"]] if reply.mode == "native" else [],
                                         "mode": reply.mode})
            try:
                calls, feedback = parse_calls(reply, req.turn, req.problem, store, seen, req.submit_only)
            except ArtifactStoreError:
                raise
            except Exception as e:  # noqa: BLE001 - a paid reply is answered and counted, never a traceback
                calls, feedback = [], (f"Your reply could not be read ({type(e).__name__}: {str(e)[:200]}); nothing "
                                       f"was run. Call the tools again.")
            c = cost(ep, reply.tokens_in, reply.tokens_out)
            entry = {"kind": "llm-turn", "prev": req.conversation_key, "workflow_id": req.workflow_id,
                     "turn": req.turn, "iteration": req.iteration, "prompt_key": prompt_key,
                     "results": [r.model_dump(mode="json") for r in req.tool_results], "hints": req.hints,
                     "assistant": {"content": reply.content, "tool_calls": reply.tool_calls,
                                   "calls_from_text": reply.calls_from_text, "reasoning": reply.reasoning},
                     "calls": [c_.model_dump(mode="json") for c_ in calls], "feedback": feedback,
                     "usage": {"tokens_in": reply.tokens_in, "tokens_out": reply.tokens_out},
                     "latency_s": round(reply.latency_s, 3), "cost_usd": c, "model": reply.model,
                     "finish_reason": reply.finish_reason, "mode": reply.mode, "learned": reply.learned}
            conv = store.put_json(entry)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        activity.logger.info("llm turn %d: %d in / %d out tokens, %.2f s, %d tool calls", req.turn,
                             reply.tokens_in, reply.tokens_out, reply.latency_s, len(calls))
        prose = FENCE.sub("[code]", text_tool_calls(reply.content)[1] if reply.calls_from_text else reply.content)
        return LlmTurnResult(conversation_key=conv, prompt_key=prompt_key, text=prose[:500],
                             tool_calls=calls, feedback=feedback, tokens_in=reply.tokens_in,
                             tokens_out=reply.tokens_out, latency_s=reply.latency_s, cost_usd=c, model=reply.model,
                             adapted=reply.adapted, learned=reply.learned)

    @activity.defn(name="llm_tool")
    def llm_tool(self, req: LlmToolRequest) -> ToolResult:
        """The tools that only read: sources of the problem, the notebook, the best kernel, a diff."""
        call = req.call
        store = self.settings.store
        try:
            folder = get_problem(req.problem).folder
            if call.name in ("read_baseline", "read_oracle", "read_starting_kernel"):
                fname = {"read_baseline": "baseline.py", "read_oracle": "oracle.py",
                         "read_starting_kernel": "kernel.py"}[call.name]
                text = line_range((folder / fname).read_text(), f"{req.problem}/{fname}", call.args)
            elif call.name == "read_notebook":
                text = line_range(store.get_text(req.notebook_key), "notebook", call.args) if req.notebook_key else \
                    "No notebook yet: it is written at the first compaction."
            elif call.name == "show_best":
                b = req.best
                if b is None:
                    text = "No kernel has passed yet."
                else:
                    measured = INTERPRETER_VERDICT if b.interpreter else \
                        f"{b.speedup:.3f}x, {b.time_ms:.4g} ms vs baseline {b.baseline_ms:.4g} ms"
                    text = (f"Best: {b.candidate_id} from iteration {b.iteration}: {measured}\n\n"
                            + store.get_text(b.source_key))
            elif call.name == "diff_against_best":
                if req.best is None:
                    text = "No best yet to diff against."
                elif not call.source_key:
                    return ToolResult(call_id=call.call_id, name=call.name, error=True,
                                      content=f"unknown candidate_id {call.candidate_id!r}")
                else:
                    a, b = store.get_text(req.best.source_key), store.get_text(call.source_key)
                    text = "".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                                        f"best {req.best.candidate_id}",
                                                        call.candidate_id or "candidate")) or "identical to the best"
            else:
                return ToolResult(call_id=call.call_id, name=call.name, error=True,
                                  content=f"{call.name} is not a read-only tool")
            key = store.put_text(text)
        except ArtifactStoreError as e:
            raise _infra(e) from e
        # Only the key goes back: sources stay out of workflow history (the next turn reads the content).
        return ToolResult(call_id=call.call_id, name=call.name, content_key=key, content=f"{len(text)} characters")

    def all(self) -> list:
        return [self.llm_turn, self.llm_tool]
