"""The command line's grammar: every command, its arguments, and the function that runs it."""

from __future__ import annotations

import argparse
import sys

from cli.demo import cmd_demo
from cli.home import HOME
from cli.local import cmd_bench, cmd_llm_check, cmd_problems, cmd_selftest, cmd_verify
from cli.query import cmd_export, cmd_notebook, cmd_report, cmd_status, cmd_watch
from cli.run import cmd_budget, cmd_hint, cmd_pause, cmd_resume, cmd_start, cmd_stop
from cli.server import cmd_dev
from cli.workers import cmd_worker


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a missing argument, `--iterations abc`) as one line and exit
    status 2, like every other bad input; `--help` still prints the usage."""

    def error(self, message: str):
        print(f"marathon: error: {self.prog.removeprefix('marathon ')}: {message}" if self.prog != "marathon"
              else f"marathon: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="marathon", description="Long-horizon GPU kernel optimization on Temporal")
    sub = p.add_subparsers(dest="command", required=True)

    def client_cmd(name, fn, help_):
        c = sub.add_parser(name, help=help_)
        c.add_argument("--address", help="Temporal frontend host:port (default: TEMPORAL_ADDRESS or profile)")
        c.add_argument("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE or profile)")
        c.set_defaults(fn=fn)
        return c

    c = sub.add_parser("dev", help="start the Temporal dev server on a SQLite file, with its Web UI")
    c.add_argument("--port", type=int, default=7233)
    c.add_argument("--ui-port", type=int, dest="ui_port", help="the Web UI's port (default: --port + 1000)")
    c.add_argument("--db", help=f"SQLite file (default {HOME / 'temporal.db'})")
    c.add_argument("--ip", default="127.0.0.1", help="0.0.0.0 lets workers on other hosts connect")
    c.add_argument("--headless", action="store_true", help="no Web UI")
    c.set_defaults(fn=cmd_dev)

    c = client_cmd("worker", cmd_worker, "run a worker")
    c.add_argument("--role", choices=["agent", "gpu", "all"], default="all")
    c.add_argument("--gpu-queue", dest="gpu_queue",
                   help="task queue the GPU worker polls (default MARATHON_GPU_QUEUE or marathon-gpu); runs "
                        "started with the same --gpu-queue are evaluated here")
    c.add_argument("--metrics-port", type=int, dest="metrics_port",
                   help="Prometheus: Temporal SDK metrics on PORT, marathon counters on PORT+1 "
                        "(default MARATHON_METRICS_PORT; unset: no metrics)")

    def run_flags(c):
        c.add_argument("--policy", choices=["search", "llm"])
        c.add_argument("--iterations", type=int)
        c.add_argument("--hours", type=float)
        c.add_argument("--tokens", type=int)
        c.add_argument("--gpu-seconds", type=float, dest="gpu_seconds")
        c.add_argument("--population", type=int)
        c.add_argument("--compact-every", type=int, dest="compact_every",
                       help="iterations between compactions (default: 10, or 8 x population when larger)")
        c.add_argument("--seed", type=int)
        c.add_argument("--shape")
        c.add_argument("--model")
        c.add_argument("--turns-per-iteration", type=int, dest="turns_per_iteration",
                       help="llm policy: model turns allowed without a new iteration before the run stops "
                            "(default 30)")
        c.add_argument("--gpu-queue", dest="gpu_queue",
                       help="task queue of the GPU workers for this run (default marathon-gpu)")
        c.add_argument("--kernel", help="search policy: a starting kernel with a KNOBS line and KNOB_SPACE to "
                                        "tune (a problem file has no template of its own)")
        c.add_argument("--spec", help="a RunSpec as JSON, or @file; flags override its fields")
        c.add_argument("--id", help="workflow id (default marathon-PROBLEM-TIMESTAMP)")

    c = client_cmd("start", cmd_start, "start a run")
    c.add_argument("problem", nargs="?")
    run_flags(c)

    for name, fn, help_ in (("status", cmd_status, "show a run's status"),
                            ("watch", cmd_watch, "follow a run live until it ends"),
                            ("pause", cmd_pause, "pause a run after its current step"),
                            ("resume", cmd_resume, "resume a paused run"),
                            ("report", cmd_report, "write a run's report (Markdown and PNG plots)"),
                            ("notebook", cmd_notebook, "print a run's notebook")):
        c = client_cmd(name, fn, help_)
        c.add_argument("id")
        if name == "status":
            c.add_argument("--json", action="store_true")
        if name == "report":
            c.add_argument("--out", help="directory (default ~/.marathon/reports/ID)")
        if name == "notebook":
            c.add_argument("--version", type=int)

    c = client_cmd("export", cmd_export, "write a run's best kernel as a standalone file, with its receipt")
    c.add_argument("id")
    c.add_argument("--out", help="directory for kernel.py, receipt.json and receipt.md (default ./export-ID; "
                                 "- prints kernel.py)")
    c.add_argument("--force", action="store_true", help="overwrite an earlier export in that directory")

    c = sub.add_parser("verify", help="verify a kernel file against a problem's reference here (GPU, or the Triton "
                                      "interpreter without one)")
    c.add_argument("problem", help="a problem name, a problem file or folder, or a stored key")
    c.add_argument("kernel", help="the kernel file: run(inputs, out), a ModelNew class, or a `marathon export` file")
    c.add_argument("--shape", help="the shape to verify at (default: the primary shape on a GPU, else the CPU one)")
    c.set_defaults(fn=cmd_verify)

    c = sub.add_parser("problems", help="list the problems with their shapes, input distributions and knobs; with "
                                        "a path, check that problem file or folder without starting a run")
    c.add_argument("path", nargs="?", help="a problem file (KernelBench format) or problem folder to check")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_problems)

    c = client_cmd("budget", cmd_budget, "change a run's budget (only the fields given)")
    c.add_argument("id")
    c.add_argument("--iterations", type=int)
    c.add_argument("--hours", type=float)
    c.add_argument("--tokens", type=int)
    c.add_argument("--gpu-seconds", type=float, dest="gpu_seconds")
    c.add_argument("--context-tokens", type=int, dest="context_tokens",
                   help="llm policy: the cap on a turn's prompt (estimated tokens), for an endpoint with a smaller "
                        "context")

    c = client_cmd("stop", cmd_stop, "stop a run: finish the evaluations under way, re-verify the best, return")
    c.add_argument("id")
    c.add_argument("--reason", default="operator")
    c.add_argument("--now", action="store_true",
                   help="cancel the evaluations under way (not recorded) and skip the re-verification")

    c = client_cmd("hint", cmd_hint, "steer the proposer: KNOB=value pairs (search), free text (llm)")
    c.add_argument("id")
    c.add_argument("text")

    c = client_cmd("demo", cmd_demo, "dev server + worker + a run + report (what `make run` does)")
    c.add_argument("problem", nargs="?", default="softmax")
    c.add_argument("--iterations", type=int, default=30)
    c.add_argument("--port", type=int, default=7233,
                   help="the dev server's port, where the demo starts one (TEMPORAL_ADDRESS or --address: that "
                        "server, none started)")
    c.add_argument("--ui-port", type=int, dest="ui_port", help="its Web UI's port (default: --port + 1000)")
    c.add_argument("--policy", choices=["search", "llm"])
    c.add_argument("--local-model", action="store_true", dest="local_model",
                   help="with --policy llm: serve SmolLM2-135M-Instruct here (llama-cpp-python, no account) "
                        "for the run's agent worker (`make run-llm`)")
    c.add_argument("--id")

    c = sub.add_parser("llm-check", help="send one tiny request to the model endpoint this environment "
                                         "configures (OPENAI_BASE_URL, MARATHON_MODEL, MARATHON_LLM_*)")
    c.add_argument("--model", help="model name (default MARATHON_MODEL)")
    c.add_argument("--profile", help="endpoint profile (default MARATHON_LLM_PROFILE or auto): auto, openai-chat, "
                                     "openai-reasoning, vllm, sglang, ollama, llamacpp")
    c.set_defaults(fn=cmd_llm_check)
    c = sub.add_parser("selftest", help="run the GPU worker's canary self-test here")
    c.set_defaults(fn=cmd_selftest)
    c = sub.add_parser("bench", help="measure the scoreboard on this GPU (docs/scoreboard.md)")
    c.add_argument("problems", nargs="*", help="PROBLEM, or PROBLEM@I,J for only its shapes number I and J")
    c.add_argument("--best", action="append", default=[],
                   help="PROBLEM=SOURCE_KEY of a run's kernel; repeat it to measure several, the fastest counts")
    c.add_argument("--primary-only", action="store_true")
    c.add_argument("--merge", nargs="+", metavar="SCOREBOARD_JSON",
                   help="measure nothing: write these scoreboard.json files' rows as one scoreboard")
    c.add_argument("--out", default=str(HOME / "bench"),
                   help=f"directory for scoreboard.md and .json (default {HOME / 'bench'})")
    c.set_defaults(fn=cmd_bench)
    return p
