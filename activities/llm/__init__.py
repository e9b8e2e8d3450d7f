"""Policy `llm`: a model works through tools, as activities of the agent worker (docs/llm.md).

endpoint: the endpoint's kind and the worker's configuration of it · errors: what each failure is, retried
or pausing the run · chat: one request, refusals answered by the change they name · replies: a reply in
any shape as one Reply · sources: kernel modules in a model's text · tools: the tool schemas and the text
protocol · calls: a reply's tool calls checked and stored · history and prompt: the turn's prompt within a
token budget · activities: `llm_turn` and `llm_tool` · compaction: the model's notebook rewrite · check:
`marathon llm-check`.
"""
