"""Every setting of ``specbench specdecpp train`` (the head's data and its training), and the key of the
cached data the settings determine."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from specbench.errors import SpecbenchError
from specbench.models.cache import DISTILLED_PREFIX
from specbench.sources.smollm2 import ALIAS as SMOLLM2_ALIAS

DEFAULT_DRAFTER = f"{DISTILLED_PREFIX}{SMOLLM2_ALIAS}/small"


@dataclass(frozen=True)
class TrainConfig:
    target: str = SMOLLM2_ALIAS
    drafter: str = DEFAULT_DRAFTER
    target_options: dict = field(default_factory=dict)
    drafter_options: dict = field(default_factory=dict)
    name: str = "default"
    data_dir: str = ""
    prompts: int = 800  # training + evaluation prompts
    max_new_tokens: int = 128  # length cap of the target's responses
    eval_fraction: float = 0.1
    mixing_ratio: float = 0.15  # r: probability that a position keeps the target's token (no loss)
    depth: int = 3  # residual blocks D (0: one linear layer)
    w_acc: float = 1.0
    w_rej: float = 6.0
    epochs: float = 3.0
    batch_size: int = 32  # sequences per optimiser step
    lr: float = 1e-3  # the release keeps HF's 5e-5 for ~50x more steps (40k prompts)
    warmup_ratio: float = 0.03
    seed: int = 42
    teacher_batch: int = 8  # sequences per teacher / draft forward pass
    dtype: str = "float32"
    device: str = "cpu"
    # "distill": distill's prompts, eval_fraction of them held out at random; "alpaca": the paper's
    # setup, Alpaca's specdecpp-train prompts to train and its specdecpp-dev prompts to evaluate
    # (specdecpp-test stays for the benchmark)
    prompt_set: str = "distill"
    # the target's responses: greedy at temperature 0, else sampled (the release samples them with the
    # checkpoint's generation config)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    # a file of the target's responses (a responses-*.pt this command wrote) used instead of generating
    # them: the hours of a real pair's sampling, shared across machines
    responses: str = ""

    def data_key(self, fingerprint: str) -> str:
        """Hash of everything the features and labels depend on (not the head's hyperparameters)."""
        fields = {
            k: getattr(self, k)
            for k in (
                "target",
                "drafter",
                "target_options",
                "drafter_options",
                "prompts",
                "max_new_tokens",
                "eval_fraction",
                "mixing_ratio",
                "seed",
                "dtype",
            )
        }
        defaults = TrainConfig()
        for name in ("prompt_set", "temperature", "top_p", "top_k"):  # at their defaults keys stay as before
            if getattr(self, name) != getattr(defaults, name):
                fields[name] = getattr(self, name)
        if self.responses:  # the labels are built on exactly these responses
            path = Path(self.responses)
            if not path.is_file():
                raise SpecbenchError(
                    f"--responses {path}", "no such file", "pass a responses-*.pt from a specdecpp cache"
                )
            fields["responses"] = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        payload = json.dumps(fields | {"data": fingerprint, "version": 1}, sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]
