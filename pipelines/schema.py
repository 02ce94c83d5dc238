"""Every config key of a run, as typed dataclasses. A run YAML mirrors `RunConfig` section by section.

Each stage reads the sections named in its `StageSpec.sections` (pipelines/stage.py); those, plus the
run seed and its inputs' content hashes, are its cache key. Each field's comment (beside it, or right
above it) is its documentation: `specdraft config --defaults` prints every key with its type, default and
that comment (pipelines/config_reference.py), and a test keeps every field documented.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from specdraft.data.demo_world import DOMAINS, HELDOUT_DOMAINS
from specdraft.core.errors import InputError, require_int
from specdraft.decoding.defaults import DecodingDefaults, is_threshold
from specdraft.pipelines.gguf_file import GGUFSource
# the evaluate section lives in its own file; its names are RunConfig's and read from here too
from specdraft.pipelines.schema_evaluate import BANDITS, SETS, CountedCosts, EvaluateSection  # noqa: F401
from specdraft.drafters.model import CausalLMConfig, preset
from specdraft.training.trainer import TrainerConfig


@dataclass
class RunSection:
    root: str = "runs/demo"  # every stage writes one directory under here
    seed: int = 0  # global seed; stages derive their own streams from it
    stages: Optional[list[str]] = None  # stages `specdraft run` executes, in order; null: all
    # before a stage starts work it re-hashes the files its input manifests promise: "cached" hashes a
    # file again only when its size or mtime changed (run.root/.work/hash-cache.json), "full" always,
    # "off" never (the choice is recorded in the stage's manifest)
    verify_inputs: Literal["cached", "full", "off"] = "cached"


@dataclass
class TargetSection:
    name_or_path: Optional[str] = None  # local HF dir or hub id; null: the demo target from pretrain-target
    # hub ids only: branch, tag or commit (null: main); the resolved commit is in every cache key and
    # manifest (a local dir is pinned by the content hash of its files instead; pipelines/pinning.py)
    revision: Optional[str] = None
    trust_remote_code: bool = False  # never on unless you trust the model repository
    # what the target and its drafters run in wherever a stage or the decoder runs them for inference (training
    # has its own: trainer.precision). auto: bf16 on a GPU with bf16 and on a CPU with bf16 units (avx512_bf16 or AMX),
    # where a (K + 1)-token verify costs about one forward; fp32 on other CPUs. float16 on a CPU without float16
    # units is refused (slower than fp32 there)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    quantization: Literal["none", "int8", "nf4"] = "none"  # bitsandbytes loading of the target
    device_map: Union[str, dict[str, Any], None] = None  # "auto", an explicit map, or null (one device)
    # a target shipped as GGUF (one file, or one split over package files); stage convert-target loads it with
    # transformers' GGUF reader and writes it once as a safetensors model directory that every later stage loads.
    # Exclusive with name_or_path; null: no GGUF target
    gguf: Optional[GGUFSource] = None

    def check(self) -> None:
        """The config's shape only: convert-target reads the files (validating a config never needs them)."""
        if self.gguf is None:
            return
        if self.name_or_path is not None or self.revision is not None:
            raise InputError("target.gguf and target.name_or_path (or revision) both name the target; keep one")
        self.gguf.check_shape("target.gguf")


