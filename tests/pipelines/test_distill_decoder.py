"""distill-data's `decoder` backend: the project's batched decoder answers the prompts, alone or speculatively with a
drafter, and writes the rows transformers' `generate` writes (greedy, float32), in the same chunks."""
import random
import shutil
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specdraft.pipelines.distill_data as dd
from specdraft.core.errors import InputError
from specdraft.data.generation import decode_responses, generate_responses
from specdraft.decoding.policies.acceptance_head import AcceptanceHead, save_head
from specdraft.decoding.rounds.sampling import SamplingConfig
from specdraft.pipelines.readers import load_distill_data
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import tiny_config

GREEDY = {"temperatures": [0.0]}


def rows_of(root):
    ds = load_distill_data(root / "distill_data")
    return {s: [(r["id"], tuple(r["prompt_ids"]), tuple(r["response_ids"]), r["finish_reason"], r["prompt_truncated"])
                for r in ds[s]] for s in ds}


def distilled(root, **distill_data):
    run_stage(tiny_config(root, target={"dtype": "float32"}, distill_data=distill_data), "distill-data")
    return rows_of(root)


@pytest.fixture
def two_runs(tiny_run, tmp_path):
    """The tiny run and a copy of it, for one stage run with each setting."""
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other)
    return tiny_run, other


def random_llama(seed: int, layers: int = 2, context: int = 64) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=2, max_position_embeddings=context, eos_token_id=2,
                                        initializer_range=0.2)).eval()


def test_greedy_answers_equal_transformers_generate_through_padding_stops_and_the_length_limit():
    """Ragged prompts (transformers left-pads them, the decoder keeps each row's own cache), rows that stop at a
    turn end mid-answer (the stop token kept) beside rows cut at max_new_tokens, and a prompt that fills the
    context with its answer to the last slot."""
    model, rng = random_llama(0), random.Random(0)
    prompts = [[1] + [rng.randrange(3, 64) for _ in range(rng.randrange(1, 20))] for _ in range(11)]
    prompts.append([1] + [rng.randrange(3, 64) for _ in range(64 - 12 - 1)])  # 52 tokens + 12 new = the context
    free = generate_responses(model, prompts, 0, [2], 0.0, 0, 1.0, 12, 0)
    stop = Counter(t for r, _ in free for t in r[1:10]).most_common(1)[0][0]  # a token some rows emit mid-answer
    hf = generate_responses(model, prompts, 0, [stop], 0.0, 0, 1.0, 12, 0)
    ours = decode_responses(model, prompts, [stop], SamplingConfig(0.0), 12, 0)
    assert ours == hf
    finishes = Counter(f for _, f in hf)
    assert finishes["eos"] >= 2 and finishes["length"] >= 2  # both endings were compared
    assert all((f == "eos") == (r[-1] == stop) and (stop not in r[:-1]) for r, f in ours)
    assert len(ours[-1][0]) == 12 or ours[-1][1] == "eos"


def test_the_stage_writes_the_rows_of_the_hf_backend(two_runs):
    """Same chunks, same rows: prompts formatted and fitted as before, answers token for token (float32, greedy)."""
    hf_root, dec_root = two_runs
    hf = distilled(hf_root, backend="hf", **GREEDY)
    assert distilled(dec_root, backend="decoder", **GREEDY) == hf
    assert sum(len(v) for v in hf.values()) == 2 * (6 + 3)


def save_drafter(model, tok, path):
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("drafter", ["target", "random", "eagle"])
def test_speculative_answers_are_the_target_alones(two_runs, tmp_path, drafter, capsys):
    """Lossless: with a drafter (the target's own copy: every draft accepted; a random one, or an untrained EAGLE
    drafter of this target: most rejected) the greedy answers are the target-alone decoder's token for token, in
    fewer target forwards where drafts are accepted."""
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.decoding.speculators.eagle_model import new_eagle_drafter, save_eagle, target_dir_hash

    alone_root, spec_root = two_runs
    target_dir = alone_root / "target"
    tok, target = load_tokenizer(str(target_dir)), load_causal_lm(str(target_dir), "float32")
    torch.manual_seed(1)
    if drafter == "eagle":
        path = str(save_eagle(new_eagle_drafter(target.config, target_hash=target_dir_hash(target_dir)),
                              tmp_path / "eagle"))
    else:
        model = target if drafter == "target" else LlamaForCausalLM(LlamaConfig(
            **{**target.config.to_dict(), "num_hidden_layers": 1, "initializer_range": 0.5})).eval()
        path = save_drafter(model, tok, tmp_path / "drafter")
    alone = distilled(alone_root, backend="decoder", **GREEDY)
    capsys.readouterr()
    assert distilled(spec_root, backend="decoder", drafter=path, k=3, **GREEDY) == alone
    mat = float(capsys.readouterr().out.split("MAT ")[1].split()[0])
    assert (mat > 2.5) if drafter == "target" else (1.0 <= mat < 2.5)


