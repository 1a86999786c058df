"""The sweep puts an engine back on its original config: the status's public spec must become
valid overrides (it carries api_key_set, which no spec accepts)."""

import asyncio

from llmconsole.console.commands.sweep import DaemonController
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.sweep.runner import EngineTarget


class RecordingClient:
    def __init__(self, spec: EngineSpec):
        self.spec, self.overrides = spec, None

    def restart_engine(self, name, overrides=None, force=False):
        self.overrides = overrides
        fields = {**self.spec.config_dict(), **overrides}
        self.spec = EngineSpec(**fields, api_key="sk-kept")  # what the daemon does with overrides
        return {"config_id": self.spec.config_id}

    def engine(self, name):
        return {
            "name": name,
            "state": "ready",
            "url": "http://127.0.0.1:1",
            "served_model_name": "m",
            "model": self.spec.model,
            "config_id": self.spec.config_id,
            "spec": self.spec.public_dict(),
        }


def test_restore_sends_config_fields_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    original = EngineSpec(model=str(tmp_path), max_num_seqs=8, api_key="sk-kept")
    client = RecordingClient(original.model_copy(update={"max_num_seqs": 4}))
    target = EngineTarget("http://127.0.0.1:1", "m", original.model, original.config_id, original.public_dict())
    back = asyncio.run(DaemonController(client, "e1").restore(target))
    assert "api_key_set" not in client.overrides
    assert back.config_id == original.config_id
