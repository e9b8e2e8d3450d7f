"""Policy `llm`: the model rewrites the notebook at each compaction.

`rewrite_notebook` runs inside the `compact_notebook` activity. It gives the model the previous notebook,
the deterministic summary of every record so far, the records since the last compaction and what
compile/check/benchmark/profile answered in those turns, and asks for a rewritten notebook: strategies
tried and why they failed, what the profiler said, what to try next. The version header (`# Notebook:
..., version N` / `previous version: KEY`), the facts from the records and what failed and why are always
the deterministic ones (whatever the model keeps), so the chain stays readable with `marathon notebook
ID` whatever the model writes; the model's part follows a `## The model's notes` heading. A rewrite cut
off at the reply limit, or one that repeats itself, is refused and the previous version's notes are
kept, with a line saying why; so they are when the endpoint fails in any way, and the run carries on.
After the token budget is spent the final version makes no call; after another budget stop its reply
is capped at FINAL_REPLY_TOKENS.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import replace

from activities.llm.endpoint import LlmSettings
from workflows.artifacts import ArtifactStore, ArtifactStoreError
from workflows.contracts import CompactRequest
from workflows.text import clip, model_result_text

NOTEBOOK_SYSTEM = """You keep the engineering notebook of a long GPU-kernel optimization run. The \
notebook is the run's only long-term memory: the next turns see it instead of the full history. \
Rewrite it from the previous notebook and the new records. Keep what still matters, drop what does \
not. Sections: what works (with numbers), strategies tried and why they failed (compile errors, wrong \
results, slower), what the profiler said, open ideas to try next. Markdown, at most about 900 words. \
Do not invent measurements: use the numbers given."""


def _record_lines(req: CompactRequest) -> list[str]:
    out = []
    for r in req.records[-60:]:
        out.append(f"- #{r.iteration} {r.candidate_id} {r.outcome}: {model_result_text(r, 200)}; "
                   f"rationale: {clip(r.rationale, 160)}")
    return out


_KEPT_SECTIONS = ("## What failed", "## Operator hints")  # kept verbatim whatever the model writes


_GPU_TOOLS = ("compile", "check", "benchmark", "profile")
MAX_TURNS_READ = 16  # turn records walked back for the tool results since the last compaction


def _tool_result_lines(req: CompactRequest, store: ArtifactStore) -> list[str]:
    """What compile/check/benchmark/profile answered since the last compaction (oldest first): the
    records hold only submissions, and the profiler's and compiler's words are what explain them."""
    since = req.records[0].iteration - 1 if req.records else None
    turns, key = [], req.conversation_key
    while key and len(turns) < MAX_TURNS_READ:
        try:
            entry = store.get_json(key)
        except ArtifactStoreError:
            break
        turns.append(entry)
        if since is not None and entry.get("iteration", 0) < since:
            break
        key = entry.get("prev")
    turns.reverse()
    out = []
    for i, t in enumerate(turns):
        answers = turns[i + 1].get("results", []) if i + 1 < len(turns) else \
            [r.model_dump(mode="json") for r in req.tool_results]
        cids = {c.get("call_id"): c.get("candidate_id") for c in t.get("calls") or []}
        for r in answers:
            if r.get("name") not in _GPU_TOOLS or not r.get("content"):
                continue
            text = " ".join(r["content"].split())[:300]
            cid = cids.get(r.get("call_id"))
            out.append(f"- turn {t.get('turn')} {r['name']}{f' {cid}' if cid else ''}: {text}")
    return out[-40:]


def _header_and_facts(deterministic_text: str) -> tuple[str, str, str]:
    """(version header, the facts from the records, the sections kept verbatim: what failed and why,
    the operator's hints) of the deterministic notebook."""
    lines = deterministic_text.splitlines()
    header = "\n".join(lines[:2])
    facts, kept = [], []
    section = facts
    for ln in lines[2:]:
        if ln.startswith("## "):
            section = kept if ln.startswith(_KEPT_SECTIONS) else facts if ln.startswith("## Totals") else None
            if section is kept and kept:
                kept.append("")
        if section is not None:
            section.append(ln)
    return header, "\n".join(facts).strip(), "\n".join(kept).strip()


NOTES_HEAD = "## The model's notes"
FINAL_REPLY_TOKENS = 1500  # the rewrite after a budget stop: about the 900 words asked, no more


def model_notes(notebook: str) -> str:
    """The model-written part of a notebook version ("" for a deterministic one)."""
    i = notebook.find("\n" + NOTES_HEAD + "\n")
    return notebook[i + len(NOTES_HEAD) + 2:].strip() if i >= 0 else ""


