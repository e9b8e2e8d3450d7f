"""`marathon worker` against a namespace the server does not have: one line and exit status 2 at once, not the
SDK's worker-validation traceback."""

from __future__ import annotations

import asyncio

from cli import main


async def test_a_worker_in_an_unknown_namespace_is_one_line(env, capsys):
    address = env.client.service_client.config.target_host
    capsys.readouterr()
    rc = await asyncio.wait_for(asyncio.to_thread(
        main, ["worker", "--role", "agent", "--namespace", "nosuch-ns", "--address", address]), 30)
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("marathon: error: namespace 'nosuch-ns' is not on the server at "), err
