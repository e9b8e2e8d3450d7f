"""The marathon CLI: bad input gets one clear line and a non-zero exit; the client commands work
against the real dev server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workflows.helpers import run_id, workers
from workflows.contracts import RunResult

MARATHON = [sys.executable, "-m", "cli"]


def marathon(*args, env_address=None, check=False):
    env = None
    if env_address:
        import os

        env = {**os.environ, "TEMPORAL_ADDRESS": env_address}
    p = subprocess.run(MARATHON + list(args), capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("args, message", [
    (["start", "nosuch"], "unknown problem 'nosuch'; known problems:"),
    (["start", "softmax", "--iterations", "0"], "budget.iterations: budget iterations must be positive"),
    (["start", "softmax", "--hours", "-2"], "budget.hours: budget hours must be positive"),
    (["start", "--spec", "{not json"], "--spec is not valid JSON"),
    (["start", "--spec", '{"problem": "softmax", "budgett": {}}'], "unknown field 'budgett'"),
    (["start", "--spec", "[1]"], "--spec must be a JSON object"),
    (["start", "softmax", "--shape", "huge"], "problem softmax has no shape 'huge'"),
    (["start", "softmax", "--population", "0"], "population must be at least 1"),
    (["start", "softmax", "--population", "24", "--compact-every", "10"],
     "compact_every 10 is below population 24: each run would continue as new with more"),
    (["start", "softmax", "--gpu-queue", "two words"], "gpu_queue must be a task queue name"),
    (["worker", "--role", "gpu", "--gpu-queue", "a/b"], "invalid --gpu-queue"),
    (["budget", "some-id", "--iterations", "-1"], "invalid budget"),
    (["budget", "some-id"], "budget needs at least one of --iterations, --hours, --tokens, --gpu-seconds, "
                            "--context-tokens"),
    (["hint", "some-id", "   "], "hint text is empty"),
    (["start", "softmax", "--spec", "@/nonexistent/spec.json"], "--spec @/nonexistent/spec.json: cannot read the file"),
    (["start", "softmax", "--iterations", "abc"], "start: argument --iterations: invalid int value: 'abc'"),
    (["status"], "status: the following arguments are required: id"),
    (["start", "softmax", "--bogus"], "unrecognized arguments: --bogus"),
    (["demo", "nosuch"], "unknown problem 'nosuch'"),  # refused before a dev server or worker starts
    (["demo", "softmax", "--iterations", "0"], "budget iterations must be positive"),
    (["bench", "nosuch"], "unknown problem 'nosuch'; known problems:"),
    (["verify", "softmax", "/nonexistent/kernel.py"], "/nonexistent/kernel.py: cannot read the kernel file"),
    (["verify", "nosuch", "README.md"], "unknown problem 'nosuch'; known problems:"),
    (["start"], "which problem? name one of kda, mla_decode, mla_prefill, softmax (`marathon problems` describes"),
    (["problems", "/nonexistent/problem.py"], "/nonexistent/problem.py: no such file or folder"),
    (["problems", "sofmax"], "unknown problem 'sofmax'; known problems: kda, mla_decode, mla_prefill, softmax"),
    (["problems", "README.md"], "README.md: syntax error at line"),
])
def test_bad_input_is_one_clear_line(args, message):
    # unreachable address: validation must fail first, before any connection is tried
    p = marathon(*args, env_address="127.0.0.1:1")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marathon: error: ") and message in lines[0], p.stderr


def test_a_bad_gpu_worker_setting_is_one_clear_line_before_connecting():
    import os

    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1", "MARATHON_WALL": "maybe"}
    p = subprocess.run(MARATHON + ["worker", "--role", "gpu"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip() == "marathon: error: MARATHON_WALL='maybe': expected on, landlock, seccomp or off", p.stderr


def test_compaction_default_grows_with_the_population():
    import argparse

    from cli.spec import parse_spec

    def spec(**kw):
        base = dict(spec=None, problem="softmax", iterations=None, hours=None, tokens=None, gpu_seconds=None,
                    policy=None, population=None, compact_every=None, seed=None, shape=None, model=None,
                    gpu_queue=None)
        return parse_spec(argparse.Namespace(**{**base, **kw}))

    assert spec().compact_every == 10  # population 1: as before
    assert spec(population=24).compact_every == 192  # 8 x population
    assert spec(population=24, compact_every=30).compact_every == 30  # named: kept, as it is not below 24


def test_problems_lists_shapes_distributions_and_knobs():
    p = marathon("problems", check=True)
    assert "softmax: row-wise softmax" in p.stdout
    assert "  shapes: M4096 N4096 (primary), M16384 N1024; without a GPU: M16 N300" in p.stdout
    assert "  input distributions: normal, wide" in p.stdout and "kda: " in p.stdout
    rows = json.loads(marathon("problems", "--json", check=True).stdout)
    assert {r["name"] for r in rows} == {"kda", "mla_decode", "mla_prefill", "softmax"}
    assert next(r for r in rows if r["name"] == "kda")["distributions"] == ["mild", "strong"]
    # the knobs with their values, as a search hint names them
    assert "  knobs: VARIANT = single, online; BLOCK_N = 64, 128, 256, 512, 1024, 2048; ROWS = 1, 2, 4, 8;" in p.stdout
    assert "EVICT = '', evict_first, evict_last" in p.stdout
    assert next(r for r in rows if r["name"] == "softmax")["knobs"]["ROWS"] == [1, 2, 4, 8]
    one = marathon("problems", "softmax", check=True).stdout
    assert one.startswith("softmax: row-wise softmax") and "kda" not in one


def test_problems_checks_a_problem_file_or_folder_without_starting_a_run(store, tmp_path):
    files = Path(__file__).resolve().parents[1] / "baselines" / "files"
    p = marathon("problems", str(files / "rmsnorm.py"), check=True)
    lines = p.stdout.splitlines()
    assert lines[0].startswith(f"{files / 'rmsnorm.py'}: a problem file, key file:")
    assert "  get_inputs: inputs in0 float32 [256, 8192]; weight float32 [8192]; outputs out0 float32 [256, 8192]" in lines
    assert lines[-1].startswith(f"OK: `marathon start {files / 'rmsnorm.py'} --policy llm` starts a run of it")
    folder = marathon("problems", str(files / "axpy_folder"), check=True).stdout
    assert "  knobs: BLOCK = 64, 128, 256, 512, 1024; num_warps = 1, 2, 4, 8" in folder
    assert "(policies: search, llm)" in folder
    # a file that a run would refuse is refused the same way, in one line
    bad = tmp_path / "raises.py"
    bad.write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                   "        raise ValueError('no')\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n\n"
                   "def get_cpu_inputs():\n    return [torch.randn(2, 2)]\n")
    p = marathon("problems", str(bad))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "the reference raised ValueError: no" in lines[0], p.stderr
    assert not any(f.is_file() for f in store.root.rglob("*")), "checking a problem stores nothing"


def test_marathon_home_holds_the_state_the_artifact_store_included(tmp_path):
    """MARATHON_HOME moves ~/.marathon as a whole; MARATHON_ARTIFACTS moves the artifact store alone."""
    import os

    code = ("from cli.home import HOME; from workflows.artifacts import default_root; "
            "print(HOME); print(default_root())")
    env = {k: v for k, v in os.environ.items() if k not in ("MARATHON_HOME", "MARATHON_ARTIFACTS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**env, "MARATHON_HOME": str(tmp_path / "home")}).stdout.split()
    assert out == [str(tmp_path / "home"), str(tmp_path / "home" / "artifacts")]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={**env, "MARATHON_HOME": str(tmp_path / "home"),
                              "MARATHON_ARTIFACTS": str(tmp_path / "store")}).stdout.split()
    assert out == [str(tmp_path / "home"), str(tmp_path / "store")]


def closed_pipe_run(*args, env_address=None) -> subprocess.CompletedProcess:
    """Run marathon with its stdout a pipe whose reader has already gone (`marathon ... | head`)."""
    import os

    env = {**os.environ, "TEMPORAL_ADDRESS": env_address} if env_address else None
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(MARATHON + list(args), stdout=w, stderr=subprocess.PIPE, text=True, env=env,
                           timeout=120)
    finally:
        os.close(w)
    return p


def test_a_closed_pipe_ends_quietly():
    p = closed_pipe_run("problems")
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_unreachable_server_is_one_clear_line():
    p = marathon("start", "softmax", env_address="127.0.0.1:1")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [p.stderr.strip()]
    assert "cannot reach Temporal at 127.0.0.1:1 (connection refused): " in p.stderr
    assert "`marathon dev`" in p.stderr and "TEMPORAL_ADDRESS" in p.stderr


@pytest.mark.slow(40)
async def test_client_commands_against_the_dev_server(env, store):
    address = env.client.service_client.config.target_host
    wid = run_id("cli")
    async with workers(env.client):
        # a budget the run cannot exhaust while the CLI calls below run (each is a fresh process: slow
        # on a loaded machine), so that it is still running when the budget is changed and stopped
        # compaction only where the history suggests it: a live report must add the records its ledger lacks
        p = await asyncio.to_thread(marathon, "start", "softmax", "--iterations", "4000", "--tokens", "900000",
                                    "--compact-every", "5000", "--id", wid, env_address=address, check=True)
        assert p.stdout.strip() == wid
        dup = await asyncio.to_thread(marathon, "start", "softmax", "--id", wid, env_address=address)
        assert dup.returncode == 2 and "already exists" in dup.stderr
        await asyncio.sleep(1.0)
        st = json.loads((await asyncio.to_thread(marathon, "status", wid, "--json", env_address=address,
                                                 check=True)).stdout)
        assert {"iteration", "phase", "best", "budget", "used", "runs"} <= set(st)
        text = (await asyncio.to_thread(marathon, "status", wid, env_address=address, check=True)).stdout
        assert text.startswith(f"{wid}: softmax (search) iteration")
        assert "\nbudget: 4,000 iterations, 900,000 tokens; used: " in text
        assert "\nnote: no GPU: kernels ran under the Triton interpreter" in text  # the synthetic evaluator's timings
        bad = await asyncio.to_thread(marathon, "budget", wid, "--iterations", "1", env_address=address)
        if st["iteration"] >= 1:
            assert bad.returncode == 2 and "budget change rejected" in bad.stderr
        ok = await asyncio.to_thread(marathon, "budget", wid, "--iterations", "4500", env_address=address,
                                     check=True)
        assert ok.stdout.strip() == "budget now 4,500 iterations, 900,000 tokens"
        # only the fields given change: the iteration and token limits stay
        ok = await asyncio.to_thread(marathon, "budget", wid, "--hours", "5", env_address=address, check=True)
        assert ok.stdout.strip() == "budget now 4,500 iterations, 5 h, 900,000 tokens"
        st = json.loads((await asyncio.to_thread(marathon, "status", wid, "--json", env_address=address,
                                                 check=True)).stdout)
        assert st["budget"] == {"iterations": 4500, "hours": 5.0, "tokens": 900000, "gpu_seconds": None}

        # hints to a search run name knobs and values of the problem's knob space
        for text, message in (("BLOCK_N=3", "knob BLOCK_N has no value '3'; its values: 64, 128"),
                              ("BLOK_N=1024", "softmax has no knob 'BLOK_N'; its knobs: VARIANT, BLOCK_N"),
                              ("make it faster", "a search run takes KNOB=value hints")):
            bad = await asyncio.to_thread(marathon, "hint", wid, text, env_address=address)
            lines = bad.stderr.strip().splitlines()
            assert bad.returncode == 2 and len(lines) == 1 and message in lines[0], bad.stderr
        await asyncio.to_thread(marathon, "hint", wid, "BLOCK_N=1024 num_warps=8", env_address=address,
                                check=True)

        for _ in range(600):
            before = json.loads((await asyncio.to_thread(marathon, "status", wid, "--json", env_address=address,
                                                         check=True)).stdout)["iteration"]
            if before >= 2:
                break
            await asyncio.sleep(0.2)
        rep = await asyncio.to_thread(marathon, "report", wid, "--out", str(store.root.parent / "live"),
                                      env_address=address, check=True)
        live = open(rep.stdout.strip()).read()
        listed = [int(ln.split("|")[1]) for ln in live.split("## Iterations", 1)[1].splitlines()
                  if ln.startswith("| ") and ln.split("|")[1].strip().isdigit()]
        assert before >= 2 and listed == list(range(1, len(listed) + 1)) and len(listed) >= before, listed
        assert f"- iterations: {len(listed)} recorded, still running" in live and "progress.png" in live

        piped = await asyncio.to_thread(closed_pipe_run, "status", wid, env_address=address)
        assert piped.returncode == 0 and piped.stderr == "", piped.stderr

        await asyncio.to_thread(marathon, "stop", wid, "--reason", "cli test", env_address=address, check=True)
        res = await asyncio.wait_for(env.client.get_workflow_handle(wid, result_type=RunResult).result(), 120)
        assert res.stopped_by == "stop-signal" and res.iterations < 4500 and res.stop_reason == "cli test"
        text = (await asyncio.to_thread(marathon, "status", wid, env_address=address, check=True)).stdout
        assert f"iteration {res.iterations}, phase done" in text and "\nstopped by stop-signal (cli test)\n" in text
        done = await asyncio.to_thread(marathon, "watch", wid, env_address=address, check=True)
        assert "stopped by stop-signal (cli test)" in done.stdout
        rep = await asyncio.to_thread(marathon, "report", wid, "--out", str(store.root.parent / "rep"),
                                      env_address=address, check=True)
        text = open(rep.stdout.strip()).read()
        assert f"# Run {wid}: softmax" in text and "progress.png" in text
        assert "stopped by stop-signal, stop reason: cli test" in text
        nb = await asyncio.to_thread(marathon, "notebook", wid, env_address=address, check=True)
        assert nb.stdout.startswith("# Notebook: softmax")
        exported = store.root.parent / "export"
        await asyncio.to_thread(marathon, "export", wid, "--out", str(exported), env_address=address, check=True)
        kernel = (exported / "kernel.py").read_text()
        assert kernel.startswith(f"# Exported from marathon run {wid}: the best kernel of problem softmax\n")
        assert kernel.endswith(store.get_text(res.best_source_key)) and "class ModelNew" not in kernel
        receipt = json.loads((exported / "receipt.json").read_text())
        assert receipt["verify_command"] == f"marathon verify softmax {exported / 'kernel.py'}"
        assert receipt["problem"]["key"] == "softmax" and receipt["problem"]["kind"] == "built-in"
        assert len(receipt["problem"]["source_sha256"]) == 64 and receipt["kernel"]["candidate_id"] == res.best.candidate_id
        assert sorted(p.name for p in exported.iterdir()) == ["kernel.py", "receipt.json", "receipt.md"]
    # with no worker to answer the query, a finished run's status is its result
    text = (await asyncio.to_thread(marathon, "status", wid, env_address=address, check=True)).stdout
    assert f"{wid}: softmax finished after {res.iterations} iterations" in text
    assert "\nstopped by stop-signal (cli test)\nbest: " in text
    late = await asyncio.gather(*(asyncio.to_thread(marathon, *a, env_address=address)
                                  for a in (["stop", wid], ["budget", wid, "--hours", "9"], ["pause", wid])))
    for p in late:
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and wid in lines[0], p.stderr


@pytest.mark.parametrize("args", [["status", "no-such-run"], ["watch", "no-such-run"], ["report", "no-such-run"],
                                  ["export", "no-such-run"], ["notebook", "no-such-run"], ["stop", "no-such-run"],
                                  ["budget", "no-such-run", "--hours", "1"], ["hint", "no-such-run", "BLOCK_N=64"]])
async def test_an_unknown_run_is_one_clear_line(env, args):
    p = await asyncio.to_thread(marathon, *args, env_address=env.client.service_client.config.target_host)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "'no-such-run'" in lines[0], p.stderr


async def test_hints_are_checked_by_the_run_s_policy_without_a_worker(env):
    """The run's spec comes from its history, so the check needs no worker: a search run refuses what its
    proposer would ignore, an llm run takes free text."""
    address = env.client.service_client.config.target_host
    search, llm = run_id("hints"), run_id("hintl")
    await asyncio.gather(
        asyncio.to_thread(marathon, "start", "softmax", "--id", search, env_address=address, check=True),
        asyncio.to_thread(marathon, "start", "softmax", "--policy", "llm", "--id", llm, env_address=address,
                          check=True))
    try:
        refused, taken = await asyncio.gather(
            asyncio.to_thread(marathon, "hint", search, "use bigger blocks", env_address=address),
            asyncio.to_thread(marathon, "hint", llm, "use bigger blocks", env_address=address))
        assert refused.returncode == 2 and "a search run takes KNOB=value hints" in refused.stderr
        assert taken.returncode == 0 and taken.stdout.strip() == f"hint sent to {llm}", taken.stderr
    finally:
        for wid in (search, llm):
            await env.client.get_workflow_handle(wid).terminate("test over")


async def test_a_file_without_cpu_inputs_is_refused_where_only_cpu_workers_serve(env, store, tmp_path, capsys,
                                                                                 monkeypatch):
    """From a CUDA host the run is taken for a GPU run; the workers polling its GPU queue say in their
    identity that they have no CUDA, so `marathon start` refuses it up front with what to add."""
    from concurrent.futures import ThreadPoolExecutor

    from temporalio import activity
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.service import RPCError
    from temporalio.worker import Worker

    import cli.spec
    from cli import main
    from cli.workers import gpu_worker_identity, queue_pollers

    @activity.defn(name="compile_candidate")
    def idle() -> None:
        pass

    monkeypatch.setattr(cli.spec, "cuda_here", lambda: True)
    address = env.client.service_client.config.target_host
    f = tmp_path / "no_cpu.py"
    f.write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
                 "        return x * 2\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n")
    for interpreter, queue in ((True, run_id("cpuq")), (False, run_id("cudaq"))):
        client = await Client.connect(address, identity=gpu_worker_identity(interpreter),
                                      data_converter=pydantic_data_converter)
        wid = run_id("nocpu")
        async with Worker(client, task_queue=queue, activities=[idle], activity_executor=ThreadPoolExecutor(1)):
            async def polled():  # the worker's first poll reached the server
                while not await queue_pollers(env.client, queue):
                    await asyncio.sleep(0.1)
            await asyncio.wait_for(polled(), 30)
            capsys.readouterr()
            rc = await asyncio.to_thread(main, ["start", str(f), "--policy", "llm", "--gpu-queue", queue, "--id", wid,
                                                "--address", address])
            err = capsys.readouterr().err.strip().splitlines()
        if interpreter:
            assert rc == 2 and len(err) == 1 and "add get_cpu_inputs() to the file" in err[0], err
            assert err[0].startswith(f"marathon: error: {f} defines no get_cpu_inputs()"), err
            assert f"the workers on task queue {queue} have no CUDA" in err[0]
            with pytest.raises(RPCError):
                await env.client.get_workflow_handle(wid).describe()  # nothing started
        else:  # a CUDA worker serves the queue: the run starts
            assert rc == 0, err
            await env.client.get_workflow_handle(wid).terminate("test over")


def test_export_refuses_a_run_without_a_kernel_and_an_output_that_is_a_file(tmp_path, store):
    from cli.export import ExportError, export_run
    from workflows.contracts import BestSummary, Used

    res = RunResult(workflow_id="r1", problem="softmax", iterations=3, best=None, stopped_by="budget-iterations",
                    runs=1, used=Used())
    with pytest.raises(ExportError, match="run r1 has no accepted kernel yet"):
        export_run("r1", res, tmp_path / "out")
    best = BestSummary(candidate_id="c1", speedup=1.0, time_ms=1.0, baseline_ms=1.0, iteration=1)
    key = store.put_text("def run(inputs, out):\n    pass\n")
    (tmp_path / "taken").write_text("mine")
    with pytest.raises(ExportError, match="exists and is not a directory"):
        export_run("r1", res.model_copy(update={"best": best, "best_source_key": key}), tmp_path / "taken")
    assert (tmp_path / "taken").read_text() == "mine" and not (tmp_path / "out").exists()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_one_dev_server_per_database_and_no_worker_said_at_once(tmp_path):
    """`marathon dev` holds its SQLite file: a second one on it is refused in one line. On a server no worker
    polls, `status` says so in one line at once (not a query time-out) and `watch` says what it waits for."""
    import os
    import signal
    import time

    db, port = tmp_path / "temporal.db", free_port()
    first = subprocess.Popen(MARATHON + ["dev", "--db", str(db), "--port", str(port), "--headless"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().startswith(f"Temporal dev server on 127.0.0.1:{port}, database {db}")
        second = marathon("dev", "--db", str(db), "--port", str(free_port()), "--headless")
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0].startswith(f"marathon: error: {db} is in use by another Temporal dev server (pid ")
        assert f"port {port}" in lines[0] and "give --db another file" in lines[0]

        address = f"127.0.0.1:{port}"
        wid = run_id("noworker")
        marathon("start", "softmax", "--id", wid, env_address=address, check=True)
        t0 = time.monotonic()
        p = marathon("status", wid, env_address=address)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1, p.stderr
        assert "no worker is polling task queue marathon-agent: start one with `marathon worker --role all`" \
            in lines[0]
        assert time.monotonic() - t0 < 20, "said at once, not after the query's time-out"
        with pytest.raises(subprocess.TimeoutExpired) as waited:
            subprocess.run(MARATHON + ["watch", wid], capture_output=True, text=True, timeout=15,
                           env={**os.environ, "TEMPORAL_ADDRESS": address})
        err = waited.value.stderr.decode() if isinstance(waited.value.stderr, bytes) else waited.value.stderr
        assert f"waiting: run '{wid}': no worker is polling task queue marathon-agent" in (err or ""), err
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    # the lock went with the server: the database is free again
    from cli.server import lock_database

    os.close(lock_database(db))