def degenerate(text: str) -> str | None:
    """Why a rewrite is not a notebook but a model repeating itself, or None."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) >= 8:
        top, n = Counter(lines).most_common(1)[0]
        if n >= 5 and n * 3 >= len(lines):
            return f"it repeats itself: one line is {n} of its {len(lines)} lines ({clip(top, 60)!r})"
    raw = text.encode()
    if len(raw) >= 1500:
        ratio = len(zlib.compress(raw, 9)) / len(raw)
        if ratio < 0.12:  # prose and code compress to 30-50 %; a loop of the same words to a few %
            return f"it repeats itself: it compresses to {ratio:.0%} of its size"
    return None


def _version(header: str, facts: str, verbatim: str, notes: str, note: str = "") -> str:
    text = f"{header}\n\n{facts}\n\n" + (f"{verbatim}\n\n" if verbatim else "") + (f"{note}\n\n" if note else "")
    return text + (f"{NOTES_HEAD}\n\n{notes}\n" if notes else "")


def rewrite_notebook(req: CompactRequest, deterministic_text: str, store: ArtifactStore,
                     llm: LlmSettings) -> tuple[str, int, int]:
    """(notebook text, tokens in, tokens out). Never raises for an endpoint failure."""
    from activities.llm.chat import chat

    previous = ""
    if req.notebook_key:
        try:
            previous = store.get_text(req.notebook_key)
        except ArtifactStoreError:
            previous = ""
    if req.hints:
        deterministic_text = (deterministic_text.rstrip() + "\n\n## Operator hints in force\n"
                              + "\n".join(f"- {h}" for h in req.hints) + "\n")
    header, facts, verbatim = _header_and_facts(deterministic_text)
    kept = model_notes(previous)
    kept_words = (f"the notes of version {req.notebook_version} are kept" if kept else
                  "this version is the deterministic summary of the records")
    if req.stopped_by == "budget-tokens":
        return _version(header, facts, verbatim, kept, f"> The token budget is spent: the model did not rewrite "
                                                       f"this version; {kept_words}."), 0, 0
    user = "\n\n".join([
        f"Problem: {req.problem}. Run {req.run}. This will be notebook version "
        f"{req.notebook_version + 1}{' (the final one: the run is ending)' if req.final else ''}.",
        "# Previous notebook\n" + (previous or "(none: this is the first version)"),
        "# Summary computed from all records so far\n" + deterministic_text,
        "# Records since the last compaction\n" + ("\n".join(_record_lines(req)) or "(none)"),
        "# What compile, check, benchmark and profile said since the last compaction\n"
        + ("\n".join(_tool_result_lines(req, store)) or "(nothing)"),
        "Write the new notebook now (without the version header; it is added for you)."])
    try:
        ep = llm.endpoint(req.model)
        if req.stopped_by and req.stopped_by.startswith("budget-"):
            cap = min(FINAL_REPLY_TOKENS, ep.profile.reply_tokens or FINAL_REPLY_TOKENS)
            ep = replace(ep, profile=replace(ep.profile, reply_tokens=cap), explicit=ep.explicit | {"reply_tokens"})
        reply = chat([{"role": "system", "content": NOTEBOOK_SYSTEM}, {"role": "user", "content": user}], ep,
                     adapted=req.adapted)
    except Exception as e:  # noqa: BLE001 - any failure: the deterministic notebook and the kept notes
        reason = str(e).splitlines()[0][:300] if str(e) else type(e).__name__
        return _version(header, facts, verbatim, kept, f"> The model did not rewrite this version ({reason}); "
                                                       f"{kept_words}."), 0, 0
    # A model that repeats the header must not confuse the version chain.
    body = "\n".join(ln for ln in reply.content.strip().splitlines() if ln.strip() != NOTES_HEAD
                     and not ln.startswith(("# Notebook:", "previous version:"))).strip()
    refused = ("it was cut off at the reply limit" + (f" of {reply.tokens_out} tokens" if reply.tokens_out else "")
               if reply.finish_reason == "length" else "it is empty" if not body else degenerate(body))
    if refused:
        return _version(header, facts, verbatim, kept, f"> The model's rewrite was refused ({refused}); "
                                                       f"{kept_words}."), reply.tokens_in, reply.tokens_out
    # Failures and hints are kept verbatim whatever the model wrote: a summariser that drops them would
    # let the next turns walk into the same dead ends, or forget what the operator asked.
    return _version(header, facts, verbatim, body), reply.tokens_in, reply.tokens_out
