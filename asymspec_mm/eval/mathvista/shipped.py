"""The MathVista testmini text data shipped inside the package (``data/``, CC BY-SA 4.0: see ``data/NOTICE.md``).

The files are MathVista's own bytes, unchanged, so that the paper protocol, ``--require-caption`` and
``--dump-prompts`` work from any install. :data:`SHA256` records the digest of each; :func:`check_shipped`
compares the installed files with it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...base.errors import DatasetUnavailableError

#: The folder of the shipped copy (the default text folder unless --text-dir / $ASYMSPEC_MATHVISTA_DIR say otherwise).
SHIPPED_DIR = Path(__file__).with_name("data")

#: SHA-256 of each shipped file, as copied from MathVista (lupantech/MathVista, data/ at commit 53d5258).
SHA256: dict[str, str] = {
    "testmini.json": "ab0148dca9d401c31cc47f29b3826eec28a76ff155a1c0878d81e8daf0413480",
    "query.json": "a2d173eafbadc7fec6f6d101822723debcbde06bd23a754ebdfc92e229161421",
    "captions_bard.json": "f3a8d143778b9a229e7b80a80466001d6841e27affb91f219510289307c40706",
    "ocrs_easyocr.json": "c9f36bdcc31cb6e4d7504350d92db65900b278ffed7f56f438391bd85519ced0",
}


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_shipped(folder: Path = SHIPPED_DIR) -> None:
    """Raise :class:`DatasetUnavailableError` naming each shipped file that is missing or whose bytes differ."""
    bad = []
    for name, want in SHA256.items():
        path = folder / name
        if not path.is_file():
            bad.append(f"{name} is missing")
        elif sha256_of(path) != want:
            bad.append(f"{name} differs from MathVista's (sha256 {sha256_of(path)[:12]}..., expected {want[:12]}...)")
    if bad:
        raise DatasetUnavailableError(f"the MathVista text data in {folder} is damaged: {'; '.join(bad)}; reinstall asymspec-mm")