@dataclass
class DemoSection:
    # which built-in world: demo (stdlib text: code, math, translate, summarize, chat; spell held out),
    # quality (rule tasks a small target learns and a one-layer drafter does not: math, translate, summarize;
    # data/quality_world.py), instruct (requests for a real chat model: code, math, summarize, chat; translate
    # held out; data/instruct_world.py) or coder (requests for a coder-instruct model: write, explain, tests,
    # math; fix held out; data/coder_world.py); domains / heldout_domains must name the chosen world's domains,
    # and no domain may be both (its OOD set would be in-domain)
    world: Literal["demo", "quality", "instruct", "coder"] = "demo"
    seed: int = 0  # the world is a pure function of this seed (the demo world's also of the interpreter's stdlib)
    domains: list[str] = field(default_factory=lambda: list(DOMAINS))  # domains with a drafter each
    heldout_domains: list[str] = field(default_factory=lambda: list(HELDOUT_DOMAINS))  # OOD: no drafter
    corpus_per_domain: int = 3000  # pretraining documents per domain (target and general drafter phase)
    train_per_domain: int = 200  # prompts per domain: distillation and acceptance data
    dev_per_domain: int = 40  # prompts per domain: alignment, head thresholds, router dev
    test_per_domain: int = 20  # prompts per domain: evaluation (also the perturbed and OOD sets)

    def check(self) -> None:
        from specdraft.data.prompts import WORLDS

        world_domains = WORLDS[self.world].ALL_DOMAINS
        for d in self.domains + self.heldout_domains:
            if d not in world_domains:
                import difflib

                hint = difflib.get_close_matches(d, sorted(world_domains), n=1, cutoff=0.0)
                raise InputError(f"demo domain '{d}' does not exist in the {self.world} world; did you mean "
                                 f"'{hint[0]}'? (its domains: {', '.join(world_domains)})")
        if not self.domains:
            raise InputError("demo.domains is empty; name at least one of " + ", ".join(world_domains))
        both = [d for d in self.heldout_domains if d in self.domains]
        if both:
            raise InputError(f"demo.heldout_domains names {', '.join(both)}, also in demo.domains: a held-out domain "
                             f"is one no drafter trains on; drop {'it' if len(both) == 1 else 'them'} from one of the two")
        for name in ("corpus_per_domain", "train_per_domain", "dev_per_domain", "test_per_domain"):
            if getattr(self, name) < 1:
                raise InputError(f"demo.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PromptsSection:
    # User prompt sources for a real run: JSONL files (a `prompt` field; optional `domain`, `response`,
    # `split`, `id`) or `datasets` directories. Empty: the demo world's prompt sets.
    sources: list[str] = field(default_factory=list)
    # How every stage formats a prompt for the target (decoding/bundle/chat.py; records may also be `messages` /
    # `conversations` lists, data/chat.py). null: the target tokenizer's chat template (plain text if it
    # has none); "none": plain text always; else a Jinja template string or a path to a .jinja file.
    chat_template: Optional[str] = None
    system_prompt: Optional[str] = None  # a system turn added to prompts that carry none (null: none)
    reasoning: Literal["keep", "strip"] = "keep"  # <think>...</think> of earlier assistant turns: kept or stripped
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # extra template variables, e.g. {enable_thinking: false}

    def check(self) -> None:
        from specdraft.data.chat import chat_format

        chat_format(self)  # a missing template file or a malformed template name fails before any stage


@dataclass
class TokenizerSection:
    vocab_size: int = 2048  # byte-level BPE vocabulary of the demo target
    min_frequency: int = 2  # BPE merges need at least this many occurrences


@dataclass
class PretrainTargetSection:
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)  # the demo target's BPE tokenizer
    model: CausalLMConfig = field(default_factory=lambda: preset("demo-target"))  # the demo target's architecture (LlamaForCausalLM); default preset demo-target
    seq_len: int = 256  # packed training blocks
    lr: float = 3e-3  # peak learning rate (AdamW, cosine with linear warmup)
    warmup_ratio: float = 0.05  # fraction of the steps spent warming up
    weight_decay: float = 0.0  # AdamW weight decay
    train: TrainerConfig = field(default_factory=lambda: TrainerConfig(max_steps=300, batch_size=16,  # the Lightning Trainer: steps, batch, precision, strategy, checkpoints
                                                                       checkpoint_every_n_steps=100))

    def check(self) -> None:
        if self.seq_len < 8:
            raise InputError(f"pretrain_target.seq_len must be >= 8, got {self.seq_len}")
        if self.seq_len > self.model.max_positions:
            raise InputError(f"pretrain_target.seq_len ({self.seq_len}) exceeds model.max_positions "
                             f"({self.model.max_positions}); lower one or raise the other")
        if not self.lr > 0:
            raise InputError(f"pretrain_target.lr must be > 0, got {self.lr}")


