"""Data stages: registry, download, prepare/clean, SentencePiece, token arrays, batching."""
