"""Download and unpack a corpus from its canonical source (for machines that are online).

Archives are fetched to a temporary file, checked (size, and a checksum when one is
known or published beside the archive), unpacked with tarfile's ``data`` filter (no
absolute paths, no links out of the folder) and moved into place, so an interrupted
download never leaves a half corpus behind.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class DownloadError(RuntimeError):
    """The corpus could not be downloaded or failed verification."""


@dataclass(frozen=True)
class Source:
    """A canonical download.

    Attributes:
        url: the archive (``.tar.gz``).
        dest: folder (inside the download dir) the archive's content is moved to.
        strip: leading folder inside the archive to drop (``""`` keeps the archive layout).
        sha256: expected checksum, when known.
        checksum_url: a published ``.sha1``/``.md5``/``.sha256`` file to verify against.
        extra: more single files to fetch into ``dest`` (``(url, name)``).
    """

    url: str
    dest: str
    strip: str = ""
    sha256: str | None = None
    checksum_url: str | None = None
    extra: tuple[tuple[str, str], ...] = ()


def download_file(url: str, path: Path, timeout: float = 60.0) -> None:
    """Fetch ``url`` into ``path``; a :class:`DownloadError` naming the address when it cannot."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, open(path, "wb") as out:
            shutil.copyfileobj(response, out, length=1 << 20)
    except OSError as exc:
        raise DownloadError(f"cannot download {url}: {exc}") from exc


def _digest(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify(path: Path, source: Source, workdir: Path) -> None:
    """Check an archive against the known or published checksum; raise DownloadError if it differs."""
    if source.sha256 and _digest(path, "sha256") != source.sha256:
        raise DownloadError(f"{source.url}: sha256 mismatch")
    if source.checksum_url:
        algorithm = source.checksum_url.rsplit(".", 1)[-1]
        sums = workdir / f"checksum.{algorithm}"
        download_file(source.checksum_url, sums)
        expected = sums.read_text(encoding="utf-8", errors="replace").split()[0].lower()
        if _digest(path, algorithm) != expected:
            raise DownloadError(f"{source.url}: {algorithm} mismatch with {source.checksum_url}")


def fetch(source: Source, download_dir: Path) -> Path:
    """Download, verify and unpack ``source`` into ``download_dir / source.dest``."""
    final = download_dir / source.dest
    download_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=download_dir, prefix=".fetch-") as tmp:
        workdir = Path(tmp)
        archive = workdir / "archive.tar.gz"
        download_file(source.url, archive)
        verify(archive, source, workdir)
        unpacked = workdir / "unpacked"
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise DownloadError(f"{source.url}: not a readable tar archive: {exc}") from exc
        content = unpacked / source.strip if source.strip else unpacked
        if not content.is_dir():
            raise DownloadError(f"{source.url}: archive has no {source.strip}/ folder")
        for url, name in source.extra:
            download_file(url, content / name)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            shutil.rmtree(final)
        shutil.move(str(content), final)
    return final
