"""Generation through a serving engine: an OpenAI-compatible server (vLLM, SGLang, ...) answering token-id
prompts on /v1/completions, and a vLLM server this process starts from vLLM's own venv and stops.

vLLM pins another transformers than the project, so it never imports here: it runs as a subprocess of
the engine venv's python (`make vllm` builds .venv-vllm), and we talk to it over HTTP with httpx: one
asyncio task per prompt on one connection pool, which caps how many requests are in flight.

Prompts go to the server as token ids, formatted once by the caller (decoding.bundle.chat.format_prompt): the
server applies no chat template of its own. Responses come back as token ids (vLLM's `return_token_ids`;
a server without it may give `logprobs` tokens as "token_id:N" under `return_tokens_as_token_ids`), cut at
the first end-of-turn token with that token kept, as data.generation.generate_batch does for HF.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from specdraft.core.errors import InputError

VLLM_PYTHON_ENV = "SPECDRAFT_VLLM_PYTHON"
# vLLM's speculative-decoding counters on its Prometheus /metrics (a counter's samples carry the `_total` suffix);
# data/vllm_offline.py reads the same counters from an offline engine under the names without it
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "num_drafts",
                 "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens"}
SPEC_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
DEFAULT_VLLM_VENV = ".venv-vllm"
SEED_MOD = 2**31  # engines take a 32-bit request seed


def engine_python(configured: str | None) -> Path:
    """The python of vLLM's own venv: the configured one, else $SPECDRAFT_VLLM_PYTHON, else .venv-vllm here."""
    raw = configured or os.environ.get(VLLM_PYTHON_ENV) or str(Path(DEFAULT_VLLM_VENV) / "bin" / "python")
    path = Path(raw).expanduser()
    if not path.exists():
        raise InputError(f"vLLM's python '{raw}' does not exist; run `make vllm` (builds {DEFAULT_VLLM_VENV}) or set "
                         f"distill_data.engine_python / ${VLLM_PYTHON_ENV} to a python that imports vllm")
    return path.absolute()  # not resolve(): a venv's bin/python is a link to the base interpreter


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_spec_counters(text: str) -> dict:
    """vLLM's speculative-decoding counters from a Prometheus text exposition, summed over label sets (engines,
    models): {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos": [per draft position]}.
    num_draft_tokens / num_drafts is the mean K of the verification steps; accepted_per_pos[i] counts steps whose
    first i + 1 drafts were all accepted."""
    out: dict = {name: 0 for name in SPEC_COUNTERS.values()}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:spec_decode_"):
            continue
        series, _, value = line.rpartition(" ")
        name, _, labels = series.partition("{")
        if name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[name]] += int(float(value))
        elif name == SPEC_PER_POS:
            position = next(int(v.strip('"')) for k, _, v in (kv.partition("=") for kv in labels.rstrip("}").split(","))
                            if k.strip() == "position")
            per_pos[position] = per_pos.get(position, 0) + int(float(value))
    out["accepted_per_pos"] = [per_pos.get(i, 0) for i in range(max(per_pos, default=-1) + 1)]
    return out


def spec_counter_difference(after: dict, before: dict) -> dict:
    """What happened between two readings of `parse_spec_counters` (the counters are cumulative)."""
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    pad = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], pad)]
    return out


# an exception as a traceback ends it, bare or behind vLLM's `(EngineCore pid=N) ERROR date time [file:line] ` prefix
EXCEPTION_LINE = re.compile(r"^(?:\(\w+ pid=\d+\) (?:ERROR|CRITICAL) \S+ \S+ \[[^\]]*\] )?([\w.]*(?:Error|Exception): .*)$")


def first_error(log: Path) -> str:
    """What stopped a server, from its log: the first exception line (`SomeError: message`, with its next line when
    that continues it, as pydantic's validation errors do), else the log's last line. A dying vLLM prints its root
    cause first, then the shutdown's own errors and warnings."""
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    for i, line in enumerate(lines):
        found = EXCEPTION_LINE.match(line)
        if found:
            more = lines[i + 1].strip() if i + 1 < len(lines) and lines[i + 1].startswith(" ") else ""
            return f"{found.group(1)} {more}".strip()
    return lines[-1] if lines else "(empty log)"


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


