"""The tools the model calls: their schemas, and the plain-text protocol for endpoints without native
tool calls (and for models that write their calls into the reply's text)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex

from activities.llm.sources import FENCE

READ_LINES_DEFAULT = 480  # lines a read tool returns when no range is asked for
SOURCE_TOOLS = {"submit_kernel", "compile", "check", "benchmark", "profile", "diff_against_best"}


def tool_schema(name: str, description: str, props: dict | None = None, required: list[str] | None = None) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props or {}, "required": required or [],
                       "additionalProperties": False}}}


_RANGE = {"start_line": {"type": "integer", "description": "first line to read (1-based; default 1)"},
          "end_line": {"type": "integer", "description": f"last line to read (default: {READ_LINES_DEFAULT} lines on)"}}
RANGE_TOOLS = {"read_baseline", "read_oracle", "read_starting_kernel", "read_notebook"}

_SRC = {"source": {"type": "string", "description": "the complete candidate module (Python + Triton)"},
        "candidate_id": {"type": "string", "description": "or: the id of a kernel seen before"}}

TOOLS = [
    tool_schema("submit_kernel", "Submit a complete candidate module for evaluation: rules, compile, correctness "
        "check, benchmark. Uses one iteration of the budget; a faster correct kernel becomes the best.",
        {"source": _SRC["source"],
         "rationale": {"type": "string", "description": "one line: what this tries and why"}},
        ["source", "rationale"]),
    tool_schema("compile", "Compile a kernel without submitting it: errors, registers, spills, shared memory.", _SRC),
    tool_schema("check", "Run the correctness check (all seeds and input distributions) without submitting.", _SRC),
    tool_schema("benchmark", "Time a kernel against the baseline and the current best, without submitting.", _SRC),
    tool_schema("profile", "The harness's profile summary of a kernel (compile stats, profiler, what bounds it).",
        _SRC),
    tool_schema("read_baseline", "Read the source of the baseline the kernels race against (a line range if given).",
        _RANGE),
    tool_schema("read_oracle", "Read the source of the high-precision oracle the outputs are compared with.", _RANGE),
    tool_schema("read_starting_kernel", "Read the starting kernel (the problem's template); a line range if given.",
        _RANGE),
    tool_schema("read_notebook", "Read the run's notebook: what was tried, what failed and why.", _RANGE),
    tool_schema("show_best", "Show the current best kernel's source and its measurements."),
    tool_schema("diff_against_best", "A unified diff of a kernel against the current best.", _SRC),
]
TOOL_NAMES = {t["function"]["name"] for t in TOOLS}


TEXT_PROTOCOL = """Tools are called in plain text: this endpoint takes no native tool calls. To call a \
tool, write a line

TOOL: <name> [key=value ...]

For submit_kernel, compile, check, benchmark, profile and diff_against_best, put the complete module in a \
```python fenced block right after that line (or give candidate_id=<id> of a kernel seen before). \
submit_kernel takes rationale="one line: what this tries and why". read_baseline, read_oracle, \
read_starting_kernel and read_notebook take start_line=N end_line=M for a part of a long file. Several \
TOOL: lines in one reply are run in order; a reply with a fenced module and no TOOL: line is a \
submission. The tools: """

_TOOL_LINE = re.compile(r"^[ \t>*`]*(?:TOOL|CALL)[ \t]*:[ \t]*`?([A-Za-z_]+)`?[ \t]*(.*)$", re.M)
_CALL_OPEN = re.compile(r"<tool_call>\s*|\[TOOL_CALLS\]\s*|<\|tool_call\|>\s*|<function_call>\s*")
_CALL_CLOSE = re.compile(r"\s*(</tool_call>|<\|/tool_call\|>|</function_call>)")


def _call_of(x) -> dict | None:
    """{"name", "arguments": str} from a tool call object written as JSON, in any of its usual shapes."""
    if not isinstance(x, dict):
        return None
    if isinstance(x.get("function"), dict):
        x = {**x["function"], **{k: v for k, v in x.items() if k != "function"}}
    name = x.get("name")
    if not isinstance(name, str) or not name:
        return None
    args = x.get("arguments", x.get("parameters", {}))
    return {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}


def _protocol_args(rest: str) -> dict:
    rest = rest.strip().strip("`")
    if rest.startswith("{"):
        try:
            obj = json.loads(rest)
            if isinstance(obj, dict):
                return obj
        except json.JSONDecodeError:
            pass
    args: dict = {}
    words = []
    try:
        tokens = shlex.split(rest)
    except ValueError:
        tokens = rest.split()
    for tok in tokens:
        k, eq, v = tok.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_]+", k):
            args[k] = int(v) if k in ("start_line", "end_line") and v.isdigit() else v
        else:
            words.append(tok)
    if "lines" in args and isinstance(args["lines"], str) and re.fullmatch(r"\d+-\d+", args["lines"]):
        a, b = args.pop("lines").split("-")
        args["start_line"], args["end_line"] = int(a), int(b)
    if words and "rationale" not in args:
        args["rationale"] = " ".join(words)
    return args


def _protocol_calls(content: str) -> list[dict]:
    """`TOOL: name key=value ...` lines, each with the fenced module that follows it (before the next)."""
    found = list(_TOOL_LINE.finditer(content))
    calls = []
    for i, m in enumerate(found):
        name, args = m.group(1), _protocol_args(m.group(2))
        segment = content[m.end(): found[i + 1].start() if i + 1 < len(found) else len(content)]
        if name in SOURCE_TOOLS and "source" not in args and "candidate_id" not in args:
            blocks = [b for lang, b in FENCE.findall(segment) if lang.lower() in ("", "python", "py", "python3")]
            if blocks:
                args["source"] = blocks[0]
        if name == "submit_kernel" and "rationale" not in args:
            r = re.search(r"^\s*rationale\s*:\s*(.+)$", segment, re.M | re.I)
            args["rationale"] = r.group(1).strip() if r else "submitted in text mode"
        calls.append({"name": name, "arguments": json.dumps(args)})
    return calls


def text_tool_calls(content: str) -> tuple[list[dict], str]:
    """Tool calls a model wrote in its reply's text instead of sending them natively: <tool_call>{...}
    </tool_call> (Hermes/Qwen), [TOOL_CALLS][...] (Mistral), a reply that is one JSON call, or this
    project's `TOOL:` lines. Returns (calls with ids, the prose around the JSON calls)."""
    calls: list[dict] = []
    prose = content
    dec = json.JSONDecoder()
    spans = []
    for m in _CALL_OPEN.finditer(content):
        try:
            obj, end = dec.raw_decode(content, m.end())
        except ValueError:
            continue
        got = [c for c in (_call_of(x) for x in (obj if isinstance(obj, list) else [obj])) if c]
        if got:
            calls += got
            close = _CALL_CLOSE.match(content, end)
            spans.append((m.start(), close.end() if close else end))
    for a, b in reversed(spans):
        prose = prose[:a] + prose[b:]
    if not calls:
        body = re.sub(r"^```(?:json)?\s*|\s*```$", "", content.strip())
        if body.startswith(("{", "[")):
            try:
                obj = json.loads(body)
                got = [c for c in (_call_of(x) for x in (obj if isinstance(obj, list) else [obj])) if c]
                if got and all(c["name"] in TOOL_NAMES for c in got):
                    calls, prose = got, ""
            except json.JSONDecodeError:
                pass
    if not calls:
        calls = _protocol_calls(content)
    tag = hashlib.sha256(content.encode()).hexdigest()[:8]
    return [{"id": f"text_{tag}_{i}", **c} for i, c in enumerate(calls)], prose.strip()
