"""Reading a recipe: YAML (a key given twice is an error), ``extends:`` chains, then validation.

:func:`load_recipe` reads a file and :func:`parse_recipe` validates data already parsed; both return a
:class:`~specbench.recipe.experiment.Recipe` or raise one SpecbenchError line naming the file, the
field and the fix.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import yaml
from pydantic import ValidationError

from specbench.errors import SpecbenchError
from specbench.recipe.checks import check_recipe
from specbench.recipe.experiment import Recipe
from specbench.recipe.messages import from_validation_error


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        explicit = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
        if len(explicit) < len(node.value):  # `<<: *defaults`: merged keys may be overridden
            self.flatten_mapping(node)
        for key_node, _ in explicit:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys are reported by SafeLoader itself
            if key in seen:
                raise _DuplicateKey(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_recipe(path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    """Read, validate and return a recipe; any problem is one SpecbenchError line."""
    path = Path(path)
    return parse_recipe(_extended(_read_yaml(path), path), path, known_tasks)


def _extended(data, path: Path, chain: tuple[Path, ...] = ()):
    """A recipe with ``extends: other.yaml`` is that recipe with this file's keys laid over it:
    mappings merge key by key (so ``models: {large: {source: ...}}`` swaps one model and keeps its
    dtype and device), anything else, lists included, replaces the base's value. The base is found
    relative to the extending file; relative paths inside either resolve from the extending file."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    data = dict(data)
    base_name = data.pop("extends")
    field = f"{path}: extends"
    if not isinstance(base_name, str) or not base_name.strip():
        raise SpecbenchError(field, "must name one recipe file", "e.g. extends: gemma_2b_27b.yaml")
    base_path = path.parent / base_name
    here = path.resolve()
    if base_path.resolve() in chain + (here,):
        raise SpecbenchError(
            field, f"{base_name} leads back to this recipe", "let one recipe of the chain stand alone"
        )
    if not base_path.is_file():
        raise SpecbenchError(
            field, f"{base_name} not found in {path.parent}", "give the base recipe's path relative to it"
        )
    base = _extended(_read_yaml(base_path), base_path, chain + (here,))
    if not isinstance(base, dict):
        raise SpecbenchError(field, f"{base_name} is not a recipe mapping", "extend a recipe file")
    return _overlay(base, data)


def _overlay(base: dict, over: dict) -> dict:
    merged = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _overlay(base[key], value) if both else value
    return merged


def _read_yaml(path: Path):
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecbenchError(
            str(path), "recipe file not found", "check the path (recipes live in recipes/)"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise SpecbenchError(
            str(path), f"cannot read the recipe ({reason})", "give a readable YAML file"
        ) from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as error:
        raise _yaml_error(path, error) from None
    except RecursionError:
        raise SpecbenchError(
            str(path), "is nested too deeply to be a recipe", "a recipe is a few levels of mappings and lists"
        ) from None
    return data


def parse_recipe(data: dict, path: str | Path, known_tasks: Collection[str] | None = None) -> Recipe:
    """Validate already-parsed YAML; ``path`` names the file in messages and anchors relative paths."""
    path = Path(path)
    if not isinstance(data, dict):
        raise SpecbenchError(
            str(path), "a recipe must be a YAML mapping", "start with name:, models:, datasets: and methods:"
        )
    try:
        recipe = Recipe.model_validate(data, context={"recipe_dir": path.parent})
    except ValidationError as error:
        raise from_validation_error(path, error, Recipe) from None
    recipe._path = path
    check_recipe(recipe, path, known_tasks)
    return recipe


def _yaml_error(path: Path, error: yaml.YAMLError) -> SpecbenchError:
    mark = getattr(error, "problem_mark", None)
    at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(error, "problem", None) or "invalid YAML"
    fix = "keep only one of them" if isinstance(error, _DuplicateKey) else "fix the YAML syntax there"
    return SpecbenchError(str(path), f"{at}{problem}", fix)
