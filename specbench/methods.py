"""The method interface and its registry: what a recipe's ``method:`` names.

Every decoding module in :mod:`specbench.decoding` that implements a method declares it next to its
algorithm, as a module-level ``METHODS = (Method(...), ...)``: the hyperparameters with their types,
ranges and help (:class:`ParamSpec`), the drafter roles it takes, a rule across parameters, whether its
output must equal the target's own, and ``run``, the adapter from a cell's parameters and one
:class:`Request` to the algorithm's :class:`~specbench.decoding.generation.Generation`. :data:`METHODS`
collects them the first time it is read (as lm-evaluation-harness collects its tasks), so a new method
is one new module in ``specbench/decoding/`` plus its tests.

What the rest of specbench needs of a method is declared on it too, so that no module outside
``decoding/`` branches on method names: which method is the baseline of every speedup
(:data:`BASELINE`), what ``specbench plan`` expects of a row (:class:`PassRule`), the papers' theory of a
measured cell (:mod:`specbench.decoding.theory`) and the cells.csv columns only it has.

This module imports neither torch nor the recipe schema: the recipe asks the registry for a method's
specs, and the decoding modules import only :class:`Method`, :class:`ParamSpec`, :class:`Request` and
:class:`PassRule` from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbench.registry import Registry

if TYPE_CHECKING:
    import torch

    from specbench.decoding.generation import Generation
    from specbench.models.sampling import SamplingParams


@dataclass(frozen=True)
class ParamSpec:
    type: type  # int, float, str, bool or list; a bool is never accepted as a number
    default: Any
    help: str
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    choices: tuple | None = None
    validator: Callable[[Any], str | None] | None = None  # extra rule: None, or the fix for a bad value
    # A parameter added after results were published: at its default it is left out of the cell
    # fingerprint, so rows recorded before it existed still resume.
    added_later: bool = False


# The method every speedup is measured against; rows and cells.csv name it so, and readers of those
# files compare against this name without loading the registry. Its Method says baseline=True.
BASELINE = "autoregressive"

DRAFT_LENGTH = ParamSpec(int, 4, "draft length, the tokens proposed per target verification", 1, 64)

# A rule across parameters, called with every fully resolved grid point, the method's recipe entry
# (specbench.recipe.MethodSpec) and the generation settings (GenerationSpec): None, or
# (param, problem, fix). Typed loosely so that this interface never imports the recipe schema.
Check = Callable[[dict, Any, Any], "tuple[str, str, str] | None"]

# The method's own rule for the models its entry names, in place of the drafter: rules of
# specbench.decoding.roles (e.g. a cascade's drafters: list), called with the method's recipe entry
# and the recipe's models: None, or (field, problem, fix). Typed loosely, as Check.
RolesCheck = Callable[[Any, Any], "tuple[str, str, str] | None"]


@dataclass(frozen=True)
class Request:
    """One example as a method sees it: the prompt, the decoding settings and the seeded generator."""

    prompt_ids: torch.Tensor
    max_new_tokens: int
    sampling: SamplingParams
    eos_token_id: list[int]
    generator: torch.Generator
    # the target's autoregressive output ids for this example, for methods that declare
    # ``needs_reference`` (oracles); None otherwise
    reference_ids: list[int] | None = None

    def decoding(self) -> dict:
        """The keyword arguments every decoding loop takes."""
        return dict(
            max_new_tokens=self.max_new_tokens,
            sampling=self.sampling,
            eos_token_id=self.eos_token_id,
            generator=self.generator,
        )


# run(params, target, drafter, request): the drafter is None, a model or a statistical drafter; for a
# method with ``drafter_list`` the list of drafters, largest first, statistical last.
Run = Callable[[dict, Any, Any, Request], "Generation"]


# A model's part in a cell for a pass rule: the target, or the index of a drafter in the entry's order
# (``drafter:`` is index 0; a cascade's ``drafters:`` list in its order).
Role = str | int
TARGET = "target"


@dataclass(frozen=True)
class PassRule:
    """What ``specbench plan`` expects of one row: ``passes(params, tokens, alpha)`` gives the forward
    passes of each model, as (role, passes) pairs in the order the plan lists them, for ``tokens``
    generated tokens at acceptance rate ``alpha``, and the draft length k it assumed (None: no draft);
    ``text`` is the rule in words, printed under the plan."""

    text: str
    passes: Callable[[dict, float, float], tuple[list[tuple[Role, float]], int | None]]


def leviathan_tokens_per_step(alpha: float, k: float) -> float:
    """E[tokens per target pass] = (1 - α^(k+1)) / (1 - α) (Leviathan et al. 2023, Eq. 1)."""
    return k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def chain_passes(
    tokens: float, alpha: float, k: int, drafter_passes: tuple[float, ...] = ()
) -> list[tuple[Role, float]]:
    """A draft of k tokens a target pass, accepted as Leviathan et al. expect: T / E(α, k) target
    passes, and ``drafter_passes[i]`` passes of drafter i per target pass."""
    steps = tokens / leviathan_tokens_per_step(alpha, k)
    return [(TARGET, steps), *((i, passes * steps) for i, passes in enumerate(drafter_passes))]


def _draft_k(params: dict, tokens: float, alpha: float) -> tuple[list[tuple[Role, float]], int]:
    return chain_passes(tokens, alpha, params["k"], (params["k"],)), params["k"]


SPECULATIVE_PASSES = PassRule(
    "T / E(α, k) target passes (Leviathan et al. 2023, Eq. 1), k drafter passes each", _draft_k
)


def never(params: dict) -> bool:
    return False


def always(params: dict) -> bool:
    return True


def k_draft_length(params: dict) -> tuple[int, ...]:
    return (params["k"],) if "k" in params else ()


@dataclass(frozen=True)
class Method:
    name: str
    help: str
    run: Run
    params: dict[str, ParamSpec]
    needs_drafter: bool = False
    neural_drafter_only: bool = False  # the drafter must be a model, not a statistical drafter
    drafter_list: bool = False  # takes ``drafters:`` (a cascade) instead of ``drafter:``
    # reads the target's own autoregressive output for the same example (oracles): the recipe must
    # hold an autoregressive method on the same target, and the runner passes its output ids
    needs_reference: bool = False
    check: Check | None = None
    check_roles: RolesCheck | None = None
    # the kind of heads on the target's hidden states the drafter must be (a source with heads=True of
    # that kind: "medusa", "eagle"); None: the method takes no heads
    takes_heads: str | None = None
    # False: the method calls transformers' generate on the model's own module, so its cells run
    # eagerly on any engine (nothing is compiled for them, and no compile time is charged)
    runs_engine: bool = True
    # whether a cell with these parameters must reproduce the target's own output (checked against the
    # AR cell when greedy, and the condition for replaying the target)
    lossless: Callable[[dict], bool] = never
    # why the target cannot be replayed from its AR output, when the method runs the target itself
    no_replay: str | None = None
    # the most candidates one verification holds, for each draft length the cell uses: the compiled
    # engine compiles a pass of each + 1 tokens (shorter passes pad up to one, longer run eagerly)
    draft_lengths: Callable[[dict], tuple[int, ...]] = k_draft_length
    # the most nodes of each token tree the cell verifies or drafts (tree methods): the compiled engine
    # compiles a tree pass of each + 1 tokens
    tree_sizes: Callable[[dict], tuple[int, ...]] = lambda params: ()
    # bumped when the algorithm's outputs or counts change for the same parameters: above 1 it enters
    # the cells' fingerprints, so a resumed run recomputes those rows instead of mixing two versions
    revision: int = 1
    # the baseline of every speedup (one method, named BASELINE)
    baseline: bool = False
    # what `specbench plan` expects of a row; None: one target pass per token, and the plan says so
    plan: PassRule | None = None
    # the papers' expected step for a measured cell, from its rows and their acceptance
    # (rows, iid) -> specbench.decoding.theory.Expectation, or None where the theory does not apply
    theory: Callable[[list[dict], bool], Any] | None = None
    # the cells.csv columns only this method has: (rows, their steps) -> {column: value}
    cell_metrics: Callable[[list[dict], list], dict] | None = None


def given_params(spec) -> set[str]:
    """The parameter names a recipe entry sets, in its grid or in params to a value other than the
    method's default (a resolved recipe writes every default, and must load again as it ran)."""
    declared = METHODS[spec.method].params
    return spec.grid.keys() | {
        name for name, value in spec.params.items() if name not in declared or value != declared[name].default
    }


METHODS: Registry[Method] = Registry("method", "specbench.decoding", "METHODS")
