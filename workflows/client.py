"""Connecting to Temporal the same way everywhere: the temporal envconfig profile (TOML) with
TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE / TEMPORAL_API_KEY overriding it, the pydantic converter always."""

from __future__ import annotations

import asyncio

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
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise Unreachable(f"cannot reach Temporal at {cfg['target_host']}: {detail}") from e
