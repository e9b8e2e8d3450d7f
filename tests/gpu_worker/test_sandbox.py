"""The worker's channel to a child (gpu_worker.sandbox): a reply always answers its own request."""

import pickle

import pytest

from gpu_worker.protocol import CudaInit
from gpu_worker.sandbox import Sandbox, SandboxFailure


class Interrupted(Exception):
    """Stands for an activity's cancellation, which temporalio raises in the activity's thread."""


def test_a_call_interrupted_before_its_reply_kills_the_child():
    # a call cancelled while the child works leaves that reply in the pipe; unless the child is killed,
    # every later call reads its predecessor's reply
    sb = Sandbox("candidate", interpreter=True)
    try:
        sb.wait_ready()

        def cancelled():
            raise Interrupted()

        with pytest.raises(Interrupted):
            sb.call(CudaInit(), 60, heartbeat=cancelled)  # the request is sent; the wait is interrupted
        assert sb.closed and not sb.alive()
        with pytest.raises(SandboxFailure, match="already closed"):
            sb.call(CudaInit(), 60)
    finally:
        sb.close()


def test_a_reply_to_another_request_is_refused():
    sb = Sandbox("candidate", interpreter=True)
    try:
        sb.wait_ready()
        assert sb.call(CudaInit(), 60).ok
        # a request whose reply nobody read (what an interrupted call would leave behind)
        sb._send.send_bytes(pickle.dumps({"cmd": "cuda_init", "seq": 999}))
        with pytest.raises(SandboxFailure, match="out of step"):
            sb.call(CudaInit(), 60)
        assert sb.closed
    finally:
        sb.close()
