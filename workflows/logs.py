"""structlog JSON logs carrying workflow id, run id and activity; one configuration for every worker."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso"), structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
    )


def activity_logger():
    """A logger bound to the current activity's workflow id, run id and name."""
    from temporalio import activity

    log = structlog.get_logger()
    try:
        info = activity.info()
    except RuntimeError:
        return log
    return log.bind(workflow_id=info.workflow_id, run_id=info.workflow_run_id, activity=info.activity_type,
                    attempt=info.attempt)
