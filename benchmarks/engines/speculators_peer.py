"""vLLM's `speculators` (0.9.0) as bench_speculators.py's peer: its EAGLE-3 trainer run on a CPU, and its checkpoint
loaded into specdraft's decoder.

The trainer runs as a child process of speculators' own venv through speculators_launch.py, on the rows and hidden
states speculators_data.py wrote, with the settings the comparison fixes. Its checkpoint is vLLM's eagle3 layout
plus two norms speculators turns on by default; `load_peer` maps it onto specdraft's EAGLE-3 drafter
(`layers.N.*` -> `body.layers.N.*`) with those norms added by `PeerEagle3Drafter`.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import Eagle3Drafter
from benchmarks.harness.timing import run_child, tail

LAUNCHER = Path(__file__).with_name("speculators_launch.py")
DROPPED_PEER_KEYS = ("embed_tokens.weight", "t2d", "verifier_lm_head.weight", "verifier_norm.weight")


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
    shutil.rmtree(save, ignore_errors=True)
    cmd = [args.spec_python, str(LAUNCHER), "--steps-per-epoch", str(steps), "--", *flags]
    res = run_child(cmd, save.parent / "speculators_train.log")
    if res["rc"] != 0:
        raise RuntimeError(f"speculators train failed (rc {res['rc']}); its log ends:\n{tail(save.parent / 'speculators_train.log')}")
    epochs = sorted((p for p in save.iterdir() if p.name.isdigit() and (p / "model.safetensors").exists()),
                    key=lambda p: int(p.name))
    if not epochs:
        raise RuntimeError(f"speculators wrote no checkpoint under {save}")
    return {**res, "model": str(epochs[-1]), "flags": flags, "steps": steps_run(save.parent / "speculators_train.log")}


def steps_run(log: Path, epochs: int = 1) -> int:
    """The optimizer steps speculators ran, from its log: the launcher's packing of the train split (one step a
    packed batch, over `epochs` epochs). The packing asked for `--steps-per-epoch` batches can make fewer (the
    smallest token budget that packs the rows into at most that many), so the count asked for is not the count run."""
    found = re.findall(r"^\[speculators_launch\] --total-seq-len \d+: (\d+) packed batches an epoch$",
                       log.read_text(errors="replace"), flags=re.MULTILINE)
    if not found:
        raise RuntimeError(f"{log} does not say how many batches speculators packed (no speculators_launch line)")
    return int(found[-1]) * epochs


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

