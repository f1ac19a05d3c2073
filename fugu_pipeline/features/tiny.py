"""A tiny Qwen3 encoder built locally, for tests and the offline demo.

Model weights cannot be downloaded on these machines, so `ensure_tiny_encoder()` builds, once, a
small Qwen3 model from a `transformers.Qwen3Config` with fixed seeds and a byte-level BPE
tokenizer trained with the `tokenizers` library on the small corpus below. The result is an
ordinary Hugging Face directory: `AutoModel.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)` load it like any hub model, so the real loading code runs.

The vectors it makes mean nothing (random weights); they are deterministic, which is what tests
need. `qwen3_0_6b_shaped_config()` gives Qwen3-0.6B's real shapes for benchmarks with random
weights.

torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fugu_pipeline.settings import settings

TINY_NAME = "tiny"
SEED = 1234
VOCAB_SIZE = 2048
PAD_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [PAD_TOKEN, "<|im_start|>", "<|im_end|>"]
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# A small corpus in three registers (maths, code, general English) so the BPE merges look like
# those of a real tokenizer on router prompts. Written here, so the build needs no download.
CORPUS = """\
Solve for x: 3x + 7 = 22. Subtract 7 from both sides, then divide by 3, so x = 5.
What is the derivative of f(x) = x^3 - 4x^2 + 2x - 9 with respect to x?
Compute the integral of sin(x) cos(x) dx from 0 to pi/2.
A train leaves the station at 60 km/h; two hours later a second train follows at 90 km/h.
How many minutes does the second train need to catch up with the first one?
Find all integers n such that n^2 - 5n + 6 = 0. The roots are n = 2 and n = 3.
The probability of rolling two sixes with two fair dice is 1/36.
Let A be a 2 by 2 matrix with determinant 4. What is the determinant of 3A?
Prove that the sum of the first n odd numbers equals n squared.
If the ratio of boys to girls in a class is 3:4 and there are 28 students, how many are girls?
Simplify the expression (2a + 3b)(2a - 3b) and factor 9y^2 - 16.
The mean of five numbers is 12; four of them are 10, 11, 13 and 15. Find the fifth number.
A rectangle has a perimeter of 40 cm and an area of 96 square centimetres. Find its sides.
Convert 0.375 to a fraction in lowest terms, then write 7/8 as a percentage.
What is the greatest common divisor of 84 and 126? What is their least common multiple?
Evaluate the limit of (1 + 1/n)^n as n goes to infinity.
The sequence 2, 6, 18, 54 is geometric with common ratio 3; give the tenth term.
def fibonacci(n: int) -> int:
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
def binary_search(items: list[int], target: int) -> int:
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
class Stack:
    def __init__(self):
        self.items = []
    def push(self, item):
        self.items.append(item)
    def pop(self):
        return self.items.pop()
for i in range(10):
    print(f"value {i}: {i * i}")
import json
with open("data.json", "r", encoding="utf-8") as f:
    data = json.load(f)
SELECT name, COUNT(*) FROM orders WHERE status = 'shipped' GROUP BY name ORDER BY 2 DESC;
function add(a, b) { return a + b; }
const items = [1, 2, 3].map((x) => x * 2).filter((x) => x > 2);
fn main() { let v: Vec<i32> = (0..10).collect(); println!("{:?}", v); }
Write a Python function that reverses a linked list and explain its time complexity.
Fix the bug in this code: the loop never terminates because the index is not incremented.
Implement quicksort in Rust and return the sorted vector.
Why does this regular expression fail to match email addresses with a plus sign?
Write a SQL query that returns the top three customers by total spending.
The quick brown fox jumps over the lazy dog near the river bank.
Summarise the main causes of the French Revolution in three sentences.
Translate the following sentence into French: the weather is lovely today.
Write a short poem about the sea at night, with the moon and a lighthouse.
Explain the difference between weather and climate to a ten year old.
What is the capital of Australia, and why is it not Sydney?
Give three tips for writing a clear and persuasive cover letter.
Describe how photosynthesis turns light, water and carbon dioxide into sugar and oxygen.
Who wrote Pride and Prejudice, and what is the novel about?
List the planets of the solar system in order of distance from the sun.
Please rewrite this paragraph so that it is shorter and easier to read.
The committee will meet on Thursday afternoon to discuss the budget for next year.
She opened the window, listened to the rain, and decided to stay at home with a book.
In the history of science, the printing press changed how knowledge spread across Europe.
Answer the question with a single word: which gas do plants absorb from the air?
Classify the sentiment of this review as positive, negative or neutral.
Extract the names of all people and places mentioned in the following news article.
What are the advantages and disadvantages of remote work for a small company?
A good router sends each task to the model most likely to answer it well and cheaply.
"""


def fugu_home() -> Path:
    """`$FUGU_HOME`, default `~/.cache/fugu_pipeline`."""
    return settings().cache_home()


def default_tiny_dir() -> Path:
    return fugu_home() / "encoders" / "tiny-qwen3"


def is_complete(directory: Path) -> bool:
    return all((directory / name).is_file() for name in REQUIRED_FILES)


def ensure_tiny_encoder(directory: Path | None = None) -> Path:
    """Return a directory holding the tiny Qwen3 encoder, building it on first use.

    The build is deterministic (fixed seeds, fixed corpus): two builds give byte-identical
    weights. It is written to a temporary sibling directory and renamed into place, so a process
    racing this one sees either no directory or a complete one.
    """
    target = Path(directory).expanduser() if directory is not None else default_tiny_dir()
    if is_complete(target):
        return target
    if target.exists() and any(target.iterdir()):
        raise RuntimeError(
            f"{target} exists but is not a complete tiny encoder (missing one of {REQUIRED_FILES}); "
            "delete it and it will be rebuilt"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _build(tmp)
        try:
            os.rename(tmp, target)  # atomic; replaces an empty directory
        except OSError:
            if not is_complete(target):  # not a lost race: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _train_tokenizer():
    """Byte-level BPE trained on CORPUS, wrapped as a transformers fast tokenizer."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=PAD_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="right",
        model_max_length=2048,
    )


def tiny_config(vocab_size: int, pad_token_id: int):
    """The tiny Qwen3 shape: hidden 64, 2 layers, 4 heads (2 key/value heads)."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=pad_token_id,
        bos_token_id=pad_token_id,
    )


def _build(out: Path) -> None:
    import torch
    from transformers import Qwen3Model

    from fugu_pipeline.features.hf_logging import quiet_transformers

    tokenizer = _train_tokenizer()
    pad_id = tokenizer.pad_token_id
    vocab = -(-len(tokenizer) // 64) * 64  # round up to a multiple of 64, like real models
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3Model(tiny_config(vocab, pad_id)).eval()
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)


def qwen3_0_6b_shaped_config():
    """A `Qwen3Config` with Qwen3-0.6B's real shapes, for benchmarks with random weights."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
    )
