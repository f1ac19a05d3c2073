"""Transcripts as feature vectors for the coordinator head: the frozen encoder, the window, a cache.

`TranscriptFeaturizer(encoder)` turns `HeadInput`s into vectors with the encoder's settings (for
the roles head: final layer, penultimate position, L2-normalised, template `HEAD_TEMPLATE`):
- A transcript longer than the encoder's window (`max_length` tokens) is cut from the FRONT of
  its turns, so the task and the latest turns stay; a task that alone would fill more than three
  quarters of the window (what the cut marks leave of it) keeps its beginning.
- Every text is padded on the right to its own bucket (its length plus at least one pad, rounded
  up to a multiple of `BUCKET` tokens) and batched only with texts of the same bucket, so its
  vector never depends on which other transcripts shared the batch. (Padded to "the longest in
  the batch", the tiny Qwen3's vectors move by up to 4e-3 between batch compositions: enough to
  flip a close decision, and to break replay from the trajectory store.) Serving uses the same
  featurizer, so it computes exactly the vectors training saw.
- Vectors are kept in memory by the exact text (LRU), so candidates of one CMA-ES generation that
  reach the same transcript share one encoding. `prefetch` encodes many sessions' inputs in one
  go before the policies read them.
- With the SVF adapter (`with_scales`), each candidate's vectors depend on its own scales, but the
  layers below the adapted one do not: their output is cached per transcript (bounded by
  `SVF_CACHE_MB`) and shared by every candidate, and `prefetch_many` runs the adapted layer and
  those above it for all candidates' missing (scales, transcript) rows in one forward per padded
  width (`session/svf.py:SVFRunner`).

torch loads with the encoder (`features/encoder.py`); this module itself imports only numpy.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from fugu_pipeline.session.transcript import CUT_MARK, HeadInput

if TYPE_CHECKING:
    from fugu_pipeline.features.contract import FeatureContract
    from fugu_pipeline.features.encoder import Encoder

BUCKET = 16  # padded widths are multiples of this
SVF_CACHE_MB = 1024  # hidden states below the SVF-adapted layer kept per encoder (least recently used out)
TASK_SHARE = 0.75  # the most of the window a task keeps when there are turns to show
TASK_CUT = "\n[... task cut to fit the encoder window ...]"
MEMO_SIZE = 20_000  # tokenizer results kept for the window's cuts (tasks and marks many transcripts repeat)


class TranscriptFeaturizer:
    """Transcript -> vector with a frozen encoder (see the module docstring). Thread-safe."""

    def __init__(self, encoder: "Encoder", *, cache_size: int = 200_000, adapter=None, scales: np.ndarray | None = None,
                 lock: threading.RLock | None = None):
        if encoder.settings.lexical:
            raise ValueError("the multi-turn coordinator reads transcripts without lexical statistics: "
                             "give it an encoder with lexical off")
        self.encoder = encoder
        self.settings = encoder.settings
        self.max_length = self.settings.max_length
        self.cache_size = cache_size
        self.adapter, self.scales = adapter, scales  # an SVF adapter (session/svf.py) and this candidate's scales
        self._svf: _SVFShared | None = None  # with scales: the cache of hidden states below the adapted layer
        self._svf_shared: dict[int, _SVFShared] = {}
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = lock or threading.RLock()
        self._threads = _torch_threads()  # encoding may run in another thread: use this thread's setting there
        self.encoded = 0  # texts run through the encoder
        self.hits = 0  # vectors served from memory
        self.cut = 0  # transcripts cut to fit the window
        self._window_memo: dict[tuple[str, str], object] = {}  # `_memo`
        self._is_causal: bool | None = None  # `_causal`

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def with_scales(self, adapter, scales: np.ndarray) -> "TranscriptFeaturizer":
        """A featurizer for one SVF candidate: the same encoder (and lock), its own scales and
        vector cache, and the hidden states below the adapted layer shared with every candidate
        made from this featurizer with the same adapter."""
        if self.settings.layer != -1:
            raise ValueError("the SVF adapter needs the encoder's final layer as features (layer -1)")
        f = TranscriptFeaturizer(self.encoder, cache_size=self.cache_size, adapter=adapter,
                                 scales=np.asarray(scales, np.float32), lock=self._lock)
        with self._lock:
            shared = self._svf_shared.get(id(adapter))
            if shared is None or shared.adapter is not adapter:
                shared = self._svf_shared[id(adapter)] = _SVFShared(adapter)
        f._svf = shared
        return f

    def contract(self) -> "FeatureContract":
        return self.encoder.feature_contract()

    # ----------------------------------------------------------------- the window

    def _count(self, texts: list[str]) -> list[int]:
        ids = self.encoder.tokenizer(list(texts), add_special_tokens=True, truncation=False,
                                     return_attention_mask=False)["input_ids"]
        return [max(1, len(x)) for x in ids]

    def _encoded(self, text: str) -> list[int]:
        """The token ids `_count` counts (special tokens, no truncation)."""
        return self.encoder.tokenizer([text], add_special_tokens=True, truncation=False,
                                      return_attention_mask=False)["input_ids"][0]

    def _memo(self, kind: str, text: str, make):
        """A tokenizer result that many transcripts repeat (a task's ids and counts, the marks' counts):
        computed once per text (the memo is emptied when it grows past MEMO_SIZE)."""
        key = (kind, text)
        got = self._window_memo.get(key)
        if got is None:
            if len(self._window_memo) >= MEMO_SIZE:
                self._window_memo.clear()
            got = self._window_memo[key] = make(text)
        return got

    def _format(self, body: str) -> str:
        return self.settings.format([body])[0]

    def _ids(self, text: str) -> list[int]:
        return self.encoder.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, ids: list[int]) -> str:
        return self.encoder.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def fit(self, inp: HeadInput) -> tuple[str, int]:
        """(the encoder text for this input, its token count), cut to the window if needed."""
        text = self._format(inp.text())
        n = self._count([text])[0]
        if n <= self.max_length:
            return text, n
        text, ids = self._cut_to_window(inp)
        return text, max(1, len(ids))

    def _cut_to_window(self, inp: HeadInput) -> tuple[str, list[int]]:
        """The text of an input too long for the window, cut (module docstring), and its token ids."""
        self.cut += 1
        limit = self.max_length
        tail = "\n\n" + inp.state if inp.state else ""  # the state line always stays
        count = lambda t: self._memo("count", t, lambda x: self._count([x])[0])  # noqa: E731
        avail = limit - count(self._format(("\n\n" + CUT_MARK if inp.turns else "") + tail))  # after the marks
        task = inp.task
        task_ids = self._memo("ids", task, self._ids)
        task_room = int(avail * TASK_SHARE) if inp.turns else avail
        if len(task_ids) > task_room:
            cut_len = len(self._memo("ids", TASK_CUT, self._ids))
            task = self._decode(task_ids[: max(task_room - cut_len, 1)]) + TASK_CUT
        if not inp.turns:
            return self._shrink(task, "", [], limit, tail)
        return self._shrink(task, CUT_MARK, self._ids(inp.turns), limit, tail)

    def _shrink(self, task: str, mark: str, turn_ids: list[int], limit: int, tail: str = "") -> tuple[str, list[int]]:
        """Keep as many of the last turn tokens as fit (re-counted after decoding, which can merge
        tokens differently). Returns the text and its token ids."""
        head = self._format(task + "\n\n" + mark + tail)
        keep = max(0, limit - self._memo("count", head, lambda x: self._count([x])[0]))
        for _ in range(8):
            body = task + ("\n\n" + mark + self._decode(turn_ids[len(turn_ids) - keep:]) if keep else "") + tail
            text = self._format(body)
            ids = self._encoded(text)
            n = max(1, len(ids))
            if n <= limit:
                return text, ids
            keep = max(0, keep - (n - limit) - 1)
        task_only = self._format(task + tail)  # last resort: the (already cut) task and the state alone
        return task_only, self._encoded(task_only)

    # ----------------------------------------------------------------- vectors

    def bucket(self, n: int) -> int:
        """The padded width of a text of n tokens: at least one pad, a multiple of BUCKET."""
        return -(-(n + 1) // BUCKET) * BUCKET

    def _tokens(self, text: str) -> list[int]:
        ids = self.encoder.tokenizer(text, add_special_tokens=True)["input_ids"]
        return ids[: self.max_length] or [self.encoder.pad_id]

    def token_ids(self, inputs: list[HeadInput]) -> list[list[int]]:
        """The encoder's token ids of each input's text as `fit` makes it: the texts that fit the
        window are tokenized once, all in one call (the ids of the text `fit` returns for them);
        only a transcript that must be cut goes through `fit`."""
        texts = [self._format(inp.text()) for inp in inputs]
        ids = self.encoder.tokenizer(texts, add_special_tokens=True, truncation=False,
                                     return_attention_mask=False)["input_ids"] if texts else []
        return [(self._cut_to_window(inp)[1][: self.max_length] or [self.encoder.pad_id]) if len(x) > self.max_length
                else x or [self.encoder.pad_id] for inp, x in zip(inputs, ids)]

    def _forward(self, seqs: list[list[int]], width: int) -> np.ndarray:
        """The encoder's vectors (its layer, pooling, normalisation) for sequences padded to `width`."""
        import torch

        from fugu_pipeline.features.encoder import pool_hidden

        enc, s = self.encoder, self.settings
        tokens = torch.full((len(seqs), width), enc.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, x in enumerate(seqs):
            tokens[r, : len(x)] = torch.tensor(x, dtype=torch.long)
            mask[r, : len(x)] = 1
        tokens, mask = tokens.to(enc.resolved_device), mask.to(enc.resolved_device)
        # padding is on the right: in a causal model no real token attends to a pad, so on the CPU the
        # model needs no padding mask (the same values; building and applying the mask cost ~15% of the
        # pass). Training and serving both run this one path, so their features agree whatever bits a
        # CPU's kernels give the two paths. Elsewhere other attention kernels would run: the mask stays.
        model_mask = None if torch.device(enc.resolved_device).type == "cpu" and self._causal() else mask
        with torch.inference_mode():
            if s.layer == -1:
                hidden = enc.model(input_ids=tokens, attention_mask=model_mask).last_hidden_state
            else:
                hidden = enc.model(input_ids=tokens, attention_mask=model_mask,
                                   output_hidden_states=True).hidden_states[s.layer]
            vec = pool_hidden(hidden, mask, s.pooling, s.token_position).to(torch.float32)
            if s.normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
        enc.forward_passes += 1
        return vec.cpu().numpy()

    def _causal(self) -> bool:
        """Whether every attention layer of the encoder is causal (decoder models such as Qwen3; a
        bidirectional encoder such as MiniLM needs its padding mask)."""
        if self._is_causal is None:
            flags = [m.is_causal for m in self.encoder.model.modules() if isinstance(getattr(m, "is_causal", None), bool)]
            self._is_causal = bool(flags) and all(flags)
        return self._is_causal

    @staticmethod
    def key(inp: HeadInput) -> str:
        return hashlib.sha256(f"{inp.task}\x1e{inp.turns}\x1e{inp.state}".encode()).hexdigest()

    def prefetch(self, inputs: list[HeadInput]) -> None:
        """Encode every input not in memory yet, in groups of the same padded width (with this
        featurizer's SVF scales, when it has them)."""
        if self._svf is not None:
            _prefetch_svf([(self, inputs)])
            return
        with self._lock:
            todo: dict[str, HeadInput] = {}
            for inp in inputs:
                k = self.key(inp)
                if k not in self._cache and k not in todo:
                    todo[k] = inp
            if not todo:
                return
            _torch_threads(self._threads)
            ids = dict(zip(todo, self.token_ids(list(todo.values()))))
            by_bucket: dict[int, list[str]] = {}
            for k, x in ids.items():
                by_bucket.setdefault(self.bucket(len(x)), []).append(k)
            self._encode(ids, by_bucket)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _encode(self, ids: dict[str, list[int]], by_bucket: dict[int, list[str]]) -> None:
        for width in sorted(by_bucket):
            keys = by_bucket[width]
            rows = max(1, self.settings.token_budget // width)
            for i in range(0, len(keys), rows):
                part = keys[i:i + rows]
                for k, v in zip(part, self._forward([ids[k] for k in part], width)):
                    self._cache[k] = v
            self.encoded += len(keys)

    def features(self, inputs: list[HeadInput]) -> np.ndarray:
        """Vectors (N, dim) float32 in input order."""
        with self._lock:
            keys = [self.key(inp) for inp in inputs]
            self.hits += sum(k in self._cache for k in keys)
            self.prefetch(inputs)
            out = np.empty((len(inputs), self.dim), dtype=np.float32)
            for i, (k, inp) in enumerate(zip(keys, inputs)):
                if k not in self._cache:  # evicted by a very large prefetch: encode it alone
                    self.prefetch([inp])
                self._cache.move_to_end(k)
                out[i] = self._cache[k]
            return out


class _SVFShared:
    """Hidden states entering the SVF-adapted layer, per transcript text (LRU by bytes), and the
    runner that finishes them per candidate."""

    def __init__(self, adapter):
        from fugu_pipeline.session.svf import SVFRunner

        self.adapter = adapter
        self.runner = SVFRunner(adapter)
        self.hidden: OrderedDict[str, object] = OrderedDict()  # text key -> (n, H) tensor
        self.bytes = 0
        self.bottom_rows = 0  # transcripts run through the layers below the adapted one
        self.tail_rows = 0  # (candidate, transcript) rows run through the adapted layer and above

    def keep(self, key: str, h) -> None:
        self.hidden[key] = h
        self.bytes += h.element_size() * h.nelement()
        while self.bytes > SVF_CACHE_MB * 2**20 and len(self.hidden) > 1:
            _, old = self.hidden.popitem(last=False)
            self.bytes -= old.element_size() * old.nelement()


def prefetch_many(requests: list[tuple[TranscriptFeaturizer, list[HeadInput]]]) -> None:
    """Encode what several featurizers are about to read: plain ones each in one go, SVF candidates
    that share an encoder and adapter all together (module docstring)."""
    svf: dict[int, list] = {}
    for f, inputs in requests:
        if f._svf is None:
            f.prefetch(inputs)
        else:
            svf.setdefault(id(f._svf), []).append((f, inputs))
    for group in svf.values():
        _prefetch_svf(group)


def _prefetch_svf(group: list[tuple[TranscriptFeaturizer, list[HeadInput]]]) -> None:
    import torch

    from fugu_pipeline.features.encoder import pool_hidden

    lead = group[0][0]
    shared, enc, s = lead._svf, lead.encoder, lead.settings
    with lead._lock:
        rows: dict[tuple[int, str], tuple[TranscriptFeaturizer, str, HeadInput]] = {}
        for f, inputs in group:
            for inp in inputs:
                k = f.key(inp)
                if k not in f._cache:
                    rows.setdefault((id(f), k), (f, k, inp))
        if not rows:
            return
        _torch_threads(lead._threads)
        dev = enc.resolved_device
        texts: dict[str, HeadInput] = {}
        for f, k, inp in rows.values():
            texts.setdefault(k, inp)
        for k in [k for k in texts if k in shared.hidden]:
            shared.hidden.move_to_end(k)
        ids = dict(zip(texts, lead.token_ids(list(texts.values()))))
        missing: dict[int, list[str]] = {}
        for k in texts:
            if k not in shared.hidden:
                missing.setdefault(lead.bucket(len(ids[k])), []).append(k)
        for width in sorted(missing):  # the layers below the adapted one: once per transcript
            keys = missing[width]
            step = max(1, s.token_budget // width)
            for i in range(0, len(keys), step):
                part = keys[i:i + step]
                tokens, mask = _padded([ids[k] for k in part], width, enc.pad_id, dev)
                h = shared.runner.bottom(tokens, mask)
                for r, k in enumerate(part):
                    shared.keep(k, h[r, : len(ids[k])].clone())
                shared.bottom_rows += len(part)
        by_width: dict[int, list] = {}
        for f, k, _ in rows.values():
            by_width.setdefault(lead.bucket(len(ids[k])), []).append((f, k))
        for width in sorted(by_width):  # the adapted layer and those above: per (candidate, transcript)
            todo = by_width[width]
            step = max(1, s.token_budget // width)
            for i in range(0, len(todo), step):
                part = todo[i:i + step]
                hs = [shared.hidden[k] for _, k in part]
                hidden = torch.zeros((len(part), width, hs[0].shape[-1]), dtype=hs[0].dtype, device=dev)
                mask = torch.zeros((len(part), width), dtype=torch.long, device=dev)
                for r, h in enumerate(hs):
                    hidden[r, : h.shape[0]] = h
                    mask[r, : h.shape[0]] = 1
                scales = torch.as_tensor(np.stack([f.scales for f, _ in part]), dtype=torch.float32, device=dev)
                with torch.inference_mode():
                    last = shared.runner.tail(hidden, mask, scales)
                    vec = pool_hidden(last, mask, s.pooling, s.token_position).to(torch.float32)
                    if s.normalize:
                        vec = torch.nn.functional.normalize(vec, dim=-1)
                enc.forward_passes += 1
                for (f, k), v in zip(part, vec.cpu().numpy()):
                    f._cache[k] = v
                    f.encoded += 1
                    while len(f._cache) > f.cache_size:
                        f._cache.popitem(last=False)
                shared.tail_rows += len(part)


def _padded(seqs: list[list[int]], width: int, pad_id: int, device):
    import torch

    tokens = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, x in enumerate(seqs):
        tokens[r, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[r, : len(x)] = 1
    return tokens.to(device), mask.to(device)


def _torch_threads(n: int | None = None) -> int | None:
    """torch's intra-op thread count of this thread; with `n`, set it. `torch.set_num_threads` does
    not carry over to threads started later (OpenMP keeps it per thread), so a featurizer called
    from a worker thread would otherwise use every core: on a shared CPU several times slower."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return n
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return torch.get_num_threads()
