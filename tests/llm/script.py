"""Scripted model behaviour for the llm tests."""

from __future__ import annotations

import json

from tests.llm.server import Reply, completion, is_compaction


class TurnScript:
    """Turn requests take the next scripted item; compaction requests (notebook rewrites) go to
    `compaction`. An item is a Reply or a callable(body) -> Reply. When the script runs out the
    model answers with prose and no tool call (the run ends once it has been idle long enough)."""

    def __init__(self, turns, compaction=None) -> None:
        self.turns = list(turns)
        self.i = 0
        self.compaction_n = 0
        self.compaction = compaction or self.default_compaction

    def default_compaction(self, body) -> Reply:
        self.compaction_n += 1
        return completion(f"## What works\nNOTEBOOK-MARK-{self.compaction_n}: bigger blocks and more warps helped.\n"
                          f"## Next\ntry the single-pass variant", prompt_tokens=prompt_tokens(body),
                          completion_tokens=40)

    def __call__(self, body, headers) -> Reply:
        if is_compaction(body):
            return self.compaction(body)
        if self.i < len(self.turns):
            item = self.turns[self.i]
            self.i += 1
            return item(body) if callable(item) else item
        return completion("I have nothing more to try.", prompt_tokens=prompt_tokens(body), completion_tokens=8)


def prompt_tokens(body) -> int:
    return len(json.dumps(body.get("messages", []))) // 4


def turn(*calls, content=None, completion_tokens=30):
    """A scripted turn whose reported prompt size follows the real prompt."""
    return lambda body: completion(content, list(calls), prompt_tokens=prompt_tokens(body),
                                   completion_tokens=completion_tokens)
