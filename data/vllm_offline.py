"""Run by vLLM's own python (never imported by the project): an offline `vllm.LLM` on token-id prompts,
greedy or sampled, with or without a speculative config, and its speculative-decoding counters.

    <engine python> data/vllm_offline.py request.json result.json

request.json: {"model": dir, "prompts": [[ids]], "max_tokens": n, "stop_token_ids": [ids],
               "temperature": 0.0, "seed": 0, "dtype": "float32", "ignore_eos": false,
               "speculative_config": {...} | null}
result.json:  {"outputs": [[ids]], "finish_reasons": [...], "seconds": generate wall time,
               "spec": {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos": [...]}}
The counters are vLLM's Prometheus metrics (`LLM.get_metrics`), summed over the engine's label sets.
"""
import json
import sys
import time

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "num_drafts", "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_counters(metrics) -> dict:
    out = {v: 0 for v in SPEC_COUNTERS.values()}
    out["accepted_per_pos"] = []
    for m in metrics:
        if m.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[m.name]] += int(m.value)
        elif m.name == PER_POS:
            values = list(m.values)
            acc = out["accepted_per_pos"] + [0] * (len(values) - len(out["accepted_per_pos"]))
            out["accepted_per_pos"] = [a + (values[i] if i < len(values) else 0) for i, a in enumerate(acc)]
    return out


def main(request_path: str, result_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    req = json.loads(open(request_path).read())
    llm = LLM(model=req["model"], dtype=req.get("dtype", "auto"), seed=req.get("seed", 0),
              speculative_config=req.get("speculative_config"), disable_log_stats=False,
              max_model_len=req.get("max_model_len"), enforce_eager=True)
    params = SamplingParams(temperature=req.get("temperature", 0.0), max_tokens=req["max_tokens"],
                            stop_token_ids=req.get("stop_token_ids") or None, seed=req.get("seed"), detokenize=False,
                            ignore_eos=req.get("ignore_eos", False))
    start = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in req["prompts"]], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    result = {"outputs": [list(o.outputs[0].token_ids) for o in outs],
              "finish_reasons": [o.outputs[0].finish_reason for o in outs], "seconds": seconds,
              "spec": spec_counters(llm.get_metrics())}
    with open(result_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":  # vLLM's engine starts worker processes that re-import this file
    main(*sys.argv[1:3])
