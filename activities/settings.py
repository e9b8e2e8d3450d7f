"""The agent worker's settings, read from its environment once, when the worker is built: the artifact
store it writes to and the model endpoint of the llm policy. Its activities read these, never the
environment, so a variable changed in the worker's process after it started changes nothing."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from activities.llm.endpoint import LlmSettings
from workflows.artifacts import ArtifactStore, default_root


@dataclass(frozen=True)
class AgentSettings:
    store: ArtifactStore
    llm: LlmSettings

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AgentSettings:
        env = os.environ if env is None else env
        return cls(store=ArtifactStore(default_root(env)), llm=LlmSettings.from_env(env))
