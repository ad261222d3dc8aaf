"""The first GPU check of the roofline pass cost: the committed H100 bench runs (results/bench/h100_*),
predicted from their pass counts with the H100's public figures, beside what they measured.

    python -m scripts.prediction.h100_roofline   # writes results/prediction/h100_roofline.md

The bench files hold per-request means, not rows: target passes per request and tokens/s per method,
8 prompts x 128 new tokens, k = 4. Drafter passes are not printed; a model drafter runs k one-token
passes per target pass (one per drafted token), which is what the rows of such runs record.
"""

from __future__ import annotations

from pathlib import Path

from specbench.pipeline.analysis import cost_model, profiles

ROOT = Path(__file__).resolve().parents[2]
K = 4
# random-init TinyLlama-shaped models (hidden 2048, 22 layers, 4 KV heads of 64, vocab 32000), bf16
TARGET = {"parameters": 961.6e6, "layers": 22}
DRAFTERS = {"h100_tiny-llama-1b_same_k4.txt": 961.6e6, "h100_tiny-llama-1b_small_k4.txt": 206.6e6}
DRAFTER_LAYERS = {"h100_tiny-llama-1b_same_k4.txt": 22, "h100_tiny-llama-1b_small_k4.txt": 2}


def roofline(parameters: float, layers: int) -> cost_model.Roofline:
    figures = profiles.device_figures()["h100"]
    kv = 2 * layers * 4 * 64 * 2  # K and V, 4 KV heads of 64, bf16
    return profiles.roofline_cost(figures, 2 * parameters, parameters, kv, "bfloat16")


def methods(text: str) -> dict[str, tuple[float, float]]:
    """method -> (tok/s, target passes per request) from a bench table (rows wrap over two lines)."""
    found, label = {}, ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip()[1:-1].split("│")]
        if len(cells) < 4:
            continue
        if cells[1]:
            label = cells[0]
            found[label] = (float(cells[1]), float(cells[3]))
        elif label and cells[0]:
            found[f"{label} {cells[0]}"] = found.pop(label)
            label = ""
    return found


def main() -> str:
    target = roofline(TARGET["parameters"], TARGET["layers"])
    lines = [
        "| run | method | target passes / request | tok/s measured | speedup measured "
        "| speedup roofline | error |",
        "|---|---|---|---|---|---|---|",
    ]
    pass_ms = []
    for name, drafter_parameters in DRAFTERS.items():
        table = methods((ROOT / "results" / "bench" / name).read_text())
        drafter = roofline(drafter_parameters, DRAFTER_LAYERS[name])
        ar_rate, ar_passes = table["ours: autoregressive"]
        tokens = 128
        ar_seconds = target.seconds([(1.0, ar_passes, 0.0)])
        pass_ms.append((name, 1000 / ar_rate, 1000 * target.pass_seconds(1, 0)))
        for method, drafts in (("ours: SD k=4", True), ("ours: SD prompt-lookup k=4", False)):
            rate, passes = table[method]
            seconds = target.seconds([(K + 1.0, passes, 0.0)])
            if drafts:
                seconds += drafter.seconds([(1.0, K * passes, 0.0)])
            predicted = ar_seconds / seconds
            measured = rate / ar_rate
            lines.append(
                f"| `{name}` | {method.removeprefix('ours: ')} | {passes:.1f} | {rate:.1f} | "
                f"{measured:.2f} | "
                f"{predicted:.2f} | {100 * (predicted / measured - 1):+.1f}% |"
            )
    lines.append("")
    for name, measured_ms, roof_ms in pass_ms:
        lines.append(
            f"`{name}`: an AR step took {measured_ms:.1f} ms ({tokens} tokens per request); the roofline "
            f"says {roof_ms:.2f} ms ({measured_ms / roof_ms:.0f}x less)."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    text = main()
    (ROOT / "results" / "prediction" / "h100_roofline.md").write_text(text + "\n")
    print(text)
