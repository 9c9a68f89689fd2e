# nnmem_sweep — the README's two set-up commands are `make report` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
CONFIG  ?= configs/llama.yaml
OUT     ?=
# torch and torchvision pinned as a pair (torchvision's wheel is built against one torch release; the 2.13 CPU wheel
# cannot import PyPI's torchvision). Both lie on this machine's disk; the measured truth is byte-identical under 2.14.1.
TORCH   ?= torch==2.14.1 torchvision==0.29.1
STAMP   := $(VENV)/.install-stamp
MSTAMP  := $(VENV)/.install-stamp-measure

.PHONY: install install-measure lock test run report bench truth derive accuracy validate gpu-check clean

# The last line compiles the allocator replay once (numba caches it beside the module): not in a user's first run.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@$(BIN)/python -c 'from nnmem_sweep.allocator import fast; fast.warm()'
	@touch $@

# The measurement extra (torch, torchvision, transformers, peft, bitsandbytes) with the dev tools, from the lock
# (requirements/measure.lock: exact releases and sha256, no resolution): two pip processes unpack alternate lines
# (pip unpacks one wheel at a time, and the CUDA build of torch brings nvidia wheels of 3.2 GiB installed), pip
# check holds what landed to pyproject.toml, and the modules are compiled on every core (pip compiles on one).
# Where the lock cannot be installed (another platform, an index without a release), pip resolves the extra
# itself, with the pinned torch pair in the same resolution so that the extra's open ranges never pick other
# releases.
LOCK    := requirements/measure.lock
PIPQ    := $(BIN)/python -m pip install -q --disable-pip-version-check
$(MSTAMP): pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@grep -v '^#' $(LOCK) | awk 'NR % 2 == 1' > $(VENV)/lock-1.txt
	@grep -v '^#' $(LOCK) | awk 'NR % 2 == 0' > $(VENV)/lock-2.txt
	@{ $(PIPQ) --no-deps --no-compile -r $(VENV)/lock-1.txt & a=$$!; \
	   $(PIPQ) --no-deps --no-compile -r $(VENV)/lock-2.txt & b=$$!; \
	   wait $$a; ra=$$?; wait $$b; test $$ra = 0 -a $$? = 0; } \
	 && $(PIPQ) --no-deps --no-compile -e . && $(BIN)/python -m pip check -q >/dev/null \
	 || { echo "the lock did not install here, or pip check found the venv inconsistent: resolving with pip"; \
	      $(PIPQ) --no-compile $(TORCH) -e '.[dev,measure]'; }
	@$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig as s; print(s.get_path("purelib"))') \
		>/dev/null 2>&1 || true  # as pip's compile, past the few files written for a newer Python (torch's py312_*)
	@$(BIN)/python -c 'from nnmem_sweep.allocator import fast; fast.warm()'
	@touch $(STAMP) $@

# Regenerate the lock (after changing pyproject.toml's dependencies or TORCH): pip resolves in an empty venv.
lock:
	@rm -rf $(VENV)-lock && $(PY) -m venv $(VENV)-lock
	@$(VENV)-lock/bin/python -m pip install -q --disable-pip-version-check --dry-run --ignore-installed \
		--report $(VENV)-lock/report.json -e '.[dev,measure]' $(TORCH)
	@$(PY) requirements/lock.py $(VENV)-lock/report.json > $(LOCK) && rm -rf $(VENV)-lock

install: $(STAMP)

install-measure: $(MSTAMP)

# The import layers first (pyproject.toml [tool.importlinter]): an import cycle or an import against the layers fails.
test: $(MSTAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m pytest

validate: $(STAMP)
	$(BIN)/nnmem-sweep validate configs/*.yaml

run: $(STAMP)
	$(BIN)/nnmem-sweep run $(CONFIG) $(if $(OUT),--out $(OUT))

# SINCE=REV adds the max-batch cells that changed since CONFIG as committed at git revision REV.
report: $(STAMP)
	$(BIN)/nnmem-sweep report $(CONFIG) $(if $(OUT),--out $(OUT)) $(if $(SINCE),--changes-since $(SINCE))

bench: $(STAMP)
	$(BIN)/python bench/run.py

# Regenerate the committed measured cases (tests/data/truth/*.json) with PyTorch's MemTracker under FakeTensorMode.
truth: $(MSTAMP)
	$(BIN)/nnmem-sweep truth --write tests/data/truth

# The shipped plans of models without a hand model (nnmem_sweep/models/derived/): every measured case's and every
# shipped scenario's that uses one, and the derived twins of the hand-modelled scenarios (their allocation sequences
# give the replayed allocator reserve, replays.py), traced anew (NNMEM_SWEEP_REDERIVE=1), then the configs/
# scenarios' replays and the GPU-kit points' on those plans (replays.SHIPPED_REPLAYS). Minutes; run after changing
# derive/ or allocator/ (tests/test_replays_shipped.py says when the shipped replays are stale). DeepSpeed's ZeRO-1/2
# rows (configs/llama-8b-deepspeed.yaml, the kit's DeepSpeed points) are traced with its engine where DeepSpeed 0.19.8
# is installed (pip install deepspeed==0.19.8 --no-deps: without it pip pulls a CUDA torch); else the shipped stand.
derive: $(MSTAMP)
	NNMEM_SWEEP_REDERIVE=1 $(BIN)/nnmem-sweep derive --presets --truth tests/data/truth --ship
	for points in validation/gpu*.yaml; do NNMEM_SWEEP_REDERIVE=1 $(BIN)/nnmem-sweep derive --gpu-points $$points --ship; done
	NNMEM_SWEEP_REDERIVE=1 $(BIN)/nnmem-sweep derive configs/*.yaml bench/grid_1m_derived.yaml --ship

# Measured vs estimated on every committed case, and on every committed real-GPU run (validation/gpu/).
accuracy: $(STAMP)
	$(BIN)/nnmem-sweep accuracy

# The GPU kit (README, "Checking on a real GPU"): validation/gpu.yaml's points measured on the GPU at hand, into
# validation/gpu/<gpu>/<date>/ (GPU_OUT=DIR elsewhere), within BUDGET seconds. Needs only torch, transformers, peft
# and pyyaml: the venv's python when there is one, else the machine's python3 (a CUDA image), nothing installed.
# DRY=1: every point at a tiny size on the CPU (checks the kit, not memory; make test runs it too).
# POINTS=validation/gpu-fsdp.yaml (one rank of FSDP2 steps) or validation/gpu-lora.yaml: another points file, into
# <date>-fsdp / <date>-lora; POINTS="A.yaml B.yaml": several, one after the other within the one BUDGET.
KITPY   ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
BUDGET  ?= 420
POINTS  ?= validation/gpu.yaml
gpu-check:
	PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) PYTHONUNBUFFERED=1 $(KITPY) -m nnmem_sweep.measure.kit $(POINTS) --budget $(BUDGET) \
		$(if $(DRY),--dry-run) $(if $(GPU_OUT),--out $(GPU_OUT)) $(if $(ONLY),--only $(ONLY))

clean:
	rm -rf $(VENV) build *.egg-info
