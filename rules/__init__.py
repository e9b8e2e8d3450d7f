"""Static rules for candidate sources, shared by the agent worker (checks a proposal before it is sent)
and the GPU worker (checks it again before it runs): pure Python on the AST, no torch import, no I/O.

A candidate is written in a small language, checked by what it may contain: `host_language.py` lists its
Python (imports, statements, builtins, the members of torch, triton and math, the attributes of values)
and LANGUAGE_RULE, the same in the words told to proposers; `triton_language.py` lists what its
@triton.jit functions may use; `check.py` walks the source (check_source) and refuses everything else;
`refusals.py` names the rule a refused name breaks; `torch_ops.py` holds what a candidate's torch may do
(ALLOWED_ATEN_OPS, which the GPU worker's run-time guard enforces) and TORCH_RULE.
"""
