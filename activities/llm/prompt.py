"""The turn's prompt: the system prompt, the objective, the starting kernel and the notebook (the same
from turn to turn, so a provider's prompt cache covers them), the last turns, then the run's state, top-k
kernels and the operator's hints, within a token budget."""

from __future__ import annotations

import difflib

from baselines.registry import get_problem
from rules.host_language import LANGUAGE_RULE
from rules.torch_ops import TORCH_RULE
from workflows.artifacts import ArtifactStore, ArtifactStoreError
from workflows.contracts import Budget, LlmTurnRequest, Used
from workflows.text import INTERPRETER_VERDICT, clip, model_result_text
from activities.llm.context import endpoint_room, too_small
from activities.llm.endpoint import Endpoint, Profile
from activities.llm.errors import ContextTooSmall
from activities.llm.history import history_units, load_turns, result_text
from activities.llm.replies import estimate_tokens
from activities.llm.tools import TEXT_PROTOCOL, TOOLS

HISTORY_TURNS = 4  # past turns replayed verbatim in a prompt (older ones live in the notebook)
TOOL_CONTENT_CHARS = 6000  # one tool answer of an older turn in a prompt, at most
LAST_TOOL_CONTENT_CHARS = 24000  # one answer to the latest turn: a whole template fits (KDA's is 22.9 k)

_ROLE = """You are an expert GPU kernel engineer in a long optimization run. You write Triton \
kernels and iterate like an expert: write, compile, check, profile, think, try again. You act only \
through the tools; every kernel you want measured for real goes through submit_kernel. A submission's \
answer brings the kernel's profile when it is a new best; ask `profile` for any other."""

_CANDIDATE = """A candidate is one Python module that defines `run(inputs, out)`: `inputs` maps names to \
tensors, `out` maps output names to preallocated tensors that `run` must fill in place (they are poisoned with NaN \
first). Keep a top-level `KNOBS = {...}` line if you like; it is optional."""

_RULES = """Rules (the harness rejects a candidate that breaks one, naming the rule):
- Triton only: no third-party kernel libraries (flash_attn, flashinfer, xformers, fla, liger, cutlass, \
...), no torch.ops / torch.compile / cuBLAS matmuls / the problem's own PyTorch op doing the work.
- """ + TORCH_RULE + """
- """ + LANGUAGE_RULE + """
- No CUDA streams, events, graphs or synchronisation games with the timer; no try/except fallbacks; \
no caching keyed by data_ptr/id/storage; no Tensor subclasses or __torch_function__ tricks.
- Results must match the oracle within the problem's tolerance on every seed and input distribution."""

# The rules in one paragraph (about 100 estimated tokens against 660): the harness names a broken rule in its
# answer, so a small context spends its room on the kernel and the turns instead
_RULES_BRIEF = """Rules (the harness rejects a candidate that breaks one, naming the rule): Triton does the \
work (no third-party kernel libraries, torch ops or cuBLAS doing it); in run(), torch only allocates, \
views, copies, casts and fills; imports of torch, triton, triton.language and math only; no streams, graphs, \
try/except fallbacks or pointer-keyed caches; results within the problem's tolerance."""

_REPLY = "Reply with tool calls. Put complete sources in the `source` argument, never a fragment or a diff."

SYSTEM_PROMPT = "\n\n".join([_ROLE, _CANDIDATE, _RULES, _REPLY])
COMPACT_SYSTEM_PROMPT = "\n\n".join([_ROLE, _CANDIDATE, _RULES_BRIEF, _REPLY])
COMPACT_CONTEXT = 8192  # an endpoint context of at most this many tokens gets COMPACT_SYSTEM_PROMPT


def compact_prompt(s: Profile) -> bool:
    """Whether the endpoint's known context is small enough for the compact system prompt: there the full
    rules would take a tenth of the context on every turn (and a 4,096-token context could not hold the
    first prompt at all), and a CPU-served model evaluates them again whenever the prompt's start changes."""
    return bool(s.context_tokens) and s.context_tokens <= COMPACT_CONTEXT


