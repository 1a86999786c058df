"""Secrets and the config history: what a secret is, that only its name is stored or shown, and
that a stored version rebuilds to exactly what ran."""

from __future__ import annotations

import json
import sqlite3

import pytest

from llmconsole.db import Store
from llmconsole.db.versions import RollbackError, spec_from_version
from llmconsole.engine.secrets import SECRET_VALUE, is_secret_name
from llmconsole.engine.spec import EngineSpec, fill_secrets

TOKEN = "hf_live_abcdef0123456789"


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "data" / "llmconsole.db")
    yield s
    s.close()


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "hf_token",
        "token",
        "GITHUB_ACCESS_TOKEN",
        "HFTOKEN",
        "OPENAI_API_KEY",
        "api_key",
        "x-api-key",
        "apikey",
        "AWS_SECRET_ACCESS_KEY",
        "CLIENT_SECRET",
        "DB_PASSWORD",
        "PGPASSWORD",
        "passwd",
        "Authorization",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "private_key",
        "--api-key",
        "--hf-token",
        "OPENAI_KEY",
        "DB_PASS",
        "ENCRYPTION_KEY",
        "BASIC_AUTH",
        "GH_PRIVATE",
        "SSH_PASSPHRASE",
        "AWS_ACCESS_KEY_ID",
    ],
)
def test_credential_names_are_secret(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "api_key_set",
        "max_num_batched_tokens",
        "kv_cache_tokens",
        "--tokenizer-mode",
        "--tokenizer",
        "tokenizer_mode",
        "TOKENIZERS_PARALLELISM",
        "--max-num-batched-tokens",
        "OMP_NUM_THREADS",
        "VLLM_CPU_KVCACHE_SPACE",
        "--ssl-keyfile",
        "--long-prefill-token-threshold",
        "key",
        "KEYBOARD_LAYOUT",
        "PASSTHROUGH",
        "num_key_value_heads",
        "key_source",
        "AUTHOR",
    ],
)
def test_settings_that_mention_tokens_or_keys_are_not_secret(name):
    assert not is_secret_name(name)


def _spec(model_dir, **kw) -> EngineSpec:
    return EngineSpec(model=str(model_dir), max_num_seqs=8, **kw)


def test_public_dict_names_secret_env_vars_without_their_values(model_dir):
    spec = _spec(
        model_dir,
        env={"HF_TOKEN": TOKEN, "TOKENIZERS_PARALLELISM": "false"},
        extra_args=("--tokenizer-mode=auto",),
        api_key="sk-x",
    )
    public = spec.public_dict()
    assert public["env"] == {"HF_TOKEN": SECRET_VALUE, "TOKENIZERS_PARALLELISM": "false"}
    assert public["extra_args"] == ["--tokenizer-mode=auto"]
    assert TOKEN not in json.dumps(public) and "sk-x" not in json.dumps(public)
    assert spec.diff(_spec(model_dir, env={"HF_TOKEN": "other"})) == [
        ("env", {"HF_TOKEN": SECRET_VALUE, "TOKENIZERS_PARALLELISM": "false"}, {"HF_TOKEN": SECRET_VALUE}),
        ("extra_args", ["--tokenizer-mode=auto"], []),
    ]
    # The launch still gets the value itself.
    assert spec.secret_env() == {"HF_TOKEN": TOKEN}


def test_config_id_depends_on_secret_names_not_values(model_dir):
    a = _spec(model_dir, env={"HF_TOKEN": TOKEN})
    assert a.config_id == _spec(model_dir, env={"HF_TOKEN": "rotated"}).config_id
    assert a.config_id != _spec(model_dir).config_id
    assert a.config_id != _spec(model_dir, env={"MY_TOKEN": TOKEN}).config_id
    # Specs without secrets keep the ids they always had: the hash of every field.
    plain = _spec(model_dir, env={"OMP_NUM_THREADS": "2"})
    import hashlib

    canonical = json.dumps(plain.config_dict(), sort_keys=True, separators=(",", ":"))
    assert plain.config_id == hashlib.sha256(canonical.encode()).hexdigest()[:12]


