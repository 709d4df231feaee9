"""Faker-made documents for the document pipeline, reproducible from a seed."""
from __future__ import annotations

import functools

from faker import Faker


@functools.lru_cache(maxsize=1)
def _faker() -> Faker:
    return Faker()  # building one costs ~10 ms; reseeding it costs nothing


def make_documents(count: int, seed: int, *, prefix: str = "doc") -> list[tuple[str, dict]]:
    """`count` (job id, payload) pairs; the same seed gives the same documents."""
    fake = _faker()
    fake.seed_instance(seed)
    docs = []
    for i in range(count):
        job_id = f"{prefix}-{i:05d}"
        docs.append((job_id, {
            "doc_id": job_id,
            "title": fake.catch_phrase(),
            "body": f"{fake.name()} of {fake.company()} wrote from {fake.city()}.\n"
                    + fake.paragraph(nb_sentences=4),
        }))
    return docs
