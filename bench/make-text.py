#!/usr/bin/env python3
"""Writes a deterministic text file of about SIZE_MB megabytes for the wordcount benchmark.

Words follow a Zipf-like distribution over a 50,000-word vocabulary (some capitalised,
some with non-ASCII letters), separated by spaces and punctuation, ~12 words a line.
"""
import random
import sys

size_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 100
path = sys.argv[2] if len(sys.argv) > 2 else "/tmp/weir-bench-100mb.txt"
rng = random.Random(42)
letters = "abcdefghijklmnopqrstuvwxyzéüöß"
vocabulary = []
for i in range(50_000):
    length = 2 + (i % 9)
    word = "".join(rng.choice(letters) for _ in range(length))
    vocabulary.append(word.capitalize() if i % 7 == 0 else word)
weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
separators = [" ", " ", " ", ", ", ". ", "; ", " - "]
target = size_mb * 1024 * 1024
written = 0
with open(path, "w", encoding="utf-8") as out:
    while written < target:
        words = rng.choices(vocabulary, weights=weights, k=4096)
        parts = []
        for index, word in enumerate(words):
            parts.append(word)
            parts.append("\n" if index % 12 == 11 else rng.choice(separators))
        chunk = "".join(parts)
        out.write(chunk)
        written += len(chunk.encode("utf-8"))
print(path)
