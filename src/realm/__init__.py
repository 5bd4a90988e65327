"""REALM: retrieval-augmented language model pretraining (Guu et al., 2020) in PyTorch."""

__version__ = "0.1.0"
