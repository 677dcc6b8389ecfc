"""The example models' data: the 8x8 digits and a byte-level text corpus,
shipped in ``oar/models/data/`` (provenance and licences in its README), with
seeded, deterministic batching. Everything here is numpy; the caller moves
batches to a device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

__all__ = ["DATA_DIR", "Digits", "TextBatches", "decode", "digits_batches", "encode", "load_corpus", "load_digits"]

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
CORPUS_FILE = "pydoc_topics.txt"
DIGITS_FILE = "digits.npz"


@dataclass(frozen=True)
class Digits:
    """A split of the digits: ``images`` float32 [N, 1, 8, 8] scaled to [0, 1], ``labels`` int64 [N]."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def flat(self) -> np.ndarray:
        """The images as float32 [N, 64], for the MLP."""
        return self.images.reshape(len(self), 64)


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[Digits, Digits]:
    """(train, test): the 1,797 digits shuffled by ``seed`` and split, the last
    ``test_fraction`` held out."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), not {test_fraction}")
    path = os.path.join(DATA_DIR, DIGITS_FILE)
    with np.load(path) as archive:
        images, target = archive["images"], archive["target"]
    if images.shape[1:] != (8, 8) or images.shape[0] != target.shape[0]:
        raise ValueError(f"{path}: expected images [N, 8, 8] and target [N], got {images.shape} and {target.shape}")
    order = np.random.default_rng(seed).permutation(images.shape[0])
    images = (images[order].astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    labels = target[order].astype(np.int64)
    n_test = max(1, int(round(images.shape[0] * test_fraction)))
    cut = images.shape[0] - n_test
    return Digits(images[:cut], labels[:cut]), Digits(images[cut:], labels[cut:])


def digits_batches(data: Digits, batch_size: int, seed: int, epoch: int = 0,
                   flat: bool = False, drop_last: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of (images, labels) batches in an order fixed by (seed, epoch)."""
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
    images = data.flat() if flat else data.images
    order = np.random.default_rng([seed, epoch]).permutation(len(data))
    stop = len(data) - len(data) % batch_size if drop_last else len(data)
    for start in range(0, stop, batch_size):
        index = order[start:start + batch_size]
        yield np.ascontiguousarray(images[index]), data.labels[index]


def load_corpus() -> np.ndarray:
    """The shipped corpus as a uint8 array of its UTF-8 bytes (the byte-level vocabulary is 256)."""
    with open(os.path.join(DATA_DIR, CORPUS_FILE), "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Text to byte tokens (int64)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)


def decode(tokens) -> str:
    """Byte tokens back to text; invalid UTF-8 (a cut multi-byte character) is replaced."""
    return bytes(int(t) & 0xFF for t in np.asarray(tokens).reshape(-1)).decode("utf-8", errors="replace")


class TextBatches:
    """Random windows of a token stream for next-token prediction.

    ``batch(step)`` is a pure function of (seed, step): the same step gives the
    same batch whatever came before, so a resumed run sees the data it would have.
    The stream is split once: the first ``1 - val_fraction`` for training, the
    rest for validation (``split="val"``).
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, seq_len: int, seed: int = 0,
                 val_fraction: float = 0.05):
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, not of shape {tokens.shape}")
        if batch_size <= 0 or seq_len <= 0:
            raise ValueError(f"batch_size and seq_len must be positive, not {batch_size} and {seq_len}")
        cut = int(tokens.shape[0] * (1.0 - val_fraction))
        self.splits = {"train": tokens[:cut].astype(np.int64), "val": tokens[cut:].astype(np.int64)}
        for name, part in self.splits.items():
            if part.shape[0] < seq_len + 1:
                raise ValueError(f"the {name} split has {part.shape[0]} tokens, fewer than seq_len + 1 = {seq_len + 1}")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed

    def batch(self, step: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """(inputs, targets), both int64 [batch_size, seq_len]; targets are inputs shifted by one."""
        tokens = self.splits[split]
        stream = 0 if split == "train" else 1
        rng = np.random.default_rng([self.seed, stream, step])
        starts = rng.integers(0, tokens.shape[0] - self.seq_len, size=self.batch_size)
        windows = tokens[starts[:, None] + np.arange(self.seq_len + 1)]
        return np.ascontiguousarray(windows[:, :-1]), np.ascontiguousarray(windows[:, 1:])
