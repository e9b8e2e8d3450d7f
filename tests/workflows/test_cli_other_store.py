"""`report` and `notebook` read a finished run's artifacts from this machine's store: where that store is not
the one the workers wrote (another MARATHON_HOME or MARATHON_ARTIFACTS), one line and exit status 2, as
`export` says, not a traceback."""

from __future__ import annotations

import asyncio

from cli import main
from tests.workflows.helpers import start, workers
from workflows.contracts import RunSpec


async def test_report_and_notebook_from_another_store_are_one_line(env, store, tmp_path, monkeypatch, capsys):
    address = env.client.service_client.config.target_host
    async with workers(env.client):
        h = await start(env.client, RunSpec(problem="softmax", budget={"iterations": 3}, compact_every=2), "store")
        res = await asyncio.wait_for(h.result(), 120)
    assert res.notebook_key and res.ledger_key
    monkeypatch.setenv("MARATHON_ARTIFACTS", str(tmp_path / "elsewhere"))
    for argv in (["report", h.id, "--out", str(tmp_path / "r")], ["notebook", h.id]):
        capsys.readouterr()
        rc = await asyncio.to_thread(main, [*argv, "--address", address])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert "not found under" in err and "MARATHON_ARTIFACTS" in err, (argv, err)
