"""What specbench reads of a GGUF file before llama.cpp serves it: the model it holds (architecture,
layers, width, vocabulary, file type), checked against the recipe's model, and its vocabulary checked
against a drafter's, so that a wrong file is a one-line error before any server starts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from specbench.errors import SpecbenchError

# llama.cpp takes a draft model whose vocabulary is at most this many entries longer or shorter than the
# target's (padding), every shared id with the same text (common/speculative.cpp); specbench asks the same
VOCABULARY_SLACK = 128


@dataclass(frozen=True)
class GGUFFacts:
    path: Path
    name: str | None  # general.name
    architecture: str | None
    layers: int | None
    width: int | None
    tokens: tuple[bytes, ...]  # tokenizer.ggml.tokens, id by id
    file_type: str | None  # general.file_type as llama.cpp names it: Q4_K_M, BF16, F32

    def describe(self) -> dict:
        return {
            "gguf": str(self.path),
            "general_name": self.name,
            "architecture": self.architecture,
            "file_type": self.file_type,
            "gguf_bytes": self.path.stat().st_size if self.path.is_file() else None,  # a pass reads ~all
        }


def read_facts(path: Path | str, where: str) -> GGUFFacts:
    """The facts of the GGUF file at ``path``, or a one-line error naming ``where``."""
    path = Path(path)
    if not path.is_file():
        raise SpecbenchError(where, f"GGUF file {path} not found", "give the path of an existing .gguf file")
    stat = path.stat()
    try:
        return _read(str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    except (ValueError, OSError, IndexError) as error:  # the reader's errors on a file that is no GGUF
        raise SpecbenchError(
            where, f"{path} is not a readable GGUF file ({error})", "give the model's .gguf file"
        ) from None


@lru_cache(maxsize=16)
def _read(path: str, size: int, modified: int) -> GGUFFacts:
    """Read once per file version (size and time in the key): a vocabulary of 150k tokens takes seconds."""
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)

    def value(key: str):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    architecture = value("general.architecture")
    field = reader.get_field("tokenizer.ggml.tokens")
    tokens = tuple(bytes(field.parts[i]) for i in field.data) if field is not None else ()
    file_type = value("general.file_type")
    if file_type is not None:
        try:
            file_type = LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            file_type = f"file type {file_type}"
    return GGUFFacts(
        Path(path),
        value("general.name"),
        architecture,
        value(f"{architecture}.block_count") if architecture else None,
        value(f"{architecture}.embedding_length") if architecture else None,
        tokens,
        file_type,
    )


def model_problem(facts: GGUFFacts, config, vocabulary: int) -> str | None:
    """How the GGUF file differs from the recipe's model (its transformers ``config`` and a tokenizer of
    ``vocabulary`` entries), or None when it holds the same model: layers, width and vocabulary."""
    layers, width = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if None not in (facts.layers, layers) and facts.layers != layers:
        return f"it has {facts.layers} layers, the recipe's model {layers}"
    if None not in (facts.width, width) and facts.width != width:
        return f"its hidden size is {facts.width}, the recipe's model's {width}"
    size = getattr(config, "vocab_size", None)
    if facts.tokens and size is not None and len(facts.tokens) not in (size, vocabulary):
        return f"its vocabulary has {len(facts.tokens)} tokens, the recipe's model's {size}"
    return None


def vocabulary_problem(target: GGUFFacts, drafter: GGUFFacts) -> str | None:
    """How a drafter's GGUF vocabulary differs from its target's, or None when llama.cpp can verify its
    drafts token for token (same ids for the same text; a few padding entries more or fewer)."""
    ours, theirs = target.tokens, drafter.tokens
    if abs(len(ours) - len(theirs)) > VOCABULARY_SLACK:
        return f"{drafter.path.name} has {len(theirs)} tokens and {target.path.name} {len(ours)}"
    for i, (one, other) in enumerate(zip(ours, theirs, strict=False)):
        if one != other:
            return f"token {i} is {other!r} in {drafter.path.name} and {one!r} in {target.path.name}"
    return None
