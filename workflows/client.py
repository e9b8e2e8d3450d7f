"""Connecting to Temporal the same way everywhere: the temporal envconfig profile (TOML) with
TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY overriding it, the pydantic converter always."""

from __future__ import annotations

import asyncio
import re

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig


class Unreachable(RuntimeError):
    pass


def connect_config(address: str | None = None, namespace: str | None = None) -> dict:
    cfg = dict(ClientConfig.load_client_connect_config())
    cfg.setdefault("target_host", "localhost:7233")
    if address:
        cfg["target_host"] = address
    if namespace:
        cfg["namespace"] = namespace
    return cfg


async def connect(address: str | None = None, namespace: str | None = None, timeout: float = 10.0) -> Client:
    cfg = connect_config(address, namespace)
    try:
        return await asyncio.wait_for(Client.connect(**cfg, data_converter=pydantic_data_converter), timeout)
    except (asyncio.TimeoutError, RuntimeError, OSError) as e:
        raise Unreachable(f"cannot reach Temporal at {cfg['target_host']} ({transport_detail(e, timeout)}): start a "
                          f"local server with `marathon dev`, or point TEMPORAL_ADDRESS (or --address) at yours") from e


def transport_detail(e: BaseException, timeout: float) -> str:
    """A connection failure in a few words: the OS's own message where the transport error carries one."""
    if isinstance(e, asyncio.TimeoutError):
        return f"no answer within {timeout:g} s"
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    said = re.search(r'message: "([^"]+)"', text)  # the OS error inside the transport's debug text
    if said:
        return said.group(1).lower()
    if "dns error" in text or "failed to lookup" in text:
        return "unknown host"
    return text[:160]
