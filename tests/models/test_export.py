"""`realm export`: each tower as a sentence-transformers folder and an ONNX graph that its own library loads, in a
process that never imports realm, and that reproduces `realm search`'s scores f(x, z) on the same index."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import TINY_QA_PRESET

from realm.cli.main import main

QUESTION = "Where did Bach die?"

SENTENCE_TRANSFORMERS = """
import json, sys
from sentence_transformers import SentenceTransformer
out, question, hits = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
query = SentenceTransformer(f"{out}/query", device="cpu").encode([question])
docs = SentenceTransformer(f"{out}/doc", device="cpu").encode([[hit["title"], hit["text"]] for hit in hits])
assert not any(name == "realm" or name.startswith("realm.") for name in sys.modules)
print(json.dumps((docs @ query[0]).tolist()))
"""

ONNX = """
import json, sys
import onnxruntime
from transformers import AutoTokenizer
out, question, hits, graph = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]

def embed(tower, *texts):
    tokenizer = AutoTokenizer.from_pretrained(f"{out}/{tower}")
    length = json.load(open(f"{out}/{tower}/realm_onnx.json"))["max_length"]
    inputs = tokenizer(*texts, padding=True, truncation=True, max_length=length, return_tensors="np")
    session = onnxruntime.InferenceSession(f"{out}/{tower}/{graph}", providers=["CPUExecutionProvider"])
    return session.run(None, {k: inputs[k].astype("int64") for k in ("input_ids", "attention_mask", "token_type_ids")})[0]

query = embed("query", [question])
docs = embed("doc", [hit["title"] for hit in hits], [hit["text"] for hit in hits])
assert not any(name == "realm" or name.startswith("realm.") for name in sys.modules)
print(json.dumps((docs @ query[0]).tolist()))
"""


def _scores(script: str, *args: str) -> list[float]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def searched(tiny_qa, monkeypatch, capsys) -> tuple[str, str, list[dict]]:
    """(model dir, index dir, `realm search --json` hits for QUESTION) under the tiny preset."""
    model_dir, index_dir = tiny_qa
    monkeypatch.setattr("realm.cli.options.get_preset", lambda name: TINY_QA_PRESET)
    assert main(["search", QUESTION, "--index", str(index_dir), "--model", str(model_dir), "-k", "6", "--json"]) == 0
    return str(model_dir), str(index_dir), json.loads(capsys.readouterr().out)


def test_sentence_transformers_export_reproduces_realm_search_scores(searched, tmp_path):
    model_dir, _, hits = searched
    out = tmp_path / "st"
    assert main(["export", model_dir, "--format", "sentence-transformers", "--out", str(out), "--quiet"]) == 0
    scores = _scores(SENTENCE_TRANSFORMERS, str(out), QUESTION, json.dumps(hits))
    assert scores == pytest.approx([hit["score"] for hit in hits], abs=1e-4)


def test_onnx_export_reproduces_realm_search_scores_and_int8_stays_close(searched, tmp_path, capsys):
    model_dir, _, hits = searched
    out = tmp_path / "onnx"
    assert main(["export", model_dir, "--format", "onnx", "--int8", "--out", str(out), "--quiet"]) == 0
    scores = _scores(ONNX, str(out), QUESTION, json.dumps(hits), "model.onnx")
    assert scores == pytest.approx([hit["score"] for hit in hits], abs=1e-4)
    int8 = _scores(ONNX, str(out), QUESTION, json.dumps(hits), "model_int8.onnx")
    assert int8 != scores and int8 == pytest.approx(scores, abs=0.5)  # quantized: close, not equal
    capsys.readouterr()
    assert main(["export", model_dir, "--format", "sentence-transformers", "--int8", "--out", str(out)]) == 2
    assert "realm: error: --int8 quantizes ONNX graphs" in capsys.readouterr().err