@dataclass
class DistillDataSection:
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.3, 0.7, 1.0])  # MetaSD App. F.2
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables
    max_new_tokens: int = 64  # tokens per target response
    batch_size: int = 32  # prompts per generate call
    chunk_size: int = 128  # jobs per resumable chunk file (the unit of sharding and of redo after a kill)
    max_prompt_tokens: int = 384  # longer prompts follow long_prompts
    long_prompts: Literal["truncate", "refuse"] = "truncate"  # truncate keeps BOS and the last tokens
    splits: list[str] = field(default_factory=lambda: ["train", "dev"])  # prompt splits the target answers
    device: str = "auto"  # where the target runs without a device_map: auto = cuda if available, else cpu
    # who generates: hf = transformers generate in this process; decoder = the project's batched decoder in this
    # process (static KV cache, ragged rows, optionally compiled and speculative: compile, drafter); vllm = a vLLM
    # OpenAI-compatible server this stage starts on the target from engine_python and stops when done; openai = a
    # server you run at engine_url (an engine whose /v1/completions takes token-id prompts and returns token ids,
    # e.g. vLLM). The engine_* keys say where, not what: a rerun at another URL resumes the same work
    backend: Literal["hf", "decoder", "vllm", "openai"] = "hf"
    # decoder backend: torch.compile mode of the decoder's steps (none | default | reduce-overhead); one compiler
    # serves the whole stage, so each graph (a batch size, a padded prompt width) compiles once
    compile: Literal["none", "default", "reduce-overhead"] = "none"
    # decoder backend: a drafter whose drafts the target verifies: a model directory with the target's tokenizer (a
    # causal LM such as the target's small sibling or a first round's drafter, or an EAGLE drafter of this target).
    # Lossless: the answers are the target's own (greedy: the same tokens; sampled: the same distribution, other
    # draws), made in fewer target forwards where its drafts are accepted. null: the target alone
    drafter: Optional[str] = None
    k: Optional[int] = None  # drafts per round with a drafter (fixed K); null: 4, or the head's own rounds with head
    head: Optional[str] = None  # a SpecDec++ head directory of the drafter: each round's length, at the head's threshold
    engine_url: Optional[str] = None  # openai backend: the server's base URL, e.g. http://localhost:8000/v1
    engine_model: Optional[str] = None  # openai backend: the name the server serves the target under (checked on /v1/models)
    engine_python: Optional[str] = None  # vllm backend: python of vLLM's own venv; null: $SPECDRAFT_VLLM_PYTHON or .venv-vllm (make vllm)
    engine_timeout_s: float = 600.0  # vllm/openai backends: seconds for the server to start and for one request
    # processes on this machine that share the chunks (`specdraft distill-data --shard` started here; this one
    # merges), the machine's torch threads split between them; the same bytes as one process, as each batch is
    # seeded by its chunk. 1: this process alone. Unused where the stage already runs as one of several shards
    # (--shard, a Slurm array, torchrun ranks)
    processes: int = 1

    def check(self) -> None:
        if self.processes < 1:
            raise InputError(f"distill_data.processes must be >= 1, got {self.processes}")
        if self.processes > 1 and self.backend == "vllm":
            raise InputError("distill_data.processes > 1 would start one vLLM server per process; the server batches "
                             "requests itself: set distill_data.processes: 1 with backend vllm")
        if self.backend == "openai" and not (self.engine_url and self.engine_model):
            raise InputError("distill_data.backend openai needs distill_data.engine_url (e.g. http://localhost:8000/v1) "
                             "and distill_data.engine_model (the name the server serves the target under)")
        if self.engine_timeout_s <= 0:
            raise InputError(f"distill_data.engine_timeout_s must be > 0, got {self.engine_timeout_s}")
        self.check_decoder()
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise InputError(f"distill_data.temperatures must be a non-empty list of values >= 0, got {self.temperatures}")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise InputError("distill_data.top_p must be in (0, 1] and top_k >= 0 (0 disables top-k)")
        for name in ("max_new_tokens", "batch_size", "chunk_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"distill_data.{name} must be >= 1, got {getattr(self, name)}")
        for s in self.splits:
            if s not in ("train", "dev", "test"):
                raise InputError(f"distill_data.splits: unknown split '{s}'; use train, dev or test")

    def check_decoder(self) -> None:
        """The decoder backend's keys: set only with it, a drafter's only with a drafter, one rule per round."""
        if self.backend != "decoder":
            given = [f"{k}: {v}" for k, v in (("compile", self.compile if self.compile != "none" else None),
                                              ("drafter", self.drafter), ("k", self.k), ("head", self.head)) if v]
            if given:
                raise InputError(f"distill_data.{given[0]} applies to backend decoder, not {self.backend}; set "
                                 "distill_data.backend: decoder or leave it out")
        if self.drafter is None and (self.k is not None or self.head is not None):
            raise InputError("distill_data.k and distill_data.head shape a drafter's rounds; name it with "
                             "distill_data.drafter: DIR or leave them out")
        if self.k is not None and self.head is not None:
            raise InputError("distill_data.k (fixed K) and distill_data.head (SpecDec++ rounds) both set the round's "
                             "length; keep one")
        if self.k is not None:
            require_int(self.k, "distill_data.k")


@dataclass
class DrafterSpec:
    name: str  # the drafter's directory name in drafters/ and the bundle
    domains: list[str] = field(default_factory=list)  # empty: every training domain (an OFA drafter)


@dataclass
class PhaseSection:
    enabled: bool = True  # only the general phase can be turned off (finetune must stay on)
    loss: Literal["ce", "fkl", "tvd"] = "ce"  # ce: KD on target samples; fkl/tvd: against the target's p
    lr: float = 2e-5  # MetaSD App. F.2
    warmup_ratio: float = 0.03  # fraction of the steps spent warming up (cosine schedule)
    weight_decay: float = 0.0  # AdamW weight decay
    optimizer: Literal["adamw", "adamw8bit"] = "adamw"  # adamw8bit needs bitsandbytes
    teacher_topk: Optional[int] = None  # fkl/tvd: keep only the target's top-k (null: full distribution)
    # fkl/tvd: run the target once over the training rows and keep its logits at every trained-on position in
    # memory when they fit in this many GB (positions x vocab x 4 bytes); 0 or too big: run it at every step
    teacher_cache_gb: float = 2.0
    grad_checkpointing: bool = False  # recompute activations in the backward pass (less memory, more time)
    max_length: int = 512  # tokens per training sequence (long prompts lose tokens from the left)
    train: TrainerConfig = field(default_factory=lambda: TrainerConfig(max_epochs=3, batch_size=8))  # the Lightning Trainer of this phase

    def check(self) -> None:
        if not self.lr > 0:
            raise InputError(f"lr must be > 0, got {self.lr}")
        if self.max_length < 2:
            raise InputError(f"max_length must be >= 2, got {self.max_length}")
        if self.teacher_cache_gb < 0:
            raise InputError(f"teacher_cache_gb must be >= 0 (0: run the target at every step), got {self.teacher_cache_gb}")


@dataclass
class EagleTreeSection:
    """EAGLE-2's dynamic draft tree (decoding/speculators/eagle.py TreeShape); the paper's defaults are 6 / 10 / 60."""
    depth: int = 4  # levels drafted per round
    top_k: int = 4  # children per expanded node, and nodes expanded per level
    nodes: int = 16  # nodes kept (by cumulative draft confidence) and verified in one target forward


@dataclass
class EagleSection:
    """White-box EAGLE drafters over the target's features (drafters/eagle.py), trained on the same
    self-distilled rows as the independent drafters, with the target's features and distribution from stage
    teacher-data's stored signal (computed by the target in every step where that stage did not run)."""
    enabled: bool = False  # train EAGLE drafters beside the independent ones
    drafters: Optional[list[str]] = None  # names of drafters (as train_drafters names them) to give an
    #                                       EAGLE twin "eagle-<name>" with the same domains; null: all of them
    n_layers: int = 1  # decoder layers of the target's architecture
    # eagle3 (the default: what an engine serves): vLLM's Llama EAGLE-3 drafter (fc over 3 target layers,
    # [embedding ; hidden] into the layer, own lm_head over draft_vocab), token loss only, trained with the
    # training-time test (ttt_steps unrolled steps on its own predictions; no noise); export writes it as a
    # directory vLLM loads as method eagle3; needs a target of >= 3 layers;
    # eagle1: reads the target's final hidden state, SmoothL1 feature + token loss, feature noise;
    # eagle3-proj: specdraft's earlier EAGLE-3 ([embedding ; fused] projected to d, the target's head),
    # the same training; eagle1 and eagle3-proj are served by specdraft's decoder only
    variant: Literal["eagle1", "eagle3", "eagle3-proj"] = "eagle3"
    # eagle3: 3 increasing target layer ids (id i = the input of layer i, hidden_states[i]); null: vLLM's
    # 2, L/2, L-3. eagle3-proj: 3 hidden-state indices in [0, L]; null: EAGLE-3's 2, L/2, L-3
    layers: Optional[list[int]] = None
    draft_vocab: Optional[int] = None  # eagle3: draft in the N most frequent tokens of the self-distilled responses (d2t); null: the full vocabulary
    ttt_steps: int = 3  # eagle3: training-time test steps (1 = no unrolling)
    lr: float = 3e-4  # AdamW peak learning rate (cosine schedule with linear warmup)
    warmup_ratio: float = 0.03  # fraction of the steps spent warming up
    weight_decay: float = 0.0  # AdamW weight decay
    feature_noise: float = 0.1  # EAGLE-1: U(-0.1, 0.1) on the input features
    token_weight: float = 0.1  # EAGLE-1: 0.1 x token loss (forward KL to the target) + SmoothL1 on features
    max_length: int = 512  # tokens per (prompt + response) training sequence
    train: TrainerConfig = field(default_factory=lambda: TrainerConfig(max_epochs=3, batch_size=8))  # the loop
    # every this many optimizer steps (and at the end), the drafter's teacher-forced dev agreement and acceptance
    # go into its eagle_config.json (`dev_curve`): acceptance against training steps. 0: none
    eval_every_n_steps: int = 0
    tree: EagleTreeSection = field(default_factory=EagleTreeSection)  # the tree rows of evaluate / generate

    def check(self) -> None:
        if self.n_layers < 1 or self.max_length < 2:
            raise InputError("train_drafters.eagle.n_layers must be >= 1 and max_length >= 2")
        if not self.lr > 0 or self.feature_noise < 0 or self.token_weight < 0:
            raise InputError("train_drafters.eagle: lr must be > 0, feature_noise and token_weight >= 0")
        if self.ttt_steps < 1:
            raise InputError("train_drafters.eagle.ttt_steps must be >= 1 (1 = no training-time test)")
        if self.eval_every_n_steps < 0:
            raise InputError(f"train_drafters.eagle.eval_every_n_steps must be >= 0 (0: no dev curve), got "
                             f"{self.eval_every_n_steps}")
        if self.layers is not None and (self.variant == "eagle1" or len(self.layers) != 3):
            raise InputError("train_drafters.eagle.layers takes 3 hidden-state indices (low, middle, high) and only "
                             "with variant: eagle3; drop it for EAGLE-3's default or for eagle1")
        if self.draft_vocab is not None and (self.variant != "eagle3" or self.draft_vocab < 1):
            raise InputError("train_drafters.eagle.draft_vocab takes a size >= 1 and only with variant: eagle3")
        from specdraft.decoding.speculators.eagle import TreeShape

        TreeShape(self.tree.depth, self.tree.top_k, self.tree.nodes)


@dataclass
class TrainDraftersSection:
    model: CausalLMConfig = field(default_factory=lambda: preset("demo-drafter"))  # a preset name (metasd-68m for real runs) or the fields
    # what every drafter starts from instead of random init (train_drafters.model is then unused): a drafter
    # checkpoint dir, or a GGUF model ({file: ...} or {parts: [...], sha256: ...}, as target.gguf) such as the
    # target's smaller sibling, converted once in the stage's work dir; its tokenizer must be the target's
    init_from: Union[str, GGUFSource, None] = None
    # keep the untouched init_from model as a drafter of its own under this name (e.g. sibling): in drafters/ and
    # the bundle with no domains (neither a specialist nor the all-domain drafter), its alignment measured as every
    # drafter's, so reports set the distilled drafters beside it. null: none
    init_drafter: Optional[str] = None
    drafters: Optional[list[DrafterSpec]] = None  # null: one per training domain + "ofa" on all of them
    general: PhaseSection = field(default_factory=lambda: PhaseSection(lr=1e-3, train=TrainerConfig(max_steps=200, batch_size=16)))  # phase 1, on general_on's data
    # what the general phase trains on: corpus = the built-in world's pretraining documents (demo and quality
    # worlds; held-out domains excluded); distilled = the self-distilled responses of every training domain
    # (prompt + response, loss on the response): a real target has no corpus, so the mixture is the base every
    # drafter, the OFA one included, then finetunes from
    general_on: Literal["corpus", "distilled"] = "corpus"
    finetune: PhaseSection = field(default_factory=PhaseSection)  # phase 2 on self-distilled responses
    # distilled: the target's own responses (self-distillation); reference: the prompt sets' reference
    # answers instead (the no-distillation control of benchmarks/training/bench_distillation.py)
    finetune_on: Literal["distilled", "reference"] = "distilled"
    # same_epochs: the OFA drafter runs the finetune epochs over the whole mixture (MetaSD);
    # same_steps: it gets as many optimizer steps as one specialist (an equal-compute comparison)
    ofa_compute: Literal["same_epochs", "same_steps"] = "same_epochs"
    alignment_batch_size: int = 32  # sequences per teacher-forced forward when measuring alignment
    # the weights of the serving drafters as written (the trained ones and init_drafter; they train in fp32):
    # bfloat16 halves a sibling-sized drafter on disk and in the bundle, where a pair served in bf16 rounds them anyway
    save_dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = "auto"  # where the target runs for alignment / fkl teachers: auto = cuda if available
    eagle: EagleSection = field(default_factory=EagleSection)  # EAGLE drafters (off by default)

    def check(self) -> None:
        if isinstance(self.init_from, GGUFSource):
            self.init_from.check_shape("train_drafters.init_from")
        name = self.init_drafter
        if name is not None and (self.init_from is None or not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name)):
            raise InputError(f"train_drafters.init_drafter {name!r} keeps the init_from model as a drafter: "
                             "it needs init_from and a plain name (letters, digits, _ . -), e.g. sibling")
        if not self.finetune.enabled:
            raise InputError("train_drafters.finetune.enabled: false is not supported (the finetune phase makes the "
                             "serving drafters); turn off train_drafters.general.enabled instead, or drop the key")