def test_sampling_settings_seeds_plan_and_one_compiler_reach_the_decoder(tiny_run, tmp_path, monkeypatch):
    """The decoder's own statistical tests cover the speculative loop at T > 0; here: what the stage hands it. Each
    batch gets SamplingConfig(T, top_k, top_p), its seed from (run seed, chunk, batch) as the hf backend's, the
    drafter's fixed-K plan, and one StepCompiler for every batch."""
    from specdraft.core.hashing import derive_seed
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.decoding.policies.stopping import FixedK

    tok = load_tokenizer(str(tiny_run / "target"))
    path = save_drafter(load_causal_lm(str(tiny_run / "target")), tok, tmp_path / "drafter")
    calls, real = [], dd.decode_responses

    def spy(model, prompts, stops, sampling, max_new, seed, plan, compiler, metrics):
        calls.append((len(prompts), sampling, seed, plan.policy(), compiler))
        return real(model, prompts, stops, sampling, max_new, seed, plan, compiler, metrics)

    monkeypatch.setattr(dd, "decode_responses", spy)
    settings = {"backend": "decoder", "drafter": path, "k": 2, "temperatures": [0.7], "top_k": 5, "top_p": 0.9,
                "splits": ["train"]}
    cfg = tiny_config(tiny_run, distill_data=settings)
    run_stage(cfg, "distill-data")
    sizes = [n for n, *_ in calls]
    assert sizes == [4, 1, 4, 1, 2]  # 12 prompts in chunks of 5 at batch size 4
    assert {c[1] for c in calls} == {SamplingConfig(0.7, 5, 0.9)}
    chunks = ["train-t0.7-00000"] * 2 + ["train-t0.7-00001"] * 2 + ["train-t0.7-00002"]
    assert [c[2] for c in calls] == [derive_seed(cfg.run.seed, name, b) for name, b in zip(chunks, [0, 4, 0, 4, 0])]
    assert all(isinstance(c[3], FixedK) and c[3].max_tokens == 2 for c in calls)
    assert len({id(c[4]) for c in calls}) == 1
    again = tmp_path / "again"
    shutil.copytree(tiny_run, again, ignore=shutil.ignore_patterns("distill_data", ".work"))
    run_stage(tiny_config(again, distill_data=settings), "distill-data")
    assert rows_of(again) == rows_of(tiny_run)  # sampled rows: the same bytes from the same seeds


def test_a_head_drafts_specdecpp_rounds(tiny_run, tmp_path, capsys):
    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer

    tok, target = load_tokenizer(str(tiny_run / "target")), load_causal_lm(str(tiny_run / "target"), "float32")
    path = save_drafter(target, tok, tmp_path / "drafter")
    torch.manual_seed(0)
    head = save_head(AcceptanceHead(target.config.hidden_size, 0), tmp_path / "head", {"threshold": 0.5, "k_max": 3})
    alone = tmp_path / "alone"
    shutil.copytree(tiny_run, alone)
    assert distilled(tiny_run, backend="decoder", drafter=path, head=str(head), **GREEDY) == \
        distilled(alone, backend="decoder", **GREEDY)
    assert "MAT " in capsys.readouterr().out


@pytest.mark.slow  # inductor compiles the target's steps: minutes on 2 shared cores
def test_compiled_decoder_writes_the_eager_rows(two_runs):
    eager_root, compiled_root = two_runs
    settings = {"backend": "decoder", "splits": ["dev"], **GREEDY}
    assert distilled(compiled_root, compile="default", **settings) == distilled(eager_root, **settings)


def test_decoder_keys_are_refused_where_they_mean_nothing(tmp_path):
    def check(**distill_data):
        tiny_config(tmp_path, distill_data=distill_data).distill_data.check()

    with pytest.raises(InputError, match="distill_data.compile: default applies to backend decoder, not hf"):
        check(compile="default")
    with pytest.raises(InputError, match="distill_data.drafter: d applies to backend decoder, not vllm"):
        check(backend="vllm", drafter="d")
    with pytest.raises(InputError, match="name it with distill_data.drafter"):
        check(backend="decoder", k=4)
    with pytest.raises(InputError, match="both set the round's length; keep one"):
        check(backend="decoder", drafter="d", k=4, head="h")
    with pytest.raises(InputError, match="distill_data.k must be an integer >= 1, got 0"):
        check(backend="decoder", drafter="d", k=0)
    check(backend="decoder", drafter="d", compile="default", k=2)


def test_a_prompt_past_the_context_is_refused_in_the_stages_keys(tiny_run):
    cfg = tiny_config(tiny_run, distill_data={"backend": "decoder", "max_new_tokens": 250, "splits": ["dev"]})
    with pytest.raises(InputError, match=r"\+ distill_data.max_new_tokens \(250\) exceeds the target's context \(256\); "
                                         r"lower distill_data.max_prompt_tokens to at most 6"):
        run_stage(cfg, "distill-data")


def test_a_quantized_target_is_the_hf_backends(tiny_run):
    cfg = tiny_config(tiny_run, target={"quantization": "int8"}, distill_data={"backend": "decoder"})
    with pytest.raises(InputError, match="backend decoder runs the target unquantized, not int8"):
        run_stage(cfg, "distill-data")


def test_answer_rate_times_a_backend_as_the_stage_calls_it(tiny_run):
    """The benchmark's measure: open_backend's generate over batches, each seeded as the measure says; the
    answered tokens are the answers' lengths."""
    from specdraft.decoding.bundle.loading import load_tokenizer

    cfg = tiny_config(tiny_run, distill_data={"backend": "decoder", "max_new_tokens": 6})
    tok = load_tokenizer(str(tiny_run / "target"))
    prompts = [[1, 5 + i, 7, 9 + 2 * i][: 2 + i % 3] for i in range(5)]
    with dd.open_backend(cfg, str(tiny_run / "target"), tiny_run, tok) as generate:
        rate = dd.answer_rate(generate, prompts, 2, 1.0, 10)
        by_hand = [r for b, s in ((0, 10), (2, 12), (4, 14)) for r, _ in generate(prompts[b:b + 2], 1.0, s, [])]
    assert rate["answers"] == by_hand
    assert rate["answered_tokens"] == sum(map(len, by_hand)) > 0
    assert rate["tokens_per_s"] == pytest.approx(rate["answered_tokens"] / rate["wall_s"])
