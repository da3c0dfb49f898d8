"""Proofs that hold the shared model against implementations nobody here wrote (Hugging Face `transformers`)."""
