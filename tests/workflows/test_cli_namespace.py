"""`marathon start` against a namespace the server does not have: one line and exit status 2, nothing started."""

from __future__ import annotations

import asyncio

from cli import main


async def test_start_in_an_unknown_namespace_is_one_line(env, capsys):
    address = env.client.service_client.config.target_host
    capsys.readouterr()
    rc = await asyncio.to_thread(main, ["start", "softmax", "--namespace", "nosuch-ns", "--address", address])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if not ln.startswith("warning: ")]
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("marathon: error: namespace 'nosuch-ns': ") and "not found" in lines[0], err
