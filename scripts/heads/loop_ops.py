"""Aten operations dispatched per decoding step of the tree methods, by part of the step: on a GPU each
is at least one kernel launch, and a small model's step is bound by them (the H100 run in
results/heads/smollm2_eagle_gpu spends about 40% of its walltime outside model passes). Counted on any
device with a random Llama as deep as SmolLM2-135M (30 layers; narrow, since the count does not depend on
the width) and a random EAGLE head, greedy, the GPU run's trees.

    python -m scripts.heads.loop_ops
"""

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specbench.decoding import tree_speculative
from specbench.decoding.medusa import MedusaTreeDrafter
from specbench.drafters import eagle, medusa
from specbench.drafters.heads import draft_head
from specbench.models.hf import HFModel
from specbench.models.tiny import build_tiny


class Parts(TorchDispatchMode):
    """Counts dispatched operations under the label of the innermost part of the step being run."""

    def __init__(self):
        super().__init__()
        self.part, self.ops = "loop", Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[self.part] += 1
        return func(*args, **(kwargs or {}))


def labelled(parts: Parts, label: str, function):
    def wrapped(*args, **kwargs):
        outer, parts.part = parts.part, label
        try:
            return function(*args, **kwargs)
        finally:
            parts.part = outer

    return wrapped


def count(name: str, weights, drafter, params: dict) -> None:
    parts = Parts()
    target = HFModel(weights, "target")
    model_pass = target.model.forward
    target.model.forward = labelled(parts, "target forward", model_pass)
    if hasattr(drafter, "head"):
        drafter.head.forward = labelled(parts, "head forward", drafter.head.forward)
    prompt = torch.tensor([3, 4, 5, 2, 9, 1, 7, 7, 8, 2])
    with torch.inference_mode(), parts:
        out = tree_speculative.generate(target, drafter, prompt, max_new_tokens=64, **params)
    target.model.forward = model_pass
    steps = len(out.steps)
    per_step = {part: ops / steps for part, ops in parts.ops.items()}
    detail = ", ".join(f"{part} {n:.0f}" for part, n in sorted(per_step.items()))
    print(f"{name:24s} {sum(per_step.values()):6.0f} ops per step ({detail}); {steps} steps")


def main() -> None:
    torch.manual_seed(0)
    weights, _ = build_tiny(
        "tiny-llama",
        dtype=torch.float32,
        seed=3,
        vocab_size=512,
        hidden_size=64,
        layers=30,
        heads=8,
        init_std=0.3,
    )
    head_module = eagle.EagleHead.for_target(weights)
    lm_head = weights.get_output_embeddings().weight.detach()
    embeddings = weights.get_input_embeddings()
    head = eagle.EagleDrafter("eagle", head_module, embeddings, draft_head(lm_head, None), "t")
    heads = medusa.MedusaHeads(weights.config.hidden_size, 4)
    medusa_drafter = MedusaTreeDrafter(medusa.MedusaDrafter("medusa", heads, draft_head(lm_head, None), "t"))
    print(f"torch {torch.__version__}, python -m scripts.heads.loop_ops")
    count("eagle tree, 24 nodes", weights, head, dict(depth=6, branch=4, frontier=4, nodes=24))
    count("eagle tree, 48 nodes", weights, head, dict(depth=6, branch=4, frontier=4, nodes=48))
    count("eagle chain, depth 5", weights, head, dict(depth=5, branch=1, frontier=1, nodes=5))
    count("medusa tree, 20 nodes", weights, medusa_drafter, dict(depth=4, branch=3, frontier=3, nodes=20))


if __name__ == "__main__":
    main()
