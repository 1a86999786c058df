"""What the daemon remembers: sessions, configs, runs, actions, alerts, series and sweeps.

`Store.open(path)` is the door; everything it returns is an immutable record.
"""

from llmconsole.db.compaction import Retention
from llmconsole.db.guard import StoreError
from llmconsole.db.migrations import SCHEMA_VERSION
from llmconsole.db.records import (
    Action,
    Alert,
    CompactionResult,
    ConfigHistory,
    ConfigVersion,
    EngineRun,
    MetricSample,
    OperatorSession,
    Sweep,
    SweepPoint,
    WindowSample,
)
from llmconsole.db.store import Store

__all__ = [
    "Action",
    "Alert",
    "CompactionResult",
    "ConfigHistory",
    "ConfigVersion",
    "EngineRun",
    "MetricSample",
    "OperatorSession",
    "Retention",
    "SCHEMA_VERSION",
    "Store",
    "StoreError",
    "Sweep",
    "SweepPoint",
    "WindowSample",
]
