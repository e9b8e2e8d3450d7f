"""Static rules for candidate sources, shared by the agent worker (checks a proposal before it is sent)
and the GPU worker (checks it again before it runs): pure Python on the AST, no torch import, no I/O.

`check.py` holds check_source and the rule tables; `names.py` follows names bound to modules;
`torch_ops.py` holds what a candidate's torch may do (ALLOWED_ATEN_OPS, which the GPU worker's run-time
guard enforces) and TORCH_RULE, the same rule in the words told to proposers.
"""
