"""The stand-in's n-gram model, checked in the test process: the counting module, the corpus and
the tokenizer are loaded by their file paths under private names (the controller never imports
the stand-in's `sglang` package, `test_the_controller_cannot_import_the_standin`). Slow by itself
(it imports torch), so outside the fast tier; the model's behaviour in a server is proven by
tests/test_standin_language.py over real processes."""

from __future__ import annotations

import math
import re
from types import ModuleType
from typing import Any

import pytest

from tests.standin import standin_module

pytestmark = [pytest.mark.pure, pytest.mark.slow]

TARGET_ORDER = 12


@pytest.fixture(scope="module")
def ngram() -> ModuleType:
    return standin_module("models/ngram.py")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return standin_module("tokenizer/char_tokenizer.py").CharTokenizer()


@pytest.fixture(scope="module")
def documents() -> tuple[str, ...]:
    return tuple(standin_module("models/corpus.py").DOCUMENTS)


@pytest.fixture(scope="module")
def target(ngram: ModuleType, tokenizer: Any, documents: tuple[str, ...]) -> tuple[Any, Any]:
    token_lists = [tokenizer.encode(document) for document in documents]
    return ngram.build_ngram_logits(token_lists, tokenizer.vocab_size, TARGET_ORDER)


def greedy(ngram: ModuleType, table: tuple[Any, Any], ids: list[int], count: int) -> list[int]:
    rows, logits = table
    out: list[int] = []
    for _ in range(count):
        row = ngram.longest_context_row(rows, ids + out, TARGET_ORDER)
        out.append(int(logits[row].argmax()))
    return out


def test_every_row_is_a_distribution_of_integer_logits(
    ngram: ModuleType, target: tuple[Any, Any]
) -> None:
    _, logits = target
    assert bool((logits == logits.floor()).all()), "logits are integers: sums stay exact"
    mass = (logits / ngram.LOGIT_SCALE).exp().sum(dim=1)
    # Rounding each log-probability down loses at most 1/LOGIT_SCALE of it.
    assert float(mass.max()) <= 1.0 + 1e-9
    assert float(mass.min()) >= math.exp(-1 / ngram.LOGIT_SCALE) - 1e-9


def test_counting_twice_gives_the_same_table(
    ngram: ModuleType, tokenizer: Any, documents: tuple[str, ...], target: tuple[Any, Any]
) -> None:
    token_lists = [tokenizer.encode(document) for document in documents]
    rows, logits = ngram.build_ngram_logits(token_lists, tokenizer.vocab_size, TARGET_ORDER)
    assert rows == target[0]
    assert bool((logits == target[1]).all())


def test_an_unseen_context_backs_off_to_its_longest_seen_suffix(
    ngram: ModuleType, tokenizer: Any
) -> None:
    rows, _ = ngram.build_ngram_logits([tokenizer.encode("abcab")], tokenizer.vocab_size, 4)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert ngram.longest_context_row(rows, encode("zzab"), 4) == rows[bytes(encode("ab"))]
    assert ngram.longest_context_row(rows, encode("xyzb"), 4) == rows[bytes(encode("b"))]
    assert ngram.longest_context_row(rows, encode("xyz"), 4) == rows[b""]
    # at most order - 1 tokens of context, even where a longer one was seen
    assert ngram.longest_context_row(rows, encode("abcab"), 2) == rows[bytes(encode("b"))]


def test_greedy_continuation_reads_as_the_corpus_language(
    ngram: ModuleType, tokenizer: Any, documents: tuple[str, ...], target: tuple[Any, Any]
) -> None:
    prompt = tokenizer.encode("The capital of France is")
    text = tokenizer.decode(greedy(ngram, target, prompt, 48))
    assert text.startswith(" Paris.")
    known = set(re.findall(r"[a-z]+", " ".join(documents).lower()))
    words = re.findall(r"[a-z]+", text.lower())[:-1]  # the last may be cut off
    assert words and all(word in known for word in words), text


def test_the_corpus_is_a_few_kilobytes_of_printable_text(documents: tuple[str, ...]) -> None:
    size = sum(len(document) for document in documents)
    assert 2_000 <= size <= 16_000
    assert all(ch == "\n" or 32 <= ord(ch) < 127 for document in documents for ch in document)