def _problem_facts(req: LlmTurnRequest) -> list[str]:
    p = get_problem(req.problem)
    shapes = ", ".join(s.name for s in p.shapes)
    target = req.shape or "the primary GPU shape (or the CPU shape under the interpreter)"
    facts = [f"Problem: {p.name}: {p.description}",
             f"Shapes: {shapes}; CPU/interpreter shape {p.cpu_shape.name}. Timed on: {target}."]
    timed = [x for x in [*p.shapes, p.cpu_shape] if x.name == req.shape] or p.shapes[:1]
    for shape in timed:
        try:
            fl, by = p.flops(shape), p.bytes_moved(shape)
        except (NotImplementedError, KeyError, TypeError, ValueError):
            continue
        dims = ", ".join(f"{k}={v}" for k, v in shape.params.items())
        facts.append(f"Work at {shape.name} ({dims}): {fl / 1e9:.4g} GFLOP and at least {by / 1e6:.4g} MB moved "
                     f"({fl / by:.3g} FLOP/byte); the floor is the slower of moving those bytes at the device's "
                     f"bandwidth and doing those FLOPs at its peak.")
    d = req.device_facts
    if d is not None:  # known once the run's first benchmark on a GPU has come back
        facts.append(f"GPU: {d.device}; measured ceilings {d.bandwidth_tbps:.2f} TB/s device copy and "
                     f"{d.matmul_tflops:.0f} TFLOP/s bf16 matmul; the timed shape's floor at those rates is "
                     f"{d.floor_ms:.4g} ms. Timing is device time (CUDA-graph replay or back to back with the "
                     f"host ahead) on every input distribution; the worst speedup decides; host launch cost "
                     f"is reported apart and counts for nothing.")
    return facts + [
        f"Inputs: see read_starting_kernel / read_baseline. Outputs compared with the oracle: "
        f"{', '.join(p.outputs)}; pass iff rel-RMS error <= max({p.tolerance_floor:g}, "
        f"{p.tolerance_alpha:g} x the baseline's own error)."]


def objective(req: LlmTurnRequest) -> str:
    """The goal, restated in full every turn: iteration 700 aims at the same target as iteration 1. It
    is the same text every turn (what changes is in run_state), so the prompt's start can be cached."""
    return "\n".join(["# Objective", "Make the fastest correct Triton kernel for this problem. Faster than the "
                      "baseline is the minimum; beat the current best.", *_problem_facts(req),
                      "Rules: Triton only; no third-party kernel libraries or library kernels doing the work; "
                      "the harness rejects forbidden imports, exec/eval/getattr, streams/events/graphs, "
                      "try/except fallbacks, pointer-keyed caches, Tensor subclasses, wrong results."])


def run_state(req: LlmTurnRequest) -> str:
    """Where the run stands this turn: the baseline's time, the best, what is left of the budget."""
    b, u, bud = req.best, req.used, req.budget
    lines = ["# Where the run stands"]
    lines.append(f"Baseline time: {req.baseline_ms:.4g} ms" if req.baseline_ms else
                 "Baseline time: not measured yet (the first submission measures it).")
    if b and b.interpreter:
        lines.append(f"Current best: {b.candidate_id} from iteration {b.iteration}; {INTERPRETER_VERDICT}.")
    elif b:
        worst = f" on {b.deciding_dist}, its worst input distribution" if b.deciding_dist else ""
        lines.append(f"Current best: {b.candidate_id} from iteration {b.iteration}: {b.speedup:.3f}x the "
                     f"baseline{worst}, {b.time_ms:.4g} ms. A new best needs a worst speedup over the input "
                     f"distributions above the best's with 95% confidence; being slower than the best on a "
                     f"distribution that is not its worst is allowed.")
    else:
        lines.append("Current best: none yet: submit a correct kernel first.")
    left = []
    if bud.iterations is not None:
        left.append(f"{bud.iterations - u.iterations} of {bud.iterations} submissions")
    if bud.tokens is not None:
        left.append(f"{bud.tokens - u.tokens} of {bud.tokens} tokens")
    if bud.hours is not None:
        left.append(f"{max(0.0, bud.hours - u.seconds / 3600):.2f} of {bud.hours} hours")
    if bud.gpu_seconds is not None:
        left.append(f"{bud.gpu_seconds - u.gpu_seconds:.0f} of {bud.gpu_seconds:.0f} GPU-seconds")
    lines.append(f"Remaining budget: {'; '.join(left) or 'unlimited'}. Used so far: {u.iterations} "
                 f"submissions, {u.turns} turns, {u.tool_calls} tool calls.")
    return "\n".join(lines)


