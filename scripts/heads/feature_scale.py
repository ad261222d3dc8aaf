"""The scale of the target states an EAGLE-3 head fuses, against the final (normed) state the EAGLE-1
head reads: RMS, largest magnitude, and the median over positions of each position's largest
magnitude, over the first 20 held-out sequences of the features ``specbench distill --size eagle3``
cached (layers 2, 15 and 27, then the last).

    python -m scripts.heads.feature_scale <cache>/distill/<target>/features-<key>-layers2.15.27-held-<n>.pt
"""

import sys

import torch


def main() -> None:
    features = torch.load(sys.argv[1], weights_only=True)
    states = torch.cat([f.float() for f in features[:20]])
    print(f"# {states.shape[0]} positions of {min(20, len(features))} held-out sequences")
    for i, name in enumerate(["layer 2", "layer 15", "layer 27", "last (normed)"]):
        v = states[:, i]
        rms, top, median = v.pow(2).mean().sqrt(), v.abs().max(), v.abs().amax(-1).median()
        print(f"{name:14} rms {rms:8.2f}  max {top:9.1f}  median position max {median:7.1f}")


if __name__ == "__main__":
    main()