@dataclass
class TeacherDataSection:
    """The target's signal over the training rows, computed once (stage teacher-data) so that no drafter's training
    runs the target: its top-k distribution at every trained-on position and, for EAGLE drafters, the hidden
    states they read at every token."""
    # false: no stored signal; fkl / tvd and the EAGLE drafters then run the target at every training step
    enabled: bool = True
    top_k: int = 64  # the target's most likely tokens kept per trained-on position (the distillation target)
    hidden_dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"  # how the EAGLE features are stored
    logprob_dtype: Literal["float16", "float32"] = "float16"  # how the top-k log-probabilities are stored
    # a second source of training rows at prefill speed, text the target did not write, scored in the same pass:
    # reference = the train prompts' reference answers (each after its prompt), corpus = prepare-data's corpus
    # (demo and quality worlds; held-out domains excluded). ce trains on the target's greedy token there, fkl / tvd
    # and EAGLE on its top-k. []: the target's own answers only
    extra: list[Literal["reference", "corpus"]] = field(default_factory=list)
    extra_per_domain: Optional[int] = None  # at most this many extra rows per source and domain; null: all
    batch_size: int = 16  # rows per teacher-forced forward
    chunk_size: int = 64  # rows per resumable shard (the unit of sharding and of redo after a kill)
    # processes on this machine that share the chunks (as distill_data.processes); 1: this process alone
    processes: int = 1
    device: str = "auto"  # where the target runs without a device_map: auto = cuda if available, else cpu

    def check(self) -> None:
        for name in ("top_k", "batch_size", "chunk_size", "processes"):
            if getattr(self, name) < 1:
                raise InputError(f"teacher_data.{name} must be >= 1, got {getattr(self, name)}")
        if self.extra_per_domain is not None and self.extra_per_domain < 1:
            raise InputError(f"teacher_data.extra_per_domain must be >= 1 or null (all), got {self.extra_per_domain}")
        if len(set(self.extra)) != len(self.extra):
            raise InputError(f"teacher_data.extra names a source twice ({self.extra}); name each once")


