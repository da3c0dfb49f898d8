# One command to read the site, one to run every test. Both set everything up first.
#   make serve   -> venv + packages + KaTeX, run the proofs, serve the site at http://127.0.0.1:8000
#   make test    -> the same set-up + Chromium, run the proofs, then the model, drill, site and browser tests
#                   (their one strict build also prints the cheat sheet's PDF)

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
KATEX  := build/npm/node_modules/katex/package.json
JOBS   ?= 2
export NO_MKDOCS_2_WARNING := 1
# Python caches each module's bytecode unless PYTHONDONTWRITEBYTECODE is set (some sandboxes and CI images set it):
# then every process compiles everything it imports again, the proofs and pytest's rewritten asserts included.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup chromium proofs site serve test pdf bench seeds at-scale notebooks clean

setup: $(VENV)/.installed $(KATEX)

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[site,browser]'
	@# pip would compile the bytecode of every file it installs, one at a time (87 s here); importing what the proofs,
	@# the site and the tests use compiles only those modules (a fifth of the files, 9 s). The rest compile on first use.
	$(PY) -c "import torch, matplotlib.pyplot, transformers, mkdocs.commands.build, material, playwright.sync_api, jupytext"
	touch $@

$(KATEX):
	npm install --silent --no-audit --no-fund --prefix build/npm katex@0.16.47

# Without an emoji font the verdict icons ✅ and ❌ draw as empty boxes in Chromium, its screenshots and the PDF.
chromium:                ## Debian's chromium for the browser tests and the PDF, with CJK and emoji fonts
	@{ command -v chromium >/dev/null && fc-list 2>/dev/null | grep -qi "noto.*cjk" && \
	   fc-list 2>/dev/null | grep -qi "color emoji"; } || { \
	  echo "installing Debian's chromium, fonts-noto-cjk and fonts-noto-color-emoji for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium fonts-noto-cjk fonts-noto-color-emoji >/dev/null; }

proofs: setup            ## run every proof; writes evidence/ that the site shows
	$(PY) -m pytest proofs -n $(JOBS) --dist loadfile -q --progress

site: proofs
	$(VENV)/bin/mkdocs build --strict

serve:                   ## reruns only proofs whose evidence is missing, failed or stale; serves even if one fails
	@$(MAKE) --no-print-directory -j 2 --output-sync=target setup  # the packages and KaTeX side by side
	-@stale="$$($(PY) -m proofs.stale)"; if [ -n "$$stale" ]; then \
	  $(PY) -m pytest $$stale -n $(JOBS) --dist loadfile -q --progress --reuse-evidence; fi
	$(VENV)/bin/mkdocs serve -a 127.0.0.1:8000

test:                    ## what CI runs: set-up, proofs first (they write the evidence), then everything else
	@# the packages, KaTeX and Chromium install side by side: each waits on its downloads more than on a core
	@$(MAKE) --no-print-directory -j 3 --output-sync=target setup chromium
	$(PY) -m pytest proofs -n $(JOBS) --dist loadfile -q --progress --durations=10
	$(PY) -m pytest tests -n $(JOBS) --maxschedchunk 1 -q --durations=10

pdf: setup chromium      ## the cheat sheet as build/pdf/cheat-sheet.pdf (linked from the page by the next build)
	$(PY) docs/hooks/print_pdf.py

bench: setup             ## the shared encoder layer vs torch.nn, FlatAdam vs torch's Adam, the proof suite per file in reference units
	$(PY) bench/bench_encoder_layer.py
	$(PY) bench/bench_optimizer.py
	$(PY) bench/bench_suite.py --workers $(JOBS)

SEEDS ?= 20
seeds: setup             ## every proof under $(SEEDS) random seeds outside 0-29: each test's pass rate
	$(PY) -m proofs.seeds proofs -n $(SEEDS) --jobs $(JOBS)

PRESET ?=
at-scale: setup          ## the training verdicts on a ~100x larger model and real text: bench/at_scale/<preset>.json
	$(PY) -m proofs.at_scale $(if $(PRESET),--preset $(PRESET))   # gpu with CUDA (~8 min), else cpu (~30 min)

notebooks: setup         ## proofs as .ipynb under build/notebooks (never committed)
	mkdir -p build/notebooks
	for f in $$(find proofs -name 'proof_*.py'); do \
	  $(VENV)/bin/jupytext --quiet --to notebook -o build/notebooks/$$(basename $$f .py).ipynb $$f; done

clean:
	rm -rf site evidence build/notebooks build/site-extra build/pdf build/screenshots .pytest_cache
