"""Where the cross-encoder (`cascade_cross_encoder.py`) enters the cascade: one more reply column of
the cell verifier, kept only when it clearly lowers the verifier's out-of-fold log-loss.

- Training (`cross_encoder_step`, called by `fugu-lite train`'s cascade step; `cascade.cross_encoder`):
  `off`; `auto` (the default): used when the non-test rows hold at least `cross_encoder_fit.min_pairs`
  (prompt, reply) pairs, the encoder loads and its fine-tunes are estimated to take at most
  `cross_encoder_fit.max_minutes` (`cross_encoder.fit_estimate`, before the whole pass), else one line
  says why and the verifier reads what it read before; `on`: whatever the number of pairs and the time
  (a missing encoder is an error naming the setting).
- Nesting (`verifier_oof`): each pair's column is the cross-encoder's score from a model trained
  without the pair's verifier fold (`cross_fit`), so the verifier's out-of-fold scores, and the
  thresholds the plan search chooses on them, stay out of fold. The verifier is fitted with and
  without the column (each with its own grid choice); the column is kept when it lowers the
  per-reply out-of-fold log-loss by at least `cross_encoder_fit.min_gain` with a one-sided 95% lower
  bound above zero (paired over the replies), and the line says which.
- The checkpoint (`cross_encoder_files`): the column is the reply statistic named `cross_encoder`
  (the last one), the fine-tuned layers and head are `cross_encoder.safetensors` in the cascade's
  folder, and `head_params.cross_encoder` is its contract (encoder and its content identity, max
  length, truncation, scaling, the file's sha256), which the content hash covers. Loading
  (`saved_cross_encoder`) refuses a changed file or another encoder.
- Serving and offline scoring (`reply_stats`, `with_saved_cross`): the final model (every non-test
  pair) scores each paid reply with its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fugu_pipeline.policies.cascade.cross_encoder import (
    CROSS_FILE,
    CROSS_STAT,
    POOLING,
    TRUNCATION,
    CrossEncoder,
    CrossEncoderConfig,
    CrossFit,
    new_top,
    resolved,
)
from fugu_pipeline.policies.cascade.verifier import VerifierInputs, auc, oof_scores


@dataclass
class CrossColumn:
    """The cross-fitted column of the fitted rows (row-aligned with them; 0 where no reply)."""

    values: np.ndarray  # (rows, W)
    fit: CrossFit


def with_column(inp: VerifierInputs, values: np.ndarray) -> VerifierInputs:
    """`inp` with one more reply statistic, `cross_encoder`, last."""
    from fugu_pipeline.policies.cascade.answer_features import STATS_V1

    col = np.where(inp.has, np.nan_to_num(values, nan=0.0), 0.0).astype(np.float32)[:, :, None]
    return VerifierInputs(inp.prompt, np.concatenate([inp.answer, col], axis=2), inp.has, inp.target,
                          tuple(inp.stat_names or STATS_V1) + (CROSS_STAT,))


def cross_encoder_step(cc, data, grid, seed: int = 0, log=print) -> Callable | None:
    """What `fit_cascade` calls with (rows, folds) for the cross-fitted column, or None when the
    cross-encoder is off or its encoder cannot be loaded under `auto` (one line says so). `cc`: the
    `cascade:` settings."""
    from fugu_pipeline.features.routing_data import TrainingDataError
    from fugu_pipeline.features.settings import EncoderLoadError
    from fugu_pipeline.policies.cascade.cross_encoder import resolve_model

    mode, cfg = cc.cross_encoder, cc.cross_encoder_fit
    if mode == "off":
        return None
    try:
        resolve_model(cfg.model)  # where it is; its weights load only when there are pairs enough to use it
    except (EncoderLoadError, OSError, ValueError) as exc:
        if mode == "on":
            raise TrainingDataError(f"cascade.cross_encoder is on, but its encoder cascade.cross_encoder_fit.model "
                                    f"{cfg.model!r} cannot be loaded: {str(exc).splitlines()[0]}") from None
        log(f"cascade: cross-encoder not used: its encoder {cfg.model!r} cannot be loaded ({str(exc).splitlines()[0]}); "
            "the verifier reads what it read without it")
        return None

    def step(rows: np.ndarray, folds: np.ndarray) -> CrossColumn | None:
        from fugu_pipeline.policies.cascade.cross_encoder import FitTooLong, cross_fit, load_base

        cells = [(k, j) for k, i in enumerate(rows) for j in range(len(data.worker_ids))
                 if grid.text[i, j] is not None and data.quality is not None and not np.isnan(data.quality[i, j])]
        y = np.array([data.quality[rows[k], j] for k, j in cells], np.float64)
        why = None
        if mode == "auto" and len(cells) < cfg.min_pairs:
            why = (f"{len(cells)} (prompt, reply) pairs on the non-test rows, fewer than cascade.cross_encoder_fit.min_pairs "
                   f"({cfg.min_pairs}); set cascade.cross_encoder: on to use it anyway")
        elif len(cells) < 2 * cfg.folds or len(np.unique(y >= 0.5)) < 2:
            why = f"{len(cells)} (prompt, reply) pairs, too few (or one class only) to fit {cfg.folds} cross-fitted models"
        if why:
            log(f"cascade: cross-encoder not used: {why}; the verifier reads what it read without it")
            return None
        base = load_base(cfg.model, cfg.device)
        here = resolved(cfg, base.device)  # `auto` layers and epochs for this device
        log(f"cascade: cross-encoder {cfg.model} on {len(cells)} (prompt, reply) pairs, {cfg.folds} cross-fitted "
            f"fine-tunes (top {here.train_layers} layers, {here.epochs} epochs, max {cfg.max_length} tokens) on {base.device}")
        allowed = cfg.max_minutes * 60 if mode == "auto" and cfg.max_minutes is not None else None
        try:
            fit = cross_fit(base, [data.prompts[rows[k]] for k, _ in cells], [grid.text[rows[k], j] for k, j in cells],
                            y, np.array([folds[k] for k, _ in cells]), cfg, seed, log, max_seconds=allowed)
        except FitTooLong as exc:
            log(f"cascade: cross-encoder not used: its fine-tunes would take {exc} on {base.device} ({exc.probe}), "
                f"more than cascade.cross_encoder_fit.max_minutes ({cfg.max_minutes:g}); raise it, set "
                "cascade.cross_encoder: on, or train where a GPU is; the verifier reads what it read without it")
            return None
        values = np.zeros((len(rows), len(data.worker_ids)))
        for (k, j), v in zip(cells, fit.oof):
            values[k, j] = v
        return CrossColumn(values, fit)

    return step


def verifier_oof(sub: VerifierInputs, folds: np.ndarray, cross: CrossColumn | None, log=print):
    """(scores, setting, figures, the inputs the chosen verifier reads, the cross-fit when it is kept):
    `verifier.oof_scores` without the cross-encoder's column and, given `cross`, with it; the column is
    kept when its out-of-fold log-loss gain is clear (`_paired_gain`)."""
    scores, setting, fig = oof_scores(sub, folds)
    if cross is None:
        return scores, setting, fig, sub, None
    wide = with_column(sub, cross.values)
    s2, set2, fig2 = oof_scores(wide, folds)
    gain, low = _paired_gain(scores, s2, sub)
    keep = low > 0 and gain >= cross.fit.cfg.min_gain
    alone = auc(cross.values[sub.has], sub.target[sub.has] >= 0.5)
    figures = {"oof_auc_alone": alone, "used": keep, "seconds": cross.fit.seconds, **cross.fit.figures,
               "logloss_gain": gain, "logloss_gain_low": low,
               "without": {"oof_auc": fig["oof_auc"], "oof_logloss": fig["oof_logloss"]},
               "with": {"oof_auc": fig2["oof_auc"], "oof_logloss": fig2["oof_logloss"]}}
    log(f"cascade: cross-encoder out-of-fold AUC {alone:.3f} alone ({cross.fit.seconds:.0f}s); the verifier's "
        f"out-of-fold AUC / log-loss {fig2['oof_auc']:.3f} / {fig2['oof_logloss']:.4f} with it, {fig['oof_auc']:.3f} / "
        f"{fig['oof_logloss']:.4f} without: " + ("kept" if keep else "left out, no clear gain")
        + f" (log-loss gain {gain:+.4f}, 95% lower bound {low:+.4f}, least kept {cross.fit.cfg.min_gain:g})")
    if keep:
        return s2, set2, {**fig2, "cross_encoder": figures}, wide, cross.fit
    return scores, setting, {**fig, "cross_encoder": figures}, sub, None


def _paired_gain(without: np.ndarray, with_: np.ndarray, inp: VerifierInputs) -> tuple[float, float]:
    """The mean per-reply out-of-fold log-loss gain of the column and its one-sided 95% lower bound
    (normal, paired over the replies): the column is kept only when that bound is above zero, so a
    column of noise, which lowers the best of the grid's log-losses by chance, is left out."""
    m = inp.has & ~np.isnan(without) & ~np.isnan(with_)
    y = np.clip(inp.target[m], 0, 1)

    def loss(p):
        p = np.clip(p[m], 1e-6, 1 - 1e-6)
        return -(y * np.log(p) + (1 - y) * np.log(1 - p))

    d = loss(without) - loss(with_)
    if len(d) < 2:
        return float(d.mean()) if len(d) else 0.0, -np.inf
    return float(d.mean()), float(d.mean() - 1.645 * d.std(ddof=1) / np.sqrt(len(d)))


