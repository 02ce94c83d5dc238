"""distill-data through a serving engine: the `vllm` backend (a server the stage starts from vLLM's venv
and stops) and the `openai` backend (a server already running) write the same chunks and dataset, with
per-request seeds, as each other; their greedy responses are the HF backend's; a server that does not
answer, serves another model or dies mid-run stops the stage with one line, and a rerun resumes."""
import os
import time

import pytest

import specdraft.pipelines.distill_data as dd
from specdraft.core.errors import InputError
from specdraft.data.engines import VllmServer
from specdraft.pipelines.readers import load_distill_data
from specdraft.pipelines.stage import run_stage, stage_dir
from tests.pipelines.conftest import fresh_copy, tiny_config

pytestmark = pytest.mark.vllm


def rows(root):
    ds = load_distill_data(root / "distill_data")
    return {s: {r["id"]: (tuple(r["prompt_ids"]), tuple(r["response_ids"]), r["finish_reason"]) for r in ds[s]}
            for s in ds}


def engine_config(root, **distill):
    return tiny_config(root, distill_data=distill)


@pytest.fixture(scope="module")
def served(vllm_python, tiny_run_template, tmp_path_factory):
    """A vLLM server on the tiny target, run by the test as a user would, under the name 'tiny-target'."""
    target = stage_dir(tiny_config(tiny_run_template), "pretrain-target")
    log = tmp_path_factory.mktemp("served") / "server.log"
    with VllmServer(vllm_python, str(target), "tiny-target", log, "float32", timeout_s=420) as url:
        yield url


@pytest.fixture(scope="module")
def by_backend(vllm_python, tiny_run_template, served, tmp_path_factory, request):
    """The stage's output with each backend; the vllm one killed after two chunks and rerun."""
    base = tmp_path_factory.mktemp("by_backend")
    out = {}
    hf = fresh_copy(tiny_run_template, base, "hf")
    run_stage(engine_config(hf), "distill-data")
    out["hf"] = rows(hf)

    oai = fresh_copy(tiny_run_template, base, "openai")
    run_stage(engine_config(oai, backend="openai", engine_url=served, engine_model="tiny-target"), "distill-data")
    out["openai"] = rows(oai)

    root = fresh_copy(tiny_run_template, base, "vllm")
    cfg = engine_config(root, backend="vllm", engine_python=str(vllm_python), engine_timeout_s=420)
    servers, real_start, real_run_chunk, done = [], VllmServer.start, dd.run_chunk, []

    def recording_start(self):
        servers.append(self)
        url = real_start(self)
        self.session = self.proc.pid  # its process group: the server and the engine processes it starts
        return url

    def server_dies_after_two_chunks(chunk, *args, **kwargs):
        if len(done) == 2 and len(servers) == 1:
            servers[-1].proc.kill()  # the server process dies (its engine core follows it)
            servers[-1].proc.wait()
        result = real_run_chunk(chunk, *args, **kwargs)
        done.append(chunk["name"])
        return result

    mp = pytest.MonkeyPatch()
    mp.setattr(VllmServer, "start", recording_start)
    mp.setattr(dd, "run_chunk", server_dies_after_two_chunks)
    try:
        with pytest.raises(InputError) as died:
            run_stage(cfg, "distill-data")
        chunk_files = sorted(p.name for p in (root / ".work").glob("distill_data-*/chunks/*.json"))
        out["died"] = {"message": str(died.value), "chunks_kept": len(chunk_files),
                       "stopped": all(s.proc is None for s in servers)}
        run_stage(cfg, "distill-data")  # resumes: the two finished chunks are not redone
        out["vllm"], out["chunks_done"], out["servers"] = rows(root), done, servers
    finally:
        mp.undo()
    return out


def test_vllm_and_openai_backends_write_the_same_data(by_backend):
    assert by_backend["vllm"] == by_backend["openai"]  # per-request seeds: T=1 rows too
    assert by_backend["vllm"].keys() == by_backend["hf"].keys()
    for split in by_backend["hf"]:
        assert by_backend["vllm"][split].keys() == by_backend["hf"][split].keys()
        for rid, (prompt, resp, finish) in by_backend["vllm"][split].items():
            assert prompt == by_backend["hf"][split][rid][0]  # the chat template applied once, the same way
            assert 1 <= len(resp) <= 8 and (finish == "eos") == (resp[-1] == 2)


def test_greedy_responses_agree_with_the_hf_backend(by_backend):
    greedy = [(rid, r) for s in by_backend["hf"] for rid, r in by_backend["hf"][s].items() if rid.endswith("@t0")]
    vllm = {rid: r for s in by_backend["vllm"] for rid, r in by_backend["vllm"][s].items()}
    same = sum(vllm[rid] == r for rid, r in greedy)
    print(f"\ngreedy responses equal between hf and vllm: {same}/{len(greedy)}")
    assert same == len(greedy)


def test_a_server_that_dies_stops_the_stage_in_one_line_and_a_rerun_resumes(by_backend):
    died = by_backend["died"]
    assert "did not answer" in died["message"] and "\n" not in died["message"]
    assert died["chunks_kept"] == 2 and died["stopped"]
    done = by_backend["chunks_done"]
    assert len(done) > 2 and len(set(done)) == len(done)  # the rerun did the rest, none of it twice
    assert len(by_backend["servers"]) == 2 and all(s.proc is None for s in by_backend["servers"])
    for server in by_backend["servers"]:  # nothing of either server is left running, the crashed one included
        assert session_ended(server.session)


def session_ended(pgid: int, wait_s: float = 30.0) -> bool:
    """True once no process of the group is left (killed ones may take a moment to be reaped)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


def test_another_model_or_no_server_is_one_line(tiny_run_template, served, tmp_path):
    from specdraft.data.engines import free_port

    root = fresh_copy(tiny_run_template, tmp_path)
    with pytest.raises(InputError, match=r"serves \['tiny-target'\], not 'llama-70b'"):
        run_stage(engine_config(root, backend="openai", engine_url=served, engine_model="llama-70b"), "distill-data")
    with pytest.raises(InputError, match="did not answer") as e:
        run_stage(engine_config(root, backend="openai", engine_url=f"http://127.0.0.1:{free_port()}/v1",
                                engine_model="tiny-target", engine_timeout_s=5), "distill-data")
    assert "\n" not in str(e.value)
    assert not (root / "distill_data").exists()
