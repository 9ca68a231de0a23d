"""Byte-level text for the language-model examples: a generated play-like text, the train/validation split
of a file, the random windows a training step reads, and the attacked copy of a text used to test
robustness."""
import math
import random
from pathlib import Path

import torch


def generated_text(size=300_000, seed=0):
    """A play-like text of about size bytes, the same for the same seed: speeches of a few characters made
    of sentences of a small grammar, with structure enough for a byte-level model to learn."""
    rng = random.Random(seed)
    speakers = ("KING", "QUEEN", "DUKE", "PRINCE", "NURSE", "FRIAR", "CAPTAIN", "FOOL")
    subjects = ("the king", "my lord", "this crown", "the night", "your grace", "a fool", "the sea", "thy heart")
    verbs = ("doth love", "shall keep", "hath lost", "will tell", "must bear", "cannot find", "would see")
    objects = ("the crown", "a kingdom", "my sword", "her honour", "the truth", "thy name", "the morning")
    endings = (".", "!", "?", ", I pray.", ", my liege.", ", and more.")
    lines, total = [], 0
    while total < size:
        speech = " ".join(f"{rng.choice(subjects).capitalize()} {rng.choice(verbs)} {rng.choice(objects)}"
                          f"{rng.choice(endings)}" for _ in range(rng.randint(1, 4)))
        lines.append(f"{rng.choice(speakers)}:\n{speech}\n\n")
        total += len(lines[-1])
    return "".join(lines).encode()


def split_bytes(path=None, valid=0.1, size=300_000):
    """The bytes of the file at path (or of generated_text(size)) as int64 tensors (train, validation): the
    first 90% train, the next fraction `valid` (at most 0.1) validates. enwik8 with valid = 0.05 gives its
    usual 90M / 5M split, its last 5M (the test set) left out."""
    if not 0 < valid <= 0.1:
        raise ValueError(f"the validation fraction must lie in (0, 0.1], got {valid}")
    text = Path(path).read_bytes() if path else generated_text(size)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    cut = int(0.9 * len(data))
    return data[:cut], data[cut:cut + math.ceil(valid * len(data))]


def random_windows(data, length, count, generator):
    """count windows of `length` consecutive elements of data (a 1-D tensor) as a count x length tensor, each
    starting at a position drawn uniformly from the len(data) - length + 1 that fit, so every element, the
    last included, can be read."""
    starts = len(data) - length + 1
    if starts < 1:
        raise ValueError(f"windows of {length} bytes need a text of at least {length} bytes, got {len(data)}")
    offsets = torch.randint(0, starts, (count,), generator=generator)
    return data[offsets[:, None] + torch.arange(length)]


def attacked(data, rate, seed=1):
    """A copy of data (int64 bytes) with a fraction `rate` of its bytes replaced by uniform random bytes,
    the same for the same seed."""
    gen = torch.Generator().manual_seed(seed)
    hit = torch.rand(data.shape, generator=gen) < rate
    noise = torch.randint(0, 256, data.shape, generator=gen)
    return torch.where(hit, noise, data)
