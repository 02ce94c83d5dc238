"""Every stage formats prompts the same way: the target's chat template (the demo tokenizer has one)."""
from specdraft.data.chat import row_messages
from specdraft.data.prompts import load_prompt_sets
from specdraft.decoding.bundle.chat import format_prompt
from specdraft.decoding.bundle.loading import load_tokenizer
from specdraft.pipelines.readers import load_distill_data
from specdraft.pipelines.stage import run_stage
from tests.pipelines.conftest import tiny_config as _tiny_config


def tiny_config(root, **sections):
    """The tiny run at one temperature (half the generation of the default two)."""
    return _tiny_config(root, distill_data={"temperatures": [0.0]}, **sections)


def test_distill_data_prompts_are_chat_formatted(tiny_run):
    cfg = tiny_config(tiny_run, prompts={"system_prompt": "Answer briefly."})
    out = run_stage(cfg, "distill-data")
    tok = load_tokenizer(tiny_run / "target")
    rows = {r["id"]: r for r in load_prompt_sets(tiny_run / "prompts")["train"]}
    data = load_distill_data(out)["train"]
    assert len(data) > 0
    for r in data:
        msgs = [{"role": "system", "content": "Answer briefly."}, *row_messages(rows[r["prompt_id"]])]
        assert r["prompt_ids"] == format_prompt(tok, msgs)
        assert tok.convert_ids_to_tokens(r["prompt_ids"][-1]) == "<|assistant|>"
        assert tok.convert_ids_to_tokens(r["prompt_ids"][1]) == "<|system|>"
    # the chat settings are part of distill-data's cache key
    assert run_stage(tiny_config(tiny_run, prompts={"system_prompt": "Answer briefly."}), "distill-data") == out
    msgs = []
    run_stage(tiny_config(tiny_run), "distill-data", log=msgs.append)
    assert any("rebuilding" in m for m in msgs)


def test_drafter_loss_covers_only_the_response_of_a_templated_prompt(tiny_run):
    from specdraft.drafters.data import CausalLMCollator

    out = run_stage(tiny_config(tiny_run), "distill-data")
    tok = load_tokenizer(tiny_run / "target")
    row = load_distill_data(out)["train"][0]
    batch = CausalLMCollator(pad_token_id=tok.pad_token_id)([{"prompt_ids": row["prompt_ids"],
                                                             "response_ids": row["response_ids"]}])
    ids, mask = batch["input_ids"][0], batch["loss_mask"][0].bool()
    # position t predicts token t + 1: the trained-on targets are exactly the response tokens
    assert ids[1:][mask[:-1]].tolist() == row["response_ids"] and not mask[-1]
    assert tok.convert_ids_to_tokens(row["prompt_ids"][-1]) == "<|assistant|>"
