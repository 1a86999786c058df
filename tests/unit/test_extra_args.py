"""Extra args are read the way vLLM's parser reads them (`_` for `-`, abbreviations, `--flag=value`,
`--config FILE`), so none can set a spec field or pass a secret around the spec."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from llmconsole.engine.spec import EngineSpec, refused_option, validation_messages


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


@pytest.mark.parametrize(
    "args, says",
    [
        (["--api_key=x"], "api_key"),
        (["--api-key", "x"], "api_key"),
        (["--api-k=x"], "vLLM reads it as --api-key"),
        (["--hf_token=hf_x"], "HF_TOKEN"),
        (["--max_num_seqs=8"], "spec field (max_num_seqs)"),
        (["--max-num-seqs", "8"], "spec field (max_num_seqs)"),
        (["--max-num-se=8"], "vLLM reads it as --max-num-seqs"),
        (["--max_num_se", "8"], "spec field (max_num_seqs)"),
        (["-tp=2"], "spec field (tensor_parallel_size)"),
        (["-t", "2"], "spec field (tensor_parallel_size)"),
        (["--device-memory-utilization=0.5"], "spec field (gpu_memory_utilization)"),
        (["--no-enforce_eager"], "spec field (enforce_eager)"),
        (["--kv_cache_memory_bytes.x=1"], "spec field (kv_cache_memory_bytes)"),
        (["--config", "serve.yaml"], "--config"),
        (["--conf=serve.yaml"], "--config"),
    ],
)
def test_extra_args_that_reach_a_spec_field_or_a_secret_are_refused(model_dir, args, says):
    with pytest.raises(ValidationError) as e:
        EngineSpec(model=str(model_dir), extra_args=args)
    msgs = " ".join(validation_messages(e.value))
    assert msgs.startswith("extra_args") and says in msgs, msgs


def test_refusals_name_the_way_to_give_it(model_dir):
    with pytest.raises(ValidationError) as e:
        EngineSpec(model=str(model_dir), extra_args=["--max_num_seqs=8"])
    assert "`--max-num-seqs`" in str(e.value)
    with pytest.raises(ValidationError) as e:
        EngineSpec(model=str(model_dir), extra_args=["--api_key=x"])
    assert "--api-key-env" in str(e.value) and "x" not in validation_messages(e.value)[0].split()[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["--tokenizer-mode=auto"],
        ["--tokenizer_mode", "auto"],
        ["--tokenizer", "/models/tok"],
        ["--trust-request-chat-template"],
        ["-O3"],
        ["--compilation-config.mode=3"],
        ["--config-format", "hf"],
        ["--seed-unrelated-value", "-1"],
        ["--max-num-queued-reqs=4"],
        ["--long-prefill-token-threshold", "64"],
    ],
)
def test_other_vllm_options_pass_unchanged(model_dir, args):
    assert EngineSpec(model=str(model_dir), extra_args=args).extra_args == tuple(args)


def test_the_option_lists_match_the_installed_vllm_parser():
    """The spec keeps vLLM's option names itself (the daemon never imports vLLM to validate);
    this keeps those lists honest against the vLLM installed here."""
    pytest.importorskip("vllm")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from llmconsole.engine import spec as spec_mod

    parser = make_arg_parser(FlexibleArgumentParser())
    assert parser.allow_abbrev, "vLLM no longer accepts abbreviations: the prefix rule can be dropped"
    by_option = {o: a.dest for a in parser._actions for o in a.option_strings}
    fields = set(EngineSpec.model_fields)
    # Every option of a spec field, aliases included, is owned, and owned options are vLLM's.
    for option, dest in by_option.items():
        if dest in fields and dest not in ("api_key",):
            assert spec_mod._OWNED_FLAGS.get(option) == dest, option
    for option, field in spec_mod._OWNED_FLAGS.items():
        assert by_option.get(option) == field, option
    secret_dests = {"api_key", "hf_token"}
    assert {o for o, d in by_option.items() if d in secret_dests} == set(spec_mod._SECRET_FLAGS)
    assert "--config" in by_option and set(spec_mod._HIDDEN_FLAGS) == {"--config"}
    assert not spec_mod._REMOVED_FLAGS & set(by_option)
    # Options whose full name is a prefix of a refused one are not taken for its abbreviation.
    refused = spec_mod._REFUSED
    prefixes = {o for o in by_option if o not in refused and any(r != o and r.startswith(o) for r in refused)}
    assert prefixes == set(spec_mod._OWN_OPTIONS_THAT_PREFIX_REFUSED)
    # And what the spec refuses is what vLLM would read as that option.
    for args, dest in (
        (["--max_num_se=8"], "max_num_seqs"),
        (["--api_k=x"], "api_key"),
        (["-t", "2"], "tensor_parallel_size"),
        (["--device_mem", "0.5"], "gpu_memory_utilization"),
    ):
        assert by_option[refused_option(args[0])] == dest
        ns = parser.parse_args(args)
        assert getattr(ns, dest) != parser.get_default(dest), args  # vLLM set the field from it


def test_the_cli_refuses_them_with_exit_2_before_anything_starts(cli, home, tiny_model):
    for arg, says in (("--api_key=x", "--api-key-env"), ("--max_num_seqs=8", "`--max-num-seqs`")):
        r = cli("engine", "start", "e1", "--model", str(tiny_model), "--extra-arg", arg, check=False)
        assert r.returncode == 2 and says in r.stderr, r.stderr
    assert not (home / "run" / "control.sock").exists(), "a refused spec must not even start the daemon"
    # A value that starts with `-` is taken as the extra arg's own, not as a flag of the CLI.
    from llmconsole.console.cli import _join_extra_args, build_parser

    ns = build_parser().parse_args(_join_extra_args(["engine", "start", "e1", "--extra-arg", "--tokenizer-mode=auto"]))
    assert ns.extra_args == ["--tokenizer-mode=auto"]
