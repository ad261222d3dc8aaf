"""Tiny recipes for tests, one function a part, so that a test writes only what it varies:
random-init models (``tiny``), statistical drafters (``lookup``, ``maxgram``), the AR baseline
(``ar``), speculative decoding over a grid of k or one k (``speculative``), CS Drafting
(``cs_drafting``), and the recipe around them (``recipe``)."""

from __future__ import annotations


def lookup() -> dict:
    return {"source": "prompt-lookup"}


def maxgram() -> dict:
    return {"source": "maxgram"}


def tiny(source: str = "tiny-llama", dtype: str | None = "float64", **options) -> dict:
    """A random-init model entry (the tiny sources' options: seed, layers, vocab_size, init_std ...)."""
    entry: dict = {"source": source}
    if dtype is not None:
        entry["dtype"] = dtype
    if options:
        entry["options"] = options
    return entry


def ar(name: str = "ar", target: str = "target") -> dict:
    return {"name": name, "method": "autoregressive", "target": target}


def speculative(
    drafter: str = "draft", k: int | list[int] | None = (2, 4), name: str = "sd", target: str = "target"
) -> dict:
    """Speculative decoding with ``drafter``: a grid over k (a list), one k in params (an int), or
    the method's default k (None)."""
    entry = {"name": name, "method": "speculative", "target": target, "drafter": drafter}
    if k is None:
        return entry
    return entry | ({"params": {"k": k}} if isinstance(k, int) else {"grid": {"k": list(k)}})


def cs_drafting(drafters: list[str], K: list, name: str = "cs", target: str = "target") -> dict:
    return {"name": name, "method": "cs_drafting", "target": target, "drafters": drafters, "params": {"K": K}}


def recipe(
    name: str,
    models: dict,
    methods: list[dict],
    *,
    limit: int = 2,
    max_new_tokens: int = 16,
    temperature: float | None = None,
    task: str = "arithmetic",
    **top,
) -> dict:
    """A recipe as a dict: ``top`` holds the other top-level fields (seed, warmup, engine ...)."""
    generation: dict = {"max_new_tokens": max_new_tokens}
    if temperature is not None:
        generation["temperature"] = temperature
    return {
        "name": name,
        **top,
        "generation": generation,
        "models": models,
        "datasets": [{"task": task, "limit": limit}],
        "methods": methods,
    }