def stored_signal_readers(cfg: "RunConfig") -> dict[str, int]:
    """The training phases that read the target's stored signal, each with the context length it trains at:
    the finetune phase (fkl / tvd, or extra rows), the EAGLE drafters. Empty: stage teacher-data has nothing to
    do (it is off, or the drafters train on reference answers it does not score)."""
    tcfg, dcfg = cfg.train_drafters, cfg.teacher_data
    if not dcfg.enabled or tcfg.finetune_on != "distilled":
        return {}
    readers = {}
    if tcfg.finetune.loss != "ce" or dcfg.extra:
        readers["train_drafters.finetune"] = tcfg.finetune.max_length
    if tcfg.eagle.enabled:
        readers["train_drafters.eagle"] = tcfg.eagle.max_length
    return readers


@dataclass
class SamplingSection:
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 disables
    top_p: float = 1.0  # 1.0 disables

    def config(self):
        """The decoder's SamplingConfig (raises InputError on impossible values)."""
        from specdraft.decoding.rounds.sampling import SamplingConfig

        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def check(self) -> None:
        self.config()


@dataclass
class AcceptanceDataSection:
    # The transforms labels are made under, one set of labels, features and heads each; the decoder
    # picks the heads whose transform it serves with (SpecDec++ §4.4: never label at another one).
    label_transforms: list[SamplingSection] = field(default_factory=lambda: [SamplingSection()])
    mix_rate: float = 0.15  # r: probability that Z_i is the target's token X_i (SpecDec++ §4.4)
    batch_size: int = 32  # sequences per forward
    max_length: int = 512  # tokens per sequence (prompt truncated from the left)
    max_sequences: dict[str, int] = field(default_factory=lambda: {"train": 4000, "dev": 400})  # per drafter
    cache_features: bool = True  # false: store no hidden states; train-heads reruns the drafter each epoch
    drafters: Optional[list[str]] = None  # null: every drafter of train-drafters
    device: str = "auto"  # where target and drafters run: auto = cuda if available, else cpu

    def check(self) -> None:
        if not 0.0 <= self.mix_rate < 1.0:
            raise InputError(f"acceptance_data.mix_rate must be in [0, 1), got {self.mix_rate}")
        if self.batch_size < 1 or self.max_length < 2:
            raise InputError("acceptance_data.batch_size must be >= 1 and max_length >= 2")
        tags = [t.config().tag for t in self.label_transforms]
        if not tags or len(set(tags)) != len(tags):
            raise InputError(f"acceptance_data.label_transforms must list distinct transforms, got {tags}; "
                             "e.g. [{temperature: 0.0}, {temperature: 1.0}]")


