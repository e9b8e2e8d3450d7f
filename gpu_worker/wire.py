"""How the protocol's messages travel between the harness and a sandbox child: plain pickle of plain values
(`to_wire` / `parse_request`, `reply_to_wire` / `read_reply`), so that no class of ours is unpickled on either
side, and every message is validated on arrival (`ProtocolError` in the child, a `protocol` failure in the
worker)."""

from __future__ import annotations

import dataclasses
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from gpu_worker.protocol import REQUESTS, Request, Result

R = TypeVar("R", bound=Result)


class ProtocolError(ValueError):
    """A message that is not one of the protocol's: refused, never acted on."""


def to_wire(request: Request, seq: int | None) -> dict:
    """What the worker pickles for the child: the command, its number and its fields as plain values."""
    return {"cmd": request.cmd, "seq": seq, **request.model_dump()}


def _why(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'message'}: {err['msg']}" for err in e.errors())


def parse_request(msg: Any) -> Request:
    """The child's reading of one message; ProtocolError with what is wrong with it."""
    if not isinstance(msg, dict):
        raise ProtocolError(f"a request is a dict, not {type(msg).__name__}")
    cmd = msg.get("cmd")
    cls = REQUESTS.get(cmd) if isinstance(cmd, str) else None
    if cls is None:
        raise ProtocolError(f"unknown command {cmd!r}; known: {', '.join(sorted(REQUESTS))}")
    try:
        return cls.model_validate({k: v for k, v in msg.items() if k not in ("cmd", "seq")})
    except ValidationError as e:
        raise ProtocolError(f"malformed {cmd} request: {_why(e)}") from None


class Failure(Result):
    """Why a command failed: `kind` (exception, violation, oom, cuda-error, compile-error, contract,
    protocol, ...), the error, the traceback; `fatal`: the child is done (its CUDA context is unusable)."""

    kind: str
    error: str
    traceback: str = ""
    fatal: bool = False


class Envelope(Result):
    """Every reply: the request's number, its result or its failure, and the child's state."""

    seq: int | None
    result: dict[str, Any] | None = None
    failure: Failure | None = None
    violations: list[tuple[str, str]] = []


@dataclasses.dataclass(frozen=True)
class Reply(Generic[R]):
    """A reply as the worker reads it: `result` (of the request's `Result` type) when the command ran,
    `failure` when it did not, and what the child reports with every reply."""

    seq: int | None
    result: R | None = None
    failure: Failure | None = None
    violations: tuple[tuple[str, str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None


def reply_to_wire(seq: int | None, result: Result | None = None, failure: Failure | None = None,
                  violations=()) -> dict:
    """What the child pickles for the worker."""
    return {"seq": seq, "result": None if result is None else result.model_dump(),
            "failure": None if failure is None else failure.model_dump(),
            "violations": [tuple(v) for v in violations]}


def read_reply(request: type[Request] | Request, raw: Any) -> Reply:
    """The worker's reading of the reply to `request`; one that does not fit is a `protocol` failure (with
    the number it carries, so that an answer to another request is still told apart)."""
    seq = raw.get("seq") if isinstance(raw, dict) else None
    try:
        env = Envelope.model_validate(raw)
    except ValidationError as e:
        return Reply(seq=seq if isinstance(seq, int) else None,
                     failure=Failure(kind="protocol", error=f"malformed reply: {_why(e)}"))
    common = dict(seq=env.seq, violations=tuple(env.violations))
    if env.failure is not None:
        return Reply(failure=env.failure, **common)
    try:
        result = request.result_type.model_validate(env.result if env.result is not None else {})
    except ValidationError as e:
        return Reply(failure=Failure(kind="protocol", error=f"malformed {request.cmd} reply: {_why(e)}"), **common)
    return Reply(result=result, **common)
