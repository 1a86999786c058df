"""The identity of a spec as the fleet's state file stores it, valid or not.

A stored spec can stop validating (its model directory is gone, a field was renamed): the engine
keeps it verbatim and must still be known by the config id it ran under.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from llmconsole.engine.spec import EngineSpec


@functools.cache
def _not_config_fields() -> frozenset[str]:
    return frozenset(EngineSpec.model_fields) - frozenset(EngineSpec(model="x").config_dict())


def stored_config_id(raw: Mapping[str, Any]) -> str:
    """The config id of a spec as stored (see EngineSpec.config_id), even if it no longer validates."""
    not_config = _not_config_fields()
    canonical = json.dumps({k: v for k, v in raw.items() if k not in not_config}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]