@dataclass
class TrainHeadsSection:
    depths: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])  # D residual blocks (SpecDec++ §5.1)
    w_rejs: list[float] = field(default_factory=lambda: [1.0, 3.0, 6.0, 12.0])  # rejection weights; w_acc = 1
    lr: float = 5e-5  # Adam, cosine schedule
    epochs: int = 3  # passes over the acceptance data (SpecDec++ §5.1: 3)
    batch_size: int = 32  # positions per step (SpecDec++ §5.1: 32)
    tie_blocks: bool = False  # share one block across the D positions (the reference code's accident, made explicit)
    zero_init: bool = False  # residual blocks start as the identity
    thresholds: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5, 0.7, 0.9])  # h candidates
    # c = t_draft / t_target the thresholds and the best fixed K are chosen with, and that export writes into
    # the bundle (unless decoding.cost_ratio pins another); null: calibrated on this machine as evaluate calibrates it
    cost_ratio: Optional[float] = None
    # processes on this machine that share the (drafter, label transform) grids (`specdraft train-heads --shard`
    # started here; this one measures c first and merges), the machine's torch threads split between them; the
    # same files as one process. 1: this process alone
    processes: int = 1

    def check(self) -> None:
        if self.processes < 1:
            raise InputError(f"train_heads.processes must be >= 1, got {self.processes}")
        if any(d < 0 or d > 8 for d in self.depths) or not self.depths:
            raise InputError(f"train_heads.depths must be a non-empty list of 0..8, got {self.depths}")
        if not self.w_rejs or any(w <= 0 for w in self.w_rejs):
            raise InputError(f"train_heads.w_rejs must be positive, got {self.w_rejs}")
        if not self.thresholds or not all(is_threshold(h) for h in self.thresholds):
            raise InputError(f"train_heads.thresholds must lie in (0, 1), got {self.thresholds}")
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise InputError("train_heads.epochs and batch_size must be >= 1 and lr > 0")
        if self.cost_ratio is not None and self.cost_ratio < 0:
            raise InputError(f"train_heads.cost_ratio must be >= 0, got {self.cost_ratio}")


