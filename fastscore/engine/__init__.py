"""The prefix-sharing engine: a trie over token sequences and the plans built on it. Token ids only; no backend."""
