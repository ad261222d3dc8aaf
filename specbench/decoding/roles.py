"""The models a method entry names, checked against what the method declares it takes.

A :class:`~specbench.methods.Method` declares its roles: a drafter or none (``needs_drafter``), a model
drafter only (``neural_drafter_only``), heads on the target's states of one kind (``takes_heads``), or
its own rule (``check_roles``, e.g. a cascade's ``drafters:`` list). :func:`roles_problem` holds every
entry to them, so a new method or kind of heads declares itself and changes nothing here.

The entry and the models are the recipe's (:class:`specbench.recipe.MethodSpec` and its ``models``),
typed loosely as :data:`~specbench.methods.Check` is, so that this layer never imports the recipe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specbench.methods import Method
from specbench.sources import source_of, tokenizer_of

# (field of the method entry, problem, fix) or None
Problem = tuple[str, str, str] | None


def roles_problem(info: Method, spec: Any, models: Mapping[str, Any]) -> Problem:
    """The first role of ``spec`` (a recipe's method entry) that ``info`` does not take."""
    problem = heads_problem(info, spec, models)
    if problem:
        return problem
    target_source = models[spec.target].source
    if not source_of(target_source).neural:
        return (
            "target",
            f"model {spec.target!r} ({target_source}) is a statistical drafter and cannot be a target",
            "use a neural model as the target; a statistical drafter can only be a drafter",
        )
    problem = tokenizer_problem(spec, models)
    if problem:
        return problem
    if info.check_roles is not None:
        return info.check_roles(spec, models)
    if spec.drafters is not None:
        return (
            "drafters",
            f"method {spec.method!r} takes no drafters list",
            "use drafter: NAME (drafters: is for cascades such as cs_drafting)",
        )
    if info.needs_drafter and spec.drafter is None:
        return (
            "drafter",
            f"method {spec.method!r} needs a drafter",
            f"add drafter: with one of {', '.join(sorted(models))}",
        )
    if not info.needs_drafter and spec.drafter is not None:
        return "drafter", f"method {spec.method!r} takes no drafter", "remove drafter:"
    if info.neural_drafter_only and not source_of(models[spec.drafter].source).neural:
        return (
            "drafter",
            f"method {spec.method!r} needs a model drafter, but {spec.drafter!r} is a statistical drafter",
            "use a model as the drafter (for prompt lookup use method hf_prompt_lookup or speculative)",
        )
    return None


def heads_problem(info: Method, spec: Any, models: Mapping[str, Any]) -> Problem:
    """Heads on a target's states (Medusa, EAGLE) serve only the methods that hand them those states,
    and only heads of the kind the method drafts with, trained on its target."""
    if source_of(models[spec.target].source).heads:
        return "target", f"{spec.target!r} is a set of heads, not a model", "use a model as the target"
    for role, names in (("drafter", [spec.drafter]), ("drafters", spec.drafters or [])):
        for name in names:
            if name is None:
                continue
            source = source_of(models[name].source)
            if source.heads and not info.takes_heads:
                return (
                    role,
                    f"{name!r} is a set of heads on the target's states; {spec.method!r} cannot use it",
                    f"use method {source.kind} for these heads, or a drafter model here",
                )
            if info.takes_heads and (source.heads_for or source.kind) != info.takes_heads:
                return (
                    role,
                    f"method {spec.method!r} drafts with {info.takes_heads} heads on the target's states; "
                    f"{name!r} is {'a set of ' + source.kind + ' heads' if source.heads else 'not'}",
                    f"use a {info.takes_heads}:<target>/<name> source with options: {{of: TARGET}}",
                )
    if info.takes_heads and spec.drafter is not None:
        of = models[spec.drafter].options.get("of")
        if of != spec.target:
            return (
                "drafter",
                f"the heads {spec.drafter!r} read {of!r}'s states, but the target is {spec.target!r}",
                f"set models.{spec.drafter}.options.of: {spec.target}",
            )
    return None


def tokenizer_problem(spec: Any, models: Mapping[str, Any]) -> Problem:
    """A drafter whose tokenizer is known, before anything loads, to differ from the target's (the
    same check runs on the loaded tokenizers, for the sources that know theirs only then)."""
    target = tokenizer_of(models[spec.target].source)
    drafters = [spec.drafter] if spec.drafter is not None else list(spec.drafters or ())
    for name in drafters if target is not None else ():
        tokenizer = tokenizer_of(models[name].source)
        if tokenizer is not None and tokenizer != target:
            return (
                "drafter" if spec.drafter is not None else "drafters",
                f"drafter {name!r} ({models[name].source}) does not share the target's tokenizer "
                f"({tokenizer}; {spec.target!r} uses {target}'s)",
                "use a drafter trained with the target's vocabulary",
            )
    return None