@dataclass
class TrainRouterSection:
    # Routing baselines (MetaSD §4.3): pick one drafter per prompt before decoding.
    labels: Literal["acceptance", "domain"] = "acceptance"  # best measured drafter per prompt, or its domain's
    hidden: int = 128  # MLP width over mean-pooled target input embeddings
    lr: float = 1e-3  # Adam learning rate of the classifier
    train: TrainerConfig = field(default_factory=lambda: TrainerConfig(max_epochs=20, batch_size=32))  # the Lightning Trainer of the classifier
    label_batch_size: int = 16  # prompts per teacher-forced forward when measuring drafter acceptance
    # training prompts labelled (a seeded subset; each label runs the target over the prompt's responses); null: all
    label_prompts: Optional[int] = None

    def check(self) -> None:
        if self.label_prompts is not None:
            require_int(self.label_prompts, "train_router.label_prompts", hint="or null: every training prompt")
    device: str = "auto"  # where target and drafters run when measuring labels: auto = cuda if available


@dataclass
class ExportSection:
    heads: Literal["best", "all"] = "best"  # per drafter: the head with the best simulated cost, or all 20
    target: Literal["copy", "reference"] = "copy"  # copy the weights into the bundle, or reference path/hub id
    # ship the REST / suffix-decoding datastore (suffix array over distill-data's train responses)
    datastore: bool = True