def _starting_source(problem: str) -> str | None:
    try:
        return get_problem(problem).template()
    except (OSError, LookupError, ValueError):
        return None


def _template_block(problem: str) -> str:
    try:
        src = (get_problem(problem).folder / "kernel.py").read_text()
    except OSError:
        return ""
    return "# The starting kernel (the problem's template, kernel.py)\n```python\n" + src.rstrip() + "\n```"


def _records_block(req: LlmTurnRequest) -> str:
    if not req.recent:
        return ""
    lines = ["# Latest submissions"]
    for r in req.recent[-8:]:
        lines.append(f"- #{r.iteration} {r.candidate_id} {r.outcome}: {model_result_text(r, 160)}; "
                     f"{clip(r.rationale, 100)}")
    return "\n".join(lines)


def _kernels_block(req: LlmTurnRequest, store: ArtifactStore, with_diffs: bool, base: str | None = None) -> str:
    """The best kernel in full (with `base`, the starting kernel, as a diff against it where that is
    shorter: for prompts too small for the whole source), then with_diffs the leaderboard against the best."""
    best_src = None
    lines = []
    # under the interpreter (its best's timings are the run's) a ratio says nothing: the entries are unranked
    interp = req.best is not None and req.best.interpreter

    def speed(x: float) -> str:
        return "interpreter" if interp else f"{x:.3f}x"

    if req.best is not None:
        try:
            best_src = store.get_text(req.best.source_key)
        except ArtifactStoreError:
            best_src = None
    if best_src:
        head = f"## 1. {req.best.candidate_id} (the best, {speed(req.best.speedup)})"
        same = base is not None and best_src.rstrip() == base.rstrip()
        diff = "".join(difflib.unified_diff(base.splitlines(True), best_src.splitlines(True), "start",
                                            req.best.candidate_id, n=1)) if base and not same else None
        if same:
            lines += ["# Top kernels", head + ": identical to the starting kernel (read_starting_kernel shows it)"]
        elif diff is not None and len(diff) < len(best_src):
            lines += ["# Top kernels", head + ", as a diff against the starting kernel (read_starting_kernel "
                      "shows it)", "```diff", diff.rstrip(), "```"]
        else:
            lines += ["# Top kernels", head, "```python", best_src.rstrip(), "```"]
    if not with_diffs:
        return "\n".join(lines)
    for i, e in enumerate((e for e in req.leaderboard if not req.best or e.candidate_id != req.best.candidate_id),
                          2):
        try:
            src = store.get_text(e.source_key)
        except ArtifactStoreError:
            continue
        if best_src:
            diff = "".join(difflib.unified_diff(best_src.splitlines(True), src.splitlines(True),
                                                "best", e.candidate_id, n=1))
            if len(diff) < len(src):
                lines += [f"## {i}. {e.candidate_id} ({speed(e.speedup)}), as a diff against the best",
                          "```diff", diff.rstrip(), "```"]
                continue
        lines += [f"## {i}. {e.candidate_id} ({speed(e.speedup)})", "```python", src.rstrip(), "```"]
    return "\n".join(lines)


def system_prompt(mode: str, compact: bool = False) -> str:
    base = COMPACT_SYSTEM_PROMPT if compact else SYSTEM_PROMPT
    if mode != "text":
        return base
    return (base.rsplit("\n\n", 1)[0] + "\n\n" + TEXT_PROTOCOL
            + "; ".join(f"{t['function']['name']} ({t['function']['description']})" for t in TOOLS) + ".")


