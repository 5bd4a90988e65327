"""What counts as a question: text with a letter or digit once invisible characters are gone."""

from __future__ import annotations

import unicodedata

_INVISIBLE = ("Cc", "Cf", "Zl", "Zp", "Zs")  # controls, format characters (U+200B, U+FEFF, ...), separators


def visible_text(text: str) -> str:
    """`text` with format characters removed and controls and separators as spaces, stripped; "" when what is
    left (NFKC-normalised) holds no letter or digit: a zero-width space or a NUL is not a question."""
    kept = "".join(
        "" if unicodedata.category(ch) == "Cf" else " " if unicodedata.category(ch) in _INVISIBLE else ch for ch in text
    ).strip()
    normalised = unicodedata.normalize("NFKC", kept)
    return kept if any(unicodedata.category(ch)[0] in "LN" for ch in normalised) else ""