def cross_encoder_files(model: CrossEncoder | None) -> tuple[dict, Callable[[Path], None]]:
    """(`head_params` entries, a writer of the weights file into the saved checkpoint folder)."""
    import hashlib

    from fugu_pipeline.policies.cascade.cross_encoder import state_bytes

    if model is None:
        return {}, lambda folder: None
    blob = state_bytes(model)
    contract = {**model.contract(), "file": CROSS_FILE, "sha256": hashlib.sha256(blob).hexdigest()}

    def write(folder: Path) -> None:
        from fugu_pipeline.files import atomic_write

        target = Path(folder) / CROSS_FILE
        if not target.is_file() or target.read_bytes() != blob:  # a re-run of the same save completes it
            atomic_write(target, blob)

    return {"cross_encoder": contract}, write


def load_model(folder: str | Path, contract: dict, device: str = "auto") -> CrossEncoder:
    """The cross-encoder a checkpoint's contract names, from `folder/cross_encoder.safetensors`;
    CheckpointError (one line: what differs and what to do) when the file is missing or changed, or
    the encoder here is not the one it was trained on."""
    import hashlib

    from safetensors.torch import load

    from fugu_pipeline.features.settings import EncoderLoadError
    from fugu_pipeline.policies.cascade.cross_encoder import load_base
    from fugu_pipeline.train.checkpoints import CheckpointError

    path = Path(folder) / CROSS_FILE
    if contract.get("truncation") != TRUNCATION or contract.get("pooling") != POOLING:
        raise CheckpointError(f"{path}: the cross-encoder was trained with truncation {contract.get('truncation')!r} and "
                              f"pooling {contract.get('pooling')!r}; this version builds {TRUNCATION!r}, {POOLING!r}: "
                              "retrain the cascade")
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: this cascade's verifier reads a cross-encoder; copy the whole "
                              "checkpoint folder, or train again (the same command writes it)")
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != contract.get("sha256"):
        raise CheckpointError(f"{path} does not match the manifest's cross_encoder.sha256 (changed after saving); "
                              "restore it or train again")
    try:
        base = load_base(contract["model"], device)
    except EncoderLoadError as exc:
        raise CheckpointError(f"{path}: the cross-encoder's encoder {contract['model']!r} cannot be loaded: {exc}") from None
    if base.identity != contract.get("encoder_identity"):
        raise CheckpointError(f"{path}: the cross-encoder was fine-tuned from {contract['model']!r} with identity "
                              f"{contract.get('encoder_identity')}, but that encoder here is {base.identity}; install "
                              "the same encoder files or retrain the cascade")
    if (base.n_layers, base.hidden) != (contract.get("n_layers"), contract.get("hidden")):
        raise CheckpointError(f"{path}: the cross-encoder has {contract.get('n_layers')} layers of "
                              f"{contract.get('hidden')}, the encoder here {base.n_layers} of {base.hidden}")
    cfg = CrossEncoderConfig(model=contract["model"], max_length=int(contract["max_length"]),
                             train_layers=int(contract["train_layers"]))
    top = new_top(base, cfg.train_layers, 0)
    try:
        top.load_state_dict(load(raw))
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{path}: its tensors do not fit the contract's model ({str(exc).splitlines()[0]})") from None
    top.to(base.device).eval()
    return CrossEncoder(base, top, cfg, tuple(contract["platt"]))


