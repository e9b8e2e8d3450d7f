"""The typed messages between the worker and a child (gpu_worker.protocol) and the child's dispatch of them:
a request or reply that does not fit its declared type is a `protocol` failure, never acted on."""

from __future__ import annotations

from gpu_worker.protocol import CudaInit


def test_the_child_refuses_an_unknown_command_and_a_malformed_request_and_keeps_serving():
    """Anything but a declared request with its exact fields and types gets one `protocol` failure reply,
    carrying the request's number; the child neither acts on it nor crashes nor hangs."""
    from gpu_worker import protocol
    from gpu_worker.sandbox import Sandbox

    sb = Sandbox("candidate", interpreter=True)
    try:
        cases = [("standard", 0)]
        for wire, why in (
                ({"cmd": "format_disk"}, "unknown command 'format_disk'"),
                ({"cmd": "stage", "cases": "all"}, "malformed stage request: cases"),
                ({"cmd": "stage", "cases": cases, "extra": 1}, "malformed stage request: extra"),
                ({"cmd": "time", "reps": "20"}, "malformed time request: reps"),
                ({"cmd": "verify"}, "malformed verify request: cases: Field required"),
                ({"cmd": "load", "source": 3, "problem": "softmax", "shape": None}, "malformed load request: source")):
            r = sb._exchange(wire, protocol.Stage, 60)
            assert not r.ok and r.failure.kind == "protocol" and why in r.failure.error, (wire, r)
            assert sb.alive()
        assert sb.call(CudaInit(), 60).ok  # still serving, replies still in step
    finally:
        sb.close()


def test_a_reply_that_does_not_fit_its_request_is_a_protocol_failure():
    from gpu_worker import protocol, wire

    good = wire.reply_to_wire(3, protocol.Staged(seconds=0.5))
    assert wire.read_reply(protocol.Stage, good).result == protocol.Staged(seconds=0.5)
    wrong = wire.read_reply(protocol.Time, good)  # a stage's result read as a timing's
    assert not wrong.ok and wrong.seq == 3 and wrong.failure.kind == "protocol" and "times" in wrong.failure.error
    broken = wire.read_reply(protocol.Stage, {"seq": 3, "result": {"seconds": "soon"}})
    assert not broken.ok and broken.failure.kind == "protocol"
    assert not wire.read_reply(protocol.Stage, "not a reply").ok


def test_every_declared_request_has_a_handler_in_the_child():
    from gpu_worker import child, protocol

    assert set(child.COMMANDS) | {protocol.Exit} == set(protocol.REQUESTS.values())
