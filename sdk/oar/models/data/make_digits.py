"""Writes digits.npz beside this file from scikit-learn's copy of the UCI 8x8
handwritten digits (run once; the shipped file needs no scikit-learn).

    .venv/bin/pip install scikit-learn && .venv/bin/python sdk/oar/models/data/make_digits.py
"""

from __future__ import annotations

import os

import numpy as np


def main() -> None:
    from sklearn.datasets import load_digits  # only here: the package never imports sklearn

    digits = load_digits()
    images = np.asarray(digits.images, dtype=np.uint8)  # [1797, 8, 8], integer pixels 0..16
    target = np.asarray(digits.target, dtype=np.uint8)  # [1797], classes 0..9
    assert images.shape == (1797, 8, 8) and images.max() == 16 and set(target.tolist()) == set(range(10))
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")
    np.savez_compressed(out, images=images, target=target)
    print(f"wrote {out}: {images.shape[0]} images, {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