def test_the_store_keeps_a_spec_verbatim_but_never_a_secret(store, model_dir):
    spec = _spec(
        model_dir,
        env={"HF_TOKEN": TOKEN, "TOKENIZERS_PARALLELISM": "false"},
        extra_args=("--tokenizer-mode=auto", "--tokenizer", "/models/tok"),
        api_key="sk-live-1",
    )
    store.record_config(spec.config_id, spec.public_dict())
    saved = store.config(spec.config_id).spec
    assert saved["extra_args"] == ["--tokenizer-mode=auto", "--tokenizer", "/models/tok"]
    assert saved["env"] == {"HF_TOKEN": SECRET_VALUE, "TOKENIZERS_PARALLELISM": "false"}
    # A caller that hands the store a secret anyway does not get it stored.
    store.record_config("ffffffffffff", {"model": "x", "api_key": "sk-live-2", "env": {"HF_TOKEN": TOKEN}})
    with sqlite3.connect(store.path) as raw:
        dump = "\n".join(raw.iterdump())
    assert TOKEN not in dump and "sk-live-1" not in dump and "sk-live-2" not in dump


def _version(store: Store, engine: str, spec: EngineSpec):
    store.run_started(engine, spec.config_id, spec_public=spec.public_dict())
    return next(h for h in store.config_versions(engine) if h.config_id == spec.config_id)


def test_a_stored_version_rebuilds_to_exactly_what_ran(store, model_dir):
    ran = _spec(
        model_dir,
        env={"HF_TOKEN": TOKEN, "TOKENIZERS_PARALLELISM": "false"},
        extra_args=("--tokenizer-mode=auto",),
        api_key="sk-live-1",
    )
    version = _version(store, "e1", ran)
    now = _spec(model_dir, api_key="sk-live-1")  # the engine has since dropped the variable
    back = spec_from_version(version, now, {"HF_TOKEN": TOKEN})
    assert back == ran
    assert back.config_id == version.config_id
    assert back.argv(ran.runtime or _cpu(), 8000) == ran.argv(ran.runtime or _cpu(), 8000)
    assert back.launch_env(_cpu()) == ran.launch_env(_cpu())
    # Without the value, nothing is relaunched with a stand-in.
    with pytest.raises(RollbackError, match="HF_TOKEN"):
        spec_from_version(version, now, {})


def test_a_version_stored_with_scrubbed_extra_args_is_not_relaunched(store, model_dir):
    store.run_started(
        "e1", "0123456789ab", spec_public={"model": str(model_dir), "extra_args": ["--tokenizer-mode=<redacted>"]}
    )
    version = store.config_versions("e1")[0]
    with pytest.raises(RollbackError, match="scrubbed"):
        spec_from_version(version, _spec(model_dir), {})


def test_fill_secrets_names_what_it_cannot_fill():
    assert fill_secrets({"HF_TOKEN": SECRET_VALUE, "A": "1"}, {"HF_TOKEN": TOKEN}) == {"HF_TOKEN": TOKEN, "A": "1"}
    with pytest.raises(ValueError, match="HF_TOKEN"):
        fill_secrets({"HF_TOKEN": SECRET_VALUE}, {})


def _cpu():
    from llmconsole.engine.runtime import Runtime

    return Runtime(kind="python-module", executable="/env/bin/python", device="cpu")


# Names that say "credential" without the words API, TOKEN or PASSWORD in full.
SHORT_NAMED = {"OPENAI_KEY": "sk-short-named-1a2b", "DB_PASS": "pw-short-named-3c4d", "ENCRYPTION_KEY": "enc-5e6f"}


def test_short_credential_names_stay_out_of_status_history_and_export(cli, model_dir):
    """What status shows (the spec's public dict), `llmconsole history` and an export carry the
    names of these variables, never their values; a setting beside them keeps its value."""
    spec = _spec(model_dir, env={**SHORT_NAMED, "KEYBOARD_LAYOUT": "us"})
    public = spec.public_dict()
    assert public["env"] == {**{k: SECRET_VALUE for k in SHORT_NAMED}, "KEYBOARD_LAYOUT": "us"}
    assert spec.secret_env() == SHORT_NAMED
    with Store.open(cli.home / "llmconsole.db") as s:
        run = s.run_started("e1", spec.config_id, spec_public=public, pid=10, port=8000)
        s.run_exited(run, 1, "engine said " + " ".join(f"{k}={v}" for k, v in SHORT_NAMED.items()))
        s.record_action("start", engine="e1", to_config_id=spec.config_id, detail=dict(SHORT_NAMED))
    cli("daemon", "start")  # history and export read the store through the daemon
    history = cli("history", "--json").stdout
    assert "ENCRYPTION_KEY" in history and "KEYBOARD_LAYOUT" in history
    cli("export", "--out", str(cli.home / "bundle"))
    bundle = [p for p in (cli.home / "bundle").rglob("*") if p.is_file()]
    assert any("ENCRYPTION_KEY" in p.read_text() for p in bundle)
    for value in SHORT_NAMED.values():
        assert value not in json.dumps(public) and value not in history
        assert not [p.name for p in bundle if value in p.read_text()], value
