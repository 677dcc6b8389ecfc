"""Writes pydoc_topics.txt beside this file: the English prose of the Python
Language Reference topics that CPython ships in its standard library
(``pydoc_data.topics``, the text behind ``help("if")``), under the PSF licence.

    python sdk/oar/models/data/make_corpus.py

Topics are written in sorted order, each under a "== name ==" header line.
"""

from __future__ import annotations

import os
import platform


def main() -> None:
    from pydoc_data import topics

    parts = [f"== {name} ==\n\n{topics.topics[name].strip()}\n\n" for name in sorted(topics.topics)]
    text = "".join(parts)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pydoc_topics.txt")
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    print(f"wrote {out}: {len(topics.topics)} topics from Python {platform.python_version()}, "
          f"{len(text.encode('utf-8'))} bytes")


if __name__ == "__main__":
    main()
