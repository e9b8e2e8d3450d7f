"""Policy llm with the real GPU worker activities: Triton kernels from the scripted model run under
the Triton interpreter in the sandbox (compile, correctness check, benchmark), end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.ledger import read_ledger
from baselines.registry import get_problem
from tests.llm.script import TurnScript, turn
from tests.llm.server import ChatServer
from tests.workflows.helpers import start
from workflows.contracts import RunSpec

# The harness's own "wrong" canary: it skips the max subtraction, so exp overflows on the "wide" inputs
# and the check must fail.
UNSAFE = (Path(__file__).resolve().parents[2] / "gpu_worker" / "canaries" / "wrong.py").read_text()


@pytest.mark.slow(40)
async def test_llm_with_real_interpreter_kernels(env, store, llm_env, real_gpu):
    from tests.workflows.helpers import workers

    p = get_problem("softmax")
    single = p.render({"VARIANT": "single", "BLOCK_N": 512})
    script = TurnScript([
        turn(("compile", {"source": single}), ("check", {"source": UNSAFE})),
        turn(("submit_kernel", {"source": single, "rationale": "one pass over the row"}),
             ("submit_kernel", {"source": "import torch\n\ndef run(inputs, out):\n"
                                          "    out['y'].copy_(torch.softmax(inputs['x'], -1))\n",
                                "rationale": "library softmax"})),
    ])
    with ChatServer(script) as server:
        llm_env(server)
        async with workers(env.client, real_gpu):
            h = await start(env.client, RunSpec(problem="softmax", policy="llm", budget={"iterations": 2}),
                            "llm-interp")
            res = await h.result()
        turns = server.turns()
    recs = read_ledger(store, res.ledger_key)
    assert [r.iteration for r in recs] == [1, 2]
    assert recs[0].outcome == "improved" and recs[0].interpreter and recs[0].speedup > 0
    assert recs[1].outcome == "rejected" and recs[1].stage == "rules" and "library-kernel" in recs[1].reason
    # the second turn's prompt carries the real compile report and the failed check
    answers = [m["content"] for m in turns[1].body["messages"] if m["role"] == "tool"]
    assert answers[0].startswith("compiled (interpreter)") and "_softmax_single" in answers[0]
    assert answers[1].startswith("ERROR: incorrect")