@dataclass
class RunConfig:
    run: RunSection = field(default_factory=RunSection)  # where the run writes, its seed and which stages run
    target: TargetSection = field(default_factory=TargetSection)  # the target LLM: a local dir or hub id, or null for the demo target
    demo: DemoSection = field(default_factory=DemoSection)  # the built-in demo world (used when target.name_or_path is null)
    prompts: PromptsSection = field(default_factory=PromptsSection)  # user prompt sets for a real run
    pretrain_target: PretrainTargetSection = field(default_factory=PretrainTargetSection)  # demo only: the tiny target's tokenizer and pretraining
    distill_data: DistillDataSection = field(default_factory=DistillDataSection)  # the target answers the train/dev prompts (MetaSD App. F.2)
    teacher_data: TeacherDataSection = field(default_factory=TeacherDataSection)  # the target's signal over the training rows, computed once
    train_drafters: TrainDraftersSection = field(default_factory=TrainDraftersSection)  # general pretraining, then self-distillation per domain + OFA (MetaSD App. F.2)
    acceptance_data: AcceptanceDataSection = field(default_factory=AcceptanceDataSection)  # SpecDec++ §4.4: token-mixed acceptance labels and drafter features
    train_heads: TrainHeadsSection = field(default_factory=TrainHeadsSection)  # SpecDec++ §5.1 grid of acceptance heads; thresholds chosen by simulation
    train_router: TrainRouterSection = field(default_factory=TrainRouterSection)  # MetaSD §4.3 routing baselines
    export: ExportSection = field(default_factory=ExportSection)  # what goes into the bundle the decoder serves with
    # the decoder's defaults: export writes them into bundle.json (what generate and evaluate serve with);
    # train-heads simulates rounds up to its k_max and times the cost ratio with rounds of its k
    decoding: DecodingDefaults = field(default_factory=DecodingDefaults)
    evaluate: EvaluateSection = field(default_factory=EvaluateSection)  # decode the eval prompt sets with the bundle and write the report

    def check(self) -> None:
        from specdraft.decoding.cascades import method_from_spec

        method_from_spec(self.decoding.cascade, "decoding.cascade")  # bundle.json's reader checks it again
        lengths = stored_signal_readers(self)
        if len(set(lengths.values())) > 1:  # one stored signal, computed over one context
            raise InputError(f"{' and '.join(f'{k}.max_length ({v})' for k, v in lengths.items())} differ, and both "
                             "read the target's stored signal (teacher-data), computed over one context; set them "
                             "equal, or teacher_data.enabled: false")