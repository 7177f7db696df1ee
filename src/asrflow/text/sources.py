"""General text for language models: ``lang.lm_text`` entries that name a published corpus.

A small corpus's transcripts make a weak LM; a general text interpolated with them
(``lang.lm_combine: interpolate``) gives it a vocabulary and word sequences. ``nltk:<corpus>``
names a corpus of the NLTK data collection whose sentences asrflow can read:

- ``nltk:brown``: the Brown corpus (1 M words of 1961 American English prose, fifteen genres),
  part-of-speech tagged tokens, a sentence a line;
- ``nltk:movie_reviews``: 2,000 film reviews (1.5 M words), tokenised, a sentence a line.

Each is read from ``$ASRFLOW_DATA_MIRROR/nltk_data/packages/corpora/<corpus>.zip`` (the layout
of the collection's repository), else ``<corpus.download_dir>/nltk_data/...``, else downloaded
there from its canonical address, ``https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/
packages/corpora/<corpus>.zip``. Sentences are returned raw; the lang stage normalises them as
transcripts are.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from asrflow.corpus.base import mirror_root
from asrflow.corpus.download import DownloadError, download_file

PREFIX = "nltk:"
URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/{name}.zip"
FOLDER = "nltk_data/packages/corpora"


class TextSourceError(ValueError):
    """A named text that cannot be found or read."""


def _brown(name: str, text: str) -> list[str]:
    """Brown's ``word/tag`` tokens without their tags, a sentence a line (the category files ``c??NN``)."""
    if not re.fullmatch(r"brown/c[a-r]\d\d", name):
        return []
    return [" ".join(token.rsplit("/", 1)[0] for token in line.split()) for line in text.splitlines()]


def _movie_reviews(name: str, text: str) -> list[str]:
    """A review's sentences, one a line (``movie_reviews/pos/*.txt``, ``.../neg/*.txt``)."""
    return text.splitlines() if re.fullmatch(r"movie_reviews/(pos|neg)/[^/]+\.txt", name) else []


#: The corpora asrflow reads, with each member file's reader.
READERS: dict[str, Callable[[str, str], list[str]]] = {"brown": _brown, "movie_reviews": _movie_reviews}


def is_named(entry: str) -> bool:
    """Whether a ``lang.lm_text`` entry names a corpus rather than a file."""
    return entry.startswith(PREFIX)


def archive(name: str, download_dir: str | Path) -> Path:
    """The zip of corpus ``name``: the mirror's, else a downloaded one (fetched now if missing)."""
    mirror = mirror_root()
    if mirror is not None:
        path = mirror / FOLDER / f"{name}.zip"
        if not path.is_file():
            raise TextSourceError(f"lang.lm_text {PREFIX}{name}: the mirror has no {FOLDER}/{name}.zip ({path})")
        return path
    path = Path(download_dir) / FOLDER / f"{name}.zip"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as tmp:
            part = Path(tmp) / f"{name}.zip"
            try:
                download_file(URL.format(name=name), part)
            except DownloadError as exc:
                raise TextSourceError(f"lang.lm_text {PREFIX}{name}: {exc}") from None
            shutil.move(str(part), path)
    return path


def named_sentences(entry: str, download_dir: str | Path) -> list[str]:
    """The raw sentences of a named corpus (``nltk:brown``), in the archive's member order."""
    name = entry[len(PREFIX):]
    reader = READERS.get(name)
    if reader is None:
        raise TextSourceError(f"lang.lm_text {entry}: unknown corpus; known: "
                              f"{', '.join(PREFIX + n for n in READERS)}")
    path = archive(name, download_dir)
    out: list[str] = []
    try:
        with zipfile.ZipFile(path) as zf:
            for member in sorted(zf.namelist()):
                if not member.endswith("/"):
                    out += reader(member, zf.read(member).decode("utf-8", errors="replace"))
    except (zipfile.BadZipFile, OSError) as exc:
        raise TextSourceError(f"lang.lm_text {entry}: {path} is not a readable zip: {exc}") from None
    if not out:
        raise TextSourceError(f"lang.lm_text {entry}: {path} holds no sentences of {name}")
    return out