class CompletionsClient:
    """/v1/completions of an OpenAI-compatible server, one request per prompt (the server batches
    concurrent requests itself; at most `concurrency` are in flight)."""

    def __init__(self, url: str, model: str, timeout_s: float = 600.0, concurrency: int = 64):
        self.url, self.model, self.timeout_s, self.concurrency = url.rstrip("/"), model, timeout_s, concurrency

    def _answer(self, path: str, response: httpx.Response | Exception) -> dict:
        """The JSON of a response, or the one line saying why there is none."""
        if isinstance(response, httpx.Response) and response.is_error:
            raise InputError(f"the server at {self.url} refused {path} (HTTP {response.status_code}: "
                             f"{_one_line(response.text)})")
        try:
            if isinstance(response, Exception):
                raise response
            return response.json()
        except (httpx.HTTPError, OSError, ValueError) as e:  # refused, reset, timed out, not JSON
            raise InputError(f"the server at {self.url} did not answer {path} ({_one_line(str(e) or type(e).__name__, 120)}); "
                             "start it (or check distill_data.engine_url); finished chunks are kept and a rerun resumes") from None

    def _call(self, path: str, body: dict | None = None) -> dict:
        try:
            with httpx.Client(base_url=self.url, timeout=self.timeout_s) as http:
                response = http.get(path) if body is None else http.post(path, json=body)
        except httpx.HTTPError as e:
            response = e
        return self._answer(path, response)

    def check_model(self) -> None:
        """Fail unless the server serves `model` (a server for another model would answer happily)."""
        served = [m.get("id") for m in self._call("/models").get("data", [])]
        if self.model not in served:
            raise InputError(f"the server at {self.url} serves {served}, not '{self.model}'; "
                             "point distill_data.engine_url at the target's server or fix distill_data.engine_model")

    def spec_decode_counters(self) -> dict:
        """The server's speculative-decoding counters now (`parse_spec_counters` of its /metrics, served beside
        /v1): cumulative since it started, so a caller takes differences around the requests it measures."""
        try:
            with httpx.Client(timeout=self.timeout_s) as http:
                response = http.get(self.url.removesuffix("/v1") + "/metrics")
        except httpx.HTTPError as e:
            response = e
        if isinstance(response, Exception) or response.is_error:
            raise InputError(f"the server at {self.url} did not answer /metrics ({_one_line(str(response), 120)}); "
                             "start it with its Prometheus metrics on (vLLM's default)")
        return parse_spec_counters(response.text)

    def _body(self, prompt: list[int], stops: list[int], temperature: float, top_k: int, top_p: float,
              max_new_tokens: int, seed: int) -> dict:
        return {"model": self.model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": temperature,
                "top_p": top_p, "top_k": top_k if top_k > 0 else -1, "seed": seed % SEED_MOD,
                "stop_token_ids": stops, "return_token_ids": True, "skip_special_tokens": False}

    def _response(self, answer: dict, stops: list[int]) -> tuple[list[int], str]:
        choice = answer["choices"][0]
        ids = choice.get("token_ids")
        if ids is None:
            raise InputError(f"the server at {self.url} returned no response token ids; it needs vLLM's "
                             "return_token_ids (vLLM >= 0.10) or an engine that returns them")
        end = next((i for i, t in enumerate(ids) if t in stops), None)
        if end is not None:
            return list(ids[: end + 1]), "eos"
        if choice.get("finish_reason") == "stop":  # stopped on a stop token it did not return
            raise InputError(f"the server at {self.url} stopped a response without returning its stop token; "
                             "use an engine that returns the stop token id (vLLM does)")
        return list(ids), "length"

    def complete(self, prompt: list[int], stops: list[int], temperature: float, top_k: int, top_p: float,
                 max_new_tokens: int, seed: int) -> tuple[list[int], str]:
        body = self._body(prompt, stops, temperature, top_k, top_p, max_new_tokens, seed)
        return self._response(self._call("/completions", body), stops)

    def generate(self, prompts: list[list[int]], stops: list[int], temperature: float, top_k: int, top_p: float,
                 max_new_tokens: int, seeds: list[int]) -> list[tuple[list[int], str]]:
        """Every prompt as its own request with its own seed, sent concurrently; results in prompt order.
        The first failure cancels the requests still out and is raised as its one line."""

        async def one(http: httpx.AsyncClient, prompt: list[int], seed: int) -> tuple[list[int], str]:
            body = self._body(prompt, stops, temperature, top_k, top_p, max_new_tokens, seed)
            try:
                response = await http.post("/completions", json=body)
            except httpx.HTTPError as e:
                response = e
            return self._response(self._answer("/completions", response), stops)

        async def run() -> list[tuple[list[int], str]]:
            limits = httpx.Limits(max_connections=max(1, self.concurrency))
            # no limit on waiting for a free connection: a long batch queues behind the first `concurrency`
            timeout = httpx.Timeout(self.timeout_s, pool=None)
            async with httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits) as http:
                async with asyncio.TaskGroup() as group:
                    tasks = [group.create_task(one(http, p, s)) for p, s in zip(prompts, seeds)]
            return [t.result() for t in tasks]

        try:
            return asyncio.run(run())
        except ExceptionGroup as group:  # a TaskGroup's failures: the first says what went wrong
            raise group.exceptions[0] from None


class VllmServer:
    """`vllm.entrypoints.openai.api_server` on `model_path`, started from vLLM's venv in its own process
    group on a free local port; `with VllmServer(...) as url:` waits until it serves and stops it (its own
    pid, then its group) on exit. Its log goes to `log_path`."""

    def __init__(self, python: Path, model_path: str, served_name: str, log_path: Path, dtype: str = "auto",
                 seed: int = 0, timeout_s: float = 600.0, extra_args: tuple[str, ...] = (), env: dict | None = None):
        self.python, self.model_path, self.served_name, self.log_path = python, model_path, served_name, log_path
        self.dtype, self.seed, self.timeout_s, self.extra_args, self.env = dtype, seed, timeout_s, extra_args, env
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def command(self, port: int) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_path,
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(port),
                "--dtype", self.dtype, "--seed", str(self.seed % SEED_MOD), "--disable-uvicorn-access-log",
                *self.extra_args]

    def start(self) -> str:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               **(self.env or {})}
        for var in ("PYTHONPATH", "VIRTUAL_ENV"):  # the project's venv must not leak into vLLM's
            env.pop(var, None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command(port), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self._wait_ready()
        return self.url

    def _wait_ready(self) -> None:
        client = CompletionsClient(self.url, self.served_name, timeout_s=5)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                self.stop()
                raise InputError(f"vLLM exited with code {code} while starting ({_one_line(first_error(self.log_path))}); "
                                 f"its log: {self.log_path}")
            try:
                client.check_model()
                return
            except InputError:
                time.sleep(1.0)
        self.stop()
        raise InputError(f"vLLM did not start serving within {self.timeout_s:g} s (distill_data.engine_timeout_s); "
                         f"its log: {self.log_path}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # the API server shuts its engine core down on SIGTERM
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        try:  # what outlived it in its own session (the engine core and workers of a server that crashed)
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