_LOADED: dict[tuple[str, str], CrossEncoder] = {}


def saved_cross_encoder(folder: str | Path, contract: dict | None) -> CrossEncoder | None:
    """The checkpoint's cross-encoder (None when it has none), loaded once per process."""
    if not contract:
        return None
    key = (str(Path(folder).resolve()), contract.get("sha256", ""))
    if key not in _LOADED:
        _LOADED[key] = load_model(folder, contract)
    return _LOADED[key]


def reply_stats(prompt: str, replies: list[tuple[str, str | None]], names, cross: CrossEncoder | None,
                encode=None, executed: np.ndarray | None = None) -> np.ndarray:
    """The reply statistics `names` of (reply, final answer) pairs to one prompt, (n, len(names)):
    `answer_features.reply_statistics` (`encode`: the reply encoder, for those it computes;
    `executed`: the code's runs on the prompt's examples, already made), and the cross-encoder's
    column where `names` hold it."""
    from fugu_pipeline.policies.cascade.answer_features import reply_statistics

    plain = [n for n in names if n != CROSS_STAT]
    out = np.zeros((len(replies), len(names)), np.float32)
    cols = [k for k, n in enumerate(names) if n != CROSS_STAT]
    if replies:
        out[:, cols] = reply_statistics([(r, f, prompt) for r, f in replies], plain, encode, executed=executed)
    if CROSS_STAT in names and replies:
        if cross is None:
            raise ValueError("the verifier reads the cross-encoder's column but the checkpoint has no cross-encoder")
        out[:, list(names).index(CROSS_STAT)] = cross.score([prompt] * len(replies), [r for r, _ in replies])
    return out


def with_saved_cross(checkpoint, data, grid, inputs: VerifierInputs, rows: np.ndarray | None = None) -> VerifierInputs:
    """`inputs` with the column of the checkpoint's cross-encoder (each reply of `rows`, default every
    row, scored with its prompt); `inputs` as they are when the checkpoint has none."""
    contract = getattr(checkpoint.head, "cross_encoder", None)
    if not contract:
        return inputs
    model = saved_cross_encoder(checkpoint.path, contract)
    rows = np.arange(len(data.task_ids)) if rows is None else np.asarray(rows)
    cells = [(i, j) for i in rows for j in range(len(data.worker_ids)) if grid.text[i, j] is not None]
    values = np.zeros(inputs.has.shape)
    got = model.score([data.prompts[i] for i, _ in cells], [grid.text[i, j] for i, j in cells])
    for (i, j), v in zip(cells, got):
        values[i, j] = v
    return with_column(inputs, values)
