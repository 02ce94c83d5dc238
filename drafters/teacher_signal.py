"""The target's signal over training rows, computed once and stored: what every drafter's training reads from the
target, so that no training step runs it.

One teacher-forced pass of the target over a row (prompt + response, fitted to the training context as
`CausalLMCollator` fits it) gives
  - its top-k next-token distribution at every trained-on position (the collator's loss-mask positions): token
    ids and their log-probabilities under the full softmax, highest first; fkl / tvd distil it, ce on text the
    target did not write takes its top-1 (the target's greedy token), EAGLE drafters distil it too;
  - the hidden states an EAGLE drafter reads (`fused_features` of its feature layers: EAGLE-3's three layer
    inputs, or EAGLE-1's final state) at every token of the row, since the drafter attends to the prompt too.

A stored row is a plain dict of columns (a `datasets` row):
  id, prompt_id, domain, source     source "distilled" (the target's own answer) or "reference" / "corpus" (text it
                                    did not write, scored in the same pass)
  prompt_ids, response_ids          as trained on: already fitted, so the collator leaves them as they are
  topk_ids, topk_logprobs           bytes of an (n, k) array: ids uint16 (int32 past 65,536 tokens), log-probs in
                                    `SignalFormat.logprob_dtype`; n = the row's trained-on positions
  features                          bytes of a (T, F) array in `SignalFormat.hidden_dtype`, T = the row's tokens;
                                    empty when no EAGLE drafter reads the stored signal
Raw bytes with the shapes implied by the row and the format (info.json of the stage) read ~8x faster than
datasets' Array2D, and carry bf16, which Arrow has no type for.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import datasets
import numpy as np
import torch

from specdraft.core.errors import InputError
from specdraft.decoding.speculators.eagle_model import fused_features
from specdraft.drafters.data import (CE_TARGETS, TEACHER_FEATURES, TOPK_IDS, TOPK_LOGPROBS, CausalLMCollator,
                                     fit_to_length)

DISTILLED = "distilled"
SOURCES = (DISTILLED, "reference", "corpus")
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# numpy has no bf16: its bytes travel as int16 and are viewed as bf16 again in torch; ids under 65,536 travel as
# int16 bytes too and are read back as uint16
NUMPY_OF = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16, torch.int32: np.int32}


ROW_FEATURES = datasets.Features({
    **{k: datasets.Value("string") for k in ("id", "prompt_id", "domain", "source")},
    "prompt_ids": datasets.Sequence(datasets.Value("int32")), "response_ids": datasets.Sequence(datasets.Value("int32")),
    "prompt_dropped": datasets.Value("int32"),
    # a row's arrays can pass 2 GiB in a chunk of a wide target's rows: 64-bit offsets
    **{k: datasets.Value("large_binary") for k in ("topk_ids", "topk_logprobs", "features")},
})


@dataclass(frozen=True)
class SignalFormat:
    """What a stored signal holds and in which types (the stage's info.json)."""

    top_k: int  # distribution entries kept per trained-on position
    vocab_size: int  # the target's
    max_length: int  # the training context the rows were fitted to (tokens)
    feature_layers: tuple[int, ...] | None  # hidden_states indices fused per token; None: no features stored
    feature_width: int  # F: hidden size x len(feature_layers) (0 without features)
    hidden_dtype: str = "bfloat16"
    logprob_dtype: str = "float16"

    @property
    def id_dtype(self) -> torch.dtype:
        return torch.int16 if self.vocab_size <= 65536 else torch.int32  # int16 bytes read back as uint16

    def to_json(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = None if self.feature_layers is None else list(self.feature_layers)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "SignalFormat":
        d = dict(d)
        d["feature_layers"] = None if d.get("feature_layers") is None else tuple(d["feature_layers"])
        return cls(**d)


def signal_format(target_config, top_k: int, max_length: int, feature_layers: Sequence[int] | None,
                  hidden_dtype: str = "bfloat16", logprob_dtype: str = "float16") -> SignalFormat:
    """The format for `target_config`; refuses a k past the vocabulary."""
    V = target_config.vocab_size
    if not 1 <= top_k <= V:
        raise InputError(f"teacher_data.top_k must be in [1, {V}] (the target's vocabulary), got {top_k}")
    layers = None if feature_layers is None else tuple(feature_layers)
    width = 0 if layers is None else target_config.hidden_size * len(layers)
    return SignalFormat(top_k, V, max_length, layers, width, hidden_dtype, logprob_dtype)


def to_bytes(x: torch.Tensor, dtype: torch.dtype) -> bytes:
    x = x.detach().to("cpu", dtype).contiguous()
    return x.view(torch.int16).numpy().tobytes() if dtype == torch.bfloat16 else x.numpy().tobytes()


def from_bytes(buf: bytes, dtype: torch.dtype, width: int) -> torch.Tensor:
    """(n, width) tensor of `dtype` from `to_bytes` output (a copy: Arrow's buffers are read-only)."""
    if dtype == torch.int16:
        arr = torch.from_numpy(np.frombuffer(buf, dtype=np.uint16).astype(np.int64))
    else:
        arr = torch.from_numpy(np.frombuffer(buf, dtype=NUMPY_OF[dtype]).copy())
        arr = arr.view(torch.bfloat16) if dtype == torch.bfloat16 else arr.long() if dtype == torch.int32 else arr
    return arr.view(-1, width)


def fitted(row: dict, max_length: int) -> dict:
    """A row's prompt and response as trained on at `max_length` (long prompts lose tokens from the left)."""
    if not row["prompt_ids"]:  # then no position would predict the response's first token
        raise InputError(f"row {row['id']} has an empty prompt; every stored row needs one (a BOS token at least)")
    prompt, response, dropped = fit_to_length(row["prompt_ids"], row["response_ids"], max_length)
    return dict(row, prompt_ids=prompt, response_ids=response, prompt_dropped=dropped)


@torch.no_grad()
def score_batch(target, rows: list[dict], fmt: SignalFormat, pad_id: int) -> list[dict]:
    """One teacher-forced pass of `target` over fitted `rows`; -> each row with its stored columns. The LM head
    runs at the trained-on positions only; hidden states are gathered only when `fmt` stores features."""
    collate = CausalLMCollator(pad_token_id=pad_id, max_length=fmt.max_length)
    batch = collate(rows)
    dev = target.get_input_embeddings().weight.device
    mask = batch["loss_mask"].to(dev).bool()
    out = target(input_ids=batch["input_ids"].to(dev), attention_mask=batch["attention_mask"].to(dev),
                 use_cache=False, logits_to_keep=mask, output_hidden_states=fmt.feature_layers is not None)
    logprobs, ids = out.logits.float().log_softmax(-1).topk(fmt.top_k, dim=-1)  # (N, k), highest first
    counts = mask.sum(1).tolist()
    feats = None if fmt.feature_layers is None else fused_features(out.hidden_states, fmt.feature_layers)
    lengths = batch["attention_mask"].sum(1).tolist()
    stored = []
    for b, (r, ids_b, lp_b) in enumerate(zip(rows, ids.split(counts), logprobs.split(counts))):
        f = b"" if feats is None else to_bytes(feats[b, : lengths[b]], FLOAT_DTYPES[fmt.hidden_dtype])
        stored.append(dict(r, topk_ids=to_bytes(ids_b, fmt.id_dtype),
                           topk_logprobs=to_bytes(lp_b, FLOAT_DTYPES[fmt.logprob_dtype]), features=f))
    return stored


def score_rows(target, rows: list[dict], fmt: SignalFormat, pad_id: int, batch_size: int) -> list[dict]:
    """`score_batch` over length-sorted batches (little padding); -> the stored rows in `rows`' order. With right
    padding a row's signal does not depend on its batch-mates."""
    rows = [fitted(r, fmt.max_length) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["prompt_ids"]) + len(rows[i]["response_ids"]))
    out: list[dict | None] = [None] * len(rows)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        for i, s in zip(idx, score_batch(target, [rows[i] for i in idx], fmt, pad_id)):
            out[i] = s
    return out


def ce_targets(row: dict, topk_ids: torch.Tensor) -> torch.Tensor:
    """The token ce trains on at each of a row's trained-on positions: the response's next token on the target's
    own answers (what ce reads without a stored signal), the target's greedy token on text it did not write."""
    if row["source"] == DISTILLED:
        return torch.as_tensor(row["response_ids"], dtype=torch.long)
    return topk_ids[:, 0]


class StoredExamples(torch.utils.data.Dataset):
    """Training examples over stored rows (a `datasets.Dataset`, memory-mapped), decoded one at a time: prompt
    and response ids, the top-k rows (`topk`), the ce targets, and the features (`features`)."""

    def __init__(self, data, indices: Sequence[int], fmt: SignalFormat, topk: bool = True, features: bool = False):
        if features and fmt.feature_layers is None:
            raise InputError("the stored signal holds no hidden states; rerun stage teacher-data with the EAGLE "
                             "drafters enabled (train_drafters.eagle.enabled)")
        if data._indices is not None:
            # a select()ed dataset keeps the whole table beside a mapping of its rows, and the cells below read the
            # table: without this, row i would be the table's i-th, not the selection's (datasets has no public
            # accessor for the mapping; flattening keeps only the selected rows, in memory)
            data = data.flatten_indices(keep_in_memory=True)
        self.table, self.indices, self.fmt = data.data, list(indices), fmt  # the Arrow table: no row dicts
        self.topk, self.features = topk, features

    def __len__(self) -> int:
        return len(self.indices)

    def _cell(self, name: str, i: int):
        return self.table.column(name)[i].as_py()

    def __getitem__(self, j: int) -> dict:
        i, fmt = self.indices[j], self.fmt
        row = {k: self._cell(k, i) for k in ("source", "prompt_ids", "response_ids")}
        ids = from_bytes(self._cell("topk_ids", i), fmt.id_dtype, fmt.top_k)
        ex = {"prompt_ids": row["prompt_ids"], "response_ids": row["response_ids"], CE_TARGETS: ce_targets(row, ids)}
        if self.topk:
            ex[TOPK_IDS] = ids
            ex[TOPK_LOGPROBS] = from_bytes(self._cell("topk_logprobs", i), FLOAT_DTYPES[fmt.logprob_dtype], fmt.top_k)
        if self.features:
            ex[TEACHER_FEATURES] = from_bytes(self._cell("features", i), FLOAT_DTYPES[fmt.hidden_dtype],
                                              fmt.feature_width)
        return ex