def build_messages(req: LlmTurnRequest, store: ArtifactStore, mode: str = "native",
                   budget: int | None = None, compact: bool = False, answers_in_user: bool = False) -> list[dict]:
    """The turn's prompt, within `budget` estimated tokens (default: req.context_tokens, less the tool
    schemas in native mode): system, the objective, the starting kernel and the notebook (the same from
    turn to turn), the last turns, then the run's state. To fit, it sheds the template once there is a
    best (keeping the two latest turns), old turns, the non-best kernels, the notebook's middle, long tool
    answers, the latest turn's kernels in full (named and diffed instead), then the best kernel's lines
    that the starting kernel has too. The objective, the best (else the template) and the latest turn
    with its answers always stay. `compact`: the compact system prompt (compact_prompt); `answers_in_user`:
    the tools' answers repeated in a user message (history_units)."""
    notebook = ""
    if req.notebook_key:
        try:
            notebook = store.get_text(req.notebook_key)
        except ArtifactStoreError:
            notebook = "(the notebook could not be read)"
    turns = load_turns(store, req.conversation_key, HISTORY_TURNS)
    hints = req.hints
    past_hints = [h for h in req.standing_hints if h not in hints]
    template = _template_block(req.problem)
    base = _starting_source(req.problem)  # older turns' kernels replay as a diff against it
    call = "call tools" if mode != "text" else "call tools with TOOL: lines"
    tail = []
    if hints:
        tail.append("New hints from the operator (act on them):\n" + "\n".join(f"- {h}" for h in hints))
    if req.turns_per_iteration:
        left = req.turns_per_iteration - req.turns_since_submission
        if left <= max(3, req.turns_per_iteration // 5):
            tail.append(f"Only {left} turn{'s' if left != 1 else ''} left to record a new submission: after "
                        f"{req.turns_per_iteration} turns without one the run stops. Submit a kernel now.")
    if req.submit_only:
        how = ("write `TOOL: submit_kernel rationale=\"...\"` with the complete module in a ```python block after it"
               if mode == "text" else "call submit_kernel with the complete module in `source` and a `rationale`")
        tail.append(f"Only submit_kernel is open this turn ({req.submit_only}): {how}. The other tools open "
                    f"again once a submission is recorded.")
    if req.best and req.best.interpreter:
        tail.append(f"Goal: improve on the current best {req.best.candidate_id} for {req.problem} "
                    f"({INTERPRETER_VERDICT}). Decide your next step and {call}.")
    elif req.best:
        tail.append(f"Goal: beat {req.best.speedup:.3f}x (current best {req.best.candidate_id}) on "
                    f"{req.problem}. Decide your next step and {call}.")
    else:
        tail.append(f"Goal: a correct kernel for {req.problem} faster than the baseline. Decide your next "
                    f"step and {call}.")

    def assemble(n_turns: int, diffs: bool, nb_chars: int | None, tool_limit: int, last_limit: int,
                 with_template: bool, best_as_diff: bool = False, latest_full: bool = True) -> list[dict]:
        # What stays the same from turn to turn comes first (system, objective, template, notebook), so a
        # provider's prompt cache covers it; what changes (state, kernels, submissions, hints) comes last.
        stable = [objective(req)]
        if with_template and template:
            stable.append(template)
        if notebook:
            nb = notebook if nb_chars is None or len(notebook) <= nb_chars else (
                notebook[: nb_chars // 2] + "\n...[notebook shortened to fit the prompt]...\n"
                + notebook[-nb_chars // 2:])
            stable.append("# Notebook (compacted memory of this run)\n" + nb)
        state = [f"Turn {req.turn}.", run_state(req)]
        kb = _kernels_block(req, store, diffs, base if best_as_diff else None)
        if kb:
            state.append(kb)
        rb = _records_block(req)
        if rb:
            state.append(rb)
        if past_hints:
            state.append("# Operator hints in force\n" + "\n".join(f"- {h}" for h in past_hints))
        msgs = [{"role": "system", "content": system_prompt(mode, compact)},
                {"role": "user", "content": "\n\n".join(stable)}]
        units = history_units(turns, req.tool_results, store, tool_limit, mode, last_limit, base, latest_full,
                              answers_in_user)
        for u in units[len(units) - n_turns:] if n_turns else []:
            msgs += u
        if (not turns or not n_turns) and req.tool_results:  # answers whose turn is not shown: as text
            msgs.append({"role": "user", "content": "\n\n".join(
                f"{r.name}: {result_text(r, store, tool_limit)}" for r in req.tool_results)})
        msgs.append({"role": "user", "content": "\n\n".join(state + tail)})
        return msgs

    if budget is None:
        budget = req.context_tokens - (estimate_tokens(TOOLS) if mode != "text" else 0)
    big, small = LAST_TOOL_CONTENT_CHARS, TOOL_CONTENT_CHARS
    # What always stays: the objective, the best kernel (else the starting kernel: the code to start from)
    # and the latest turn with its answers and feedback. The template goes before the history's oldest
    # turns do, but not before the latest two.
    keep = req.best is None or not template
    plans = [(n, True, None, small, big, True) for n in range(len(turns), min(2, len(turns)) - 1, -1)]
    plans += [(n, True, None, small, big, keep) for n in range(len(turns), 0, -1)]
    plans += [(1, False, None, small, big, keep), (1, False, None, small, small, keep)]
    plans += [(1, False, c, small, small, keep) for c in (8000, 4000, 2000, 800)]
    plans += [(1, False, 800, 1500, 1500, keep), (1, False, 800, 1500, 1500, keep, False, False)]
    plans += [(1, False, 800, 1500, 1500, keep, True, False), (1, False, 400, 500, 500, keep, True, False)]
    for plan in plans:
        msgs = assemble(*plan)
        if estimate_tokens(msgs) <= budget:
            return msgs
    return msgs  # the smallest plan: what always stays, whatever it costs


def prompt_budget(req: LlmTurnRequest, s: Profile, shrink: int, mode: str, tools: list[dict] = TOOLS) -> int:
    """Estimated tokens the turn's prompt may take: the run's context_tokens, within the endpoint's
    context less the reply cap when that is known, smaller at each shrink after a refusal."""
    budget = req.context_tokens - (estimate_tokens(tools) if mode != "text" else 0)
    room = endpoint_room(s, 0, mode, tools)
    return int((budget if room is None else min(budget, room)) * 0.6 ** shrink)


def fit_prompt(req: LlmTurnRequest, store: ArtifactStore, s: Profile, shrink: int, mode: str,
               tools: list[dict] = TOOLS) -> list[dict]:
    """The turn's prompt within its budget. Raises ContextTooSmall (with the tokens it needs) when even
    the smallest prompt, which keeps only what always stays, does not fit the endpoint's known context."""
    msgs = build_messages(req, store, mode, prompt_budget(req, s, shrink, mode, tools), compact_prompt(s),
                          s.tool_answers == "user")
    room = endpoint_room(s, shrink, mode, tools)
    if room is not None and estimate_tokens(msgs) > room:
        raise ContextTooSmall(estimate_tokens(msgs) + (estimate_tokens(tools) if mode != "text" else 0))
    return msgs


LAST_TURN_TOKENS = 600  # a later turn's prompt adds its last turn, compacted, over the first one's


def context_fit(ep: Endpoint, s: Profile, mode: str) -> str | None:
    """For `marathon llm-check`: None when a run's smallest prompt (softmax, the smallest problem: the
    objective, the starting kernel, a compacted last turn) fits the known context beside the reply cap;
    else what would help. None too when the context is unknown."""
    room = endpoint_room(s, 0, mode)
    if room is None:
        return None
    req = LlmTurnRequest(workflow_id="llm-check", problem="softmax", turn=2, iteration=1, budget=Budget(),
                         used=Used(turns=1))
    smallest = build_messages(req, None, mode, budget=0, compact=compact_prompt(s))
    need = estimate_tokens(smallest) + LAST_TURN_TOKENS
    if need <= room:
        return None
    return too_small(ep, s, need + (estimate_tokens(TOOLS) if mode != "text" else 0), then="")
